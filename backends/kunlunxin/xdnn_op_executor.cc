// The native route through the xdnn binding module (xdnn_op_executor.h).
#include "xdnn_op_executor.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/item.h>
#include <c10/core/ScalarType.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "flagos/device_memory_tensor.h"
#include "kunlunxin_runtime.h"
#include "xdnn_module_abi.h"

namespace flagos {
namespace {

static_assert(FLAGOS_XDNN_UINT8 == static_cast<int>(c10::ScalarType::Byte));
static_assert(FLAGOS_XDNN_INT8 == static_cast<int>(c10::ScalarType::Char));
static_assert(FLAGOS_XDNN_INT16 == static_cast<int>(c10::ScalarType::Short));
static_assert(FLAGOS_XDNN_INT32 == static_cast<int>(c10::ScalarType::Int));
static_assert(FLAGOS_XDNN_INT64 == static_cast<int>(c10::ScalarType::Long));
static_assert(FLAGOS_XDNN_FLOAT16 == static_cast<int>(c10::ScalarType::Half));
static_assert(FLAGOS_XDNN_FLOAT32 == static_cast<int>(c10::ScalarType::Float));
static_assert(FLAGOS_XDNN_FLOAT64 == static_cast<int>(c10::ScalarType::Double));
static_assert(FLAGOS_XDNN_BOOL == static_cast<int>(c10::ScalarType::Bool));
static_assert(FLAGOS_XDNN_BFLOAT16 == static_cast<int>(c10::ScalarType::BFloat16));

// One call's descriptors and the storage they point into.
class CallDescriptors {
 public:
  CallDescriptors(c10::Device device) : device_(device) {}

  // Adds `value` as the next argument; DeclinedError for what the module
  // cannot take.
  absl::Status Add(const c10::IValue& value) {
    flagos_xdnn_arg arg{};
    if (value.isNone()) {
      arg.kind = FLAGOS_XDNN_ARG_NONE;
    } else if (value.isTensor()) {
      const at::Tensor& t = value.toTensor();
      if (!t.defined()) {
        arg.kind = FLAGOS_XDNN_ARG_NONE;
      } else if (t.dim() == 0 && t.device().is_cpu()) {
        // A number the client sent by value (`x += 1` sends a wrapped
        // number as a 0-dim host tensor): the bindings take it as a Scalar.
        const c10::Scalar number = t.item();
        if (number.isBoolean()) {
          arg.kind = FLAGOS_XDNN_ARG_BOOL;
          arg.i = number.toBool() ? 1 : 0;
        } else if (number.isIntegral(/*includeBool=*/false)) {
          arg.kind = FLAGOS_XDNN_ARG_INT;
          arg.i = number.toLong();
        } else if (number.isFloatingPoint()) {
          arg.kind = FLAGOS_XDNN_ARG_DOUBLE;
          arg.d = number.toDouble();
        } else {
          return DeclinedError("a complex number sent by value");
        }
      } else {
        absl::StatusOr<flagos_xdnn_tensor> d = Describe(t);
        if (!d.ok()) return d.status();
        arg.kind = FLAGOS_XDNN_ARG_TENSOR;
        arg.tensor = *d;
      }
    } else if (value.isBool()) {
      arg.kind = FLAGOS_XDNN_ARG_BOOL;
      arg.i = value.toBool() ? 1 : 0;
    } else if (value.isInt()) {
      arg.kind = FLAGOS_XDNN_ARG_INT;
      arg.i = value.toInt();
    } else if (value.isDouble()) {
      arg.kind = FLAGOS_XDNN_ARG_DOUBLE;
      arg.d = value.toDouble();
    } else if (value.isString()) {
      std::string& text = strings_.emplace_back(value.toStringRef());
      arg.kind = FLAGOS_XDNN_ARG_STRING;
      arg.string = text.c_str();
    } else if (value.isBoolList()) {
      std::vector<int64_t>& ints = ints_.emplace_back();
      for (bool b : value.toBoolList()) ints.push_back(b ? 1 : 0);
      arg.kind = FLAGOS_XDNN_ARG_BOOLS;
      arg.count = static_cast<int64_t>(ints.size());
      arg.ints = ints.data();
    } else if (value.isIntList()) {
      std::vector<int64_t>& ints = ints_.emplace_back(value.toIntVector());
      arg.kind = FLAGOS_XDNN_ARG_INTS;
      arg.count = static_cast<int64_t>(ints.size());
      arg.ints = ints.data();
    } else if (value.isDoubleList()) {
      std::vector<double>& doubles = doubles_.emplace_back(value.toDoubleVector());
      arg.kind = FLAGOS_XDNN_ARG_DOUBLES;
      arg.count = static_cast<int64_t>(doubles.size());
      arg.doubles = doubles.data();
    } else if (value.isTensorList()) {
      std::vector<flagos_xdnn_tensor>& list = lists_.emplace_back();
      for (const at::Tensor& t : value.toTensorVector()) {
        if (!t.defined()) return DeclinedError("an undefined tensor in a tensor list");
        absl::StatusOr<flagos_xdnn_tensor> d = Describe(t);
        if (!d.ok()) return d.status();
        list.push_back(*d);
      }
      arg.kind = FLAGOS_XDNN_ARG_TENSORS;
      arg.count = static_cast<int64_t>(list.size());
      arg.tensors = list.data();
    } else if (value.isList()) {
      // Scalar[]: real numbers only.
      std::vector<double>& doubles = doubles_.emplace_back();
      for (const c10::IValue& element : value.toListRef()) {
        if (element.isDouble()) {
          doubles.push_back(element.toDouble());
        } else if (element.isInt()) {
          doubles.push_back(static_cast<double>(element.toInt()));
        } else {
          return DeclinedError(absl::StrCat("a list of ", element.tagKind()));
        }
      }
      arg.kind = FLAGOS_XDNN_ARG_DOUBLES;
      arg.count = static_cast<int64_t>(doubles.size());
      arg.doubles = doubles.data();
    } else {
      return DeclinedError(absl::StrCat("an argument of kind ", value.tagKind()));
    }
    args_.push_back(arg);
    return absl::OkStatus();
  }

