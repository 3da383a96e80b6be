// The fake libxdnn_pytorch's normalisation ops: batch norm and layer norm,
// forward and backward. Test-only; see README.md. Same discipline as
// fake_xdnn_nn_ops.cc: every check at issue, on the calling thread, then ONE
// kernel on the context's stream that reads every input before it writes
// any output; the arithmetic follows ATen's CPU kernels (PyTorch 2.13).

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "fake_xdnn_internal.h"
#include "fake_xdnn_nn_helpers.h"

using namespace fake_xdnn;  // NOLINT: the shared internals (fake_xdnn_internal.h)

namespace {

// ---- batch norm ----------------------------------------------------------

// input [N, C, *]: C channels, `inner` elements per (sample, channel).
struct ChannelGeom {
  int64_t outer, c, inner;
  int64_t count() const { return outer * inner; }  // elements per channel
};

ChannelGeom ChannelsOf(const Tensor& input) {
  ChannelGeom g{input.sizes[0], input.sizes[1], 1};
  for (size_t d = 2; d < input.sizes.size(); ++d) g.inner *= input.sizes[d];
  return g;
}

// A per-channel tensor: C elements, any shape (aten checks numel only).
bool PerChannel(const OptTensor& t, int64_t c) { return !t || Numel(t->sizes) == c; }

template <typename T>
Kernel BatchNormKernel(ChannelGeom g, bool training, double momentum, double eps, Bound input,
                       OptBound weight, OptBound bias, OptBound rmean, OptBound rvar, Bound out,
                       OptBound save_mean, OptBound save_invstd, bool lie) {
  return [=]() {
    const std::vector<T> x = GatherAll<T>(input), w = GatherOpt<T>(weight), b = GatherOpt<T>(bias);
    const std::vector<T> rm = GatherOpt<T>(rmean), rv = GatherOpt<T>(rvar);
    const int64_t cnt = g.count();
    std::vector<double> mean(Z(g.c)), invstd(Z(g.c)), new_rm(rm.size()), new_rv(rv.size());
    auto at = [&](int64_t n, int64_t c, int64_t i) { return Z((n * g.c + c) * g.inner + i); };
    for (int64_t c = 0; c < g.c; ++c) {
      if (training) {
        double sum = 0;
        for (int64_t n = 0; n < g.outer; ++n) {
          for (int64_t i = 0; i < g.inner; ++i) sum += static_cast<double>(x[at(n, c, i)]);
        }
        const double m = sum / static_cast<double>(cnt);
        double var_sum = 0;
        for (int64_t n = 0; n < g.outer; ++n) {
          for (int64_t i = 0; i < g.inner; ++i) {
            const double d = static_cast<double>(x[at(n, c, i)]) - m;
            var_sum += d * d;
          }
        }
        const double var = var_sum / static_cast<double>(cnt);
        mean[Z(c)] = m;
        // aten's InvStd: 0 when both the variance and eps are 0.
        invstd[Z(c)] = (var == 0 && eps == 0) ? 0.0 : 1.0 / std::sqrt(var + eps);
        if (rmean) new_rm[Z(c)] = momentum * m + (1 - momentum) * static_cast<double>(rm[Z(c)]);
        // The unbiased variance: one element per channel gives 0/0 (NaN), as aten.
        if (rvar) {
          new_rv[Z(c)] = momentum * (var_sum / static_cast<double>(cnt - 1)) +
                         (1 - momentum) * static_cast<double>(rv[Z(c)]);
        }
      } else {
        mean[Z(c)] = static_cast<double>(rm[Z(c)]);
        invstd[Z(c)] = 1.0 / std::sqrt(static_cast<double>(rv[Z(c)]) + eps);
      }
    }
    std::vector<double> y(x.size());
    for (int64_t c = 0; c < g.c; ++c) {
      // aten's batch_norm_cpu_collect_linear_and_constant_terms.
      const double alpha = invstd[Z(c)] * (weight ? static_cast<double>(w[Z(c)]) : 1.0);
      const double beta = (bias ? static_cast<double>(b[Z(c)]) : 0.0) - mean[Z(c)] * alpha;
      for (int64_t n = 0; n < g.outer; ++n) {
        for (int64_t i = 0; i < g.inner; ++i) y[at(n, c, i)] = static_cast<double>(x[at(n, c, i)]) * alpha + beta;
      }
    }
    if (out.numel > 0) Scatter<T>(out, y, lie);
    if (training) {
      ScatterOpt<T>(save_mean, mean, lie);
      ScatterOpt<T>(save_invstd, invstd, lie);
      ScatterOpt<T>(rmean, new_rm, lie);
      ScatterOpt<T>(rvar, new_rv, lie);
    }
  };
}

int BatchNorm(xdnn::Context* ctx, const Tensor& input_raw, const OptionalTensor& weight_raw,
              const OptionalTensor& bias_raw, const OptionalTensor& rm_raw, const OptionalTensor& rv_raw,
              bool training, double momentum, double eps, const Tensor& out_raw, const Tensor& sm_raw,
              const Tensor& si_raw) {
  if (int rc = Enter(kFn_native_batch_norm, input_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&input_raw, weight_raw ? &*weight_raw : nullptr, bias_raw ? &*bias_raw : nullptr,
                      rm_raw ? &*rm_raw : nullptr, rv_raw ? &*rv_raw : nullptr, &out_raw, &sm_raw, &si_raw})) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor input = Norm(input_raw), out = Norm(out_raw);
  const Tensor sm = Norm(sm_raw), si = Norm(si_raw);
  const OptTensor weight = NormOpt(weight_raw), bias = NormOpt(bias_raw), rm = NormOpt(rm_raw),
                  rv = NormOpt(rv_raw);
  // Eval never touches save_mean/save_invstd: empty ones (aten's [0], or a
  // caller's "absent" placeholder) are not even dtype-checked.
  auto save = [&](const Tensor& t) { return training || Numel(t.sizes) != 0 ? &t : nullptr; };
  if (!SameFloat({&input, Ptr(weight), Ptr(bias), Ptr(rm), Ptr(rv), &out, save(sm), save(si)})) {
    return xdnn::NOT_IMPLEMENT;
  }
  if (input.sizes.size() < 2 || out.sizes != input.sizes) return xdnn::INVALID_PARAM;
  const ChannelGeom g = ChannelsOf(input);
  if (!PerChannel(weight, g.c) || !PerChannel(bias, g.c) || !PerChannel(rm, g.c) || !PerChannel(rv, g.c)) {
    return xdnn::INVALID_PARAM;
  }
  if (training) {
    // aten: "input tensor must have at least one element".
    if (Numel(input.sizes) == 0) return xdnn::INVALID_PARAM;
    if (Numel(sm.sizes) != g.c || Numel(si.sizes) != g.c) return xdnn::INVALID_PARAM;
  } else {
    // Eval uses the running statistics (aten crashes without them); the
    // save tensors are aten's empty ones, or C elements left untouched.
    if (!rm || !rv) return xdnn::INVALID_PARAM;
    const int64_t ns = Numel(sm.sizes), ni = Numel(si.sizes);
    if ((ns != 0 && ns != g.c) || (ni != 0 && ni != g.c)) return xdnn::INVALID_PARAM;
  }
  if (SelfOverlapping(out) ||
      (training && (SelfOverlapping(sm) || SelfOverlapping(si) || (rm && SelfOverlapping(*rm)) ||
                    (rv && SelfOverlapping(*rv))))) {
    return xdnn::INVALID_PARAM;
  }
  if (!training && Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bi, bo;
  OptBound bw, bb, brm, brv, bsm, bsi;
  return BindAndLaunch(kFn_native_batch_norm, ctx,
                       {{input, &bi}, {weight, &bw}, {bias, &bb}, {rm, &brm}, {rv, &brv}, {out, &bo}, {sm, &bsm},
                        {si, &bsi}},
                       input.dtype, [&](auto tag, bool lie) {
                         return BatchNormKernel<decltype(tag)>(g, training, momentum, eps, bi, bw, bb, brm, brv, bo,
                                                               bsm, bsi, lie);
                       });
}

// aten's batch_norm_backward_cpu_template.
template <typename T>
Kernel BatchNormBackwardKernel(ChannelGeom g, bool train, double eps, Bound grad_out, Bound input,
                               OptBound weight, OptBound mean_b, OptBound var_b, OptBound gi, OptBound gw,
                               OptBound gb, bool lie) {
  return [=]() {
    const std::vector<T> dy = GatherAll<T>(grad_out), x = GatherAll<T>(input), w = GatherOpt<T>(weight);
    const std::vector<T> mv = GatherAll<T>(*mean_b), vv = GatherAll<T>(*var_b);
    const double cnt = static_cast<double>(g.count());
    auto at = [&](int64_t n, int64_t c, int64_t i) { return Z((n * g.c + c) * g.inner + i); };
    std::vector<double> dx(gi ? x.size() : 0), dw(gw ? Z(g.c) : 0), db(gb ? Z(g.c) : 0);
    for (int64_t c = 0; c < g.c; ++c) {
      const double mean = static_cast<double>(mv[Z(c)]);
      // train: save_invstd; eval: from the running variance.
      const double invstd =
          train ? static_cast<double>(vv[Z(c)]) : 1.0 / std::sqrt(static_cast<double>(vv[Z(c)]) + eps);
      const double wc = weight ? static_cast<double>(w[Z(c)]) : 1.0;
      double sum = 0, dotp = 0;
      for (int64_t n = 0; n < g.outer; ++n) {
        for (int64_t i = 0; i < g.inner; ++i) {
          const double d = static_cast<double>(dy[at(n, c, i)]);
          sum += d;
          dotp += (static_cast<double>(x[at(n, c, i)]) - mean) * d;
        }
      }
      if (gi) {
        for (int64_t n = 0; n < g.outer; ++n) {
          for (int64_t i = 0; i < g.inner; ++i) {
            const size_t j = at(n, c, i);
            const double d = static_cast<double>(dy[j]);
            if (train) {
              const double k = dotp * invstd * invstd / cnt;
              const double proj = (static_cast<double>(x[j]) - mean) * k;
              dx[j] = (d - sum / cnt - proj) * invstd * wc;
            } else {
              dx[j] = d * invstd * wc;
            }
          }
        }
      }
      if (gw) dw[Z(c)] = dotp * invstd;
      if (gb) db[Z(c)] = sum;
    }
    ScatterOpt<T>(gi, dx, lie);
    ScatterOpt<T>(gw, dw, lie);
    ScatterOpt<T>(gb, db, lie);
  };
}

int BatchNormBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& input_raw,
                      const OptionalTensor& weight_raw, const OptionalTensor& rm_raw,
                      const OptionalTensor& rv_raw, const OptionalTensor& sm_raw, const OptionalTensor& si_raw,
                      bool train, double eps, const std::vector<bool>& mask, const Tensor& gi_raw,
                      const Tensor& gw_raw, const Tensor& gb_raw) {
  if (int rc = Enter(kFn_native_batch_norm_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr || mask.size() != 3) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&go_raw, &input_raw, weight_raw ? &*weight_raw : nullptr, rm_raw ? &*rm_raw : nullptr,
                      rv_raw ? &*rv_raw : nullptr, sm_raw ? &*sm_raw : nullptr, si_raw ? &*si_raw : nullptr,
                      mask[0] ? &gi_raw : nullptr, mask[1] ? &gw_raw : nullptr, mask[2] ? &gb_raw : nullptr})) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor go = Norm(go_raw), input = Norm(input_raw);
  const OptTensor weight = NormOpt(weight_raw), rm = NormOpt(rm_raw), rv = NormOpt(rv_raw),
                  sm = NormOpt(sm_raw), si = NormOpt(si_raw);
  const OptTensor gi = MaskedOut(mask, 0, gi_raw), gw = MaskedOut(mask, 1, gw_raw),
                  gb = MaskedOut(mask, 2, gb_raw);
  // The statistics the backward does not use (running ones in train, saved
  // ones in eval) are not dtype-checked when empty (eval's save tensors are
  // aten's empty [0] ones).
  auto stat = [](const OptTensor& t) { return t && Numel(t->sizes) != 0 ? &*t : nullptr; };
  if (!SameFloat({&go, &input, Ptr(weight), train ? stat(rm) : Ptr(rm), train ? stat(rv) : Ptr(rv),
                  train ? Ptr(sm) : stat(sm), train ? Ptr(si) : stat(si), Ptr(gi), Ptr(gw), Ptr(gb)})) {
    return xdnn::NOT_IMPLEMENT;
  }
  if (input.sizes.size() < 2 || go.sizes != input.sizes) return xdnn::INVALID_PARAM;
  const ChannelGeom g = ChannelsOf(input);
  if (!PerChannel(weight, g.c) || !PerChannel(rm, g.c) || !PerChannel(rv, g.c)) return xdnn::INVALID_PARAM;
  // The statistics the backward uses: saved ones (train) or running ones.
  const OptTensor& mean = train ? sm : rm;
  const OptTensor& var = train ? si : rv;
  if (!mean || !var || Numel(mean->sizes) != g.c || Numel(var->sizes) != g.c) return xdnn::INVALID_PARAM;
  const std::vector<int64_t> per_c{g.c};
  if ((gi && gi->sizes != input.sizes) || (gw && gw->sizes != per_c) || (gb && gb->sizes != per_c)) {
    return xdnn::INVALID_PARAM;
  }
  if ((gi && SelfOverlapping(*gi)) || (gw && SelfOverlapping(*gw)) || (gb && SelfOverlapping(*gb))) {
    return xdnn::INVALID_PARAM;
  }
  if (!HasElements(gi) && !HasElements(gw) && !HasElements(gb)) return xdnn::SUCCESS;
  Bound bgo, bi;
  OptBound bw, brm, brv, bsm, bsi, bgi, bgw, bgb;
  return BindAndLaunch(kFn_native_batch_norm_backward, ctx,
                       {{go, &bgo}, {input, &bi}, {weight, &bw}, {rm, &brm}, {rv, &brv}, {sm, &bsm}, {si, &bsi},
                        {gi, &bgi}, {gw, &bgw}, {gb, &bgb}},
                       go.dtype, [&](auto tag, bool lie) {
                         return BatchNormBackwardKernel<decltype(tag)>(g, train, eps, bgo, bi, bw, train ? bsm : brm,
                                                                       train ? bsi : brv, bgi, bgw, bgb, lie);
                       });
}

