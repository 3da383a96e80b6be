#include "cpu_kernel_facts.h"

namespace flagos {

const std::vector<KernelFact>& CpuKernelFacts() {
  // Batch norm keeps its saved statistics in the input's reduced-precision
  // dtype on the CPU (float32 on CUDA, which the meta functions follow) and
  // returns none (empty tensors) in eval mode; _embedding_bag sizes its
  // auxiliary outputs differently; layer and group norm keep their
  // statistics in the input's dtype; multilabel_margin_loss_forward returns
  // a 0-dimensional loss for a 1-dimensional input without reduction (the
  // meta function: one element). With operands of mixed dtypes, three kernels
  // return another dtype than their meta functions (found by
  // scripts/mixed-sweep): addr's result takes a 0-dim `self`'s dtype, where
  // the meta function ignores it; huber_loss, normal(Tensor, Tensor) and
  // binary_cross_entropy (a weight of another dtype) return their first
  // operand's dtype, where the meta function promotes.
  static const std::vector<KernelFact>* const facts = new std::vector<KernelFact>{
      {"aten::_embedding_bag", /*always=*/true, false, false},
      {"aten::multilabel_margin_loss_forward", true, false, false},
      {"aten::_embedding_bag_forward_only", true, false, false},
      {"aten::native_layer_norm", false, /*reduced_precision_input=*/true, false},
      {"aten::native_group_norm", false, true, false},
      {"aten::native_batch_norm", false, true, /*eval_mode=*/true},
      {"aten::_native_batch_norm_legit", false, true, true},
      {"aten::_native_batch_norm_legit_no_training", true, false, false},
      {"aten::_batch_norm_no_update", true, false, false},
      {"aten::_batch_norm_with_update", false, true, false},
      {"aten::addr", false, false, false, /*mixed_dtype_operands=*/true},
      {"aten::huber_loss", false, false, false, true},
      {"aten::normal", false, false, false, true},
      {"aten::binary_cross_entropy", false, false, false, true},
  };
  return *facts;
}

}  // namespace flagos
