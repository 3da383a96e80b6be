// The kernel facts flagosd sends a client (NegotiateResponse.kernel_facts):
// for each operator overload, the facts of the kernels its route runs. An
// overload routed `native` gets the native kernels' facts, one routed
// `cpu_fallback` the facts of ATen's CPU kernels (the cpu_fallback route's);
// a fact whose op has overloads on both routes names the overloads it holds
// for (KernelFact::overloads). No ATen here: the caller says which
// overloads an operator has.
#ifndef FLAGOS_DAEMON_EXECUTION_ROUTE_KERNEL_FACTS_H_
#define FLAGOS_DAEMON_EXECUTION_ROUTE_KERNEL_FACTS_H_

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "flagos/kernel_facts.h"
#include "ops/op_routes.h"

namespace flagos::daemon {

// `native_facts`: the native kernels' facts, nullptr for a backend without
// native kernels; `fallback_facts`: the cpu_fallback route's.
// `overloads_of("aten::native_batch_norm")` lists the operator's overload
// names in flagosd's torch ("" for the default one); a fact about an
// operator that torch does not have is dropped (no call can reach it).
std::vector<KernelFact> RouteKernelFacts(
    const OpRoutes& routes, const std::vector<KernelFact>* native_facts,
    const std::vector<KernelFact>& fallback_facts,
    absl::FunctionRef<std::vector<std::string>(absl::string_view op)> overloads_of);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_ROUTE_KERNEL_FACTS_H_