  absl::StatusOr<flagos_xdnn_tensor> Describe(const at::Tensor& t) {
    if (t.device() != device_) {
      return DeclinedError(absl::StrCat("an operand on ", t.device().str(),
                                        " (xdnn runs on the op's device only)"));
    }
    if (t.is_conj() || t.is_neg() || t.is_complex()) {
      return DeclinedError("a complex, conjugate or negative-view operand");
    }
    flagos_xdnn_tensor d{};
    d.data = t.numel() == 0 ? nullptr : const_cast<void*>(t.const_data_ptr());
    d.dtype = static_cast<int32_t>(t.scalar_type());
    d.dim = static_cast<int32_t>(t.dim());
    d.sizes = t.sizes().data();
    d.strides = t.strides().data();
    return d;
  }

  const std::vector<flagos_xdnn_arg>& args() const { return args_; }
  // The dtype of the first tensor (lists included); -1 when none.
  int32_t key_dtype() const {
    for (const flagos_xdnn_arg& arg : args_) {
      if (arg.kind == FLAGOS_XDNN_ARG_TENSOR) return arg.tensor.dtype;
      if (arg.kind == FLAGOS_XDNN_ARG_TENSORS && arg.count > 0) return arg.tensors[0].dtype;
    }
    return -1;
  }

 private:
  const c10::Device device_;
  std::vector<flagos_xdnn_arg> args_;
  std::deque<std::vector<int64_t>> ints_;
  std::deque<std::vector<double>> doubles_;
  std::deque<std::vector<flagos_xdnn_tensor>> lists_;
  std::deque<std::string> strings_;
};

class XdnnOpExecutor final : public OpExecutor {
 public:
  XdnnOpExecutor(KunlunxinStreams& streams, XdnnModule module, std::vector<KernelFact> facts)
      : streams_(streams), module_(std::move(module)), facts_(std::move(facts)) {
    for (int32_t i = 0; i < module_.module->nops; ++i) bound_.insert(module_.module->ops[i]);
  }

  c10::Device AtenDevice(int device) const override { return PrivateUse1Device(device); }

  at::Tensor WrapDeviceMemory(int device, DevicePtr ptr, c10::IntArrayRef sizes,
                              c10::IntArrayRef strides, c10::ScalarType dtype) override {
    return DeviceMemoryTensor(device, ptr, sizes, strides, dtype);
  }

