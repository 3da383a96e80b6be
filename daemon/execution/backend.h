// The device backend flagosd serves: a DeviceRuntime (memory, streams,
// events), the routes of its operators (backends/<name>/ops.conf), its
// native OpExecutor if it has kernels of its own, and ATen's CPU kernels for
// the cpu_fallback route. Chosen by name at startup.
//
// This header does not include ATen; backend.cc does.
#ifndef FLAGOS_DAEMON_EXECUTION_BACKEND_H_
#define FLAGOS_DAEMON_EXECUTION_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "flagos/kernel_facts.h"
#include "flagos/runtime.h"
#include "ops/op_routes.h"

namespace flagos {
class DeviceCollectives;
class OpExecutor;
}  // namespace flagos

namespace flagos::daemon {

// The Kunlun P800's device nodes (/dev/xpu0.., /dev/xpuctrl).
inline constexpr char kXpuDeviceGlob[] = "/dev/xpu*";

struct BackendOptions {
  // "auto", "cpu", "cuda", "kunlunxin".
  std::string name = "auto";
  // Overrides the routes of the embedded ops.conf: every operator takes
  // this route ("" keeps the file's; "cpu_fallback" runs the cpu backend as
  // a non-host-addressable device would be, for tests).
  std::string force_route;
  // CPU backend: number of emulated devices and bytes of memory each.
  int cpu_devices = 2;
  uint64_t device_memory = 8ull << 30;
  // "auto": the device nodes whose presence means this is a P800 node, so
  // that a kunlunxin runtime that does not load is an error, not emulation
  // on the CPU. Tests point it elsewhere (FLAGOS_XPU_DEVICE_GLOB, test-only).
  std::string xpu_device_glob = kXpuDeviceGlob;
  // Composite operators not to run as one call ("aten::op.overload";
  // flagosd --decompose-ops): left out of composite_ops(), so clients
  // decompose them (execution/composite_ops.h).
  std::vector<std::string> decompose_ops;
  // The operator routes to use instead of the embedded ops.conf (flagosd
  // --ops-conf; a node's calibrated route file). Empty: for kunlunxin the
  // installed kInstalledKunlunxinOpsConf when it exists, else the embedded
  // file.
  std::string ops_conf;
  // kunlunxin: the xdnn binding module to load (flagosd --xdnn-module);
  // empty: FLAGOS_KUNLUNXIN_XDNN_MODULE, else beside flagosd
  // (backends/kunlunxin/xdnn_module_loader.h).
  std::string xdnn_module;
};

// Where scripts/kunlunxin-calibrate's route file is installed on a node.
inline constexpr char kInstalledKunlunxinOpsConf[] = "/etc/flagos/kunlunxin-ops.conf";

class Backend {
 public:
  // Creates the backend `options.name` names. "auto" picks kunlunxin when
  // libxpurt loads and reports devices, else cpu, but only where no P800
  // device node exists (`xpu_device_glob`): on a P800 node whose runtime
  // does not load it fails with the kunlunxin error (the library, where it
  // was looked for, the variable to set) and never emulates devices
  // silently; --backend=cpu asks for emulation. FAILED_PRECONDITION for a
  // backend that cannot start here (kunlunxin without the SDK: the message
  // names the library, the directories searched and the variables to set)
  // or not built into this flagosd; INVALID_ARGUMENT for an unknown name or
  // bad parameters.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& options);
  ~Backend();

  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  DeviceRuntime& runtime() const { return *runtime_; }
  // The backend's own kernels (the native route); nullptr when it has none.
  OpExecutor* native_executor() const { return native_.get(); }
  // ATen's CPU kernels over host memory (the cpu_fallback route).
  OpExecutor& host_executor() const { return *host_; }
  const OpRoutes& routes() const { return routes_; }
  // What the kernels of each operator's route return that their meta
  // functions do not say: the native kernels' facts for the overloads
  // routed native, ATen CPU's for those routed cpu_fallback
  // (route_kernel_facts.h). Sent to clients at the handshake.
  const std::vector<KernelFact>& kernel_facts() const { return kernel_facts_; }
  // The composite operators it runs as one call, sorted (composite_ops.h).
  // Sent to clients at the handshake; they decompose every other one.
  const std::vector<std::string>& composite_ops() const { return composite_ops_; }
  // Where the routes came from ("backends/kunlunxin/ops.conf (embedded)", a
  // file's path).
  const std::string& routes_origin() const { return routes_origin_; }
  // What runs the native route ("ATen CPU", "xdnn_pytorch through
  // <module>"), or "" when the backend has none; then native_absent_why()
  // says why (every operator takes cpu_fallback).
  const std::string& native_description() const { return native_description_; }
  const std::string& native_absent_why() const { return native_absent_why_; }
  // What runs collectives over device memory ("BKCL (<file>)", "flagosd's
  // own threads", "flagosd's host route (why)").
  const std::string& collectives_description() const { return collectives_description_; }

 private:
  Backend(std::string name, std::unique_ptr<DeviceRuntime> runtime,
          std::unique_ptr<OpExecutor> native, std::unique_ptr<OpExecutor> host, OpRoutes routes,
          std::vector<KernelFact> kernel_facts, std::vector<std::string> composite_ops);

  const std::string name_;
  const std::unique_ptr<DeviceRuntime> runtime_;
  // The vendor collective library, if any: used by native_ (destroyed
  // before it), using runtime_.
  std::unique_ptr<DeviceCollectives> collectives_;
  const std::unique_ptr<OpExecutor> native_;
  const std::unique_ptr<OpExecutor> host_;
  const OpRoutes routes_;
  const std::vector<KernelFact> kernel_facts_;
  const std::vector<std::string> composite_ops_;
  std::string routes_origin_;
  std::string native_description_;
  std::string native_absent_why_;
  std::string collectives_description_;
};

// The version of the torch flagosd was built against ("2.13.0").
std::string TorchVersion();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_BACKEND_H_
