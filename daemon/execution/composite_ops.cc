#include "execution/composite_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "flagos/op_executor.h"

namespace flagos::daemon {
namespace {

std::string FullName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : absl::StrCat(name.name, ".", name.overload_name);
}

// What a client would otherwise run decomposed: the composite kernels
// PyTorch gives every backend without a kernel of its own (torch_fl's
// forwarding rule, plugin/csrc/composite_forwarding.cpp).
bool IsComposite(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CompositeOpsRunWhole(
    const OpRoutes& routes, const OpExecutor* native, const OpExecutor& host,
    const std::vector<std::string>& decomposed) {
  absl::flat_hash_set<std::string> unclaimed(decomposed.begin(), decomposed.end());
  std::vector<std::string> whole;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (!absl::StartsWith(name.name, "aten::")) continue;
    std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
    if (!op.has_value() || !IsComposite(*op)) continue;
    std::string full_name = FullName(name);
    const OpExecutor* kernels = routes.RouteOf(full_name) == OpRoute::kNative ? native : &host;
    if (kernels == nullptr || !kernels->HasKernel(*op)) continue;
    if (unclaimed.erase(full_name) > 0) continue;
    whole.push_back(std::move(full_name));
  }
  if (!unclaimed.empty()) {
    std::vector<std::string> names(unclaimed.begin(), unclaimed.end());
    std::sort(names.begin(), names.end());
    return absl::InvalidArgumentError(absl::StrCat(
        "--decompose-ops names ", absl::StrJoin(names, ", "),
        ", which this backend does not run as one call anyway (not a composite ATen operator "
        "with a kernel on its route); name operators as aten::op.overload (no overload for "
        "the default one), as NegotiateResponse.composite_ops lists them"));
  }
  std::sort(whole.begin(), whole.end());
  return whole;
}

std::vector<std::string> OverloadsOf(absl::string_view op) {
  std::vector<std::string> overloads;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name == op) overloads.push_back(name.overload_name);
  }
  std::sort(overloads.begin(), overloads.end());
  return overloads;
}

}  // namespace flagos::daemon
