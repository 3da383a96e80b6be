// The composite operators a backend runs as one call: ATen operators with
// a CompositeExplicitAutograd (or ...NonFunctional) implementation, which
// a client decomposes into other operators unless the daemon runs the
// whole operator on a kernel of its own. flagosd reports them at the
// handshake (NegotiateResponse.composite_ops) and torch_fl forwards exactly
// those; it decomposes the rest, as PyTorch does for a device without the
// kernel.
//
// An operator counts when the kernels of its route (ops.conf) have a kernel
// for it (OpExecutor::HasKernel: ATen's CPU kernel, and the _foreach_ lists'
// CPU loop, for the cpu backend; ATen's CPU kernel for the cpu_fallback
// route) and it is not in `decomposed`
// (flagosd --decompose-ops).
//
// This header does not include ATen; composite_ops.cc does.
#ifndef FLAGOS_DAEMON_EXECUTION_COMPOSITE_OPS_H_
#define FLAGOS_DAEMON_EXECUTION_COMPOSITE_OPS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/op_routes.h"

namespace flagos {
class OpExecutor;
}  // namespace flagos

namespace flagos::daemon {

// Sorted names ("aten::add.Tensor"; no overload for the default one).
// `native`: the native kernels (nullptr when the backend has none), `host`:
// the cpu_fallback route's. INVALID_ARGUMENT naming the entry when a name
// in `decomposed` is no composite operator the backend runs whole (a
// typo, or an operator clients never forward).
absl::StatusOr<std::vector<std::string>> CompositeOpsRunWhole(
    const OpRoutes& routes, const OpExecutor* native, const OpExecutor& host,
    const std::vector<std::string>& decomposed);

// The overload names of operator `op` ("aten::native_batch_norm") in
// flagosd's torch, "" for the default one; empty when it has none.
std::vector<std::string> OverloadsOf(absl::string_view op);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_COMPOSITE_OPS_H_
