// The libxpurt functions the kunlunxin backend loads at run time, as an
// X-macro table (the pattern of IREE's dynamic_symbol_tables.h), with the
// prototypes public sources show (shared/reference/kunlunxin-xpu-runtime.md;
// to be confirmed against the real SDK's xpu/runtime.h). Every function is
// extern "C" and returns int: 0 on success, else a code from the vendor's
// table (xpurt_status.h), sometimes negated by the kernel driver.
//
// XPURT_REQUIRED(name, params): the backend fails to load without it.
// XPURT_OPTIONAL(name, params): used when present.
//
// The vendor's types, spelled as the ABI sees them: XPUStream and XPUEvent
// are void*; enums (memory kind, copy kind, device attribute) are int.
// C++ default arguments of the vendor header (memory kind, stream) are
// passed explicitly.
//
// This header is shared with tests/fakes/xpurt, the test-only fake runtime,
// so that both sides agree on every prototype.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XPURT_SYMBOLS_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XPURT_SYMBOLS_H_

#include <cstdint>

// clang-format off
#define FLAGOS_XPURT_SYMBOLS(XPURT_REQUIRED, XPURT_OPTIONAL)                                     \
  XPURT_REQUIRED(xpu_device_count, (int* count))                                                 \
  XPURT_REQUIRED(xpu_current_device, (int* dev))                                                 \
  XPURT_REQUIRED(xpu_set_device, (int dev))                                                      \
  XPURT_REQUIRED(xpu_device_get_attr, (uint64_t* value, int attr, int dev))                      \
  XPURT_REQUIRED(xpu_malloc, (void** ptr, uint64_t size, int kind))                              \
  XPURT_REQUIRED(xpu_free, (void* ptr))                                                          \
  XPURT_REQUIRED(xpu_memcpy, (void* dst, const void* src, uint64_t size, int kind))              \
  XPURT_REQUIRED(xpu_memcpy_async,                                                               \
                 (void* dst, const void* src, uint64_t size, int kind, void* stream))            \
  XPURT_REQUIRED(xpu_memcpy_peer,                                                                \
                 (int dst_dev, void* dst, int src_dev, const void* src, uint64_t size))          \
  XPURT_REQUIRED(xpu_stream_create, (void** stream))                                             \
  XPURT_REQUIRED(xpu_stream_destroy, (void* stream))                                             \
  XPURT_REQUIRED(xpu_stream_wait_event, (void* stream, void* event))                             \
  XPURT_REQUIRED(xpu_wait, (void* stream))                                                       \
  XPURT_REQUIRED(xpu_event_create, (void** event))                                               \
  XPURT_REQUIRED(xpu_event_destroy, (void* event))                                               \
  XPURT_REQUIRED(xpu_event_record, (void* event, void* stream))                                  \
  XPURT_REQUIRED(xpu_event_wait, (void* event))                                                  \
  XPURT_REQUIRED(xpu_event_query, (void* event))                                                 \
  XPURT_OPTIONAL(xpu_get_driver_version, (uint32_t* major, uint32_t* minor))                     \
  XPURT_OPTIONAL(xpu_get_runtime_version, (uint32_t* major, uint32_t* minor))                    \
  XPURT_OPTIONAL(xpu_host_alloc, (void** ptr, uint64_t size, unsigned flags))                    \
  XPURT_OPTIONAL(xpu_host_free, (void* ptr))                                                     \
  XPURT_OPTIONAL(xpu_host_register, (void* ptr, uint64_t size, unsigned flags))                  \
  XPURT_OPTIONAL(xpu_host_unregister, (void* ptr))
// clang-format on

// libxpuml (NVML-like), loaded when present for memory figures and device
// telemetry. Every function returns xpumlReturn_t (an enum, int to the
// ABI): 0 success, 1 uninitialised, 2 invalid argument, 3 not supported.
// xpumlDevice_t is an opaque pointer; xpumlMemory_t is XpumlMemory and
// xpumlUtilization_t is XpumlUtilization below; xpumlTemperatureSensors_t
// is an enum (int).
//
// XPUML_REQUIRED(name, params): libxpuml is not used without it.
// XPUML_OPTIONAL(name, params): used when present (older libxpuml versions
// lack the telemetry calls; the figure is then absent).
// clang-format off
#define FLAGOS_XPUML_SYMBOLS(XPUML_REQUIRED, XPUML_OPTIONAL)                                   \
  XPUML_REQUIRED(xpumlInit, (void))                                                            \
  XPUML_REQUIRED(xpumlShutdown, (void))                                                        \
  XPUML_REQUIRED(xpumlDeviceGetCount, (unsigned int* count))                                   \
  XPUML_REQUIRED(xpumlDeviceGetHandleByIndex, (unsigned int index, void** dev))                \
  XPUML_REQUIRED(xpumlDeviceGetMemoryInfo, (void* dev, struct XpumlMemory* memory))            \
  XPUML_OPTIONAL(xpumlDeviceGetTemperature, (void* dev, int sensor, unsigned int* celsius))    \
  XPUML_OPTIONAL(xpumlDeviceGetPowerUsage, (void* dev, unsigned int* milliwatts))              \
  XPUML_OPTIONAL(xpumlDeviceGetUtilizationRates, (void* dev, struct XpumlUtilization* util))
// clang-format on

namespace flagos::kunlunxin {

// Values of the vendor's enums (public sources).
inline constexpr int kXpuMemoryKindMain = 0;     // HBM
inline constexpr int kXpuMemcpyDeviceToHost = 0;
inline constexpr int kXpuMemcpyHostToDevice = 1;
inline constexpr int kXpuMemcpyDeviceToDevice = 2;
inline constexpr int kXpuAttrModel = 4;          // 300..599: KL3 (the P800 generation)
inline constexpr int kXpuAttrMainMemory = 5;     // bytes
inline constexpr int kXpuMaxDevices = 64;        // MAX_DEVICE_NUM
inline constexpr int kXpuMaxStreams = 256;       // streams per process
inline constexpr int kXpumlTemperatureXpu = 0;   // xpumlTemperatureSensors_t: the XPU die, °C

}  // namespace flagos::kunlunxin

// xpumlMemory_t: page size, total, free, used of global memory, then the
// same for L3 (bytes), then reserved words.
struct XpumlMemory {
  unsigned long long global_page_size;
  unsigned long long global_total;
  unsigned long long global_free;
  unsigned long long global_used;
  unsigned long long l3_page_size;
  unsigned long long l3_total;
  unsigned long long l3_free;
  unsigned long long l3_used;
  unsigned long long reserved[8];
};

// xpumlUtilization_t: percent of the last sample period during which
// kernels ran (xpu) and device memory was read or written (memory).
struct XpumlUtilization {
  unsigned int xpu;
  unsigned int memory;
  unsigned long long reserved[15];
};

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XPURT_SYMBOLS_H_
