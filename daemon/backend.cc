#include "backend.h"

#include <torch/headeronly/version.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "cpu_op_executor.h"
#include "cpu_runtime.h"

namespace flagos::daemon {

Backend::Backend(std::string name, std::unique_ptr<DeviceRuntime> runtime,
                 std::unique_ptr<OpExecutor> executor)
    : name_(std::move(name)), runtime_(std::move(runtime)), executor_(std::move(executor)) {}

Backend::~Backend() = default;

absl::StatusOr<std::unique_ptr<Backend>> Backend::Create(const BackendOptions& options) {
  if (options.name == "auto" || options.name == kCpuBackendName) {
    CpuRuntimeParams params;
    params.devices = options.cpu_devices;
    params.memory_per_device = options.device_memory;
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = CreateCpuRuntime(params);
    if (!runtime.ok()) return runtime.status();
    return std::unique_ptr<Backend>(
        new Backend(kCpuBackendName, *std::move(runtime), CreateCpuOpExecutor()));
  }
  if (options.name == "cuda" || options.name == "kunlunxin") {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend ", options.name,
        " is not built into this flagosd (built in: cpu); use --backend=cpu or a flagosd built "
        "with the ",
        options.name, " backend"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown backend '", options.name,
                                                 "': choose auto, cpu, cuda or kunlunxin"));
}

std::string TorchVersion() { return TORCH_VERSION; }

}  // namespace flagos::daemon
