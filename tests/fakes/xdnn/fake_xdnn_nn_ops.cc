// The fake libxdnn_pytorch's convolution, normalisation, pooling, embedding
// and activation ops, with cat and where (the header's block after "----
// convolution, normalisation, pooling, embedding, activations"). Test-only;
// see README.md. Same discipline as fake_xdnn_pytorch.cc (the shared parts
// are in fake_xdnn_internal.h): every check at issue, on the calling thread,
// then ONE kernel on the context's stream that reads every input before it
// writes any output. The arithmetic follows ATen's CPU kernels (PyTorch
// 2.13), accumulating in double.
//
// Outputs an op computes only on request (output_mask) are ignored
// entirely when not requested: not checked, not translated, not written, so
// their data may be nullptr.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fake_xdnn_internal.h"

using namespace fake_xdnn;  // NOLINT: the shared internals (fake_xdnn_internal.h)

namespace {

// ---- helpers -------------------------------------------------------------

using Pair = std::array<int64_t, 2>;
using OptTensor = std::optional<Tensor>;
using OptBound = std::optional<Bound>;

// aten's expand_param_if_needed: one value for both spatial dims, or two.
bool ToPair(const std::vector<int64_t>& v, Pair* out) {
  if (v.size() == 1) {
    *out = {v[0], v[0]};
    return true;
  }
  if (v.size() == 2) {
    *out = {v[0], v[1]};
    return true;
  }
  return false;
}

OptTensor NormOpt(const OptionalTensor& t) {
  if (!t) return std::nullopt;
  return Norm(*t);
}

// Every listed tensor (nullptr: absent) well formed.
bool AllWellFormed(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t != nullptr && !WellFormed(*t)) return false;
  }
  return true;
}

const Tensor* Ptr(const OptTensor& t) { return t ? &*t : nullptr; }

// SameFloatDtype over the present tensors (nullptr: absent); the first is
// present.
bool SameFloat(std::initializer_list<const Tensor*> ts) {
  const ScalarType first = (*ts.begin())->dtype;
  if (!IsFloat(first)) return false;
  for (const Tensor* t : ts) {
    if (t != nullptr && t->dtype != first) return false;
  }
  return true;
}

bool IsIndex(ScalarType t) { return t == ScalarType::kint64 || t == ScalarType::kint32; }

bool HasElements(const OptTensor& t) { return t && Numel(t->sizes) > 0; }

// The requested outputs of a backward (output_mask[i]), normalised.
bool Masked(const std::vector<bool>& mask, size_t i) { return i < mask.size() && mask[i]; }

OptTensor MaskedOut(const std::vector<bool>& mask, size_t i, const Tensor& t) {
  if (!Masked(mask, i)) return std::nullopt;
  return Norm(t);
}

template <typename T>
std::vector<T> GatherAll(const Bound& b) {
  return Gather<T>(b, b.sizes);
}

template <typename T>
std::vector<T> GatherOpt(const OptBound& b) {
  return b ? GatherAll<T>(*b) : std::vector<T>{};
}

std::vector<int64_t> GatherIndex(const Bound& b) {
  if (b.dtype == ScalarType::kint32) {
    const std::vector<int32_t> v = GatherAll<int32_t>(b);
    return std::vector<int64_t>(v.begin(), v.end());
  }
  return GatherAll<int64_t>(b);
}

template <typename T, typename V>
void ScatterOpt(const OptBound& b, const V& values, bool lie) {
  if (b && b->numel > 0) Scatter<T>(*b, values, lie);
}

// Writes values[j] to out's j-th element (row-major) where keep(j); the
// other elements are left as they are.
template <typename T, typename V, typename Keep>
void ScatterIf(const Bound& out, const V& values, bool lie, Keep keep) {
  const int64_t is = ItemSize(out.dtype);
  int64_t j = 0;
  ForEachIndex<1>(out.sizes, {out.strides}, [&](const std::array<int64_t, 1>& off) {
    const int64_t k = j++;
    if (!keep(k)) return;
    const T v = static_cast<T>(values[static_cast<size_t>(k)]);
    Store<T>(out.base + off[0] * is, lie ? Lie(v) : v);
  });
}

size_t Z(int64_t i) { return static_cast<size_t>(i); }

// ---- convolution ---------------------------------------------------------

// A 2-d convolution's geometry: input [n,c,h,w], weight [o, c/groups, kh,
// kw], output [n,o,ho,wo].
struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, ho, wo, groups;
  Pair stride, pad, dil;
};

// aten's check_shape_forward for a non-transposed 2-d convolution;
// INVALID_PARAM or -1.
int CheckConv(const Tensor& input, const Tensor& weight, const std::vector<int64_t>& stride,
              const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
              const std::vector<int64_t>& output_padding, int64_t groups, ConvGeom* g) {
  if (input.sizes.size() != 4 || weight.sizes.size() != 4) return xdnn::INVALID_PARAM;
  Pair opad;
  if (!ToPair(stride, &g->stride) || !ToPair(padding, &g->pad) || !ToPair(dilation, &g->dil) ||
      !ToPair(output_padding, &opad)) {
    return xdnn::INVALID_PARAM;
  }
  for (int i = 0; i < 2; ++i) {
    if (g->stride[i] <= 0 || g->dil[i] <= 0 || g->pad[i] < 0 || opad[i] < 0) return xdnn::INVALID_PARAM;
  }
  if (groups <= 0) return xdnn::INVALID_PARAM;
  g->groups = groups;
  g->n = input.sizes[0];
  g->c = input.sizes[1];
  g->h = input.sizes[2];
  g->w = input.sizes[3];
  g->o = weight.sizes[0];
  g->kh = weight.sizes[2];
  g->kw = weight.sizes[3];
  if (g->o < groups || g->o % groups != 0 || weight.sizes[1] * groups != g->c) return xdnn::INVALID_PARAM;
  // "Kernel size can't be greater than actual input size".
  const int64_t eff_h = g->dil[0] * (g->kh - 1) + 1, eff_w = g->dil[1] * (g->kw - 1) + 1;
  if (g->kh <= 0 || g->kw <= 0 || g->h + 2 * g->pad[0] < eff_h || g->w + 2 * g->pad[1] < eff_w) {
    return xdnn::INVALID_PARAM;
  }
  g->ho = (g->h + 2 * g->pad[0] - eff_h) / g->stride[0] + 1;
  g->wo = (g->w + 2 * g->pad[1] - eff_w) / g->stride[1] + 1;
  return -1;
}

