// Smoke test of the fake libxpurt / libxpuml (tests/fakes/xpurt). Plain
// C++, no test framework:
//
//   fake_xpurt_selftest <path to libxpurt.so.2>
//
// dlopen()s the fake (libxpuml.so.1 is taken from the same folder), checks
// its hostile properties, and re-executes itself with other FAKE_XPU_*
// settings for the checks that need them. Exits non-zero on any failure.
// Timing checks ("not yet done right after the call") are only judged when
// the observation finished within FAKE_XPU_DELAY_US of the call; otherwise
// they are counted as inconclusive and retried.

#include <dlfcn.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fake_xpurt_codes.h"
#include "../selftest_checks.h"  // CHECK, CHECK_RC, REQUIRE (on g_failures, below)
#include "xpurt_symbols.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace fake_xpu;

constexpr int kD2H = flagos::kunlunxin::kXpuMemcpyDeviceToHost;
constexpr int kH2D = flagos::kunlunxin::kXpuMemcpyHostToDevice;
constexpr int kD2D = flagos::kunlunxin::kXpuMemcpyDeviceToDevice;
constexpr uint64_t kGiB = 1ull << 30;

struct Api {
#define SELFTEST_SLOT(name, params) int(*name) params = nullptr;
  FLAGOS_XPURT_SYMBOLS(SELFTEST_SLOT, SELFTEST_SLOT)
  FLAGOS_XPUML_SYMBOLS(SELFTEST_SLOT, SELFTEST_SLOT)
#undef SELFTEST_SLOT
  uint64_t (*memory_used)(int) = nullptr;
  uint64_t (*memory_total)(int) = nullptr;
  int (*device_count)(void) = nullptr;
  int (*live_streams)(void) = nullptr;
  int (*live_events)(void) = nullptr;
  uint64_t (*calls)(const char*) = nullptr;
};

Api api;
std::string g_lib;   // libxpurt.so.2
std::string g_ml;    // libxpuml.so.1
std::string g_self;  // this executable
int64_t g_delay_us = 200;
std::atomic<int> g_failures{0};
int g_inconclusive = 0;
int g_unjudged = 0;  // timing checks that never got an observation in time

bool AllBytes(const std::vector<unsigned char>& v, unsigned char b) {
  for (unsigned char c : v) {
    if (c != b) return false;
  }
  return true;
}

bool WithinDelay(Clock::time_point t0) {
  return Clock::now() - t0 < std::chrono::microseconds(g_delay_us);
}

void Inconclusive(const char* what) {
  ++g_inconclusive;
  std::fprintf(stderr, "note: %s: observation took longer than the delay; retrying\n", what);
}

void Judged(bool judged, const char* what) {
  if (judged) return;
  ++g_unjudged;
  std::fprintf(stderr, "note: %s: never observed within the delay; not judged\n", what);
}

