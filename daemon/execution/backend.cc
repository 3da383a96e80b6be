#include "execution/backend.h"

#include <glob.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
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
#include "bkcl_collectives.h"
#include "collectives/library_collectives.h"
#include "kunlunxin_runtime.h"
#include "logging.h"
#include "xdnn_module_loader.h"
#include "xdnn_op_executor.h"

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

bool FileExists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// The routes of `backend` and where they came from.
absl::StatusOr<OpRoutes> RoutesFor(absl::string_view backend, const BackendOptions& options,
                                   std::string* origin) {
  if (!options.force_route.empty()) {
    *origin = absl::StrCat("--op-route=", options.force_route);
    return OpRoutes::Parse(absl::StrCat("default = ", options.force_route, "\n"), "--op-route");
  }
  std::string file = options.ops_conf;
  if (file.empty() && backend == kKunlunxinBackendName && FileExists(kInstalledKunlunxinOpsConf)) {
    file = kInstalledKunlunxinOpsConf;
  }
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--ops-conf: cannot read ", file, " (write it with scripts/kunlunxin-calibrate --out ",
          file, ", or leave --ops-conf out to use the routes built into flagosd)"));
    }
    std::stringstream text;
    text << in.rdbuf();
    *origin = file;
    return OpRoutes::Parse(text.str(), file);
  }
  *origin = absl::StrCat("backends/", backend, "/ops.conf (built in)");
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
  std::string routes_origin;
  absl::StatusOr<OpRoutes> routes = RoutesFor(name, options, &routes_origin);
  if (!routes.ok()) return routes.status();
  std::unique_ptr<OpExecutor> host = CreateCpuOpExecutor();
  // The native route: ATen's CPU kernels over the cpu backend's host
  // memory; on kunlunxin, xdnn_pytorch through the binding module when it
  // loads. Without it every kunlunxin operator takes cpu_fallback (one log
  // line says why; /metrics shows flagosd_native_route_available 0).
  std::unique_ptr<OpExecutor> native;
  std::string native_description;
  std::string native_absent_why;
  std::unique_ptr<DeviceCollectives> collectives;
  std::string collectives_description = "flagosd's own threads";
  if (name == kCpuBackendName) {
    native = CreateCpuOpExecutor(/*foreach_lists=*/true);
    native_description = "ATen CPU";
  } else if (name == kKunlunxinBackendName) {
    absl::StatusOr<XdnnModule> module = LoadXdnnModule(options.xdnn_module);
    if (module.ok()) {
      native_description = absl::StrCat("xdnn_pytorch through ", module->path, " (",
                                        module->module->built_against, ", ",
                                        module->module->nops, " overloads bound)");
      native = CreateXdnnOpExecutor(*runtime, *std::move(module), host->kernel_facts());
    } else if (absl::IsNotFound(module.status())) {
      native_absent_why = std::string(module.status().message());
    } else {
      // A module that is there but does not load (its vendor libraries not
      // found, another ABI): a clear error, not a node silently slower.
      return absl::FailedPreconditionError(
          absl::StrCat("kunlunxin backend: ", module.status().message()));
    }
    const bool wants_native =
        routes->native_count() > 0 || routes->default_route() == OpRoute::kNative;
    if (native == nullptr) {
      LogWarning(absl::StrCat("kunlunxin: the native (xdnn) route is absent, so every operator "
                              "takes cpu_fallback",
                              wants_native ? absl::StrCat(" although ", routes_origin,
                                                          " routes some native")
                                           : std::string(),
                              ": ", native_absent_why));
      if (wants_native) {
        absl::StatusOr<OpRoutes> fallback =
            OpRoutes::Parse("default = cpu_fallback\n", "no native route");
        if (!fallback.ok()) return fallback.status();
        routes = *std::move(fallback);
      }
    } else {
      LogInfo(absl::StrCat("kunlunxin: native route: ", native_description, "; ",
                           routes->native_count(), " overloads routed native by ",
                           routes_origin));
    }
    // The collectives: BKCL over device memory when it loads, else the
    // daemon's host route (library_collectives.h).
    absl::StatusOr<std::unique_ptr<DeviceCollectives>> bkcl =
        CreateBkclCollectives(*runtime, kunlunxin::BkclSearch());
    if (bkcl.ok()) {
      collectives = *std::move(bkcl);
      native = CreateLibraryCollectiveExecutor(*collectives, *runtime, std::move(native));
      routes->RouteNamespace(LibraryCollectivesNamespace(), OpRoute::kNative);
      collectives_description = collectives->description();
      LogInfo(absl::StrCat("kunlunxin: collectives run through ", collectives_description));
    } else if (absl::IsNotFound(bkcl.status())) {
      collectives_description = absl::StrCat("flagosd's host route (", bkcl.status().message(), ")");
      LogInfo(absl::StrCat("kunlunxin: collectives run on flagosd's host route (cpu_fallback): ",
                           bkcl.status().message()));
    } else {
      return bkcl.status();
    }
  }
  if (native == nullptr && (routes->native_count() > 0 ||
                            routes->default_route() == OpRoute::kNative)) {
    return absl::FailedPreconditionError(absl::StrCat(
        routes_origin, " routes operators native but the ", name,
        " backend has no native kernels in this flagosd; route them cpu_fallback"));
  }
  // The facts and composite operators of the kernels each route runs
  // (xdnn's facts are ATen CPU's: xdnn_op_executor.h says why).
  std::vector<KernelFact> facts =
      RouteKernelFacts(*routes, native == nullptr ? nullptr : &native->kernel_facts(),
                       host->kernel_facts(), &OverloadsOf);
  absl::StatusOr<std::vector<std::string>> composite_ops =
      CompositeOpsRunWhole(*routes, native.get(), *host, options.decompose_ops);
  if (!composite_ops.ok()) return composite_ops.status();
  auto backend = std::unique_ptr<Backend>(
      new Backend(name, std::move(runtime), std::move(native), std::move(host),
                  *std::move(routes), std::move(facts), *std::move(composite_ops)));
  backend->routes_origin_ = std::move(routes_origin);
  backend->native_description_ = std::move(native_description);
  backend->native_absent_why_ = std::move(native_absent_why);
  backend->collectives_ = std::move(collectives);
  backend->collectives_description_ = std::move(collectives_description);
  return backend;
}

std::string TorchVersion() { return TORCH_VERSION; }

}  // namespace flagos::daemon
