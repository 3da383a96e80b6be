// Which kernel scaled_dot_product_attention uses on flagos: the one the CPU
// would pick for the same inputs. ATen asks the device's
// _fused_sdp_choice_stub; without a PrivateUse1 entry it takes the math
// decomposition, while the CPU runs its fused flash-attention kernel where
// eligible, and float32 results (above all gradients) then differ beyond
// the default tolerances. With the CPU's choice, the fused calls
// (_scaled_dot_product_flash_attention_for_cpu and its backward) go through
// the fallback and flagosd runs the CPU's own kernels.
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>

namespace at::native {

REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &_fused_sdp_choice_cpp)

}  // namespace at::native
