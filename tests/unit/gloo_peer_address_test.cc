// The address of a gloo rank record, read so that flagosd checks where its
// gloo would connect (admission/gloo_peer_address.h), and the check itself
// (StoreNetworks::CheckPeer). The records here are built by hand in the
// layout the header states; the tests between daemons
// (tests/python/test_distributed_between_daemons.py) read the records
// torch's own gloo writes.
#include "admission/gloo_peer_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "admission/store_networks.h"

namespace flagos::daemon {
namespace {

void PutU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

sockaddr_storage V4(const char* ip, uint16_t port) {
  sockaddr_storage ss;
  std::memset(&ss, 0xa5, sizeof(ss));  // the unused rest is not zero in real records
  sockaddr_in in = {};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET, ip, &in.sin_addr), 1);
  std::memcpy(&ss, &in, sizeof(in));
  return ss;
}

sockaddr_storage V6(const char* ip, uint16_t port) {
  sockaddr_storage ss = {};
  sockaddr_in6 in = {};
  in.sin6_family = AF_INET6;
  in.sin6_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET6, ip, &in.sin6_addr), 1);
  std::memcpy(&ss, &in, sizeof(in));
  return ss;
}

std::vector<uint8_t> Record(const std::string& host, const sockaddr_storage& address,
                            uint64_t ranks, uint64_t address_bytes = 136) {
  std::vector<uint8_t> out;
  PutU64(out, host.size());
  out.insert(out.end(), host.begin(), host.end());
  PutU64(out, address_bytes);
  const auto* a = reinterpret_cast<const uint8_t*>(&address);
  out.insert(out.end(), a, a + sizeof(address));
  PutU64(out, static_cast<uint64_t>(-1));  // the address's sequence
  for (uint64_t i = 0; i < ranks; ++i) PutU64(out, i);  // each rank's pair sequence
  return out;
}

std::string Port(const sockaddr_storage& ss) {
  return std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port));
}

TEST(GlooPeerAddressTest, ReadsTheAddressOfARecord) {
  // 170 bytes for a rank of a 2-rank group on host "vm", as torch 2.13's gloo writes it.
  const std::vector<uint8_t> two = Record("vm", V4("127.0.1.1", 43105), 2);
  ASSERT_EQ(two.size(), 170u);
  absl::StatusOr<sockaddr_storage> a = GlooPeerAddress(two, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->ss_family, AF_INET);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&*a)->sin_addr, text, sizeof(text));
  EXPECT_STREQ(text, "127.0.1.1");
  EXPECT_EQ(Port(*a), "43105");

  absl::StatusOr<sockaddr_storage> b = GlooPeerAddress(Record("", V6("fd00::7", 9), 4096), 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->ss_family, AF_INET6);
}

TEST(GlooPeerAddressTest, RefusesWhatIsNotTheLayout) {
  const std::vector<uint8_t> good = Record("node-a", V4("10.0.0.1", 1), 3);
  ASSERT_TRUE(GlooPeerAddress(good, 3).ok());
  auto refused = [](const std::vector<uint8_t>& record, const std::string& what) {
    absl::StatusOr<sockaddr_storage> a = GlooPeerAddress(record, 3);
    ASSERT_FALSE(a.ok()) << what;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_NE(a.status().message().find("torch 2.13's gloo rank record"), std::string::npos)
        << a.status();
    EXPECT_NE(a.status().message().find(what), std::string::npos) << a.status();
  };
  refused({}, "no host-name length");
  // Every truncation, and one byte more.
  for (size_t n = 1; n < good.size(); ++n) {
    EXPECT_FALSE(GlooPeerAddress(std::vector<uint8_t>(good.begin(), good.begin() + n), 3).ok())
        << n;
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  refused(longer, "25 bytes after the address, not 24 for 3 ranks");
  // A record of another group size.
  refused(Record("node-a", V4("10.0.0.1", 1), 2), "16 bytes after the address, not 24 for 3 ranks");
  refused(Record(std::string(256, 'h'), V4("10.0.0.1", 1), 3), "a host name of 256 bytes");
  // A host-name length near 2^64 does not wrap the bounds check.
  std::vector<uint8_t> huge = good;
  std::memset(huge.data(), 0xff, 8);
  refused(huge, "a host name of 18446744073709551615 bytes");
  refused(Record("h", V4("10.0.0.1", 1), 3, 128), "an address of 128 bytes");
  sockaddr_storage unix_family = V4("10.0.0.1", 1);
  unix_family.ss_family = AF_UNIX;
  refused(Record("h", unix_family, 3), "address family 1, not AF_INET or AF_INET6");
}

TEST(GlooPeerAddressTest, APeerIsCheckedAgainstTheRule) {
  const StoreNetworks listed = *StoreNetworks::Parse({"10.20.0.0/16"});
  const sockaddr_storage in = V4("10.20.3.4", 5000);
  const sockaddr_storage out = V4("203.0.113.7", 4567);
  EXPECT_TRUE(listed.CheckPeer(reinterpret_cast<const sockaddr*>(&in), "rank 1").ok());
  const absl::Status no = listed.CheckPeer(reinterpret_cast<const sockaddr*>(&out), "rank 1");
  EXPECT_EQ(no.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::string(no.message()),
            "rank 1 is at 203.0.113.7:4567 (the address its daemon published in the job's "
            "Store), and flagosd connects only to addresses in its --store-networks: "
            "10.20.0.0/16; if that daemon's node is there, the node's operator adds its network "
            "to flagosd's --store-networks (e.g. --store-networks=auto,203.0.113.7) "
            "(docs/distributed.md)");
  const sockaddr_storage v6 = V6("2001:db8::1", 80);
  EXPECT_NE(std::string(listed.CheckPeer(reinterpret_cast<const sockaddr*>(&v6), "rank 2")
                            .message())
                .find("rank 2 is at [2001:db8::1]:80"),
            std::string::npos);
  // auto: loopback and this host's networks.
  const StoreNetworks automatic = *StoreNetworks::Parse({"auto"});
  const sockaddr_storage loop = V4("127.0.1.1", 1);
  EXPECT_TRUE(automatic.CheckPeer(reinterpret_cast<const sockaddr*>(&loop), "rank 1").ok());
  EXPECT_FALSE(automatic.CheckPeer(reinterpret_cast<const sockaddr*>(&out), "rank 1").ok());
  const StoreNetworks any = *StoreNetworks::Parse({"any"});
  EXPECT_TRUE(any.CheckPeer(reinterpret_cast<const sockaddr*>(&out), "rank 1").ok());
  sockaddr_storage other = {};
  other.ss_family = AF_UNIX;
  EXPECT_EQ(any.CheckPeer(reinterpret_cast<const sockaddr*>(&other), "rank 1").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flagos::daemon
