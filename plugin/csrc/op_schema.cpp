#include "op_schema.h"

#include <c10/util/Exception.h>

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

}  // namespace torch_fl
