#include "xpurt_library.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace flagos::kunlunxin {
namespace {

constexpr char kPrefix[] = "kunlunxin backend: ";
constexpr char kDefaultSdkSoDir[] = "/usr/local/xpu/so";
constexpr char kInstallGuide[] = "docs/vendors/kunlunxin/installation.md";

// The libraries libxpu_blas.so needs in the global scope (its undefined
// cudaGetDriverEntryPoint), loaded before libxpurt.
constexpr const char* kPreloads[] = {"libxpucuda.so", "libcudart.so.12"};
constexpr const char* kXpurtNames[] = {"libxpurt.so.2", "libxpurt.so"};
constexpr const char* kXpumlNames[] = {"libxpuml.so.1", "libxpuml.so"};
// In dependency order: libxdnn_pytorch.so needs the other three.
constexpr const char* kXdnnLibraries[] = {"libxpu_blas.so", "libxpu_dnn.so",
                                          "libxpu_flash_attention.so", "libxdnn_pytorch.so"};

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string DlError() {
  const char* error = dlerror();
  return error == nullptr ? std::string("unknown dlopen error") : std::string(error);
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string Join(absl::string_view dir, absl::string_view name) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  return absl::StrCat(dir, "/", name);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

void AddUnique(std::vector<std::string>* dirs, std::string dir) {
  if (dir.empty()) return;
  if (std::find(dirs->begin(), dirs->end(), dir) == dirs->end()) dirs->push_back(std::move(dir));
}

}  // namespace

std::vector<std::string> SdkDirs(const XpurtSearch& search) {
  std::vector<std::string> dirs;
  if (!search.xpu_root.empty()) {
    AddUnique(&dirs, Join(search.xpu_root, "so"));
    AddUnique(&dirs, Join(search.xpu_root, "lib"));
    AddUnique(&dirs, Join(search.xpu_root, "xcudart/lib"));
  }
  AddUnique(&dirs, kDefaultSdkSoDir);
  return dirs;
}

namespace {

std::vector<std::string> XdnnDirs(const XpurtSearch& search) {
  std::vector<std::string> dirs;
  for (absl::string_view dir : absl::StrSplit(search.xdnn_lib_dirs, ':', absl::SkipEmpty())) {
    AddUnique(&dirs, std::string(dir));
  }
  return dirs;
}

// The libxpurt files in `dir`, in the order to try them: libxpurt.so.2,
// libxpurt.so, then any other libxpurt.so.* (sorted; for example the
// measured install's libxpurt.so.12.9.1.kunlun).
std::vector<std::string> XpurtFilesIn(const std::string& dir) {
  std::vector<std::string> files;
  for (const char* name : kXpurtNames) {
    const std::string path = Join(dir, name);
    if (Exists(path)) files.push_back(path);
  }
  std::vector<std::string> others;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "libxpurt.so.") && name != kXpurtNames[0]) {
      others.push_back(entry.path().string());
    }
  }
  std::sort(others.begin(), others.end());
  files.insert(files.end(), others.begin(), others.end());
  return files;
}

// The loader's name for the file behind `handle` (a full path when the
// loader found it on its own path).
std::string LoadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* out) {
  void* symbol = dlsym(handle, name);
  *out = reinterpret_cast<Fn>(symbol);
  return symbol != nullptr;
}

std::string EnvironmentHelp() {
  return absl::StrCat(
      "Install the XPU SDK and set XPU_ROOT to its root (usually /usr/local/xpu), or set "
      "FLAGOS_KUNLUNXIN_XPURT to the library file; for the xdnn op libraries set "
      "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR (see ",
      kInstallGuide, ").");
}

}  // namespace

XpurtSearch XpurtSearch::WithEnvironment() const {
  XpurtSearch search = *this;
  if (search.xpurt_file.empty()) search.xpurt_file = Env("FLAGOS_KUNLUNXIN_XPURT");
  if (search.xpu_root.empty()) search.xpu_root = Env("XPU_ROOT");
  if (search.xdnn_lib_dirs.empty()) search.xdnn_lib_dirs = Env("FLAGOS_KUNLUNXIN_XDNN_LIB_DIR");
  return search;
}

