// A test-only fake of libxpuml (the Kunlun NVML-like management library).
// It has no state of its own: it reads the fake libxpurt's figures through
// libxpurt's fake_xpu_* introspection symbols, found with
// dlsym(RTLD_DEFAULT, ...), which works when libxpurt was loaded
// RTLD_GLOBAL first (as flagosd loads it). Without them xpumlInit reports
// "uninitialised" (1).
//
// Its telemetry figures (the same for every device) come from FAKE_XPUML_*,
// read once when the library loads; a malformed value aborts the load.

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "fake_env.h"
#include "xpurt_symbols.h"

// Built twice: as libxpuml with every function of the table, and with
// FAKE_XPUML_WITHOUT_TELEMETRY as an older libxpuml that lacks the OPTIONAL
// ones (the telemetry calls).
#define FAKE_XPUML_DECLARE(name, params) extern "C" __attribute__((visibility("default"))) int name params;
#define FAKE_XPUML_ABSENT(name, params)
#ifdef FAKE_XPUML_WITHOUT_TELEMETRY
#define FAKE_XPUML_OPTIONAL FAKE_XPUML_ABSENT
#else
#define FAKE_XPUML_OPTIONAL FAKE_XPUML_DECLARE
#endif
FLAGOS_XPUML_SYMBOLS(FAKE_XPUML_DECLARE, FAKE_XPUML_OPTIONAL)
#undef FAKE_XPUML_DECLARE

namespace {

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr unsigned long long kPageSize = 4096;
constexpr unsigned long long kL3Bytes = 96ull << 20;

// ---- configuration (FAKE_XPUML_*) ----------------------------------------

struct Telemetry {
  unsigned int temperature = 45;    // FAKE_XPUML_TEMPERATURE, degrees C
  unsigned int power_mw = 150000;   // FAKE_XPUML_POWER_MW
  unsigned int utilization = 0;     // FAKE_XPUML_UTILIZATION, percent
  bool supported = true;            // false: FAKE_XPUML_NO_TELEMETRY=1
};

// Written once by the library constructor, before any call can be made.
Telemetry g_telemetry;

using fake_env::Trim;

long long ParseInt(const char* var, const std::string& text, long long lo, long long hi) {
  return fake_env::ParseInt("fake libxpuml", var, text, lo, hi);
}

void ParseConfig(Telemetry& t) {
  if (const char* v = std::getenv("FAKE_XPUML_TEMPERATURE")) {
    t.temperature = static_cast<unsigned int>(ParseInt("FAKE_XPUML_TEMPERATURE", Trim(v), 0, 200));
  }
  if (const char* v = std::getenv("FAKE_XPUML_POWER_MW")) {
    t.power_mw = static_cast<unsigned int>(ParseInt("FAKE_XPUML_POWER_MW", Trim(v), 0, UINT_MAX));
  }
  if (const char* v = std::getenv("FAKE_XPUML_UTILIZATION")) {
    t.utilization = static_cast<unsigned int>(ParseInt("FAKE_XPUML_UTILIZATION", Trim(v), 0, 100));
  }
  if (const char* v = std::getenv("FAKE_XPUML_NO_TELEMETRY")) {
    t.supported = ParseInt("FAKE_XPUML_NO_TELEMETRY", Trim(v), 0, 1) == 0;
  }
}

__attribute__((constructor)) void FakeXpumlLoad() { ParseConfig(g_telemetry); }

using MemoryFn = uint64_t (*)(int);
using CountFn = int (*)(void);

struct Runtime {
  MemoryFn used = nullptr;
  MemoryFn total = nullptr;
  CountFn count = nullptr;
};

std::atomic<const Runtime*> g_runtime{nullptr};
Runtime g_resolved;

// A device handle is the address of one of these bytes.
char g_handles[flagos::kunlunxin::kXpuMaxDevices];

const Runtime* Current() { return g_runtime.load(std::memory_order_acquire); }

int DeviceIndex(const Runtime* rt, void* dev) {
  char* c = static_cast<char*>(dev);
  if (c < g_handles || c >= g_handles + sizeof(g_handles)) return -1;
  int i = static_cast<int>(c - g_handles);
  return i < rt->count() ? i : -1;
}

}  // namespace

