// The unary RPCs (Negotiate, GetStats), each bounded by a deadline, with gRPC
// failures turned into statuses that name the daemon and what to do.
#ifndef FLAGOS_CLIENT_SRC_UNARY_CALLS_H_
#define FLAGOS_CLIENT_SRC_UNARY_CALLS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

// Negotiates a protocol version in [kProtocolMinVersion, kProtocolMaxVersion]
// with the daemon at `endpoint`. UNAVAILABLE when it does not answer by
// `deadline`; FAILED_PRECONDITION when it chose a version outside the range.
absl::StatusOr<v1::NegotiateResponse> Negotiate(v1::Flagos::Stub& stub, const std::string& endpoint,
                                                const std::string& client_name,
                                                absl::Time deadline);

// The daemon's statistics, or the RPC's failure naming the daemon.
absl::StatusOr<v1::GetStatsResponse> FetchStats(v1::Flagos::Stub& stub, const std::string& endpoint,
                                                absl::Time deadline);

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_UNARY_CALLS_H_