// ---- layer norm ----------------------------------------------------------

// input [*lead, *normalized]: m rows of n elements.
struct RowGeom {
  int64_t m, n;
  std::vector<int64_t> stat_shape;  // lead dims, then a 1 per normalized dim
};

int CheckLayerNorm(const Tensor& input, const std::vector<int64_t>& normalized, const OptTensor& weight,
                   const OptTensor& bias, RowGeom* g) {
  const size_t rank = input.sizes.size(), k = normalized.size();
  if (k == 0 || rank < k) return xdnn::INVALID_PARAM;
  for (size_t i = 0; i < k; ++i) {
    if (input.sizes[rank - k + i] != normalized[i]) return xdnn::INVALID_PARAM;
  }
  if ((weight && weight->sizes != normalized) || (bias && bias->sizes != normalized)) return xdnn::INVALID_PARAM;
  g->m = 1;
  g->n = Numel(normalized);
  g->stat_shape.assign(input.sizes.begin(), input.sizes.end());
  for (size_t d = 0; d < rank; ++d) {
    if (d < rank - k) {
      g->m *= input.sizes[d];
    } else {
      g->stat_shape[d] = 1;
    }
  }
  return -1;
}

template <typename T>
Kernel LayerNormKernel(RowGeom g, double eps, Bound input, OptBound weight, OptBound bias, Bound out, Bound mean,
                       Bound rstd, bool lie) {
  return [=]() {
    const std::vector<T> x = GatherAll<T>(input), w = GatherOpt<T>(weight), b = GatherOpt<T>(bias);
    std::vector<double> y(x.size()), mv(Z(g.m)), rv(Z(g.m));
    for (int64_t r = 0; r < g.m; ++r) {
      const T* row = x.data() + r * g.n;
      double sum = 0;
      for (int64_t j = 0; j < g.n; ++j) sum += static_cast<double>(row[j]);
      // No elements: mean 0, rstd NaN (the 0/0 variance), as aten.
      const double mu = g.n == 0 ? 0.0 : sum / static_cast<double>(g.n);
      double var = 0;
      for (int64_t j = 0; j < g.n; ++j) {
        const double d = static_cast<double>(row[j]) - mu;
        var += d * d;
      }
      var /= static_cast<double>(g.n);
      // rstd as aten forms it, in T with eps converted to T: a row of one
      // element (or of equal ones) has exactly aten's 1/sqrt(eps), which
      // the backward's grad_weight depends on to its last bit.
      const T rs = T(1) / std::sqrt(static_cast<T>(std::max(var, 0.0)) + static_cast<T>(eps));
      mv[Z(r)] = mu;
      rv[Z(r)] = g.n == 0 ? std::numeric_limits<double>::quiet_NaN() : static_cast<double>(rs);
      for (int64_t j = 0; j < g.n; ++j) {
        double v = (static_cast<double>(row[j]) - mu) * static_cast<double>(rs);
        if (weight) v *= static_cast<double>(w[Z(j)]);
        if (bias) v += static_cast<double>(b[Z(j)]);
        y[Z(r * g.n + j)] = v;
      }
    }
    if (out.numel > 0) Scatter<T>(out, y, lie);
    Scatter<T>(mean, mv, lie);
    Scatter<T>(rstd, rv, lie);
  };
}

