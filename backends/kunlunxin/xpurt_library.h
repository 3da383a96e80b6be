// libxpurt (and libxpuml, and the xdnn op libraries) bound at run time with
// dlopen/dlsym, so that flagosd builds and starts without the XPU SDK.
//
// Load order (shared/reference/kunlunxin-xpu-runtime.md, "Loading order"),
// every library RTLD_NOW and, except libxpuml, RTLD_GLOBAL:
//   1. libxpucuda.so, then libcudart.so.12, from the first searched
//      directory that has them (optional: absence is fine; the xdnn
//      libraries need their symbols in the global scope);
//   2. libxpurt: the file $FLAGOS_KUNLUNXIN_XPURT names when it is set (and
//      nothing else), else the first of libxpurt.so.2, libxpurt.so and any
//      libxpurt.so.* in $XPU_ROOT/so, $XPU_ROOT/lib, $XPU_ROOT/xcudart/lib,
//      /usr/local/xpu/so, then the loader's own path (dlopen by soname);
//   3. libxpuml.so.1 / libxpuml.so: libxpurt's directory, the same
//      directories, then the loader's path (optional; its telemetry
//      functions are optional within it);
//   4. when $FLAGOS_KUNLUNXIN_XDNN_LIB_DIR is set (colon-separated
//      directories): libxpu_blas.so, libxpu_dnn.so, libxpu_flash_attention.so
//      and libxdnn_pytorch.so from there, in that order (all required then).
// The handles stay open for the life of the process: vendor runtimes do not
// survive dlclose, so nothing here ever closes one. Loading twice is cheap
// (the loader hands back the mapped library).
//
// Thread safety: Load may be called from any thread; a loaded library is
// immutable.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XPURT_LIBRARY_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XPURT_LIBRARY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "xpurt_symbols.h"

namespace flagos::kunlunxin {

// One pointer per libxpurt function of FLAGOS_XPURT_SYMBOLS; an OPTIONAL
// function the library does not export is null, a REQUIRED one never is.
struct XpurtApi {
#define FLAGOS_XPURT_POINTER(name, params) int(*name) params = nullptr;
  FLAGOS_XPURT_SYMBOLS(FLAGOS_XPURT_POINTER, FLAGOS_XPURT_POINTER)
#undef FLAGOS_XPURT_POINTER
};

// libxpuml's functions (FLAGOS_XPUML_SYMBOLS): every REQUIRED one, or no
// libxpuml; an OPTIONAL one (the telemetry calls) the library does not
// export is null.
struct XpumlApi {
#define FLAGOS_XPUML_POINTER(name, params) int(*name) params = nullptr;
  FLAGOS_XPUML_SYMBOLS(FLAGOS_XPUML_POINTER, FLAGOS_XPUML_POINTER)
#undef FLAGOS_XPUML_POINTER
};

// Where to look. Empty fields are taken from the environment variable named
// beside them; the search applies only what is set.
struct XpurtSearch {
  std::string xpurt_file;     // FLAGOS_KUNLUNXIN_XPURT: the libxpurt file itself
  std::string xpu_root;       // XPU_ROOT: the SDK root (so/, lib/, xcudart/lib/)
  std::string xdnn_lib_dirs;  // FLAGOS_KUNLUNXIN_XDNN_LIB_DIR: colon-separated

  // This search with its empty fields filled from the environment.
  XpurtSearch WithEnvironment() const;
};

// The XPU SDK's library directories, in search order: $XPU_ROOT/so,
// $XPU_ROOT/lib, $XPU_ROOT/xcudart/lib (when xpu_root is set), then
// /usr/local/xpu/so. (BKCL is looked for there too: bkcl_library.h.)
std::vector<std::string> SdkDirs(const XpurtSearch& search);

class XpurtLibrary {
 public:
  // FAILED_PRECONDITION naming what is missing, where it was looked for and
  // the variable to set: libxpurt not found or not loadable, a REQUIRED
  // function missing from it, or an xdnn library missing from
  // FLAGOS_KUNLUNXIN_XDNN_LIB_DIR. `search` is used as given (call
  // WithEnvironment() first for the environment's).
  static absl::StatusOr<std::unique_ptr<XpurtLibrary>> Load(const XpurtSearch& search);

  XpurtLibrary(const XpurtLibrary&) = delete;
  XpurtLibrary& operator=(const XpurtLibrary&) = delete;

  const XpurtApi& api() const { return api_; }
  // The libxpurt file loaded (the loader's own name for it when it came from
  // the loader's path).
  const std::string& path() const { return path_; }

  // libxpuml, or null when it is absent or lacks a REQUIRED function
  // (xpuml_note() says why).
  const XpumlApi* xpuml() const { return has_xpuml_ ? &xpuml_ : nullptr; }
  // Where libxpuml came from and which OPTIONAL functions it lacks, or why
  // it was not loaded.
  const std::string& xpuml_note() const { return xpuml_note_; }

  // The files loaded before libxpurt (libxpucuda.so, libcudart.so.12), and
  // the xdnn libraries (empty unless FLAGOS_KUNLUNXIN_XDNN_LIB_DIR was set).
  const std::vector<std::string>& preloaded() const { return preloaded_; }
  const std::vector<std::string>& xdnn_libraries() const { return xdnn_libraries_; }

 private:
  XpurtLibrary() = default;

  XpurtApi api_;
  std::string path_;
  XpumlApi xpuml_;
  bool has_xpuml_ = false;
  std::string xpuml_note_;
  std::vector<std::string> preloaded_;
  std::vector<std::string> xdnn_libraries_;
  // The dlopen handles, never closed (kept for the later native op route).
  std::vector<void*> handles_;
};

}  // namespace flagos::kunlunxin

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XPURT_LIBRARY_H_
