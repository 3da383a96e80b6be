// One call's arguments in xdnn_pytorch's types (xdnn_invocation.h).
#include "xdnn_invocation.h"

#include <string>

namespace flagos::kunlunxin::xdnn_binding {
namespace {

const char* KindName(int32_t kind) {
  switch (kind) {
    case FLAGOS_XDNN_ARG_NONE: return "None";
    case FLAGOS_XDNN_ARG_TENSOR: return "a tensor";
    case FLAGOS_XDNN_ARG_INT: return "an int";
    case FLAGOS_XDNN_ARG_DOUBLE: return "a float";
    case FLAGOS_XDNN_ARG_BOOL: return "a bool";
    case FLAGOS_XDNN_ARG_INTS: return "an int list";
    case FLAGOS_XDNN_ARG_DOUBLES: return "a float list";
    case FLAGOS_XDNN_ARG_TENSORS: return "a tensor list";
    case FLAGOS_XDNN_ARG_STRING: return "a string";
    case FLAGOS_XDNN_ARG_BOOLS: return "a bool list";
    default: return "an unknown kind";
  }
}

[[noreturn]] void Unexpected(int i, const flagos_xdnn_arg& arg, const char* wanted) {
  throw Decline{"argument " + std::to_string(i) + " is " + KindName(arg.kind) + ", not " + wanted};
}

}  // namespace

std::optional<xdnn_pytorch::ScalarType> XdnnScalarType(int32_t dtype) {
  using xdnn_pytorch::ScalarType;
  switch (dtype) {
    case FLAGOS_XDNN_BOOL: return ScalarType::kbool;
    case FLAGOS_XDNN_UINT8: return ScalarType::kuint8;
    case FLAGOS_XDNN_INT8: return ScalarType::kint8;
    case FLAGOS_XDNN_INT16: return ScalarType::kint16;
    case FLAGOS_XDNN_INT32: return ScalarType::kint32;
    case FLAGOS_XDNN_INT64: return ScalarType::kint64;
    case FLAGOS_XDNN_FLOAT32: return ScalarType::kfloat32;
    case FLAGOS_XDNN_FLOAT16: return ScalarType::kfloat16;
    case FLAGOS_XDNN_BFLOAT16: return ScalarType::kbfloat16;
    case FLAGOS_XDNN_FLOAT64: return ScalarType::kfloat64;
    default: return std::nullopt;
  }
}

xdnn_pytorch::Tensor ToXdnn(const flagos_xdnn_tensor& t) {
  if (t.dtype == FLAGOS_XDNN_ABSENT) {
    // A result nobody wants: no memory; the call's mask says not to write it.
    return xdnn_pytorch::Tensor{{0}, {1}, xdnn_pytorch::ScalarType::kfloat32, nullptr};
  }
  std::optional<xdnn_pytorch::ScalarType> type = XdnnScalarType(t.dtype);
  if (!type.has_value()) {
    throw Decline{"dtype " + std::to_string(t.dtype) + " has no xdnn_pytorch ScalarType"};
  }
  xdnn_pytorch::Tensor out{{}, {}, *type, t.data};
  if (t.dim == 0) {
    out.sizes = {1};
    out.strides = {1};
  } else {
    out.sizes.assign(t.sizes, t.sizes + t.dim);
    out.strides.assign(t.strides, t.strides + t.dim);
  }
  return out;
}

const flagos_xdnn_arg& Invocation::Arg(int i) const {
  if (i < 0 || i >= call_.nargs) {
    throw Decline{"argument " + std::to_string(i) + " is missing (the call has " +
                  std::to_string(call_.nargs) + ")"};
  }
  return call_.args[i];
}

bool Invocation::IsNone(int i) const { return Arg(i).kind == FLAGOS_XDNN_ARG_NONE; }
bool Invocation::IsTensor(int i) const { return Arg(i).kind == FLAGOS_XDNN_ARG_TENSOR; }

xdnn_pytorch::Tensor Invocation::Tensor(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_TENSOR) Unexpected(i, arg, "a tensor");
  return ToXdnn(arg.tensor);
}

xdnn_pytorch::OptionalTensor Invocation::OptionalTensor(int i) const {
  if (IsNone(i)) return std::nullopt;
  return Tensor(i);
}