// Calls f(n, o, oh, ow, ci, ki, x_index, w_index) for every product term of
// the convolution: x_index into the row-major input, w_index into the
// row-major weight, ci the input channel, ki the flat kernel position.
template <typename F>
void ForEachConvTerm(const ConvGeom& g, F&& f) {
  const int64_t og = g.o / g.groups, cg = g.c / g.groups;
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t o = 0; o < g.o; ++o) {
      const int64_t grp = o / og;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const int64_t out_index = ((n * g.o + o) * g.ho + oh) * g.wo + ow;
          for (int64_t q = 0; q < cg; ++q) {
            const int64_t ci = grp * cg + q;
            for (int64_t a = 0; a < g.kh; ++a) {
              const int64_t ih = oh * g.stride[0] - g.pad[0] + a * g.dil[0];
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t b = 0; b < g.kw; ++b) {
                const int64_t iw = ow * g.stride[1] - g.pad[1] + b * g.dil[1];
                if (iw < 0 || iw >= g.w) continue;
                f(out_index, ((n * g.c + ci) * g.h + ih) * g.w + iw, ((o * cg + q) * g.kh + a) * g.kw + b);
              }
            }
          }
        }
      }
    }
  }
}

template <typename T>
Kernel ConvKernel(ConvGeom g, Bound input, Bound weight, OptBound bias, Bound out, bool lie) {
  return [=]() {
    const std::vector<T> x = GatherAll<T>(input), w = GatherAll<T>(weight), b = GatherOpt<T>(bias);
    std::vector<double> acc(Z(g.n * g.o * g.ho * g.wo), 0.0);
    ForEachConvTerm(g, [&](int64_t oi, int64_t xi, int64_t wi) {
      acc[Z(oi)] += static_cast<double>(x[Z(xi)]) * static_cast<double>(w[Z(wi)]);
    });
    if (bias) {
      const int64_t plane = g.ho * g.wo;
      for (size_t i = 0; i < acc.size(); ++i) {
        acc[i] += static_cast<double>(b[Z((static_cast<int64_t>(i) / plane) % g.o)]);
      }
    }
    Scatter<T>(out, acc, lie);
  };
}

int Convolution(xdnn::Context* ctx, const Tensor& input_raw, const Tensor& weight_raw,
                const OptionalTensor& bias_raw, const std::vector<int64_t>& stride,
                const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool transposed,
                const std::vector<int64_t>& output_padding, int64_t groups, const Tensor& out_raw) {
  if (int rc = Enter(kFn_convolution, input_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&input_raw, &weight_raw, bias_raw ? &*bias_raw : nullptr, &out_raw})) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor input = Norm(input_raw), weight = Norm(weight_raw), out = Norm(out_raw);
  const OptTensor bias = NormOpt(bias_raw);
  // transposed: a deconvolution, which the fake lacks.
  if (!SameFloat({&input, &weight, Ptr(bias), &out}) || transposed) return xdnn::NOT_IMPLEMENT;
  ConvGeom g;
  if (int rc = CheckConv(input, weight, stride, padding, dilation, output_padding, groups, &g); rc >= 0) {
    return rc;
  }
  if (bias && bias->sizes != std::vector<int64_t>{g.o}) return xdnn::INVALID_PARAM;
  if (out.sizes != std::vector<int64_t>{g.n, g.o, g.ho, g.wo} || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bi, bw, bo;
  OptBound bb;
  return BindAndLaunch(kFn_convolution, ctx, {{input, &bi}, {weight, &bw}, {bias, &bb}, {out, &bo}}, out.dtype,
                       [&](auto tag, bool lie) { return ConvKernel<decltype(tag)>(g, bi, bw, bb, bo, lie); });
}

template <typename T>
Kernel ConvBackwardKernel(ConvGeom g, Bound grad_output, Bound input, Bound weight, OptBound gi,
                          OptBound gw, OptBound gb, bool lie) {
  return [=]() {
    const std::vector<T> go = GatherAll<T>(grad_output);
    const std::vector<T> x = gw ? GatherAll<T>(input) : std::vector<T>{};
    const std::vector<T> w = gi ? GatherAll<T>(weight) : std::vector<T>{};
    std::vector<double> dx(gi ? Z(g.n * g.c * g.h * g.w) : 0, 0.0);
    std::vector<double> dw(gw ? Z(g.o * (g.c / g.groups) * g.kh * g.kw) : 0, 0.0);
    std::vector<double> db(gb ? Z(g.o) : 0, 0.0);
    if (gi || gw) {
      ForEachConvTerm(g, [&](int64_t oi, int64_t xi, int64_t wi) {
        const double d = static_cast<double>(go[Z(oi)]);
        if (gi) dx[Z(xi)] += d * static_cast<double>(w[Z(wi)]);
        if (gw) dw[Z(wi)] += d * static_cast<double>(x[Z(xi)]);
      });
    }
    if (gb) {
      const int64_t plane = g.ho * g.wo;
      for (size_t i = 0; i < go.size(); ++i) {
        db[Z((static_cast<int64_t>(i) / plane) % g.o)] += static_cast<double>(go[i]);
      }
    }
    ScatterOpt<T>(gi, dx, lie);
    ScatterOpt<T>(gw, dw, lie);
    ScatterOpt<T>(gb, db, lie);
  };
}

int ConvolutionBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& input_raw,
                        const Tensor& weight_raw, const std::vector<int64_t>& stride,
                        const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                        bool transposed, const std::vector<int64_t>& output_padding, int64_t groups,
                        const std::vector<bool>& mask, const Tensor& gi_raw, const Tensor& gw_raw,
                        const Tensor& gb_raw) {
  if (int rc = Enter(kFn_convolution_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr || mask.size() != 3) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&go_raw, &input_raw, &weight_raw, mask[0] ? &gi_raw : nullptr,
                      mask[1] ? &gw_raw : nullptr, mask[2] ? &gb_raw : nullptr})) {
    return xdnn::INVALID_PARAM;
  }
  const Tensor go = Norm(go_raw), input = Norm(input_raw), weight = Norm(weight_raw);
  const OptTensor gi = MaskedOut(mask, 0, gi_raw), gw = MaskedOut(mask, 1, gw_raw),
                  gb = MaskedOut(mask, 2, gb_raw);
  if (!SameFloat({&go, &input, &weight, Ptr(gi), Ptr(gw), Ptr(gb)}) || transposed) return xdnn::NOT_IMPLEMENT;
  ConvGeom g;
  if (int rc = CheckConv(input, weight, stride, padding, dilation, output_padding, groups, &g); rc >= 0) {
    return rc;
  }
  if (go.sizes != std::vector<int64_t>{g.n, g.o, g.ho, g.wo} || (gi && gi->sizes != input.sizes) ||
      (gw && gw->sizes != weight.sizes) || (gb && gb->sizes != std::vector<int64_t>{g.o})) {
    return xdnn::INVALID_PARAM;
  }
  if ((gi && SelfOverlapping(*gi)) || (gw && SelfOverlapping(*gw)) || (gb && SelfOverlapping(*gb))) {
    return xdnn::INVALID_PARAM;
  }
  if (!HasElements(gi) && !HasElements(gw) && !HasElements(gb)) return xdnn::SUCCESS;
  Bound bgo, bi, bw;
  OptBound bgi, bgw, bgb;
  return BindAndLaunch(kFn_convolution_backward, ctx,
                       {{go, &bgo}, {input, &bi}, {weight, &bw}, {gi, &bgi}, {gw, &bgw}, {gb, &bgb}}, go.dtype,
                       [&](auto tag, bool lie) {
                         return ConvBackwardKernel<decltype(tag)>(g, bgo, bi, bw, bgi, bgw, bgb, lie);
                       });
}

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

// ---- softmax -------------------------------------------------------------

template <typename T>
Kernel SoftmaxKernel(Bound self, Along g, Bound out, bool lie) {
  return [=]() {
    const std::vector<T> x = GatherAll<T>(self);
    std::vector<T> res(x.size());
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t i = 0; i < g.inner; ++i) {
        auto at = [&](int64_t j) { return Z((o * g.len + j) * g.inner + i); };
        T mx = -std::numeric_limits<T>::infinity();
        bool nan = false;  // a NaN anywhere makes the whole slice NaN, as in aten
        for (int64_t j = 0; j < g.len; ++j) {
          mx = std::max(mx, x[at(j)]);
          nan = nan || std::isnan(x[at(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < g.len; ++j) sum += std::exp(static_cast<double>(x[at(j)]) - mx);
        for (int64_t j = 0; j < g.len; ++j) {
          res[at(j)] = nan ? std::numeric_limits<T>::quiet_NaN()
                           : static_cast<T>(std::exp(static_cast<double>(x[at(j)]) - mx) / sum);
        }
      }
    }
    Scatter<T>(out, res, lie);
  };
}

// grad_input = output * (grad - sum(grad * output, dim)).
template <typename T>
Kernel SoftmaxBackwardKernel(Bound grad, Bound output, Along g, Bound out, bool lie) {
  return [=]() {
    const std::vector<T> go = GatherAll<T>(grad), y = GatherAll<T>(output);
    std::vector<T> res(go.size());
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t i = 0; i < g.inner; ++i) {
        auto at = [&](int64_t j) { return Z((o * g.len + j) * g.inner + i); };
        double dot = 0;
        for (int64_t j = 0; j < g.len; ++j) dot += static_cast<double>(go[at(j)]) * static_cast<double>(y[at(j)]);
        for (int64_t j = 0; j < g.len; ++j) {
          res[at(j)] = static_cast<T>(static_cast<double>(y[at(j)]) * (static_cast<double>(go[at(j)]) - dot));
        }
      }
    }
    Scatter<T>(out, res, lie);
  };
}

// ---- embedding -----------------------------------------------------------

// `t` is indices.sizes followed by `d`; a 0-dim index (sent as {1}) also
// allows plain {d}.
bool IndexedShape(const std::vector<int64_t>& t, const Tensor& indices, const Tensor& indices_raw, int64_t d) {
  std::vector<int64_t> want = indices.sizes;
  want.push_back(d);
  if (t == want) return true;
  return (indices_raw.sizes.empty() || IsScalarShape(indices)) && t == std::vector<int64_t>{d};
}

template <typename T>
Kernel EmbeddingKernel(Bound weight, Bound indices, Bound out, bool lie) {
  return [=]() {
    const int64_t rows = weight.sizes[0], d = weight.sizes[1];
    const std::vector<int64_t> idx = GatherIndex(indices);
    const int64_t is = ItemSize(weight.dtype);
    std::vector<T> res(Z(out.numel), T(0));
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] < 0 || idx[i] >= rows) continue;
      for (int64_t j = 0; j < d; ++j) {
        res[i * Z(d) + Z(j)] = Load<T>(weight.base + (idx[i] * weight.strides[0] + j * weight.strides[1]) * is);
      }
    }
    // An index outside [0, rows) (aten raises) is only visible here: its
    // row of `out` is skipped, left as it was.
    ScatterIf<T>(out, res, lie, [&](int64_t k) {
      const int64_t v = idx[Z(k / d)];
      return v >= 0 && v < rows;
    });
  };
}