void* LoadRuntime() {
  void* h = dlopen(g_lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) std::fprintf(stderr, "dlopen %s: %s\n", g_lib.c_str(), dlerror());
  REQUIRE(h != nullptr);
#define SELFTEST_LOAD(name, params)                                          \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(h, #name));          \
  if (api.name == nullptr) std::fprintf(stderr, "missing export: %s\n", #name); \
  REQUIRE(api.name != nullptr);
  FLAGOS_XPURT_SYMBOLS(SELFTEST_LOAD, SELFTEST_LOAD)
#undef SELFTEST_LOAD
  api.memory_used = reinterpret_cast<uint64_t (*)(int)>(dlsym(h, "fake_xpu_memory_used"));
  api.memory_total = reinterpret_cast<uint64_t (*)(int)>(dlsym(h, "fake_xpu_memory_total"));
  api.device_count = reinterpret_cast<int (*)(void)>(dlsym(h, "fake_xpu_device_count"));
  api.live_streams = reinterpret_cast<int (*)(void)>(dlsym(h, "fake_xpu_live_streams"));
  api.live_events = reinterpret_cast<int (*)(void)>(dlsym(h, "fake_xpu_live_events"));
  api.calls = reinterpret_cast<uint64_t (*)(const char*)>(dlsym(h, "fake_xpu_calls"));
  REQUIRE(api.memory_used && api.memory_total && api.device_count && api.live_streams && api.live_events &&
          api.calls);
  return h;
}

void* LoadXpuml() {
  void* h = dlopen(g_ml.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) std::fprintf(stderr, "dlopen %s: %s\n", g_ml.c_str(), dlerror());
  REQUIRE(h != nullptr);
#define SELFTEST_LOAD(name, params)                                  \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(h, #name));  \
  REQUIRE(api.name != nullptr);
  FLAGOS_XPUML_SYMBOLS(SELFTEST_LOAD, SELFTEST_LOAD)
#undef SELFTEST_LOAD
  return h;
}

// Forks; the child runs `fn` with SIGSEGV at its default action and no
// core file. Returns the wait status.
template <typename F>
int InChild(F fn) {
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    fn();
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

bool DiedOfSegv(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV; }

// Re-executes this program as `mode` with the given environment; returns
// the wait status, or -1 when it ran past `timeout_s` (it is then killed).
int RunMode(const std::string& mode, const std::vector<std::pair<std::string, std::string>>& env,
            int timeout_s = 120) {
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execl(g_self.c_str(), g_self.c_str(), g_lib.c_str(), mode.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ExitedOk(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

void* Malloc(uint64_t n) {
  void* p = nullptr;
  int rc = api.xpu_malloc(&p, n, 0);
  if (rc != kOk) std::fprintf(stderr, "xpu_malloc(%llu) = %d\n", static_cast<unsigned long long>(n), rc);
  REQUIRE(rc == kOk && p != nullptr);
  return p;
}

void* NewStream() {
  void* s = nullptr;
  REQUIRE(api.xpu_stream_create(&s) == kOk && s != nullptr);
  return s;
}

void* NewEvent() {
  void* e = nullptr;
  REQUIRE(api.xpu_event_create(&e) == kOk && e != nullptr);
  return e;
}

std::vector<unsigned char> ReadDevice(const void* d, size_t n) {
  std::vector<unsigned char> out(n, 0);
  CHECK_RC(api.xpu_memcpy(out.data(), d, n, kD2H), kOk);
  return out;
}

void FillDevice(void* d, size_t n, unsigned char b) {
  std::vector<unsigned char> v(n, b);
  CHECK_RC(api.xpu_memcpy(d, v.data(), n, kH2D), kOk);
}

// Runs one operation on `stream` so that its worker thread exists: timing
// checks must not be flattered by the thread's start-up time.
void WarmUp(void* stream, void* device_buffer) {
  unsigned char b = 0;
  CHECK_RC(api.xpu_memcpy_async(&b, device_buffer, 1, kD2H, stream), kOk);
  CHECK_RC(api.xpu_wait(stream), kOk);
}

// ---- in-process checks ---------------------------------------------------

void TestExports(void* h) {
  // Everything in the prototype table was found by LoadRuntime; none of the
  // calls the real runtime lacks may exist.
  const char* absent[] = {"xpu_memset", "xpu_memset_async", "xpu_stream_query", "xpu_event_elapsed_time",
                          "xpu_device_synchronize", "xpu_synchronize", "xpu_stream_create_with_priority",
                          "xpu_stream_get_priority", "xpu_device_get_stream_priority_range", "xpu_strerror",
                          "xpu_mem_get_info", "xpu_memory_info", "xpu_ctx_create"};
  for (const char* name : absent) {
    if (dlsym(h, name) != nullptr) {
      std::fprintf(stderr, "unexpected export: %s\n", name);
      ++g_failures;
    }
  }
}

void TestDevices() {
  int n = -1;
  CHECK_RC(api.xpu_device_count(&n), kOk);
  CHECK(n == 2);
  CHECK(api.device_count() == 2);
  CHECK_RC(api.xpu_device_count(nullptr), kErrInvalidParam);
  int cur = -1;
  CHECK_RC(api.xpu_current_device(&cur), kOk);
  CHECK(cur == 0);
  CHECK_RC(api.xpu_set_device(2), kErrInvalidDevice);
  CHECK_RC(api.xpu_set_device(-1), kErrInvalidDevice);
  CHECK_RC(api.xpu_set_device(1), kOk);
  CHECK_RC(api.xpu_current_device(&cur), kOk);
  CHECK(cur == 1);
  // The current device is per thread: a new thread starts on device 0.
  int other = -1;
  std::thread([&] { api.xpu_current_device(&other); }).join();
  CHECK(other == 0);

  // get_attr reads the current device (1) whatever `dev` says.
  uint64_t v = 99;
  CHECK_RC(api.xpu_device_get_attr(&v, 1, 0), kOk);
  CHECK(v == 1);
  CHECK_RC(api.xpu_set_device(0), kOk);
  CHECK_RC(api.xpu_device_get_attr(&v, 1, 1), kOk);
  CHECK(v == 0);
  CHECK_RC(api.xpu_device_get_attr(&v, 4, 0), kOk);
  CHECK(v == 400);
  CHECK_RC(api.xpu_device_get_attr(&v, 5, 0), kOk);
  CHECK(v == kGiB);
  CHECK_RC(api.xpu_device_get_attr(&v, 7, 0), kOk);
  CHECK(v == 0);
  CHECK_RC(api.xpu_device_get_attr(&v, 11, 0), kErrInvalidParam);
  CHECK_RC(api.xpu_device_get_attr(&v, -1, 0), kErrInvalidParam);
  CHECK_RC(api.xpu_device_get_attr(nullptr, 4, 0), kErrInvalidParam);

  uint32_t major = 0, minor = 0;
  CHECK_RC(api.xpu_get_driver_version(&major, &minor), kOk);
  CHECK(major == 5 && minor == 0);
  CHECK_RC(api.xpu_get_runtime_version(&major, &minor), kOk);
  CHECK(major == 5 && minor == 37);
}

void TestMemory() {
  CHECK(api.memory_total(0) == kGiB);
  CHECK(api.memory_total(5) == 0);
  uint64_t used0 = api.memory_used(0);
  void* p = Malloc(1000);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  CHECK(api.memory_used(0) == used0 + 1024);
  void* z = Malloc(0);
  CHECK(z != p);
  CHECK(api.memory_used(0) == used0 + 1024 + 256);

  void* q = nullptr;
  CHECK_RC(api.xpu_malloc(&q, 16, 1), kErrInvalidParam);
  CHECK_RC(api.xpu_malloc(nullptr, 16, 0), kErrInvalidParam);
  CHECK_RC(api.xpu_malloc(&q, kGiB + 1, 0), kErrNoDeviceMemory);
  CHECK_RC(api.xpu_malloc(&q, kGiB, 0), kErrNoDeviceMemory);  // some is in use
  CHECK_RC(api.xpu_malloc(&q, UINT64_MAX, 0), kErrNoDeviceMemory);

  int local = 0;
  CHECK_RC(api.xpu_free(static_cast<char*>(p) + 256), kErrInvalidParam);
  CHECK_RC(api.xpu_free(&local), kErrInvalidParam);
  CHECK_RC(api.xpu_free(nullptr), kErrInvalidParam);
  CHECK_RC(api.xpu_free(z), kOk);
  CHECK_RC(api.xpu_free(p), kOk);
  CHECK_RC(api.xpu_free(p), kErrInvalidParam);
  CHECK(api.memory_used(0) == used0);

  // Fresh memory is garbage, and freed memory is not cleared.
  const size_t n = 8192;
  void* a = Malloc(n);
  CHECK(AllBytes(ReadDevice(a, n), 0xA5));
  FillDevice(a, n, 0);
  CHECK(AllBytes(ReadDevice(a, n), 0));
  CHECK_RC(api.xpu_free(a), kOk);
  void* b = Malloc(n);
  CHECK(AllBytes(ReadDevice(b, n), 0xA5));
  CHECK_RC(api.xpu_free(b), kOk);

  // A large allocation: costs nothing until touched, usable at both ends.
  void* big = Malloc(512ull << 20);
  FillDevice(static_cast<char*>(big) + (512ull << 20) - 4096, 4096, 0x3C);
  CHECK(AllBytes(ReadDevice(static_cast<char*>(big) + (512ull << 20) - 4096, 4096), 0x3C));
  CHECK_RC(api.xpu_free(big), kOk);
}

void TestDeref() {
  void* p = Malloc(4096);
  FillDevice(p, 4096, 7);
  int st = InChild([&] {
    volatile unsigned char c = *static_cast<volatile unsigned char*>(p);
    (void)c;
  });
  CHECK(DiedOfSegv(st));
  st = InChild([&] { *static_cast<volatile unsigned char*>(p) = 1; });
  CHECK(DiedOfSegv(st));
  void* s = NewStream();
  st = InChild([&] {
    volatile unsigned char c = *static_cast<volatile unsigned char*>(s);
    (void)c;
  });
  CHECK(DiedOfSegv(st));
  CHECK_RC(api.xpu_stream_destroy(s), kOk);

  // xpu_host_free unmaps: a stale host pointer faults too.
  void* h = nullptr;
  CHECK_RC(api.xpu_host_alloc(&h, 4096, 0), kOk);
  CHECK_RC(api.xpu_host_free(h), kOk);
  st = InChild([&] {
    volatile unsigned char c = *static_cast<volatile unsigned char*>(h);
    (void)c;
  });
  CHECK(DiedOfSegv(st));
  CHECK_RC(api.xpu_free(p), kOk);
}

void TestAsyncVisibility() {
  const size_t n = 4096;
  void* d = Malloc(n);
  void* s = NewStream();
  WarmUp(s, d);
  WarmUp(nullptr, d);
  std::vector<unsigned char> src(n), out(n);

  // H2D then D2H on one stream: nothing has happened when the calls return.
  bool judged = false;
  for (int attempt = 0; attempt < 50 && !judged; ++attempt) {
    FillDevice(d, n, 0x11);
    std::fill(src.begin(), src.end(), 0x22);
    std::fill(out.begin(), out.end(), 0x33);
    auto t0 = Clock::now();
    CHECK_RC(api.xpu_memcpy_async(d, src.data(), n, kH2D, s), kOk);
    CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, s), kOk);
    bool old = AllBytes(out, 0x33);
    // With a long enough delay, the work must still be pending after a
    // quarter of it (a fake that runs work at once fails here).
    if (g_delay_us >= 2000 && old) {
      std::this_thread::sleep_for(std::chrono::microseconds(g_delay_us / 4));
      old = AllBytes(out, 0x33);
    }
    if (WithinDelay(t0)) {
      CHECK(old);
      judged = true;
    } else {
      Inconclusive("async D2H before xpu_wait");
    }
    CHECK_RC(api.xpu_wait(s), kOk);
    CHECK(AllBytes(out, 0x22));
  }
  Judged(judged, "async D2H before xpu_wait");

  // An H2D reads its host source when it runs, not when it is issued.
  judged = false;
  for (int attempt = 0; attempt < 50 && !judged; ++attempt) {
    FillDevice(d, n, 0x11);
    std::fill(src.begin(), src.end(), 0x22);
    auto t0 = Clock::now();
    CHECK_RC(api.xpu_memcpy_async(d, src.data(), n, kH2D, s), kOk);
    std::fill(src.begin(), src.end(), 0x44);
    bool in_time = WithinDelay(t0);
    CHECK_RC(api.xpu_wait(s), kOk);
    if (in_time) {
      CHECK(AllBytes(ReadDevice(d, n), 0x44));
      judged = true;
    } else {
      Inconclusive("H2D source reuse");
    }
  }
  Judged(judged, "H2D source reuse");

  // xpu_memcpy waits for the default stream only, not for `s`.
  judged = false;
  for (int attempt = 0; attempt < 50 && !judged; ++attempt) {
    FillDevice(d, n, 0x11);
    std::fill(src.begin(), src.end(), 0x22);
    auto t0 = Clock::now();
    CHECK_RC(api.xpu_memcpy_async(d, src.data(), n, kH2D, s), kOk);
    std::vector<unsigned char> now = ReadDevice(d, n);
    if (WithinDelay(t0)) {
      CHECK(AllBytes(now, 0x11));
      judged = true;
    } else {
      Inconclusive("xpu_memcpy ignoring other streams");
    }
    CHECK_RC(api.xpu_wait(s), kOk);
    CHECK(AllBytes(ReadDevice(d, n), 0x22));
  }
  Judged(judged, "xpu_memcpy ignoring other streams");

  // ... but it does wait for the default stream.
  std::fill(src.begin(), src.end(), 0x55);
  CHECK_RC(api.xpu_memcpy_async(d, src.data(), n, kH2D, nullptr), kOk);
  CHECK(AllBytes(ReadDevice(d, n), 0x55));
  // xpu_wait(NULL) waits for the default stream.
  std::fill(out.begin(), out.end(), 0);
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, nullptr), kOk);
  CHECK_RC(api.xpu_wait(nullptr), kOk);
  CHECK(AllBytes(out, 0x55));

  // D2D on a stream, then a peer copy between devices.
  void* d2 = Malloc(n);
  CHECK_RC(api.xpu_memcpy_async(d2, d, n, kD2D, s), kOk);
  CHECK_RC(api.xpu_wait(s), kOk);
  CHECK(AllBytes(ReadDevice(d2, n), 0x55));
  CHECK_RC(api.xpu_set_device(1), kOk);
  void* d1 = Malloc(n);
  CHECK_RC(api.xpu_memcpy_peer(1, d1, 0, d2, n), kOk);
  CHECK(AllBytes(ReadDevice(d1, n), 0x55));
  CHECK_RC(api.xpu_memcpy_peer(0, d1, 0, d2, n), kErrInvalidParam);  // d1 is on device 1
  CHECK_RC(api.xpu_memcpy_peer(2, d1, 0, d2, n), kErrInvalidDevice);
  CHECK_RC(api.xpu_memcpy_peer(1, d1, 0, d2, n + 1), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy_peer(1, d1, 0, d2, 0), kOk);
  CHECK_RC(api.xpu_free(d1), kOk);
  CHECK_RC(api.xpu_set_device(0), kOk);

  // Validation at issue time.
  CHECK_RC(api.xpu_memcpy_async(d, d2, n, kH2D, s), kErrInvalidParam);           // "host" source is device memory
  CHECK_RC(api.xpu_memcpy_async(d2, d, n, kD2H, s), kErrInvalidParam);           // "host" destination is device memory
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n + 1, kD2H, s), kErrInvalidParam);  // beyond the allocation
  CHECK_RC(api.xpu_memcpy_async(out.data(), static_cast<char*>(d) + 1, n, kD2H, s), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy_async(out.data(), src.data(), n, kD2H, s), kErrInvalidParam);  // host "device" pointer
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, 3, s), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy(out.data(), src.data(), n, 3), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy_async(nullptr, nullptr, 0, kD2H, s), kOk);  // size 0: nothing
  CHECK_RC(api.xpu_memcpy(nullptr, nullptr, 0, kH2D), kOk);
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, reinterpret_cast<void*>(&out)), kErrInvalidParam);
  void* e = NewEvent();
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, e), kErrInvalidParam);  // an event is no stream
  CHECK_RC(api.xpu_event_destroy(e), kOk);
  // Device 1 memory through a device 0 stream.
  CHECK_RC(api.xpu_set_device(1), kOk);
  void* other = Malloc(n);
  CHECK_RC(api.xpu_set_device(0), kOk);
  CHECK_RC(api.xpu_memcpy_async(out.data(), other, n, kD2H, s), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy(out.data(), other, n, kD2H), kErrInvalidParam);
  // A freed allocation cannot be copied from.
  CHECK_RC(api.xpu_free(d2), kOk);
  CHECK_RC(api.xpu_memcpy(out.data(), d2, n, kD2H), kErrInvalidParam);

  CHECK_RC(api.xpu_set_device(1), kOk);
  CHECK_RC(api.xpu_free(other), kOk);
  CHECK_RC(api.xpu_set_device(0), kOk);
  CHECK_RC(api.xpu_stream_destroy(s), kOk);
  CHECK_RC(api.xpu_free(d), kOk);
}

