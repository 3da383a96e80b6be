// What ATen's CPU kernels return that their meta functions do not say. They
// run every op of the cpu backend and every cpu_fallback op of any backend.
#ifndef FLAGOS_BACKENDS_CPU_CPU_KERNEL_FACTS_H_
#define FLAGOS_BACKENDS_CPU_CPU_KERNEL_FACTS_H_

#include <vector>

#include "flagos/kernel_facts.h"

namespace flagos {

const std::vector<KernelFact>& CpuKernelFacts();

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_CPU_CPU_KERNEL_FACTS_H_
