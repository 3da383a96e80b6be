#include "conformance.h"
#include "cpu_runtime.h"

namespace flagos::conformance {

BackendRegistration CpuBackend() {
  return BackendRegistration{"cpu", [] {
                               CpuRuntimeParams params;
                               params.devices = 2;
                               params.memory_per_device = 64ull << 20;
                               return CreateCpuRuntime(params);
                             }};
}

}  // namespace flagos::conformance