int Embedding(xdnn::Context* ctx, const Tensor& weight_raw, const Tensor& indices_raw, int64_t padding_idx,
              bool scale_grad_by_freq, bool sparse, const Tensor& out_raw) {
  // padding_idx, scale_grad_by_freq and sparse change only the backward.
  (void)padding_idx;
  (void)scale_grad_by_freq;
  (void)sparse;
  if (int rc = Enter(kFn_embedding, weight_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(weight_raw) || !WellFormed(indices_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor weight = Norm(weight_raw), indices = Norm(indices_raw), out = Norm(out_raw);
  if (!SameFloatDtype({&weight, &out}) || !IsIndex(indices.dtype)) return xdnn::NOT_IMPLEMENT;
  if (weight.sizes.size() != 2 || !IndexedShape(out.sizes, indices, indices_raw, weight.sizes[1]) ||
      SelfOverlapping(out)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  Bound bw, bi, bo;
  return BindAndLaunch(kFn_embedding, ctx, {{weight, &bw}, {indices, &bi}, {out, &bo}}, out.dtype,
                       [&](auto tag, bool lie) { return EmbeddingKernel<decltype(tag)>(bw, bi, bo, lie); });
}

// aten's embedding_dense_backward_cpu: grad_weight zeroed, then row
// indices[i] += grad_output row i, except rows equal to padding_idx; an
// index outside [0, num_weights) is skipped.
template <typename T>
Kernel EmbeddingBackwardKernel(Bound grad, Bound indices, int64_t padding_idx, Bound gw, bool lie) {
  return [=]() {
    const int64_t rows = gw.sizes[0], d = gw.sizes[1];
    const std::vector<int64_t> idx = GatherIndex(indices);
    const std::vector<T> go = GatherAll<T>(grad);
    std::vector<double> acc(Z(rows * d), 0.0);
    for (size_t i = 0; i < idx.size(); ++i) {
      const int64_t r = idx[i];
      if (r < 0 || r >= rows || r == padding_idx) continue;
      for (int64_t j = 0; j < d; ++j) acc[Z(r * d + j)] += static_cast<double>(go[i * Z(d) + Z(j)]);
    }
    Scatter<T>(gw, acc, lie);
  };
}

int EmbeddingDenseBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& indices_raw,
                           int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq,
                           const Tensor& gw_raw) {
  if (int rc = Enter(kFn_embedding_dense_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(go_raw) || !WellFormed(indices_raw) || !WellFormed(gw_raw)) return xdnn::INVALID_PARAM;
  const Tensor go = Norm(go_raw), indices = Norm(indices_raw), gw = Norm(gw_raw);
  // scale_grad_by_freq: each row divided by its index's count, which the
  // fake lacks.
  if (!SameFloatDtype({&go, &gw}) || !IsIndex(indices.dtype) || scale_grad_by_freq) return xdnn::NOT_IMPLEMENT;
  const int64_t d = go.sizes.back();
  if (num_weights < 0 || gw.sizes != std::vector<int64_t>{num_weights, d} ||
      !IndexedShape(go.sizes, indices, indices_raw, d) || SelfOverlapping(gw)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(gw.sizes) == 0) return xdnn::SUCCESS;
  Bound bg, bi, bw;
  return BindAndLaunch(kFn_embedding_dense_backward, ctx, {{go, &bg}, {indices, &bi}, {gw, &bw}}, gw.dtype,
                       [&](auto tag, bool lie) {
                         return EmbeddingBackwardKernel<decltype(tag)>(bg, bi, padding_idx, bw, lie);
                       });
}

// ---- gelu ----------------------------------------------------------------

// aten's GeluType: "none" (erf) or "tanh"; -1 for anything else.
int GeluType(const std::string& approximate) {
  if (approximate == "none") return 0;
  if (approximate == "tanh") return 1;
  return -1;
}

constexpr double kSqrt1_2 = 0.70710678118654752440;          // M_SQRT1_2
constexpr double kBeta = 0.79788456080286535588;             // sqrt(2/pi): M_SQRT2 * M_2_SQRTPI * 0.5
constexpr double kAlpha = 0.39894228040143267794;            // 1/sqrt(2*pi): M_2_SQRTPI * M_SQRT1_2 * 0.5
constexpr double kKappa = 0.044715;

double Gelu(double x, bool tanh_form) {
  if (tanh_form) return 0.5 * x * (1 + std::tanh(kBeta * (x + kKappa * x * x * x)));
  return x * 0.5 * (1 + std::erf(x * kSqrt1_2));
}

double GeluGrad(double dy, double x, bool tanh_form) {
  if (tanh_form) {
    const double x_sq = x * x, inner = kBeta * (x + kKappa * x_sq * x), t = std::tanh(inner);
    const double left = 0.5 * x, right = 1 + t;
    const double left_derivative = 0.5 * right;
    const double right_derivative = left * (1 - t * t) * kBeta * (1 + 3 * kKappa * x_sq);
    return dy * (left_derivative + right_derivative);
  }
  const double cdf = 0.5 * (1 + std::erf(x * kSqrt1_2));
  const double pdf = kAlpha * std::exp(-0.5 * x * x);
  return dy * (cdf + x * pdf);
}

// ---- max_pool2d ------------------------------------------------------------

// A 2-d pooling's geometry over `planes` planes of [h, w] -> [ho, wo].
struct PoolGeom {
  int64_t planes, h, w, ho, wo;
  Pair kernel, stride, pad, dil;
  std::vector<int64_t> lead;  // the dims before [h, w]
};

// aten's pooling_output_shape (div_rtn: floor division).
int64_t PoolOutputSize(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  const int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  // In ceil mode the last window must start inside the input or left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// aten's max_pool2d_with_indices argument and shape checks (input [C,H,W]
// or [N,C,H,W], H, W and C non-zero).
int CheckMaxPool(const Tensor& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                 const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool ceil_mode,
                 PoolGeom* g) {
  if (!ToPair(kernel_size, &g->kernel) || !ToPair(padding, &g->pad) || !ToPair(dilation, &g->dil)) {
    return xdnn::INVALID_PARAM;
  }
  if (stride.empty()) {
    g->stride = g->kernel;  // aten: an empty stride is the kernel size
  } else if (!ToPair(stride, &g->stride)) {
    return xdnn::INVALID_PARAM;
  }
  for (int i = 0; i < 2; ++i) {
    if (g->kernel[i] <= 0 || g->stride[i] <= 0 || g->dil[i] <= 0 || g->pad[i] < 0) return xdnn::INVALID_PARAM;
    // "pad should be at most half of effective kernel size".
    if (g->pad[i] > ((g->kernel[i] - 1) * g->dil[i] + 1) / 2) return xdnn::INVALID_PARAM;
  }
  const size_t rank = self.sizes.size();
  if (rank != 3 && rank != 4) return xdnn::INVALID_PARAM;
  for (size_t d = rank - 3; d < rank; ++d) {
    if (self.sizes[d] == 0) return xdnn::INVALID_PARAM;
  }
  g->lead.assign(self.sizes.begin(), self.sizes.end() - 2);
  g->planes = Numel(g->lead);
  g->h = self.sizes[rank - 2];
  g->w = self.sizes[rank - 1];
  g->ho = PoolOutputSize(g->h, g->kernel[0], g->pad[0], g->stride[0], g->dil[0], ceil_mode);
  g->wo = PoolOutputSize(g->w, g->kernel[1], g->pad[1], g->stride[1], g->dil[1], ceil_mode);
  if (g->ho < 1 || g->wo < 1) return xdnn::INVALID_PARAM;  // "Output size is too small"
  return -1;
}

std::vector<int64_t> PooledShape(const PoolGeom& g) {
  std::vector<int64_t> s = g.lead;
  s.push_back(g.ho);
  s.push_back(g.wo);
  return s;
}

// aten's cpu_max_pool: the window clipped to the input (padding reads as
// -inf), the first maximum wins, a NaN always does (the last one); a window
// of only -inf gives its first in-bounds position.
template <typename T>
Kernel MaxPoolKernel(PoolGeom g, Bound self, Bound out, Bound indices, bool lie) {
  return [=]() {
    const std::vector<T> x = GatherAll<T>(self);
    std::vector<T> res(Z(g.planes * g.ho * g.wo));
    std::vector<int64_t> idx(res.size());
    for (int64_t p = 0; p < g.planes; ++p) {
      const T* plane = x.data() + p * g.h * g.w;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          int64_t ih0 = oh * g.stride[0] - g.pad[0], iw0 = ow * g.stride[1] - g.pad[1];
          const int64_t ih1 = std::min(ih0 + (g.kernel[0] - 1) * g.dil[0] + 1, g.h);
          const int64_t iw1 = std::min(iw0 + (g.kernel[1] - 1) * g.dil[1] + 1, g.w);
          while (ih0 < 0) ih0 += g.dil[0];
          while (iw0 < 0) iw0 += g.dil[1];
          int64_t best = ih0 * g.w + iw0;
          T maxval = -std::numeric_limits<T>::infinity();
          for (int64_t ih = ih0; ih < ih1; ih += g.dil[0]) {
            for (int64_t iw = iw0; iw < iw1; iw += g.dil[1]) {
              const T v = plane[ih * g.w + iw];
              if (v > maxval || std::isnan(v)) {
                maxval = v;
                best = ih * g.w + iw;
              }
            }
          }
          const size_t o = Z((p * g.ho + oh) * g.wo + ow);
          res[o] = maxval;
          idx[o] = best;
        }
      }
    }
    Scatter<T>(out, res, lie);
    Scatter<int64_t>(indices, idx, lie);
  };
}

int MaxPool2d(xdnn::Context* ctx, const Tensor& self_raw, const std::vector<int64_t>& kernel_size,
              const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
              const std::vector<int64_t>& dilation, bool ceil_mode, const Tensor& out_raw,
              const Tensor& indices_raw) {
  if (int rc = Enter(kFn_max_pool2d_with_indices, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(out_raw) || !WellFormed(indices_raw)) return xdnn::INVALID_PARAM;
  const Tensor self = Norm(self_raw), out = Norm(out_raw), indices = Norm(indices_raw);
  if (!SameFloatDtype({&self, &out}) || indices.dtype != ScalarType::kint64) return xdnn::NOT_IMPLEMENT;
  PoolGeom g;
  if (int rc = CheckMaxPool(self, kernel_size, stride, padding, dilation, ceil_mode, &g); rc >= 0) return rc;
  const std::vector<int64_t> shape = PooledShape(g);
  if (out.sizes != shape || indices.sizes != shape || SelfOverlapping(out) || SelfOverlapping(indices)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(shape) == 0) return xdnn::SUCCESS;
  Bound bs, bo, bi;
  return BindAndLaunch(kFn_max_pool2d_with_indices, ctx, {{self, &bs}, {out, &bo}, {indices, &bi}}, out.dtype,
                       [&](auto tag, bool lie) { return MaxPoolKernel<decltype(tag)>(g, bs, bo, bi, lie); });
}

// grad_input zeroed, then grad_output added at each output's index into
// its plane; an index outside the plane (aten writes out of bounds) is
// skipped.
template <typename T>
Kernel MaxPoolBackwardKernel(PoolGeom g, Bound grad, Bound indices, Bound gi, bool lie) {
  return [=]() {
    const std::vector<T> go = GatherAll<T>(grad);
    const std::vector<int64_t> idx = GatherAll<int64_t>(indices);
    const int64_t plane = g.h * g.w, per_plane = g.ho * g.wo;
    std::vector<double> acc(Z(g.planes * plane), 0.0);
    for (int64_t p = 0; p < g.planes; ++p) {
      for (int64_t k = 0; k < per_plane; ++k) {
        const int64_t i = idx[Z(p * per_plane + k)];
        if (i < 0 || i >= plane) continue;
        acc[Z(p * plane + i)] += static_cast<double>(go[Z(p * per_plane + k)]);
      }
    }
    Scatter<T>(gi, acc, lie);
  };
}

int MaxPool2dBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& self_raw,
                      const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                      const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool ceil_mode,
                      const Tensor& indices_raw, const Tensor& gi_raw) {
  if (int rc = Enter(kFn_max_pool2d_with_indices_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&go_raw, &self_raw, &indices_raw, &gi_raw})) return xdnn::INVALID_PARAM;
  const Tensor go = Norm(go_raw), self = Norm(self_raw), indices = Norm(indices_raw), gi = Norm(gi_raw);
  if (!SameFloatDtype({&go, &self, &gi}) || indices.dtype != ScalarType::kint64) return xdnn::NOT_IMPLEMENT;
  PoolGeom g;
  if (int rc = CheckMaxPool(self, kernel_size, stride, padding, dilation, ceil_mode, &g); rc >= 0) return rc;
  const std::vector<int64_t> shape = PooledShape(g);
  if (go.sizes != shape || indices.sizes != shape || gi.sizes != self.sizes || SelfOverlapping(gi)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(gi.sizes) == 0) return xdnn::SUCCESS;
  Bound bg, bs, bi, bgi;
  return BindAndLaunch(kFn_max_pool2d_with_indices_backward, ctx,
                       {{go, &bg}, {self, &bs}, {indices, &bi}, {gi, &bgi}}, gi.dtype,
                       [&](auto tag, bool lie) { return MaxPoolBackwardKernel<decltype(tag)>(g, bg, bi, bgi, lie); });
}

// ---- adaptive_avg_pool2d -------------------------------------------------

// aten's adaptive pooling window of output i: [floor(i*in/out),
// ceil((i+1)*in/out)).
int64_t StartIndex(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
int64_t EndIndex(int64_t i, int64_t out, int64_t in) { return ((i + 1) * in + out - 1) / out; }

// input [C,H,W] or [N,C,H,W] with its non-batch dims non-zero.
bool AdaptiveInputOk(const Tensor& t) {
  const size_t rank = t.sizes.size();
  if (rank != 3 && rank != 4) return false;
  for (size_t d = rank - 3; d < rank; ++d) {
    if (t.sizes[d] == 0) return false;
  }
  return true;
}

template <typename T>
Kernel AdaptiveAvgPoolKernel(int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo, Bound self, Bound out,
                             bool lie) {
  return [=]() {
    const std::vector<T> x = GatherAll<T>(self);
    std::vector<double> res(Z(planes * ho * wo));
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t oh = 0; oh < ho; ++oh) {
        const int64_t h0 = StartIndex(oh, ho, h), h1 = EndIndex(oh, ho, h);
        for (int64_t ow = 0; ow < wo; ++ow) {
          const int64_t w0 = StartIndex(ow, wo, w), w1 = EndIndex(ow, wo, w);
          double sum = 0;
          for (int64_t ih = h0; ih < h1; ++ih) {
            for (int64_t iw = w0; iw < w1; ++iw) sum += static_cast<double>(x[Z((p * h + ih) * w + iw)]);
          }
          res[Z((p * ho + oh) * wo + ow)] = sum / static_cast<double>(h1 - h0) / static_cast<double>(w1 - w0);
        }
      }
    }
    Scatter<T>(out, res, lie);
  };
}

int AdaptiveAvgPool2d(xdnn::Context* ctx, const Tensor& self_raw, const std::vector<int64_t>& output_size,
                      const Tensor& out_raw) {
  if (int rc = Enter(kFn_adaptive_avg_pool2d, self_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!WellFormed(self_raw) || !WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  const Tensor self = Norm(self_raw), out = Norm(out_raw);
  if (!SameFloatDtype({&self, &out})) return xdnn::NOT_IMPLEMENT;
  // aten: "output_size must be 2", and the input's non-batch dims non-zero.
  if (output_size.size() != 2 || output_size[0] < 0 || output_size[1] < 0 || !AdaptiveInputOk(self)) {
    return xdnn::INVALID_PARAM;
  }
  const size_t rank = self.sizes.size();
  std::vector<int64_t> shape(self.sizes.begin(), self.sizes.end() - 2);
  const int64_t planes = Numel(shape);
  shape.push_back(output_size[0]);
  shape.push_back(output_size[1]);
  if (out.sizes != shape || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(shape) == 0) return xdnn::SUCCESS;
  const int64_t h = self.sizes[rank - 2], w = self.sizes[rank - 1];
  Bound bs, bo;
  return BindAndLaunch(kFn_adaptive_avg_pool2d, ctx, {{self, &bs}, {out, &bo}}, out.dtype, [&](auto tag, bool lie) {
    return AdaptiveAvgPoolKernel<decltype(tag)>(planes, h, w, output_size[0], output_size[1], bs, bo, lie);
  });
}

// grad_input zeroed, then each output's grad / kh / kw added over its window.
template <typename T>
Kernel AdaptiveAvgPoolBackwardKernel(int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo, Bound grad,
                                     Bound gi, bool lie) {
  return [=]() {
    const std::vector<T> go = GatherAll<T>(grad);
    std::vector<double> acc(Z(planes * h * w), 0.0);
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t oh = 0; oh < ho; ++oh) {
        const int64_t h0 = StartIndex(oh, ho, h), h1 = EndIndex(oh, ho, h);
        for (int64_t ow = 0; ow < wo; ++ow) {
          const int64_t w0 = StartIndex(ow, wo, w), w1 = EndIndex(ow, wo, w);
          const double delta = static_cast<double>(go[Z((p * ho + oh) * wo + ow)]) / static_cast<double>(h1 - h0) /
                               static_cast<double>(w1 - w0);
          for (int64_t ih = h0; ih < h1; ++ih) {
            for (int64_t iw = w0; iw < w1; ++iw) acc[Z((p * h + ih) * w + iw)] += delta;
          }
        }
      }
    }
    Scatter<T>(gi, acc, lie);
  };
}

int AdaptiveAvgPool2dBackward(xdnn::Context* ctx, const Tensor& go_raw, const Tensor& self_raw,
                              const Tensor& gi_raw) {
  if (int rc = Enter(kFn_adaptive_avg_pool2d_backward, go_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&go_raw, &self_raw, &gi_raw})) return xdnn::INVALID_PARAM;
  const Tensor go = Norm(go_raw), self = Norm(self_raw), gi = Norm(gi_raw);
  if (!SameFloatDtype({&go, &self, &gi})) return xdnn::NOT_IMPLEMENT;
  // grad_output: self's leading dims, then [ho, wo], non-batch dims non-zero.
  if (!AdaptiveInputOk(self) || !AdaptiveInputOk(go) || go.sizes.size() != self.sizes.size() ||
      !std::equal(self.sizes.begin(), self.sizes.end() - 2, go.sizes.begin()) || gi.sizes != self.sizes ||
      SelfOverlapping(gi)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(gi.sizes) == 0) return xdnn::SUCCESS;
  const size_t rank = self.sizes.size();
  const int64_t planes = Numel(std::vector<int64_t>(self.sizes.begin(), self.sizes.end() - 2));
  const int64_t h = self.sizes[rank - 2], w = self.sizes[rank - 1];
  const int64_t ho = go.sizes[rank - 2], wo = go.sizes[rank - 1];
  Bound bg, bs, bgi;
  return BindAndLaunch(kFn_adaptive_avg_pool2d_backward, ctx, {{go, &bg}, {self, &bs}, {gi, &bgi}}, gi.dtype,
                       [&](auto tag, bool lie) {
                         return AdaptiveAvgPoolBackwardKernel<decltype(tag)>(planes, h, w, ho, wo, bg, bgi, lie);
                       });
}

