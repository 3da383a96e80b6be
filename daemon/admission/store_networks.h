// Where flagosd connects for its clients: --store-networks.
//
// A process group whose ranks are sessions of different daemons meets in
// the job's c10d Store, whose address the client names (join_group in
// collectives/collective_ops.cc). Without a rule, any client that may open a
// session could make flagosd connect to any host and port it can reach —
// from the daemon's network position, which is not necessarily the
// client's (a client over TCP from another node; a daemon in another
// network namespace). flagosd connects only to Stores, and to the other
// daemons of a group (the addresses they publish in that Store), whose
// address lies in these networks:
//
//   auto   loopback and the networks of this host's interfaces (each
//          address with its netmask, read at each join) — the default: a
//          torchrun job's Store is on one of the job's nodes;
//   any    every address;
//   none   no address: groups that span daemons are refused;
//   CIDR   e.g. 10.20.0.0/16, fd00::/8, or one address (10.1.2.3).
//
// Entries combine (auto,10.20.0.0/16). A host name is resolved once and
// flagosd connects to the address it checked (no second lookup to race).
#ifndef FLAGOS_DAEMON_ADMISSION_STORE_NETWORKS_H_
#define FLAGOS_DAEMON_ADMISSION_STORE_NETWORKS_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

// An IPv4 or IPv6 network. IPv4 addresses are kept as IPv4-mapped IPv6
// (::ffff:a.b.c.d), so one comparison serves both.
struct IpNetwork {
  uint8_t address[16] = {};
  int prefix_bits = 0;  // of the 128

  bool Contains(const uint8_t (&ip)[16]) const;
  std::string ToString() const;  // "10.0.0.0/8", "::1/128"
};

class StoreNetworks {
 public:
  // --store-networks' value. INVALID_ARGUMENT naming an entry that is not
  // auto, any, none, an address or a CIDR, or none combined with others.
  static absl::StatusOr<StoreNetworks> Parse(const std::vector<std::string>& values);

  // The daemon's rule (main sets it from the flag; until then: auto).
  static void SetCurrent(StoreNetworks networks);
  static StoreNetworks Current();

  // The numeric address to connect to for `host` (a name or an address):
  // the first of its addresses in these networks. INVALID_ARGUMENT when
  // `host` is not a host name or an address, NOT_FOUND when it does not
  // resolve, PERMISSION_DENIED (saying which networks are allowed and how
  // to add one) when none of its addresses is allowed.
  absl::StatusOr<std::string> Resolve(absl::string_view host) const;

  // OK when `peer` (an IPv4 or IPv6 socket address another daemon of the
  // group published in the job's Store, which flagosd would connect to)
  // lies in these networks. PERMISSION_DENIED otherwise, naming `who` and
  // the address, and saying how to allow it; INVALID_ARGUMENT for another
  // address family.
  absl::Status CheckPeer(const sockaddr* peer, absl::string_view who) const;

  // "auto (127.0.0.0/8, ::1/128, 10.0.2.0/24), 203.0.113.0/24", "any", "none".
  std::string Describe() const;

 private:
  std::vector<IpNetwork> Networks() const;  // the listed ones, and auto's now

  bool auto_ = true;
  bool any_ = false;
  std::vector<IpNetwork> listed_;
};

// An address ("10.1.2.3", "::1", "::ffff:10.1.2.3") or a CIDR
// ("10.0.0.0/8"): INVALID_ARGUMENT otherwise.
absl::StatusOr<IpNetwork> ParseIpNetwork(absl::string_view text);

// Loopback and each address of this host's interfaces with its netmask.
std::vector<IpNetwork> HostNetworks();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_STORE_NETWORKS_H_