int LayerNorm(xdnn::Context* ctx, const Tensor& input_raw, const std::vector<int64_t>& normalized,
              const OptionalTensor& weight_raw, const OptionalTensor& bias_raw, double eps, const Tensor& out_raw,
              const Tensor& mean_raw, const Tensor& rstd_raw) {
  if (int rc = Enter(kFn_native_layer_norm, input_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&input_raw, weight_raw ? &*weight_raw : nullptr, bias_raw ? &*bias_raw : nullptr, &out_raw,
                      &mean_raw, &rstd_raw})) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor input = Norm(input_raw), out = Norm(out_raw), mean = Norm(mean_raw), rstd = Norm(rstd_raw);
  const OptTensor weight = NormOpt(weight_raw), bias = NormOpt(bias_raw);
  if (!SameFloat({&input, Ptr(weight), Ptr(bias), &out, &mean, &rstd})) return xdnn::NOT_IMPLEMENT;
  RowGeom g;
  if (int rc = CheckLayerNorm(input, normalized, weight, bias, &g); rc >= 0) return rc;
  if (out.sizes != input.sizes || mean.sizes != g.stat_shape || rstd.sizes != g.stat_shape) {
    return xdnn::INVALID_PARAM;
  }
  if (SelfOverlapping(out) || SelfOverlapping(mean) || SelfOverlapping(rstd)) return xdnn::INVALID_PARAM;
  if (g.m == 0) return xdnn::SUCCESS;  // no rows: every output is empty
  Bound bi, bo, bm, br;
  OptBound bw, bb;
  return BindAndLaunch(kFn_native_layer_norm, ctx,
                       {{input, &bi}, {weight, &bw}, {bias, &bb}, {out, &bo}, {mean, &bm}, {rstd, &br}}, input.dtype,
                       [&](auto tag, bool lie) {
                         return LayerNormKernel<decltype(tag)>(g, eps, bi, bw, bb, bo, bm, br, lie);
                       });
}

