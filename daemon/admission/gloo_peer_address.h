// The address a daemon's gloo publishes for its rank in the job's Store,
// read so that flagosd can check it (--store-networks, store_networks.h)
// before gloo connects to it.
//
// A group that spans daemons meets through torch's ProcessGroupGloo inside
// flagosd (collectives/gloo_process_group.h): each rank's gloo writes a
// record under its rank's key, and every other rank's gloo connects to the
// socket address in it. The Store is the client's, so the record is what a
// client (or anyone who reaches its Store) wrote.
//
// The record's layout is gloo's own and differs between gloo versions. This
// reads the one of the gloo in the libtorch flagosd is built with (torch
// 2.13; tests/unit/gloo_peer_address_test.cc builds records, and every test
// between daemons reads real ones), all little-endian:
//
//   u64 host-name length, the host name;
//   u64 address length (136), the address: a sockaddr_storage (128 bytes:
//     an AF_INET or AF_INET6 sockaddr, the rest unused) and an i64 sequence;
//   an i64 per rank of the group (its pairs' sequence numbers), to the end.
//
// Anything else — a short or long record, lengths that do not add up, an
// address of another size or family — is refused: flagosd does not connect
// to an address it could not read (fail closed), and says which layout it
// expected, so that a torch upgrade that changed it shows at once.
#ifndef FLAGOS_DAEMON_ADMISSION_GLOO_PEER_ADDRESS_H_
#define FLAGOS_DAEMON_ADMISSION_GLOO_PEER_ADDRESS_H_

#include <sys/socket.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace flagos::daemon {

// The socket address of a gloo rank record (above) of a group of `nranks`;
// INVALID_ARGUMENT saying what did not match.
absl::StatusOr<sockaddr_storage> GlooPeerAddress(const std::vector<uint8_t>& record, int nranks);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_GLOO_PEER_ADDRESS_H_
