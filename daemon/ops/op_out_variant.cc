// out= overloads and arguments (op_out_variant.h).
#include "ops/op_out_variant.h"

#include <ATen/ops/empty_strided.h>

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace flagos::daemon {

std::optional<c10::OperatorHandle> FindOutVariant(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::Argument>& arguments = schema.arguments();
  const std::vector<c10::Argument>& returns = schema.returns();
  if (returns.empty()) return std::nullopt;
  for (const c10::Argument& argument : arguments) {
    if (argument.alias_info() != nullptr) return std::nullopt;  // not functional
  }
  for (const c10::Argument& ret : returns) {
    if (ret.type()->kind() != c10::TypeKind::TensorType || ret.alias_info() != nullptr) {
      return std::nullopt;
    }
  }
  // Every overload name of every operator, once.
  static const auto* const overloads = [] {
    auto* map = new absl::flat_hash_map<std::string, std::vector<std::string>>();
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      (*map)[name.name].push_back(name.overload_name);
    }
    return map;
  }();
  auto it = overloads->find(op.operator_name().name);
  if (it == overloads->end()) return std::nullopt;
  for (const std::string& overload : it->second) {
    std::optional<c10::OperatorHandle> candidate =
        c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.operator_name().name, overload));
    if (!candidate.has_value() || candidate->operator_name() == op.operator_name()) continue;
    const std::vector<c10::Argument>& out_arguments = candidate->schema().arguments();
    if (out_arguments.size() != arguments.size() + returns.size() ||
        candidate->schema().returns().size() != returns.size()) {
      continue;
    }
    bool matches = true;
    for (size_t i = 0; i < arguments.size() && matches; ++i) {
      matches = out_arguments[i].name() == arguments[i].name() &&
                *out_arguments[i].type() == *arguments[i].type();
    }
    for (size_t i = arguments.size(); i < out_arguments.size() && matches; ++i) {
      matches = out_arguments[i].is_out() &&
                out_arguments[i].type()->kind() == c10::TypeKind::TensorType;
    }
    if (matches) return candidate;
  }
  return std::nullopt;
}

bool OutputsIntact(const v1::OpCall& call,
                 const std::vector<std::pair<at::Tensor, const void*>>& made) {
  for (int i = 0; i < call.outputs_size(); ++i) {
    const v1::TensorRef& ref = call.outputs(i);
    const at::Tensor& t = made[i].first;
    if (t.sizes() != c10::IntArrayRef(ref.sizes().data(), ref.sizes_size()) ||
        t.strides() != c10::IntArrayRef(ref.strides().data(), ref.strides_size()) ||
        t.data_ptr() != made[i].second || t.is_conj() || t.is_neg()) {
      return false;
    }
  }
  return true;
}

std::vector<OutArgument> ReplaceOutArguments(const std::vector<c10::Argument>& arguments,
                                             torch::jit::Stack* stack) {
  std::vector<OutArgument> outs;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!arguments[i].is_out() || !(*stack)[i].isTensor()) continue;
    const at::Tensor destination = (*stack)[i].toTensor();
    if (!destination.defined()) continue;
    at::Tensor scratch =
        at::empty_strided(destination.sizes(), destination.strides(), destination.options());
    (*stack)[i] = c10::IValue(scratch);
    outs.push_back(OutArgument{&arguments[i].name(), destination, std::move(scratch)});
  }
  return outs;
}

}  // namespace flagos::daemon