std::vector<xdnn_pytorch::Tensor> Invocation::Tensors(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_TENSORS) Unexpected(i, arg, "a tensor list");
  std::vector<xdnn_pytorch::Tensor> tensors;
  tensors.reserve(arg.count);
  for (int64_t k = 0; k < arg.count; ++k) tensors.push_back(ToXdnn(arg.tensors[k]));
  return tensors;
}

xdnn_pytorch::Scalar Invocation::Scalar(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  switch (arg.kind) {
    case FLAGOS_XDNN_ARG_INT:
    case FLAGOS_XDNN_ARG_BOOL:
      return xdnn_pytorch::Scalar::create(static_cast<int64_t>(arg.i));
    case FLAGOS_XDNN_ARG_DOUBLE:
      return FloatScalar(arg.d);
    default:
      Unexpected(i, arg, "a number");
  }
}

int64_t Invocation::ScalarCount(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_DOUBLES && arg.kind != FLAGOS_XDNN_ARG_INTS) {
    Unexpected(i, arg, "a number list");
  }
  return arg.count;
}

xdnn_pytorch::Scalar Invocation::ScalarAt(int i, int64_t k) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (k < 0 || k >= ScalarCount(i)) Unexpected(i, arg, "a longer number list");
  if (arg.kind == FLAGOS_XDNN_ARG_INTS) return xdnn_pytorch::Scalar::create(arg.ints[k]);
  return FloatScalar(arg.doubles[k]);
}

xdnn_pytorch::Scalar Invocation::FloatScalar(double value) const {
  // xdnn_pytorch's Scalar holds a float: a float64 op whose scalar a float
  // cannot hold exactly would compute with another value than ATen's.
  if (static_cast<double>(static_cast<float>(value)) != value && HasFloat64Tensor()) {
    throw Decline{"a float64 op with a scalar a float cannot hold"};
  }
  return xdnn_pytorch::Scalar::create(static_cast<float>(value));
}

bool Invocation::HasFloat64Tensor() const {
  for (int32_t i = 0; i < call_.nargs; ++i) {
    const flagos_xdnn_arg& arg = call_.args[i];
    if (arg.kind == FLAGOS_XDNN_ARG_TENSOR && arg.tensor.dtype == FLAGOS_XDNN_FLOAT64) return true;
    if (arg.kind == FLAGOS_XDNN_ARG_TENSORS) {
      for (int64_t k = 0; k < arg.count; ++k) {
        if (arg.tensors[k].dtype == FLAGOS_XDNN_FLOAT64) return true;
      }
    }
  }
  return false;
}

int64_t Invocation::Int(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_INT && arg.kind != FLAGOS_XDNN_ARG_BOOL) {
    Unexpected(i, arg, "an int");
  }
  return arg.i;
}

bool Invocation::Bool(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_BOOL) Unexpected(i, arg, "a bool");
  return arg.i != 0;
}

double Invocation::Double(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind == FLAGOS_XDNN_ARG_DOUBLE) return arg.d;
  if (arg.kind == FLAGOS_XDNN_ARG_INT) return static_cast<double>(arg.i);
  Unexpected(i, arg, "a float");
}

std::vector<int64_t> Invocation::Ints(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind == FLAGOS_XDNN_ARG_NONE) return {};
  if (arg.kind != FLAGOS_XDNN_ARG_INTS) Unexpected(i, arg, "an int list");
  return std::vector<int64_t>(arg.ints, arg.ints + arg.count);
}

std::string Invocation::String(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_STRING) Unexpected(i, arg, "a string");
  return arg.string;
}

std::vector<bool> Invocation::Bools(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_BOOLS) Unexpected(i, arg, "a bool list");
  return std::vector<bool>(arg.ints, arg.ints + arg.count);
}

int32_t Invocation::DtypeOf(int i) const {
  const flagos_xdnn_arg& arg = Arg(i);
  if (arg.kind != FLAGOS_XDNN_ARG_TENSOR) Unexpected(i, arg, "a tensor");
  return arg.tensor.dtype;
}

}  // namespace flagos::kunlunxin::xdnn_binding