void TestEvents() {
  const size_t n = 4096;
  const uint64_t big = 64ull << 20;
  void* e = NewEvent();
  CHECK_RC(api.xpu_event_query(e), kOk);  // never recorded
  CHECK_RC(api.xpu_event_wait(e), kOk);
  void* s1 = NewStream();
  void* s2 = NewStream();
  void* scratch = Malloc(n);
  WarmUp(s1, scratch);
  WarmUp(s2, scratch);
  CHECK_RC(api.xpu_free(scratch), kOk);

  // A record is pending until its stream reaches it.
  bool judged = false;
  for (int attempt = 0; attempt < 50 && !judged; ++attempt) {
    auto t0 = Clock::now();
    CHECK_RC(api.xpu_event_record(e, s1), kOk);
    int q = api.xpu_event_query(e);
    if (WithinDelay(t0)) {
      CHECK_RC(q, kErrBusy);
      judged = true;
    } else {
      Inconclusive("event pending right after record");
    }
    CHECK_RC(api.xpu_event_wait(e), kOk);
    CHECK_RC(api.xpu_event_query(e), kOk);
  }
  Judged(judged, "event pending right after record");

  // s2 waits for an event recorded on s1 behind a large copy.
  void* dbig = Malloc(big);
  std::vector<unsigned char> host(big, 0x66), out(n, 0);
  CHECK_RC(api.xpu_memcpy_async(dbig, host.data(), big, kH2D, s1), kOk);
  CHECK_RC(api.xpu_event_record(e, s1), kOk);
  CHECK_RC(api.xpu_stream_wait_event(s2, e), kOk);
  CHECK_RC(api.xpu_memcpy_async(out.data(), static_cast<char*>(dbig) + big - n, n, kD2H, s2), kOk);
  CHECK_RC(api.xpu_wait(s2), kOk);
  CHECK(AllBytes(out, 0x66));
  CHECK_RC(api.xpu_event_query(e), kOk);  // s2 could only finish after it

  // An event recorded on the default stream, waited for by s2.
  std::fill(host.begin(), host.begin() + n, 0x77);
  CHECK_RC(api.xpu_memcpy_async(dbig, host.data(), n, kH2D, nullptr), kOk);
  CHECK_RC(api.xpu_event_record(e, nullptr), kOk);
  CHECK_RC(api.xpu_stream_wait_event(s2, e), kOk);
  CHECK_RC(api.xpu_memcpy_async(out.data(), dbig, n, kD2H, s2), kOk);
  CHECK_RC(api.xpu_wait(s2), kOk);
  CHECK(AllBytes(out, 0x77));

  // Re-recording replaces the record that waits and queries see.
  CHECK_RC(api.xpu_event_record(e, s1), kOk);
  CHECK_RC(api.xpu_event_record(e, s2), kOk);
  CHECK_RC(api.xpu_event_wait(e), kOk);
  CHECK_RC(api.xpu_event_query(e), kOk);

  // Destroying an event with a pending record is allowed.
  int live = api.live_events();
  void* e2 = NewEvent();
  CHECK(api.live_events() == live + 1);
  CHECK_RC(api.xpu_event_record(e2, s1), kOk);
  CHECK_RC(api.xpu_stream_wait_event(s2, e2), kOk);
  CHECK_RC(api.xpu_event_destroy(e2), kOk);
  CHECK(api.live_events() == live);
  CHECK_RC(api.xpu_wait(s2), kOk);
  CHECK_RC(api.xpu_wait(s1), kOk);
  CHECK_RC(api.xpu_event_destroy(e2), kErrInvalidParam);
  CHECK_RC(api.xpu_event_query(e2), kErrInvalidParam);
  CHECK_RC(api.xpu_event_record(nullptr, s1), kErrInvalidParam);
  CHECK_RC(api.xpu_stream_wait_event(s1, s2), kErrInvalidParam);  // a stream is no event

  // Events belong to their device.
  CHECK_RC(api.xpu_set_device(1), kOk);
  void* s_dev1 = NewStream();
  void* e_dev1 = NewEvent();
  CHECK_RC(api.xpu_stream_wait_event(s_dev1, e), kErrInvalidParam);
  CHECK_RC(api.xpu_event_record(e, nullptr), kErrInvalidParam);
  CHECK_RC(api.xpu_event_record(e, s_dev1), kErrInvalidParam);
  CHECK_RC(api.xpu_event_record(e_dev1, s_dev1), kOk);
  CHECK_RC(api.xpu_event_wait(e_dev1), kOk);
  CHECK_RC(api.xpu_event_destroy(e_dev1), kOk);
  CHECK_RC(api.xpu_stream_destroy(s_dev1), kOk);
  CHECK_RC(api.xpu_set_device(0), kOk);

  CHECK_RC(api.xpu_free(dbig), kOk);
  CHECK_RC(api.xpu_stream_destroy(s1), kOk);
  CHECK_RC(api.xpu_stream_destroy(s2), kOk);
  CHECK_RC(api.xpu_event_destroy(e), kOk);
}

