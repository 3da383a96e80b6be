// The device backend flagosd serves: a DeviceRuntime (memory, streams,
// events) and an OpExecutor (ATen operators over device memory), chosen by
// name at startup.
//
// This header does not include ATen; backend.cc does.
#ifndef FLAGOS_DAEMON_BACKEND_H_
#define FLAGOS_DAEMON_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "flagos/runtime.h"

namespace flagos {
class OpExecutor;
}  // namespace flagos

namespace flagos::daemon {

struct BackendOptions {
  // "auto", "cpu", "cuda", "kunlunxin".
  std::string name = "auto";
  // CPU backend: number of emulated devices and bytes of memory each.
  int cpu_devices = 2;
  uint64_t device_memory = 8ull << 30;
};

class Backend {
 public:
  // Creates the backend `options.name` names. "auto" picks the best one
  // built in (today: cpu). FAILED_PRECONDITION for a backend not built into
  // this flagosd; INVALID_ARGUMENT for an unknown name or bad parameters.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& options);
  ~Backend();

  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  DeviceRuntime& runtime() const { return *runtime_; }
  OpExecutor& executor() const { return *executor_; }

 private:
  Backend(std::string name, std::unique_ptr<DeviceRuntime> runtime,
          std::unique_ptr<OpExecutor> executor);

  const std::string name_;
  const std::unique_ptr<DeviceRuntime> runtime_;
  const std::unique_ptr<OpExecutor> executor_;
};

// The version of the torch flagosd was built against ("2.13.0").
std::string TorchVersion();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_BACKEND_H_
