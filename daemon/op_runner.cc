// The daemon's ATen translation unit: everything that touches c10 types.
#include "op_runner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <cstring>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "backend.h"
#include "command_validation.h"
#include "flagos/op_executor.h"

namespace flagos::daemon {
namespace {

using TypePtr = c10::TypePtr;
using c10::TypeKind;

std::string OpName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : absl::StrCat(name.name, ".", name.overload_name);
}

absl::string_view ValueKindName(const v1::Value& value) {
  switch (value.v_case()) {
    case v1::Value::kNone: return "none";
    case v1::Value::kI: return "i (int)";
    case v1::Value::kD: return "d (float)";
    case v1::Value::kB: return "b (bool)";
    case v1::Value::kC: return "c (complex)";
    case v1::Value::kS: return "s (string)";
    case v1::Value::kTensor: return "tensor";
    case v1::Value::kHostTensor: return "host_tensor";
    case v1::Value::kInts: return "ints";
    case v1::Value::kDoubles: return "doubles";
    case v1::Value::kBools: return "bools";
    case v1::Value::kList: return "list";
    case v1::Value::kDevice: return "device";
    case v1::Value::kGenerator: return "generator";
    case v1::Value::V_NOT_SET: return "an empty value";
  }
  return "unknown";
}

// A 64-bit mix (splitmix64's finaliser) so that nearby (seed, offset) pairs
// give unrelated generator seeds.
uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string SizesString(c10::IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

bool IsIntLike(TypeKind kind) {
  return kind == TypeKind::IntType || kind == TypeKind::SymIntType ||
         kind == TypeKind::ScalarTypeType || kind == TypeKind::LayoutType ||
         kind == TypeKind::MemoryFormatType || kind == TypeKind::QSchemeType;
}

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

// Runs `fn`, turning exceptions (c10 ones included) into a status.
template <typename Fn>
absl::Status Guarded(const std::string& op_name, absl::string_view what, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(op_name, ": ", what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op_name, ": ", what, ": ", e.what()));
  }
}

// Decodes one call's arguments and handles its returns.
class CallContext {
 public:
  CallContext(const Backend& backend, int device, const std::string& op_name,
              OpRunner::RangeCheck check)
      : backend_(backend), device_(device), op_name_(op_name), check_(check) {}

  absl::StatusOr<c10::IValue> Decode(const v1::Value& value, const TypePtr& type,
                                     const std::string& where) {
    const TypeKind kind = type->kind();
    if (kind == TypeKind::OptionalType) {
      if (value.has_none()) return c10::IValue();
      if (value.has_tensor() && value.tensor().undefined()) return c10::IValue();
      return Decode(value, type->expectRef<c10::OptionalType>().getElementType(), where);
    }
    const auto mismatch = [&]() {
      return absl::InvalidArgumentError(absl::StrCat(op_name_, ": ", where, " has type ",
                                                     type->str(), " but the command sends ",
                                                     ValueKindName(value)));
    };
    if (IsIntLike(kind)) {
      if (!value.has_i()) return mismatch();
      return c10::IValue(value.i());
    }
    switch (kind) {
      case TypeKind::TensorType: {
        if (value.has_tensor()) {
          absl::StatusOr<at::Tensor> tensor = WrapTensor(value.tensor(), where);
          if (!tensor.ok()) return tensor.status();
          return c10::IValue(*std::move(tensor));
        }
        if (value.has_host_tensor()) {
          absl::StatusOr<at::Tensor> tensor = HostTensor(value.host_tensor(), where);
          if (!tensor.ok()) return tensor.status();
          return c10::IValue(*std::move(tensor));
        }
        return mismatch();
      }
      case TypeKind::FloatType:
      case TypeKind::SymFloatType:
        if (value.has_d()) return c10::IValue(value.d());
        if (value.has_i()) return c10::IValue(static_cast<double>(value.i()));
        return mismatch();
      case TypeKind::BoolType:
      case TypeKind::SymBoolType:
        if (!value.has_b()) return mismatch();
        return c10::IValue(value.b());
      case TypeKind::ComplexType:
        if (value.has_c()) return c10::IValue(c10::complex<double>(value.c().re(), value.c().im()));
        if (value.has_d()) return c10::IValue(c10::complex<double>(value.d(), 0));
        if (value.has_i()) return c10::IValue(c10::complex<double>(value.i(), 0));
        return mismatch();
      case TypeKind::NumberType:  // Scalar
        if (value.has_i()) return c10::IValue(value.i());
        if (value.has_d()) return c10::IValue(value.d());
        if (value.has_b()) return c10::IValue(value.b());
        if (value.has_c()) return c10::IValue(c10::complex<double>(value.c().re(), value.c().im()));
        return mismatch();
      case TypeKind::StringType:
        if (!value.has_s()) return mismatch();
        return c10::IValue(value.s());
      case TypeKind::DeviceObjType: {
        if (!value.has_device()) return mismatch();
        return DecodeDevice(value.device(), where);
      }
      case TypeKind::GeneratorType: {
        if (!value.has_generator()) return mismatch();
        if (backend_.executor().AtenDevice(device_).type() != c10::kCPU) {
          return absl::UnimplementedError(absl::StrCat(
              op_name_, ": ", where, ": random generators are not implemented for the ",
              backend_.name(), " backend"));
        }
        const v1::GeneratorValue& g = value.generator();
        return c10::IValue(
            at::make_generator<at::CPUGeneratorImpl>(Mix64(g.seed() ^ Mix64(g.offset()))));
      }
      case TypeKind::ListType:
        return DecodeList(value, type->expectRef<c10::ListType>().getElementType(), where);
      default:
        return absl::UnimplementedError(absl::StrCat(op_name_, ": ", where, " has type ",
                                                     type->str(),
                                                     ", which flagosd cannot decode yet"));
    }
  }

