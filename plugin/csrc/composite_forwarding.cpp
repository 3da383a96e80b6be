#include "composite_forwarding.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <unordered_set>

#include "fallback.h"
#include "op_schema.h"
#include "runtime.h"

namespace torch_fl {
namespace {

// The composite kernel PyTorch would give PrivateUse1 (the non-functional
// one first, as the dispatcher's table does).
uint8_t DecompositionOf(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)
             ? OpTraits::kCompositeDecomposeNonFunctional
             : OpTraits::kCompositeDecompose;
}

// The composite operators the daemon runs whole, read once from the
// session's handshake (as the kernel facts are); nullptr when the daemon
// sends no report.
const std::unordered_set<std::string>* ReportedCompositeOps() {
  static const std::unordered_set<std::string>* const reported =
      []() -> const std::unordered_set<std::string>* {
    const flagos::v1::NegotiateResponse& info = Session().info();
    if (!info.has_composite_ops()) return nullptr;
    const auto& ops = info.composite_ops().ops();
    return new std::unordered_set<std::string>(ops.begin(), ops.end());
  }();
  return reported;
}

uint8_t CompositeRouteOf(const c10::OperatorHandle& op, const OpTraits& traits) {
  uint8_t route = traits.composite.load(std::memory_order_relaxed);
  if (route != OpTraits::kCompositeUnknown) return route;
  const std::unordered_set<std::string>* reported = ReportedCompositeOps();
  // A daemon that sends no report runs whole what has a CPU kernel (what
  // flagosd's ATen kernels can run); one that reports says which.
  const bool forward = reported == nullptr
                           ? op.hasKernelForDispatchKey(c10::DispatchKey::CPU)
                           : reported->count(traits.describe) > 0;
  route = forward ? OpTraits::kCompositeForward : DecompositionOf(op);
  traits.composite.store(route, std::memory_order_relaxed);
  return route;
}

void CompositeOp(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpTraits& traits = TraitsOf(op);
  switch (CompositeRouteOf(op, traits)) {
    case OpTraits::kCompositeForward:
      RunOnDaemon(op, traits, stack);
      return;
    case OpTraits::kCompositeDecomposeNonFunctional:
      op.callBoxedForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional, *stack);
      return;
    default:
      op.callBoxedForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd, *stack);
      return;
  }
}

bool ReturnsAView(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    if (r.alias_info() != nullptr) return true;
  }
  return false;
}

}  // namespace

int ForwardCompositeOps() {
  static int forwarded = [] {
    const char* disabled = std::getenv("FLAGOS_COMPOSITE_OPS");
    if (disabled != nullptr && std::string(disabled) == "decompose") return 0;
    // Kept for the life of the process, like every registration.
    auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                       c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    int count = 0;
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
      if (!op.has_value() || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        continue;
      }
      // Without a CPU kernel: only what a daemon's own kernels may run whole
      // (a native route binds embedding, which ATen's CPU runs decomposed).
      // Views (expand, permute, t, ...) stay PyTorch's unboxed composite
      // kernels: no daemon runs them, and they are on every step's path.
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU) && ReturnsAView(op->schema())) {
        continue;
      }
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&CompositeOp>());
      ++count;
    }
    return count;
  }();
  return forwarded;
}

}  // namespace torch_fl