// ---- cat -----------------------------------------------------------------

// aten's legacy rule: a 1-d tensor of size [0] is skipped whatever its
// rank against the others.
bool LegacySkipped(const Tensor& t) { return t.sizes == std::vector<int64_t>{0}; }

int Cat(xdnn::Context* ctx, const std::vector<Tensor>& raw, int64_t dim, const Tensor& out_raw) {
  if (int rc = Enter(kFn_cat, raw.empty() ? out_raw : raw[0]); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  for (const Tensor& t : raw) {
    if (!WellFormed(t)) return xdnn::INVALID_PARAM;
  }
  if (!WellFormed(out_raw)) return xdnn::INVALID_PARAM;
  std::vector<Tensor> in;
  for (const Tensor& t : raw) in.push_back(Norm(t));
  const Tensor out = Norm(out_raw);
  // No type promotion: every tensor has out's dtype, one copy takes.
  if (!IsCopyable(out.dtype)) return xdnn::NOT_IMPLEMENT;
  for (const Tensor& t : in) {
    if (t.dtype != out.dtype) return xdnn::NOT_IMPLEMENT;
  }
  if (in.empty()) return xdnn::INVALID_PARAM;  // aten: "expected a non-empty list of Tensors"
  std::vector<const Tensor*> used;
  for (const Tensor& t : in) {
    if (!LegacySkipped(t)) used.push_back(&t);
  }
  if (used.empty()) {
    // Everything skipped: aten's result is [0].
    if (Numel(out.sizes) != 0) return xdnn::INVALID_PARAM;
    return xdnn::SUCCESS;
  }
  const std::vector<int64_t>& first = used[0]->sizes;
  const int64_t d = WrapDim(dim, first.size());
  if (d < 0) return xdnn::INVALID_PARAM;
  std::vector<int64_t> shape = first;
  shape[Z(d)] = 0;
  for (const Tensor* t : used) {
    if (t->sizes.size() != first.size()) return xdnn::INVALID_PARAM;
    for (size_t k = 0; k < first.size(); ++k) {
      if (static_cast<int64_t>(k) != d && t->sizes[k] != first[k]) return xdnn::INVALID_PARAM;
    }
    shape[Z(d)] += t->sizes[Z(d)];
  }
  if (out.sizes != shape || SelfOverlapping(out)) return xdnn::INVALID_PARAM;
  if (Numel(shape) == 0) return xdnn::SUCCESS;
  void* stream = ctx->xpu_stream;
  std::vector<Bound> bins(used.size());
  for (size_t i = 0; i < used.size(); ++i) {
    if (!Bind(stream, *used[i], &bins[i])) return xdnn::INVALID_PARAM;
  }
  Bound bo;
  if (!Bind(stream, out, &bo)) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[kFn_cat];
  const Along g = AlongDim(shape, d);  // outer x (len along dim) x inner
  Kernel k;
  VisitCopyable(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    k = [bins, bo, g, d, lie]() {
      std::vector<T> res(Z(bo.numel));
      int64_t at = 0;  // where along `d` the current input starts
      for (const Bound& b : bins) {
        const std::vector<T> v = GatherAll<T>(b);
        const int64_t len = b.sizes[Z(d)];
        for (int64_t o = 0; o < g.outer; ++o) {
          for (int64_t j = 0; j < len; ++j) {
            for (int64_t i = 0; i < g.inner; ++i) {
              res[Z((o * g.len + at + j) * g.inner + i)] = v[Z((o * len + j) * g.inner + i)];
            }
          }
        }
        at += len;
      }
      Scatter<T>(bo, res, lie);
    };
  });
  return Launch(stream, std::move(k));
}

