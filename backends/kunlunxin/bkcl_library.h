// libbkcl (Kunlun's collective library) bound at run time with dlopen/dlsym,
// as libxpurt is (xpurt_library.h), so flagosd builds and starts without it.
// The functions are FLAGOS_BKCL_SYMBOLS (bkcl_symbols.h).
//
// Where (BkclSearch): the file FLAGOS_KUNLUNXIN_BKCL names (and nothing
// else), or "off" for none; else libbkcl.so in the XPU SDK's directories
// (SdkDirs: $XPU_ROOT/so, $XPU_ROOT/lib, $XPU_ROOT/xcudart/lib,
// /usr/local/xpu/so), then the loader's own path. Loaded RTLD_NOW |
// RTLD_LOCAL after libxpurt (RTLD_GLOBAL), whose symbols it needs. The
// handle is never closed (queued collective kernels run its code).
//
// Thread safety: Load from any thread; a loaded library is immutable.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_BKCL_LIBRARY_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_BKCL_LIBRARY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bkcl_symbols.h"

namespace flagos::kunlunxin {

// One pointer per function of FLAGOS_BKCL_SYMBOLS; an OPTIONAL one the
// library does not export is null, a REQUIRED one never is.
struct BkclApi {
#define FLAGOS_BKCL_POINTER(name, params) int(*name) params = nullptr;
  FLAGOS_BKCL_SYMBOLS(FLAGOS_BKCL_POINTER, FLAGOS_BKCL_POINTER)
#undef FLAGOS_BKCL_POINTER
};

struct BkclSearch {
  std::string file;      // FLAGOS_KUNLUNXIN_BKCL: the libbkcl file, or "off"
  std::string xpu_root;  // XPU_ROOT

  // This search with its empty fields filled from the environment.
  BkclSearch WithEnvironment() const;
};

class BkclLibrary {
 public:
  // NOT_FOUND (naming the directories searched and the variable to set)
  // when no libbkcl is there or the search is "off": the collectives then
  // run on the daemon's host route. FAILED_PRECONDITION naming the file for
  // one that is there but does not load or lacks a REQUIRED function.
  static absl::StatusOr<std::unique_ptr<BkclLibrary>> Load(const BkclSearch& search);

  BkclLibrary(const BkclLibrary&) = delete;
  BkclLibrary& operator=(const BkclLibrary&) = delete;

  const BkclApi& api() const { return api_; }
  const std::string& path() const { return path_; }
  // The OPTIONAL functions the library lacks.
  const std::vector<std::string>& missing_optional() const { return missing_optional_; }

 private:
  BkclLibrary() = default;
  BkclApi api_;
  std::string path_;
  std::vector<std::string> missing_optional_;
};

// "BKCL_RUNTIME_ERROR (2)", or "unknown BKCL result N".
std::string BkclResultText(int result);

// OK for BKCL_SUCCESS; else "kunlunxin device D: <call> failed: <result
// text>; <what to do>" (INVALID_ARGUMENT for BKCL_INVALID_ARGUMENT, INTERNAL
// otherwise).
absl::Status BkclStatus(int result, int device, absl::string_view call);

}  // namespace flagos::kunlunxin

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_BKCL_LIBRARY_H_
