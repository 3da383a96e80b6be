#include "status_codes.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "flagos/client/connection.h"

namespace flagos::client {
namespace {

constexpr int kMaxCode = 16;  // UNAUTHENTICATED

}  // namespace

std::string CodeName(int code) {
  switch (code) {
    case 0: return "OK";
    case 1: return "CANCELLED";
    case 2: return "UNKNOWN";
    case 3: return "INVALID_ARGUMENT";
    case 4: return "DEADLINE_EXCEEDED";
    case 5: return "NOT_FOUND";
    case 6: return "ALREADY_EXISTS";
    case 7: return "PERMISSION_DENIED";
    case 8: return "RESOURCE_EXHAUSTED";
    case 9: return "FAILED_PRECONDITION";
    case 10: return "ABORTED";
    case 11: return "OUT_OF_RANGE";
    case 12: return "UNIMPLEMENTED";
    case 13: return "INTERNAL";
    case 14: return "UNAVAILABLE";
    case 15: return "DATA_LOSS";
    case 16: return "UNAUTHENTICATED";
    default: return absl::StrCat("CODE_", code);
  }
}

absl::StatusCode AbslCode(int code) {
  if (code < 0 || code > kMaxCode) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(code);
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_message().empty()) {
    return absl::Status(AbslCode(status.error_code()), context);
  }
  return absl::Status(AbslCode(status.error_code()),
                      absl::StrCat(context, ": ", status.error_message()));
}

std::string DescribeGrpcStatus(const grpc::Status& status) {
  std::string name = CodeName(status.error_code());
  if (status.error_message().empty()) return name;
  return absl::StrCat(name, ": ", status.error_message());
}

}  // namespace flagos::client
