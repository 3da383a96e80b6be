// A test-only, deliberately hostile fake of the Kunlun vendor op library
// libxdnn_pytorch.so. See README.md next to this file. It is never shipped
// and never loaded outside tests.
//
// Design:
// - Every call is checked at issue time, on the calling thread: the
//   context, each tensor's shape (sizes and strides of one length, no
//   negative size or stride), the dtypes, the shapes' agreement (aten's
//   rules), and then every tensor's byte range, which must lie in one live
//   allocation of the stream's device (fake_xpu_kernel_address, the fake
//   libxpurt's hook). A call that fails a check does nothing.
// - The arithmetic runs later, as ONE kernel queued on the context's stream
//   (fake_xpu_launch): it runs on the stream's worker thread, at least
//   FAKE_XPU_DELAY_US after the call, in order with the stream's copies. A
//   kernel reads every input into host memory before it writes its output,
//   so an output may alias an input (in-place forms).
// - Device addresses are PROT_NONE: the fake only ever touches the
//   read/write ("shadow") addresses the hook hands out at issue time.

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fake_env.h"
#include "fake_xpurt.h"

// The library is built with hidden visibility; the header's declarations
// are the API, so they (and only they, with fake_xdnn_* below) are visible.
// libxdnn_pytorch.map keeps everything else local.
#pragma GCC visibility push(default)
#include "xdnn_pytorch/xdnn_pytorch.h"
#pragma GCC visibility pop

#define FAKE_XDNN_API extern "C" __attribute__((visibility("default")))

FAKE_XDNN_API uint64_t fake_xdnn_calls(const char* op);
FAKE_XDNN_API const char* fake_xdnn_version(void);

namespace {

using xdnn_pytorch::OptionalTensor;
using xdnn_pytorch::Scalar;
using xdnn_pytorch::ScalarType;
using xdnn_pytorch::Tensor;

// ---- the library's functions ---------------------------------------------

// Every function the header declares (Scalar::create aside). The ones after
// destroy_context return an xdnn::Error and can be named in FAKE_XDNN_*.
#define FAKE_XDNN_FUNCTIONS(X)                                                                \
  X(create_context) X(destroy_context) X(add_tensor) X(add_scalar) X(sub_tensor)              \
  X(mul_tensor) X(mul_scalar) X(div_tensor) X(div_scalar) X(neg) X(relu) X(sqrt) X(exp)       \
  X(threshold_backward) X(addcmul) X(addcdiv) X(lerp_scalar) X(fill__scalar) X(copy) X(mm)    \
  X(bmm) X(addmm) X(sum_dim_IntList) X(mean_dim) X(log_softmax) X(log_softmax_backward_data)  \
  X(nll_loss) X(nll_loss_backward)

enum Fn {
#define FAKE_XDNN_ENUM(name) kFn_##name,
  FAKE_XDNN_FUNCTIONS(FAKE_XDNN_ENUM)
#undef FAKE_XDNN_ENUM
  kFnCount
};

constexpr const char* kFnNames[kFnCount] = {
#define FAKE_XDNN_NAME(name) #name,
    FAKE_XDNN_FUNCTIONS(FAKE_XDNN_NAME)
#undef FAKE_XDNN_NAME
};

int FnByName(std::string_view name) {
  for (int i = 0; i < kFnCount; ++i) {
    if (name == kFnNames[i]) return i;
  }
  return -1;
}

bool ReturnsCode(int fn) { return fn != kFn_create_context && fn != kFn_destroy_context; }

// ScalarType names, in the enum's order.
constexpr int kDtypeCount = 10;
constexpr const char* kDtypeNames[kDtypeCount] = {"bool",  "uint8",   "int8",     "int16",
                                                  "int32", "int64",   "float32",  "float16",
                                                  "bfloat16", "float64"};

bool KnownDtype(ScalarType t) {
  return static_cast<unsigned>(t) < static_cast<unsigned>(kDtypeCount);
}

int64_t ItemSize(ScalarType t) {
  switch (t) {
    case ScalarType::kbool:
    case ScalarType::kuint8:
    case ScalarType::kint8:
      return 1;
    case ScalarType::kint16:
    case ScalarType::kfloat16:
    case ScalarType::kbfloat16:
      return 2;
    case ScalarType::kint32:
    case ScalarType::kfloat32:
      return 4;
    case ScalarType::kint64:
    case ScalarType::kfloat64:
      return 8;
  }
  return 0;
}

// ---- configuration (read once, when the library loads) -------------------

struct Config {
  uint32_t not_implement[kFnCount] = {};  // FAKE_XDNN_NOT_IMPLEMENT: a bit per dtype
  bool lie[kFnCount] = {};                // FAKE_XDNN_LIE
  int fail[kFnCount] = {};                // FAKE_XDNN_FAIL: the code, 0 for none
};

Config g_cfg;
std::atomic<uint64_t> g_calls[kFnCount] = {};

[[noreturn]] void ConfigError(const char* var, const std::string& what) {
  fake_env::ConfigError("fake libxdnn_pytorch", var, what);
}

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t pos = s.find(sep, start);
    out.push_back(fake_env::Trim(
        s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start)));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

int OpOf(const char* var, const std::string& name) {
  const int fn = FnByName(name);
  if (fn < 0) ConfigError(var, "unknown function '" + name + "'");
  if (!ReturnsCode(fn)) ConfigError(var, "'" + name + "' returns no error code");
  return fn;
}

void ParseConfig(Config& cfg) {
  if (const char* v = std::getenv("FAKE_XDNN_NOT_IMPLEMENT")) {
    for (const std::string& item : Split(v, ',')) {
      if (item.empty()) continue;
      const std::vector<std::string> f = Split(item, ':');
      if (f.size() != 2) ConfigError("FAKE_XDNN_NOT_IMPLEMENT", "'" + item + "' is not op:dtype");
      const int fn = OpOf("FAKE_XDNN_NOT_IMPLEMENT", f[0]);
      uint32_t bits = 0;
      if (f[1] == "*") {
        bits = (1u << kDtypeCount) - 1;
      } else {
        for (int d = 0; d < kDtypeCount; ++d) {
          if (f[1] == kDtypeNames[d]) bits = 1u << d;
        }
        if (bits == 0) ConfigError("FAKE_XDNN_NOT_IMPLEMENT", "unknown dtype '" + f[1] + "'");
      }
      cfg.not_implement[fn] |= bits;
    }
  }
  if (const char* v = std::getenv("FAKE_XDNN_LIE")) {
    for (const std::string& item : Split(v, ',')) {
      if (item.empty()) continue;
      cfg.lie[OpOf("FAKE_XDNN_LIE", item)] = true;
    }
  }
  if (const char* v = std::getenv("FAKE_XDNN_FAIL")) {
    for (const std::string& item : Split(v, ',')) {
      if (item.empty()) continue;
      const std::vector<std::string> f = Split(item, ':');
      if (f.size() != 2) ConfigError("FAKE_XDNN_FAIL", "'" + item + "' is not op:code");
      const int fn = OpOf("FAKE_XDNN_FAIL", f[0]);
      if (f[1] == "INVALID_PARAM") {
        cfg.fail[fn] = xdnn::INVALID_PARAM;
      } else if (f[1] == "RUNTIME_ERROR") {
        cfg.fail[fn] = xdnn::RUNTIME_ERROR;
      } else if (f[1] == "NO_ENOUGH_WORKSPACE") {
        cfg.fail[fn] = xdnn::NO_ENOUGH_WORKSPACE;
      } else {
        ConfigError("FAKE_XDNN_FAIL", "unknown code '" + f[1] +
                                          "' (INVALID_PARAM, RUNTIME_ERROR or NO_ENOUGH_WORKSPACE)");
      }
    }
  }
}

