// A test-only, deliberately hostile fake of the Kunlun P800 runtime library
// libxpurt. See README.md next to this file for what it does and why. It
// is never shipped and never loaded outside tests.
//
// Design:
// - Each device owns a memfd as large as its memory. The file is mapped
//   twice: PROT_NONE (the addresses xpu_malloc hands out, so a host
//   dereference faults) and read/write (the "shadow", used only inside the
//   fake to perform copies).
// - Each stream (the per-device default stream and every created one) is a
//   FIFO run by its own worker thread, started on the first queued
//   operation. An operation becomes runnable FAKE_XPU_DELAY_US after it was
//   issued, so completion always lags the call. With FAKE_XPU_STALL_AFTER
//   the Nth queued operation, and every later one on its device, is marked
//   stalled: its worker waits at it until the library unloads.
// - An event's record is a shared Record whose `done` flag the worker sets
//   when it reaches the marker; waits on records use one global
//   mutex/condition variable.
// - All state lives in one heap object created by the library constructor
//   and never deleted (another library's destructor may still call in at
//   exit); the destructor stops and joins every worker.

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fake_xpurt.h"
#include "fake_xpurt_codes.h"
#include "fake_env.h"
#include "xpurt_symbols.h"

// Declare every function of the shared prototype table first: a definition
// below whose parameters differ from the table's is a compile error
// (conflicting declaration of a C function).
#define FAKE_XPU_DECLARE(name, params) extern "C" __attribute__((visibility("default"))) int name params;
FLAGOS_XPURT_SYMBOLS(FAKE_XPU_DECLARE, FAKE_XPU_DECLARE)
#undef FAKE_XPU_DECLARE

namespace {

using fake_xpu::kErrAbnormal;
using fake_xpu::kErrBusy;
using fake_xpu::kErrHostMemoryRegistered;
using fake_xpu::kErrInvalidDevice;
using fake_xpu::kErrInvalidParam;
using fake_xpu::kErrNoDeviceMemory;
using fake_xpu::kErrNoHostMemory;
using fake_xpu::kOk;

constexpr int kMaxDevices = flagos::kunlunxin::kXpuMaxDevices;
constexpr int kMaxStreams = flagos::kunlunxin::kXpuMaxStreams;
constexpr uint64_t kAlign = 256;
constexpr unsigned char kPoison = 0xA5;
// Fresh allocations up to this size are filled with kPoison; larger ones
// only where the memory was used before (filling them whole would make
// every large allocation cost its size in real memory).
constexpr uint64_t kPoisonWholeLimit = 64ull << 20;
constexpr int kLastAttr = 10;
constexpr uint64_t kModelKl3P800 = 400;
// Handles are addresses inside PROT_NONE regions: unique, and a host
// dereference of a handle faults.
constexpr uint64_t kHandleRegionBytes = 64ull << 20;
constexpr uint64_t kHandleStride = 8;

using Clock = std::chrono::steady_clock;

enum Sym : int {
#define FAKE_XPU_SYM_ENUM(name, params) kSym_##name,
  FLAGOS_XPURT_SYMBOLS(FAKE_XPU_SYM_ENUM, FAKE_XPU_SYM_ENUM)
#undef FAKE_XPU_SYM_ENUM
      kSymCount
};

constexpr const char* kSymNames[kSymCount] = {
#define FAKE_XPU_SYM_NAME(name, params) #name,
    FLAGOS_XPURT_SYMBOLS(FAKE_XPU_SYM_NAME, FAKE_XPU_SYM_NAME)
#undef FAKE_XPU_SYM_NAME
};

int SymByName(std::string_view name) {
  for (int i = 0; i < kSymCount; ++i) {
    if (name == kSymNames[i]) return i;
  }
  return -1;
}

[[noreturn]] void ConfigError(const char* var, const std::string& what) {
  fake_env::ConfigError("fake libxpurt", var, what);
}

struct FailRule {
  uint64_t nth;  // 1-based call number; 0: every call
  int code;
};

struct Config {
  int devices = 2;
  uint64_t memory = 1ull << 30;
  int64_t delay_us = 200;
  std::vector<FailRule> fail[kSymCount];
  bool lie[kSymCount] = {};
  // FAKE_XPU_STALL_AFTER=N[@D]: the Nth queued operation (of device D, or
  // of any device when D < 0) stalls its device; 0: never.
  uint64_t stall_after = 0;
  int stall_device = -1;
};

struct Record {
  std::atomic<bool> done{false};
};

enum class OpKind { kCopy, kRecord, kWaitRecord, kKernel };

struct Op {
  OpKind kind = OpKind::kCopy;
  Clock::time_point ready_at;
  void* dst = nullptr;        // translated (shadow or host) address
  const void* src = nullptr;  // translated (shadow or host) address
  uint64_t size = 0;
  std::shared_ptr<Record> record;  // kRecord: to complete; kWaitRecord: to wait for (may be null)
  bool stalled = false;            // issued to a stalled device: never runs
  void (*kernel)(void*) = nullptr;  // kKernel: runs kernel(kernel_arg)
  void* kernel_arg = nullptr;
};

struct Stream {
  int dev = 0;
  uintptr_t handle = 0;  // 0 for a device's default stream
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> queue;
  uint64_t issued = 0;
  uint64_t completed = 0;
  bool closed = false;  // destroyed: no new work
  bool stop = false;    // the worker must exit (guarded by mu)
  std::atomic<bool> stop_flag{false};  // the same, for waits on records
  std::thread worker;
};

struct Allocation {
  uint64_t reserved;   // bytes taken from the device (multiple of kAlign)
  uint64_t requested;  // bytes a copy may touch
};

struct Device {
  int index = 0;
  uint64_t capacity = 0;
  uint64_t map_size = 0;
  int fd = -1;
  char* base = nullptr;    // PROT_NONE: what callers see
  char* shadow = nullptr;  // read/write: what the fake's copies use
  std::mutex mu;
  std::map<uint64_t, uint64_t> free_blocks;  // offset -> bytes
  std::map<uint64_t, Allocation> live;       // offset -> allocation
  uint64_t used = 0;
  std::shared_ptr<Stream> default_stream;
};

struct Event {
  int dev = 0;
  std::mutex mu;
  std::shared_ptr<Record> latest;  // null: never recorded
};

struct State {
  Config cfg;
  pid_t pid = 0;
  std::atomic<bool> forked{false};
  std::atomic<bool> shutdown{false};
  std::vector<std::unique_ptr<Device>> devices;
  std::atomic<uint64_t> calls[kSymCount] = {};

