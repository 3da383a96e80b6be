#include "cpu_dtype_widening.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace flagos {
namespace {

using c10::ScalarType;

// The complex dtype of a real one and the real dtype of a complex one
// (Undefined where there is none).
ScalarType ComplexOf(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return ScalarType::ComplexHalf;
    case ScalarType::Float: return ScalarType::ComplexFloat;
    case ScalarType::Double: return ScalarType::ComplexDouble;
    default: return ScalarType::Undefined;
  }
}
ScalarType RealOf(ScalarType t) {
  switch (t) {
    case ScalarType::ComplexHalf: return ScalarType::Half;
    case ScalarType::ComplexFloat: return ScalarType::Float;
    case ScalarType::ComplexDouble: return ScalarType::Double;
    default: return ScalarType::Undefined;
  }
}

// The dtype a return of dtype `t` goes back to, or Undefined to keep it.
ScalarType BackDtype(const DtypeWidening& w, ScalarType t) {
  if (t == w.compute) return w.missing;
  if (t != ScalarType::Undefined && t == ComplexOf(w.compute)) return ComplexOf(w.missing);
  if (t != ScalarType::Undefined && t == RealOf(w.compute)) return RealOf(w.missing);
  return ScalarType::Undefined;
}

const absl::flat_hash_map<std::string, std::vector<const DtypeWidening*>>& ByOperator() {
  static const auto* const map = [] {
    auto* m = new absl::flat_hash_map<std::string, std::vector<const DtypeWidening*>>();
    for (const DtypeWidening& w : CpuDtypeWidenings()) (*m)[w.op].push_back(&w);
    return m;
  }();
  return *map;
}

// The dtype of the call's first tensor argument (Undefined when none).
ScalarType FirstTensorDtype(const torch::jit::Stack& stack) {
  for (const c10::IValue& v : stack) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) return v.toTensor().scalar_type();
      continue;
    }
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (t.defined()) return t.scalar_type();
      }
    }
  }
  return ScalarType::Undefined;
}

bool IsScalarArgument(const c10::Argument& argument) {
  c10::TypePtr type = argument.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
  return type->kind() == c10::TypeKind::NumberType;
}

}  // namespace

const std::vector<DtypeWidening>& CpuDtypeWidenings() {
  using S = ScalarType;
  // Each row: CUDA's kernel takes `missing`, ATen's CPU kernel does not
  // (it raises "... not implemented for '<dtype>'"); OpInfo's
  // supported_dtypes("cuda") minus supported_dtypes("cpu"), checked against
  // the CPU kernels of this torch. The op sweep's "CUDA's extra dtypes"
  // rows (docs/reference/operator-support.md) compare each with a CPU
  // reference computed in a wider dtype.
  static const char kHistc[] =
      "integer input: the output has the input's dtype; min and max are read as int64 "
      "(truncated), min == max takes the data's extremes, then min - 1 and max + 1; an element "
      "x in [min, max] counts in bin (x - min) * bins / (max - min) (integer division; bins "
      "for x == max), which float64 computes exactly while |x| * bins < 2^53";
  static const char kAbsBool[] = "abs of bool is the identity (the output is bool)";
  static const char kTraceBool[] = "the sum of the diagonal's trues, as int64";
  static const char kReduced[] =
      "float16 / bfloat16 input: CUDA's kernel accumulates in float32 and rounds the result "
      "to the input's dtype";
  static const std::vector<DtypeWidening>* const table = new std::vector<DtypeWidening>{
      {"aten::_upsample_bilinear2d_aa", S::Half, S::Float, false, kReduced},
      {"aten::_upsample_bilinear2d_aa", S::BFloat16, S::Float, false, kReduced},
      {"aten::_upsample_bilinear2d_aa_backward", S::Half, S::Float, false, kReduced},
      {"aten::_upsample_bilinear2d_aa_backward", S::BFloat16, S::Float, false, kReduced},
      {"aten::abs", S::Bool, S::Byte, false, kAbsBool},
      {"aten::abs_", S::Bool, S::Byte, false, kAbsBool},
      {"aten::avg_pool3d", S::Half, S::Float, false, kReduced},
      {"aten::avg_pool3d", S::BFloat16, S::Float, false, kReduced},
      {"aten::avg_pool3d_backward", S::Half, S::Float, false, kReduced},
      {"aten::avg_pool3d_backward", S::BFloat16, S::Float, false, kReduced},
      {"aten::histc", S::Byte, S::Double, true, kHistc},
      {"aten::histc", S::Char, S::Double, true, kHistc},
      {"aten::histc", S::Short, S::Double, true, kHistc},
      {"aten::histc", S::Int, S::Double, true, kHistc},
      {"aten::histc", S::Long, S::Double, true, kHistc},
      {"aten::multi_margin_loss", S::Half, S::Float, false, kReduced},
      {"aten::multi_margin_loss", S::BFloat16, S::Float, false, kReduced},
      {"aten::multi_margin_loss_backward", S::Half, S::Float, false, kReduced},
      {"aten::multi_margin_loss_backward", S::BFloat16, S::Float, false, kReduced},
      {"aten::multilabel_margin_loss_backward", S::Half, S::Float, false, kReduced},
      {"aten::multilabel_margin_loss_backward", S::BFloat16, S::Float, false, kReduced},
      {"aten::multilabel_margin_loss_forward", S::Half, S::Float, false, kReduced},
      {"aten::multilabel_margin_loss_forward", S::BFloat16, S::Float, false, kReduced},
      {"aten::rrelu_with_noise", S::Half, S::Float, false,
       "training: noise drawn in float32, the output rounded to float16"},
      {"aten::rrelu_with_noise_", S::Half, S::Float, false,
       "training: noise drawn in float32, the output rounded to float16"},
      {"aten::trace", S::Bool, S::Byte, false, kTraceBool},
  };
  return *table;
}

