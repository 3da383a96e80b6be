// Which operators flagosd serves, decided from the operator's schema alone:
// the refusals register_op applies whatever a client asks (CheckServable),
// the argument rules bound to a served operator's schema
// (BindArgumentRules, op_argument_rules.h), and the listing of every
// operator in flagosd's torch with its verdict (ListServedOps,
// `flagosd --list-served-ops`, from which
// docs/reference/served-operators.md is generated).
//
// This header does not include ATen; op_servability.cc does.
//
// Thread safety: pure functions of immutable schemas; call from any thread.
#ifndef FLAGOS_DAEMON_OPS_OP_SERVABILITY_H_
#define FLAGOS_DAEMON_OPS_OP_SERVABILITY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ops/op_argument_rules.h"

namespace c10 {
struct FunctionSchema;
}  // namespace c10

namespace flagos::daemon {

// PERMISSION_DENIED naming `full_name` ("register_op <full_name>: flagosd
// does not run this operator: <why> (docs/reference/errors.md ...)") when
// flagosd does not serve operator `schema`, else OK. Refused:
//   - views: an op that returns a tensor aliasing an argument it does not
//     write (aten::_reshape_alias, aten::as_strided, ...) builds a tensor
//     over memory the daemon never range-checked; torch_fl makes views in
//     the client and never forwards one;
//   - ops that reach the host beyond device memory: files (aten::from_file
//     reads and creates them as the daemon's user);
//   - ops whose kernels index their tensors by int arguments no rule of
//     op_argument_rules.h can bound (aten::_sobol_engine_*);
//   - ops taking raw storages, whose memory the daemon cannot check;
//   - ops outside ATen's namespace: distributed (c10d, symm_mem: networks,
//     other processes' memory), profiler, backend-specific and test ops,
//     which torch_fl never forwards (docs/reference/served-operators.md).
absl::Status CheckServable(const c10::FunctionSchema& schema, const std::string& full_name);

// The rules of op_argument_rules.h for `schema`'s op, bound to its
// arguments (empty when the op has none); INTERNAL when a rule names an
// argument the schema lacks (a mistake in the table, op_argument_rules.h).
absl::StatusOr<BoundArgumentRules> BindArgumentRules(const c10::FunctionSchema& schema);

// Every operator in flagosd's torch (all namespaces, every overload), one per
// line sorted by name: "<name.overload>\tserved" or "<name.overload>\tserved\t
// <its argument rules>" or "<name.overload>\trefused\t<why>", by the rule
// register_op applies (`flagosd --list-served-ops`;
// docs/reference/served-operators.md is generated from it).
std::string ListServedOps();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_SERVABILITY_H_
