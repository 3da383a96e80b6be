#include "admission/store_networks.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {
namespace {

constexpr size_t kMaxHostBytes = 253;  // the longest DNS name

void FromV4(const in_addr& v4, uint8_t (&out)[16]) {
  std::memset(out, 0, 16);
  out[10] = 0xff;
  out[11] = 0xff;
  std::memcpy(out + 12, &v4, 4);
}

bool IsMappedV4(const uint8_t (&ip)[16]) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(ip, kPrefix, 12) == 0;
}

// The address of a sockaddr, false for other families.
bool FromSockaddr(const sockaddr* sa, uint8_t (&out)[16]) {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET) {
    FromV4(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, out);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
    return true;
  }
  return false;
}

// The leading one bits of a netmask.
int PrefixOf(const uint8_t* mask, int bytes) {
  int bits = 0;
  for (int i = 0; i < bytes; ++i) {
    for (int b = 7; b >= 0; --b) {
      if ((mask[i] >> b & 1) == 0) return bits;
      ++bits;
    }
  }
  return bits;
}

std::string AddressText(const uint8_t (&ip)[16]) {
  char text[INET6_ADDRSTRLEN] = {};
  if (IsMappedV4(ip)) {
    inet_ntop(AF_INET, ip + 12, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, ip, text, sizeof(text));
  }
  return text;
}

// The mask of byte `i` of an address in a network of `prefix_bits`.
uint8_t ByteMask(int prefix_bits, int i) {
  const int left = prefix_bits - 8 * i;
  return left >= 8 ? 0xff : left <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - left));
}

// `n` with its host bits cleared: the network's own address.
IpNetwork Whole(IpNetwork n) {
  for (int i = 0; i < 16; ++i) n.address[i] &= ByteMask(n.prefix_bits, i);
  return n;
}

bool Listed(const std::vector<IpNetwork>& networks, const uint8_t (&ip)[16]) {
  for (const IpNetwork& n : networks) {
    if (n.Contains(ip)) return true;
  }
  return false;
}

// A host as a client may name it: letters, digits, '.', '-', '_', and
// ':' and '%' of IPv6 addresses (with a zone), nothing else.
bool IsHostText(absl::string_view host) {
  if (host.empty() || host.size() > kMaxHostBytes) return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
        c != '_' && c != ':' && c != '%') {
      return false;
    }
  }
  return true;
}

struct CurrentRule {
  absl::Mutex mu;
  StoreNetworks networks ABSL_GUARDED_BY(mu) = *StoreNetworks::Parse({"auto"});
};

CurrentRule& TheCurrent() {
  static CurrentRule* current = new CurrentRule;  // never destroyed: read until exit
  return *current;
}

}  // namespace

bool IpNetwork::Contains(const uint8_t (&ip)[16]) const {
  for (int i = 0; i < 16; ++i) {
    const uint8_t mask = ByteMask(prefix_bits, i);
    if ((ip[i] & mask) != (address[i] & mask)) return false;
  }
  return true;
}

std::string IpNetwork::ToString() const {
  if (IsMappedV4(address) && prefix_bits >= 96) {
    return absl::StrCat(AddressText(address), "/", prefix_bits - 96);
  }
  return absl::StrCat(AddressText(address), "/", prefix_bits);
}

absl::StatusOr<IpNetwork> ParseIpNetwork(absl::string_view text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", absl::CHexEscape(text.substr(0, 64)),
        "' is not an IP address or a network (an address, or address/prefix: 10.0.0.0/8, "
        "fd00::/8)"));
  };
  std::pair<std::string, std::string> parts = absl::StrSplit(text, absl::MaxSplits('/', 1));
  IpNetwork n;
  int max_bits;
  in_addr v4;
  if (inet_pton(AF_INET, parts.first.c_str(), &v4) == 1) {
    FromV4(v4, n.address);
    max_bits = 32;
  } else if (inet_pton(AF_INET6, parts.first.c_str(), n.address) == 1) {
    max_bits = 128;
  } else {
    return bad();
  }
  int bits = max_bits;
  const bool has_prefix = text.find('/') != absl::string_view::npos;
  if (has_prefix && (!absl::SimpleAtoi(parts.second, &bits) || bits < 0 || bits > max_bits)) {
    return bad();
  }
  n.prefix_bits = max_bits == 32 ? bits + 96 : bits;
  return Whole(n);
}

std::vector<IpNetwork> HostNetworks() {
  std::vector<IpNetwork> out = {*ParseIpNetwork("127.0.0.0/8"), *ParseIpNetwork("::1/128")};
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> owned(list, &freeifaddrs);
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    IpNetwork n;
    if (!FromSockaddr(a->ifa_addr, n.address)) continue;
    uint8_t mask[16];
    if (a->ifa_netmask != nullptr && a->ifa_netmask->sa_family == a->ifa_addr->sa_family &&
        FromSockaddr(a->ifa_netmask, mask)) {
      n.prefix_bits = a->ifa_addr->sa_family == AF_INET ? 96 + PrefixOf(mask + 12, 4)
                                                        : PrefixOf(mask, 16);
    } else {
      n.prefix_bits = 128;
    }
    const IpNetwork whole = Whole(n);
    if (!Listed(out, whole.address)) out.push_back(whole);
  }
  return out;
}

