// Each bound aten overload and its xdnn_pytorch call (xdnn_bindings.h).
// An overload's in-place, out= and functional forms share one function:
// the Invocation hands it the output its form implies.
#include "xdnn_bindings.h"

#include <algorithm>
#include <string>

namespace flagos::kunlunxin::xdnn_binding {
namespace {

using xdnn_pytorch::Scalar;
using xdnn_pytorch::Tensor;

#define XDNN_CALL(call, fn, ...) ((call).Calling(#fn), xdnn_pytorch::fn((call).ctx(), __VA_ARGS__))

// ---- elementwise
// The Tensor overloads also take a number the client sent by value as
// `other` (`x += 1`): the Scalar call then.
int AddTensor(Invocation& c) {
  if (!c.IsTensor(1)) return XDNN_CALL(c, add_scalar, c.Tensor(0), c.Scalar(1), c.Scalar(2), c.Out(0));
  return XDNN_CALL(c, add_tensor, c.Tensor(0), c.Tensor(1), c.Scalar(2), c.Out(0));
}
int AddScalar(Invocation& c) {
  return XDNN_CALL(c, add_scalar, c.Tensor(0), c.Scalar(1), c.Scalar(2), c.Out(0));
}
int SubTensor(Invocation& c) {
  return XDNN_CALL(c, sub_tensor, c.Tensor(0), c.Tensor(1), c.Scalar(2), c.Out(0));
}
int MulTensor(Invocation& c) {
  if (!c.IsTensor(0) && c.IsTensor(1)) {  // a number times a tensor
    return XDNN_CALL(c, mul_scalar, c.Tensor(1), c.Scalar(0), c.Out(0));
  }
  if (!c.IsTensor(1)) return XDNN_CALL(c, mul_scalar, c.Tensor(0), c.Scalar(1), c.Out(0));
  return XDNN_CALL(c, mul_tensor, c.Tensor(0), c.Tensor(1), c.Out(0));
}
int MulScalar(Invocation& c) { return XDNN_CALL(c, mul_scalar, c.Tensor(0), c.Scalar(1), c.Out(0)); }
int DivTensor(Invocation& c) {
  if (!c.IsTensor(1)) return XDNN_CALL(c, div_scalar, c.Tensor(0), c.Scalar(1), c.Out(0));
  return XDNN_CALL(c, div_tensor, c.Tensor(0), c.Tensor(1), c.Out(0));
}
int DivScalar(Invocation& c) { return XDNN_CALL(c, div_scalar, c.Tensor(0), c.Scalar(1), c.Out(0)); }
int Neg(Invocation& c) { return XDNN_CALL(c, neg, c.Tensor(0), c.Out(0)); }
int Relu(Invocation& c) { return XDNN_CALL(c, relu, c.Tensor(0), c.Out(0)); }
int Sqrt(Invocation& c) { return XDNN_CALL(c, sqrt, c.Tensor(0), c.Out(0)); }
int Exp(Invocation& c) { return XDNN_CALL(c, exp, c.Tensor(0), c.Out(0)); }
int ThresholdBackward(Invocation& c) {
  return XDNN_CALL(c, threshold_backward, c.Tensor(0), c.Tensor(1), c.Scalar(2), c.Out(0));
}
int Addcmul(Invocation& c) {
  return XDNN_CALL(c, addcmul, c.Tensor(0), c.Tensor(1), c.Tensor(2), c.Scalar(3), c.Out(0));
}
int Addcdiv(Invocation& c) {
  return XDNN_CALL(c, addcdiv, c.Tensor(0), c.Tensor(1), c.Tensor(2), c.Scalar(3), c.Out(0));
}
int LerpScalar(Invocation& c) {
  return XDNN_CALL(c, lerp_scalar, c.Tensor(0), c.Tensor(1), c.Scalar(2), c.Out(0));
}
int Fill(Invocation& c) { return XDNN_CALL(c, fill__scalar, c.Tensor(0), c.Scalar(1), c.Out(0)); }
int Zero(Invocation& c) {
  return XDNN_CALL(c, fill__scalar, c.Tensor(0), Scalar::create(int64_t{0}), c.Out(0));
}
// copy_(self, src, non_blocking): self is the output.
int Copy(Invocation& c) { return XDNN_CALL(c, copy, c.Tensor(1), c.Out(0)); }

// ---- matrix products
int Mm(Invocation& c) { return XDNN_CALL(c, mm, c.Tensor(0), c.Tensor(1), c.Out(0)); }
int Bmm(Invocation& c) { return XDNN_CALL(c, bmm, c.Tensor(0), c.Tensor(1), c.Out(0)); }
int Addmm(Invocation& c) {
  return XDNN_CALL(c, addmm, c.Tensor(0), c.Tensor(1), c.Tensor(2), c.Scalar(3), c.Scalar(4),
                   c.Out(0));
}

// ---- reductions: (self, dim, keepdim, dtype); a dtype other than the
// output's is a conversion xdnn_pytorch's call does not take.
void RequireSameDtype(Invocation& c, int dtype_arg) {
  if (!c.IsNone(dtype_arg) && c.Int(dtype_arg) != c.DtypeOf(0)) {
    throw Decline{"a dtype= other than the input's"};
  }
}
int SumDim(Invocation& c) {
  RequireSameDtype(c, 3);
  return XDNN_CALL(c, sum_dim_IntList, c.Tensor(0), c.Ints(1), c.Bool(2), c.Out(0));
}
int MeanDim(Invocation& c) {
  RequireSameDtype(c, 3);
  return XDNN_CALL(c, mean_dim, c.Tensor(0), c.Ints(1), c.Bool(2), c.Out(0));
}

// ---- softmax and losses
int LogSoftmax(Invocation& c) {
  return XDNN_CALL(c, log_softmax, c.Tensor(0), c.Int(1), c.Bool(2), c.Out(0));
}
int LogSoftmaxBackward(Invocation& c) {
  std::optional<xdnn_pytorch::ScalarType> input_dtype =
      XdnnScalarType(static_cast<int32_t>(c.Int(3)));
  if (!input_dtype.has_value()) throw Decline{"input_dtype has no xdnn_pytorch ScalarType"};
  return XDNN_CALL(c, log_softmax_backward_data, c.Tensor(0), c.Tensor(1), c.Int(2),
                   *input_dtype, c.Out(0));
}
int NllLoss(Invocation& c) {
  return XDNN_CALL(c, nll_loss, c.Tensor(0), c.Tensor(1), c.OptionalTensor(2), c.Int(3), c.Int(4),
                   c.Out(0), c.Out(1));
}
int NllLossBackward(Invocation& c) {
  return XDNN_CALL(c, nll_loss_backward, c.Tensor(0), c.Tensor(1), c.Tensor(2),
                   c.OptionalTensor(3), c.Int(4), c.Int(5), c.Tensor(6), c.Out(0));
}

// ---- convolution, normalisation, pooling, embedding, activations
// convolution(input, weight, bias?, stride, padding, dilation, transposed,
// output_padding, groups)
// The binding takes 2-d convolutions (NCHW input, 4-d weight), the shape
// the xdnn_pytorch contract it is built against describes; a 1-d or 3-d one
// (nn.Conv1d: the 3-d input aten::convolution is called with) is declined
// and runs on cpu_fallback instead of failing with INVALID_PARAM.
void DeclineAllButTwoD(const xdnn_pytorch::Tensor& input, const xdnn_pytorch::Tensor& weight) {
  if (input.sizes.size() != 4 || weight.sizes.size() != 4) {
    throw Decline{"a convolution that is not 2-d (input of " + std::to_string(input.sizes.size()) +
                  " dimensions)"};
  }
}
int Convolution(Invocation& c) {
  const xdnn_pytorch::Tensor input = c.Tensor(0);
  const xdnn_pytorch::Tensor weight = c.Tensor(1);
  DeclineAllButTwoD(input, weight);
  return XDNN_CALL(c, convolution, input, weight, c.OptionalTensor(2), c.Ints(3), c.Ints(4),
                   c.Ints(5), c.Bool(6), c.Ints(7), c.Int(8), c.Out(0));
}
// convolution_backward(grad_output, input, weight, bias_sizes?, stride,
// padding, dilation, transposed, output_padding, groups, output_mask)
int ConvolutionBackward(Invocation& c) {
  const xdnn_pytorch::Tensor input = c.Tensor(1);
  const xdnn_pytorch::Tensor weight = c.Tensor(2);
  DeclineAllButTwoD(input, weight);
  return XDNN_CALL(c, convolution_backward, c.Tensor(0), input, weight, c.Ints(4),
                   c.Ints(5), c.Ints(6), c.Bool(7), c.Ints(8), c.Int(9), c.Bools(10), c.Out(0),
                   c.Out(1), c.Out(2));
}
// native_batch_norm / _native_batch_norm_legit(input, weight?, bias?,
// running_mean?, running_var?, training, momentum, eps)
int NativeBatchNorm(Invocation& c) {
  return XDNN_CALL(c, native_batch_norm, c.Tensor(0), c.OptionalTensor(1), c.OptionalTensor(2),
                   c.OptionalTensor(3), c.OptionalTensor(4), c.Bool(5), c.Double(6), c.Double(7),
                   c.Out(0), c.Out(1), c.Out(2));
}
// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
// running_var?, save_mean?, save_invstd?, train, eps, output_mask)
int NativeBatchNormBackward(Invocation& c) {
  return XDNN_CALL(c, native_batch_norm_backward, c.Tensor(0), c.Tensor(1), c.OptionalTensor(2),
                   c.OptionalTensor(3), c.OptionalTensor(4), c.OptionalTensor(5),
                   c.OptionalTensor(6), c.Bool(7), c.Double(8), c.Bools(9), c.Out(0), c.Out(1),
                   c.Out(2));
}
// native_layer_norm(input, normalized_shape, weight?, bias?, eps)
int NativeLayerNorm(Invocation& c) {
  return XDNN_CALL(c, native_layer_norm, c.Tensor(0), c.Ints(1), c.OptionalTensor(2),
                   c.OptionalTensor(3), c.Double(4), c.Out(0), c.Out(1), c.Out(2));
}
// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
// weight?, bias?, output_mask)
int NativeLayerNormBackward(Invocation& c) {
  return XDNN_CALL(c, native_layer_norm_backward, c.Tensor(0), c.Tensor(1), c.Ints(2),
                   c.Tensor(3), c.Tensor(4), c.OptionalTensor(5), c.OptionalTensor(6),
                   c.Bools(7), c.Out(0), c.Out(1), c.Out(2));
}
int Softmax(Invocation& c) {
  return XDNN_CALL(c, softmax, c.Tensor(0), c.Int(1), c.Bool(2), c.Out(0));
}
int SoftmaxBackward(Invocation& c) {
  std::optional<xdnn_pytorch::ScalarType> input_dtype =
      XdnnScalarType(static_cast<int32_t>(c.Int(3)));
  if (!input_dtype.has_value()) throw Decline{"input_dtype has no xdnn_pytorch ScalarType"};
  return XDNN_CALL(c, softmax_backward_data, c.Tensor(0), c.Tensor(1), c.Int(2), *input_dtype,
                   c.Out(0));
}
// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
int Embedding(Invocation& c) {
  return XDNN_CALL(c, embedding, c.Tensor(0), c.Tensor(1), c.Int(2), c.Bool(3), c.Bool(4),
                   c.Out(0));
}
// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq)
int EmbeddingDenseBackward(Invocation& c) {
  return XDNN_CALL(c, embedding_dense_backward, c.Tensor(0), c.Tensor(1), c.Int(2), c.Int(3),
                   c.Bool(4), c.Out(0));
}
int Gelu(Invocation& c) { return XDNN_CALL(c, gelu, c.Tensor(0), c.String(1), c.Out(0)); }
int GeluBackward(Invocation& c) {
  return XDNN_CALL(c, gelu_backward, c.Tensor(0), c.Tensor(1), c.String(2), c.Out(0));
}
// An empty stride list means the kernel size (aten's default).
std::vector<int64_t> PoolStride(Invocation& c, int stride, int kernel) {
  std::vector<int64_t> s = c.Ints(stride);
  return s.empty() ? c.Ints(kernel) : s;
}
// max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
int MaxPool2d(Invocation& c) {
  return XDNN_CALL(c, max_pool2d_with_indices, c.Tensor(0), c.Ints(1), PoolStride(c, 2, 1),
                   c.Ints(3), c.Ints(4), c.Bool(5), c.Out(0), c.Out(1));
}
// max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride,
// padding, dilation, ceil_mode, indices)
int MaxPool2dBackward(Invocation& c) {
  return XDNN_CALL(c, max_pool2d_with_indices_backward, c.Tensor(0), c.Tensor(1), c.Ints(2),
                   PoolStride(c, 3, 2), c.Ints(4), c.Ints(5), c.Bool(6), c.Tensor(7), c.Out(0));
}
int AdaptiveAvgPool2d(Invocation& c) {
  return XDNN_CALL(c, adaptive_avg_pool2d, c.Tensor(0), c.Ints(1), c.Out(0));
}
int AdaptiveAvgPool2dBackward(Invocation& c) {
  return XDNN_CALL(c, adaptive_avg_pool2d_backward, c.Tensor(0), c.Tensor(1), c.Out(0));
}
int Cat(Invocation& c) { return XDNN_CALL(c, cat, c.Tensors(0), c.Int(1), c.Out(0)); }
int Where(Invocation& c) {
  return XDNN_CALL(c, where, c.Tensor(0), c.Tensor(1), c.Tensor(2), c.Out(0));
}

// ---- the optimizers' _foreach_ ops: one call per list element. Every
// element must have the first one's dtype (checked before anything is
// issued), so a dtype refusal can only come at the first element; a
// refusal after that is a failure, not a decline (work was issued).
std::vector<Tensor> SameDtypeList(Invocation& c, int i) {
  std::vector<Tensor> list = c.Tensors(i);
  for (const Tensor& t : list) {
    if (t.dtype != list.front().dtype) throw Decline{"a tensor list of mixed dtypes"};
  }
  return list;
}

template <typename PerElement>
int ForEach(Invocation& c, size_t n, PerElement per_element) {
  for (size_t k = 0; k < n; ++k) {
    const int rc = per_element(k);
    if (rc != xdnn::SUCCESS) {
      if (k > 0 && rc == xdnn::NOT_IMPLEMENT) return xdnn::RUNTIME_ERROR;
      return rc;
    }
  }
  return xdnn::SUCCESS;
}

std::vector<Tensor> ForeachOutputs(Invocation& c, std::vector<Tensor>& self, bool in_place) {
  if (in_place) return self;
  std::vector<Tensor> outs;
  for (int k = 0; k < c.nouts(); ++k) outs.push_back(c.Out(k));
  if (outs.size() != self.size()) throw Decline{"results do not match the list"};
  return outs;
}

template <bool kInPlace>
int ForeachSqrt(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  std::vector<Tensor> out = ForeachOutputs(c, self, kInPlace);
  return ForEach(c, self.size(), [&](size_t k) { return XDNN_CALL(c, sqrt, self[k], out[k]); });
}
int ForeachAddScalar(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  const Scalar s = c.Scalar(1);
  const Scalar one = Scalar::create(int64_t{1});
  return ForEach(c, self.size(),
                 [&](size_t k) { return XDNN_CALL(c, add_scalar, self[k], s, one, self[k]); });
}
int ForeachAddList(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  std::vector<Tensor> other = c.Tensors(1);
  const Scalar alpha = c.Scalar(2);
  if (other.size() != self.size()) throw Decline{"lists of different lengths"};
  return ForEach(c, self.size(), [&](size_t k) {
    return XDNN_CALL(c, add_tensor, self[k], other[k], alpha, self[k]);
  });
}
int ForeachMulScalar(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  const Scalar s = c.Scalar(1);
  return ForEach(c, self.size(),
                 [&](size_t k) { return XDNN_CALL(c, mul_scalar, self[k], s, self[k]); });
}
int ForeachMulList(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  std::vector<Tensor> other = c.Tensors(1);
  if (other.size() != self.size()) throw Decline{"lists of different lengths"};
  return ForEach(c, self.size(),
                 [&](size_t k) { return XDNN_CALL(c, mul_tensor, self[k], other[k], self[k]); });
}
int ForeachDivScalarList(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  if (c.ScalarCount(1) != static_cast<int64_t>(self.size())) throw Decline{"scalars != list"};
  return ForEach(c, self.size(), [&](size_t k) {
    return XDNN_CALL(c, div_scalar, self[k], c.ScalarAt(1, k), self[k]);
  });
}
int ForeachLerpScalar(Invocation& c) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  std::vector<Tensor> end = c.Tensors(1);
  const Scalar weight = c.Scalar(2);
  if (end.size() != self.size()) throw Decline{"lists of different lengths"};
  return ForEach(c, self.size(), [&](size_t k) {
    return XDNN_CALL(c, lerp_scalar, self[k], end[k], weight, self[k]);
  });
}
// _foreach_addcmul_ / _foreach_addcdiv_(self[], tensor1[], tensor2[],
// value or values[]): `call` per element, in place.
using PointwiseCall = int (*)(xdnn::Context*, const Tensor&, const Tensor&, const Tensor&,
                              const Scalar&, Tensor&);
int ForeachPointwise(Invocation& c, PointwiseCall call, const char* name, bool scalar_list) {
  std::vector<Tensor> self = SameDtypeList(c, 0);
  std::vector<Tensor> t1 = c.Tensors(1), t2 = c.Tensors(2);
  if (t1.size() != self.size() || t2.size() != self.size() ||
      (scalar_list && c.ScalarCount(3) != static_cast<int64_t>(self.size()))) {
    throw Decline{"list lengths"};
  }
  return ForEach(c, self.size(), [&](size_t k) {
    const Scalar value = scalar_list ? c.ScalarAt(3, static_cast<int64_t>(k)) : c.Scalar(3);
    c.Calling(name);
    return call(c.ctx(), self[k], t1[k], t2[k], value, self[k]);
  });
}
int ForeachAddcmulScalar(Invocation& c) {
  return ForeachPointwise(c, xdnn_pytorch::addcmul, "addcmul", /*scalar_list=*/false);
}
int ForeachAddcdivScalar(Invocation& c) {
  return ForeachPointwise(c, xdnn_pytorch::addcdiv, "addcdiv", /*scalar_list=*/false);
}
int ForeachAddcdivScalarList(Invocation& c) {
  return ForeachPointwise(c, xdnn_pytorch::addcdiv, "addcdiv", /*scalar_list=*/true);
}

#undef XDNN_CALL

using F = Form;
std::vector<Binding> MakeBindings() {
  std::vector<Binding> table = {
      {"aten::add.Tensor", F::kFunctional, 0, AddTensor},
      {"aten::add_.Tensor", F::kInPlace, 0, AddTensor},
      {"aten::add.out", F::kOut, 1, AddTensor},
      {"aten::add.Scalar", F::kFunctional, 0, AddScalar},
      {"aten::add_.Scalar", F::kInPlace, 0, AddScalar},
      {"aten::add.Scalar_out", F::kOut, 1, AddScalar},
      {"aten::sub.Tensor", F::kFunctional, 0, SubTensor},
      {"aten::sub_.Tensor", F::kInPlace, 0, SubTensor},
      {"aten::sub.out", F::kOut, 1, SubTensor},
      {"aten::mul.Tensor", F::kFunctional, 0, MulTensor},
      {"aten::mul_.Tensor", F::kInPlace, 0, MulTensor},
      {"aten::mul.out", F::kOut, 1, MulTensor},
      {"aten::mul.Scalar", F::kFunctional, 0, MulScalar},
      {"aten::mul_.Scalar", F::kInPlace, 0, MulScalar},
      {"aten::mul.Scalar_out", F::kOut, 1, MulScalar},
      {"aten::div.Tensor", F::kFunctional, 0, DivTensor},
      {"aten::div_.Tensor", F::kInPlace, 0, DivTensor},
      {"aten::div.out", F::kOut, 1, DivTensor},
      {"aten::div.Scalar", F::kFunctional, 0, DivScalar},
      {"aten::div_.Scalar", F::kInPlace, 0, DivScalar},
      {"aten::div.Scalar_out", F::kOut, 1, DivScalar},
      {"aten::neg", F::kFunctional, 0, Neg},
      {"aten::neg_", F::kInPlace, 0, Neg},
      {"aten::neg.out", F::kOut, 1, Neg},
      {"aten::relu", F::kFunctional, 0, Relu},
      {"aten::relu_", F::kInPlace, 0, Relu},
      {"aten::relu.out", F::kOut, 1, Relu},
      {"aten::sqrt", F::kFunctional, 0, Sqrt},
      {"aten::sqrt_", F::kInPlace, 0, Sqrt},
      {"aten::sqrt.out", F::kOut, 1, Sqrt},
      {"aten::exp", F::kFunctional, 0, Exp},
      {"aten::exp_", F::kInPlace, 0, Exp},
      {"aten::exp.out", F::kOut, 1, Exp},
      {"aten::threshold_backward", F::kFunctional, 0, ThresholdBackward},
      {"aten::threshold_backward.grad_input", F::kOut, 1, ThresholdBackward},
      {"aten::addcmul", F::kFunctional, 0, Addcmul},
      {"aten::addcmul_", F::kInPlace, 0, Addcmul},
      {"aten::addcmul.out", F::kOut, 1, Addcmul},
      {"aten::addcdiv", F::kFunctional, 0, Addcdiv},
      {"aten::addcdiv_", F::kInPlace, 0, Addcdiv},
      {"aten::addcdiv.out", F::kOut, 1, Addcdiv},
      {"aten::lerp.Scalar", F::kFunctional, 0, LerpScalar},
      {"aten::lerp_.Scalar", F::kInPlace, 0, LerpScalar},
      {"aten::lerp.Scalar_out", F::kOut, 1, LerpScalar},
      {"aten::fill_.Scalar", F::kInPlace, 0, Fill},
      {"aten::zero_", F::kInPlace, 0, Zero},
      {"aten::copy_", F::kInPlace, 0, Copy},
      {"aten::mm", F::kFunctional, 0, Mm},
      {"aten::mm.out", F::kOut, 1, Mm},
      {"aten::bmm", F::kFunctional, 0, Bmm},
      {"aten::bmm.out", F::kOut, 1, Bmm},
      {"aten::addmm", F::kFunctional, 0, Addmm},
      {"aten::addmm_", F::kInPlace, 0, Addmm},
      {"aten::addmm.out", F::kOut, 1, Addmm},
      {"aten::sum.dim_IntList", F::kFunctional, 0, SumDim},
      {"aten::sum.IntList_out", F::kOut, 1, SumDim},
      {"aten::mean.dim", F::kFunctional, 0, MeanDim},
      {"aten::mean.out", F::kOut, 1, MeanDim},
      {"aten::_log_softmax", F::kFunctional, 0, LogSoftmax},
      {"aten::_log_softmax.out", F::kOut, 1, LogSoftmax},
      {"aten::_log_softmax_backward_data", F::kFunctional, 0, LogSoftmaxBackward},
      {"aten::_log_softmax_backward_data.out", F::kOut, 1, LogSoftmaxBackward},
      {"aten::nll_loss_forward", F::kFunctional, 0, NllLoss},
      {"aten::nll_loss_forward.output", F::kOut, 2, NllLoss},
      {"aten::nll_loss_backward", F::kFunctional, 0, NllLossBackward},
      {"aten::nll_loss_backward.grad_input", F::kOut, 1, NllLossBackward},
      {"aten::convolution", F::kFunctional, 0, Convolution},
      {"aten::convolution.out", F::kOut, 1, Convolution},
      {"aten::convolution_backward", F::kFunctional, 0, ConvolutionBackward},
      {"aten::native_batch_norm", F::kFunctional, 0, NativeBatchNorm},
      {"aten::native_batch_norm.out", F::kOut, 3, NativeBatchNorm},
      {"aten::_native_batch_norm_legit", F::kFunctional, 0, NativeBatchNorm},
      {"aten::native_batch_norm_backward", F::kFunctional, 0, NativeBatchNormBackward},
      {"aten::native_layer_norm", F::kFunctional, 0, NativeLayerNorm},
      {"aten::native_layer_norm_backward", F::kFunctional, 0, NativeLayerNormBackward},
      {"aten::_softmax", F::kFunctional, 0, Softmax},
      {"aten::_softmax.out", F::kOut, 1, Softmax},
      {"aten::_softmax_backward_data", F::kFunctional, 0, SoftmaxBackward},
      {"aten::_softmax_backward_data.out", F::kOut, 1, SoftmaxBackward},
      {"aten::embedding", F::kFunctional, 0, Embedding},
      {"aten::embedding_dense_backward", F::kFunctional, 0, EmbeddingDenseBackward},
      {"aten::gelu", F::kFunctional, 0, Gelu},
      {"aten::gelu_", F::kInPlace, 0, Gelu},
      {"aten::gelu.out", F::kOut, 1, Gelu},
      {"aten::gelu_backward", F::kFunctional, 0, GeluBackward},
      {"aten::gelu_backward.grad_input", F::kOut, 1, GeluBackward},
      {"aten::max_pool2d_with_indices", F::kFunctional, 0, MaxPool2d},
      {"aten::max_pool2d_with_indices.out", F::kOut, 2, MaxPool2d},
      {"aten::max_pool2d_with_indices_backward", F::kFunctional, 0, MaxPool2dBackward},
      {"aten::max_pool2d_with_indices_backward.grad_input", F::kOut, 1, MaxPool2dBackward},
      {"aten::_adaptive_avg_pool2d", F::kFunctional, 0, AdaptiveAvgPool2d},
      {"aten::_adaptive_avg_pool2d.out", F::kOut, 1, AdaptiveAvgPool2d},
      {"aten::_adaptive_avg_pool2d_backward", F::kFunctional, 0, AdaptiveAvgPool2dBackward},
      {"aten::_adaptive_avg_pool2d_backward.out", F::kOut, 1, AdaptiveAvgPool2dBackward},
      {"aten::cat", F::kFunctional, 0, Cat},
      {"aten::cat.out", F::kOut, 1, Cat},
      {"aten::where.self", F::kFunctional, 0, Where},
      {"aten::where.self_out", F::kOut, 1, Where},
      {"aten::_foreach_sqrt", F::kFunctional, 0, ForeachSqrt<false>},
      {"aten::_foreach_sqrt_", F::kInPlace, 0, ForeachSqrt<true>},
      {"aten::_foreach_add_.Scalar", F::kInPlace, 0, ForeachAddScalar},
      {"aten::_foreach_add_.List", F::kInPlace, 0, ForeachAddList},
      {"aten::_foreach_mul_.Scalar", F::kInPlace, 0, ForeachMulScalar},
      {"aten::_foreach_mul_.List", F::kInPlace, 0, ForeachMulList},
      {"aten::_foreach_div_.ScalarList", F::kInPlace, 0, ForeachDivScalarList},
      {"aten::_foreach_lerp_.Scalar", F::kInPlace, 0, ForeachLerpScalar},
      {"aten::_foreach_addcmul_.Scalar", F::kInPlace, 0, ForeachAddcmulScalar},
      {"aten::_foreach_addcdiv_.Scalar", F::kInPlace, 0, ForeachAddcdivScalar},
      {"aten::_foreach_addcdiv_.ScalarList", F::kInPlace, 0, ForeachAddcdivScalarList},
  };
  std::sort(table.begin(), table.end(), [](const Binding& a, const Binding& b) {
    return std::string_view(a.op) < std::string_view(b.op);
  });
  return table;
}

}  // namespace

const std::vector<Binding>& Bindings() {
  static const std::vector<Binding>* const table = new std::vector<Binding>(MakeBindings());
  return *table;
}

const Binding* FindBinding(std::string_view op) {
  const std::vector<Binding>& table = Bindings();
  auto it = std::lower_bound(table.begin(), table.end(), op,
                             [](const Binding& b, std::string_view name) { return std::string_view(b.op) < name; });
  if (it == table.end() || std::string_view(it->op) != op) return nullptr;
  return &*it;
}

}  // namespace flagos::kunlunxin::xdnn_binding