absl::StatusOr<std::unique_ptr<XpurtLibrary>> XpurtLibrary::Load(const XpurtSearch& search) {
  std::unique_ptr<XpurtLibrary> library(new XpurtLibrary());
  const std::vector<std::string> sdk_dirs = SdkDirs(search);
  const std::vector<std::string> xdnn_dirs = XdnnDirs(search);

  // 1. The CUDA-compatible layer the xdnn libraries resolve against, from
  // the first searched directory that has it. Absence is normal (an SDK
  // without the vendor torch package): nothing here needs it yet.
  std::vector<std::string> preload_dirs;
  if (!search.xpurt_file.empty()) AddUnique(&preload_dirs, DirName(search.xpurt_file));
  for (const std::string& dir : sdk_dirs) AddUnique(&preload_dirs, dir);
  for (const std::string& dir : xdnn_dirs) AddUnique(&preload_dirs, dir);
  std::vector<std::string> preload_failures;
  for (const char* name : kPreloads) {
    for (const std::string& dir : preload_dirs) {
      const std::string path = Join(dir, name);
      if (!Exists(path)) continue;
      if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
        library->handles_.push_back(handle);
        library->preloaded_.push_back(path);
      } else {
        preload_failures.push_back(absl::StrCat(path, " (", DlError(), ")"));
      }
      break;
    }
  }

  // 2. libxpurt.
  void* xpurt = nullptr;
  if (!search.xpurt_file.empty()) {
    // The user named the file: use it or say why not, never another one.
    if (!Exists(search.xpurt_file)) {
      return absl::FailedPreconditionError(absl::StrCat(
          kPrefix, "FLAGOS_KUNLUNXIN_XPURT names ", search.xpurt_file,
          ", which does not exist: point it at the SDK's libxpurt (usually "
          "$XPU_ROOT/so/libxpurt.so.2), or unset it to search XPU_ROOT, ",
          kDefaultSdkSoDir, " and the loader path. ", EnvironmentHelp()));
    }
    xpurt = dlopen(search.xpurt_file.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (xpurt == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(kPrefix, "cannot load libxpurt from ", search.xpurt_file,
                       " (FLAGOS_KUNLUNXIN_XPURT): ", DlError(), ". ", EnvironmentHelp()));
    }
    library->path_ = search.xpurt_file;
  } else {
    std::vector<std::string> searched;
    if (search.xpu_root.empty()) searched.push_back("XPU_ROOT (unset)");
    for (const std::string& dir : sdk_dirs) {
      const std::vector<std::string> files = XpurtFilesIn(dir);
      if (files.empty()) {
        searched.push_back(absl::StrCat(dir, " (no libxpurt.so.2, libxpurt.so or libxpurt.so.*)"));
        continue;
      }
      for (const std::string& file : files) {
        xpurt = dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
        if (xpurt != nullptr) {
          library->path_ = file;
          break;
        }
        searched.push_back(absl::StrCat(file, " (", DlError(), ")"));
      }
      if (xpurt != nullptr) break;
    }
    std::vector<std::string> loader_errors;
    for (const char* name : kXpurtNames) {
      if (xpurt != nullptr) break;
      xpurt = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (xpurt != nullptr) {
        library->path_ = LoadedPath(xpurt, name);
      } else {
        loader_errors.push_back(DlError());
      }
    }
    if (xpurt == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          kPrefix, "libxpurt (the Kunlun XPU runtime) was not found: searched ",
          absl::StrJoin(searched, ", "), ", and the loader path (",
          absl::StrJoin(loader_errors, "; "), "). ", EnvironmentHelp()));
    }
  }
  library->handles_.push_back(xpurt);

  std::vector<std::string> missing;
  XpurtApi& api = library->api_;
