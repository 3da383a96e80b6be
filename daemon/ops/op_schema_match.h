// Whether a client's operator schema is flagosd's own (register_op).
//
// Operators are registered by name and overload, and their arguments travel
// in schema order; a client built against another torch, whose schema for
// the same name changed, would have its arguments read in the wrong places.
// The client therefore sends the schema it was built with, and register_op
// admits the op only when that schema is the daemon's, but for argument
// names (which never travel). No ATen in this header.
#ifndef FLAGOS_DAEMON_OPS_OP_SCHEMA_MATCH_H_
#define FLAGOS_DAEMON_OPS_OP_SCHEMA_MATCH_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace c10 {
struct FunctionSchema;
}

namespace flagos::daemon {

// The printed schema ("aten::add.Tensor(Tensor self, Tensor other, *,
// Scalar alpha=1) -> Tensor") of `name`.`overload` in flagosd's torch, as
// torch_fl sends it; nullopt when there is no such operator.
std::optional<std::string> OwnSchemaText(const std::string& name, const std::string& overload);

// OK when `client_schema` is `own` (the same text, or the same types,
// defaults, keyword-only markers, aliasing and returns under other argument
// names). INVALID_ARGUMENT for an empty schema, one over kMaxOpSchemaBytes
// or one nested deeper than kMaxOpSchemaNesting; FAILED_PRECONDITION naming
// the op, both schemas and both torch versions otherwise.
absl::Status CheckClientSchema(const c10::FunctionSchema& own, absl::string_view client_schema,
                               absl::string_view client_torch_version,
                               absl::string_view full_name);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_SCHEMA_MATCH_H_
