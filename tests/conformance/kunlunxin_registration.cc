// The kunlunxin backend over the test-only fake libxpurt (tests/fakes/xpurt):
// a hostile stand-in for the P800 whose device memory the host cannot read
// and whose work completes late. The fake reads FAKE_XPU_* once, when it is
// loaded: the values below apply unless the caller's environment already
// sets them.
#include <cstdlib>

#include "conformance.h"
#include "kunlunxin_runtime.h"

namespace flagos::conformance {

BackendRegistration KunlunxinFakeBackend() {
  return BackendRegistration{"kunlunxin_fake", [] {
                               setenv("FAKE_XPU_MEMORY", "67108864", /*overwrite=*/0);
                               setenv("FAKE_XPU_DELAY_US", "200", /*overwrite=*/0);
                               setenv("FLAGOS_KUNLUNXIN_XPURT",
                                      FLAGOS_FAKE_XPU_ROOT "/so/libxpurt.so.2", /*overwrite=*/0);
                               return CreateKunlunxinRuntime(KunlunxinRuntimeParams{});
                             }};
}

}  // namespace flagos::conformance
