// Decodes an OpCall's arguments by the op's schema (op_argument_decoder.h).
#include "ops/op_argument_decoder.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "flagos/op_executor.h"
#include "ops/op_error_context.h"
#include "ops/op_generators.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {
namespace {

using TypePtr = c10::TypePtr;
using c10::TypeKind;

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

bool IsIntLike(TypeKind kind) {
  return kind == TypeKind::IntType || kind == TypeKind::SymIntType ||
         kind == TypeKind::ScalarTypeType || kind == TypeKind::LayoutType ||
         kind == TypeKind::MemoryFormatType || kind == TypeKind::QSchemeType;
}

// OK when `v` names a value of the enum an argument of type `kind` has
// (ATen indexes its tables with these unchecked: an out-of-range dtype
// would read past them); other int-like kinds take any value.
absl::Status CheckEnumValue(TypeKind kind, int64_t v) {
  int64_t count = -1;
  absl::string_view what;
  switch (kind) {
    case TypeKind::ScalarTypeType:
      count = static_cast<int64_t>(c10::ScalarType::Undefined);
      what = "ScalarType (dtype)";
      break;
    case TypeKind::LayoutType:
      count = static_cast<int64_t>(c10::Layout::NumOptions);
      what = "Layout";
      break;
    case TypeKind::MemoryFormatType:
      count = static_cast<int64_t>(c10::MemoryFormat::NumOptions);
      what = "MemoryFormat";
      break;
    case TypeKind::QSchemeType:
      count = static_cast<int64_t>(c10::COMPILE_TIME_NUM_QSCHEMES);
      what = "QScheme";
      break;
    default:
      return absl::OkStatus();
  }
  if (v >= 0 && v < count) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(v, " is not a ", what, " (valid: 0..", count - 1,
                                                 ")"));
}

// CheckEnumValue for a decoded argument whose declared (real) type is an
// enum, an optional one or a list of them (decoding sees them as ints).
absl::Status CheckEnumArgument(const TypePtr& real_type, const c10::IValue& value) {
  TypePtr type = real_type;
  if (type->kind() == TypeKind::OptionalType) {
    if (value.isNone()) return absl::OkStatus();
    type = type->containedType(0);
  }
  if (type->kind() == TypeKind::ListType) {
    if (!value.isIntList()) return absl::OkStatus();
    const TypeKind element = type->containedType(0)->kind();
    for (int64_t v : value.toIntVector()) {
      if (absl::Status s = CheckEnumValue(element, v); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return value.isInt() ? CheckEnumValue(type->kind(), value.toInt()) : absl::OkStatus();
}

// Decodes one call's Values through its context.
class ArgumentDecoder {
 public:
  explicit ArgumentDecoder(OpCallContext& context)
      : context_(context), op_name_(context.op_name()) {}

  absl::StatusOr<c10::IValue> Decode(const v1::Value& value, const TypePtr& type,
                                     const ValueWhere& where) {
    const TypeKind kind = type->kind();
    if (kind == TypeKind::OptionalType) {
      if (value.has_none()) return c10::IValue();
      if (value.has_tensor() && value.tensor().undefined()) return c10::IValue();
      return Decode(value, type->expectRef<c10::OptionalType>().getElementType(), where);
    }
    const auto mismatch = [&]() {
      return absl::InvalidArgumentError(absl::StrCat(op_name_, ": ", where.str(), " has type ",
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
          absl::StatusOr<at::Tensor> tensor = context_.WrapTensor(value.tensor(), where);
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
        if (context_.KernelDevice(context_.device()).type() != c10::kCPU) {
          // The cpu_fallback route draws it (op_generators.h).
          return DeclinedError(absl::StrCat(
              op_name_, ": ", where.str(), ": the ", context_.backend().name(),
              " backend's native kernels take no generator"));
        }
        const v1::GeneratorValue& g = value.generator();
        return c10::IValue(SeededCpuGenerator(g));
      }
      case TypeKind::ListType:
        return DecodeList(value, type->expectRef<c10::ListType>().getElementType(), where);
      default:
        return absl::UnimplementedError(absl::StrCat(op_name_, ": ", where.str(), " has type ",
                                                     type->str(),
                                                     ", which flagosd cannot decode yet"));
    }
  }

 private:
  absl::StatusOr<c10::IValue> DecodeDevice(const v1::DeviceValue& device,
                                           const ValueWhere& where) {
    if (device.type() == "cpu") return c10::IValue(c10::Device(c10::kCPU));
    const int index = device.index() < 0 ? context_.device() : device.index();
    const int device_count = context_.backend().runtime().DeviceCount();
    if (index < 0 || index >= device_count) {
      return CheckDevice(index, device_count, absl::StrCat(op_name_, ": ", where.str()));
    }
    return c10::IValue(context_.KernelDevice(index));
  }

  absl::StatusOr<c10::IValue> DecodeList(const v1::Value& value, const TypePtr& element,
                                         const ValueWhere& where) {
    const TypeKind kind = element->kind();
    const auto mismatch = [&]() {
      return absl::InvalidArgumentError(absl::StrCat(op_name_, ": ", where.str(), " has type ",
                                                     element->str(), "[] but the command sends ",
                                                     ValueKindName(value)));
    };
    const auto element_where = [&](int i) { return where.Element(i); };
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
  absl::StatusOr<at::Tensor> HostTensor(const v1::HostTensor& host, const ValueWhere& where) {
    absl::StatusOr<int64_t> numel = CheckHostTensor(host);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": ", where.str(), ": ", numel.status().message()));
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
      // It stays a host tensor: the kernels of both routes run on the CPU
      // today (a native route on device kernels would upload it through
      // the runtime, never with an ATen device copy).
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return tensor;
  }

  OpCallContext& context_;
  const std::string& op_name_;
};

}  // namespace

absl::Status DecodeArguments(OpCallContext& context, const std::vector<c10::Argument>& arguments,
                             const v1::OpCall& call, torch::jit::Stack* stack) {
  const std::string& op_name = context.op_name();
  ArgumentDecoder decoder(context);
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::Argument& argument = arguments[i];
    const ValueWhere where = ValueWhere::Argument(argument.name(), i);
    if (i >= static_cast<size_t>(call.args_size())) {
      if (!argument.default_value().has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_name, ": ", where.str(), " is missing and has no default; the command sends ",
            call.args_size(), " of ", arguments.size(), " arguments"));
      }
      stack->push_back(*argument.default_value());
      continue;
    }
    context.set_writing(argument.alias_info() != nullptr && argument.alias_info()->isWrite());
    absl::StatusOr<c10::IValue> value = decoder.Decode(call.args(i), argument.type(), where);
    if (!value.ok()) return value.status();
    if (absl::Status s = CheckEnumArgument(argument.real_type(), *value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(op_name, ": ", where.str(), ": ",
                                                     s.message()));
    }
    stack->push_back(*std::move(value));
  }
  context.set_writing(false);
  return absl::OkStatus();
}

}  // namespace flagos::daemon
