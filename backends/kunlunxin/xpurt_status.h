// The vendor's runtime error codes (public sources; the real SDK's
// xpu/runtime.h is authoritative). xpu_strerror is static inline in the
// vendor header, not exported, so flagosd keeps its own table.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XPURT_STATUS_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XPURT_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace flagos::kunlunxin {

inline constexpr int kXpuSuccess = 0;
inline constexpr int kXpuErrInvalidDevice = 701;
inline constexpr int kXpuErrNoDeviceMemory = 705;
inline constexpr int kXpuErrNoHostMemory = 706;
inline constexpr int kXpuErrInvalidParam = 707;
inline constexpr int kXpuErrNotSupported = 712;
inline constexpr int kXpuErrAbnormal = 713;
inline constexpr int kXpuErrBusy = 716;
inline constexpr int kXpuErrHostMemoryRegistered = 816;

// The code with the driver's sign removed (codes come negated from the
// kernel driver).
inline int NormalizeXpuCode(int code) { return code < 0 ? -code : code; }

// "XPUERR_NOMEM (705): no device memory", or "unknown code N".
std::string XpuCodeText(int code);

// The status for a failed call: the code maps onto a status code
// (out of memory → RESOURCE_EXHAUSTED, invalid device/parameter →
// INVALID_ARGUMENT, not supported → UNIMPLEMENTED, busy/timeout →
// UNAVAILABLE, runtime/driver unusable (702-704, 709, 710) →
// FAILED_PRECONDITION, host memory already registered (816) →
// ALREADY_EXISTS, everything else (abnormal, hardware) → INTERNAL); the
// message is "kunlunxin device D: <call> failed: <code text>; <hint>"
// ("kunlunxin backend: ..." when `device` is negative: a call bound to no
// device). OK for code 0.
absl::Status XpuStatus(int code, int device, absl::string_view call);

}  // namespace flagos::kunlunxin

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XPURT_STATUS_H_
