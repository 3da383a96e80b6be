// A test-only fake of libxpuml (the Kunlun NVML-like management library).
// It has no state of its own: it reads the fake libxpurt's figures through
// libxpurt's fake_xpu_* introspection symbols, found with
// dlsym(RTLD_DEFAULT, ...), which works when libxpurt was loaded
// RTLD_GLOBAL first (as flagosd loads it). Without them xpumlInit reports
// "uninitialised" (1).

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "xpurt_symbols.h"

#define FAKE_XPUML_DECLARE(name, params) extern "C" __attribute__((visibility("default"))) int name params;
FLAGOS_XPUML_SYMBOLS(FAKE_XPUML_DECLARE)
#undef FAKE_XPUML_DECLARE

namespace {

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr unsigned long long kPageSize = 4096;
constexpr unsigned long long kL3Bytes = 96ull << 20;

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

namespace {
__attribute__((used)) void* const kEveryXpumlFunction[] = {
#define FAKE_XPUML_ADDRESS(name, params) reinterpret_cast<void*>(&name),
    FLAGOS_XPUML_SYMBOLS(FAKE_XPUML_ADDRESS)
#undef FAKE_XPUML_ADDRESS
};
}  // namespace
