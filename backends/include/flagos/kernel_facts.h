// Facts about a backend's kernels that the client needs and cannot derive:
// calls whose kernel returns other output metadata than the op's meta
// function (which follows CUDA) says. Each set of kernels states its own
// (OpExecutor::kernel_facts: ATen's CPU kernels in
// backends/cpu/cpu_kernel_facts.cc, which the cpu backend runs natively and
// every backend runs on its cpu_fallback route); flagosd sends, for each
// operator overload, the facts of the kernels its route runs
// (daemon/execution/route_kernel_facts.h) at the handshake
// (NegotiateResponse.kernel_facts), so the client hard-codes no backend's
// behaviour. No ATen here.
#ifndef FLAGOS_BACKENDS_KERNEL_FACTS_H_
#define FLAGOS_BACKENDS_KERNEL_FACTS_H_

#include <string>
#include <vector>

namespace flagos {

struct KernelFact {
  std::string op;  // "aten::native_batch_norm" (the overloads below)
  // When the kernel's outputs differ (alternatives).
  bool always = false;
  bool reduced_precision_input = false;  // first argument float16 / bfloat16
  bool eval_mode = false;                // the op's `training` argument is false
  bool mixed_dtype_operands = false;     // its tensor arguments are not all of one dtype
  // The overloads it holds for ("" names the default overload); empty:
  // every overload. Set by the daemon when routes differ between an op's
  // overloads; a backend's own facts leave it empty.
  std::vector<std::string> overloads = {};
};

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_KERNEL_FACTS_H_