// ---- where ---------------------------------------------------------------

int Where(xdnn::Context* ctx, const Tensor& cond_raw, const Tensor& self_raw, const Tensor& other_raw,
          const Tensor& out_raw) {
  if (int rc = Enter(kFn_where, cond_raw); rc >= 0) return rc;
  if (ctx == nullptr) return xdnn::INVALID_PARAM;
  if (!AllWellFormed({&cond_raw, &self_raw, &other_raw, &out_raw})) return xdnn::INVALID_PARAM;
  const Tensor cond = Norm(cond_raw), self = Norm(self_raw), other = Norm(other_raw), out = Norm(out_raw);
  // condition: bool (aten still takes uint8, deprecated); self, other and
  // out one dtype copy takes (no type promotion).
  if ((cond.dtype != ScalarType::kbool && cond.dtype != ScalarType::kuint8) || !IsCopyable(out.dtype) ||
      self.dtype != out.dtype || other.dtype != out.dtype) {
    return xdnn::NOT_IMPLEMENT;
  }
  if (!BroadcastsTo(cond.sizes, out.sizes) || !BroadcastsTo(self.sizes, out.sizes) ||
      !BroadcastsTo(other.sizes, out.sizes) || SelfOverlapping(out)) {
    return xdnn::INVALID_PARAM;
  }
  if (Numel(out.sizes) == 0) return xdnn::SUCCESS;
  void* stream = ctx->xpu_stream;
  Bound bc, bs, bo2, bo;
  if (!BindAll(stream, {{cond, &bc}, {self, &bs}, {other, &bo2}, {out, &bo}})) return xdnn::INVALID_PARAM;
  const bool lie = g_cfg.lie[kFn_where];
  Kernel k;
  VisitCopyable(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    k = [bc, bs, bo2, bo, lie]() {
      // uint8 and bool are both one byte, non-zero true.
      const std::vector<bool> c = Gather<bool>(bc, bo.sizes);
      const std::vector<T> a = Gather<T>(bs, bo.sizes), b = Gather<T>(bo2, bo.sizes);
      ScatterWith<T>(bo, lie, [&](int64_t j) { return c[Z(j)] ? a[Z(j)] : b[Z(j)]; });
    };
  });
  return Launch(stream, std::move(k));
}

}  // namespace