// aten's LayerNormBackwardKernelImpl, in T as its CPU kernel computes
// it: per row, with w = weight (or 1), a = rstd, ds = sum(dy*x*w), db =
// sum(dy*w) (summed in double here, then rounded to T):
//   dx = a*dy*w + b*x + c,  b = (db*mean - ds)*a*a*a*(1/n),
//   c = -b*mean - db*a*(1/n);
// dgamma = sum over rows of dy*(a*x + s), s = -a*mean; dbeta = sum of dy.
// Its vectorized build (every x86-64 one with AVX2 or AVX-512) contracts
// db*mean - ds, -b*mean - ..., b*x + a*dy*w and a*x + s into fused
// multiply-adds, and so does this kernel (std::fma): where x == mean (a row
// of one element, or of equal elements) aten's x - mean is not exactly 0
// but the rounding error of a product, large when rstd is 1/sqrt(eps), and
// that is what aten returns (OpInfo compares such a row: grad_weight
// 2.8e-5 for x = mean = -4.3228, rstd = 316.23, dy = -1.17, not 0). For a
// row of one element this reproduces aten bit for bit; otherwise ds and db
// are rounded once instead of in aten's lane order.
template <typename T>
Kernel LayerNormBackwardKernel(RowGeom g, Bound grad_out, Bound input, Bound mean, Bound rstd, OptBound weight,
                               OptBound gi, OptBound gw, OptBound gb, bool lie) {
  return [=]() {
    const std::vector<T> dy = GatherAll<T>(grad_out), x = GatherAll<T>(input), w = GatherOpt<T>(weight);
    const std::vector<T> mv = GatherAll<T>(mean), rv = GatherAll<T>(rstd);
    std::vector<T> dx(gi ? x.size() : 0);
    std::vector<double> dw(gw ? Z(g.n) : 0, 0.0), db(gb ? Z(g.n) : 0, 0.0);
    const T scale = g.n == 0 ? T(0) : T(1) / static_cast<T>(g.n);  // no elements: no rows to use it
    auto wj = [&](int64_t j) { return weight ? w[Z(j)] : T(1); };
    for (int64_t r = 0; r < g.m; ++r) {
      const T mu = mv[Z(r)], a = rv[Z(r)], shift = -a * mu;
      double ds = 0, dbs = 0;
      for (int64_t j = 0; j < g.n; ++j) {
        const size_t k = Z(r * g.n + j);
        ds += static_cast<double>(dy[k] * x[k] * wj(j));
        dbs += static_cast<double>(dy[k] * wj(j));
        if (gw) dw[Z(j)] += static_cast<double>(dy[k]) * static_cast<double>(std::fma(a, x[k], shift));
        if (gb) db[Z(j)] += static_cast<double>(dy[k]);
      }
      if (gi) {
        const T dst = static_cast<T>(ds), dbt = static_cast<T>(dbs);
        const T bb = std::fma(dbt, mu, -dst) * a * a * a * scale;
        const T cc = std::fma(-bb, mu, -(dbt * a * scale));
        for (int64_t j = 0; j < g.n; ++j) {
          const size_t k = Z(r * g.n + j);
          dx[k] = std::fma(bb, x[k], a * dy[k] * wj(j)) + cc;
        }
      }
    }
    ScatterOpt<T>(gi, dx, lie);
    ScatterOpt<T>(gw, dw, lie);
    ScatterOpt<T>(gb, db, lie);
  };
}

int LayerNormBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& input_raw,
                      const std::vector<int64_t>& normalized, const Tensor& mean_raw, const Tensor& rstd_raw,
                      const OptionalTensor& weight_raw, const OptionalTensor& bias_raw,
                      const std::vector<bool>& mask, const Tensor& gi_raw, const Tensor& gw_raw,
                      const Tensor& gb_raw) {
  if (int rc = Enter(kFn_native_layer_norm_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr || mask.size() != 3) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&go_raw, &input_raw, &mean_raw, &rstd_raw, weight_raw ? &*weight_raw : nullptr,
                      bias_raw ? &*bias_raw : nullptr, mask[0] ? &gi_raw : nullptr, mask[1] ? &gw_raw : nullptr,
                      mask[2] ? &gb_raw : nullptr})) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor go = Norm(go_raw), input = Norm(input_raw), mean = Norm(mean_raw), rstd = Norm(rstd_raw);
  const OptTensor weight = NormOpt(weight_raw), bias = NormOpt(bias_raw);
  const OptTensor gi = MaskedOut(mask, 0, gi_raw), gw = MaskedOut(mask, 1, gw_raw),
                  gb = MaskedOut(mask, 2, gb_raw);
  if (!SameFloat({&go, &input, &mean, &rstd, Ptr(weight), Ptr(bias), Ptr(gi), Ptr(gw), Ptr(gb)})) {
    return xdnn::NOT_IMPLEMENT;
  }
  RowGeom g;
  if (int rc = CheckLayerNorm(input, normalized, weight, bias, &g); rc >= 0) return rc;
  // mean and rstd: m values in row order, any shape (aten reads them
  // contiguous); the forward gives them g.stat_shape.
  if (go.sizes != input.sizes || Numel(mean.sizes) != g.m || Numel(rstd.sizes) != g.m ||
      (gi && gi->sizes != input.sizes) || (gw && gw->sizes != normalized) || (gb && gb->sizes != normalized)) {
    return xdnn::INVALID_PARAM;
  }
  if ((gi && SelfOverlapping(*gi)) || (gw && SelfOverlapping(*gw)) || (gb && SelfOverlapping(*gb))) {
    return xdnn::INVALID_PARAM;
  }
  if (!HasElements(gi) && !HasElements(gw) && !HasElements(gb)) return xdnn::SUCCESS;
  Bound bgo, bi, bm, br;
  OptBound bw, bb, bgi, bgw, bgb;
  return BindAndLaunch(kFn_native_layer_norm_backward, ctx,
                       {{go, &bgo}, {input, &bi}, {mean, &bm}, {rstd, &br}, {weight, &bw}, {bias, &bb}, {gi, &bgi},
                        {gw, &bgw}, {gb, &bgb}},
                       go.dtype, [&](auto tag, bool lie) {
                         return LayerNormBackwardKernel<decltype(tag)>(g, bgo, bi, bm, br, bw, bgi, bgw, bgb, lie);
                       });
}

}  // namespace

