// The fake libxdnn_pytorch's convolution, pooling, embedding and activation
// ops, with cat and where (the header's block after "---- convolution,
// normalisation, pooling, embedding, activations"; normalisation is in
// fake_xdnn_norm_ops.cc, the shared helpers in fake_xdnn_nn_helpers.h).
// Test-only; see README.md. Same discipline as fake_xdnn_pytorch.cc (the shared parts
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
#include "fake_xdnn_nn_helpers.h"

using namespace fake_xdnn;  // NOLINT: the shared internals (fake_xdnn_internal.h)

namespace {


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
