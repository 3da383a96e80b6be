// What an op's error names: the operator (`OperatorFullName`), where a value sits in the call
// (`ValueWhere`: "argument 'self' (#0)", "output 1", "out argument 'out'",
// "argument 'tensors' (#0) element 2"), exceptions from kernels turned into
// a status that names the op and the value (`Guarded`), and sizes as text.
//
// The text of a ValueWhere is built only when an error is reported: a call
// that succeeds pays for no strings.
//
// Header only (c10's operator name, exception and array types; no ATen
// operator headers).
//
// Thread safety: values; a ValueWhere refers to the names it was made from
// (schema argument names, which live as long as the operator) and, for an
// element, to its parent, which must outlive it.
#ifndef FLAGOS_DAEMON_OPS_OP_ERROR_CONTEXT_H_
#define FLAGOS_DAEMON_OPS_OP_ERROR_CONTEXT_H_

#include <ATen/core/operator_name.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

// Where a value sits in a call, for error messages.
class ValueWhere {
 public:
  static ValueWhere Argument(const std::string& name, size_t index) {
    return ValueWhere(Kind::kArgument, &name, static_cast<int>(index));
  }
  static ValueWhere Output(int index) { return ValueWhere(Kind::kOutput, nullptr, index); }
  static ValueWhere OutArgument(const std::string& name) {
    return ValueWhere(Kind::kOutArgument, &name, 0);
  }
  // `text` must outlive the result (a literal).
  static ValueWhere Text(absl::string_view text) {
    ValueWhere where(Kind::kText, nullptr, 0);
    where.text_ = text;
    return where;
  }
  // Element `index` of the list this names; `*this` must outlive the result.
  ValueWhere Element(int index) const {
    ValueWhere where(Kind::kElement, nullptr, index);
    where.parent_ = this;
    return where;
  }

  std::string str() const {
    switch (kind_) {
      case Kind::kArgument: return absl::StrCat("argument '", *name_, "' (#", index_, ")");
      case Kind::kOutput: return absl::StrCat("output ", index_);
      case Kind::kOutArgument: return absl::StrCat("out argument '", *name_, "'");
      case Kind::kText: return std::string(text_);
      case Kind::kElement: return absl::StrCat(parent_->str(), " element ", index_);
    }
    return std::string();
  }

 private:
  enum class Kind { kArgument, kOutput, kOutArgument, kText, kElement };
  ValueWhere(Kind kind, const std::string* name, int index)
      : kind_(kind), name_(name), index_(index) {}

  Kind kind_;
  const std::string* name_ = nullptr;
  int index_ = 0;
  const ValueWhere* parent_ = nullptr;
  absl::string_view text_;
};

// Runs `fn` (returning absl::Status), turning exceptions (c10 ones
// included) into a status naming `op_name` and `where`: INVALID_ARGUMENT
// for c10's, INTERNAL for others.
template <typename Fn>
absl::Status Guarded(const std::string& op_name, const ValueWhere& where, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(op_name, ": ", where.str(), ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op_name, ": ", where.str(), ": ", e.what()));
  }
}

// "aten::add.Tensor" ("aten::relu" for an empty overload): how errors and
// listings name an operator.
inline std::string OperatorFullName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : absl::StrCat(name.name, ".", name.overload_name);
}

// "[2, 3]".
inline std::string SizesString(c10::IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_ERROR_CONTEXT_H_