  absl::Status Call(int device, StreamHandle stream, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack) override {
    const c10::FunctionSchema& schema = op.schema();
    for (const c10::Argument& ret : schema.returns()) {
      if (ret.alias_info() == nullptr) {
        return DeclinedError("a functional overload without the client's outputs");
      }
    }
    const std::vector<c10::IValue> arguments(stack->begin(), stack->end());
    absl::Status s = Run(device, stream, op, *stack, {});
    if (!s.ok()) return s;
    // Every return aliases the argument it names (in-place and out=).
    stack->clear();
    for (const c10::Argument& ret : schema.returns()) {
      for (size_t i = 0; i < schema.arguments().size() && i < arguments.size(); ++i) {
        const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
        if (alias != nullptr && alias->beforeSets() == ret.alias_info()->beforeSets()) {
          stack->push_back(arguments[i]);
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CallInto(int device, StreamHandle stream, const c10::OperatorHandle& op,
                        torch::jit::Stack* stack, const std::vector<at::Tensor>& outputs) override {
    absl::Status s = Run(device, stream, op, *stack, outputs);
    if (s.ok()) stack->clear();
    return s;
  }

  bool host_addressable() const override { return false; }

  bool HasKernel(const c10::OperatorHandle& op) const override {
    return bound_.contains(c10::toString(op.operator_name()));
  }

  const std::vector<KernelFact>& kernel_facts() const override { return facts_; }

 private:
  absl::Status Run(int device, StreamHandle stream, const c10::OperatorHandle& op,
                   const torch::jit::Stack& stack, const std::vector<at::Tensor>& outputs) {
    const std::string name = c10::toString(op.operator_name());
    if (!bound_.contains(name)) return DeclinedError(absl::StrCat(name, " is not bound to xdnn"));
    CallDescriptors descriptors(AtenDevice(device));
    for (const c10::IValue& value : stack) {
      if (absl::Status s = descriptors.Add(value); !s.ok()) return s;
    }
    std::vector<flagos_xdnn_tensor> outs;
    for (const at::Tensor& out : outputs) {
      if (!out.defined()) {
        flagos_xdnn_tensor absent{};
        absent.dtype = FLAGOS_XDNN_ABSENT;
        outs.push_back(absent);
        continue;
      }
      absl::StatusOr<flagos_xdnn_tensor> d = descriptors.Describe(out);
      if (!d.ok()) return d.status();
      outs.push_back(*d);
    }
    const int32_t dtype = descriptors.key_dtype();
    {
      absl::ReaderMutexLock lock(&mu_);
      if (refused_.contains(std::make_pair(name, dtype))) {
        return DeclinedError(absl::StrCat("xdnn_pytorch refused ", name, " for ",
                                          DtypeName(dtype), " before (NOT_IMPLEMENT)"));
      }
    }
    flagos_xdnn_call call{};
    call.op = name.c_str();
    call.nargs = static_cast<int32_t>(descriptors.args().size());
    call.args = descriptors.args().data();
    call.nouts = static_cast<int32_t>(outs.size());
    call.outs = outs.data();
    call.device = device;
    flagos_xdnn_result result{};
    absl::Status issued = streams_.IssueOnStream(device, stream, [&](void* xpu_stream) {
      call.stream = xpu_stream;
      module_.module->call(&call, &result);
      return Translate(name, device, dtype, result);
    });
    return issued;
  }

  absl::Status Translate(const std::string& name, int device, int32_t dtype,
                         const flagos_xdnn_result& r) {
    const std::string via =
        r.vendor_call[0] == '\0' ? std::string()
                                 : absl::StrCat(" through xdnn_pytorch::", r.vendor_call,
                                                r.vendor_code[0] == '\0' ? "" : " (",
                                                r.vendor_code, r.vendor_code[0] == '\0' ? "" : ")");
    switch (r.code) {
      case FLAGOS_XDNN_OK:
        return absl::OkStatus();
      case FLAGOS_XDNN_DECLINED:
        if (std::string_view(r.vendor_code) == "NOT_IMPLEMENT") {
          absl::MutexLock lock(&mu_);
          refused_.insert(std::make_pair(name, dtype));
        }
        return DeclinedError(absl::StrCat(name, via, " for ", DtypeName(dtype), ": ", r.message));
      case FLAGOS_XDNN_INVALID:
        return absl::InvalidArgumentError(absl::StrCat(
            "kunlunxin device ", device, ": ", name, via, " for ", DtypeName(dtype), ": ",
            r.message, "; the call's shapes or parameters are outside what xdnn_pytorch takes "
            "(route the op cpu_fallback in the node's ops.conf and report it)"));
      case FLAGOS_XDNN_NO_WORKSPACE:
        return absl::ResourceExhaustedError(absl::StrCat(
            "kunlunxin device ", device, ": ", name, via, ": ", r.message,
            "; xdnn_pytorch needs more workspace than its context has"));
      default:
        return absl::InternalError(absl::StrCat(
            "kunlunxin device ", device, ": ", name, via, " for ", DtypeName(dtype), ": ",
            r.message, "; the device may be in a bad state: check flagos-smi and the node's "
            "kernel log"));
    }
  }

  static std::string DtypeName(int32_t dtype) {
    if (dtype < 0) return "no tensor";
    return c10::toString(static_cast<c10::ScalarType>(dtype));
  }

  KunlunxinStreams& streams_;
  const XdnnModule module_;
  const std::vector<KernelFact> facts_;
  absl::flat_hash_set<std::string> bound_;  // constant after construction
  absl::Mutex mu_;
  absl::flat_hash_set<std::pair<std::string, int32_t>> refused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<OpExecutor> CreateXdnnOpExecutor(DeviceRuntime& runtime, XdnnModule module,
                                                 std::vector<KernelFact> facts) {
  KunlunxinStreams* streams = AsKunlunxinStreams(runtime);
  if (streams == nullptr || module.module == nullptr) return nullptr;
  return std::make_unique<XdnnOpExecutor>(*streams, std::move(module), std::move(facts));
}

}  // namespace flagos