#define FLAGOS_XPURT_RESOLVE_REQUIRED(name, params) \
  if (!Resolve(xpurt, #name, &api.name)) missing.push_back(#name);
#define FLAGOS_XPURT_RESOLVE_OPTIONAL(name, params) Resolve(xpurt, #name, &api.name);
  FLAGOS_XPURT_SYMBOLS(FLAGOS_XPURT_RESOLVE_REQUIRED, FLAGOS_XPURT_RESOLVE_OPTIONAL)
#undef FLAGOS_XPURT_RESOLVE_REQUIRED
#undef FLAGOS_XPURT_RESOLVE_OPTIONAL
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kPrefix, library->path_, " is not a libxpurt flagosd can use: it does not export ",
        absl::StrJoin(missing, ", "),
        " (required). Point XPU_ROOT at an XPU SDK whose runtime has them, or "
        "FLAGOS_KUNLUNXIN_XPURT at its libxpurt.so.2 (see ",
        kInstallGuide, ")."));
  }

  // 3. libxpuml, for memory figures and telemetry; optional.
  std::vector<std::string> xpuml_dirs;
  AddUnique(&xpuml_dirs, DirName(library->path_));
  for (const std::string& dir : sdk_dirs) AddUnique(&xpuml_dirs, dir);
  void* xpuml = nullptr;
  std::string xpuml_path;
  std::vector<std::string> xpuml_errors;
  for (const std::string& dir : xpuml_dirs) {
    for (const char* name : kXpumlNames) {
      const std::string path = Join(dir, name);
      if (!Exists(path)) continue;
      xpuml = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (xpuml != nullptr) {
        xpuml_path = path;
        break;
      }
      xpuml_errors.push_back(absl::StrCat(path, ": ", DlError()));
    }
    if (xpuml != nullptr) break;
  }
  for (const char* name : kXpumlNames) {
    if (xpuml != nullptr) break;
    xpuml = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (xpuml != nullptr) xpuml_path = LoadedPath(xpuml, name);
  }
  if (xpuml == nullptr) {
    library->xpuml_note_ = absl::StrCat(
        "libxpuml not found in ", absl::StrJoin(xpuml_dirs, ", "), " or on the loader path",
        xpuml_errors.empty() ? "" : absl::StrCat(" (", absl::StrJoin(xpuml_errors, "; "), ")"));
  } else {
    library->handles_.push_back(xpuml);
    std::vector<std::string> xpuml_missing;
    std::vector<std::string> xpuml_optional_missing;
    XpumlApi& ml = library->xpuml_;
#define FLAGOS_XPUML_RESOLVE_REQUIRED(name, params) \
  if (!Resolve(xpuml, #name, &ml.name)) xpuml_missing.push_back(#name);
#define FLAGOS_XPUML_RESOLVE_OPTIONAL(name, params) \
  if (!Resolve(xpuml, #name, &ml.name)) xpuml_optional_missing.push_back(#name);
    FLAGOS_XPUML_SYMBOLS(FLAGOS_XPUML_RESOLVE_REQUIRED, FLAGOS_XPUML_RESOLVE_OPTIONAL)
#undef FLAGOS_XPUML_RESOLVE_REQUIRED
#undef FLAGOS_XPUML_RESOLVE_OPTIONAL
    if (xpuml_missing.empty()) {
      library->has_xpuml_ = true;
      library->xpuml_note_ = absl::StrCat(
          "libxpuml at ", xpuml_path,
          xpuml_optional_missing.empty()
              ? std::string()
              : absl::StrCat(" (without ", absl::StrJoin(xpuml_optional_missing, ", "), ")"));
    } else {
      library->xpuml_ = XpumlApi();
      library->xpuml_note_ = absl::StrCat("libxpuml at ", xpuml_path, " lacks ",
                                          absl::StrJoin(xpuml_missing, ", "), ": not used");
    }
  }

  // 4. The xdnn op libraries, only when asked for: nothing calls them yet
  // (operators run on the daemon's cpu_fallback route), but a configured
  // directory that does not hold them is an error worth reporting at start.
  if (!search.xdnn_lib_dirs.empty()) {
    const std::string where = absl::StrCat("FLAGOS_KUNLUNXIN_XDNN_LIB_DIR (",
                                           absl::StrJoin(xdnn_dirs, ":"), ")");
    for (const char* name : kXdnnLibraries) {
      std::string found;
      for (const std::string& dir : xdnn_dirs) {
        const std::string path = Join(dir, name);
        if (Exists(path)) {
          found = path;
          break;
        }
      }
      if (found.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            kPrefix, name, " was not found in ", where,
            ": the xdnn op libraries ship in the vendor torch package "
            "(<site-packages>/torch_xmlir/); set FLAGOS_KUNLUNXIN_XDNN_LIB_DIR to that "
            "directory, or unset it (operators then run on the cpu_fallback route); see ",
            kInstallGuide));
      }
      void* handle = dlopen(found.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (handle == nullptr) {
        const std::string error = DlError();
        std::string hint;
        if (absl::StrContains(error, "undefined symbol")) {
          hint = absl::StrCat(
              "; the xdnn libraries need libxpucuda.so and libcudart.so.12 loaded first, and "
              "flagosd ",
              library->preloaded_.empty()
                  ? std::string("found neither")
                  : absl::StrCat("loaded only ", absl::StrJoin(library->preloaded_, ", ")),
              preload_failures.empty()
                  ? std::string()
                  : absl::StrCat(" (failed: ", absl::StrJoin(preload_failures, "; "), ")"),
              " in ", absl::StrJoin(preload_dirs, ", "),
              ": add the directory that holds them (the SDK's xcudart/lib or the vendor "
              "package's torch_xmlir/) to FLAGOS_KUNLUNXIN_XDNN_LIB_DIR or set XPU_ROOT");
        }
        return absl::FailedPreconditionError(absl::StrCat(kPrefix, "cannot load ", found,
                                                          " (from ", where, "): ", error, hint,
                                                          "; see ", kInstallGuide));
      }
      library->handles_.push_back(handle);
      library->xdnn_libraries_.push_back(found);
    }
  }
  return library;
}

}  // namespace flagos::kunlunxin
