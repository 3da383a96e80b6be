// The sizes some ATen CPU kernels assume of their arguments without checking
// them, checked by flagosd before the kernel runs.
//
// A session names every tensor's sizes and strides, and every tensor is
// range-checked over its own extent (command_validation.h). Most kernels
// check their arguments' shapes against each other (TensorIterator,
// structured kernels, resize_output), or resize what they write, which
// fails on memory over a segment. The kernels listed in OpArgumentRuleTable
// do not: they walk a written (or read) argument with sizes taken from
// another one (aten::_cummax_helper writes self.size(dim) elements at
// values' stride; the fused optimizers index every state tensor as
// data_ptr[i] for i < param.numel()), so a small tensor there is a write
// past its extent into memory the session does not own. Each rule states,
// for one op, what such an argument must be; a call breaking one fails with
// INVALID_ARGUMENT naming the op, the argument, what was expected and what
// was given, and the kernel never runs.
//
// A rule holds for every overload of its op whose schema has the argument
// it names (an overload without it is not bound by it). An argument that is
// None or an undefined tensor passes (the kernel does not touch it).
//
// The table and the verdicts behind it, op by op, are in
// op_argument_rule_table.cc; docs/reference/served-operators.md ("Checked
// before the kernel runs") lists every overload with its rules.
//
// No ATen, no state: everything here is a function of its arguments.
#ifndef FLAGOS_DAEMON_OPS_OP_ARGUMENT_RULES_H_
#define FLAGOS_DAEMON_OPS_OP_ARGUMENT_RULES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

enum class ArgumentRuleKind {
  // `argument` has the sizes of `reference`; for two Tensor[] arguments,
  // element by element, and `argument` is empty or as long as `reference`
  // (optional state lists such as max_exp_avg_sqs may be empty; ATen
  // checks the lengths it needs).
  kSameSizes,
  // `argument` is a vector of reference.size(1) elements: sizes [C] for an
  // input of sizes [N, C, ...] (batch norm's per-channel statistics).
  kChannels,
  // As kChannels, or no element at all (batch norm backward's saved
  // statistics are empty in evaluation mode).
  kChannelsOrEmpty,
  // `argument` has reference.size(dim_argument) elements if the bool
  // `flag_argument` is true, else one element (per-row or per-tensor
  // quantisation parameters).
  kPerRowOrOne,
  // `argument` (a Tensor or each of a Tensor[]) spans exactly its elements
  // (no gaps, no stride-0 broadcast): its kernel indexes it as data_ptr[i]
  // for i < numel.
  kDense,
  // `argument` has exactly one element (a scalar read through data_ptr).
  kOneElement,
  // The int `argument` is a dimension of `reference`, 0 <= it < its rank
  // (the kernel neither wraps a negative one nor checks it).
  kDimensionOf,
};

struct ArgumentRule {
  ArgumentRuleKind kind;
  const char* argument;
  const char* reference = nullptr;      // kSameSizes, kChannels*, kPerRowOrOne, kDimensionOf
  const char* dim_argument = nullptr;   // kPerRowOrOne: an int argument
  const char* flag_argument = nullptr;  // kPerRowOrOne: a bool argument
};

// The rules of one op (every overload of it), and why its kernel needs them.
struct OpArgumentRules {
  const char* op;  // "aten::_cummax_helper": the name without overload
  std::vector<ArgumentRule> rules;
  const char* why;
};

// Every op with rules, sorted by name.
absl::Span<const OpArgumentRules> OpArgumentRuleTable();

// The rules of op `name` ("aten::_cummax_helper"), or nullptr.
const OpArgumentRules* FindOpArgumentRules(absl::string_view name);

// "values: the sizes of self; indices: the sizes of self", for listings.
std::string DescribeRules(absl::Span<const ArgumentRule> rules);

// One argument of an op's schema, as the rules need it.
struct SchemaArgument {
  std::string name;
  // The default of an int or bool argument (a call may leave it out).
  std::optional<int64_t> int_default;
  // A kwarg-only out= argument: its kernel resizes it (on scratch memory,
  // op_runner.h), so no rule binds it.
  bool is_out = false;
};

// An op's rules bound to one overload's argument positions.
class BoundArgumentRules {
 public:
  // Binds the rules whose `argument` the overload has (and is not an out=
  // argument). INTERNAL when a
  // bound rule names a reference, dim or flag argument the schema lacks
  // (a mistake in the table).
  static absl::StatusOr<BoundArgumentRules> Bind(absl::Span<const ArgumentRule> rules,
                                                 absl::Span<const SchemaArgument> arguments);

  bool empty() const { return bound_.empty(); }

  // DescribeRules of the rules bound.
  std::string Describe() const;

  // OK when `call` (its arguments in schema order) satisfies every rule;
  // otherwise INVALID_ARGUMENT "<op_name>: argument 'values' (#1) must have
  // the sizes of argument 'self' (#0), [2], but has [1]; ...". Malformed
  // tensor descriptors are left to the decoding that follows.
  absl::Status Check(const v1::OpCall& call, absl::string_view op_name) const;

 private:
  struct Bound {
    ArgumentRule rule;
    ArgumentRuleKind kind;
    int argument = -1;
    int reference = -1;
    int dim_argument = -1;
    int flag_argument = -1;
  };
  std::vector<Bound> bound_;
  std::vector<SchemaArgument> arguments_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_ARGUMENT_RULES_H_
