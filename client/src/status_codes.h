// Conversions between the status codes on the wire (google.rpc.Code in a
// Completion, grpc::StatusCode on an RPC) and absl::Status. The three code
// sets share numbering; anything outside it becomes UNKNOWN.
#ifndef FLAGOS_CLIENT_SRC_STATUS_CODES_H_
#define FLAGOS_CLIENT_SRC_STATUS_CODES_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace flagos::client {

// The absl code for google.rpc.Code `code`; UNKNOWN when out of range.
absl::StatusCode AbslCode(int code);

// `status` as an absl::Status whose message is "<context>: <gRPC message>"
// (just `context` when gRPC gave no message).
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context);

// "UNAVAILABLE: socket closed" — a gRPC status for use inside messages.
std::string DescribeGrpcStatus(const grpc::Status& status);

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_STATUS_CODES_H_