void TestStreams() {
  int live0 = api.live_streams();
  std::vector<void*> streams;
  for (int i = live0; i < 256; ++i) streams.push_back(NewStream());
  CHECK(api.live_streams() == 256);
  void* extra = nullptr;
  CHECK_RC(api.xpu_stream_create(&extra), kErrBusy);
  CHECK_RC(api.xpu_stream_destroy(streams.back()), kOk);
  streams.pop_back();
  CHECK_RC(api.xpu_stream_create(&extra), kOk);
  streams.push_back(extra);
  for (void* s : streams) CHECK_RC(api.xpu_stream_destroy(s), kOk);
  CHECK(api.live_streams() == live0);
  CHECK_RC(api.xpu_stream_create(nullptr), kErrInvalidParam);

  // Destroy waits for pending work.
  const size_t n = 4096;
  void* d = Malloc(n);
  FillDevice(d, n, 0x5A);
  std::vector<unsigned char> out(n, 0);
  void* s = NewStream();
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, s), kOk);
  CHECK_RC(api.xpu_stream_destroy(s), kOk);
  CHECK(AllBytes(out, 0x5A));
  CHECK_RC(api.xpu_stream_destroy(s), kErrInvalidParam);
  CHECK_RC(api.xpu_wait(s), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, s), kErrInvalidParam);
  CHECK_RC(api.xpu_stream_destroy(nullptr), kErrInvalidParam);
  CHECK_RC(api.xpu_free(d), kOk);
}

void TestCurrentDevice() {
  const size_t n = 4096;
  void* p0 = Malloc(n);
  void* s0 = NewStream();
  void* e0 = NewEvent();
  std::vector<unsigned char> out(n, 0);
  CHECK_RC(api.xpu_set_device(1), kOk);
  CHECK_RC(api.xpu_free(p0), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy_async(out.data(), p0, n, kD2H, s0), kErrInvalidParam);
  CHECK_RC(api.xpu_event_record(e0, s0), kErrInvalidParam);
  CHECK_RC(api.xpu_stream_wait_event(s0, e0), kErrInvalidParam);
  CHECK_RC(api.xpu_wait(s0), kErrInvalidParam);
  CHECK_RC(api.xpu_memcpy(out.data(), p0, n, kD2H), kErrInvalidParam);
  // The same calls from another thread, which is on device 0.
  std::thread([&] {
    CHECK_RC(api.xpu_memcpy_async(out.data(), p0, n, kD2H, s0), kOk);
    CHECK_RC(api.xpu_event_record(e0, s0), kOk);
    CHECK_RC(api.xpu_wait(s0), kOk);
  }).join();
  CHECK_RC(api.xpu_set_device(0), kOk);
  CHECK_RC(api.xpu_stream_wait_event(s0, e0), kOk);
  CHECK_RC(api.xpu_wait(s0), kOk);
  CHECK_RC(api.xpu_stream_destroy(s0), kOk);
  CHECK_RC(api.xpu_event_destroy(e0), kOk);
  CHECK_RC(api.xpu_free(p0), kOk);
}