__attribute__((constructor)) void FakeXdnnLoad() { ParseConfig(g_cfg); }

// Every call starts here: counts it, then applies FAKE_XDNN_FAIL and
// FAKE_XDNN_NOT_IMPLEMENT (the latter by the dtype of the call's first
// tensor argument). -1: go on; otherwise the code to return.
int Enter(Fn fn, const Tensor& first) {
  g_calls[fn].fetch_add(1, std::memory_order_relaxed);
  if (g_cfg.fail[fn] != 0) return g_cfg.fail[fn];
  if (KnownDtype(first.dtype) &&
      (g_cfg.not_implement[fn] & (1u << static_cast<unsigned>(first.dtype))) != 0) {
    return xdnn::NOT_IMPLEMENT;
  }
  return -1;
}

// ---- shapes --------------------------------------------------------------

constexpr int64_t kMaxExtent = int64_t{1} << 48;  // elements; far beyond any fake device

// Sizes and strides of one length, none negative, and a range that fits.
bool WellFormed(const Tensor& t) {
  if (t.sizes.size() != t.strides.size()) return false;
  __int128 numel = 1, last = 0;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0 || t.strides[d] < 0) return false;
    numel *= t.sizes[d];
    if (t.sizes[d] > 0) last += static_cast<__int128>(t.sizes[d] - 1) * t.strides[d];
    if (numel > kMaxExtent || last > kMaxExtent) return false;
  }
  return true;
}

// A 0-dim tensor travels as sizes {1}, strides {1}; one sent with empty
// sizes is taken the same way.
Tensor Norm(const Tensor& t) {
  if (!t.sizes.empty()) return t;
  Tensor n = t;
  n.sizes = {1};
  n.strides = {1};
  return n;
}

int64_t Numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool IsScalarShape(const Tensor& t) { return t.sizes == std::vector<int64_t>{1}; }

// aten's broadcasting: `from` expands to `to` (trailing dims aligned; a
// dim of 1, or a missing leading dim, expands). Extra leading dims of size
// 1 are tolerated (a 0-dim tensor sent as {1}).
bool BroadcastsTo(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  const int64_t rf = static_cast<int64_t>(from.size()), rt = static_cast<int64_t>(to.size());
  for (int64_t i = 0; i < rf; ++i) {
    const int64_t d = rt - rf + i;
    if (d < 0) {
      if (from[i] != 1) return false;
      continue;
    }
    if (from[i] != to[d] && from[i] != 1) return false;
  }
  return true;
}

// An output in which two elements share memory (stride 0 on a dim of more
// than one element): aten refuses to write such a tensor.
bool SelfOverlapping(const Tensor& t) {
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] > 1 && t.strides[d] == 0) return true;
  }
  return false;
}

// A dim index wrapped into [0, rank); -1 when out of range.
int64_t WrapDim(int64_t dim, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (dim < -r || dim >= r) return -1;
  return dim < 0 ? dim + r : dim;
}

bool IsFloat(ScalarType t) { return t == ScalarType::kfloat32 || t == ScalarType::kfloat64; }

bool IsCopyable(ScalarType t) {
  return t == ScalarType::kbool || t == ScalarType::kint32 || t == ScalarType::kint64 ||
         t == ScalarType::kfloat32 || t == ScalarType::kfloat64;
}

// Floating ops compute float32 (and float64); every floating tensor of a
// call must have the first one's dtype: the fake does no type promotion.
bool SameFloatDtype(std::initializer_list<const Tensor*> ts) {
  const ScalarType first = (*ts.begin())->dtype;
  if (!IsFloat(first)) return false;
  for (const Tensor* t : ts) {
    if (t->dtype != first) return false;
  }
  return true;
}

// ---- device ranges and kernels -------------------------------------------

// A tensor translated at issue time: `base` is the shadow address of its
// first element (nullptr when it has no elements).
struct Bound {
  char* base = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  ScalarType dtype = ScalarType::kfloat32;
  int64_t numel = 0;
};

// Translates t's byte range for a kernel on `stream`; false when the range
// is not inside one live allocation of the stream's device.
bool Bind(void* stream, const Tensor& t, Bound* b) {
  b->sizes = t.sizes;
  b->strides = t.strides;
  b->dtype = t.dtype;
  b->numel = Numel(t.sizes);
  b->base = nullptr;
  if (b->numel == 0) return true;
  int64_t last = 0;
  for (size_t d = 0; d < t.sizes.size(); ++d) last += (t.sizes[d] - 1) * t.strides[d];
  const uint64_t nbytes = static_cast<uint64_t>(last + 1) * static_cast<uint64_t>(ItemSize(t.dtype));
  b->base = static_cast<char*>(fake_xpu_kernel_address(stream, t.data, nbytes));
  return b->base != nullptr;
}

using Kernel = std::function<void()>;

void RunKernel(void* arg) {
  std::unique_ptr<Kernel> k(static_cast<Kernel*>(arg));
  (*k)();
}

// Queues `k` on the stream: one launch per call.
int Launch(void* stream, Kernel k) {
  auto* heap = new Kernel(std::move(k));
  if (fake_xpu_launch(stream, &RunKernel, heap) != 0) {
    delete heap;
    return xdnn::RUNTIME_ERROR;
  }
  return xdnn::SUCCESS;
}

// ---- element access (inside kernels) -------------------------------------

template <typename T>
T Load(const char* p) {
  if constexpr (std::is_same_v<T, bool>) {
    unsigned char b;
    std::memcpy(&b, p, 1);
    return b != 0;
  } else {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
}

template <typename T>
void Store(char* p, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    const unsigned char b = v ? 1 : 0;
    std::memcpy(p, &b, 1);
  } else {
    std::memcpy(p, &v, sizeof(T));
  }
}

