// Internal to the fake libxdnn_pytorch (tests/fakes/xdnn): what its sources
// (fake_xdnn_pytorch.cc: configuration, elementwise, products, reductions,
// losses; fake_xdnn_nn_ops.cc: convolution, normalisation, pooling,
// embedding, activations, cat, where) share. Not installed, not part of the
// contract (include/xdnn_pytorch/xdnn_pytorch.h is). Everything here is
// inline and hidden (CXX_VISIBILITY_PRESET hidden, libxdnn_pytorch.map).
//
// The call discipline every op follows (README.md, "What each call does"):
// Enter (count, FAKE_XDNN_FAIL / _NOT_IMPLEMENT), context, WellFormed,
// Norm, dtypes (NOT_IMPLEMENT), shapes (INVALID_PARAM), nothing to write
// (SUCCESS), Bind every tensor with elements (INVALID_PARAM), one Launch.
// A kernel reads all its inputs before writing, so outputs may alias them.
#ifndef FLAGOS_TESTS_FAKES_XDNN_FAKE_XDNN_INTERNAL_H_
#define FLAGOS_TESTS_FAKES_XDNN_FAKE_XDNN_INTERNAL_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fake_xpurt.h"

// The library is built with hidden visibility; the header's declarations
// are the API, so they (and only they, with fake_xdnn_*) are visible.
// libxdnn_pytorch.map keeps everything else local.
#pragma GCC visibility push(default)
#include "xdnn_pytorch/xdnn_pytorch.h"
#pragma GCC visibility pop

