// Helpers of the fake libbkcl's self-test (fake_bkcl_selftest.cc): loading
// the fakes with dlopen, host encodings of BKCL's dtypes (written here, not
// taken from the fake, so the test checks the fake's arithmetic against an
// independent one), one thread per rank, and a communicator with device
// buffers per rank. Plain C++, no test framework.
#ifndef FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_SELFTEST_UTIL_H_
#define FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_SELFTEST_UTIL_H_

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bkcl_symbols.h"
#include "fake_bkcl.h"
#include "xpurt_symbols.h"

inline std::atomic<int> g_failures{0};  // checks run on the rank threads too
#include "../selftest_checks.h"          // CHECK, CHECK_RC, REQUIRE (on g_failures)

namespace selftest {

namespace bkcl = flagos::kunlunxin::bkcl;
constexpr int kH2D = flagos::kunlunxin::kXpuMemcpyHostToDevice;
constexpr int kD2H = flagos::kunlunxin::kXpuMemcpyDeviceToHost;

struct Api {
#define SELFTEST_SLOT(name, params) int(*name) params = nullptr;
  FLAGOS_XPURT_SYMBOLS(SELFTEST_SLOT, SELFTEST_SLOT)
  FLAGOS_BKCL_SYMBOLS(SELFTEST_SLOT, SELFTEST_SLOT)
#undef SELFTEST_SLOT
  decltype(&fake_bkcl_calls) calls = nullptr;
  decltype(&fake_bkcl_live_contexts) live_contexts = nullptr;
  decltype(&fake_bkcl_last_error) last_error = nullptr;
};
inline Api api;

// dlopen()s the fake libxpurt (global: libbkcl needs it) and libbkcl, and
// resolves every function; false (with a message) when one is missing.
inline bool Load(const char* xpurt_path, const char* bkcl_path) {
  void* x = dlopen(xpurt_path, RTLD_NOW | RTLD_GLOBAL);
  void* b = x == nullptr ? nullptr : dlopen(bkcl_path, RTLD_NOW | RTLD_LOCAL);
  if (b == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return false;
  }
  bool ok = true;
  auto resolve = [&](void* h, const char* name, auto* slot) {
    *slot = reinterpret_cast<std::remove_reference_t<decltype(*slot)>>(dlsym(h, name));
    if (*slot == nullptr) {
      std::fprintf(stderr, "missing %s\n", name);
      ok = false;
    }
  };
#define SELFTEST_XPU(name, params) resolve(x, #name, &api.name);
#define SELFTEST_BKCL(name, params) resolve(b, #name, &api.name);
  FLAGOS_XPURT_SYMBOLS(SELFTEST_XPU, SELFTEST_XPU)
  FLAGOS_BKCL_SYMBOLS(SELFTEST_BKCL, SELFTEST_BKCL)
#undef SELFTEST_XPU
#undef SELFTEST_BKCL
  resolve(b, "fake_bkcl_calls", &api.calls);
  resolve(b, "fake_bkcl_live_contexts", &api.live_contexts);
  resolve(b, "fake_bkcl_last_error", &api.last_error);
  return ok;
}

// The self-tests' environment (4 devices; a bug hangs a minute, not ten;
// nothing injected), set before the fakes load, then Load. Exits when a
// function is missing.
inline void LoadForSelftest(const char* xpurt_path, const char* bkcl_path) {
  setenv("FAKE_XPU_DEVICES", "4", 1);
  setenv("BKCL_TIMEOUT", "60", 1);
  unsetenv("FAKE_BKCL_FAIL");
  unsetenv("FAKE_BKCL_INIT_TIMEOUT_MS");
  REQUIRE(Load(xpurt_path, bkcl_path));
}

inline bool LastErrorHas(const char* text) { return std::strstr(api.last_error(), text) != nullptr; }

// ---- dtypes on the host -----------------------------------------------------

inline size_t Size(int dtype) {
  switch (dtype) {
    case bkcl::kUint8: return 1;
    case bkcl::kFloat16:
    case bkcl::kBfloat16: return 2;
    case bkcl::kInt32:
    case bkcl::kFloat: return 4;
    default: return 8;
  }
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The 16-bit floats, for values they hold exactly (normal ones, or 0): no
// rounding needed.
inline uint16_t ExactHalf(float f) {
  const uint32_t x = Bits(f);
  if ((x & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(x >> 16);
  const uint32_t exp = ((x >> 23) & 0xFFu) - 127 + 15;
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | (exp << 10) | ((x & 0x7FFFFFu) >> 13));
}

inline double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  const double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) != 0 ? -v : v;
}

inline std::vector<char> Encode(int dtype, const std::vector<double>& v) {
  std::vector<char> out(v.size() * Size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    char* p = out.data() + i * Size(dtype);
    auto put = [&](auto x) { std::memcpy(p, &x, sizeof(x)); };
    switch (dtype) {
      case bkcl::kUint8: put(static_cast<uint8_t>(v[i])); break;
      case bkcl::kInt32: put(static_cast<int32_t>(v[i])); break;
      case bkcl::kInt64: put(static_cast<int64_t>(v[i])); break;
      case bkcl::kFloat16: put(ExactHalf(static_cast<float>(v[i]))); break;
      case bkcl::kBfloat16: put(static_cast<uint16_t>(Bits(static_cast<float>(v[i])) >> 16)); break;
      case bkcl::kFloat: put(static_cast<float>(v[i])); break;
      default: put(v[i]); break;
    }
  }
  return out;
}

inline std::vector<double> Decode(int dtype, const std::vector<char>& b) {
  std::vector<double> out(b.size() / Size(dtype));
  for (size_t i = 0; i < out.size(); ++i) {
    const char* p = b.data() + i * Size(dtype);
    auto get = [&](auto x) {
      std::memcpy(&x, p, sizeof(x));
      return x;
    };
    switch (dtype) {
      case bkcl::kUint8: out[i] = get(uint8_t{}); break;
      case bkcl::kInt32: out[i] = get(int32_t{}); break;
      case bkcl::kInt64: out[i] = static_cast<double>(get(int64_t{})); break;
      case bkcl::kFloat16: out[i] = HalfValue(get(uint16_t{})); break;
      case bkcl::kBfloat16: {
        const uint32_t u = static_cast<uint32_t>(get(uint16_t{})) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        out[i] = f;
        break;
      }
      case bkcl::kFloat: out[i] = get(float{}); break;
      default: out[i] = get(double{}); break;
    }
  }
  return out;
}

inline double Fold(int op, double a, double b) {
  switch (op) {
    case bkcl::kAdd: return a + b;
    case bkcl::kProduct: return a * b;
    case bkcl::kMax: return std::max(a, b);
    default: return std::min(a, b);
  }
}

// Rank r's i-th input: small integers every dtype holds exactly, and whose
// sums and products over 3 ranks stay exact (|x| <= 125); negative ones
// except for uint8.
inline double In(int dtype, int r, size_t i) {
  const double v = 1 + static_cast<double>((static_cast<size_t>(r) * 7 + i * 3) % 5);
  return dtype != bkcl::kUint8 && i % 3 == 1 ? -v : v;
}

inline std::vector<double> Inputs(int dtype, int r, size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = In(dtype, r, i);
  return v;
}

// Every rank's i-th input (at element `at`), folded with op in rank order.
inline double Folded(int n, int dtype, int op, size_t at) {
  double acc = In(dtype, 0, at);
  for (int k = 1; k < n; ++k) acc = Fold(op, acc, In(dtype, k, at));
  return acc;
}

// Counts a failure (and prints the first differing element) unless rank r's
// `got` is `want`.
inline void Compare(const std::string& what, int r, const std::vector<double>& got,
                    const std::vector<double>& want) {
  if (got == want) return;
  ++g_failures;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) {
      std::fprintf(stderr, "%s, rank %d: element %zu is %g, want %g\n", what.c_str(), r, i, got[i], want[i]);
      return;
    }
  }
  std::fprintf(stderr, "%s, rank %d: %zu elements, want %zu\n", what.c_str(), r, got.size(), want.size());
}