// aten's static_cast conversions; float to integer truncates, and a NaN or
// out-of-range value gives the type's lowest value (as x86 does) instead of
// undefined behaviour.
template <typename To, typename From>
To Convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<To> || !std::is_floating_point_v<From>) {
    return static_cast<To>(v);
  } else {
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
    if (!(v >= lo && v < -lo)) return std::numeric_limits<To>::min();
    return static_cast<To>(v);
  }
}

template <typename T>
T ScalarAs(const Scalar& s) {
  return s.is_integral() ? Convert<T>(s.to_int64()) : Convert<T>(s.to_float());
}

// FAKE_XDNN_LIE: a value clearly not the right one.
template <typename T>
T Lie(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return !v;
  } else if constexpr (std::is_floating_point_v<T>) {
    return v + T(1) + T(0.5) * std::abs(v);
  } else {
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v) + 1u);
  }
}

// The one strided iteration: visits every index of `shape` in row-major
// order and calls fn(off), off[k] = sum over d of index[d] * strides[k][d].
template <size_t K, typename F>
void ForEachIndex(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, K>& strides,
                  F&& fn) {
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  const size_t rank = shape.size();
  std::vector<int64_t> idx(rank, 0);
  std::array<int64_t, K> off{};
  for (;;) {
    fn(static_cast<const std::array<int64_t, K>&>(off));
    size_t d = rank;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < shape[d]) {
        for (size_t k = 0; k < K; ++k) off[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < K; ++k) off[k] -= strides[k][d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// t's strides as seen broadcast to `shape`: 0 for an expanded dim.
std::vector<int64_t> BroadcastStrides(const Bound& t, const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 0);
  const int64_t rt = static_cast<int64_t>(t.sizes.size()), rs = static_cast<int64_t>(shape.size());
  for (int64_t i = 0; i < rt; ++i) {
    const int64_t d = rs - rt + i;
    if (d >= 0 && t.sizes[i] != 1) st[d] = t.strides[i];
  }
  return st;
}

// t's elements broadcast to `shape`, row-major (T: t's element type).
template <typename T>
std::vector<T> Gather(const Bound& t, const std::vector<int64_t>& shape) {
  std::vector<T> v;
  v.reserve(static_cast<size_t>(Numel(shape)));
  const int64_t is = ItemSize(t.dtype);
  ForEachIndex<1>(shape, {BroadcastStrides(t, shape)},
                  [&](const std::array<int64_t, 1>& off) { v.push_back(Load<T>(t.base + off[0] * is)); });
  return v;
}

// Writes value(j) to out's j-th element (row-major), lied about on demand.
template <typename T, typename Value>
void ScatterWith(const Bound& out, bool lie, Value value) {
  const int64_t is = ItemSize(out.dtype);
  int64_t j = 0;
  ForEachIndex<1>(out.sizes, {out.strides}, [&](const std::array<int64_t, 1>& off) {
    const T v = value(j++);
    Store<T>(out.base + off[0] * is, lie ? Lie(v) : v);
  });
}

template <typename T, typename V>
void Scatter(const Bound& out, const V& values, bool lie) {
  ScatterWith<T>(out, lie, [&](int64_t j) { return static_cast<T>(values[static_cast<size_t>(j)]); });
}

// ---- elementwise ---------------------------------------------------------

template <typename T, size_t N, typename F>
Kernel ElementwiseKernel(std::array<Bound, N> in, Bound out, bool lie, F f) {
  return [in = std::move(in), out = std::move(out), lie, f]() {
    std::array<std::vector<T>, N> vals;
    for (size_t i = 0; i < N; ++i) vals[i] = Gather<T>(in[i], out.sizes);
    std::vector<T> res(static_cast<size_t>(out.numel));
    for (size_t j = 0; j < res.size(); ++j) {
      std::array<T, N> a;
      for (size_t i = 0; i < N; ++i) a[i] = vals[i][j];
      res[j] = std::apply(f, a);
    }
    Scatter<T>(out, res, lie);
  };
}

// A floating elementwise op: `make(T{})` gives the per-element function of
// N values of type T.
template <size_t N, typename Make>
int Elementwise(Fn fn, xdnn::Context* ctx, std::array<const Tensor*, N> raw, const Tensor& out_raw,
                Make make) {
  if (int rc = Enter(fn, *raw[0]); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  for (const Tensor* t : raw) {
    if (!WellFormed(*t)) return xdnn::INVALID_PARAM;
  }
  if (!WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  std::array<Tensor, N> in;
  for (size_t i = 0; i < N; ++i) in[i] = Norm(*raw[i]);
  const Tensor out = Norm(out_raw);
  for (size_t i = 0; i < N; ++i) {
    if (!SameFloatDtype({&in[0], &in[i], &out})) return xdnn::NOT_IMPLEMENT;
  }
  for (size_t i = 0; i < N; ++i) {
    if (!BroadcastsTo(in[i].sizes, out.sizes)) return xdnn::INVALID_PARAM;
  }
  if (SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  void* stream = ctx->xpu_stream;
  std::array<Bound, N> b;
  Bound bo;
  for (size_t i = 0; i < N; ++i) {
    if (!Bind(stream, in[i], &b[i])) return xdnn::INVALID_PARAM;
  }
  if (!Bind(stream, out, &bo)) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[fn];
  Kernel k = out.dtype == ScalarType::kfloat64
                 ? ElementwiseKernel<double, N>(std::move(b), std::move(bo), lie, make(double{}))
                 : ElementwiseKernel<float, N>(std::move(b), std::move(bo), lie, make(float{}));
  return Launch(stream, std::move(k));
}

template <typename T>
T Relu(T x) {
  return std::isnan(x) ? x : (x < T(0) ? T(0) : x);
}

// aten's lerp (ATen/native/Lerp.h).
template <typename T>
T Lerp(T self, T end, T weight) {
  return std::abs(weight) < T(0.5) ? self + weight * (end - self)
                                   : end - (end - self) * (T(1) - weight);
}

// ---- fill and copy -------------------------------------------------------

template <typename F>
void VisitCopyable(ScalarType t, F&& f) {
  switch (t) {
    case ScalarType::kbool: f(bool{}); break;
    case ScalarType::kint32: f(int32_t{}); break;
    case ScalarType::kint64: f(int64_t{}); break;
    case ScalarType::kfloat32: f(float{}); break;
    case ScalarType::kfloat64: f(double{}); break;
    default: break;
  }
}

int Fill(xdnn::Context* ctx, const Tensor& self_raw, const Scalar& value, const Tensor& out_raw) {
  if (int rc = Enter(kFn_fill__scalar, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor self = Norm(self_raw), out = Norm(out_raw);
  if (!IsCopyable(self.dtype) || !IsCopyable(out.dtype)) return xdnn::NOT_IMPLEMENT;
  // In place: out is self.
  if (out.data != self.data || out.sizes != self.sizes || out.strides != self.strides ||
      out.dtype != self.dtype) {
    return xdnn::INVALID_PARAM;
  }
  if (SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bo;
  if (!Bind(ctx->xpu_stream, out, &bo)) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[kFn_fill__scalar];
  Kernel k;
  VisitCopyable(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = ScalarAs<T>(value);
    k = [bo = std::move(bo), v, lie]() { ScatterWith<T>(bo, lie, [v](int64_t) { return v; }); };
  });
  return Launch(ctx->xpu_stream, std::move(k));
}

int Copy(xdnn::Context* ctx, const Tensor& src_raw, const Tensor& out_raw) {
  if (int rc = Enter(kFn_copy, src_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(src_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor src = Norm(src_raw), out = Norm(out_raw);
  if (!IsCopyable(src.dtype) || !IsCopyable(out.dtype)) return xdnn::NOT_IMPLEMENT;
  if (!BroadcastsTo(src.sizes, out.sizes) || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bs, bo;
  if (!Bind(ctx->xpu_stream, src, &bs) || !Bind(ctx->xpu_stream, out, &bo)) {
    return xdnn::INVALID_PARAM;
  }
  const bool lie = g_cfg.lie[kFn_copy];
  Kernel k;
  VisitCopyable(src.dtype, [&](auto stag) {
    VisitCopyable(out.dtype, [&](auto otag) {
      using S = decltype(stag);
      using O = decltype(otag);
      k = [bs, bo, lie]() {
        const std::vector<S> v = Gather<S>(bs, bo.sizes);
        ScatterWith<O>(bo, lie, [&](int64_t j) { return Convert<O>(static_cast<S>(v[static_cast<size_t>(j)])); });
      };
    });
  });
  return Launch(ctx->xpu_stream, std::move(k));
}

// ---- matrix products -----------------------------------------------------

// out[b] = beta * c + alpha * (a[b] @ m[b]) for `batch` products of
// [n,k] x [k,m]; c (broadcast to [n,m], shared by every batch) is not read
// when beta == 0, nor the product when alpha == 0 or k == 0 (BLAS's rules,
// which aten's addmm follows).
template <typename T>
Kernel GemmKernel(int64_t batch, int64_t n, int64_t kk, int64_t m, Bound a, Bound b,
                  std::optional<Bound> c, T alpha, T beta, Bound out, bool lie) {
  return [=]() {
    const bool use_c = c.has_value() && beta != T(0);
    const bool use_ab = alpha != T(0) && kk > 0;
    std::vector<T> va, vb, vc;
    if (use_ab) {
      va = Gather<T>(a, a.sizes);
      vb = Gather<T>(b, b.sizes);
    }
    if (use_c) vc = Gather<T>(*c, {n, m});
    std::vector<T> res(static_cast<size_t>(batch * n * m));
    for (int64_t p = 0; p < batch; ++p) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          double v = 0;
          if (use_ab) {
            double acc = 0;
            for (int64_t q = 0; q < kk; ++q) {
              acc += static_cast<double>(va[static_cast<size_t>((p * n + i) * kk + q)]) *
                     static_cast<double>(vb[static_cast<size_t>((p * kk + q) * m + j)]);
            }
            v = static_cast<double>(alpha) * acc;
          }
          if (use_c) v += static_cast<double>(beta) * static_cast<double>(vc[static_cast<size_t>(i * m + j)]);
          res[static_cast<size_t>((p * n + i) * m + j)] = static_cast<T>(v);
        }
      }
    }
    Scatter<T>(out, res, lie);
  };
}

int Gemm(Fn fn, xdnn::Context* ctx, const Tensor* self_raw, const Tensor& a_raw, const Tensor& b_raw,
         const Scalar* beta, const Scalar* alpha, const Tensor& out_raw) {
  if (int rc = Enter(fn, self_raw != nullptr ? *self_raw : a_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if ((self_raw != nullptr && !WellFormed(*self_raw)) || !WellFormed(a_raw) || !WellFormed(b_raw) ||
      !WellFormed(out_raw)) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor a = Norm(a_raw), b = Norm(b_raw), out = Norm(out_raw);
  std::optional<Tensor> self;
  if (self_raw != nullptr) self = Norm(*self_raw);
  if (!SameFloatDtype({&a, &b, &out}) || (self && self->dtype != out.dtype)) return xdnn::NOT_IMPLEMENT;
  const size_t rank = fn == kFn_bmm ? 3 : 2;
  if (a.sizes.size() != rank || b.sizes.size() != rank || out.sizes.size() != rank) {
    return xdnn::INVALID_PARAM;
  }
  const size_t o = rank - 2;  // the batch dims before [n,k]
  const int64_t batch = rank == 3 ? a.sizes[0] : 1;
  const int64_t n = a.sizes[o], kk = a.sizes[o + 1], m = b.sizes[o + 1];
  if (b.sizes[o] != kk) return xdnn::INVALID_PARAM;
  if (rank == 3 && (b.sizes[0] != batch || out.sizes[0] != batch)) return xdnn::INVALID_PARAM;
  if (out.sizes[o] != n || out.sizes[o + 1] != m) return xdnn::INVALID_PARAM;
  if (self && (self->sizes.size() > 2 || !BroadcastsTo(self->sizes, {n, m}))) return xdnn::INVALID_PARAM;
  if (SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  void* stream = ctx->xpu_stream;
  Bound ba, bb, bo;
  std::optional<Bound> bc;
  if (!Bind(stream, a, &ba) || !Bind(stream, b, &bb) || !Bind(stream, out, &bo)) {
    return xdnn::INVALID_PARAM;
  }
  if (self) {
    bc.emplace();
    if (!Bind(stream, *self, &*bc)) return xdnn::INVALID_PARAM;
  }
  const bool lie = g_cfg.lie[fn];
  const Scalar one = Scalar::create(int64_t{1});
  const Scalar& al = alpha != nullptr ? *alpha : one;
  const Scalar& be = beta != nullptr ? *beta : one;
  Kernel k = out.dtype == ScalarType::kfloat64
                 ? GemmKernel<double>(batch, n, kk, m, ba, bb, bc, ScalarAs<double>(al),
                                      ScalarAs<double>(be), bo, lie)
                 : GemmKernel<float>(batch, n, kk, m, ba, bb, bc, ScalarAs<float>(al),
                                     ScalarAs<float>(be), bo, lie);
  return Launch(stream, std::move(k));
}

// ---- reductions ----------------------------------------------------------

template <typename T>
Kernel ReduceKernel(Bound self, std::vector<int64_t> keep_shape, std::vector<bool> reduced, bool mean,
                    Bound out, bool lie) {
  return [=]() {
    // Each self element's slot in the (keepdim-shaped) result, row-major.
    std::vector<int64_t> slot(keep_shape.size(), 0);
    int64_t s = 1;
    for (size_t d = keep_shape.size(); d-- > 0;) {
      slot[d] = reduced[d] ? 0 : s;
      s *= keep_shape[d];
    }
    std::vector<double> acc(static_cast<size_t>(Numel(keep_shape)), 0.0);
    int64_t count = 1;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (reduced[d]) count *= self.sizes[d];
    }
    const int64_t is = ItemSize(self.dtype);
    ForEachIndex<2>(self.sizes, {self.strides, slot}, [&](const std::array<int64_t, 2>& off) {
      acc[static_cast<size_t>(off[1])] += static_cast<double>(Load<T>(self.base + off[0] * is));
    });
    if (mean) {
      for (double& v : acc) v /= static_cast<double>(count);  // 0/0: NaN, as aten's mean of nothing
    }
    Scatter<T>(out, acc, lie);
  };
}

int Reduce(Fn fn, xdnn::Context* ctx, const Tensor& self_raw, const std::vector<int64_t>& dim,
           bool keepdim, const Tensor& out_raw) {
  if (int rc = Enter(fn, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor self = Norm(self_raw), out = Norm(out_raw);
  if (!SameFloatDtype({&self, &out})) return xdnn::NOT_IMPLEMENT;
  const size_t rank = self.sizes.size();
  std::vector<bool> reduced(rank, dim.empty());  // no dims: all of them
  for (int64_t d : dim) {
    const int64_t w = WrapDim(d, rank);
    if (w < 0 || reduced[static_cast<size_t>(w)]) return xdnn::INVALID_PARAM;  // out of range, repeated
    reduced[static_cast<size_t>(w)] = true;
  }
  std::vector<int64_t> keep_shape(self.sizes), want;
  for (size_t d = 0; d < rank; ++d) {
    if (reduced[d]) keep_shape[d] = 1;
    if (keepdim || !reduced[d]) want.push_back(keep_shape[d]);
  }
  if (want.empty()) want = {1};  // 0-dim
  if (out.sizes != want || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bs, bo;
  if (!Bind(ctx->xpu_stream, self, &bs) || !Bind(ctx->xpu_stream, out, &bo)) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[fn], mean = fn == kFn_mean_dim;
  Kernel k = out.dtype == ScalarType::kfloat64
                 ? ReduceKernel<double>(bs, keep_shape, reduced, mean, bo, lie)
                 : ReduceKernel<float>(bs, keep_shape, reduced, mean, bo, lie);
  return Launch(ctx->xpu_stream, std::move(k));
}

// ---- log_softmax ---------------------------------------------------------

struct Along {
  int64_t outer, len, inner;
};

Along AlongDim(const std::vector<int64_t>& sizes, int64_t dim) {
  Along a{1, sizes[static_cast<size_t>(dim)], 1};
  for (int64_t d = 0; d < dim; ++d) a.outer *= sizes[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < sizes.size(); ++d) a.inner *= sizes[d];
  return a;
}

template <typename T>
Kernel LogSoftmaxKernel(Bound self, Along g, Bound out, bool lie) {
  return [=]() {
    const std::vector<T> x = Gather<T>(self, self.sizes);
    std::vector<T> res(x.size());
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t i = 0; i < g.inner; ++i) {
        auto at = [&](int64_t j) { return static_cast<size_t>((o * g.len + j) * g.inner + i); };
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < g.len; ++j) mx = std::max(mx, x[at(j)]);
        // A NaN anywhere makes the whole slice NaN, as in aten.
        bool nan = false;
        for (int64_t j = 0; j < g.len; ++j) nan = nan || std::isnan(x[at(j)]);
        double sum = 0;
        for (int64_t j = 0; j < g.len; ++j) sum += std::exp(static_cast<double>(x[at(j)]) - mx);
        const double lse = static_cast<double>(mx) + std::log(sum);
        for (int64_t j = 0; j < g.len; ++j) {
          res[at(j)] = nan ? std::numeric_limits<T>::quiet_NaN()
                           : static_cast<T>(static_cast<double>(x[at(j)]) - lse);
        }
      }
    }
    Scatter<T>(out, res, lie);
  };
}

template <typename T>
Kernel LogSoftmaxBackwardKernel(Bound grad, Bound output, Along g, Bound out, bool lie) {
  return [=]() {
    const std::vector<T> go = Gather<T>(grad, grad.sizes);
    const std::vector<T> y = Gather<T>(output, output.sizes);
    std::vector<T> res(go.size());
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t i = 0; i < g.inner; ++i) {
        auto at = [&](int64_t j) { return static_cast<size_t>((o * g.len + j) * g.inner + i); };
        double sum = 0;
        for (int64_t j = 0; j < g.len; ++j) sum += static_cast<double>(go[at(j)]);
        for (int64_t j = 0; j < g.len; ++j) {
          res[at(j)] = static_cast<T>(static_cast<double>(go[at(j)]) -
                                      std::exp(static_cast<double>(y[at(j)])) * sum);
        }
      }
    }
    Scatter<T>(out, res, lie);
  };
}

int LogSoftmax(xdnn::Context* ctx, const Tensor& self_raw, int64_t dim, bool half_to_float,
               const Tensor& out_raw) {
  if (int rc = Enter(kFn_log_softmax, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor self = Norm(self_raw), out = Norm(out_raw);
  // half_to_float: a float16 input giving float32, which the fake lacks.
  if (!SameFloatDtype({&self, &out}) || half_to_float) return xdnn::NOT_IMPLEMENT;
  const int64_t d = WrapDim(dim, self.sizes.size());
  if (d < 0 || out.sizes != self.sizes || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bs, bo;
  if (!Bind(ctx->xpu_stream, self, &bs) || !Bind(ctx->xpu_stream, out, &bo)) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[kFn_log_softmax];
  const Along g = AlongDim(self.sizes, d);
  Kernel k = out.dtype == ScalarType::kfloat64 ? LogSoftmaxKernel<double>(bs, g, bo, lie)
                                               : LogSoftmaxKernel<float>(bs, g, bo, lie);
  return Launch(ctx->xpu_stream, std::move(k));
}

int LogSoftmaxBackward(xdnn::Context* ctx, const Tensor& grad_raw, const Tensor& output_raw, int64_t dim,
                       ScalarType input_dtype, const Tensor& out_raw) {
  if (int rc = Enter(kFn_log_softmax_backward_data, grad_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(grad_raw) || !WellFormed(output_raw) || !WellFormed(out_raw)) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor grad = Norm(grad_raw), output = Norm(output_raw), out = Norm(out_raw);
  // input_dtype other than grad's: a float16 forward, which the fake lacks.
  if (!SameFloatDtype({&grad, &output, &out}) || input_dtype != grad.dtype) {
    return xdnn::NOT_IMPLEMENT;
  }
  const int64_t d = WrapDim(dim, grad.sizes.size());
  if (d < 0 || output.sizes != grad.sizes || out.sizes != grad.sizes || SelfOverlapping(out)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bg, by, bo;
  if (!Bind(ctx->xpu_stream, grad, &bg) || !Bind(ctx->xpu_stream, output, &by) ||
      !Bind(ctx->xpu_stream, out, &bo)) {
    return xdnn::INVALID_PARAM;
  }
  const bool lie = g_cfg.lie[kFn_log_softmax_backward_data];
  const Along g = AlongDim(grad.sizes, d);
  Kernel k = out.dtype == ScalarType::kfloat64
                 ? LogSoftmaxBackwardKernel<double>(bg, by, g, bo, lie)
                 : LogSoftmaxBackwardKernel<float>(bg, by, g, bo, lie);
  return Launch(ctx->xpu_stream, std::move(k));
}

// ---- nll_loss ------------------------------------------------------------

constexpr int64_t kReductionNone = 0, kReductionMean = 1, kReductionSum = 2;

// What nll_loss and its backward share: self [N,C] or [C], target [N] (or
// one element for [C]), weight [C].
struct NllShape {
  bool batched;
  int64_t n, c;
};

// Element access of the nll tensors inside a kernel.
template <typename T>
struct NllAccess {
  Bound self, target;
  std::optional<Bound> weight;
  bool batched;
  T x(int64_t i, int64_t c) const {
    const int64_t off = (batched ? i * self.strides[0] : 0) + c * self.strides.back();
    return Load<T>(self.base + off * ItemSize(self.dtype));
  }
  int64_t t(int64_t i) const { return Load<int64_t>(target.base + i * target.strides[0] * 8); }
  T w(int64_t c) const {
    return weight ? Load<T>(weight->base + c * weight->strides[0] * ItemSize(weight->dtype)) : T(1);
  }
};

// Checks the tensors nll_loss and its backward share; INVALID_PARAM,
// NOT_IMPLEMENT or -1 (fine).
int CheckNll(const Tensor& self, const Tensor& target, const std::optional<Tensor>& weight,
             int64_t reduction, NllShape* shape) {
  if (!IsFloat(self.dtype)) return xdnn::NOT_IMPLEMENT;
  if (target.dtype != ScalarType::kint64) return xdnn::NOT_IMPLEMENT;
  if (weight && weight->dtype != self.dtype) return xdnn::NOT_IMPLEMENT;
  if (reduction < kReductionNone || reduction > kReductionSum) return xdnn::INVALID_PARAM;
  const size_t rank = self.sizes.size();
  if (rank != 1 && rank != 2) return xdnn::INVALID_PARAM;
  shape->batched = rank == 2;
  shape->n = shape->batched ? self.sizes[0] : 1;
  shape->c = self.sizes.back();
  if (shape->batched ? target.sizes != std::vector<int64_t>{shape->n} : !IsScalarShape(target)) {
    return xdnn::INVALID_PARAM;
  }
  if (weight && weight->sizes != std::vector<int64_t>{shape->c}) return xdnn::INVALID_PARAM;
  return -1;
}

// aten's nll_loss_forward (LossNLL.cpp): a target equal to ignore_index
// counts nothing. A target outside [0, C) (aten raises an IndexError) is
// only visible on the device: the kernel skips it like an ignored one.
template <typename T>
Kernel NllLossKernel(NllAccess<T> in, NllShape s, int64_t reduction, int64_t ignore_index, Bound output,
                     Bound total_weight, bool lie) {
  return [=]() {
    auto counted = [&](int64_t t) { return t != ignore_index && t >= 0 && t < s.c; };
    if (reduction == kReductionNone && s.batched) {
      std::vector<T> out(static_cast<size_t>(s.n), T(0));
      for (int64_t i = 0; i < s.n; ++i) {
        const int64_t t = in.t(i);
        if (counted(t)) out[static_cast<size_t>(i)] = -in.x(i, t) * in.w(t);
      }
      Scatter<T>(output, out, lie);
      Scatter<T>(total_weight, std::vector<T>{T(0)}, lie);
      return;
    }
    double loss = 0, wsum = 0;
    int64_t n_counted = 0;
    // A batch of N = 0 has no target elements to read.
    for (int64_t i = 0; i < (in.target.numel == 0 ? 0 : s.n); ++i) {
      const int64_t t = in.t(i);
      if (!counted(t)) continue;
      const T w = in.w(t);
      loss -= static_cast<double>(in.x(i, t) * w);
      wsum += static_cast<double>(w);
      ++n_counted;
    }
    const T tw = in.weight ? static_cast<T>(wsum) : static_cast<T>(n_counted);
    T result = static_cast<T>(loss);
    if (reduction == kReductionMean) result /= tw;  // nothing counted: NaN, as aten
    Scatter<T>(output, std::vector<T>{result}, lie);
    Scatter<T>(total_weight, std::vector<T>{tw}, lie);
  };
}

int NllLoss(xdnn::Context* ctx, const Tensor& self_raw, const Tensor& target_raw,
            const OptionalTensor& weight_raw, int64_t reduction, int64_t ignore_index,
            const Tensor& output_raw, const Tensor& tw_raw) {
  if (int rc = Enter(kFn_nll_loss, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(target_raw) || (weight_raw && !WellFormed(*weight_raw)) ||
      !WellFormed(output_raw) || !WellFormed(tw_raw)) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor self = Norm(self_raw), target = Norm(target_raw), output = Norm(output_raw),
               tw = Norm(tw_raw);
  std::optional<Tensor> weight;
  if (weight_raw) weight = Norm(*weight_raw);
  NllShape s;
  if (int rc = CheckNll(self, target, weight, reduction, &s); rc >= 0) return rc;
  if (output.dtype != self.dtype || tw.dtype != self.dtype) return xdnn::NOT_IMPLEMENT;
  const bool per_sample = reduction == kReductionNone && s.batched;
  if ((per_sample ? output.sizes != std::vector<int64_t>{s.n} : !IsScalarShape(output)) ||
      !IsScalarShape(tw) || SelfOverlapping(output)) {
    return xdnn::INVALID_PARAM;
  }
  // total_weight always has its one element, so there is always work.
  void* stream = ctx->xpu_stream;
  Bound bs, bt, bo, btw;
  std::optional<Bound> bw;
  if (!Bind(stream, self, &bs) || !Bind(stream, target, &bt) || !Bind(stream, output, &bo) ||
      !Bind(stream, tw, &btw)) {
    return xdnn::INVALID_PARAM;
  }
  if (weight) {
    bw.emplace();
    if (!Bind(stream, *weight, &*bw)) return xdnn::INVALID_PARAM;
  }
  const bool lie = g_cfg.lie[kFn_nll_loss];
  Kernel k;
  if (self.dtype == ScalarType::kfloat64) {
    k = NllLossKernel<double>({bs, bt, bw, s.batched}, s, reduction, ignore_index, bo, btw, lie);
  } else {
    k = NllLossKernel<float>({bs, bt, bw, s.batched}, s, reduction, ignore_index, bo, btw, lie);
  }
  return Launch(stream, std::move(k));
}

// aten's nll_loss_backward: grad_input zeroed, then
// grad_input[i, t] = -w[t] * g with g = grad_output (sum),
// grad_output / total_weight (mean) or grad_output[i] (none, batched).
template <typename T>
Kernel NllLossBackwardKernel(NllAccess<T> in, NllShape s, int64_t reduction, int64_t ignore_index,
                             Bound grad_output, Bound total_weight, Bound grad_input, bool lie) {
  return [=]() {
    auto counted = [&](int64_t t) { return t != ignore_index && t >= 0 && t < s.c; };
    std::vector<T> gi(static_cast<size_t>(grad_input.numel), T(0));
    const std::vector<T> go = Gather<T>(grad_output, grad_output.sizes);
    const int64_t rows = in.target.numel == 0 ? 0 : s.n;
    if (reduction == kReductionNone && s.batched) {
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = in.t(i);
        if (counted(t)) gi[static_cast<size_t>(i * s.c + t)] = -in.w(t) * go[static_cast<size_t>(i)];
      }
    } else {
      const T tw = Load<T>(total_weight.base);
      const T grad = -(reduction == kReductionMean ? go[0] / tw : go[0]);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = in.t(i);
        if (counted(t)) gi[static_cast<size_t>(i * s.c + t)] = in.weight ? in.w(t) * grad : grad;
      }
    }
    Scatter<T>(grad_input, gi, lie);
  };
}

int NllLossBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& self_raw,
                    const Tensor& target_raw, const OptionalTensor& weight_raw, int64_t reduction,
                    int64_t ignore_index, const Tensor& tw_raw, const Tensor& gi_raw) {
  if (int rc = Enter(kFn_nll_loss_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(go_raw) || !WellFormed(self_raw) || !WellFormed(target_raw) ||
      (weight_raw && !WellFormed(*weight_raw)) || !WellFormed(tw_raw) || !WellFormed(gi_raw)) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor go = Norm(go_raw), self = Norm(self_raw), target = Norm(target_raw), tw = Norm(tw_raw),
               gi = Norm(gi_raw);
  std::optional<Tensor> weight;
  if (weight_raw) weight = Norm(*weight_raw);
  NllShape s;
  if (int rc = CheckNll(self, target, weight, reduction, &s); rc >= 0) return rc;
  if (!SameFloatDtype({&go, &self, &tw, &gi})) return xdnn::NOT_IMPLEMENT;
  const bool per_sample = reduction == kReductionNone && s.batched;
  if ((per_sample ? go.sizes != std::vector<int64_t>{s.n} : !IsScalarShape(go)) || !IsScalarShape(tw) ||
      gi.sizes != self.sizes || SelfOverlapping(gi)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(gi.sizes) == 0) return xdnn::SUCCESS;
  void* stream = ctx->xpu_stream;
  Bound bgo, bs, bt, btw, bgi;
  std::optional<Bound> bw;
  if (!Bind(stream, go, &bgo) || !Bind(stream, self, &bs) || !Bind(stream, target, &bt) ||
      !Bind(stream, tw, &btw) || !Bind(stream, gi, &bgi)) {
    return xdnn::INVALID_PARAM;
  }
  if (weight) {
    bw.emplace();
    if (!Bind(stream, *weight, &*bw)) return xdnn::INVALID_PARAM;
  }
  const bool lie = g_cfg.lie[kFn_nll_loss_backward];
  Kernel k;
  if (gi.dtype == ScalarType::kfloat64) {
    k = NllLossBackwardKernel<double>({bs, bt, bw, s.batched}, s, reduction, ignore_index, bgo, btw, bgi,
                                      lie);
  } else {
    k = NllLossBackwardKernel<float>({bs, bt, bw, s.batched}, s, reduction, ignore_index, bgo, btw, bgi,
                                     lie);
  }
  return Launch(stream, std::move(k));
}

}  // namespace

// ---- the API -------------------------------------------------------------

namespace xdnn {

Context* create_context() {
  g_calls[kFn_create_context].fetch_add(1, std::memory_order_relaxed);
  return new Context;
}

void destroy_context(Context* ctx) {
  g_calls[kFn_destroy_context].fetch_add(1, std::memory_order_relaxed);
  delete ctx;
}

}  // namespace xdnn

namespace xdnn_pytorch {

Scalar Scalar::create(int64_t value) {
  Scalar s;
  s.integral_ = true;
  s.i_ = value;
  return s;
}

Scalar Scalar::create(float value) {
  Scalar s;
  s.integral_ = false;
  s.f_ = value;
  return s;
}

int add_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, const Scalar& alpha,
               Tensor& out) {
  return Elementwise<2>(kFn_add_tensor, ctx, {&self, &other}, out, [&](auto tag) {
    using T = decltype(tag);
    const T a = ScalarAs<T>(alpha);
    return [a](T x, T y) { return x + a * y; };
  });
}

int add_scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& other, const Scalar& alpha,
               Tensor& out) {
  return Elementwise<1>(kFn_add_scalar, ctx, {&self}, out, [&](auto tag) {
    using T = decltype(tag);
    const T a = ScalarAs<T>(alpha), o = ScalarAs<T>(other);
    return [a, o](T x) { return x + a * o; };
  });
}

int sub_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, const Scalar& alpha,
               Tensor& out) {
  return Elementwise<2>(kFn_sub_tensor, ctx, {&self, &other}, out, [&](auto tag) {
    using T = decltype(tag);
    const T a = ScalarAs<T>(alpha);
    return [a](T x, T y) { return x - a * y; };
  });
}

int mul_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return Elementwise<2>(kFn_mul_tensor, ctx, {&self, &other}, out, [](auto tag) {
    using T = decltype(tag);
    return [](T x, T y) { return x * y; };
  });
}

int mul_scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& other, Tensor& out) {
  return Elementwise<1>(kFn_mul_scalar, ctx, {&self}, out, [&](auto tag) {
    using T = decltype(tag);
    const T o = ScalarAs<T>(other);
    return [o](T x) { return x * o; };
  });
}

int div_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return Elementwise<2>(kFn_div_tensor, ctx, {&self, &other}, out, [](auto tag) {
    using T = decltype(tag);
    return [](T x, T y) { return x / y; };
  });
}

int div_scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& other, Tensor& out) {
  return Elementwise<1>(kFn_div_scalar, ctx, {&self}, out, [&](auto tag) {
    using T = decltype(tag);
    const T o = ScalarAs<T>(other);
    return [o](T x) { return x / o; };
  });
}

int neg(xdnn::Context* ctx, const Tensor& self, Tensor& out) {
  return Elementwise<1>(kFn_neg, ctx, {&self}, out, [](auto tag) {
    using T = decltype(tag);
    return [](T x) { return -x; };
  });
}

int relu(xdnn::Context* ctx, const Tensor& self, Tensor& out) {
  return Elementwise<1>(kFn_relu, ctx, {&self}, out, [](auto tag) {
    using T = decltype(tag);
    return [](T x) { return Relu(x); };
  });
}

int sqrt(xdnn::Context* ctx, const Tensor& self, Tensor& out) {
  return Elementwise<1>(kFn_sqrt, ctx, {&self}, out, [](auto tag) {
    using T = decltype(tag);
    return [](T x) { return std::sqrt(x); };
  });
}

int exp(xdnn::Context* ctx, const Tensor& self, Tensor& out) {
  return Elementwise<1>(kFn_exp, ctx, {&self}, out, [](auto tag) {
    using T = decltype(tag);
    return [](T x) { return std::exp(x); };
  });
}

int threshold_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                       const Scalar& threshold, Tensor& grad_input) {
  return Elementwise<2>(kFn_threshold_backward, ctx, {&grad_output, &self}, grad_input, [&](auto tag) {
    using T = decltype(tag);
    const T th = ScalarAs<T>(threshold);
    return [th](T g, T x) { return x <= th ? T(0) : g; };
  });
}

int addcmul(xdnn::Context* ctx, const Tensor& self, const Tensor& tensor1, const Tensor& tensor2,
            const Scalar& value, Tensor& out) {
  return Elementwise<3>(kFn_addcmul, ctx, {&self, &tensor1, &tensor2}, out, [&](auto tag) {
    using T = decltype(tag);
    const T v = ScalarAs<T>(value);
    return [v](T s, T a, T b) { return s + v * a * b; };
  });
}

int addcdiv(xdnn::Context* ctx, const Tensor& self, const Tensor& tensor1, const Tensor& tensor2,
            const Scalar& value, Tensor& out) {
  return Elementwise<3>(kFn_addcdiv, ctx, {&self, &tensor1, &tensor2}, out, [&](auto tag) {
    using T = decltype(tag);
    const T v = ScalarAs<T>(value);
    return [v](T s, T a, T b) { return s + v * a / b; };
  });
}

int lerp_scalar(xdnn::Context* ctx, const Tensor& self, const Tensor& end, const Scalar& weight,
                Tensor& out) {
  return Elementwise<2>(kFn_lerp_scalar, ctx, {&self, &end}, out, [&](auto tag) {
    using T = decltype(tag);
    const T w = ScalarAs<T>(weight);
    return [w](T s, T e) { return Lerp(s, e, w); };
  });
}

int fill__scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& value, Tensor& out) {
  return Fill(ctx, self, value, out);
}

int copy(xdnn::Context* ctx, const Tensor& src, Tensor& out) { return Copy(ctx, src, out); }

int mm(xdnn::Context* ctx, const Tensor& self, const Tensor& mat2, Tensor& out) {
  return Gemm(kFn_mm, ctx, nullptr, self, mat2, nullptr, nullptr, out);
}

int bmm(xdnn::Context* ctx, const Tensor& self, const Tensor& mat2, Tensor& out) {
  return Gemm(kFn_bmm, ctx, nullptr, self, mat2, nullptr, nullptr, out);
}

int addmm(xdnn::Context* ctx, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
          const Scalar& beta, const Scalar& alpha, Tensor& out) {
  return Gemm(kFn_addmm, ctx, &self, mat1, mat2, &beta, &alpha, out);
}

int sum_dim_IntList(xdnn::Context* ctx, const Tensor& self, const std::vector<int64_t>& dim,
                    bool keepdim, Tensor& out) {
  return Reduce(kFn_sum_dim_IntList, ctx, self, dim, keepdim, out);
}

int mean_dim(xdnn::Context* ctx, const Tensor& self, const std::vector<int64_t>& dim, bool keepdim,
             Tensor& out) {
  return Reduce(kFn_mean_dim, ctx, self, dim, keepdim, out);
}

int log_softmax(xdnn::Context* ctx, const Tensor& self, int64_t dim, bool half_to_float, Tensor& out) {
  return LogSoftmax(ctx, self, dim, half_to_float, out);
}

int log_softmax_backward_data(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& output,
                              int64_t dim, ScalarType input_dtype, Tensor& grad_input) {
  return LogSoftmaxBackward(ctx, grad_output, output, dim, input_dtype, grad_input);
}

int nll_loss(xdnn::Context* ctx, const Tensor& self, const Tensor& target, const OptionalTensor& weight,
             int64_t reduction, int64_t ignore_index, Tensor& output, Tensor& total_weight) {
  return NllLoss(ctx, self, target, weight, reduction, ignore_index, output, total_weight);
}

int nll_loss_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                      const Tensor& target, const OptionalTensor& weight, int64_t reduction,
                      int64_t ignore_index, const Tensor& total_weight, Tensor& grad_input) {
  return NllLossBackward(ctx, grad_output, self, target, weight, reduction, ignore_index, total_weight,
                         grad_input);
}

}  // namespace xdnn_pytorch

// ---- test introspection --------------------------------------------------

uint64_t fake_xdnn_calls(const char* op) {
  if (op == nullptr) return 0;
  const int fn = FnByName(op);
  return fn < 0 ? 0 : g_calls[fn].load(std::memory_order_relaxed);
}

const char* fake_xdnn_version(void) { return "fake xdnn_pytorch 0.1"; }