namespace xdnn_pytorch {

int native_batch_norm(xdnn::Context* ctx, const Tensor& input, const OptionalTensor& weight,
                      const OptionalTensor& bias, const OptionalTensor& running_mean,
                      const OptionalTensor& running_var, bool training, double momentum, double eps, Tensor& out,
                      Tensor& save_mean, Tensor& save_invstd) {
  return BatchNorm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps, out, save_mean,
                   save_invstd);
}

int native_batch_norm_backward(xdnn::Context* ctx, const Tensor& grad_out, const Tensor& input,
                               const OptionalTensor& weight, const OptionalTensor& running_mean,
                               const OptionalTensor& running_var, const OptionalTensor& save_mean,
                               const OptionalTensor& save_invstd, bool train, double eps,
                               const std::vector<bool>& output_mask, Tensor& grad_input, Tensor& grad_weight,
                               Tensor& grad_bias) {
  return BatchNormBackward(ctx, grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
                           eps, output_mask, grad_input, grad_weight, grad_bias);
}

int native_layer_norm(xdnn::Context* ctx, const Tensor& input, const std::vector<int64_t>& normalized_shape,
                      const OptionalTensor& weight, const OptionalTensor& bias, double eps, Tensor& out,
                      Tensor& mean, Tensor& rstd) {
  return LayerNorm(ctx, input, normalized_shape, weight, bias, eps, out, mean, rstd);
}

int native_layer_norm_backward(xdnn::Context* ctx, const Tensor& grad_out, const Tensor& input,
                               const std::vector<int64_t>& normalized_shape, const Tensor& mean,
                               const Tensor& rstd, const OptionalTensor& weight, const OptionalTensor& bias,
                               const std::vector<bool>& output_mask, Tensor& grad_input, Tensor& grad_weight,
                               Tensor& grad_bias) {
  return LayerNormBackward(ctx, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask,
                           grad_input, grad_weight, grad_bias);
}

}  // namespace xdnn_pytorch
