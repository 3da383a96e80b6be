#include "ops/op_argument_rules.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {
namespace {

using K = ArgumentRuleKind;

std::string SizesText(absl::Span<const int64_t> sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

// What a tensor argument's value is, for the rules.
struct TensorFacts {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t numel = 1;
  bool dense = true;
};

// The tensor a value carries, or nullopt for none / an undefined tensor /
// a value that is not a tensor (left to decoding).
std::optional<TensorFacts> FactsOf(const v1::Value& value) {
  TensorFacts facts;
  if (value.has_tensor()) {
    const v1::TensorRef& ref = value.tensor();
    if (ref.undefined()) return std::nullopt;
    facts.sizes.assign(ref.sizes().begin(), ref.sizes().end());
    facts.strides.assign(ref.strides().begin(), ref.strides().end());
    absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(ref);
    if (!extent.ok()) return std::nullopt;
    facts.numel = extent->numel;
    facts.dense = extent->numel == 0 ||
                  extent->nbytes == static_cast<uint64_t>(extent->numel) * extent->itemsize;
    return facts;
  }
  if (value.has_host_tensor()) {
    facts.sizes.assign(value.host_tensor().sizes().begin(), value.host_tensor().sizes().end());
    for (int64_t size : facts.sizes) facts.numel *= size;
    return facts;
  }
  return std::nullopt;
}

// The values a rule looks at: the tensor itself, or each tensor of a list.
std::vector<const v1::Value*> Elements(const v1::Value& value) {
  std::vector<const v1::Value*> elements;
  if (value.has_list()) {
    for (const v1::Value& element : value.list().values()) elements.push_back(&element);
  } else {
    elements.push_back(&value);
  }
  return elements;
}

}  // namespace

std::string DescribeRules(absl::Span<const ArgumentRule> rules) {
  std::vector<std::string> parts;
  for (const ArgumentRule& rule : rules) {
    switch (rule.kind) {
      case K::kSameSizes:
        parts.push_back(absl::StrCat(rule.argument, ": the sizes of ", rule.reference));
        break;
      case K::kChannels:
        parts.push_back(absl::StrCat(rule.argument, ": [", rule.reference, ".size(1)]"));
        break;
      case K::kChannelsOrEmpty:
        parts.push_back(absl::StrCat(rule.argument, ": [", rule.reference, ".size(1)] or empty"));
        break;
      case K::kPerRowOrOne:
        parts.push_back(absl::StrCat(rule.argument, ": ", rule.reference, ".size(",
                                     rule.dim_argument, ") elements if ", rule.flag_argument,
                                     ", else 1"));
        break;
      case K::kDense: parts.push_back(absl::StrCat(rule.argument, ": dense")); break;
      case K::kOneElement: parts.push_back(absl::StrCat(rule.argument, ": one element")); break;
      case K::kDimensionOf:
        parts.push_back(absl::StrCat(rule.argument, ": 0 .. ", rule.reference, ".dim() - 1"));
        break;
    }
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<BoundArgumentRules> BoundArgumentRules::Bind(
    absl::Span<const ArgumentRule> rules, absl::Span<const SchemaArgument> arguments) {
  const auto index_of = [&](const char* name) {
    if (name == nullptr) return -1;
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (arguments[i].name == name) return static_cast<int>(i);
    }
    return -1;
  };
  BoundArgumentRules bound;
  bound.arguments_.assign(arguments.begin(), arguments.end());
  for (const ArgumentRule& rule : rules) {
    Bound b{rule, rule.kind, index_of(rule.argument), index_of(rule.reference),
            index_of(rule.dim_argument), index_of(rule.flag_argument)};
    // This overload does not have it, or has it as an out= argument.
    if (b.argument < 0 || arguments[b.argument].is_out) continue;
    const bool needs_reference = rule.kind != K::kDense && rule.kind != K::kOneElement;
    if ((needs_reference && b.reference < 0) ||
        (rule.kind == K::kPerRowOrOne && (b.dim_argument < 0 || b.flag_argument < 0))) {
      return absl::InternalError(absl::StrCat(
          "the argument rule for '", rule.argument, "' names an argument this overload lacks (",
          DescribeRules({rule}), "); daemon/ops/op_argument_rule_table.cc is wrong"));
    }
    bound.bound_.push_back(b);
  }
  return bound;
}

std::string BoundArgumentRules::Describe() const {
  std::vector<ArgumentRule> rules;
  for (const Bound& b : bound_) rules.push_back(b.rule);
  return DescribeRules(rules);
}

absl::Status BoundArgumentRules::Check(const v1::OpCall& call, absl::string_view op_name) const {
  const auto where = [&](int index) {
    return absl::StrCat("argument '", arguments_[index].name, "' (#", index, ")");
  };
  const auto value_at = [&](int index) -> const v1::Value* {
    return index < call.args_size() ? &call.args(index) : nullptr;
  };
  // An int or bool argument's value (its default when the call leaves it out).
  const auto int_at = [&](int index) -> std::optional<int64_t> {
    const v1::Value* value = value_at(index);
    if (value == nullptr || value->has_none()) return arguments_[index].int_default;
    if (value->has_i()) return value->i();
    if (value->has_b()) return value->b() ? 1 : 0;
    return std::nullopt;
  };
  const auto refuse = [&](int argument, int element, const std::string& expected,
                          const std::string& given) {
    const std::string element_text = element < 0 ? "" : absl::StrCat(" element ", element);
    return absl::InvalidArgumentError(absl::StrCat(
        op_name, ": ", where(argument), element_text, " must ", expected, ", but ", given,
        "; its kernel would otherwise touch memory beyond it (send tensors of the shapes the "
        "op's schema documents)"));
  };
  for (const Bound& rule : bound_) {
    if (rule.kind == K::kDimensionOf) {
      const v1::Value* reference = value_at(rule.reference);
      std::optional<TensorFacts> facts =
          reference == nullptr ? std::nullopt : FactsOf(*reference);
      const std::optional<int64_t> dim = int_at(rule.argument);
      if (!facts.has_value() || !dim.has_value()) continue;  // left to decoding
      const int64_t rank = static_cast<int64_t>(facts->sizes.size());
      if (*dim < 0 || *dim >= rank) {
        return refuse(rule.argument, -1,
                      rank == 0 ? absl::StrCat("be a dimension of ", where(rule.reference),
                                               ", which has none")
                                : absl::StrCat("be a dimension of ", where(rule.reference), " (0..",
                                               rank - 1, ", not wrapped)"),
                      absl::StrCat("is ", *dim));
      }
      continue;
    }
    const v1::Value* value = value_at(rule.argument);
    if (value == nullptr) continue;  // left out: its default (None)
    const std::vector<const v1::Value*> elements = Elements(*value);
    std::vector<const v1::Value*> references;
    if (rule.reference >= 0 && value_at(rule.reference) != nullptr) {
      references = Elements(*value_at(rule.reference));
    }
    if (rule.kind == K::kSameSizes && value->has_list() && !elements.empty() &&
        elements.size() != references.size()) {
      return refuse(rule.argument, -1,
                    absl::StrCat("hold as many tensors as ", where(rule.reference), " (",
                                 references.size(), ")"),
                    absl::StrCat("holds ", elements.size()));
    }
    for (size_t e = 0; e < elements.size(); ++e) {
      std::optional<TensorFacts> facts = FactsOf(*elements[e]);
      if (!facts.has_value()) continue;
      const int element = value->has_list() ? static_cast<int>(e) : -1;
      const std::string given = absl::StrCat("has sizes ", SizesText(facts->sizes));
      std::optional<TensorFacts> reference;
      if (rule.reference >= 0) {
        const size_t r = references.size() == 1 ? 0 : e;
        if (r >= references.size()) continue;
        reference = FactsOf(*references[r]);
        if (!reference.has_value()) {
          return refuse(rule.argument, element,
                        absl::StrCat("come with ", where(rule.reference), " as a tensor"),
                        "that is missing");
        }
      }
      switch (rule.kind) {
        case K::kSameSizes:
          if (facts->sizes != reference->sizes) {
            return refuse(rule.argument, element,
                          absl::StrCat("have the sizes of ", where(rule.reference), ", ",
                                       SizesText(reference->sizes)),
                          given);
          }
          break;
        case K::kChannels:
        case K::kChannelsOrEmpty: {
          if (reference->sizes.size() < 2) {
            return refuse(rule.argument, element,
                          absl::StrCat("come with ", where(rule.reference),
                                       " of at least 2 dimensions [N, C, ...]"),
                          absl::StrCat("that has sizes ", SizesText(reference->sizes)));
          }
          const std::vector<int64_t> channels = {reference->sizes[1]};
          if (facts->sizes != channels && !(rule.kind == K::kChannelsOrEmpty && facts->numel == 0)) {
            return refuse(rule.argument, element,
                          absl::StrCat("have sizes ", SizesText(channels), " (the channels of ",
                                       where(rule.reference), ")",
                                       rule.kind == K::kChannelsOrEmpty ? " or none" : ""),
                          given);
          }
          break;
        }
        case K::kPerRowOrOne: {
          const std::optional<int64_t> per_row = int_at(rule.flag_argument);
          const std::optional<int64_t> dim = int_at(rule.dim_argument);
          if (!per_row.has_value() || !dim.has_value()) {
            return refuse(rule.argument, element,
                          absl::StrCat("come with ", where(rule.flag_argument), " and ",
                                       where(rule.dim_argument), " given"),
                          "one is missing");
          }
          int64_t expected = 1;
          if (*per_row != 0) {
            const int64_t rank = static_cast<int64_t>(reference->sizes.size());
            if (*dim < 0 || *dim >= rank) {
              return refuse(rule.dim_argument, -1,
                            absl::StrCat("be a dimension of ", where(rule.reference), " (0..",
                                         rank - 1, ")"),
                            absl::StrCat("is ", *dim));
            }
            expected = reference->sizes[*dim];
          }
          if (facts->numel != expected) {
            return refuse(rule.argument, element,
                          absl::StrCat("have ", expected, " elements (",
                                       *per_row != 0 ? "the rows of " : "one per tensor of ",
                                       where(rule.reference), ")"),
                          absl::StrCat(given, " (", facts->numel, " elements)",
                                       facts->numel == 0
                                           ? "; its kernel would resize an empty one in place, "
                                             "which flagosd cannot do to device memory: give it "
                                             "its statistics first (run the first step on the CPU)"
                                           : ""));
          }
          break;
        }
        case K::kDense:
          if (!facts->dense) {
            return refuse(rule.argument, element,
                          "be dense (span exactly its elements: no gaps, no stride-0 dimension)",
                          absl::StrCat(given, " and strides ", SizesText(facts->strides)));
          }
          break;
        case K::kOneElement:
          if (facts->numel != 1) {
            return refuse(rule.argument, element, "have exactly one element",
                          absl::StrCat(given, " (", facts->numel, " elements)"));
          }
          break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace flagos::daemon
