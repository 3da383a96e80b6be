// Hands an op's returns back (op_result_encoder.h).
#include "ops/op_result_encoder.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ops/held_results.h"
#include "ops/op_error_context.h"

namespace flagos::daemon {
namespace {

using TypePtr = c10::TypePtr;
using c10::TypeKind;

// How a return's type is handed back to the client.
enum class ReturnShape { kTensor, kTensorList, kOther };

ReturnShape ClassifyReturn(const TypePtr& type) {
  TypePtr t = type;
  if (t->kind() == TypeKind::OptionalType) t = t->expectRef<c10::OptionalType>().getElementType();
  if (t->kind() == TypeKind::TensorType) return ReturnShape::kTensor;
  if (t->kind() == TypeKind::ListType) {
    TypePtr element = t->expectRef<c10::ListType>().getElementType();
    if (element->kind() == TypeKind::OptionalType) {
      element = element->expectRef<c10::OptionalType>().getElementType();
    }
    if (element->kind() == TypeKind::TensorType) return ReturnShape::kTensorList;
  }
  return ReturnShape::kOther;
}

// Encodes one call's returns through its context.
class ResultEncoder {
 public:
  explicit ResultEncoder(OpCallContext& context)
      : context_(context), op_name_(context.op_name()) {}

  // Handles the returns left on `stack` by the call.
  absl::Status TakeReturns(const c10::FunctionSchema& schema, const v1::OpCall& call,
                           torch::jit::Stack* stack, v1::Completion* completion) {
    const std::vector<c10::Argument>& returns = schema.returns();
    if (stack->size() != returns.size()) {
      return absl::InternalError(absl::StrCat(op_name_, ": the kernel left ", stack->size(),
                                              " values, the schema declares ", returns.size(),
                                              " returns"));
    }
    int next_output = 0;
    const bool to_outputs = call.outputs_size() > 0;
    for (size_t i = 0; i < returns.size(); ++i) {
      const c10::Argument& ret = returns[i];
      const c10::IValue& value = (*stack)[i];
      // With want_values every return gets one Value, in schema order; a
      // return the client already holds (written in place, or copied into
      // `outputs`) is none.
      v1::Value* carried = call.want_values() ? completion->add_values() : nullptr;
      if (ret.alias_info() != nullptr && ret.alias_info()->isWrite()) {
        if (carried != nullptr) carried->set_none(true);
        continue;
      }
      const ReturnShape shape = ClassifyReturn(ret.type());
      if (shape == ReturnShape::kOther || !to_outputs) {
        if (carried == nullptr) continue;
        if (absl::Status s = Encode(value, carried); !s.ok()) return s;
        continue;
      }
      if (carried != nullptr) carried->set_none(true);
      if (shape == ReturnShape::kTensor) {
        absl::Status s = CopyOut(value.isNone() ? at::Tensor() : value.toTensor(), call,
                                 &next_output);
        if (!s.ok()) return s;
        continue;
      }
      for (const c10::IValue& element : value.toListRef()) {
        absl::Status s = CopyOut(element.isNone() ? at::Tensor() : element.toTensor(), call,
                                 &next_output);
        if (!s.ok()) return s;
      }
    }
    if (to_outputs && next_output != call.outputs_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": the command has ", call.outputs_size(),
                       " outputs but the op returned ", next_output, " tensors to copy"));
    }
    return absl::OkStatus();
  }

