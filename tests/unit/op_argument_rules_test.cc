#include "ops/op_argument_rules.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tensor_refs.h"

namespace flagos::daemon {
namespace {

constexpr int kFloat = 6;

v1::TensorRef Ref(std::initializer_list<int64_t> sizes, std::vector<int64_t> strides = {}) {
  return test_refs::MakeRef(4096, sizes, kFloat, 0, std::move(strides));
}

v1::Value T(v1::TensorRef ref) {
  v1::Value value;
  *value.mutable_tensor() = std::move(ref);
  return value;
}

v1::Value List(std::initializer_list<v1::TensorRef> refs) {
  v1::Value value;
  value.mutable_list();
  for (const v1::TensorRef& ref : refs) *value.mutable_list()->add_values()->mutable_tensor() = ref;
  return value;
}

v1::Value I(int64_t i) {
  v1::Value value;
  value.set_i(i);
  return value;
}

v1::OpCall Call(std::initializer_list<v1::Value> args) {
  v1::OpCall call;
  for (const v1::Value& arg : args) *call.add_args() = arg;
  return call;
}

std::vector<SchemaArgument> Arguments(std::initializer_list<const char*> names) {
  std::vector<SchemaArgument> arguments;
  for (const char* name : names) arguments.push_back({name, std::nullopt});
  return arguments;
}

BoundArgumentRules Bound(const char* op, const std::vector<SchemaArgument>& arguments) {
  const OpArgumentRules* rules = FindOpArgumentRules(op);
  EXPECT_NE(rules, nullptr) << op;
  absl::StatusOr<BoundArgumentRules> bound = BoundArgumentRules::Bind(rules->rules, arguments);
  EXPECT_TRUE(bound.ok()) << bound.status();
  return *std::move(bound);
}

TEST(OpArgumentRulesTest, TheTableIsFoundByOpNameOnly) {
  EXPECT_NE(FindOpArgumentRules("aten::_cummax_helper"), nullptr);
  EXPECT_NE(FindOpArgumentRules("aten::_fused_adam_"), nullptr);
  EXPECT_EQ(FindOpArgumentRules("aten::add"), nullptr);
  EXPECT_EQ(FindOpArgumentRules("aten::_cummax_helper.default"), nullptr);
  absl::Span<const OpArgumentRules> table = OpArgumentRuleTable();
  for (size_t i = 1; i < table.size(); ++i) {
    EXPECT_LT(absl::string_view(table[i - 1].op), absl::string_view(table[i].op));
  }
}

TEST(OpArgumentRulesTest, SameSizesNamesTheArgumentTheExpectedAndTheGivenSizes) {
  const BoundArgumentRules rules =
      Bound("aten::_cummax_helper", Arguments({"self", "values", "indices", "dim"}));
  EXPECT_TRUE(rules.Check(Call({T(Ref({2, 3})), T(Ref({2, 3})), T(Ref({2, 3})), I(1)}),
                          "aten::_cummax_helper")
                  .ok());
  // Any strides: the kernel walks them; the extent covers them.
  EXPECT_TRUE(rules.Check(Call({T(Ref({2, 3})), T(Ref({2, 3}, {1, 2})), T(Ref({2, 3})), I(1)}),
                          "aten::_cummax_helper")
                  .ok());
  const absl::Status s = rules.Check(
      Call({T(Ref({2})), T(Ref({1}, {536870912})), T(Ref({2})), I(0)}), "aten::_cummax_helper");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "aten::_cummax_helper: argument 'values' (#1) must have the sizes "
                               "of argument 'self' (#0), [2], but has sizes [1]; "))
      << s;
}

TEST(OpArgumentRulesTest, ADimensionMustBeInRangeAndNotNegative) {
  const BoundArgumentRules rules =
      Bound("aten::_cummin_helper", Arguments({"self", "values", "indices", "dim"}));
  const auto call = [](int64_t dim) {
    return Call({T(Ref({2, 3})), T(Ref({2, 3})), T(Ref({2, 3})), I(dim)});
  };
  EXPECT_TRUE(rules.Check(call(0), "op").ok());
  EXPECT_TRUE(rules.Check(call(1), "op").ok());
  for (int64_t dim : {-1, 2}) {
    const absl::Status s = rules.Check(call(dim), "op");
    EXPECT_TRUE(absl::StartsWith(s.message(),
                                 absl::StrCat("op: argument 'dim' (#3) must be a dimension of "
                                              "argument 'self' (#0) (0..1, not wrapped), but is ",
                                              dim)))
        << s;
  }
  const absl::Status s =
      rules.Check(Call({T(Ref({})), T(Ref({})), T(Ref({})), I(0)}), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'dim' (#3) must be a dimension of argument 'self' "
                               "(#0), which has none, but is 0"))
      << s;
}

TEST(OpArgumentRulesTest, TensorListsAreCheckedElementByElementAndMayBeEmpty) {
  const BoundArgumentRules rules = Bound(
      "aten::_fused_adam_", Arguments({"self", "grads", "exp_avgs", "exp_avg_sqs",
                                       "max_exp_avg_sqs", "state_steps", "lr", "grad_scale"}));
  const auto call = [](v1::Value exp_avgs, v1::Value grad_scale) {
    return Call({List({Ref({4}), Ref({3})}), List({Ref({4}), Ref({3})}), exp_avgs,
                 List({Ref({4}), Ref({3})}), List({}), List({Ref({}), Ref({})}), I(1),
                 grad_scale});
  };
  v1::Value none;
  none.set_none(true);
  EXPECT_TRUE(rules.Check(call(List({Ref({4}), Ref({3})}), none), "op").ok());
  absl::Status s = rules.Check(call(List({Ref({4}), Ref({2})}), none), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'exp_avgs' (#2) element 1 must have the sizes of "
                               "argument 'self' (#0), [3], but has sizes [2]"))
      << s;
  s = rules.Check(call(List({Ref({4})}), none), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'exp_avgs' (#2) must hold as many tensors as "
                               "argument 'self' (#0) (2), but holds 1"))
      << s;
  s = rules.Check(call(List({Ref({4}, {0}), Ref({3})}), none), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'exp_avgs' (#2) element 0 must be dense (span exactly "
                               "its elements: no gaps, no stride-0 dimension), but has sizes [4] "
                               "and strides [0]"))
      << s;
  s = rules.Check(call(List({Ref({4}), Ref({3})}), T(Ref({0}))), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'grad_scale' (#7) must have exactly one element, but "
                               "has sizes [0] (0 elements)"))
      << s;
}

