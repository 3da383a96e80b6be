// The CPU backend's device runtime: N emulated devices whose memory is host
// memory (mmap), each with its own memory budget.
//
// Every operation runs synchronously in the calling thread; a stream is an
// id and synchronising it has nothing to wait for (see README.md). Slots the
// contract names but this backend cannot honour are capability gaps.
//
// Thread safety: the runtime may be used from any number of threads.
#ifndef FLAGOS_BACKENDS_CPU_CPU_RUNTIME_H_
#define FLAGOS_BACKENDS_CPU_CPU_RUNTIME_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "flagos/runtime.h"

namespace flagos {

inline constexpr char kCpuBackendName[] = "cpu";

struct CpuRuntimeParams {
  // Number of emulated devices, flagos:0 .. flagos:(devices-1).
  int devices = 2;
  // Memory budget of each device, in bytes.
  uint64_t memory_per_device = 8ull << 30;

  // INVALID_ARGUMENT naming the field when a value is out of range
  // (1..kMaxDevices devices, at least kMinMemoryPerDevice bytes each).
  absl::Status Validate() const;

  static constexpr int kMaxDevices = 64;
  static constexpr uint64_t kMinMemoryPerDevice = 1ull << 20;
};

// Creates the runtime; fails with Validate()'s status.
absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateCpuRuntime(const CpuRuntimeParams& params);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_CPU_CPU_RUNTIME_H_
