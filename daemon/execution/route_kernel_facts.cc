#include "execution/route_kernel_facts.h"

#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

// Appends each of `facts` for the overloads of its op that take `route`.
void AddFactsOfRoute(const OpRoutes& routes, OpRoute route, const std::vector<KernelFact>& facts,
                     absl::FunctionRef<std::vector<std::string>(absl::string_view op)> overloads_of,
                     std::vector<KernelFact>* out) {
  for (const KernelFact& fact : facts) {
    const std::vector<std::string> overloads = overloads_of(fact.op);
    std::vector<std::string> on_route;
    for (const std::string& overload : overloads) {
      const std::string name = overload.empty() ? fact.op : absl::StrCat(fact.op, ".", overload);
      if (routes.RouteOf(name) == route) on_route.push_back(overload);
    }
    if (on_route.empty()) continue;
    KernelFact routed = fact;
    // Every overload on this route: the fact says so by naming none.
    routed.overloads.clear();
    if (on_route.size() < overloads.size()) routed.overloads = std::move(on_route);
    out->push_back(std::move(routed));
  }
}

}  // namespace

std::vector<KernelFact> RouteKernelFacts(
    const OpRoutes& routes, const std::vector<KernelFact>* native_facts,
    const std::vector<KernelFact>& fallback_facts,
    absl::FunctionRef<std::vector<std::string>(absl::string_view op)> overloads_of) {
  std::vector<KernelFact> facts;
  if (native_facts != nullptr) {
    AddFactsOfRoute(routes, OpRoute::kNative, *native_facts, overloads_of, &facts);
  }
  AddFactsOfRoute(routes, OpRoute::kCpuFallback, fallback_facts, overloads_of, &facts);
  return facts;
}

}  // namespace flagos::daemon