  // A tensor over device memory, after checking its descriptor and range.
  absl::StatusOr<at::Tensor> WrapTensor(const v1::TensorRef& ref, const std::string& where) {
    if (ref.undefined()) return at::Tensor();
    absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(ref);
    if (!extent.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": ", where, ": ", extent.status().message()));
    }
    if (absl::Status s = CheckDevice(ref.device(), backend_.runtime().DeviceCount(),
                                     absl::StrCat(op_name_, ": ", where));
        !s.ok()) {
      return s;
    }
    // An empty tensor reads and writes nothing (and its address may be 0);
    // its storage cannot grow, so no kernel can write through it.
    if (extent->numel > 0) {
      if (absl::Status s = check_(ref.device(), extent->begin, extent->nbytes); !s.ok()) return s;
    }
    std::vector<int64_t> sizes(ref.sizes().begin(), ref.sizes().end());
    std::vector<int64_t> strides(ref.strides().begin(), ref.strides().end());
    at::Tensor tensor;
    absl::Status status = Guarded(op_name_, where, [&]() {
      tensor = backend_.executor().WrapDeviceMemory(ref.device(), extent->begin, sizes, strides,
                                                    static_cast<c10::ScalarType>(ref.dtype()));
      // The client's lazy conj/neg bits, as views the kernels understand.
      if (ref.conj()) tensor = tensor._conj();
      if (ref.neg()) tensor = tensor._neg_view();
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return tensor;
  }

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

 private:
  absl::StatusOr<c10::IValue> DecodeDevice(const v1::DeviceValue& device,
                                           const std::string& where) {
    if (device.type() == "cpu") return c10::IValue(c10::Device(c10::kCPU));
    const int index = device.index() < 0 ? device_ : device.index();
    if (absl::Status s = CheckDevice(index, backend_.runtime().DeviceCount(),
                                     absl::StrCat(op_name_, ": ", where));
        !s.ok()) {
      return s;
    }
    return c10::IValue(backend_.executor().AtenDevice(index));
  }

  absl::StatusOr<c10::IValue> DecodeList(const v1::Value& value, const TypePtr& element,
                                         const std::string& where) {
    const TypeKind kind = element->kind();
    const auto mismatch = [&]() {
      return absl::InvalidArgumentError(absl::StrCat(op_name_, ": ", where, " has type ",
                                                     element->str(), "[] but the command sends ",
                                                     ValueKindName(value)));
    };
    const auto element_where = [&](int i) { return absl::StrCat(where, " element ", i); };
    if (IsIntLike(kind)) {
      std::vector<int64_t> ints;
      if (value.has_ints()) {
        ints.assign(value.ints().values().begin(), value.ints().values().end());
      } else if (value.has_list()) {
        for (const v1::Value& v : value.list().values()) {
          if (!v.has_i()) return mismatch();
          ints.push_back(v.i());
        }
      } else {
        return mismatch();
      }
      return c10::IValue(std::move(ints));
    }
    if (kind == TypeKind::FloatType) {
      if (!value.has_doubles()) return mismatch();
      return c10::IValue(
          std::vector<double>(value.doubles().values().begin(), value.doubles().values().end()));
    }
    if (kind == TypeKind::BoolType) {
      if (!value.has_bools()) return mismatch();
      c10::List<bool> bools;
      for (bool b : value.bools().values()) bools.push_back(b);
      return c10::IValue(std::move(bools));
    }
    if (!value.has_list()) return mismatch();
    const auto& values = value.list().values();
    if (kind == TypeKind::TensorType) {
      c10::List<at::Tensor> tensors;
      for (int i = 0; i < values.size(); ++i) {
        absl::StatusOr<c10::IValue> t = Decode(values[i], element, element_where(i));
        if (!t.ok()) return t.status();
        tensors.push_back(std::move(*t).toTensor());
      }
      return c10::IValue(std::move(tensors));
    }
    if (kind == TypeKind::OptionalType &&
        element->expectRef<c10::OptionalType>().getElementType()->kind() ==
            TypeKind::TensorType) {
      c10::List<std::optional<at::Tensor>> tensors;
      for (int i = 0; i < values.size(); ++i) {
        absl::StatusOr<c10::IValue> t = Decode(values[i], element, element_where(i));
        if (!t.ok()) return t.status();
        if (t->isNone()) {
          tensors.push_back(std::nullopt);
        } else {
          tensors.push_back(std::move(*t).toTensor());
        }
      }
      return c10::IValue(std::move(tensors));
    }
    c10::impl::GenericList list(element);
    for (int i = 0; i < values.size(); ++i) {
      absl::StatusOr<c10::IValue> v = Decode(values[i], element, element_where(i));
      if (!v.ok()) return v.status();
      list.push_back(*std::move(v));
    }
    return c10::IValue(std::move(list));
  }

  // A tensor holding a copy of `host`'s bytes. Dimensionless host tensors
  // stay on the CPU (PyTorch accepts CPU scalars next to device tensors).
  absl::StatusOr<at::Tensor> HostTensor(const v1::HostTensor& host, const std::string& where) {
    absl::StatusOr<int64_t> numel = CheckHostTensor(host);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": ", where, ": ", numel.status().message()));
    }
    at::Tensor tensor;
    absl::Status status = Guarded(op_name_, where, [&]() {
      std::vector<int64_t> sizes(host.sizes().begin(), host.sizes().end());
      const auto dtype = static_cast<c10::ScalarType>(host.dtype());
      tensor = at::empty(sizes, at::TensorOptions().dtype(dtype));
      if (!host.data().empty()) {
        std::memcpy(tensor.data_ptr(), host.data().data(), host.data().size());
      }
      if (host.wrapped_number() && tensor.dim() == 0) {
        tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
      }
      const c10::Device device = backend_.executor().AtenDevice(device_);
      if (tensor.dim() > 0 && device.type() != c10::kCPU) tensor = tensor.to(device);
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return tensor;
  }

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
    const std::string where = absl::StrCat("output ", index);
    absl::StatusOr<at::Tensor> destination = WrapTensor(ref, where);
    if (!destination.ok()) return destination.status();
    return CopyInto(*destination, result, where);
  }

 public:
  // Copies a result into device memory; the sizes must agree.
  absl::Status CopyInto(const at::Tensor& destination, const at::Tensor& result,
                        const std::string& where) {
    if (destination.sizes() != result.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_name_, ": ", where, " has sizes ", SizesString(destination.sizes()),
          " but the op produced sizes ", SizesString(result.sizes()),
          "; the client's shape inference disagrees with the kernel"));
    }
    static const c10::OperatorHandle copy =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    torch::jit::Stack stack{c10::IValue(destination), c10::IValue(result), c10::IValue(false)};
    absl::Status status = backend_.executor().Call(device_, copy, &stack);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(op_name_, ": copying ", where, ": ",
                                                      status.message()));
    }
    return absl::OkStatus();
  }

  // A tensor returned by value (contiguous bytes) in `out`.
  absl::Status EncodeByValue(const at::Tensor& tensor, v1::Value* out) {
    return EncodeHostTensor(tensor, out);
  }

 private:
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
    return Guarded(op_name_, "returning a tensor by value", [&]() {
      const at::Tensor host = tensor.to(c10::kCPU).contiguous();
      v1::HostTensor* h = out->mutable_host_tensor();
      for (int64_t size : host.sizes()) h->add_sizes(size);
      h->set_dtype(static_cast<int>(host.scalar_type()));
      h->set_data(static_cast<const char*>(host.const_data_ptr()), host.nbytes());
      return absl::OkStatus();
    });
  }

  absl::Status Unencodable(const c10::IValue& value) {
    return absl::UnimplementedError(absl::StrCat(op_name_, ": a return of kind ", value.tagKind(),
                                                 " cannot be sent back by flagosd yet"));
  }

  const Backend& backend_;
  const int device_;
  const std::string& op_name_;
  OpRunner::RangeCheck check_;
};