  std::mutex mu;  // the stream and event registries
  std::unordered_map<uintptr_t, std::shared_ptr<Stream>> streams;
  std::unordered_map<uintptr_t, std::shared_ptr<Event>> events;
  char* stream_handles = nullptr;
  char* event_handles = nullptr;
  uint64_t next_stream = 1;
  uint64_t next_event = 1;

  std::mutex host_mu;
  std::map<uintptr_t, uint64_t> host_allocs;      // start -> mapped bytes
  std::map<uintptr_t, uint64_t> host_registered;  // start -> bytes

  std::mutex rec_mu;  // record completion and waits on it
  std::condition_variable rec_cv;

  // FAKE_XPU_STALL_AFTER's count of queued operations and the devices it
  // stalled. Taken inside a stream's mu, never the other way round.
  std::mutex stall_mu;
  uint64_t queued_ops = 0;
  bool stalled[kMaxDevices] = {};
};

State* g = nullptr;
thread_local int t_device = 0;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// ---- configuration -------------------------------------------------------

using fake_env::Trim;

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    out.push_back(Trim(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start)));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

long long ParseInt(const char* var, const std::string& text, long long lo, long long hi) {
  return fake_env::ParseInt("fake libxpurt", var, text, lo, hi);
}

void ParseConfig(Config& cfg) {
  if (const char* v = std::getenv("FAKE_XPU_DEVICES")) {
    cfg.devices = static_cast<int>(ParseInt("FAKE_XPU_DEVICES", Trim(v), 0, kMaxDevices));
  }
  if (const char* v = std::getenv("FAKE_XPU_MEMORY")) {
    cfg.memory = static_cast<uint64_t>(ParseInt("FAKE_XPU_MEMORY", Trim(v), 1, 1ll << 40));
  }
  if (const char* v = std::getenv("FAKE_XPU_DELAY_US")) {
    cfg.delay_us = ParseInt("FAKE_XPU_DELAY_US", Trim(v), 0, 60ll * 1000 * 1000);
  }
  if (const char* v = std::getenv("FAKE_XPU_FAIL")) {
    for (const std::string& item : Split(v, ',')) {
      if (item.empty()) continue;
      std::vector<std::string> f = Split(item, ':');
      if (f.size() != 3) ConfigError("FAKE_XPU_FAIL", "'" + item + "' is not sym:N:code");
      int sym = SymByName(f[0]);
      if (sym < 0) ConfigError("FAKE_XPU_FAIL", "unknown symbol '" + f[0] + "'");
      FailRule rule;
      rule.nth = static_cast<uint64_t>(ParseInt("FAKE_XPU_FAIL", f[1], 0, LLONG_MAX));
      rule.code = static_cast<int>(ParseInt("FAKE_XPU_FAIL", f[2], INT_MIN, INT_MAX));
      cfg.fail[sym].push_back(rule);
    }
  }
  if (const char* v = std::getenv("FAKE_XPU_STALL_AFTER")) {
    const std::string text = Trim(v);
    const size_t at = text.find('@');
    cfg.stall_after = static_cast<uint64_t>(
        ParseInt("FAKE_XPU_STALL_AFTER", text.substr(0, at), 1, LLONG_MAX));
    if (at != std::string::npos) {
      cfg.stall_device = static_cast<int>(
          ParseInt("FAKE_XPU_STALL_AFTER", text.substr(at + 1), 0, cfg.devices - 1));
    }
  }
  if (const char* v = std::getenv("FAKE_XPU_LIE")) {
    for (const std::string& item : Split(v, ',')) {
      if (item.empty()) continue;
      int sym = SymByName(item);
      if (sym < 0) ConfigError("FAKE_XPU_LIE", "unknown symbol '" + item + "'");
      cfg.lie[sym] = true;
    }
  }
}