void TestHost() {
  void* h = nullptr;
  CHECK_RC(api.xpu_host_alloc(&h, 4096, 1), kErrInvalidParam);
  CHECK_RC(api.xpu_host_alloc(nullptr, 4096, 0), kErrInvalidParam);
  CHECK_RC(api.xpu_host_alloc(&h, 10000, 0), kOk);
  REQUIRE(h != nullptr);
  const unsigned char* c = static_cast<const unsigned char*>(h);
  bool garbage = true;
  for (int i = 0; i < 10000; ++i) garbage = garbage && c[i] == 0xA5;
  CHECK(garbage);
  std::memset(h, 1, 10000);
  void* d = Malloc(10000);
  CHECK_RC(api.xpu_memcpy(d, h, 10000, kH2D), kOk);
  CHECK(AllBytes(ReadDevice(d, 10000), 1));
  CHECK_RC(api.xpu_free(d), kOk);
  CHECK_RC(api.xpu_host_free(h), kOk);
  CHECK_RC(api.xpu_host_free(h), kErrInvalidParam);
  int local = 0;
  CHECK_RC(api.xpu_host_free(&local), kErrInvalidParam);

  std::vector<char> buf(3 * 4096);
  CHECK_RC(api.xpu_host_register(buf.data(), 4096, 0), kOk);
  CHECK_RC(api.xpu_host_register(buf.data() + 100, 10, 0), kErrHostMemoryRegistered);
  CHECK_RC(api.xpu_host_register(buf.data(), 4096, 0), kErrHostMemoryRegistered);
  CHECK_RC(api.xpu_host_register(buf.data() + 4096, 4096, 0), kOk);  // adjacent is fine
  CHECK_RC(api.xpu_host_register(buf.data() + 8192, 4096, 1), kErrInvalidParam);
  CHECK_RC(api.xpu_host_unregister(buf.data() + 1), kErrInvalidParam);
  CHECK_RC(api.xpu_host_unregister(buf.data()), kOk);
  CHECK_RC(api.xpu_host_unregister(buf.data()), kErrInvalidParam);
  CHECK_RC(api.xpu_host_unregister(buf.data() + 4096), kOk);
  void* dev = Malloc(4096);
  CHECK_RC(api.xpu_host_register(dev, 4096, 0), kErrInvalidParam);
  CHECK_RC(api.xpu_free(dev), kOk);
}

void TestXpuml() {
  LoadXpuml();
  unsigned int count = 0;
  CHECK_RC(api.xpumlDeviceGetCount(&count), 1);  // not initialised yet
  CHECK_RC(api.xpumlInit(), 0);
  CHECK_RC(api.xpumlDeviceGetCount(&count), 0);
  CHECK(count == 2);
  void* dev = nullptr;
  CHECK_RC(api.xpumlDeviceGetHandleByIndex(2, &dev), 2);
  CHECK_RC(api.xpumlDeviceGetHandleByIndex(1, &dev), 0);
  void* p = Malloc(1 << 20);
  XpumlMemory m;
  std::memset(&m, 0xff, sizeof(m));
  CHECK_RC(api.xpumlDeviceGetHandleByIndex(0, &dev), 0);
  CHECK_RC(api.xpumlDeviceGetMemoryInfo(dev, &m), 0);
  CHECK(m.global_page_size == 4096);
  CHECK(m.global_total == kGiB);
  CHECK(m.global_used == api.memory_used(0));
  CHECK(m.global_used >= (1u << 20));
  CHECK(m.global_free == m.global_total - m.global_used);
  CHECK(m.l3_total == 96ull << 20);
  CHECK(m.l3_used == 0);
  CHECK(m.l3_free == 96ull << 20);
  CHECK(m.reserved[0] == 0 && m.reserved[7] == 0);
  CHECK_RC(api.xpumlDeviceGetMemoryInfo(&m, &m), 2);
  CHECK_RC(api.xpumlDeviceGetMemoryInfo(dev, nullptr), 2);
  CHECK_RC(api.xpu_free(p), kOk);
  CHECK_RC(api.xpumlDeviceGetMemoryInfo(dev, &m), 0);
  CHECK(m.global_used == api.memory_used(0));
  // Telemetry at the defaults (FAKE_XPUML_* unset).
  unsigned int celsius = 0, milliwatts = 0;
  XpumlUtilization util;
  std::memset(&util, 0xff, sizeof(util));
  CHECK_RC(api.xpumlDeviceGetTemperature(dev, flagos::kunlunxin::kXpumlTemperatureXpu, &celsius), 0);
  CHECK(celsius == 45);
  CHECK_RC(api.xpumlDeviceGetTemperature(dev, 1, &celsius), 3);  // only the die sensor
  CHECK_RC(api.xpumlDeviceGetPowerUsage(dev, &milliwatts), 0);
  CHECK(milliwatts == 150000);
  CHECK_RC(api.xpumlDeviceGetUtilizationRates(dev, &util), 0);
  CHECK(util.xpu == 0 && util.memory == 0 && util.reserved[0] == 0 && util.reserved[14] == 0);
  CHECK_RC(api.xpumlDeviceGetTemperature(&m, 0, &celsius), 2);
  CHECK_RC(api.xpumlDeviceGetPowerUsage(dev, nullptr), 2);
  CHECK_RC(api.xpumlDeviceGetUtilizationRates(&m, &util), 2);
  CHECK_RC(api.xpumlShutdown(), 0);
  CHECK_RC(api.xpumlDeviceGetCount(&count), 1);
  CHECK_RC(api.xpumlDeviceGetPowerUsage(dev, &milliwatts), 1);
}

void TestCalls() {
  uint64_t before = api.calls("xpu_malloc");
  void* p = nullptr;
  api.xpu_malloc(&p, 16, 7);  // fails, still counted
  CHECK(api.calls("xpu_malloc") == before + 1);
  CHECK(api.calls("xpu_nothing") == 0);
  CHECK(api.calls(nullptr) == 0);
  CHECK(api.calls("xpu_memcpy") > 0);
}

void TestConcurrency() {
  constexpr int kThreads = 8;
  constexpr int kIters = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      CHECK_RC(api.xpu_set_device(t % 2), kOk);
      void* s = nullptr;
      void* e = nullptr;
      CHECK_RC(api.xpu_stream_create(&s), kOk);
      CHECK_RC(api.xpu_event_create(&e), kOk);
      const size_t n = 16384 + 256 * t;
      std::vector<unsigned char> in(n), out(n);
      for (int i = 0; i < kIters; ++i) {
        void* d = nullptr;
        CHECK_RC(api.xpu_malloc(&d, n, 0), kOk);
        for (size_t k = 0; k < n; ++k) in[k] = static_cast<unsigned char>(k * 31 + i * 7 + t);
        CHECK_RC(api.xpu_memcpy_async(d, in.data(), n, kH2D, s), kOk);
        CHECK_RC(api.xpu_event_record(e, s), kOk);
        CHECK_RC(api.xpu_stream_wait_event(nullptr, e), kOk);
        CHECK_RC(api.xpu_memcpy_async(out.data(), d, n, kD2H, nullptr), kOk);
        int q = api.xpu_event_query(e);
        CHECK(q == kOk || q == kErrBusy);
        CHECK_RC(api.xpu_wait(nullptr), kOk);
        CHECK(out == in);
        CHECK_RC(api.xpu_wait(s), kOk);
        CHECK_RC(api.xpu_free(d), kOk);
      }
      CHECK_RC(api.xpu_event_destroy(e), kOk);
      CHECK_RC(api.xpu_stream_destroy(s), kOk);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(api.live_streams() == 0);
  CHECK(api.live_events() == 0);
  CHECK(api.memory_used(0) == 0);
  CHECK(api.memory_used(1) == 0);
}

