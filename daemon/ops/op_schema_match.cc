// Client schema against flagosd's own (op_schema_match.h). Includes only
// ATen's function schema and the JIT schema parser, not the operator headers.
#include "ops/op_schema_match.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "protocol/command_validation.h"
#include "execution/backend.h"

namespace flagos::daemon {
namespace {

// Deepest bracket nesting of `text`; the parser recurses on it.
int Nesting(absl::string_view text) {
  int depth = 0, deepest = 0;
  for (char c : text) {
    if (c == '(' || c == '[') deepest = std::max(deepest, ++depth);
    if (c == ')' || c == ']') --depth;
  }
  return deepest;
}

bool SameAlias(const c10::AliasInfo* a, const c10::AliasInfo* b) {
  return a == b || (a != nullptr && b != nullptr && *a == *b);
}

// What travels: position, type, defaults (a missing trailing argument takes
// the daemon's), keyword-only and aliasing (which arguments are written).
bool SameOnTheWire(const c10::Argument& a, const c10::Argument& b) {
  return *a.real_type() == *b.real_type() && a.N() == b.N() &&
         a.default_value() == b.default_value() && a.kwarg_only() == b.kwarg_only() &&
         SameAlias(a.alias_info(), b.alias_info());
}

bool SameOnTheWire(const std::vector<c10::Argument>& a, const std::vector<c10::Argument>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameOnTheWire(a[i], b[i])) return false;
  }
  return true;
}

// The client's schema parsed and compared but for argument names; false when
// it does not parse.
bool SameButForNames(const c10::FunctionSchema& own, const std::string& client) {
  try {
    const c10::FunctionSchema theirs = torch::jit::parseSchema(client, /*allow_typevars=*/false);
    return theirs.name() == own.name() && theirs.overload_name() == own.overload_name() &&
           theirs.is_vararg() == own.is_vararg() && theirs.is_varret() == own.is_varret() &&
           SameOnTheWire(theirs.arguments(), own.arguments()) &&
           SameOnTheWire(theirs.returns(), own.returns());
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::optional<std::string> OwnSchemaText(const std::string& name, const std::string& overload) {
  std::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(name, overload));
  if (!handle.has_value()) return std::nullopt;
  return c10::toString(handle->schema());
}

absl::Status CheckClientSchema(const c10::FunctionSchema& own, absl::string_view client_schema,
                               absl::string_view client_torch_version,
                               absl::string_view full_name) {
  if (client_schema.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register_op ", full_name,
        ": no schema; a client sends the schema of the operator in its own torch, so that "
        "flagosd can refuse one whose arguments differ (update torch_fl)"));
  }
  if (client_schema.size() > kMaxOpSchemaBytes) {
    return absl::InvalidArgumentError(absl::StrCat("register_op ", full_name, ": a schema of ",
                                                   client_schema.size(),
                                                   " bytes; the limit is ", kMaxOpSchemaBytes));
  }
  const std::string own_text = c10::toString(own);
  if (client_schema == own_text) return absl::OkStatus();
  if (Nesting(client_schema) > kMaxOpSchemaNesting) {
    return absl::InvalidArgumentError(absl::StrCat("register_op ", full_name,
                                                   ": the schema nests brackets deeper than ",
                                                   kMaxOpSchemaNesting));
  }
  if (SameButForNames(own, std::string(client_schema))) return absl::OkStatus();
  const absl::string_view client_torch =
      client_torch_version.empty() ? absl::string_view("unknown") : client_torch_version;
  return absl::FailedPreconditionError(absl::StrCat(
      "register_op ", full_name,
      ": the client's schema differs from flagosd's, so its arguments would be read in the "
      "wrong places. client (torch ", client_torch, "): ", absl::CEscape(client_schema),
      "; flagosd (torch ", TorchVersion(), "): ", own_text,
      ". Use a torch_fl built against flagosd's torch, or a flagosd built against the "
      "client's"));
}

}  // namespace flagos::daemon
