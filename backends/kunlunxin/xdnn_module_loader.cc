// Finding and loading the xdnn binding module (xdnn_module_loader.h).
#include "xdnn_module_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flagos {
namespace {

constexpr char kModuleFile[] = "libflagos_kunlunxin_xdnn.so";

bool IsFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The directory of the running executable ("" when /proc cannot say).
std::string ExecutableDirectory() {
  std::string path(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0 || static_cast<size_t>(n) >= path.size()) return "";
  path.resize(n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// `origin`: how the path was chosen, for the errors.
absl::StatusOr<XdnnModule> Open(const std::string& path, const std::string& origin) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "the xdnn binding module ", path, " (", origin, ") does not load (",
        error == nullptr ? "" : error, "); it needs libxdnn_pytorch.so and the vendor libraries beside it: set "
        "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR to the vendor torch package's torch_xmlir directory "
        "(docs/vendors/kunlunxin/installation.md), or remove the module to run every operator "
        "on cpu_fallback"));
  }
  auto entry = reinterpret_cast<flagos_xdnn_module_entry>(dlsym(handle, FLAGOS_XDNN_MODULE_ENTRY));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the xdnn binding module ", path, " (", origin, ") has no ", FLAGOS_XDNN_MODULE_ENTRY,
        "(): it is not a flagos xdnn module; point --xdnn-module (or "
        "FLAGOS_KUNLUNXIN_XDNN_MODULE) at the libflagos_kunlunxin_xdnn.so built with this "
        "flagosd"));
  }
  const flagos_xdnn_module* module = entry();
  if (module == nullptr || module->abi != FLAGOS_XDNN_MODULE_ABI || module->call == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the xdnn binding module ", path, " (", origin, ") speaks module ABI ",
        module == nullptr ? 0u : module->abi, ", this flagosd ", FLAGOS_XDNN_MODULE_ABI,
        ": install the module built with this flagosd"));
  }
  // Never dlclose'd: vendor libraries do not survive it.
  return XdnnModule{path, module};
}

}  // namespace

absl::StatusOr<XdnnModule> LoadXdnnModule(const std::string& explicit_path) {
  std::string path = explicit_path;
  std::string origin = "--xdnn-module";
  if (path.empty()) {
    if (const char* env = std::getenv("FLAGOS_KUNLUNXIN_XDNN_MODULE"); env != nullptr) {
      path = env;
      origin = "FLAGOS_KUNLUNXIN_XDNN_MODULE";
    }
  }
  if (!path.empty()) {
    if (!IsFile(path)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the xdnn binding module ", path, " (", origin, ") does not exist: build it with "
          "XDNN_ROOT set (docs/vendors/kunlunxin/installation.md), or leave ", origin,
          " unset to run every operator on cpu_fallback"));
    }
    return Open(path, origin);
  }
  std::vector<std::string> looked;
  const std::string dir = ExecutableDirectory();
  if (!dir.empty()) {
    for (const std::string& candidate :
         {absl::StrCat(dir, "/../lib/flagosd/", kModuleFile), absl::StrCat(dir, "/", kModuleFile)}) {
      if (IsFile(candidate)) return Open(candidate, "beside flagosd");
      looked.push_back(candidate);
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no xdnn binding module (", kModuleFile, ") in ", absl::StrJoin(looked, " or "),
      ": this flagosd was built without xdnn_pytorch's header (build with XDNN_ROOT set to "
      "the vendor torch package's torch_xmlir directory)"));
}

}  // namespace flagos
