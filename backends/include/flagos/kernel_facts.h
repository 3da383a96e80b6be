// Facts about a backend's kernels that the client needs and cannot derive:
// calls whose kernel returns other output metadata than the op's meta
// function (which follows CUDA) says. flagosd sends them at the handshake
// (NegotiateResponse.kernel_facts), so the client hard-codes no backend's
// behaviour. No ATen here.
#ifndef FLAGOS_BACKENDS_KERNEL_FACTS_H_
#define FLAGOS_BACKENDS_KERNEL_FACTS_H_

#include <string>
#include <vector>

namespace flagos {

struct KernelFact {
  std::string op;  // "aten::native_batch_norm": every overload
  // When the kernel's outputs differ (alternatives).
  bool always = false;
  bool reduced_precision_input = false;  // first argument float16 / bfloat16
  bool eval_mode = false;                // the op's `training` argument is false
  bool mixed_dtype_operands = false;     // its tensor arguments are not all of one dtype
};

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_KERNEL_FACTS_H_