// ---- the API -------------------------------------------------------------

namespace xdnn_pytorch {

int convolution(xdnn::Context* ctx, const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                const std::vector<int64_t>& dilation, bool transposed, const std::vector<int64_t>& output_padding,
                int64_t groups, Tensor& out) {
  return Convolution(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, out);
}

int convolution_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                         const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& dilation, bool transposed,
                         const std::vector<int64_t>& output_padding, int64_t groups,
                         const std::vector<bool>& output_mask, Tensor& grad_input, Tensor& grad_weight,
                         Tensor& grad_bias) {
  return ConvolutionBackward(ctx, grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                             groups, output_mask, grad_input, grad_weight, grad_bias);
}

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

int softmax(xdnn::Context* ctx, const Tensor& self, int64_t dim, bool half_to_float, Tensor& out) {
  return SoftmaxCall(kFn_softmax, ctx, self, dim, half_to_float, out,
                     [](auto tag, Bound x, Along g, Bound y, bool lie) {
                       return SoftmaxKernel<decltype(tag)>(x, g, y, lie);
                     });
}

int softmax_backward_data(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& output, int64_t dim,
                          ScalarType input_dtype, Tensor& grad_input) {
  return SoftmaxBackwardCall(kFn_softmax_backward_data, ctx, grad_output, output, dim, input_dtype, grad_input,
                             [](auto tag, Bound grad, Bound y, Along g, Bound gi, bool lie) {
                               return SoftmaxBackwardKernel<decltype(tag)>(grad, y, g, gi, lie);
                             });
}