// ---- every call starts here ----------------------------------------------

// Counts the call; true when it must return *rc at once (not initialised,
// in a forked child, an injected failure, or a lie).
bool Intercept(Sym sym, int* rc) {
  State* st = g;
  if (st == nullptr) {
    *rc = kErrAbnormal;
    return true;
  }
  uint64_t n = st->calls[sym].fetch_add(1, std::memory_order_relaxed) + 1;
  if (st->forked.load(std::memory_order_relaxed)) {
    *rc = kErrAbnormal;
    return true;
  }
  for (const FailRule& r : st->cfg.fail[sym]) {
    if (r.nth == 0 || r.nth == n) {
      *rc = r.code;
      return true;
    }
  }
  if (st->cfg.lie[sym]) {
    *rc = kOk;
    return true;
  }
  return false;
}

#define FAKE_XPU_ENTER(name)                                          \
  do {                                                                \
    int fake_xpu_rc_ = 0;                                             \
    if (Intercept(kSym_##name, &fake_xpu_rc_)) return fake_xpu_rc_;   \
  } while (0)

// ---- devices and memory --------------------------------------------------

void SetupDevice(Device& d) {
  long page = sysconf(_SC_PAGESIZE);
  d.map_size = RoundUp(d.capacity, static_cast<uint64_t>(page > 0 ? page : 4096));
  char name[32];
  std::snprintf(name, sizeof(name), "fake-xpu%d", d.index);
  d.fd = memfd_create(name, MFD_CLOEXEC);
  if (d.fd < 0) ConfigError("device setup", std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(d.fd, static_cast<off_t>(d.map_size)) != 0) {
    ConfigError("device setup", std::string("ftruncate: ") + std::strerror(errno));
  }
  void* base = mmap(nullptr, d.map_size, PROT_NONE, MAP_SHARED | MAP_NORESERVE, d.fd, 0);
  void* shadow = mmap(nullptr, d.map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, d.fd, 0);
  if (base == MAP_FAILED || shadow == MAP_FAILED) {
    ConfigError("device setup", std::string("mmap: ") + std::strerror(errno) +
                                    " (FAKE_XPU_MEMORY x FAKE_XPU_DEVICES too large?)");
  }
  d.base = static_cast<char*>(base);
  d.shadow = static_cast<char*>(shadow);
  d.free_blocks.emplace(0, d.capacity);
}

int CurrentDevice(int* dev) {
  if (t_device < 0 || t_device >= g->cfg.devices) return kErrInvalidDevice;
  *dev = t_device;
  return kOk;
}

bool RangeWraps(const void* p, uint64_t n) {
  return n > UINTPTR_MAX - reinterpret_cast<uintptr_t>(p);
}

Device* DeviceOf(const void* p) {
  const char* c = static_cast<const char*>(p);
  for (auto& d : g->devices) {
    if (c >= d->base && c < d->base + d->map_size) return d.get();
  }
  return nullptr;
}

bool OverlapsDevice(const void* p, uint64_t n) {
  uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n;
  for (auto& d : g->devices) {
    uintptr_t db = reinterpret_cast<uintptr_t>(d->base), de = db + d->map_size;
    if (b < de && db < e) return true;
  }
  return false;
}

bool InLiveAllocation(Device& d, const void* p, uint64_t n) {
  uint64_t off = static_cast<uint64_t>(static_cast<const char*>(p) - d.base);
  std::lock_guard<std::mutex> lk(d.mu);
  auto it = d.live.upper_bound(off);
  if (it == d.live.begin()) return false;
  --it;
  uint64_t into = off - it->first;
  return into <= it->second.requested && n <= it->second.requested - into;
}

// Fills [off, off+len) of the shadow with kPoison: all of it when `whole`,
// else only the parts of the file that hold data (pages used before).
void Poison(Device& d, uint64_t off, uint64_t len, bool whole) {
  if (len == 0) return;
  if (whole) {
    std::memset(d.shadow + off, kPoison, len);
    return;
  }
  uint64_t pos = off, end = off + len;
  while (pos < end) {
    off_t data = lseek(d.fd, static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0) {
      if (errno != ENXIO) std::memset(d.shadow + pos, kPoison, end - pos);  // no SEEK_DATA: fill all
      return;
    }
    uint64_t dstart = std::max<uint64_t>(static_cast<uint64_t>(data), pos);
    if (dstart >= end) return;
    off_t hole = lseek(d.fd, static_cast<off_t>(dstart), SEEK_HOLE);
    uint64_t dend = hole < 0 ? end : std::min<uint64_t>(end, static_cast<uint64_t>(hole));
    if (dend <= dstart) dend = end;
    std::memset(d.shadow + dstart, kPoison, dend - dstart);
    pos = dend;
  }
}

int Allocate(Device& d, uint64_t size, void** out) {
  uint64_t want = size == 0 ? kAlign : size;
  if (want > d.capacity) return kErrNoDeviceMemory;
  uint64_t reserved = RoundUp(want, kAlign);
  uint64_t off = 0;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    auto it = std::find_if(d.free_blocks.begin(), d.free_blocks.end(),
                           [&](const auto& b) { return b.second >= reserved; });
    if (it == d.free_blocks.end()) return kErrNoDeviceMemory;
    off = it->first;
    uint64_t block = it->second;
    d.free_blocks.erase(it);
    if (block > reserved) d.free_blocks.emplace(off + reserved, block - reserved);
    d.live.emplace(off, Allocation{reserved, size});
    d.used += reserved;
  }
  Poison(d, off, reserved, reserved <= kPoisonWholeLimit);
  *out = d.base + off;
  return kOk;
}

int Release(Device& d, uint64_t off) {
  Allocation a{};
  {
    std::lock_guard<std::mutex> lk(d.mu);
    auto it = d.live.find(off);
    if (it == d.live.end()) return kErrInvalidParam;
    a = it->second;
    d.live.erase(it);
    d.used -= a.reserved;
  }
  // Not cleared: stale contents become obvious garbage.
  Poison(d, off, a.reserved, /*whole=*/false);
  std::lock_guard<std::mutex> lk(d.mu);
  uint64_t start = off, len = a.reserved;
  auto next = d.free_blocks.lower_bound(off);
  if (next != d.free_blocks.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      start = prev->first;
      len += prev->second;
      d.free_blocks.erase(prev);
    }
  }
  if (next != d.free_blocks.end() && next->first == off + a.reserved) {
    len += next->second;
    d.free_blocks.erase(next);
  }
  d.free_blocks.emplace(start, len);
  return kOk;
}

