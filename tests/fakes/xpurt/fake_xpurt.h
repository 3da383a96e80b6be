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

}  // extern "C"

#endif  // FLAGOS_TESTS_FAKES_XPURT_FAKE_XPURT_H_
