// Host kernels for the operators torch.nn.SyncBatchNorm calls, which ATen
// implements for CUDA only: per-rank statistics (batch_norm_stats), their
// combination across ranks (batch_norm_gather_stats_with_counts), the
// normalisation (batch_norm_elemt) and the two halves of the backward
// (batch_norm_backward_reduce, batch_norm_backward_elemt). Registered as
// CPU kernels, they serve flagos tensors on the cpu backend and on the
// cpu_fallback route; between the calls SyncBatchNorm runs its collectives
// through the flagos process group (torch_fl.distributed).
//
// The arithmetic is that of ATen's CUDA kernels, in float (double for
// double inputs): invstd = 1 / sqrt(biased variance + eps); the running
// variance takes the unbiased one. (ATen TU)
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "collectives/sync_batch_norm_kernels.h"

namespace flagos::daemon {
namespace {

// The statistics' dtype for `input`: its accumulation type.
at::ScalarType StatsType(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Every dimension but the channels' (1).
std::vector<int64_t> ReduceDims(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm on flagos: the input has ", input.dim(),
              " dimensions; it needs at least 2 (batch, channels, ...)");
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// `per_channel` ([C]) shaped to broadcast over `input` ([N, C, ...]).
at::Tensor PerChannel(const at::Tensor& per_channel, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = per_channel.numel();
  return per_channel.reshape(shape);
}

std::tuple<at::Tensor, at::Tensor> Stats(const at::Tensor& input, double eps) {
  const at::Tensor x = input.to(StatsType(input));
  const std::vector<int64_t> dims = ReduceDims(input);
  const at::Tensor var = x.var(dims, /*correction=*/0, /*keepdim=*/false);
  const at::Tensor mean = x.mean(dims);
  return {mean, (var + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor> GatherStatsWithCounts(
    const at::Tensor& /*input*/, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    double momentum, double eps, const at::Tensor& counts) {
  const at::ScalarType type = mean.scalar_type();
  // Each rank's mean and variance ([world, C]) and count ([world, 1]).
  const at::Tensor n = counts.to(type).reshape({-1, 1});
  const at::Tensor var = invstd.pow(-2) - eps;
  const at::Tensor total = n.sum();
  const at::Tensor global_mean = (n * mean).sum(0) / total;
  const at::Tensor global_var = (n * (var + (mean - global_mean).pow(2))).sum(0) / total;
  at::NoGradGuard no_grad;
  if (running_mean.has_value() && running_mean->defined()) {
    running_mean->mul_(1 - momentum).add_(global_mean.to(running_mean->scalar_type()), momentum);
  }
  if (running_var.has_value() && running_var->defined()) {
    const at::Tensor unbiased = global_var * total / (total - 1);
    running_var->mul_(1 - momentum).add_(unbiased.to(running_var->scalar_type()), momentum);
  }
  return {global_mean, (global_var + eps).rsqrt()};
}

at::Tensor Normalized(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                      const at::Tensor& invstd) {
  const at::ScalarType type = StatsType(input);
  at::Tensor y = (input.to(type) - PerChannel(mean.to(type), input)) *
                 PerChannel(invstd.to(type), input);
  if (weight.has_value() && weight->defined()) y = y * PerChannel(weight->to(type), input);
  if (bias.has_value() && bias->defined()) y = y + PerChannel(bias->to(type), input);
  return y.to(input.scalar_type());
}

at::Tensor Elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                 const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                 const at::Tensor& invstd, double /*eps*/) {
  return Normalized(input, weight, bias, mean, invstd)
      .contiguous(input.suggest_memory_format());
}

at::Tensor& ElemtOut(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                     const at::Tensor& invstd, double /*eps*/, at::Tensor& out) {
  const at::Tensor y = Normalized(input, weight, bias, mean, invstd);
  out.resize_(y.sizes());
  out.copy_(y);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> BackwardReduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
    const at::Tensor& invstd, const std::optional<at::Tensor>& weight, bool input_g,
    bool weight_g, bool bias_g) {
  const at::ScalarType type = StatsType(input);
  const std::vector<int64_t> dims = ReduceDims(input);
  const at::Tensor dy = grad_out.to(type);
  const at::Tensor xmu = input.to(type) - PerChannel(mean.to(type), input);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * xmu).sum(dims);
  const at::ScalarType weight_type =
      weight.has_value() && weight->defined() ? weight->scalar_type() : input.scalar_type();
  return {input_g ? sum_dy : at::Tensor(), input_g ? sum_dy_xmu : at::Tensor(),
          weight_g ? (sum_dy_xmu * invstd.to(type)).to(weight_type) : at::Tensor(),
          bias_g ? sum_dy.to(weight_type) : at::Tensor()};
}

at::Tensor BackwardElemt(const at::Tensor& grad_out, const at::Tensor& input,
                         const at::Tensor& mean, const at::Tensor& invstd,
                         const std::optional<at::Tensor>& weight, const at::Tensor& sum_dy,
                         const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  const at::ScalarType type = StatsType(input);
  // sum_dy and sum_dy_xmu are sums over every rank's batch: count holds
  // each rank's sample count.
  const at::Tensor total = count.to(type).sum();
  const at::Tensor mean_dy = PerChannel(sum_dy.to(type) / total, input);
  const at::Tensor mean_dy_xmu = PerChannel(sum_dy_xmu.to(type) / total, input);
  const at::Tensor istd = PerChannel(invstd.to(type), input);
  const at::Tensor xmu = input.to(type) - PerChannel(mean.to(type), input);
  at::Tensor scale = istd;
  if (weight.has_value() && weight->defined()) scale = scale * PerChannel(weight->to(type), input);
  const at::Tensor grad =
      (grad_out.to(type) - mean_dy - xmu * istd * istd * mean_dy_xmu) * scale;
  return grad.to(input.scalar_type()).contiguous(input.suggest_memory_format());
}

}  // namespace

int SyncBatchNormKernelCount() { return 6; }

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("batch_norm_stats", &Stats);
  m.impl("batch_norm_gather_stats_with_counts", &GatherStatsWithCounts);
  m.impl("batch_norm_elemt", &Elemt);
  m.impl("batch_norm_elemt.out", &ElemtOut);
  m.impl("batch_norm_backward_reduce", &BackwardReduce);
  m.impl("batch_norm_backward_elemt", &BackwardElemt);
}

}  // namespace flagos::daemon
