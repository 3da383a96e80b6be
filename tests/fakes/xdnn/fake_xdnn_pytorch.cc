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
//
// This file holds the configuration, the introspection and the ops up to
// nll_loss; fake_xdnn_nn_ops.cc the convolution, normalisation, pooling,
// embedding and activation ops, cat and where; fake_xdnn_internal.h what
// both share.

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fake_env.h"
#include "fake_xdnn_internal.h"

#define FAKE_XDNN_API extern "C" __attribute__((visibility("default")))

FAKE_XDNN_API uint64_t fake_xdnn_calls(const char* op);
FAKE_XDNN_API const char* fake_xdnn_version(void);

using namespace fake_xdnn;  // NOLINT: the shared internals (fake_xdnn_internal.h)

namespace {

// ---- configuration (read once, when the library loads) -------------------

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

// The comma-separated items of `var`, empty ones left out (none when unset).
std::vector<std::string> Items(const char* var) {
  std::vector<std::string> out;
  if (const char* v = std::getenv(var)) {
    for (std::string& item : Split(v, ',')) {
      if (!item.empty()) out.push_back(std::move(item));
    }
  }
  return out;
}

// An item "op:<what>" of `var`: the op's function and the <what>.
std::pair<int, std::string> OpAnd(const char* var, const std::string& item, const char* what) {
  const std::vector<std::string> f = Split(item, ':');
  if (f.size() != 2) ConfigError(var, "'" + item + "' is not op:" + what);
  return {OpOf(var, f[0]), f[1]};
}

void ParseConfig(Config& cfg) {
  for (const std::string& item : Items("FAKE_XDNN_NOT_IMPLEMENT")) {
    const auto [fn, dtype] = OpAnd("FAKE_XDNN_NOT_IMPLEMENT", item, "dtype");
    uint32_t bits = 0;
    if (dtype == "*") {
      bits = (1u << kDtypeCount) - 1;
    } else {
      for (int d = 0; d < kDtypeCount; ++d) {
        if (dtype == kDtypeNames[d]) bits = 1u << d;
      }
      if (bits == 0) ConfigError("FAKE_XDNN_NOT_IMPLEMENT", "unknown dtype '" + dtype + "'");
    }
    cfg.not_implement[fn] |= bits;
  }
  for (const std::string& item : Items("FAKE_XDNN_LIE")) cfg.lie[OpOf("FAKE_XDNN_LIE", item)] = true;
  for (const std::string& item : Items("FAKE_XDNN_FAIL")) {
    const auto [fn, code] = OpAnd("FAKE_XDNN_FAIL", item, "code");
    if (code == "INVALID_PARAM") {
      cfg.fail[fn] = xdnn::INVALID_PARAM;
    } else if (code == "RUNTIME_ERROR") {
      cfg.fail[fn] = xdnn::RUNTIME_ERROR;
    } else if (code == "NO_ENOUGH_WORKSPACE") {
      cfg.fail[fn] = xdnn::NO_ENOUGH_WORKSPACE;
    } else {
      ConfigError("FAKE_XDNN_FAIL",
                  "unknown code '" + code + "' (INVALID_PARAM, RUNTIME_ERROR or NO_ENOUGH_WORKSPACE)");
    }
  }
}

__attribute__((constructor)) void FakeXdnnLoad() { ParseConfig(g_cfg); }

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
  if (!BindAll(ctx->xpu_stream, {{src, &bs}, {out, &bo}})) return xdnn::INVALID_PARAM;
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
    // i-q-j order over a row of double accumulators: b's rows are read
    // contiguously (a 2048^3 product takes seconds, not minutes).
    std::vector<T> res(static_cast<size_t>(batch * n * m));
    std::vector<double> row(static_cast<size_t>(m));
    for (int64_t p = 0; p < batch; ++p) {
      for (int64_t i = 0; i < n; ++i) {
        std::fill(row.begin(), row.end(), 0.0);
        if (use_ab) {
          for (int64_t q = 0; q < kk; ++q) {
            const double aiq = static_cast<double>(va[static_cast<size_t>((p * n + i) * kk + q)]);
            const T* brow = vb.data() + static_cast<size_t>((p * kk + q) * m);
            for (int64_t j = 0; j < m; ++j) row[static_cast<size_t>(j)] += aiq * static_cast<double>(brow[j]);
          }
        }
        for (int64_t j = 0; j < m; ++j) {
          double v = use_ab ? static_cast<double>(alpha) * row[static_cast<size_t>(j)] : 0.0;
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
  const Scalar one = Scalar::create(int64_t{1});
  const Scalar& al = alpha != nullptr ? *alpha : one;
  const Scalar& be = beta != nullptr ? *beta : one;
  Bound ba, bb, bo;
  std::optional<Bound> bc;
  return BindAndLaunch(fn, ctx, {{a, &ba}, {b, &bb}, {out, &bo}, {self, &bc}}, out.dtype, [&](auto tag, bool lie) {
    using T = decltype(tag);
    return GemmKernel<T>(batch, n, kk, m, ba, bb, bc, ScalarAs<T>(al), ScalarAs<T>(be), bo, lie);
  });
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
  const bool mean = fn == kFn_mean_dim;
  Bound bs, bo;
  return BindAndLaunch(fn, ctx, {{self, &bs}, {out, &bo}}, out.dtype, [&](auto tag, bool lie) {
    return ReduceKernel<decltype(tag)>(bs, keep_shape, reduced, mean, bo, lie);
  });
}

// ---- log_softmax ---------------------------------------------------------


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
  Bound bs, bt, bo, btw;
  std::optional<Bound> bw;
  return BindAndLaunch(kFn_nll_loss, ctx, {{self, &bs}, {target, &bt}, {output, &bo}, {tw, &btw}, {weight, &bw}},
                       self.dtype, [&](auto tag, bool lie) {
                         return NllLossKernel<decltype(tag)>({bs, bt, bw, s.batched}, s, reduction, ignore_index, bo,
                                                             btw, lie);
                       });
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
  Bound bgo, bs, bt, btw, bgi;
  std::optional<Bound> bw;
  return BindAndLaunch(kFn_nll_loss_backward, ctx,
                       {{go, &bgo}, {self, &bs}, {target, &bt}, {tw, &btw}, {gi, &bgi}, {weight, &bw}}, gi.dtype,
                       [&](auto tag, bool lie) {
                         return NllLossBackwardKernel<decltype(tag)>({bs, bt, bw, s.batched}, s, reduction,
                                                                     ignore_index, bgo, btw, bgi, lie);
                       });
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
  return SoftmaxCall(kFn_log_softmax, ctx, self, dim, half_to_float, out,
                     [](auto tag, Bound x, Along g, Bound y, bool lie) {
                       return LogSoftmaxKernel<decltype(tag)>(x, g, y, lie);
                     });
}

int log_softmax_backward_data(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& output,
                              int64_t dim, ScalarType input_dtype, Tensor& grad_input) {
  return SoftmaxBackwardCall(kFn_log_softmax_backward_data, ctx, grad_output, output, dim, input_dtype,
                             grad_input, [](auto tag, Bound grad, Bound y, Along g, Bound gi, bool lie) {
                               return LogSoftmaxBackwardKernel<decltype(tag)>(grad, y, g, gi, lie);
                             });
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
