// --store-networks: which addresses flagosd connects to for a process group
// that spans daemons (admission/store_networks.h).
#include "admission/store_networks.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/status/status.h"

namespace flagos::daemon {
namespace {

IpNetwork Net(const std::string& text) {
  absl::StatusOr<IpNetwork> n = ParseIpNetwork(text);
  EXPECT_TRUE(n.ok()) << text << ": " << n.status();
  return n.ok() ? *n : IpNetwork{};
}

bool In(const std::string& network, const std::string& address) {
  const IpNetwork a = Net(address);
  return Net(network).Contains(a.address);
}

TEST(StoreNetworksTest, NetworksContainTheirAddressesOnly) {
  EXPECT_TRUE(In("10.0.0.0/8", "10.255.1.2"));
  EXPECT_FALSE(In("10.0.0.0/8", "11.0.0.1"));
  EXPECT_TRUE(In("192.168.4.0/22", "192.168.7.255"));
  EXPECT_FALSE(In("192.168.4.0/22", "192.168.8.0"));
  EXPECT_TRUE(In("10.1.2.3", "10.1.2.3"));
  EXPECT_FALSE(In("10.1.2.3", "10.1.2.4"));
  EXPECT_TRUE(In("0.0.0.0/0", "203.0.113.9"));
  EXPECT_FALSE(In("0.0.0.0/0", "2001:db8::1"));  // IPv4's whole space is not IPv6's
  EXPECT_TRUE(In("fd00::/8", "fd12:3456::1"));
  EXPECT_FALSE(In("fd00::/8", "fe80::1"));
  EXPECT_TRUE(In("::/0", "2001:db8::1"));
  // An IPv4-mapped IPv6 address is its IPv4 address.
  EXPECT_TRUE(In("127.0.0.0/8", "::ffff:127.0.0.1"));
  // Host bits of a CIDR are cleared; text round-trips.
  EXPECT_EQ(Net("10.1.2.3/8").ToString(), "10.0.0.0/8");
  EXPECT_EQ(Net("fd00::5/8").ToString(), "fd00::/8");
  EXPECT_EQ(Net("10.1.2.3").ToString(), "10.1.2.3/32");
}

TEST(StoreNetworksTest, MalformedNetworksAreRefusedNamingThem) {
  for (const char* bad : {"", "10.0.0.0/33", "10.0.0/8", "::1/129", "10.0.0.0/", "10.0.0.0/x",
                          "example.com", "10.0.0.0/8/8", "1.2.3.4 "}) {
    absl::StatusOr<IpNetwork> n = ParseIpNetwork(bad);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  absl::StatusOr<StoreNetworks> s = StoreNetworks::Parse({"auto", "10.0.0.0/99"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--store-networks: '10.0.0.0/99'"), std::string::npos)
      << s.status();
  s = StoreNetworks::Parse({"none", "10.0.0.0/8"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot be combined"), std::string::npos);
}

TEST(StoreNetworksTest, AutoAllowsLoopbackAndThisHostsNetworksOnly) {
  const StoreNetworks s = *StoreNetworks::Parse({"auto"});
  EXPECT_EQ(*s.Resolve("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*s.Resolve("::1"), "::1");
  absl::StatusOr<std::string> localhost = s.Resolve("localhost");
  ASSERT_TRUE(localhost.ok()) << localhost.status();
  EXPECT_TRUE(*localhost == "127.0.0.1" || *localhost == "::1") << *localhost;
  // Every address of this host's interfaces is allowed.
  for (const IpNetwork& n : HostNetworks()) {
    EXPECT_TRUE(n.Contains(n.address)) << n.ToString();
  }
  // TEST-NET-3 (RFC 5737) is no interface's network.
  absl::StatusOr<std::string> far = s.Resolve("203.0.113.7");
  ASSERT_EQ(far.status().code(), absl::StatusCode::kPermissionDenied) << far.status();
  const std::string text(far.status().message());
  EXPECT_NE(text.find("'203.0.113.7' (203.0.113.7) is in none of them"), std::string::npos)
      << text;
  EXPECT_NE(text.find("auto (loopback and this node's networks: 127.0.0.0/8"),
            std::string::npos) << text;
  EXPECT_NE(text.find("--store-networks=auto,203.0.113.7"), std::string::npos) << text;
}

TEST(StoreNetworksTest, ListedAnyAndNone) {
  const StoreNetworks listed = *StoreNetworks::Parse({"203.0.113.0/24"});
  EXPECT_EQ(*listed.Resolve("203.0.113.7"), "203.0.113.7");
  // Without auto, loopback is not allowed either.
  EXPECT_EQ(listed.Resolve("127.0.0.1").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(listed.Describe(), "203.0.113.0/24");

  const StoreNetworks any = *StoreNetworks::Parse({"any"});
  EXPECT_EQ(*any.Resolve("203.0.113.7"), "203.0.113.7");
  EXPECT_EQ(any.Describe(), "any");

  const StoreNetworks none = *StoreNetworks::Parse({"none"});
  absl::StatusOr<std::string> refused = none.Resolve("127.0.0.1");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("--store-networks=none"), std::string::npos);
  EXPECT_EQ(none.Describe(), "none");

  // An empty flag is the default.
  EXPECT_EQ(*StoreNetworks::Parse({}).value().Resolve("127.0.0.1"), "127.0.0.1");
}

TEST(StoreNetworksTest, HostsThatAreNotHostNamesAreRefusedBeforeAnyLookup) {
  const StoreNetworks any = *StoreNetworks::Parse({"any"});
  for (const std::string bad : {std::string(), std::string("a b"), std::string("x;rm -rf /"),
                                std::string("host\n"), std::string(300, 'a'),
                                std::string("h\0st", 4), std::string("[::1]")}) {
    absl::StatusOr<std::string> r = any.Resolve(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("is not a host name or an IP address"),
              std::string::npos) << r.status();
  }
  EXPECT_EQ(any.Resolve("no-such-host.invalid").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace flagos::daemon