char* Shadow(Device& d, const void* p) {
  return d.shadow + (static_cast<const char*>(p) - d.base);
}

int CheckHost(const void* p, uint64_t n) {
  if (p == nullptr || RangeWraps(p, n) || OverlapsDevice(p, n)) return kErrInvalidParam;
  return kOk;
}

// A device range inside one live allocation; of device `dev` unless dev < 0.
int CheckDevice(const void* p, uint64_t n, int dev, Device** out) {
  if (p == nullptr || RangeWraps(p, n)) return kErrInvalidParam;
  Device* d = DeviceOf(p);
  if (d == nullptr || (dev >= 0 && d->index != dev)) return kErrInvalidParam;
  if (!InLiveAllocation(*d, p, n)) return kErrInvalidParam;
  *out = d;
  return kOk;
}

// Validates a copy of kind `kind` for device `dev` and translates its
// device addresses into shadow addresses.
int PlanCopy(void* dst, const void* src, uint64_t n, int kind, int dev, void** tdst, const void** tsrc) {
  Device* dd = nullptr;
  Device* sd = nullptr;
  int rc = kOk;
  switch (kind) {
    case flagos::kunlunxin::kXpuMemcpyDeviceToHost:
      if ((rc = CheckDevice(src, n, dev, &sd)) != kOk) return rc;
      if ((rc = CheckHost(dst, n)) != kOk) return rc;
      *tdst = dst;
      *tsrc = Shadow(*sd, src);
      return kOk;
    case flagos::kunlunxin::kXpuMemcpyHostToDevice:
      if ((rc = CheckDevice(dst, n, dev, &dd)) != kOk) return rc;
      if ((rc = CheckHost(src, n)) != kOk) return rc;
      *tdst = Shadow(*dd, dst);
      *tsrc = src;
      return kOk;
    case flagos::kunlunxin::kXpuMemcpyDeviceToDevice:
      if ((rc = CheckDevice(dst, n, -1, &dd)) != kOk) return rc;
      if ((rc = CheckDevice(src, n, -1, &sd)) != kOk) return rc;
      *tdst = Shadow(*dd, dst);
      *tsrc = Shadow(*sd, src);
      return kOk;
    default:
      return kErrInvalidParam;
  }
}

bool ValidCopyKind(int kind) {
  return kind == flagos::kunlunxin::kXpuMemcpyDeviceToHost || kind == flagos::kunlunxin::kXpuMemcpyHostToDevice ||
         kind == flagos::kunlunxin::kXpuMemcpyDeviceToDevice;
}

// ---- streams -------------------------------------------------------------

void Execute(Stream& s, Op& op) {
  switch (op.kind) {
    case OpKind::kCopy:
      std::memmove(op.dst, op.src, op.size);
      break;
    case OpKind::kRecord: {
      {
        std::lock_guard<std::mutex> lk(g->rec_mu);
        op.record->done.store(true);
      }
      g->rec_cv.notify_all();
      break;
    }
    case OpKind::kKernel:
      op.kernel(op.kernel_arg);
      break;
    case OpKind::kWaitRecord:
      if (op.record) {
        std::unique_lock<std::mutex> lk(g->rec_mu);
        g->rec_cv.wait(lk, [&] { return op.record->done.load() || s.stop_flag.load(); });
      }
      break;
  }
}

void RunWorker(Stream* s) {
  std::unique_lock<std::mutex> lk(s->mu);
  for (;;) {
    if (s->stop) return;
    if (s->queue.empty()) {
      s->cv.wait(lk);
      continue;
    }
    Clock::time_point ready = s->queue.front().ready_at;
    if (s->queue.front().stalled) {  // until StopStream
      s->cv.wait(lk);
      continue;
    }
    if (Clock::now() < ready) {
      s->cv.wait_until(lk, ready);
      continue;
    }
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    lk.unlock();
    Execute(*s, op);
    op.record.reset();
    lk.lock();
    ++s->completed;
    s->cv.notify_all();
  }
}

