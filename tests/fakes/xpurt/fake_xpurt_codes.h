// The vendor error codes the fake libxpurt returns. They equal those of
// backends/kunlunxin/xpurt_status.h (status_check.cc compares them at
// compile time); they are repeated here because that header needs absl
// and the fake uses only the standard library.
#ifndef FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_CODES_H_
#define FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_CODES_H_

namespace fake_xpu {

inline constexpr int kOk = 0;
inline constexpr int kErrInvalidDevice = 701;
inline constexpr int kErrNoDeviceMemory = 705;
inline constexpr int kErrNoHostMemory = 706;
inline constexpr int kErrInvalidParam = 707;
inline constexpr int kErrAbnormal = 713;
inline constexpr int kErrBusy = 716;
inline constexpr int kErrHostMemoryRegistered = 816;

}  // namespace fake_xpu

#endif  // FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_CODES_H_