namespace fake_xdnn {

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
  X(nll_loss) X(nll_loss_backward) X(convolution) X(convolution_backward)                     \
  X(native_batch_norm) X(native_batch_norm_backward) X(native_layer_norm)                     \
  X(native_layer_norm_backward) X(softmax) X(softmax_backward_data) X(embedding)              \
  X(embedding_dense_backward) X(gelu) X(gelu_backward) X(max_pool2d_with_indices)             \
  X(max_pool2d_with_indices_backward) X(adaptive_avg_pool2d) X(adaptive_avg_pool2d_backward)  \
  X(cat) X(where)

enum Fn {
#define FAKE_XDNN_ENUM(name) kFn_##name,
  FAKE_XDNN_FUNCTIONS(FAKE_XDNN_ENUM)
#undef FAKE_XDNN_ENUM
  kFnCount
};

inline constexpr const char* kFnNames[kFnCount] = {
#define FAKE_XDNN_NAME(name) #name,
    FAKE_XDNN_FUNCTIONS(FAKE_XDNN_NAME)
#undef FAKE_XDNN_NAME
};

inline int FnByName(std::string_view name) {
  for (int i = 0; i < kFnCount; ++i) {
    if (name == kFnNames[i]) return i;
  }
  return -1;
}

inline bool ReturnsCode(int fn) { return fn != kFn_create_context && fn != kFn_destroy_context; }

// ScalarType names, in the enum's order.
inline constexpr int kDtypeCount = 10;
inline constexpr const char* kDtypeNames[kDtypeCount] = {"bool",    "uint8",   "int8",     "int16",
                                                         "int32",   "int64",   "float32",  "float16",
                                                         "bfloat16", "float64"};

inline bool KnownDtype(ScalarType t) {
  return static_cast<unsigned>(t) < static_cast<unsigned>(kDtypeCount);
}

inline int64_t ItemSize(ScalarType t) {
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

// ---- configuration (FAKE_XDNN_*, parsed once by fake_xdnn_pytorch.cc when
// the library loads) and call counts --------------------------------------

struct Config {
  uint32_t not_implement[kFnCount] = {};  // FAKE_XDNN_NOT_IMPLEMENT: a bit per dtype
  bool lie[kFnCount] = {};                // FAKE_XDNN_LIE
  int fail[kFnCount] = {};                // FAKE_XDNN_FAIL: the code, 0 for none
};

inline Config g_cfg;
inline std::atomic<uint64_t> g_calls[kFnCount] = {};

// Every call starts here: counts it, then applies FAKE_XDNN_FAIL and
// FAKE_XDNN_NOT_IMPLEMENT (the latter by the dtype of the call's first
// tensor argument). -1: go on; otherwise the code to return.
inline int Enter(Fn fn, const Tensor& first) {
  g_calls[fn].fetch_add(1, std::memory_order_relaxed);
  if (g_cfg.fail[fn] != 0) return g_cfg.fail[fn];
  if (KnownDtype(first.dtype) &&
      (g_cfg.not_implement[fn] & (1u << static_cast<unsigned>(first.dtype))) != 0) {
    return xdnn::NOT_IMPLEMENT;
  }
  return -1;
}

// ---- shapes --------------------------------------------------------------

inline constexpr int64_t kMaxExtent = int64_t{1} << 48;  // elements; far beyond any fake device

// Sizes and strides of one length, none negative, and a range that fits.
inline bool WellFormed(const Tensor& t) {
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
inline Tensor Norm(const Tensor& t) {
  if (!t.sizes.empty()) return t;
  Tensor n = t;
  n.sizes = {1};
  n.strides = {1};
  return n;
}

inline int64_t Numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

inline bool IsScalarShape(const Tensor& t) { return t.sizes == std::vector<int64_t>{1}; }

// aten's broadcasting: `from` expands to `to` (trailing dims aligned; a
// dim of 1, or a missing leading dim, expands). Extra leading dims of size
// 1 are tolerated (a 0-dim tensor sent as {1}).
inline bool BroadcastsTo(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
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
inline bool SelfOverlapping(const Tensor& t) {
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] > 1 && t.strides[d] == 0) return true;
  }
  return false;
}

// A dim index wrapped into [0, rank); -1 when out of range.
inline int64_t WrapDim(int64_t dim, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (dim < -r || dim >= r) return -1;
  return dim < 0 ? dim + r : dim;
}

inline bool IsFloat(ScalarType t) { return t == ScalarType::kfloat32 || t == ScalarType::kfloat64; }

inline bool IsCopyable(ScalarType t) {
  return t == ScalarType::kbool || t == ScalarType::kint32 || t == ScalarType::kint64 ||
         t == ScalarType::kfloat32 || t == ScalarType::kfloat64;
}

// Floating ops compute float32 (and float64); every floating tensor of a
// call must have the first one's dtype: the fake does no type promotion.
inline bool SameFloatDtype(std::initializer_list<const Tensor*> ts) {
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
inline bool Bind(void* stream, const Tensor& t, Bound* b) {
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

// One tensor of a call to translate: a required one, or an optional one
// (std::optional<Bound>: reset, then bound only when the tensor is there).
class Binding {
 public:
  Binding(const Tensor& t, Bound* b) : t_(&t), b_(b) {}
  Binding(const Tensor& t, std::optional<Bound>* ob) : t_(&t), ob_(ob) {}
  Binding(const std::optional<Tensor>& t, std::optional<Bound>* ob) : t_(t ? &*t : nullptr), ob_(ob) {}

  bool BindOn(void* stream) const {
    if (b_ != nullptr) return Bind(stream, *t_, b_);
    ob_->reset();
    if (t_ == nullptr) return true;
    ob_->emplace();
    return Bind(stream, *t_, &**ob_);
  }

 private:
  const Tensor* t_;
  Bound* b_ = nullptr;
  std::optional<Bound>* ob_ = nullptr;
};

// Binds every listed tensor, in order; false at the first one that is not
// inside one live allocation of the stream's device.
inline bool BindAll(void* stream, std::initializer_list<Binding> bindings) {
  for (const Binding& b : bindings) {
    if (!b.BindOn(stream)) return false;
  }
  return true;
}

using Kernel = std::function<void()>;

inline void RunKernel(void* arg) {
  std::unique_ptr<Kernel> k(static_cast<Kernel*>(arg));
  (*k)();
}

// Queues `k` on the stream: one launch per call.
inline int Launch(void* stream, Kernel k) {
  auto* heap = new Kernel(std::move(k));
  if (fake_xpu_launch(stream, &RunKernel, heap) != 0) {
    delete heap;
    return xdnn::RUNTIME_ERROR;
  }
  return xdnn::SUCCESS;
}

// `make(T{})` for the float dtype `t` (float32 or float64).
template <typename Make>
Kernel ByFloat(ScalarType t, Make make) {
  return t == ScalarType::kfloat64 ? make(double{}) : make(float{});
}

// The end of a floating call, once every check passed: binds the listed
// tensors (INVALID_PARAM when one is outside its allocation), then launches
// make(T{}, lie) for the float dtype `t`, lie being FAKE_XDNN_LIE of fn.
template <typename Make>
int BindAndLaunch(Fn fn, xdnn::Context* ctx, std::initializer_list<Binding> bindings, ScalarType t, Make make) {
  void* stream = ctx->xpu_stream;
  if (!BindAll(stream, bindings)) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[fn];
  return Launch(stream, ByFloat(t, [&](auto tag) { return make(tag, lie); }));
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
inline std::vector<int64_t> BroadcastStrides(const Bound& t, const std::vector<int64_t>& shape) {
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
// N values of type T. `params_ok` false (a bad non-tensor argument):
// INVALID_PARAM, after the dtype checks.
template <size_t N, typename Make>
int Elementwise(Fn fn, xdnn::Context* ctx, std::array<const Tensor*, N> raw, const Tensor& out_raw,
                Make make, bool params_ok = true) {
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
  if (!params_ok) return xdnn::INVALID_PARAM;  // a bad non-tensor argument (gelu's approximate)
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

// ---- copyable dtypes -----------------------------------------------------

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

// ---- along one dim ---------------------------------------------------------

struct Along {
  int64_t outer, len, inner;
};

inline Along AlongDim(const std::vector<int64_t>& sizes, int64_t dim) {
  Along a{1, sizes[static_cast<size_t>(dim)], 1};
  for (int64_t d = 0; d < dim; ++d) a.outer *= sizes[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < sizes.size(); ++d) a.inner *= sizes[d];
  return a;
}

// ---- softmax and log_softmax: the calls (each file has its kernels) ------

// softmax / log_softmax (fn): self and out of one float dtype and shape, a
// dim in range; the kernel is make(T{}, self, along, out, lie).
template <typename Make>
int SoftmaxCall(Fn fn, xdnn::Context* ctx, const Tensor& self_raw, int64_t dim, bool half_to_float,
                const Tensor& out_raw, Make make) {
  if (int rc = Enter(fn, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor self = Norm(self_raw), out = Norm(out_raw);
  // half_to_float: a float16 input giving float32, which the fake lacks.
  if (!SameFloatDtype({&self, &out}) || half_to_float) return xdnn::NOT_IMPLEMENT;
  const int64_t d = WrapDim(dim, self.sizes.size());
  if (d < 0 || out.sizes != self.sizes || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bs, bo;
  const Along g = AlongDim(self.sizes, d);
  return BindAndLaunch(fn, ctx, {{self, &bs}, {out, &bo}}, out.dtype,
                       [&](auto tag, bool lie) { return make(tag, bs, g, bo, lie); });
}

// Their backwards (fn): grad, the forward's output and out of one float
// dtype and shape, input_dtype grad's; the kernel is make(T{}, grad, output,
// along, out, lie).
template <typename Make>
int SoftmaxBackwardCall(Fn fn, xdnn::Context* ctx, const Tensor& grad_raw, const Tensor& output_raw, int64_t dim,
                        ScalarType input_dtype, const Tensor& out_raw, Make make) {
  if (int rc = Enter(fn, grad_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(grad_raw) || !WellFormed(output_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor grad = Norm(grad_raw), output = Norm(output_raw), out = Norm(out_raw);
  // input_dtype other than grad's: a float16 forward, which the fake lacks.
  if (!SameFloatDtype({&grad, &output, &out}) || input_dtype != grad.dtype) return xdnn::NOT_IMPLEMENT;
  const int64_t d = WrapDim(dim, grad.sizes.size());
  if (d < 0 || output.sizes != grad.sizes || out.sizes != grad.sizes || SelfOverlapping(out)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bg, by, bo;
  const Along g = AlongDim(grad.sizes, d);
  return BindAndLaunch(fn, ctx, {{grad, &bg}, {output, &by}, {out, &bo}}, out.dtype,
                       [&](auto tag, bool lie) { return make(tag, bg, by, g, bo, lie); });
}

}  // namespace fake_xdnn

#endif  // FLAGOS_TESTS_FAKES_XDNN_FAKE_XDNN_INTERNAL_H_
