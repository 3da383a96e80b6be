// The Kunlun P800 device runtime: the DeviceRuntime contract over libxpurt,
// bound at run time (xpurt_library.h), so flagosd builds and starts without
// the XPU SDK and fails with a message naming what to install where when
// the kunlunxin backend is asked for and the SDK is missing.
//
// Execution is asynchronous: a call that takes a stream issues the work
// (xpu_memcpy_async, xpu_event_record, ...) and returns; completion is
// observed through libxpurt's events and xpu_wait. The vendor's current
// device is per thread; every call sets it (xpu_set_device) on the calling
// thread first. Slots libxpurt lacks are emulated or declared gaps; the
// capability table says which and how (README.md has the whole table).
//
// Thread safety: the runtime may be used from any number of threads, as
// runtime.h says. Destroying it waits for every stream and runs every
// pending host function first, so it must not be destroyed from inside one.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_KUNLUNXIN_RUNTIME_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_KUNLUNXIN_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "flagos/runtime.h"

namespace flagos {

inline constexpr char kKunlunxinBackendName[] = "kunlunxin";

struct KunlunxinRuntimeParams {
  // Where libxpurt is looked for (xpurt_library.h has the order). Empty
  // fields come from the environment variable named beside them.
  std::string xpurt_library;  // FLAGOS_KUNLUNXIN_XPURT: the libxpurt file
  std::string xpu_root;       // XPU_ROOT: the XPU SDK's root
  std::string xdnn_lib_dirs;  // FLAGOS_KUNLUNXIN_XDNN_LIB_DIR: colon-separated

  // Memset is emulated with host→device copies of at most this many bytes
  // from one filled host buffer.
  uint64_t memset_chunk_bytes = kDefaultMemsetChunkBytes;

  // INVALID_ARGUMENT naming the field: a relative libxpurt path, or a
  // memset chunk outside [kMinMemsetChunkBytes, kMaxMemsetChunkBytes].
  absl::Status Validate() const;

  static constexpr uint64_t kDefaultMemsetChunkBytes = 16ull << 20;
  static constexpr uint64_t kMinMemsetChunkBytes = 4096;
  static constexpr uint64_t kMaxMemsetChunkBytes = 256ull << 20;
};

// What the kunlunxin runtime offers an op library that issues its own work
// (the xdnn binding, xdnn_op_executor.h) on flagosd's streams.
class KunlunxinStreams {
 public:
  virtual ~KunlunxinStreams() = default;
  // Makes `device` the vendor's current device on this thread and calls
  // `issue` with the vendor's XPUStream of `stream` (nullptr for the
  // device's NULL stream). When `issue` returns OK the stream counts the
  // work as issued (its next query asks the device). NOT_FOUND for an
  // unknown stream, INVALID_ARGUMENT for an unknown device.
  // REQUIRES: calls issuing to one stream are serialised (runtime.h).
  virtual absl::Status IssueOnStream(int device, StreamHandle stream,
                                     absl::FunctionRef<absl::Status(void* xpu_stream)> issue) = 0;
  // Makes `device` the vendor's current device on this thread and calls
  // `call` (a vendor call that binds to the current device, such as
  // bkcl_init_rank). INVALID_ARGUMENT for an unknown device.
  virtual absl::Status OnDevice(int device, absl::FunctionRef<absl::Status()> call) = 0;
};

// The runtime's KunlunxinStreams; nullptr for a runtime of another backend.
KunlunxinStreams* AsKunlunxinStreams(DeviceRuntime& runtime);

// Loads libxpurt and opens every device it reports (at most 64). Fails with
// Validate()'s status, the loader's FAILED_PRECONDITION (library or
// function missing), or FAILED_PRECONDITION when libxpurt reports no device
// or cannot say how many.
absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateKunlunxinRuntime(
    const KunlunxinRuntimeParams& params);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_KUNLUNXIN_RUNTIME_H_
