#include "admission/gloo_peer_address.h"

#include <netinet/in.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

constexpr uint64_t kMaxHostName = 255;  // a host name, with room
constexpr uint64_t kAddressBytes = sizeof(sockaddr_storage) + sizeof(int64_t);

constexpr char kLayout[] =
    "torch 2.13's gloo rank record: u64 host-name length, host name, u64 address length "
    "(136), sockaddr_storage and i64 sequence, i64 per rank";

// Reads a little-endian u64 at `at`, advancing it; false past the end.
bool ReadU64(const std::vector<uint8_t>& in, size_t& at, uint64_t& out) {
  if (in.size() - at < sizeof(uint64_t)) return false;
  out = 0;
  for (int i = 7; i >= 0; --i) out = out << 8 | in[at + i];
  at += sizeof(uint64_t);
  return true;
}

absl::Status Unreadable(const std::vector<uint8_t>& in, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "its gloo record (", in.size(), " bytes) is not in the layout flagosd reads (", kLayout,
      "): ", what));
}

}  // namespace

absl::StatusOr<sockaddr_storage> GlooPeerAddress(const std::vector<uint8_t>& record, int nranks) {
  size_t at = 0;
  uint64_t host = 0;
  if (!ReadU64(record, at, host)) return Unreadable(record, "no host-name length");
  if (host > kMaxHostName || record.size() - at < host) {
    return Unreadable(record, absl::StrCat("a host name of ", host, " bytes"));
  }
  at += host;
  uint64_t address = 0;
  if (!ReadU64(record, at, address)) return Unreadable(record, "no address length");
  if (address != kAddressBytes || record.size() - at < address) {
    return Unreadable(record, absl::StrCat("an address of ", address, " bytes"));
  }
  sockaddr_storage out;
  std::memcpy(&out, record.data() + at, sizeof(out));
  at += address;
  const uint64_t ranks = static_cast<uint64_t>(nranks < 0 ? 0 : nranks);
  if (record.size() - at != ranks * sizeof(int64_t)) {
    return Unreadable(record, absl::StrCat(record.size() - at, " bytes after the address, not ",
                                           ranks * sizeof(int64_t), " for ", ranks, " ranks"));
  }
  if (out.ss_family != AF_INET && out.ss_family != AF_INET6) {
    return Unreadable(record, absl::StrCat("address family ", out.ss_family,
                                           ", not AF_INET or AF_INET6"));
  }
  return out;
}

}  // namespace flagos::daemon