// Counts one operation queued on device `dev` for FAKE_XPU_STALL_AFTER;
// true when the device is stalled (by this operation or an earlier one).
bool CountForStall(int dev) {
  if (g->cfg.stall_after == 0) return false;
  std::lock_guard<std::mutex> lk(g->stall_mu);
  if (g->cfg.stall_device < 0 || g->cfg.stall_device == dev) {
    if (++g->queued_ops == g->cfg.stall_after) g->stalled[dev] = true;
  }
  return g->stalled[dev];
}

int Enqueue(Stream& s, Op op) {
  op.ready_at = Clock::now() + std::chrono::microseconds(g->cfg.delay_us);
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.closed) return kErrInvalidParam;
    if (s.stop) return kErrAbnormal;
    if (!s.worker.joinable()) {
      try {
        s.worker = std::thread(RunWorker, &s);
      } catch (const std::system_error&) {
        return kErrNoHostMemory;
      }
    }
    op.stalled = CountForStall(s.dev);
    s.queue.push_back(std::move(op));
    ++s.issued;
  }
  s.cv.notify_all();
  return kOk;
}

// Blocks until everything issued to `s` before the call ran.
int WaitStream(Stream& s) {
  std::unique_lock<std::mutex> lk(s.mu);
  uint64_t target = s.issued;
  s.cv.wait(lk, [&] { return s.completed >= target || s.stop; });
  return s.completed >= target ? kOk : kErrAbnormal;
}

void StopStream(Stream& s) {
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.stop = true;
    s.stop_flag.store(true);
  }
  s.cv.notify_all();
  { std::lock_guard<std::mutex> lk(g->rec_mu); }
  g->rec_cv.notify_all();
}

void JoinStream(Stream& s) {
  std::thread t;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    t = std::move(s.worker);
  }
  if (t.joinable()) t.join();
}

// NULL: the current device's default stream.
int ResolveStream(void* handle, std::shared_ptr<Stream>* out) {
  if (handle == nullptr) {
    int dev = 0;
    if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
    *out = g->devices[dev]->default_stream;
    return kOk;
  }
  std::lock_guard<std::mutex> lk(g->mu);
  auto it = g->streams.find(reinterpret_cast<uintptr_t>(handle));
  if (it == g->streams.end()) return kErrInvalidParam;
  *out = it->second;
  return kOk;
}

// Work may only be issued to a stream of the current device.
int ResolveStreamOnCurrent(void* handle, std::shared_ptr<Stream>* out) {
  int dev = 0;
  if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
  if (int rc = ResolveStream(handle, out); rc != kOk) return rc;
  return (*out)->dev == dev ? kOk : kErrInvalidParam;
}

std::shared_ptr<Event> FindEvent(void* handle) {
  std::lock_guard<std::mutex> lk(g->mu);
  auto it = g->events.find(reinterpret_cast<uintptr_t>(handle));
  return it == g->events.end() ? nullptr : it->second;
}

// ---- load and unload -----------------------------------------------------

void OnForkChild() {
  if (g != nullptr) g->forked.store(true);
}