extern "C" int xpumlInit(void) {
  void* used = dlsym(RTLD_DEFAULT, "fake_xpu_memory_used");
  void* total = dlsym(RTLD_DEFAULT, "fake_xpu_memory_total");
  void* count = dlsym(RTLD_DEFAULT, "fake_xpu_device_count");
  if (used == nullptr || total == nullptr || count == nullptr) return kUninitialized;
  static std::atomic<bool> resolved{false};
  if (!resolved.exchange(true)) {
    g_resolved.used = reinterpret_cast<MemoryFn>(used);
    g_resolved.total = reinterpret_cast<MemoryFn>(total);
    g_resolved.count = reinterpret_cast<CountFn>(count);
  }
  g_runtime.store(&g_resolved, std::memory_order_release);
  return kSuccess;
}

extern "C" int xpumlShutdown(void) {
  return g_runtime.exchange(nullptr) == nullptr ? kUninitialized : kSuccess;
}

extern "C" int xpumlDeviceGetCount(unsigned int* count) {
  const Runtime* rt = Current();
  if (rt == nullptr) return kUninitialized;
  if (count == nullptr) return kInvalidArgument;
  *count = static_cast<unsigned int>(rt->count());
  return kSuccess;
}

extern "C" int xpumlDeviceGetHandleByIndex(unsigned int index, void** dev) {
  const Runtime* rt = Current();
  if (rt == nullptr) return kUninitialized;
  if (dev == nullptr || index >= static_cast<unsigned int>(rt->count())) return kInvalidArgument;
  *dev = &g_handles[index];
  return kSuccess;
}

extern "C" int xpumlDeviceGetMemoryInfo(void* dev, struct XpumlMemory* memory) {
  const Runtime* rt = Current();
  if (rt == nullptr) return kUninitialized;
  int i = DeviceIndex(rt, dev);
  if (i < 0 || memory == nullptr) return kInvalidArgument;
  std::memset(memory, 0, sizeof(*memory));
  unsigned long long total = rt->total(i);
  unsigned long long used = rt->used(i);
  memory->global_page_size = kPageSize;
  memory->global_total = total;
  memory->global_used = used;
  memory->global_free = used <= total ? total - used : 0;
  memory->l3_page_size = kPageSize;
  memory->l3_total = kL3Bytes;
  memory->l3_used = 0;
  memory->l3_free = kL3Bytes;
  return kSuccess;
}

#ifndef FAKE_XPUML_WITHOUT_TELEMETRY
// Telemetry: before xpumlInit 1, a bad handle or null output 2, and with
// FAKE_XPUML_NO_TELEMETRY=1 (or a sensor other than the XPU die) 3.
extern "C" int xpumlDeviceGetTemperature(void* dev, int sensor, unsigned int* celsius) {
  const Runtime* rt = Current();
  if (rt == nullptr) return kUninitialized;
  if (DeviceIndex(rt, dev) < 0 || celsius == nullptr) return kInvalidArgument;
  if (!g_telemetry.supported || sensor != flagos::kunlunxin::kXpumlTemperatureXpu) return kNotSupported;
  *celsius = g_telemetry.temperature;
  return kSuccess;
}

extern "C" int xpumlDeviceGetPowerUsage(void* dev, unsigned int* milliwatts) {
  const Runtime* rt = Current();
  if (rt == nullptr) return kUninitialized;
  if (DeviceIndex(rt, dev) < 0 || milliwatts == nullptr) return kInvalidArgument;
  if (!g_telemetry.supported) return kNotSupported;
  *milliwatts = g_telemetry.power_mw;
  return kSuccess;
}

extern "C" int xpumlDeviceGetUtilizationRates(void* dev, struct XpumlUtilization* util) {
  const Runtime* rt = Current();
  if (rt == nullptr) return kUninitialized;
  if (DeviceIndex(rt, dev) < 0 || util == nullptr) return kInvalidArgument;
  if (!g_telemetry.supported) return kNotSupported;
  std::memset(util, 0, sizeof(*util));
  util->xpu = g_telemetry.utilization;
  util->memory = 0;
  return kSuccess;
}
#endif  // FAKE_XPUML_WITHOUT_TELEMETRY

namespace {
__attribute__((used)) void* const kEveryXpumlFunction[] = {
#define FAKE_XPUML_ADDRESS(name, params) reinterpret_cast<void*>(&name),
#ifdef FAKE_XPUML_WITHOUT_TELEMETRY
    FLAGOS_XPUML_SYMBOLS(FAKE_XPUML_ADDRESS, FAKE_XPUML_ABSENT)
#else
    FLAGOS_XPUML_SYMBOLS(FAKE_XPUML_ADDRESS, FAKE_XPUML_ADDRESS)
#endif
#undef FAKE_XPUML_ADDRESS
};
}  // namespace