  // Copies a result into device memory; the sizes must agree.
  absl::Status CopyInto(const at::Tensor& destination, const at::Tensor& result,
                        const ValueWhere& where) {
    if (destination.sizes() != result.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_name_, ": ", where.str(), " has sizes ", SizesString(destination.sizes()),
          " but the op produced sizes ", SizesString(result.sizes()),
          "; the client's shape inference disagrees with the kernel"));
    }
    static const c10::OperatorHandle copy =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    torch::jit::Stack stack{c10::IValue(destination), c10::IValue(result), c10::IValue(false)};
    absl::Status status = context_.CallKernel(copy, &stack);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(op_name_, ": copying ", where.str(), ": ",
                                                      status.message()));
    }
    return absl::OkStatus();
  }

  // A tensor returned by value (contiguous bytes) in `out`.
  absl::Status EncodeByValue(const at::Tensor& tensor, v1::Value* out) {
    return EncodeHostTensor(tensor, out);
  }

 private:
  // Copies one tensor return into the next output ref.
  absl::Status CopyOut(const at::Tensor& result, const v1::OpCall& call, int* next_output) {
    if (*next_output >= call.outputs_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_name_, ": the op returned more tensors than the command's ", call.outputs_size(),
          " outputs"));
    }
    const int index = (*next_output)++;
    const v1::TensorRef& ref = call.outputs(index);
    if (ref.undefined() || !result.defined()) return absl::OkStatus();
    const ValueWhere where = ValueWhere::Output(index);
    context_.set_writing(true);
    absl::StatusOr<at::Tensor> destination = context_.WrapTensor(ref, where);
    if (!destination.ok()) return destination.status();
    return CopyInto(*destination, result, where);
  }

  absl::Status Encode(const c10::IValue& value, v1::Value* out) {
    if (value.isNone()) {
      out->set_none(true);
    } else if (value.isInt()) {
      out->set_i(value.toInt());
    } else if (value.isSymInt()) {
      std::optional<int64_t> i = value.toSymInt().maybe_as_int();
      if (!i.has_value()) return Unencodable(value);
      out->set_i(*i);
    } else if (value.isDouble()) {
      out->set_d(value.toDouble());
    } else if (value.isBool()) {
      out->set_b(value.toBool());
    } else if (value.isComplexDouble()) {
      const c10::complex<double> c = value.toComplexDouble();
      out->mutable_c()->set_re(c.real());
      out->mutable_c()->set_im(c.imag());
    } else if (value.isString()) {
      out->set_s(value.toStringRef());
    } else if (value.isIntList()) {
      for (int64_t i : value.toIntVector()) out->mutable_ints()->add_values(i);
    } else if (value.isDoubleList()) {
      for (double d : value.toDoubleVector()) out->mutable_doubles()->add_values(d);
    } else if (value.isBoolList()) {
      for (bool b : value.toBoolList()) out->mutable_bools()->add_values(b);
    } else if (value.isDevice()) {
      const c10::Device device = value.toDevice();
      out->mutable_device()->set_type(c10::DeviceTypeName(device.type(), /*lower_case=*/true));
      out->mutable_device()->set_index(device.index());
    } else if (value.isTensor()) {
      if (context_.held_results() != nullptr && value.toTensor().defined()) {
        return Hold(value.toTensor(), out);
      }
      return EncodeHostTensor(value.toTensor(), out);
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        if (absl::Status s = Encode(element, out->mutable_list()->add_values()); !s.ok()) return s;
      }
      if (value.toListRef().empty()) out->mutable_list();
    } else if (value.isTuple()) {
      for (const c10::IValue& element : value.toTupleRef().elements()) {
        if (absl::Status s = Encode(element, out->mutable_list()->add_values()); !s.ok()) return s;
      }
    } else {
      return Unencodable(value);
    }
    return absl::OkStatus();
  }

  absl::Status EncodeHostTensor(const at::Tensor& tensor, v1::Value* out) {
    if (!tensor.defined()) {
      out->set_none(true);
      return absl::OkStatus();
    }
    if (!tensor.device().is_cpu()) {
      return absl::InternalError(absl::StrCat(
          op_name_, ": the kernel returned a ", tensor.device().str(),
          " tensor to send back by value; flagosd sends only host tensors"));
    }
    return Guarded(op_name_, ValueWhere::Text("returning a tensor by value"), [&]() {
      const at::Tensor host = tensor.contiguous();
      v1::HostTensor* h = out->mutable_host_tensor();
      for (int64_t size : host.sizes()) h->add_sizes(size);
      h->set_dtype(static_cast<int>(host.scalar_type()));
      h->set_data(static_cast<const char*>(host.const_data_ptr()), host.nbytes());
      return absl::OkStatus();
    });
  }

  absl::Status Hold(const at::Tensor& tensor, v1::Value* out) {
    if (!tensor.device().is_cpu()) {
      return absl::InternalError(absl::StrCat(op_name_, ": the kernel returned a ",
                                              tensor.device().str(), " tensor to hold"));
    }
    at::Tensor contiguous;
    absl::Status status = Guarded(op_name_, ValueWhere::Text("holding a result"), [&]() {
      contiguous = tensor.resolve_conj().resolve_neg().contiguous();
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    v1::HeldTensor* h = out->mutable_held();
    for (int64_t size : contiguous.sizes()) h->add_sizes(size);
    h->set_dtype(static_cast<int>(contiguous.scalar_type()));
    absl::StatusOr<uint64_t> id = context_.held_results()->Hold(std::move(contiguous));
    if (!id.ok()) return id.status();
    h->set_id(*id);
    return absl::OkStatus();
  }

  absl::Status Unencodable(const c10::IValue& value) {
    return absl::UnimplementedError(absl::StrCat(op_name_, ": a return of kind ", value.tagKind(),
                                                 " cannot be sent back by flagosd yet"));
  }

  OpCallContext& context_;
  const std::string& op_name_;
};

}  // namespace

absl::Status TakeReturns(OpCallContext& context, const c10::FunctionSchema& schema,
                         const v1::OpCall& call, torch::jit::Stack* stack,
                         v1::Completion* completion) {
  return ResultEncoder(context).TakeReturns(schema, call, stack, completion);
}

absl::Status CopyInto(OpCallContext& context, const at::Tensor& destination,
                      const at::Tensor& result, const ValueWhere& where) {
  return ResultEncoder(context).CopyInto(destination, result, where);
}

absl::Status EncodeByValue(OpCallContext& context, const at::Tensor& tensor, v1::Value* out) {
  return ResultEncoder(context).EncodeByValue(tensor, out);
}

}  // namespace flagos::daemon