__attribute__((constructor)) void FakeXpuLoad() {
  auto* st = new State;
  ParseConfig(st->cfg);
  st->pid = getpid();
  void* sh = mmap(nullptr, kHandleRegionBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* eh = mmap(nullptr, kHandleRegionBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (sh == MAP_FAILED || eh == MAP_FAILED) ConfigError("handle setup", std::strerror(errno));
  st->stream_handles = static_cast<char*>(sh);
  st->event_handles = static_cast<char*>(eh);
  for (int i = 0; i < st->cfg.devices; ++i) {
    auto d = std::make_unique<Device>();
    d->index = i;
    d->capacity = st->cfg.memory;
    SetupDevice(*d);
    d->default_stream = std::make_shared<Stream>();
    d->default_stream->dev = i;
    st->devices.push_back(std::move(d));
  }
  pthread_atfork(nullptr, nullptr, OnForkChild);
  g = st;
}

__attribute__((destructor)) void FakeXpuUnload() {
  State* st = g;
  if (st == nullptr || st->forked.load() || getpid() != st->pid) return;
  st->shutdown.store(true);
  std::vector<std::shared_ptr<Stream>> all;
  for (auto& d : st->devices) all.push_back(d->default_stream);
  {
    std::lock_guard<std::mutex> lk(st->mu);
    for (auto& [handle, s] : st->streams) all.push_back(s);
  }
  for (auto& s : all) StopStream(*s);  // pending work is dropped
  for (auto& s : all) JoinStream(*s);
  { std::lock_guard<std::mutex> lk(st->rec_mu); }
  st->rec_cv.notify_all();
  // Give the touched device memory back (a dlopen/dlclose loop must not pile
  // it up). The mappings, and `st`, are deliberately kept: a late caller
  // (another library's destructor) still finds valid, if zeroed, state.
  for (auto& d : st->devices) {
    fallocate(d->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(d->map_size));
  }
}

}  // namespace

// ---- the runtime API -----------------------------------------------------

extern "C" int xpu_device_count(int* count) {
  FAKE_XPU_ENTER(xpu_device_count);
  if (count == nullptr) return kErrInvalidParam;
  *count = g->cfg.devices;
  return kOk;
}

extern "C" int xpu_current_device(int* dev) {
  FAKE_XPU_ENTER(xpu_current_device);
  if (dev == nullptr) return kErrInvalidParam;
  *dev = t_device;
  return kOk;
}

extern "C" int xpu_set_device(int dev) {
  FAKE_XPU_ENTER(xpu_set_device);
  if (dev < 0 || dev >= g->cfg.devices) return kErrInvalidDevice;
  t_device = dev;
  return kOk;
}

// Reads the CURRENT device whatever `dev` says (the P800's behaviour).
extern "C" int xpu_device_get_attr(uint64_t* value, int attr, int dev) {
  FAKE_XPU_ENTER(xpu_device_get_attr);
  (void)dev;
  if (value == nullptr || attr < 0 || attr > kLastAttr) return kErrInvalidParam;
  int cur = 0;
  if (int rc = CurrentDevice(&cur); rc != kOk) return rc;
  switch (attr) {
    case 1:  // devid
      *value = static_cast<uint64_t>(cur);
      break;
    case flagos::kunlunxin::kXpuAttrModel:
      *value = kModelKl3P800;
      break;
    case flagos::kunlunxin::kXpuAttrMainMemory:
      *value = g->devices[cur]->capacity;
      break;
    default:
      *value = 0;
      break;
  }
  return kOk;
}

extern "C" int xpu_malloc(void** ptr, uint64_t size, int kind) {
  FAKE_XPU_ENTER(xpu_malloc);
  if (ptr == nullptr || kind != flagos::kunlunxin::kXpuMemoryKindMain) return kErrInvalidParam;
  int dev = 0;
  if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
  return Allocate(*g->devices[dev], size, ptr);
}

extern "C" int xpu_free(void* ptr) {
  FAKE_XPU_ENTER(xpu_free);
  if (ptr == nullptr) return kErrInvalidParam;
  int dev = 0;
  if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
  Device* d = DeviceOf(ptr);
  if (d == nullptr || d->index != dev) return kErrInvalidParam;
  return Release(*d, static_cast<uint64_t>(static_cast<char*>(ptr) - d->base));
}

extern "C" int xpu_memcpy(void* dst, const void* src, uint64_t size, int kind) {
  FAKE_XPU_ENTER(xpu_memcpy);
  if (!ValidCopyKind(kind)) return kErrInvalidParam;
  int dev = 0;
  if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
  if (size == 0) return kOk;
  void* tdst = nullptr;
  const void* tsrc = nullptr;
  if (int rc = PlanCopy(dst, src, size, kind, dev, &tdst, &tsrc); rc != kOk) return rc;
  // Only the default stream is waited for, not the device's other streams.
  if (int rc = WaitStream(*g->devices[dev]->default_stream); rc != kOk) return rc;
  std::memmove(tdst, tsrc, size);
  return kOk;
}

extern "C" int xpu_memcpy_async(void* dst, const void* src, uint64_t size, int kind, void* stream) {
  FAKE_XPU_ENTER(xpu_memcpy_async);
  std::shared_ptr<Stream> s;
  if (int rc = ResolveStreamOnCurrent(stream, &s); rc != kOk) return rc;
  if (!ValidCopyKind(kind)) return kErrInvalidParam;
  if (size == 0) return kOk;
  Op op;
  op.kind = OpKind::kCopy;
  op.size = size;
  if (int rc = PlanCopy(dst, src, size, kind, s->dev, &op.dst, &op.src); rc != kOk) return rc;
  return Enqueue(*s, std::move(op));
}

extern "C" int xpu_memcpy_peer(int dst_dev, void* dst, int src_dev, const void* src, uint64_t size) {
  FAKE_XPU_ENTER(xpu_memcpy_peer);
  if (dst_dev < 0 || dst_dev >= g->cfg.devices || src_dev < 0 || src_dev >= g->cfg.devices) {
    return kErrInvalidDevice;
  }
  if (size == 0) return kOk;
  Device* dd = nullptr;
  Device* sd = nullptr;
  if (int rc = CheckDevice(dst, size, dst_dev, &dd); rc != kOk) return rc;
  if (int rc = CheckDevice(src, size, src_dev, &sd); rc != kOk) return rc;
  // At once: no stream of either device is waited for.
  std::memmove(Shadow(*dd, dst), Shadow(*sd, src), size);
  return kOk;
}

extern "C" int xpu_stream_create(void** stream) {
  FAKE_XPU_ENTER(xpu_stream_create);
  if (stream == nullptr) return kErrInvalidParam;
  int dev = 0;
  if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
  std::lock_guard<std::mutex> lk(g->mu);
  if (g->streams.size() >= static_cast<size_t>(kMaxStreams)) return kErrBusy;
  if (g->next_stream >= kHandleRegionBytes / kHandleStride) return kErrNoHostMemory;
  auto s = std::make_shared<Stream>();
  s->dev = dev;
  s->handle = reinterpret_cast<uintptr_t>(g->stream_handles + g->next_stream++ * kHandleStride);
  g->streams.emplace(s->handle, s);
  *stream = reinterpret_cast<void*>(s->handle);
  return kOk;
}

extern "C" int xpu_stream_destroy(void* stream) {
  FAKE_XPU_ENTER(xpu_stream_destroy);
  if (stream == nullptr) return kErrInvalidParam;
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lk(g->mu);
    auto it = g->streams.find(reinterpret_cast<uintptr_t>(stream));
    if (it == g->streams.end()) return kErrInvalidParam;
    s = std::move(it->second);
    g->streams.erase(it);
  }
  {
    std::unique_lock<std::mutex> lk(s->mu);
    s->closed = true;
    s->cv.wait(lk, [&] { return s->completed >= s->issued || s->stop; });
  }
  StopStream(*s);
  JoinStream(*s);
  return kOk;
}

