// Compile-time check that the fake's error codes (fake_xpurt_codes.h) equal
// backends/kunlunxin/xpurt_status.h. Only that header's constexpr ints are
// used: this file builds an object library that nothing links, and it
// compiles to nothing where the header's absl dependency is not installed.
#include "fake_xpurt_codes.h"

#if __has_include("absl/status/status.h")
#include "xpurt_status.h"

namespace flagos::kunlunxin {
static_assert(fake_xpu::kOk == kXpuSuccess);
static_assert(fake_xpu::kErrInvalidDevice == kXpuErrInvalidDevice);
static_assert(fake_xpu::kErrNoDeviceMemory == kXpuErrNoDeviceMemory);
static_assert(fake_xpu::kErrNoHostMemory == kXpuErrNoHostMemory);
static_assert(fake_xpu::kErrInvalidParam == kXpuErrInvalidParam);
static_assert(fake_xpu::kErrAbnormal == kXpuErrAbnormal);
static_assert(fake_xpu::kErrBusy == kXpuErrBusy);
static_assert(fake_xpu::kErrHostMemoryRegistered == kXpuErrHostMemoryRegistered);
}  // namespace flagos::kunlunxin
#endif