// ---- checks run in a re-executed copy with other settings ---------------

int ModeFail() {
  LoadRuntime();
  void* p = nullptr;
  CHECK_RC(api.xpu_malloc(&p, 256, 0), kOk);
  void* q = nullptr;
  CHECK_RC(api.xpu_malloc(&q, 256, 0), kErrNoDeviceMemory);
  CHECK(q == nullptr);  // the injected failure did no work
  void* r = nullptr;
  CHECK_RC(api.xpu_malloc(&r, 256, 0), kOk);
  CHECK(api.calls("xpu_malloc") == 3);
  CHECK(api.memory_used(0) == 512);
  unsigned char b[16] = {};
  CHECK_RC(api.xpu_memcpy(p, b, 16, kH2D), -713);
  CHECK_RC(api.xpu_memcpy(p, b, 16, kH2D), -713);
  void* s = nullptr;
  CHECK_RC(api.xpu_stream_create(&s), kErrBusy);
  CHECK(api.live_streams() == 0);
  CHECK_RC(api.xpu_stream_create(&s), kOk);
  CHECK_RC(api.xpu_wait(s), kOk);
  CHECK_RC(api.xpu_wait(s), kOk);
  CHECK_RC(api.xpu_wait(s), kErrAbnormal);
  CHECK_RC(api.xpu_wait(s), kOk);
  CHECK_RC(api.xpu_stream_destroy(s), kOk);
  CHECK_RC(api.xpu_free(p), kOk);
  CHECK_RC(api.xpu_free(r), kOk);
  return g_failures == 0 ? 0 : 1;
}

int ModeLie() {
  LoadRuntime();
  const size_t n = 4096;
  void* d = Malloc(n);
  FillDevice(d, n, 0x11);
  std::vector<unsigned char> src(n, 0x22);
  void* s = NewStream();
  CHECK_RC(api.xpu_memcpy_async(d, src.data(), n, kH2D, s), kOk);
  CHECK_RC(api.xpu_wait(s), kOk);
  CHECK(AllBytes(ReadDevice(d, n), 0x11));  // the "copy" never happened
  void* e = NewEvent();
  CHECK_RC(api.xpu_event_record(e, s), kOk);
  CHECK_RC(api.xpu_event_query(e), kOk);  // nothing recorded: looks complete
  CHECK(api.calls("xpu_memcpy_async") == 1);
  CHECK_RC(api.xpu_event_destroy(e), kOk);
  CHECK_RC(api.xpu_stream_destroy(s), kOk);
  CHECK_RC(api.xpu_free(d), kOk);
  return g_failures == 0 ? 0 : 1;
}

int ModeNoDevices() {
  LoadRuntime();
  int n = -1;
  CHECK_RC(api.xpu_device_count(&n), kOk);
  CHECK(n == 0);
  void* p = nullptr;
  CHECK_RC(api.xpu_malloc(&p, 16, 0), kErrInvalidDevice);
  CHECK_RC(api.xpu_set_device(0), kErrInvalidDevice);
  void* s = nullptr;
  CHECK_RC(api.xpu_stream_create(&s), kErrInvalidDevice);
  CHECK_RC(api.xpu_wait(nullptr), kErrInvalidDevice);
  uint64_t v = 0;
  CHECK_RC(api.xpu_device_get_attr(&v, 5, 0), kErrInvalidDevice);
  LoadXpuml();
  unsigned int count = 9;
  CHECK_RC(api.xpumlInit(), 0);
  CHECK_RC(api.xpumlDeviceGetCount(&count), 0);
  CHECK(count == 0);
  void* dev = nullptr;
  CHECK_RC(api.xpumlDeviceGetHandleByIndex(0, &dev), 2);
  return g_failures == 0 ? 0 : 1;
}

int ModeSmall() {
  LoadRuntime();
  const uint64_t mib = 1 << 20;
  int n = 0;
  CHECK_RC(api.xpu_device_count(&n), kOk);
  CHECK(n == 3);
  CHECK_RC(api.xpu_set_device(2), kOk);
  CHECK_RC(api.xpu_set_device(3), kErrInvalidDevice);
  uint64_t v = 0;
  CHECK_RC(api.xpu_device_get_attr(&v, 5, 0), kOk);
  CHECK(v == mib);
  void* whole = Malloc(mib);
  void* more = nullptr;
  CHECK_RC(api.xpu_malloc(&more, 1, 0), kErrNoDeviceMemory);
  CHECK_RC(api.xpu_free(whole), kOk);
  void* a = Malloc(mib / 4);
  void* b = Malloc(mib / 4);
  void* c = Malloc(mib / 4);
  void* d = Malloc(mib / 4);
  CHECK_RC(api.xpu_malloc(&more, 1, 0), kErrNoDeviceMemory);
  CHECK_RC(api.xpu_free(c), kOk);
  CHECK_RC(api.xpu_free(b), kOk);
  void* bc = Malloc(mib / 2);  // needs b and c coalesced
  CHECK(bc == b);
  CHECK_RC(api.xpu_free(a), kOk);
  CHECK_RC(api.xpu_free(d), kOk);
  CHECK_RC(api.xpu_free(bc), kOk);
  whole = Malloc(mib);  // everything coalesced again
  CHECK(whole == a);
  CHECK_RC(api.xpu_free(whole), kOk);
  CHECK(api.memory_used(2) == 0);
  return g_failures == 0 ? 0 : 1;
}

// FAKE_XPUML_TEMPERATURE=71, FAKE_XPUML_POWER_MW=212500,
// FAKE_XPUML_UTILIZATION=37.
int ModeXpumlTelemetry() {
  LoadRuntime();
  LoadXpuml();
  CHECK_RC(api.xpumlInit(), 0);
  void* dev = nullptr;
  CHECK_RC(api.xpumlDeviceGetHandleByIndex(1, &dev), 0);
  unsigned int celsius = 0, milliwatts = 0;
  XpumlUtilization util{};
  CHECK_RC(api.xpumlDeviceGetTemperature(dev, 0, &celsius), 0);
  CHECK(celsius == 71);
  CHECK_RC(api.xpumlDeviceGetPowerUsage(dev, &milliwatts), 0);
  CHECK(milliwatts == 212500);
  CHECK_RC(api.xpumlDeviceGetUtilizationRates(dev, &util), 0);
  CHECK(util.xpu == 37);
  return g_failures == 0 ? 0 : 1;
}

