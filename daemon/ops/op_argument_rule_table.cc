// The table of op_argument_rules.h: which ops' kernels trust which
// argument's sizes, and what flagosd checks for them.
#include <algorithm>
#include <initializer_list>
#include <vector>

#include "absl/strings/string_view.h"
#include "ops/op_argument_rules.h"

namespace flagos::daemon {
namespace {

using K = ArgumentRuleKind;

// The state arguments of the fused optimizers: each the sizes of its
// parameter, and all indexed linearly.
std::vector<ArgumentRule> FusedOptimizerRules(std::initializer_list<const char*> states) {
  std::vector<ArgumentRule> rules;
  rules.push_back({K::kDense, "self"});
  for (const char* state : states) {
    rules.push_back({K::kSameSizes, state, "self"});
    rules.push_back({K::kDense, state});
  }
  rules.push_back({K::kOneElement, "grad_scale"});
  rules.push_back({K::kOneElement, "found_inf"});
  return rules;
}

std::vector<ArgumentRule> BatchNormRules() {
  return {{K::kChannels, "weight", "input"},       {K::kChannels, "bias", "input"},
          {K::kChannels, "running_mean", "input"}, {K::kChannels, "running_var", "input"},
          {K::kChannelsOrEmpty, "save_mean", "input"}, {K::kChannelsOrEmpty, "save_invstd", "input"},
          {K::kChannelsOrEmpty, "save_var", "input"}};
}

std::vector<ArgumentRule> QuantParamRules() {
  std::vector<ArgumentRule> rules;
  for (const char* state : {"running_min", "running_max", "scale", "zero_point"}) {
    rules.push_back({K::kPerRowOrOne, state, "self", "ch_axis", "per_row_fake_quant"});
    rules.push_back({K::kDense, state});
  }
  return rules;
}

constexpr const char* kCumWhy =
    "tensor_dim_apply3 writes values and indices with self's sizes at their own strides, and "
    "walks every dimension but `dim` unwrapped (a negative dim runs off the tensors)";
constexpr const char* kRreluWhy =
    "its kernel writes noise as noise.data_ptr()[i] for i < self.numel()";
constexpr const char* kAdamWhy =
    "its kernel indexes every parameter and state tensor as data_ptr()[i] for i < param.numel() "
    "and reads grad_scale and found_inf through data_ptr()";
constexpr const char* kBatchNormWhy =
    "its kernels read and write the per-channel vectors for input.size(1) channels";
constexpr const char* kQuantWhy =
    "its kernel writes the observer state for self.size(ch_axis) rows (per row) or one element";

// The verdicts behind the table. Every served operator (ListServedOps) with
// a written argument (Tensor(a!)) other than `self` and a kwarg-only out=
// (whose kernels resize it, which fails beyond the storage flagosd wraps),
// probed with that argument smaller than the op expects (a non-resizable
// storage of exactly its extent inside a marked buffer, ATen's CPU kernel
// of torch 2.13.0), and the kernel source read:
//   _cummax_helper, _cummin_helper: unsafe (values and indices written with
//     self's sizes at their own strides; a stride of 2^31-1 segfaults; a
//     negative dim, which the kernel does not wrap, corrupts the heap even
//     with tensors of one shape). Rule: sizes, and 0 <= dim < self.dim().
//   rrelu_with_noise, rrelu_with_noise_ (and .out, _functional): the kernel
//     checks noise's sizes but writes it as data_ptr()[i]: a stride-0 noise
//     is written beyond its extent. Rule: sizes and dense.
//   _fused_adam_, _fused_adamw_, _fused_sgd_ (each with .tensor_lr, the
//     functional overloads and .out, which clone the states and run the
//     in-place kernel on the clones: a heap overflow in flagosd): unsafe
//     (exp_avgs, exp_avg_sqs, momentum_buffer_list written for
//     param.numel() elements; stride-0 states too).
//   _fused_adagrad_ (and its overloads): grads read for param.numel()
//     elements (a read of another session's memory). Same rules.
//   _amp_update_scale_, _amp_foreach_non_finite_check_and_unscale_ (and
//     .out): safe (every scalar tensor's numel is checked to be 1).
//   _native_batch_norm_legit, _batch_norm_with_update (and .out), and
//     native_batch_norm, batch_norm_update_stats, whose schemas do not mark
//     running_mean/running_var written but whose kernels write them: unsafe
//     (written for input.size(1) channels in training, read in evaluation);
//     the other batch norm overloads with CPU or composite kernels share
//     the rule.
//   _fused_moving_avg_obs_fq_helper (and .out, _functional, and the
//     composite fused_moving_avg_obs_fake_quant): unsafe (per row, the
//     observer state written for self.size(ch_axis) rows).
//   fbgemm_linear_fp16_weight.out, ..._fp32_activation.out: safe (the output
//     is resized, which fails beyond the wrapped storage).
//   _flash_attention_forward_no_dropout_inplace: no CPU kernel (refused by
//     the dispatcher, UNIMPLEMENTED).
//   _no_grad_*_, _set_item, update, mul_.t, sort.*: TorchScript builtins, not
//     in the dispatcher (register_op: NOT_FOUND).
// Ops writing only `self` (370 overloads) write it by its own sizes and
// strides or check the other arguments against it (TensorIterator's
// in-place shape check, index bounds, source numel), probed with a small
// self and larger or out-of-range others: copy_, add_, addcmul_, lerp_,
// masked_fill_, masked_scatter_, bernoulli_.Tensor, index_copy_,
// index_fill_, index_add_, index_reduce_, index_put_ and _index_put_impl_
// (accumulating too), put_, scatter_, scatter_add_, scatter_reduce_,
// embedding_renorm_, addmm_, addmv_, addr_, addbmm_, baddbmm_, renorm_,
// _foreach_add_, _foreach_copy_, _foreach_addcmul_, _foreach_lerp_ (all
// refused or within self), fill_diagonal_, cumsum_, cumprod_, triu_, logit_,
// random_, normal_, squeeze_, unsqueeze_, transpose_ (within self);
// resize_, resize_as_, set_.source_Tensor_storage_offset and as_strided_
// fail on the wrapped storage (set_.source_Tensor stays within its source).
// _philox_uniform_, _philox_normal_, _fill_mem_eff_dropout_mask_,
// _mkldnn_transpose_, _coalesced_, copy_sparse_to_sparse_ and the
// sparse_resize_ ops have no CPU kernel for dense tensors. The exceptions, _sobol_engine_ff_,
// _sobol_engine_scramble_, _sobol_engine_initialize_state_ (and
// _sobol_engine_draw, which reads beyond sobolstate), index by int
// arguments and are refused at register_op (op_runner.cc CheckServable).
const std::vector<OpArgumentRules>& Table() {
  static const auto* const table = [] {
    auto* rules = new std::vector<OpArgumentRules>{
        {"aten::_cummax_helper",
         {{K::kSameSizes, "values", "self"},
          {K::kSameSizes, "indices", "self"},
          {K::kDimensionOf, "dim", "self"}},
         kCumWhy},
        {"aten::_cummin_helper",
         {{K::kSameSizes, "values", "self"},
          {K::kSameSizes, "indices", "self"},
          {K::kDimensionOf, "dim", "self"}},
         kCumWhy},
        {"aten::rrelu_with_noise", {{K::kSameSizes, "noise", "self"}, {K::kDense, "noise"}},
         kRreluWhy},
        {"aten::rrelu_with_noise_", {{K::kSameSizes, "noise", "self"}, {K::kDense, "noise"}},
         kRreluWhy},
        {"aten::rrelu_with_noise_functional",
         {{K::kSameSizes, "noise", "self"}, {K::kDense, "noise"}},
         kRreluWhy},
        {"aten::_fused_adam_",
         FusedOptimizerRules({"grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"}), kAdamWhy},
        {"aten::_fused_adam",
         FusedOptimizerRules({"grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"}), kAdamWhy},
        {"aten::_fused_adamw_",
         FusedOptimizerRules({"grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"}), kAdamWhy},
        {"aten::_fused_adamw",
         FusedOptimizerRules({"grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"}), kAdamWhy},
        {"aten::_fused_sgd_", FusedOptimizerRules({"grads", "momentum_buffer_list"}), kAdamWhy},
        {"aten::_fused_sgd", FusedOptimizerRules({"grads", "momentum_buffer_list"}), kAdamWhy},
        {"aten::_fused_adagrad_", FusedOptimizerRules({"grads", "state_sums"}), kAdamWhy},
        {"aten::_fused_adagrad", FusedOptimizerRules({"grads", "state_sums"}), kAdamWhy},
        {"aten::native_batch_norm", BatchNormRules(), kBatchNormWhy},
        {"aten::_native_batch_norm_legit", BatchNormRules(), kBatchNormWhy},
        {"aten::_native_batch_norm_legit_functional", BatchNormRules(), kBatchNormWhy},
        {"aten::_native_batch_norm_legit_no_training", BatchNormRules(), kBatchNormWhy},
        {"aten::_batch_norm_with_update", BatchNormRules(), kBatchNormWhy},
        {"aten::_batch_norm_with_update_functional", BatchNormRules(), kBatchNormWhy},
        {"aten::_batch_norm_no_update", BatchNormRules(), kBatchNormWhy},
        {"aten::batch_norm_update_stats", BatchNormRules(), kBatchNormWhy},
        {"aten::native_batch_norm_backward", BatchNormRules(), kBatchNormWhy},
        {"aten::batch_norm_backward", BatchNormRules(), kBatchNormWhy},
        {"aten::_batch_norm_impl_index_backward", BatchNormRules(), kBatchNormWhy},
        {"aten::fused_moving_avg_obs_fake_quant", QuantParamRules(), kQuantWhy},
        {"aten::_fused_moving_avg_obs_fq_helper", QuantParamRules(), kQuantWhy},
        {"aten::_fused_moving_avg_obs_fq_helper_functional", QuantParamRules(), kQuantWhy},
    };
    std::sort(rules->begin(), rules->end(),
              [](const OpArgumentRules& a, const OpArgumentRules& b) {
                return absl::string_view(a.op) < absl::string_view(b.op);
              });
    return rules;
  }();
  return *table;
}

}  // namespace

absl::Span<const OpArgumentRules> OpArgumentRuleTable() { return Table(); }

const OpArgumentRules* FindOpArgumentRules(absl::string_view name) {
  const std::vector<OpArgumentRules>& table = Table();
  auto it = std::lower_bound(table.begin(), table.end(), name,
                             [](const OpArgumentRules& rules, absl::string_view n) {
                               return absl::string_view(rules.op) < n;
                             });
  if (it == table.end() || absl::string_view(it->op) != name) return nullptr;
  return &*it;
}

}  // namespace flagos::daemon
