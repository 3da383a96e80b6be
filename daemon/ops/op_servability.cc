// Which operators flagosd serves (op_servability.h): c10 function schemas and
// the dispatcher's operator list, no operator headers.
#include "ops/op_servability.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "collectives/collective_ops.h"
#include "ops/op_error_context.h"

namespace flagos::daemon {
namespace {

// The reason alone of a CheckServable refusal.
std::string ServableReason(const absl::Status& refused) {
  absl::string_view text = refused.message();
  constexpr absl::string_view kLead = "flagosd does not run this operator: ";
  if (size_t at = text.find(kLead); at != absl::string_view::npos) text.remove_prefix(at + kLead.size());
  if (size_t at = text.find(" (docs/"); at != absl::string_view::npos) text = text.substr(0, at);
  return std::string(text);
}

}  // namespace

absl::Status CheckServable(const c10::FunctionSchema& schema, const std::string& full_name) {
  const auto refused = [&](absl::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat(
        "register_op ", full_name, ": flagosd does not run this operator: ", why,
        " (docs/reference/errors.md lists what is refused)"));
  };
  if (!absl::StartsWith(schema.name(), "aten::") &&
      !absl::StartsWith(schema.name(), absl::StrCat(CollectiveOpsNamespace(), "::"))) {
    return refused(absl::StrCat("it is not an ATen operator; flagosd runs only ATen's and its own ",
                                CollectiveOpsNamespace(), " collectives"));
  }
  for (const c10::Argument& r : schema.returns()) {
    const c10::AliasInfo* alias = r.alias_info();
    if (alias != nullptr && !alias->isWrite()) {
      return refused("it returns a view of an argument; torch_fl computes views in the client");
    }
  }
  if (schema.name() == "aten::from_file") return refused("it reads and creates host files");
  if (absl::StartsWith(schema.name(), "aten::_sobol_engine_")) {
    // The state of torch.quasirandom.SobolEngine, which lives on the CPU
    // whatever the device: torch_fl never forwards these.
    return refused(
        "its kernel indexes its tensors by its int arguments (dimension, num_generated) "
        "without checking their sizes; torch.quasirandom.SobolEngine keeps them on the CPU");
  }
  for (const c10::Argument& a : schema.arguments()) {
    c10::TypePtr type = a.real_type();
    if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
    if (type->kind() == c10::TypeKind::StorageType) {
      return refused("it takes a raw storage, whose memory flagosd cannot check");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<BoundArgumentRules> BindArgumentRules(const c10::FunctionSchema& schema) {
  const OpArgumentRules* rules = FindOpArgumentRules(schema.name());
  if (rules == nullptr) return BoundArgumentRules();
  std::vector<SchemaArgument> arguments;
  for (const c10::Argument& a : schema.arguments()) {
    SchemaArgument argument{a.name(), std::nullopt, a.is_out()};
    if (a.default_value().has_value()) {
      const c10::IValue& d = *a.default_value();
      if (d.isInt()) argument.int_default = d.toInt();
      if (d.isBool()) argument.int_default = d.toBool() ? 1 : 0;
    }
    arguments.push_back(std::move(argument));
  }
  return BoundArgumentRules::Bind(rules->rules, arguments);
}

std::string ListServedOps() {
  std::vector<std::string> lines;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    std::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema(name);
    if (!handle.has_value()) continue;  // a name without a schema registered yet
    const std::string full_name = OperatorFullName(name);
    const absl::Status servable = CheckServable(handle->schema(), full_name);
    absl::StatusOr<BoundArgumentRules> rules = BindArgumentRules(handle->schema());
    if (servable.ok() && (!rules.ok() || !rules->empty())) {
      // Served, with the argument rules checked before its kernel runs.
      lines.push_back(absl::StrCat(full_name, "\tserved\t",
                                   rules.ok() ? rules->Describe()
                                              : std::string(rules.status().message())));
    } else if (servable.ok()) {
      lines.push_back(absl::StrCat(full_name, "\tserved"));
    } else {
      lines.push_back(absl::StrCat(full_name, "\trefused\t", ServableReason(servable)));
    }
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrCat(absl::StrJoin(lines, "\n"), "\n");
}

}  // namespace flagos::daemon
