// Finds and loads flagosd's xdnn binding module, libflagos_kunlunxin_xdnn.so
// (xdnn/, xdnn_module_abi.h).
//
// Where: `explicit_path` (flagosd --xdnn-module, or FLAGOS_KUNLUNXIN_XDNN_MODULE)
// when given, and then only it; otherwise beside flagosd, in
// <flagosd's directory>/../lib/flagosd/ (the build tree's and the Debian
// package's layout) and then flagosd's own directory.
//
// The module needs libxdnn_pytorch.so: found through the module's RUNPATH
// (a build run in place) or already loaded RTLD_GLOBAL by the runtime from
// FLAGOS_KUNLUNXIN_XDNN_LIB_DIR (xpurt_library.h, step 4).
//
// Thread safety: LoadXdnnModule may be called from any thread; the module
// it returns is immutable and never unloaded.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XDNN_MODULE_LOADER_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XDNN_MODULE_LOADER_H_

#include <string>

#include "absl/status/statusor.h"
#include "xdnn_module_abi.h"

namespace flagos {

struct XdnnModule {
  std::string path;
  const flagos_xdnn_module* module = nullptr;
};

// NOT_FOUND (naming every place looked in) when no module file exists: the
// normal case on a node without xdnn_pytorch. FAILED_PRECONDITION when a file
// exists but does not load (the loader's error, and which variable to set
// for the vendor libraries it needs) or speaks another ABI version.
absl::StatusOr<XdnnModule> LoadXdnnModule(const std::string& explicit_path);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XDNN_MODULE_LOADER_H_
