#include "op_schema.h"

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_fl {

// The alias annotation of an argument or return; for lists (`Tensor(a!)[]`)
// the annotation of the elements.
const c10::AliasInfo* AliasOf(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info != nullptr && info->beforeSets().empty() && !info->containedTypes().empty()) {
    return &info->containedTypes()[0];
  }
  return info;
}

bool IsWritten(const c10::Argument& a) {
  const c10::AliasInfo* info = AliasOf(a);
  return info != nullptr && info->isWrite();
}

// The index of the argument that return `ret` aliases.
size_t AliasedArgument(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* r = AliasOf(schema.returns()[ret]);
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = AliasOf(schema.arguments()[i]);
    if (a == nullptr) continue;
    for (const auto& set : r->beforeSets()) {
      if (a->beforeSets().count(set) != 0) return i;
    }
  }
  TORCH_CHECK(false, "flagos: ", schema, ": return ", ret, " aliases no argument");
}

bool ReturnsOnlyTensors(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    const c10::TypePtr& type = r.real_type();
    bool tensor = type->kind() == c10::TypeKind::TensorType;
    bool tensor_list = type->kind() == c10::TypeKind::ListType &&
                       type->containedType(0)->kind() == c10::TypeKind::TensorType;
    if (!tensor && !tensor_list) return false;
  }
  return true;
}

// Views only: nothing to run in the daemon.
bool IsPureView(const c10::FunctionSchema& schema) {
  if (schema.returns().empty()) return false;
  for (const c10::Argument& a : schema.arguments()) {
    if (IsWritten(a)) return false;
  }
  for (const c10::Argument& r : schema.returns()) {
    const c10::AliasInfo* info = AliasOf(r);
    if (info == nullptr || info->isWrite()) return false;
  }
  return true;
}

namespace {

bool IsGeneratorArgument(const c10::Argument& a) {
  c10::TypePtr type = a.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
  return type->kind() == c10::TypeKind::GeneratorType;
}

std::unique_ptr<OpTraits> ComputeTraits(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  auto traits = std::make_unique<OpTraits>();
  const std::string& name = schema.name();
  traits->name = name;
  traits->overload = schema.overload_name();
  traits->describe = traits->overload.empty() ? name : name + "." + traits->overload;
  traits->returns_only_tensors = ReturnsOnlyTensors(schema);
  traits->pure_view = IsPureView(schema);
  traits->nondeterministic_seeded = op.hasTag(at::Tag::nondeterministic_seeded);
  traits->dynamic_output_shape = op.hasTag(at::Tag::dynamic_output_shape);
  traits->is_index = name == "aten::index";
  traits->float_values_keep_metadata =
      op.hasTag(at::Tag::pointwise) || name.rfind("aten::_foreach_", 0) == 0;
  traits->allows_host_operands =
      name == "aten::index" || name == "aten::index_put_" || name == "aten::index_put" ||
      name == "aten::_index_put_impl_" || name == "aten::_unsafe_index" ||
      name == "aten::_unsafe_index_put";
  const auto& arguments = schema.arguments();
  traits->written.resize(arguments.size());
  traits->generator.resize(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    traits->written[i] = IsWritten(arguments[i]);
    traits->generator[i] = IsGeneratorArgument(arguments[i]);
    if (traits->written[i] && arguments[i].real_type()->kind() == c10::TypeKind::TensorType) {
      ++traits->written_tensors;
    }
    if (traits->training_argument < 0 && arguments[i].name() == "training") {
      traits->training_argument = static_cast<int>(i);
    }
  }
  const auto& returns = schema.returns();
  traits->returns.resize(returns.size());
  for (size_t j = 0; j < returns.size(); ++j) {
    OpTraits::Return& r = traits->returns[j];
    r.tensor = returns[j].real_type()->kind() == c10::TypeKind::TensorType;
    const c10::AliasInfo* alias = AliasOf(returns[j]);
    if (alias == nullptr) continue;
    r.kind = alias->isWrite() ? OpTraits::ReturnKind::kWritten : OpTraits::ReturnKind::kView;
    r.aliased = OpTraits::kNoArgument;
    for (size_t i = 0; i < arguments.size() && r.aliased == OpTraits::kNoArgument; ++i) {
      const c10::AliasInfo* a = AliasOf(arguments[i]);
      if (a == nullptr) continue;
      for (const auto& set : alias->beforeSets()) {
        if (a->beforeSets().count(set) != 0) {
          r.aliased = i;
          break;
        }
      }
    }
  }
  return traits;
}

bool Describes(const OpTraits& traits, const c10::FunctionSchema& schema) {
  return traits.returns.size() == schema.returns().size() &&
         traits.written.size() == schema.arguments().size() && traits.name == schema.name() &&
         traits.overload == schema.overload_name();
}

struct TraitsRegistry {
  std::mutex mu;
  // By schema address; traits are never freed (a stale entry, from an
  // operator deregistered and another registered at the same address, is
  // replaced and kept alive for threads that may still read it).
  std::unordered_map<const c10::FunctionSchema*, OpTraits*> by_schema;
  std::vector<std::unique_ptr<OpTraits>> all;
};

TraitsRegistry& Registry() {
  static auto* registry = new TraitsRegistry();  // never destroyed
  return *registry;
}

const OpTraits& LookUpOrCompute(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  TraitsRegistry& registry = Registry();
  {
    std::lock_guard<std::mutex> lock(registry.mu);
    auto it = registry.by_schema.find(key);
    if (it != registry.by_schema.end() && Describes(*it->second, *key)) return *it->second;
  }
  // Computed outside the lock (hasTag and the alias sets take their own).
  std::unique_ptr<OpTraits> traits = ComputeTraits(op);
  std::lock_guard<std::mutex> lock(registry.mu);
  auto it = registry.by_schema.find(key);
  if (it != registry.by_schema.end() && Describes(*it->second, *key)) return *it->second;
  OpTraits* raw = traits.get();
  registry.all.push_back(std::move(traits));
  registry.by_schema[key] = raw;
  return *raw;
}

}  // namespace

const OpTraits& TraitsOf(const c10::OperatorHandle& op) {
  // Per thread, without a lock: the operators this thread has called.
  thread_local std::unordered_map<const c10::FunctionSchema*, const OpTraits*> local;
  const c10::FunctionSchema* key = &op.schema();
  auto it = local.find(key);
  if (it != local.end() && Describes(*it->second, *key)) return *it->second;
  const OpTraits& traits = LookUpOrCompute(op);
  local[key] = &traits;
  return traits;
}

}  // namespace torch_fl