// ---- ranks and devices --------------------------------------------------------

// Runs f(r) on n threads, thread r with device r current.
template <typename F>
void OnRanks(int n, F f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&f, r] {
      CHECK_RC(api.xpu_set_device(r), 0);
      f(r);
    });
  }
  for (std::thread& t : threads) t.join();
}

inline void Put(void* dev, const std::vector<char>& host) {
  CHECK_RC(api.xpu_memcpy(dev, host.data(), host.size(), kH2D), 0);
}

inline std::vector<char> Get(const void* dev, size_t bytes) {
  std::vector<char> host(bytes);
  CHECK_RC(api.xpu_memcpy(host.data(), dev, bytes, kD2H), 0);
  return host;
}

inline void* At(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

// One rank: its context (on device `rank`), a created stream and two
// device buffers of World::kBytes.
struct RankState {
  bkcl::Context ctx = nullptr;
  void* stream = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
};

// A communicator of n ranks, rank r on device r; formed by n threads (each
// bkcl_init_rank blocks until all joined), destroyed the same way.
struct World {
  static constexpr uint64_t kBytes = 4096;
  int n;
  std::vector<RankState> ranks;

  explicit World(int nranks) : n(nranks), ranks(nranks) {
    bkcl::UniqueId id;
    REQUIRE(api.bkcl_get_unique_id(&id) == bkcl::kSuccess);
    OnRanks(n, [&](int r) {
      RankState& s = ranks[r];
      CHECK_RC(api.xpu_stream_create(&s.stream), 0);
      CHECK_RC(api.xpu_malloc(&s.send, kBytes, 0), 0);
      CHECK_RC(api.xpu_malloc(&s.recv, kBytes, 0), 0);
      CHECK_RC(api.bkcl_init_rank(&s.ctx, r, n, &id), bkcl::kSuccess);
    });
    for (const RankState& s : ranks) REQUIRE(s.ctx != nullptr);
  }

  ~World() {
    OnRanks(n, [&](int r) {
      RankState& s = ranks[r];
      CHECK_RC(api.xpu_wait(s.stream), 0);
      CHECK_RC(api.bkcl_destroy_context(s.ctx), bkcl::kSuccess);
      CHECK_RC(api.xpu_free(s.send), 0);
      CHECK_RC(api.xpu_free(s.recv), 0);
      CHECK_RC(api.xpu_stream_destroy(s.stream), 0);
    });
  }
};

}  // namespace selftest

#endif  // FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_SELFTEST_UTIL_H_
