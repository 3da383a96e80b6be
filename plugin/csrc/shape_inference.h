// Output metadata of an operator call, inferred on meta tensors.
//
// The op runs on meta tensors mirroring its arguments (same sizes, strides,
// offsets, dtypes, shared storages). What comes out — the metadata of every
// return and of every written argument afterwards — is cached by operator
// and argument metadata (and non-tensor argument values; for pointwise and
// _foreach_ ops float values by kind only: OpTraits::
// float_values_keep_metadata), because a meta kernel can cost far more than
// the op itself (several are Python).
//
// Thread safety: InferOnMeta may be called from any thread.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "op_schema.h"

namespace torch_fl {

struct TensorMeta {
  bool defined = false;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  size_t storage_nbytes = 0;
};

// One entry per return (and per argument); a Tensor return is one TensorMeta,
// a Tensor[] return several.
struct InferredCall {
  std::vector<std::vector<TensorMeta>> returns;
  // Per argument: the tensors of a written argument after the op; empty for
  // arguments the op does not write.
  std::vector<std::vector<TensorMeta>> written;
};

// The inferred call, shared with the cache (never modified); nullptr when
// the call cannot be inferred on meta (no meta kernel, or an output size
// that depends on the data): run it synchronously instead. Shape and dtype
// errors are thrown, as the op itself would. `traits` are TraitsOf(op).
std::shared_ptr<const InferredCall> InferOnMeta(const c10::OperatorHandle& op,
                                                const OpTraits& traits,
                                                c10::ArrayRef<c10::IValue> args);

// How many calls this process inferred on meta tensors (cache misses and
// uncacheable calls): torch_fl._C._meta_inference_count().
uint64_t MetaInferenceCount();

}  // namespace torch_fl