absl::StatusOr<StoreNetworks> StoreNetworks::Parse(const std::vector<std::string>& values) {
  StoreNetworks s;
  s.auto_ = false;
  bool none = false;
  int entries = 0;
  for (const std::string& raw : values) {
    const std::string v(absl::StripAsciiWhitespace(raw));
    if (v.empty()) continue;
    ++entries;
    if (v == "auto") {
      s.auto_ = true;
    } else if (v == "any") {
      s.any_ = true;
    } else if (v == "none") {
      none = true;
    } else {
      absl::StatusOr<IpNetwork> n = ParseIpNetwork(v);
      if (!n.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--store-networks: ", n.status().message(), "; or auto, any, none"));
      }
      s.listed_.push_back(*n);
    }
  }
  if (none && entries > 1) {
    return absl::InvalidArgumentError(
        "--store-networks: none allows no network and cannot be combined with others");
  }
  if (entries == 0) s.auto_ = true;  // --store-networks= : the default
  return s;
}

void StoreNetworks::SetCurrent(StoreNetworks networks) {
  CurrentRule& c = TheCurrent();
  absl::MutexLock lock(&c.mu);
  c.networks = std::move(networks);
}

StoreNetworks StoreNetworks::Current() {
  CurrentRule& c = TheCurrent();
  absl::MutexLock lock(&c.mu);
  return c.networks;
}

std::vector<IpNetwork> StoreNetworks::Networks() const {
  std::vector<IpNetwork> all = listed_;
  if (auto_) {
    for (const IpNetwork& n : HostNetworks()) all.push_back(n);
  }
  return all;
}

std::string StoreNetworks::Describe() const {
  if (any_) return "any";
  std::vector<std::string> parts;
  if (auto_) {
    std::vector<std::string> host;
    for (const IpNetwork& n : HostNetworks()) host.push_back(n.ToString());
    parts.push_back(absl::StrCat("auto (loopback and this node's networks: ",
                                 absl::StrJoin(host, ", "), ")"));
  }
  for (const IpNetwork& n : listed_) parts.push_back(n.ToString());
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

absl::StatusOr<std::string> StoreNetworks::Resolve(absl::string_view host) const {
  if (!IsHostText(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", absl::CHexEscape(host.substr(0, 64)), host.size() > 64 ? "..." : "",
        "' is not a host name or an IP address (at most ", kMaxHostBytes,
        " letters, digits and . - _ : %)"));
  }
  if (!any_ && !auto_ && listed_.empty()) {
    return absl::PermissionDeniedError(
        "this flagosd joins no process group that spans daemons (--store-networks=none); "
        "run the job's ranks on one daemon, or ask the node's operator to allow the Store's "
        "network (docs/distributed.md)");
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string name(host);
  const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return absl::NotFoundError(absl::StrCat("the Store's host '", name,
                                            "' does not resolve on flagosd's node (",
                                            gai_strerror(rc), ")"));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found, &freeaddrinfo);
  const std::vector<IpNetwork> allowed = any_ ? std::vector<IpNetwork>{} : Networks();
  std::vector<std::string> refused;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    uint8_t ip[16];
    if (!FromSockaddr(a->ai_addr, ip)) continue;
    if (any_ || Listed(allowed, ip)) return AddressText(ip);
    const std::string text = AddressText(ip);
    if (refused.size() < 4 && std::find(refused.begin(), refused.end(), text) == refused.end()) {
      refused.push_back(text);
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "flagosd connects only to Stores in its --store-networks, and '", name, "' (",
      absl::StrJoin(refused, ", "), ") is in none of them: ", Describe(),
      "; if the job's Store is there, the node's operator adds its network to flagosd's "
      "--store-networks (e.g. --store-networks=auto,", refused.empty() ? "10.0.0.0/8" :
      refused.front(), ") (docs/distributed.md)"));
}

absl::Status StoreNetworks::CheckPeer(const sockaddr* peer, absl::string_view who) const {
  uint8_t ip[16];
  if (!FromSockaddr(peer, ip)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " published an address of family ", peer == nullptr ? -1 : peer->sa_family,
        ", not an IPv4 or IPv6 one"));
  }
  if (any_ || Listed(Networks(), ip)) return absl::OkStatus();
  const uint16_t port = ntohs(peer->sa_family == AF_INET
                                  ? reinterpret_cast<const sockaddr_in*>(peer)->sin_port
                                  : reinterpret_cast<const sockaddr_in6*>(peer)->sin6_port);
  const std::string text = AddressText(ip);
  const bool v6 = text.find(':') != std::string::npos;
  return absl::PermissionDeniedError(absl::StrCat(
      who, " is at ", v6 ? "[" : "", text, v6 ? "]" : "", ":", port,
      " (the address its daemon published in the job's Store), and flagosd connects only to "
      "addresses in its --store-networks: ",
      Describe(), "; if that daemon's node is there, the node's operator adds its network to "
      "flagosd's --store-networks (e.g. --store-networks=auto,", text, ") (docs/distributed.md)"));
}

}  // namespace flagos::daemon
