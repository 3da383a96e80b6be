// Operators that ATen routes to an "overrideable" hook for backends other
// than its own (convolution): flagos reroutes them to the generic operator,
// which the daemon runs with its backend's kernels.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fallback.h"

namespace torch_fl {
namespace {

c10::OperatorHandle Op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

at::Tensor ConvolutionOverrideable(const at::Tensor& input, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                   c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                   bool transposed, c10::IntArrayRef output_padding,
                                   int64_t groups) {
  static const c10::OperatorHandle convolution = Op("aten::convolution", "");
  torch::jit::Stack stack{input,      weight,         bias,  stride, padding,
                          dilation,   transposed,     output_padding, groups};
  RunOnDaemon(convolution, &stack);
  return stack.at(0).toTensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ConvolutionBackwardOverrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  static const c10::OperatorHandle backward = Op("aten::convolution_backward", "");
  // The bias, when its gradient is wanted, has one entry per output channel.
  std::optional<std::vector<int64_t>> bias_sizes;
  if (output_mask[2]) {
    bias_sizes = std::vector<int64_t>{transposed ? weight.size(1) * groups : weight.size(0)};
  }
  c10::List<bool> mask({output_mask[0], output_mask[1], output_mask[2]});
  torch::jit::Stack stack{grad_output, input,      weight,         bias_sizes, stride, padding,
                          dilation,    transposed, output_padding, groups,     mask};
  RunOnDaemon(backward, &stack);
  return {stack.at(0).toTensor(), stack.at(1).toTensor(), stack.at(2).toTensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(ConvolutionOverrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(ConvolutionBackwardOverrideable));
}

}  // namespace torch_fl
