// Random numbers from a command's (seed, offset) (op_generators.h).
#include "ops/op_generators.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace flagos::daemon {

at::Generator SeededCpuGenerator(const v1::GeneratorValue& g) {
  return at::make_generator<at::CPUGeneratorImpl>(GeneratorSeed(g.seed(), g.offset()));
}

ABSL_CONST_INIT absl::Mutex ImplicitGeneratorLock::mu_(absl::kConstInit);

ImplicitGeneratorLock::ImplicitGeneratorLock(c10::Device kernel_device,
                                             const v1::GeneratorValue& g) {
  mu_.Lock();
  at::Generator generator = at::globalContext().defaultGenerator(kernel_device);
  std::lock_guard<std::mutex> generator_lock(generator.mutex());
  generator.set_current_seed(GeneratorSeed(g.seed(), g.offset()));
}

ImplicitGeneratorLock::~ImplicitGeneratorLock() { mu_.Unlock(); }

}  // namespace flagos::daemon