extern "C" int xpu_stream_wait_event(void* stream, void* event) {
  FAKE_XPU_ENTER(xpu_stream_wait_event);
  std::shared_ptr<Stream> s;
  if (int rc = ResolveStreamOnCurrent(stream, &s); rc != kOk) return rc;
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr || e->dev != s->dev) return kErrInvalidParam;
  Op op;
  op.kind = OpKind::kWaitRecord;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    op.record = e->latest;
  }
  return Enqueue(*s, std::move(op));
}

extern "C" int xpu_wait(void* stream) {
  FAKE_XPU_ENTER(xpu_wait);
  std::shared_ptr<Stream> s;
  if (int rc = ResolveStreamOnCurrent(stream, &s); rc != kOk) return rc;
  return WaitStream(*s);
}

extern "C" int xpu_event_create(void** event) {
  FAKE_XPU_ENTER(xpu_event_create);
  if (event == nullptr) return kErrInvalidParam;
  int dev = 0;
  if (int rc = CurrentDevice(&dev); rc != kOk) return rc;
  std::lock_guard<std::mutex> lk(g->mu);
  if (g->next_event >= kHandleRegionBytes / kHandleStride) return kErrNoHostMemory;
  auto e = std::make_shared<Event>();
  e->dev = dev;
  auto handle = reinterpret_cast<uintptr_t>(g->event_handles + g->next_event++ * kHandleStride);
  g->events.emplace(handle, std::move(e));
  *event = reinterpret_cast<void*>(handle);
  return kOk;
}

extern "C" int xpu_event_destroy(void* event) {
  FAKE_XPU_ENTER(xpu_event_destroy);
  std::lock_guard<std::mutex> lk(g->mu);
  // A pending record keeps its marker: the stream still runs it.
  return g->events.erase(reinterpret_cast<uintptr_t>(event)) == 1 ? kOk : kErrInvalidParam;
}

extern "C" int xpu_event_record(void* event, void* stream) {
  FAKE_XPU_ENTER(xpu_event_record);
  std::shared_ptr<Stream> s;
  if (int rc = ResolveStreamOnCurrent(stream, &s); rc != kOk) return rc;
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr || e->dev != s->dev) return kErrInvalidParam;
  auto rec = std::make_shared<Record>();
  Op op;
  op.kind = OpKind::kRecord;
  op.record = rec;
  std::lock_guard<std::mutex> lk(e->mu);
  if (int rc = Enqueue(*s, std::move(op)); rc != kOk) return rc;
  e->latest = std::move(rec);
  return kOk;
}

extern "C" int xpu_event_wait(void* event) {
  FAKE_XPU_ENTER(xpu_event_wait);
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return kErrInvalidParam;
  std::shared_ptr<Record> rec;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    rec = e->latest;
  }
  if (rec == nullptr) return kOk;
  std::unique_lock<std::mutex> lk(g->rec_mu);
  g->rec_cv.wait(lk, [&] { return rec->done.load() || g->shutdown.load(); });
  return rec->done.load() ? kOk : kErrAbnormal;
}

extern "C" int xpu_event_query(void* event) {
  FAKE_XPU_ENTER(xpu_event_query);
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return kErrInvalidParam;
  std::lock_guard<std::mutex> lk(e->mu);
  return (e->latest == nullptr || e->latest->done.load()) ? kOk : kErrBusy;
}

extern "C" int xpu_get_driver_version(uint32_t* major, uint32_t* minor) {
  FAKE_XPU_ENTER(xpu_get_driver_version);
  if (major == nullptr || minor == nullptr) return kErrInvalidParam;
  *major = 5;
  *minor = 0;
  return kOk;
}

extern "C" int xpu_get_runtime_version(uint32_t* major, uint32_t* minor) {
  FAKE_XPU_ENTER(xpu_get_runtime_version);
  if (major == nullptr || minor == nullptr) return kErrInvalidParam;
  *major = 5;
  *minor = 37;
  return kOk;
}