const DtypeWidening* FindDtypeWidening(const c10::OperatorHandle& op,
                                       const torch::jit::Stack& stack) {
  const auto& by_operator = ByOperator();
  auto it = by_operator.find(op.operator_name().name);
  if (it == by_operator.end()) return nullptr;
  const ScalarType dtype = FirstTensorDtype(stack);
  for (const DtypeWidening* w : it->second) {
    if (w->missing == dtype) return w;
  }
  return nullptr;
}

void CallWidened(const c10::OperatorHandle& op, const DtypeWidening& widening,
                 torch::jit::Stack* stack) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  // (the caller's tensor, its copy in the compute dtype) for written ones.
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  const auto widen = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == widening.missing ? t.to(widening.compute) : t;
  };
  for (size_t i = 0; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    const c10::Argument* argument = i < arguments.size() ? &arguments[i] : nullptr;
    const bool writes = argument != nullptr && argument->alias_info() != nullptr &&
                        argument->alias_info()->isWrite();
    if (value.isTensor()) {
      const at::Tensor original = value.toTensor();
      at::Tensor wide = widen(original);
      if (wide.is_same(original)) continue;
      if (writes) written.emplace_back(original, wide);
      value = c10::IValue(std::move(wide));
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : value.toTensorVector()) list.push_back(widen(t));
      value = c10::IValue(std::move(list));
    } else if (widening.integer_scalars && value.isDouble() && argument != nullptr &&
               IsScalarArgument(*argument)) {
      value = c10::IValue(c10::Scalar(value.toDouble()).to<int64_t>());
    }
  }
  op.callBoxed(*stack);
  for (auto& [original, wide] : written) original.copy_(wide);
  for (c10::IValue& value : *stack) {
    if (!value.isTensor()) continue;
    const at::Tensor result = value.toTensor();
    if (!result.defined()) continue;
    bool is_written = false;
    for (const auto& [original, wide] : written) {
      if (result.is_same(wide)) {
        value = c10::IValue(original);
        is_written = true;
        break;
      }
    }
    if (is_written) continue;
    const ScalarType back = BackDtype(widening, result.scalar_type());
    if (back != ScalarType::Undefined) value = c10::IValue(result.to(back));
  }
}

}  // namespace flagos