// An out= argument and the resizable tensor the kernel writes instead.
struct OutArgument {
  std::string name;
  at::Tensor destination;  // over the session's segment
  at::Tensor scratch;
};

class OpRunnerImpl final : public OpRunner {
 public:
  explicit OpRunnerImpl(const Backend& backend) : backend_(backend) {}

  absl::Status Register(uint32_t op_id, const std::string& name,
                        const std::string& overload) override {
    const std::string full_name = overload.empty() ? name : absl::StrCat(name, ".", overload);
    if (op_id == 0 || op_id > kMaxOpId) {
      return absl::InvalidArgumentError(absl::StrCat("register_op ", full_name, ": op id ", op_id,
                                                     " is out of range (1 .. 2^31-1)"));
    }
    std::optional<c10::OperatorHandle> handle;
    try {
      handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName(name, overload));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("register_op ", full_name, ": ", e.what()));
    }
    if (!handle.has_value()) {
      return absl::NotFoundError(absl::StrCat("operator ", full_name,
                                              " is not registered in flagosd's torch ",
                                              TorchVersion()));
    }
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = ops_.try_emplace(op_id, *handle);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register_op ", full_name, ": op id ", op_id,
          " is already registered in this session (as ", OpName(it->second.operator_name()),
          "); mint a new id"));
    }
    return absl::OkStatus();
  }

  absl::Status Run(int device, const v1::OpCall& call, RangeCheck check,
                   v1::Completion* completion) override {
    try {
      return RunUnguarded(device, call, check, completion);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("op id ", call.op_id(), ": ",
                                                     e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("op id ", call.op_id(), ": ", e.what()));
    }
  }

 private:
  absl::Status RunUnguarded(int device, const v1::OpCall& call, RangeCheck check,
                            v1::Completion* completion) {
    std::optional<c10::OperatorHandle> op;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = ops_.find(call.op_id());
      if (it != ops_.end()) op = it->second;
    }
    if (!op.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("op id ", call.op_id(),
                                                     " is not registered in this session; send "
                                                     "register_op before using it"));
    }
    const std::string op_name = OpName(op->operator_name());
    const c10::FunctionSchema& schema = op->schema();
    const std::vector<c10::Argument>& arguments = schema.arguments();
    if (static_cast<size_t>(call.args_size()) > arguments.size()) {
      return absl::InvalidArgumentError(absl::StrCat(op_name, " takes ", arguments.size(),
                                                     " arguments but the command sends ",
                                                     call.args_size()));
    }
    CallContext context(backend_, device, op_name, check);
    torch::jit::Stack stack;
    stack.reserve(arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::Argument& argument = arguments[i];
      const std::string where = absl::StrCat("argument '", argument.name(), "' (#", i, ")");
      if (i >= static_cast<size_t>(call.args_size())) {
        if (!argument.default_value().has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              op_name, ": ", where, " is missing and has no default; the command sends ",
              call.args_size(), " of ", arguments.size(), " arguments"));
        }
        stack.push_back(*argument.default_value());
        continue;
      }
      absl::StatusOr<c10::IValue> value = context.Decode(call.args(i), argument.type(), where);
      if (!value.ok()) return value.status();
      stack.push_back(*std::move(value));
    }
    // out= arguments: kernels may resize them internally (mse_loss.out uses
    // its out tensor as scratch space), which memory over a segment cannot
    // do. The kernel gets a resizable tensor of the same shape; its result
    // is copied into the segment afterwards.
    std::vector<OutArgument> outs;
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (!arguments[i].is_out() || !stack[i].isTensor()) continue;
      const at::Tensor destination = stack[i].toTensor();
      if (!destination.defined()) continue;
      at::Tensor scratch = at::empty_strided(destination.sizes(), destination.strides(),
                                             destination.options());
      stack[i] = c10::IValue(scratch);
      outs.push_back(OutArgument{arguments[i].name(), destination, std::move(scratch)});
    }
    if (absl::Status s = CallOp(device, *op, call, &stack); !s.ok()) return s;
    // On the synchronous path (want_values, no outputs) an out= argument the
    // kernel resized (a data-dependent size) cannot land in the client's
    // segment: it travels back by value and the client resizes and uploads.
    const bool synchronous = call.want_values() && call.outputs_size() == 0;
    std::vector<const OutArgument*> resized;
    for (const OutArgument& out : outs) {
      if (synchronous && out.scratch.sizes() != out.destination.sizes()) {
        resized.push_back(&out);
        continue;
      }
      if (absl::Status s = context.CopyInto(out.destination, out.scratch,
                                            absl::StrCat("out argument '", out.name, "'"));
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = context.TakeReturns(schema, call, &stack, completion); !s.ok()) return s;
    if (synchronous) {
      // After one Value per return: one per written tensor argument, in
      // argument order — its new contents if it was resized, else none.
      for (size_t i = 0; i < arguments.size(); ++i) {
        const c10::AliasInfo* alias = arguments[i].alias_info();
        if (alias == nullptr || !alias->isWrite() ||
            arguments[i].real_type()->kind() != c10::TypeKind::TensorType) {
          continue;
        }
        v1::Value* value = completion->add_values();
        value->set_none(true);
        for (const OutArgument* out : resized) {
          if (out->name != arguments[i].name()) continue;
          if (absl::Status s = context.EncodeByValue(out->scratch, value); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  // Runs the op. A random op without a Generator argument draws from the
  // device's default generator: the call holds it alone, seeded from the
  // command's implicit (seed, offset), so its numbers depend on that pair
  // only, like those of an op that takes a generator.
  absl::Status CallOp(int device, const c10::OperatorHandle& op, const v1::OpCall& call,
                      torch::jit::Stack* stack) {
    if (!call.has_implicit_generator()) return backend_.executor().Call(device, op, stack);
    const v1::GeneratorValue& g = call.implicit_generator();
    absl::MutexLock lock(&implicit_generator_mu_);
    at::Generator generator =
        at::globalContext().defaultGenerator(backend_.executor().AtenDevice(device));
    {
      std::lock_guard<std::mutex> generator_lock(generator.mutex());
      generator.set_current_seed(Mix64(g.seed() ^ Mix64(g.offset())));
    }
    return backend_.executor().Call(device, op, stack);
  }

  const Backend& backend_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, c10::OperatorHandle> ops_ ABSL_GUARDED_BY(mu_);
  // Serialises the ops that use the default generator (CallOp).
  absl::Mutex implicit_generator_mu_;
};

}  // namespace

std::unique_ptr<OpRunner> OpRunner::Create(const Backend& backend) {
  return std::make_unique<OpRunnerImpl>(backend);
}

}  // namespace flagos::daemon
