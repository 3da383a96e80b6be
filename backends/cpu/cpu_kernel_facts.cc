#include "cpu_kernel_facts.h"

namespace flagos {

const std::vector<KernelFact>& CpuKernelFacts() {
  // Batch norm keeps its saved statistics in the input's reduced-precision
  // dtype on the CPU (float32 on CUDA, which the meta functions follow) and
  // returns none (empty tensors) in eval mode; _embedding_bag sizes its
  // auxiliary outputs differently; layer and group norm keep their
  // statistics in the input's dtype; multilabel_margin_loss_forward returns
  // a 0-dimensional loss for a 1-dimensional input without reduction (the
  // meta function: one element).
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
  };
  return *facts;
}

}  // namespace flagos
