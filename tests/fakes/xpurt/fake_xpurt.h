// Test introspection exported by the fake libxpurt (tests/fakes/xpurt).
// These symbols exist only in the fake: the real runtime has none of them,
// so product code must never call them. Tests reach them with
// dlsym(handle or RTLD_DEFAULT, "fake_xpu_...").
#ifndef FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_H_
#define FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_H_

#include <cstdint>

#define FAKE_XPU_API __attribute__((visibility("default")))

extern "C" {

// Bytes held by live allocations on device `dev` (each allocation counts
// its size rounded up to 256 bytes; a size-0 allocation counts 256).
// 0 for an invalid index.
FAKE_XPU_API uint64_t fake_xpu_memory_used(int dev);
// The device's capacity in bytes (FAKE_XPU_MEMORY); 0 for an invalid index.
FAKE_XPU_API uint64_t fake_xpu_memory_total(int dev);
// The number of devices the fake reports (FAKE_XPU_DEVICES).
FAKE_XPU_API int fake_xpu_device_count(void);
// Streams created with xpu_stream_create and not yet destroyed (the
// per-device default streams do not count).
FAKE_XPU_API int fake_xpu_live_streams(void);
// Events created with xpu_event_create and not yet destroyed.
FAKE_XPU_API int fake_xpu_live_events(void);
// Calls of the named xpu_* function so far in this process, counting
// injected failures and lies; 0 for a name the fake does not export.
FAKE_XPU_API uint64_t fake_xpu_calls(const char* sym);

// For the fake op library (tests/fakes/xdnn), what a kernel launch is on
// the real device:
// The fake's read/write address of device range [ptr, ptr + nbytes) for a
// kernel issued to `stream` (nullptr: the current device's NULL stream);
// nullptr unless the stream is the current device's and the range lies in
// one live allocation of that device (as a device kernel would fault).
FAKE_XPU_API void* fake_xpu_kernel_address(void* stream, const void* ptr, uint64_t nbytes);
// Queues kernel(arg) on `stream` of the current device: it runs on the
// stream's worker, in issue order, FAKE_XPU_DELAY_US after this call at the
// earliest, like a copy. 0, or the error a copy would get (707 for a stream
// of another device or a null kernel).
FAKE_XPU_API int fake_xpu_launch(void* stream, void (*kernel)(void*), void* arg);

}  // extern "C"

#endif  // FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_H_
