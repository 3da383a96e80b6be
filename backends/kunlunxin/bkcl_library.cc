#include "bkcl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "xpurt_library.h"

namespace flagos::kunlunxin {
namespace {

constexpr char kLibraryName[] = "libbkcl.so";
constexpr char kOff[] = "off";

std::string EnvOr(const std::string& value, const char* name) {
  if (!value.empty()) return value;
  const char* env = std::getenv(name);
  return env == nullptr ? std::string() : std::string(env);
}

std::string LastDlError() {
  const char* error = dlerror();
  return error == nullptr ? std::string("unknown dlopen error") : std::string(error);
}

}  // namespace

BkclSearch BkclSearch::WithEnvironment() const {
  return {EnvOr(file, "FLAGOS_KUNLUNXIN_BKCL"), EnvOr(xpu_root, "XPU_ROOT")};
}

absl::StatusOr<std::unique_ptr<BkclLibrary>> BkclLibrary::Load(const BkclSearch& search) {
  if (search.file == kOff) {
    return absl::NotFoundError("BKCL is off (FLAGOS_KUNLUNXIN_BKCL=off)");
  }
  void* handle = nullptr;
  std::string path;
  if (!search.file.empty()) {
    path = search.file;
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kunlunxin backend: FLAGOS_KUNLUNXIN_BKCL names ", path, ", which does not load: ",
          LastDlError(), "; point it at the SDK's libbkcl.so, or set FLAGOS_KUNLUNXIN_BKCL=off "
          "to run collectives on flagosd's host route"));
    }
  } else {
    std::vector<std::string> searched;
    for (const std::string& dir : SdkDirs(XpurtSearch{.xpu_root = search.xpu_root})) {
      const std::string candidate = (std::filesystem::path(dir) / kLibraryName).string();
      searched.push_back(dir);
      std::error_code error;
      if (!std::filesystem::exists(candidate, error)) continue;
      handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "kunlunxin backend: ", candidate, " does not load: ", LastDlError(),
            "; fix the install, or set FLAGOS_KUNLUNXIN_BKCL=off to run collectives on "
            "flagosd's host route"));
      }
      path = candidate;
      break;
    }
    if (handle == nullptr) {
      handle = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "no ", kLibraryName, " in ", absl::StrJoin(searched, ", "),
            " or on the loader's path; set XPU_ROOT to an XPU SDK with BKCL, or "
            "FLAGOS_KUNLUNXIN_BKCL to the library file"));
      }
      path = kLibraryName;
    }
  }
  auto library = std::unique_ptr<BkclLibrary>(new BkclLibrary());
  library->path_ = path;
  std::vector<std::string> missing;
  BkclApi& api = library->api_;
#define FLAGOS_BKCL_RESOLVE(name, params, list)                   \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, #name)); \
  if (api.name == nullptr) list.push_back(#name);
#define FLAGOS_BKCL_RESOLVE_REQUIRED(name, params) FLAGOS_BKCL_RESOLVE(name, params, missing)
#define FLAGOS_BKCL_RESOLVE_OPTIONAL(name, params) \
  FLAGOS_BKCL_RESOLVE(name, params, library->missing_optional_)
  FLAGOS_BKCL_SYMBOLS(FLAGOS_BKCL_RESOLVE_REQUIRED, FLAGOS_BKCL_RESOLVE_OPTIONAL)
#undef FLAGOS_BKCL_RESOLVE_REQUIRED
#undef FLAGOS_BKCL_RESOLVE_OPTIONAL
#undef FLAGOS_BKCL_RESOLVE
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kunlunxin backend: ", path, " lacks ", absl::StrJoin(missing, ", "),
        " (required); point XPU_ROOT or FLAGOS_KUNLUNXIN_BKCL at a BKCL that has them, or set "
        "FLAGOS_KUNLUNXIN_BKCL=off to run collectives on flagosd's host route"));
  }
  return library;
}

std::string BkclResultText(int result) {
  switch (result) {
    case bkcl::kSuccess: return "BKCL_SUCCESS (0)";
    case bkcl::kInvalidArgument: return "BKCL_INVALID_ARGUMENT (1)";
    case bkcl::kRuntimeError: return "BKCL_RUNTIME_ERROR (2)";
    case bkcl::kSystemError: return "BKCL_SYSTEM_ERROR (3)";
    case bkcl::kInternalError: return "BKCL_INTERNAL_ERROR (4)";
  }
  return absl::StrCat("unknown BKCL result ", result);
}

absl::Status BkclStatus(int result, int device, absl::string_view call) {
  if (result == bkcl::kSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(
      "kunlunxin device ", device, ": ", call, " failed: ", BkclResultText(result),
      result == bkcl::kInvalidArgument
          ? "; the arguments flagosd passed were refused (report it with the collective's "
            "dtype and sizes)"
          : "; the process group is broken: restart the job, and check the node's BKCL "
            "install and its log (BKCL_DEBUG)");
  return result == bkcl::kInvalidArgument ? absl::InvalidArgumentError(message)
                                          : absl::InternalError(message);
}

}  // namespace flagos::kunlunxin