// FAKE_XPUML_NO_TELEMETRY=1: the three telemetry calls are not supported,
// memory info still is.
int ModeXpumlNoTelemetry() {
  LoadRuntime();
  LoadXpuml();
  CHECK_RC(api.xpumlInit(), 0);
  void* dev = nullptr;
  CHECK_RC(api.xpumlDeviceGetHandleByIndex(0, &dev), 0);
  unsigned int celsius = 7, milliwatts = 7;
  XpumlUtilization util{};
  util.xpu = 7;
  CHECK_RC(api.xpumlDeviceGetTemperature(dev, 0, &celsius), 3);
  CHECK_RC(api.xpumlDeviceGetPowerUsage(dev, &milliwatts), 3);
  CHECK_RC(api.xpumlDeviceGetUtilizationRates(dev, &util), 3);
  CHECK(celsius == 7 && milliwatts == 7 && util.xpu == 7);  // outputs untouched
  XpumlMemory m;
  CHECK_RC(api.xpumlDeviceGetMemoryInfo(dev, &m), 0);
  return g_failures == 0 ? 0 : 1;
}

int ModeXpumlAlone() {
  LoadXpuml();  // no libxpurt in the process
  CHECK_RC(api.xpumlInit(), 1);
  unsigned int count = 0;
  CHECK_RC(api.xpumlDeviceGetCount(&count), 1);
  return g_failures == 0 ? 0 : 1;
}