// mmap'd, filled with garbage, and unmapped by xpu_host_free: a copy still
// queued on a freed buffer faults in the device worker.
extern "C" int xpu_host_alloc(void** ptr, uint64_t size, unsigned flags) {
  FAKE_XPU_ENTER(xpu_host_alloc);
  if (ptr == nullptr || flags != 0) return kErrInvalidParam;
  long page = sysconf(_SC_PAGESIZE);
  uint64_t pg = static_cast<uint64_t>(page > 0 ? page : 4096);
  if (size > (1ull << 46)) return kErrNoHostMemory;
  uint64_t bytes = RoundUp(size == 0 ? 1 : size, pg);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kErrNoHostMemory;
  std::memset(p, kPoison, bytes);
  {
    std::lock_guard<std::mutex> lk(g->host_mu);
    g->host_allocs.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  }
  *ptr = p;
  return kOk;
}

extern "C" int xpu_host_free(void* ptr) {
  FAKE_XPU_ENTER(xpu_host_free);
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lk(g->host_mu);
    auto it = g->host_allocs.find(reinterpret_cast<uintptr_t>(ptr));
    if (ptr == nullptr || it == g->host_allocs.end()) return kErrInvalidParam;
    bytes = it->second;
    g->host_allocs.erase(it);
  }
  munmap(ptr, bytes);
  return kOk;
}

extern "C" int xpu_host_register(void* ptr, uint64_t size, unsigned flags) {
  FAKE_XPU_ENTER(xpu_host_register);
  if (ptr == nullptr || size == 0 || flags != 0 || RangeWraps(ptr, size) || OverlapsDevice(ptr, size)) {
    return kErrInvalidParam;
  }
  uintptr_t b = reinterpret_cast<uintptr_t>(ptr), e = b + size;
  std::lock_guard<std::mutex> lk(g->host_mu);
  auto next = g->host_registered.lower_bound(b);
  if (next != g->host_registered.end() && next->first < e) return kErrHostMemoryRegistered;
  if (next != g->host_registered.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > b) return kErrHostMemoryRegistered;
  }
  g->host_registered.emplace(b, size);
  return kOk;
}

extern "C" int xpu_host_unregister(void* ptr) {
  FAKE_XPU_ENTER(xpu_host_unregister);
  std::lock_guard<std::mutex> lk(g->host_mu);
  return g->host_registered.erase(reinterpret_cast<uintptr_t>(ptr)) == 1 ? kOk : kErrInvalidParam;
}

// ---- test introspection --------------------------------------------------

namespace {
bool Usable() { return g != nullptr && !g->forked.load(); }
}  // namespace

extern "C" uint64_t fake_xpu_memory_used(int dev) {
  if (!Usable() || dev < 0 || dev >= g->cfg.devices) return 0;
  Device& d = *g->devices[dev];
  std::lock_guard<std::mutex> lk(d.mu);
  return d.used;
}

extern "C" uint64_t fake_xpu_memory_total(int dev) {
  if (!Usable() || dev < 0 || dev >= g->cfg.devices) return 0;
  return g->devices[dev]->capacity;
}

extern "C" int fake_xpu_device_count(void) { return Usable() ? g->cfg.devices : 0; }

extern "C" int fake_xpu_live_streams(void) {
  if (!Usable()) return 0;
  std::lock_guard<std::mutex> lk(g->mu);
  return static_cast<int>(g->streams.size());
}

extern "C" int fake_xpu_live_events(void) {
  if (!Usable()) return 0;
  std::lock_guard<std::mutex> lk(g->mu);
  return static_cast<int>(g->events.size());
}

extern "C" uint64_t fake_xpu_calls(const char* sym) {
  if (g == nullptr || sym == nullptr) return 0;
  int i = SymByName(sym);
  return i < 0 ? 0 : g->calls[i].load(std::memory_order_relaxed);
}

extern "C" void* fake_xpu_kernel_address(void* stream, const void* ptr, uint64_t nbytes) {
  if (!Usable()) return nullptr;
  std::shared_ptr<Stream> s;
  if (ResolveStreamOnCurrent(stream, &s) != kOk) return nullptr;
  Device* d = nullptr;
  if (CheckDevice(ptr, nbytes == 0 ? 1 : nbytes, s->dev, &d) != kOk) return nullptr;
  return Shadow(*d, ptr);
}

extern "C" int fake_xpu_launch(void* stream, void (*kernel)(void*), void* arg) {
  if (!Usable()) return kErrAbnormal;
  if (kernel == nullptr) return kErrInvalidParam;
  std::shared_ptr<Stream> s;
  if (int rc = ResolveStreamOnCurrent(stream, &s); rc != kOk) return rc;
  Op op;
  op.kind = OpKind::kKernel;
  op.kernel = kernel;
  op.kernel_arg = arg;
  return Enqueue(*s, std::move(op));
}

// Every function of the table must be defined here: taking their addresses
// makes a missing one an undefined symbol, which the link (-z defs) refuses.
namespace {
__attribute__((used)) void* const kEveryApiFunction[] = {
#define FAKE_XPU_ADDRESS(name, params) reinterpret_cast<void*>(&name),
    FLAGOS_XPURT_SYMBOLS(FAKE_XPU_ADDRESS, FAKE_XPU_ADDRESS)
#undef FAKE_XPU_ADDRESS
};
}  // namespace
