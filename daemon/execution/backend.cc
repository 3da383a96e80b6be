#include "execution/backend.h"

#include <glob.h>
#include <torch/headeronly/version.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cpu_op_executor.h"
#include "cpu_runtime.h"
#include "execution/composite_ops.h"
#include "execution/route_kernel_facts.h"
#include "flagos/op_executor.h"
#include "kunlunxin_runtime.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

// The files `pattern` matches, sorted (glob's order); none when it matches
// nothing or cannot be read.
std::vector<std::string> XpuDeviceNodes(const std::string& pattern) {
  std::vector<std::string> nodes;
  glob_t found{};
  if (glob(pattern.c_str(), 0, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc; ++i) nodes.emplace_back(found.gl_pathv[i]);
  }
  globfree(&found);
  return nodes;
}

absl::StatusOr<OpRoutes> RoutesFor(absl::string_view backend, const BackendOptions& options) {
  if (!options.force_route.empty()) {
    return OpRoutes::Parse(absl::StrCat("default = ", options.force_route, "\n"), "--op-route");
  }
  return OpRoutes::Parse(EmbeddedOpsConf(backend), absl::StrCat("backends/", backend, "/ops.conf"));
}

}  // namespace

Backend::Backend(std::string name, std::unique_ptr<DeviceRuntime> runtime,
                 std::unique_ptr<OpExecutor> native, std::unique_ptr<OpExecutor> host,
                 OpRoutes routes, std::vector<KernelFact> kernel_facts,
                 std::vector<std::string> composite_ops)
    : name_(std::move(name)),
      runtime_(std::move(runtime)),
      native_(std::move(native)),
      host_(std::move(host)),
      routes_(std::move(routes)),
      kernel_facts_(std::move(kernel_facts)),
      composite_ops_(std::move(composite_ops)) {}

Backend::~Backend() = default;

absl::StatusOr<std::unique_ptr<Backend>> Backend::Create(const BackendOptions& options) {
  std::string name = options.name;
  std::unique_ptr<DeviceRuntime> runtime;
  if (name == "auto" || name == kKunlunxinBackendName) {
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> kunlunxin =
        CreateKunlunxinRuntime(KunlunxinRuntimeParams{});
    if (kunlunxin.ok()) {
      runtime = *std::move(kunlunxin);
      name = kKunlunxinBackendName;
    } else if (name == kKunlunxinBackendName) {
      return kunlunxin.status();
    } else if (std::vector<std::string> nodes = XpuDeviceNodes(options.xpu_device_glob);
               !nodes.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--backend=auto: this node has Kunlun P800 device nodes (",
          absl::StrJoin(nodes.size() > 3 ? std::vector<std::string>(nodes.begin(),
                                                                    nodes.begin() + 3)
                                         : nodes,
                        ", "),
          nodes.size() > 3 ? absl::StrCat(" and ", nodes.size() - 3, " more") : std::string(),
          ") but the kunlunxin backend cannot start: ", kunlunxin.status().message(),
          " (under systemd, set the variable in /etc/default/flagosd and install the "
          "kunlunxin.conf drop-in: docs/vendors/kunlunxin/installation.md). flagosd does not "
          "fall back to emulated devices on a P800 node; to emulate on the CPU anyway, start "
          "it with --backend=cpu"));
    } else {
      LogInfo(absl::StrCat("backend auto: no Kunlun P800 device node (", options.xpu_device_glob,
                           ") and kunlunxin is not available (", kunlunxin.status().message(),
                           "); using cpu"));
      name = kCpuBackendName;
    }
  }
  if (name == kCpuBackendName) {
    CpuRuntimeParams params;
    params.devices = options.cpu_devices;
    params.memory_per_device = options.device_memory;
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> cpu = CreateCpuRuntime(params);
    if (!cpu.ok()) return cpu.status();
    runtime = *std::move(cpu);
  } else if (runtime == nullptr) {
    if (name == "cuda") {
      return absl::FailedPreconditionError(
          "backend cuda is not built into this flagosd (built in: cpu, kunlunxin); use "
          "--backend=cpu or --backend=kunlunxin");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown backend '", options.name, "': choose auto, cpu, cuda or kunlunxin"));
  }
  absl::StatusOr<OpRoutes> routes = RoutesFor(name, options);
  if (!routes.ok()) return routes.status();
  // Only the cpu backend has kernels of its own today (ATen's CPU kernels
  // over host-addressable memory); the kunlunxin backend's xdnn kernels are
  // a later step, so every operator there takes cpu_fallback.
  std::unique_ptr<OpExecutor> native;
  if (name == kCpuBackendName) native = CreateCpuOpExecutor();
  if (native == nullptr && (routes->native_count() > 0 ||
                            routes->default_route() == OpRoute::kNative)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backends/", name, "/ops.conf routes operators native but the ", name,
        " backend has no native kernels in this flagosd; route them cpu_fallback"));
  }
  std::unique_ptr<OpExecutor> host = CreateCpuOpExecutor();
  // The facts and composite operators of the kernels each route runs: the
  // cpu backend's native kernels are ATen CPU's, like the cpu_fallback
  // route's that every kunlunxin operator takes today.
  std::vector<KernelFact> facts =
      RouteKernelFacts(*routes, native == nullptr ? nullptr : &native->kernel_facts(),
                       host->kernel_facts(), &OverloadsOf);
  absl::StatusOr<std::vector<std::string>> composite_ops =
      CompositeOpsRunWhole(*routes, native.get(), *host, options.decompose_ops);
  if (!composite_ops.ok()) return composite_ops.status();
  return std::unique_ptr<Backend>(new Backend(name, std::move(runtime), std::move(native),
                                              std::move(host), *std::move(routes),
                                              std::move(facts), *std::move(composite_ops)));
}

std::string TorchVersion() { return TORCH_VERSION; }

}  // namespace flagos::daemon