// Leaves work queued and a thread blocked in xpu_wait, then exits: the
// unload must not hang.
int ModeExitPending() {
  LoadRuntime();
  const size_t n = 1 << 16;
  // Never freed: queued copies may still read it while the process exits
  // (as with the real runtime, a host buffer must outlive its copies).
  static auto* host = new std::vector<unsigned char>(n, 1);
  std::vector<void*> streams;
  for (int i = 0; i < 4; ++i) {
    void* s = NewStream();
    void* d = Malloc(n);  // one buffer per stream: the streams do not race
    for (int k = 0; k < 200; ++k) CHECK_RC(api.xpu_memcpy_async(d, host->data(), n, kH2D, s), kOk);
    streams.push_back(s);
  }
  void* e = NewEvent();
  CHECK_RC(api.xpu_event_record(e, streams[0]), kOk);
  CHECK_RC(api.xpu_stream_wait_event(streams[1], e), kOk);
  std::thread([s = streams[2]] { api.xpu_wait(s); }).detach();
  std::thread([e] { api.xpu_event_wait(e); }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return g_failures == 0 ? 0 : 1;
}

// Loads and unloads the library with work still queued: the unload joins
// the workers and a fresh load starts from scratch.
int ModeReload() {
  const size_t n = 1 << 16;
  static auto* host = new std::vector<unsigned char>(n, 9);  // outlives every copy
  for (int round = 0; round < 3; ++round) {
    // A fresh runtime each time when dlclose really unloaded it (it may
    // legitimately stay loaded; then the rounds simply accumulate).
    void* h = LoadRuntime();
    void* d = Malloc(n);
    void* s = NewStream();
    for (int k = 0; k < 50; ++k) CHECK_RC(api.xpu_memcpy_async(d, host->data(), n, kH2D, s), kOk);
    CHECK(dlclose(h) == 0);
  }
  return g_failures == 0 ? 0 : 1;
}

// FAKE_XPU_STALL_AFTER=3@1, two devices: device 1's third queued operation
// and everything queued on device 1 after it never run; what came before
// it, and device 0, are unaffected; the process still exits.
int ModeStall() {
  LoadRuntime();
  const size_t n = 4096;
  static auto* ones = new std::vector<unsigned char>(n, 0x11);  // outlive the stalled copies
  static auto* twos = new std::vector<unsigned char>(n, 0x22);
  CHECK_RC(api.xpu_set_device(1), kOk);
  void* d = Malloc(n);
  void* s1 = NewStream();
  void* s2 = NewStream();
  void* before = NewEvent();
  void* after_same_stream = NewEvent();
  void* after_other_stream = NewEvent();
  CHECK_RC(api.xpu_memcpy_async(d, ones->data(), n, kH2D, s1), kOk);  // 1st
  CHECK_RC(api.xpu_event_record(before, s1), kOk);                    // 2nd
  CHECK_RC(api.xpu_memcpy_async(d, twos->data(), n, kH2D, s1), kOk);  // 3rd: stalls device 1
  CHECK_RC(api.xpu_event_record(after_same_stream, s1), kOk);
  CHECK_RC(api.xpu_event_record(after_other_stream, s2), kOk);
  CHECK_RC(api.xpu_event_wait(before), kOk);
  // Long past the delay, none of the work from the third on has run.
  std::this_thread::sleep_for(std::chrono::microseconds(50 * g_delay_us) +
                              std::chrono::milliseconds(20));
  CHECK_RC(api.xpu_event_query(before), kOk);
  CHECK_RC(api.xpu_event_query(after_same_stream), kErrBusy);
  CHECK_RC(api.xpu_event_query(after_other_stream), kErrBusy);
  // The device memory holds the first copy's bytes (xpu_memcpy_peer
  // reads at once, past every stream).
  CHECK_RC(api.xpu_set_device(0), kOk);
  void* d0 = Malloc(n);
  CHECK_RC(api.xpu_memcpy_peer(0, d0, 1, d, n), kOk);
  CHECK(AllBytes(ReadDevice(d0, n), 0x11));
  // Device 0 still completes work.
  void* s0 = NewStream();
  CHECK_RC(api.xpu_memcpy_async(d0, twos->data(), n, kH2D, s0), kOk);
  CHECK_RC(api.xpu_wait(s0), kOk);
  CHECK(AllBytes(ReadDevice(d0, n), 0x22));
  // A thread waiting for the stalled stream is released by the unload at
  // exit, which must not hang.
  std::thread([s1] {
    api.xpu_set_device(1);
    api.xpu_wait(s1);
  }).detach();
  return g_failures == 0 ? 0 : 1;
}

// FAKE_XPU_STALL_AFTER=2 (no device): operations of every device count;
// the second one, on device 1, stalls device 1 only.
int ModeStallAnyDevice() {
  LoadRuntime();
  void* e0 = NewEvent();
  void* s0 = NewStream();
  CHECK_RC(api.xpu_set_device(1), kOk);
  void* e1 = NewEvent();
  void* s1 = NewStream();
  CHECK_RC(api.xpu_set_device(0), kOk);
  CHECK_RC(api.xpu_event_record(e0, s0), kOk);  // 1st
  CHECK_RC(api.xpu_set_device(1), kOk);
  CHECK_RC(api.xpu_event_record(e1, s1), kOk);  // 2nd: stalls device 1
  CHECK_RC(api.xpu_set_device(0), kOk);
  CHECK_RC(api.xpu_event_record(e0, s0), kOk);  // 3rd, on device 0: runs
  CHECK_RC(api.xpu_event_wait(e0), kOk);
  std::this_thread::sleep_for(std::chrono::microseconds(50 * g_delay_us) +
                              std::chrono::milliseconds(20));
  CHECK_RC(api.xpu_event_query(e1), kErrBusy);
  return g_failures == 0 ? 0 : 1;
}

int RunChildMode(const std::string& mode) {
  if (mode == "fail") return ModeFail();
  if (mode == "lie") return ModeLie();
  if (mode == "no-devices") return ModeNoDevices();
  if (mode == "small") return ModeSmall();
  if (mode == "xpuml-alone") return ModeXpumlAlone();
  if (mode == "xpuml-telemetry") return ModeXpumlTelemetry();
  if (mode == "xpuml-no-telemetry") return ModeXpumlNoTelemetry();
  if (mode == "exit-pending") return ModeExitPending();
  if (mode == "reload") return ModeReload();
  if (mode == "stall") return ModeStall();
  if (mode == "stall-any-device") return ModeStallAnyDevice();
  if (mode == "bad-env") {
    LoadRuntime();  // must abort
    return 3;
  }
  if (mode == "bad-xpuml-env") {
    LoadXpuml();  // must abort
    return 3;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

void TestModes() {
  struct Case {
    const char* name;
    std::vector<std::pair<std::string, std::string>> env;
  };
  std::vector<Case> cases = {
      {"fail", {{"FAKE_XPU_FAIL", "xpu_malloc:2:705, xpu_memcpy:0:-713,xpu_stream_create:1:716,xpu_wait:3:713"}}},
      {"lie", {{"FAKE_XPU_LIE", "xpu_memcpy_async,xpu_wait,xpu_event_record"}}},
      {"no-devices", {{"FAKE_XPU_DEVICES", "0"}}},
      {"small", {{"FAKE_XPU_DEVICES", "3"}, {"FAKE_XPU_MEMORY", "1048576"}}},
      {"xpuml-alone", {}},
      {"xpuml-telemetry",
       {{"FAKE_XPUML_TEMPERATURE", "71"}, {"FAKE_XPUML_POWER_MW", "212500"}, {"FAKE_XPUML_UTILIZATION", "37"}}},
      {"xpuml-no-telemetry", {{"FAKE_XPUML_NO_TELEMETRY", "1"}}},
      {"exit-pending", {{"FAKE_XPU_DELAY_US", "20000"}}},
      // dlclose leaks the fake's bookkeeping by design (see README.md).
      {"reload", {{"FAKE_XPU_DELAY_US", "20000"}, {"ASAN_OPTIONS", "detect_leaks=0"}}},
      {"stall", {{"FAKE_XPU_DEVICES", "2"}, {"FAKE_XPU_STALL_AFTER", "3@1"}}},
      {"stall-any-device", {{"FAKE_XPU_DEVICES", "2"}, {"FAKE_XPU_STALL_AFTER", "2"}}},
  };
  for (const Case& c : cases) {
    auto t0 = Clock::now();
    int st = RunMode(c.name, c.env, 60);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!ExitedOk(st)) {
      std::fprintf(stderr, "mode %s failed (status %d)\n", c.name, st);
      ++g_failures;
    }
    if (std::string(c.name) == "exit-pending" && secs > 10) {
      std::fprintf(stderr, "exit with pending work took %.1f s\n", secs);
      ++g_failures;
    }
  }
  // Malformed settings abort at load.
  const std::vector<std::pair<std::string, std::string>> bad[] = {
      {{"FAKE_XPU_FAIL", "xpu_nosuch:1:705"}}, {{"FAKE_XPU_FAIL", "xpu_malloc:x:705"}},
      {{"FAKE_XPU_LIE", "xpu_nosuch"}},        {{"FAKE_XPU_DEVICES", "65"}},
      {{"FAKE_XPU_MEMORY", "1G"}},             {{"FAKE_XPU_DELAY_US", "-1"}},
      {{"FAKE_XPU_STALL_AFTER", "0"}},         {{"FAKE_XPU_STALL_AFTER", "3@2"}},
      {{"FAKE_XPU_STALL_AFTER", "3@"}},
  };
  for (const auto& env : bad) {
    int st = RunMode("bad-env", env, 60);
    if (!(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT)) {
      std::fprintf(stderr, "%s=%s did not abort the load (status %d)\n", env[0].first.c_str(),
                   env[0].second.c_str(), st);
      ++g_failures;
    }
  }
  const std::vector<std::pair<std::string, std::string>> bad_xpuml[] = {
      {{"FAKE_XPUML_TEMPERATURE", "hot"}}, {{"FAKE_XPUML_POWER_MW", "-1"}},
      {{"FAKE_XPUML_UTILIZATION", "101"}}, {{"FAKE_XPUML_NO_TELEMETRY", "yes"}},
  };
  for (const auto& env : bad_xpuml) {
    int st = RunMode("bad-xpuml-env", env, 60);
    if (!(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT)) {
      std::fprintf(stderr, "%s=%s did not abort the libxpuml load (status %d)\n",
                   env[0].first.c_str(), env[0].second.c_str(), st);
      ++g_failures;
    }
  }
}

std::string SelfPath(const char* argv0) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = '\0';
    return buf;
  }
  return argv0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <path to libxpurt.so.2> [mode]\n", argv[0]);
    return 2;
  }
  g_lib = argv[1];
  size_t slash = g_lib.rfind('/');
  g_ml = (slash == std::string::npos ? std::string() : g_lib.substr(0, slash + 1)) + "libxpuml.so.1";
  g_self = SelfPath(argv[0]);
  if (const char* d = std::getenv("FAKE_XPU_DELAY_US")) g_delay_us = std::atoll(d);

  if (argc >= 3) return RunChildMode(argv[2]);

  // The in-process checks expect the defaults (the delay may vary).
  unsetenv("FAKE_XPU_FAIL");
  unsetenv("FAKE_XPU_LIE");
  unsetenv("FAKE_XPU_STALL_AFTER");
  unsetenv("FAKE_XPU_DEVICES");
  unsetenv("FAKE_XPU_MEMORY");
  unsetenv("FAKE_XPUML_TEMPERATURE");
  unsetenv("FAKE_XPUML_POWER_MW");
  unsetenv("FAKE_XPUML_UTILIZATION");
  unsetenv("FAKE_XPUML_NO_TELEMETRY");
  void* h = LoadRuntime();
  struct {
    const char* name;
    void (*fn)();
  } tests[] = {
      {"devices", TestDevices},   {"memory", TestMemory},         {"deref", TestDeref},
      {"async", TestAsyncVisibility}, {"events", TestEvents},     {"streams", TestStreams},
      {"current-device", TestCurrentDevice}, {"host", TestHost},   {"xpuml", TestXpuml},
      {"calls", TestCalls},       {"concurrency", TestConcurrency}, {"modes", TestModes},
  };
  TestExports(h);
  for (const auto& t : tests) {
    int before = g_failures;
    auto t0 = Clock::now();
    t.fn();
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("%-15s %s (%.0f ms)\n", t.name, g_failures == before ? "ok" : "FAILED", ms);
  }
  std::printf("delay %lld us; %d timing observations retried, %d timing checks not judged; %d failures\n",
              static_cast<long long>(g_delay_us), g_inconclusive, g_unjudged, g_failures.load());
  return g_failures == 0 ? 0 : 1;
}