TEST(OpArgumentRulesTest, ChannelsComeFromTheInputsSecondDimension) {
  const BoundArgumentRules rules = Bound(
      "aten::native_batch_norm_backward",
      Arguments({"grad_out", "input", "weight", "running_mean", "running_var", "save_mean",
                 "save_invstd", "train", "eps", "output_mask"}));
  v1::Value undefined;
  undefined.mutable_tensor()->set_undefined(true);
  const auto call = [&](v1::Value running_mean, v1::Value save_mean) {
    return Call({T(Ref({2, 5, 3})), T(Ref({2, 5, 3})), undefined, running_mean, T(Ref({5})),
                 save_mean, T(Ref({0}))});
  };
  EXPECT_TRUE(rules.Check(call(T(Ref({5})), T(Ref({5}))), "op").ok());
  EXPECT_TRUE(rules.Check(call(T(Ref({5})), T(Ref({0}))), "op").ok());  // empty in eval
  absl::Status s = rules.Check(call(T(Ref({0})), T(Ref({5}))), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'running_mean' (#3) must have sizes [5] (the channels "
                               "of argument 'input' (#1)), but has sizes [0]"))
      << s;
  s = rules.Check(call(T(Ref({5, 1})), T(Ref({5}))), "op");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpArgumentRulesTest, PerRowStateFollowsTheFlagAndItsDefault) {
  std::vector<SchemaArgument> arguments =
      Arguments({"self", "observer_on", "fake_quant_on", "running_min", "running_max", "scale",
                 "zero_point", "averaging_const", "quant_min", "quant_max", "ch_axis",
                 "per_row_fake_quant"});
  arguments.back().int_default = 0;
  const BoundArgumentRules rules = Bound("aten::_fused_moving_avg_obs_fq_helper", arguments);
  v1::Value yes;
  yes.set_b(true);
  const auto call = [&](v1::TensorRef state, int64_t ch_axis, const v1::Value* per_row) {
    v1::OpCall c = Call({T(Ref({6, 4})), T(Ref({1})), T(Ref({1})), T(state), T(state), T(state),
                         T(state), I(0), I(0), I(255), I(ch_axis)});
    if (per_row != nullptr) *c.add_args() = *per_row;
    return c;
  };
  EXPECT_TRUE(rules.Check(call(Ref({1}), 0, nullptr), "op").ok());  // the default: per tensor
  EXPECT_TRUE(rules.Check(call(Ref({6}), 0, &yes), "op").ok());
  EXPECT_TRUE(rules.Check(call(Ref({4}), 1, &yes), "op").ok());
  absl::Status s = rules.Check(call(Ref({1}), 0, &yes), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'running_min' (#3) must have 6 elements (the rows of "
                               "argument 'self' (#0)), but has sizes [1] (1 elements)"))
      << s;
  s = rules.Check(call(Ref({6}), 2, &yes), "op");
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "op: argument 'ch_axis' (#10) must be a dimension of argument "
                               "'self' (#0) (0..1), but is 2"))
      << s;
}

TEST(OpArgumentRulesTest, BindingSkipsWhatAnOverloadLacksAndOutArguments) {
  const OpArgumentRules* rules = FindOpArgumentRules("aten::native_batch_norm");
  ASSERT_NE(rules, nullptr);
  // No running statistics (as _native_batch_norm_legit.no_stats): only
  // weight and bias are bound.
  absl::StatusOr<BoundArgumentRules> bound =
      BoundArgumentRules::Bind(rules->rules, Arguments({"input", "weight", "bias", "training"}));
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(bound->Describe(), "weight: [input.size(1)]; bias: [input.size(1)]");
  std::vector<SchemaArgument> with_out = Arguments({"input", "weight", "save_mean"});
  with_out[2].is_out = true;
  bound = BoundArgumentRules::Bind(rules->rules, with_out);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(bound->Describe(), "weight: [input.size(1)]");
  // A rule whose reference the schema lacks is a mistake in the table.
  bound = BoundArgumentRules::Bind(rules->rules, Arguments({"weight"}));
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInternal);
}

TEST(OpArgumentRulesTest, NoneAndUndefinedArgumentsPass) {
  const BoundArgumentRules rules =
      Bound("aten::rrelu_with_noise", Arguments({"self", "noise", "lower", "upper"}));
  v1::Value undefined;
  undefined.mutable_tensor()->set_undefined(true);
  EXPECT_TRUE(rules.Check(Call({T(Ref({4})), undefined}), "op").ok());
  EXPECT_TRUE(rules.Check(Call({T(Ref({4}))}), "op").ok());
  // A host tensor's sizes count too.
  v1::Value host;
  host.mutable_host_tensor()->add_sizes(3);
  EXPECT_EQ(rules.Check(Call({T(Ref({4})), host}), "op").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flagos::daemon