int embedding(xdnn::Context* ctx, const Tensor& weight, const Tensor& indices, int64_t padding_idx,
              bool scale_grad_by_freq, bool sparse, Tensor& out) {
  return Embedding(ctx, weight, indices, padding_idx, scale_grad_by_freq, sparse, out);
}

int embedding_dense_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& indices,
                             int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq,
                             Tensor& grad_weight) {
  return EmbeddingDenseBackward(ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq,
                                grad_weight);
}

int gelu(xdnn::Context* ctx, const Tensor& self, const std::string& approximate, Tensor& out) {
  const int type = GeluType(approximate);
  return Elementwise<1>(
      kFn_gelu, ctx, {&self}, out,
      [type](auto tag) {
        using T = decltype(tag);
        return [type](T x) { return static_cast<T>(Gelu(static_cast<double>(x), type == 1)); };
      },
      type >= 0);
}

int gelu_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self, const std::string& approximate,
                  Tensor& grad_input) {
  const int type = GeluType(approximate);
  return Elementwise<2>(
      kFn_gelu_backward, ctx, {&grad_output, &self}, grad_input,
      [type](auto tag) {
        using T = decltype(tag);
        return [type](T dy, T x) {
          return static_cast<T>(GeluGrad(static_cast<double>(dy), static_cast<double>(x), type == 1));
        };
      },
      type >= 0);
}

int max_pool2d_with_indices(xdnn::Context* ctx, const Tensor& self, const std::vector<int64_t>& kernel_size,
                            const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                            const std::vector<int64_t>& dilation, bool ceil_mode, Tensor& out, Tensor& indices) {
  return MaxPool2d(ctx, self, kernel_size, stride, padding, dilation, ceil_mode, out, indices);
}

int max_pool2d_with_indices_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                                     const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                                     const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                                     bool ceil_mode, const Tensor& indices, Tensor& grad_input) {
  return MaxPool2dBackward(ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices,
                           grad_input);
}

int adaptive_avg_pool2d(xdnn::Context* ctx, const Tensor& self, const std::vector<int64_t>& output_size,
                        Tensor& out) {
  return AdaptiveAvgPool2d(ctx, self, output_size, out);
}

int adaptive_avg_pool2d_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                                 Tensor& grad_input) {
  return AdaptiveAvgPool2dBackward(ctx, grad_output, self, grad_input);
}

int cat(xdnn::Context* ctx, const std::vector<Tensor>& tensors, int64_t dim, Tensor& out) {
  return Cat(ctx, tensors, dim, out);
}

int where(xdnn::Context* ctx, const Tensor& condition, const Tensor& self, const Tensor& other, Tensor& out) {
  return Where(ctx, condition, self, other, out);
}

}  // namespace xdnn_pytorch
