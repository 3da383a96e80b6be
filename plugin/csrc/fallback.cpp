// The boxed fallback: every ATen operator without an explicit flagos kernel.
//
// 1. The op runs on meta tensors mirroring the arguments (same sizes,
//    strides, offsets, shared storages) to learn output metadata, to resize
//    `out=` arguments and to raise shape errors at the call site.
// 2. Fresh outputs are allocated from the caching allocator (no round trip);
//    returns that are views are built locally over the input's storage;
//    returns that alias a written argument give back that argument.
// 3. One OpCall command is enqueued; the daemon runs the op and fills the
//    outputs. Nothing waits.
// Ops whose outputs cannot be inferred on meta (data-dependent shapes, no
// meta kernel) or that return non-tensors take the synchronous path: the
// daemon runs them and returns their results, which are uploaded.
#include <Python.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "copy.h"
#include "generator.h"
#include "runtime.h"
#include "storage.h"
#include "tensor_codec.h"

namespace torch_fl {
namespace {

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

bool IsFlagos(const at::Tensor& t) { return t.defined() && t.device().type() == kFlagos; }

template <typename F>
void ForEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ForEachTensor(e, f);
  }
}

int FindDevice(const std::vector<c10::IValue>& args) {
  int found = -1;
  for (const c10::IValue& a : args) {
    ForEachTensor(a, [&](const at::Tensor& t) {
      if (!IsFlagos(t)) return;
      int d = t.device().index();
      TORCH_CHECK(found < 0 || found == d,
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, flagos:", found, " and flagos:", d, "!");
      found = d;
    });
  }
  if (found >= 0) return found;
  for (const c10::IValue& a : args) {
    if (a.isDevice() && a.toDevice().type() == kFlagos && a.toDevice().has_index()) {
      return a.toDevice().index();
    }
  }
  return CurrentDevice();
}

// The alias annotation of an argument or return; for lists (`Tensor(a!)[]`)
// the annotation of the elements.
const c10::AliasInfo* AliasOf(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info != nullptr && info->beforeSets().empty() && !info->containedTypes().empty()) {
    return &info->containedTypes()[0];
  }
  return info;
}

bool IsWritten(const c10::Argument& a) {
  const c10::AliasInfo* info = AliasOf(a);
  return info != nullptr && info->isWrite();
}

// The index of the argument that return `ret` aliases.
size_t AliasedArgument(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* r = AliasOf(schema.returns()[ret]);
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = AliasOf(schema.arguments()[i]);
    if (a == nullptr) continue;
    for (const auto& set : r->beforeSets()) {
      if (a->beforeSets().count(set) != 0) return i;
    }
  }
  TORCH_CHECK(false, "flagos: ", schema, ": return ", ret, " aliases no argument");
}

bool ReturnsOnlyTensors(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    const c10::TypePtr& type = r.real_type();
    bool tensor = type->kind() == c10::TypeKind::TensorType;
    bool tensor_list = type->kind() == c10::TypeKind::ListType &&
                       type->containedType(0)->kind() == c10::TypeKind::TensorType;
    if (!tensor && !tensor_list) return false;
  }
  return true;
}

// Views only: nothing to run in the daemon.
bool IsPureView(const c10::FunctionSchema& schema) {
  if (schema.returns().empty()) return false;
  for (const c10::Argument& a : schema.arguments()) {
    if (IsWritten(a)) return false;
  }
  for (const c10::Argument& r : schema.returns()) {
    const c10::AliasInfo* info = AliasOf(r);
    if (info == nullptr || info->isWrite()) return false;
  }
  return true;
}

// Mirrors flagos (and non-scalar CPU) tensors as meta tensors; tensors that
// share a storage get meta tensors that share one.
class MetaMirror {
 public:
  c10::IValue Convert(const c10::IValue& v) {
    if (v.isTensor()) return c10::IValue(ToMeta(v.toTensor()));
    if (v.isDevice() && v.toDevice().type() == kFlagos) return c10::IValue(c10::Device(c10::kMeta));
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(ToMeta(t));
      return c10::IValue(out);
    }
    if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isNone()) {
          out.push_back(std::nullopt);
        } else {
          out.push_back(ToMeta(e.toTensor()));
        }
      }
      return c10::IValue(out);
    }
    return v;
  }

 private:
  at::Tensor ToMeta(const at::Tensor& t) {
    if (!t.defined()) return t;
    // CPU 0-dim tensors stay: ATen lets them mix with any device.
    if (!IsFlagos(t) && !(t.device().is_cpu() && t.dim() > 0)) return t;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                           c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                           c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true);
      it = storages_.emplace(key, std::move(storage)).first;
    }
    at::Tensor meta = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(it->second), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    return meta;
  }

  std::unordered_map<c10::StorageImpl*, c10::Storage> storages_;
};

// Applies to a written flagos argument the metadata its meta mirror ended
// with (an `out=` resized, an in-place op that restrides).
void ApplyMetadata(const c10::IValue& real, const c10::IValue& meta) {
  if (real.isTensor()) {
    const at::Tensor& t = real.toTensor();
    const at::Tensor& m = meta.toTensor();
    if (!IsFlagos(t)) return;
    if (t.sizes() == m.sizes() && t.strides() == m.strides() &&
        t.storage_offset() == m.storage_offset()) {
      return;
    }
    if (m.storage().nbytes() > t.storage().nbytes()) {
      ResizeStorageBytes(t.storage(), m.storage().nbytes());
    }
    t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes(), m.strides(), m.storage_offset());
  } else if (real.isList() && meta.isList()) {
    auto r = real.toListRef();
    auto m = meta.toListRef();
    for (size_t i = 0; i < r.size() && i < m.size(); ++i) ApplyMetadata(r[i], m[i]);
  }
}

at::Tensor MakeView(const at::Tensor& base, const at::Tensor& meta) {
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), meta.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(),
                                                    meta.storage_offset());
  return view;
}

c10::IValue MakeViews(const c10::IValue& base, const c10::IValue& meta) {
  if (meta.isTensor()) return c10::IValue(MakeView(base.toTensor(), meta.toTensor()));
  c10::List<at::Tensor> views;
  for (const at::Tensor& m : meta.toTensorList()) views.push_back(MakeView(base.toTensor(), m));
  return c10::IValue(views);
}

at::Tensor AllocateOutput(const at::Tensor& meta, int device,
                          google::protobuf::RepeatedPtrField<flagos::v1::TensorRef>* refs) {
  flagos::v1::TensorRef* ref = refs->Add();
  if (!meta.defined()) {
    ref->set_undefined(true);
    return at::Tensor();
  }
  at::Tensor out = at::empty_strided(
      meta.sizes(), meta.strides(),
      at::TensorOptions().dtype(meta.scalar_type()).device(kFlagos, static_cast<c10::DeviceIndex>(device)));
  EncodeTensorRef(out, ref);
  return out;
}

c10::IValue AllocateOutputs(const c10::IValue& meta, int device,
                            google::protobuf::RepeatedPtrField<flagos::v1::TensorRef>* refs) {
  if (meta.isTensor()) return c10::IValue(AllocateOutput(meta.toTensor(), device, refs));
  c10::List<at::Tensor> outs;
  for (const at::Tensor& m : meta.toTensorList()) outs.push_back(AllocateOutput(m, device, refs));
  return c10::IValue(outs);
}

std::string Describe(const c10::FunctionSchema& schema) {
  return schema.overload_name().empty() ? schema.name()
                                        : schema.name() + "." + schema.overload_name();
}

bool IsGeneratorArgument(const c10::Argument& a) {
  c10::TypePtr type = a.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
  return type->kind() == c10::TypeKind::GeneratorType;
}

// A random op draws from the given flagos generator, or the device's
// default one: it travels as (seed, offset) and advances the offset.
void EncodeGenerator(const c10::IValue& value, int device, flagos::v1::Value* out) {
  at::Generator generator = value.isGenerator() ? value.toGenerator() : DefaultGenerator(device);
  TORCH_CHECK(generator.device().type() == c10::DeviceType::PrivateUse1,
              "flagos: a random operator on flagos needs a flagos generator, got one for ",
              generator.device());
  std::lock_guard<std::mutex> lock(generator.mutex());
  auto [seed, offset] = generator.get<FlagosGeneratorImpl>()->NextOpState();
  out->mutable_generator()->set_seed(seed);
  out->mutable_generator()->set_offset(offset);
}

flagos::v1::Command MakeOpCall(const c10::FunctionSchema& schema, int device,
                               const std::vector<c10::IValue>& args) {
  flagos::v1::Command command;
  command.set_device(device);
  auto* call = command.mutable_op();
  call->set_op_id(OpId(schema.name(), schema.overload_name()));
  for (size_t i = 0; i < args.size(); ++i) {
    if (IsGeneratorArgument(schema.arguments()[i])) {
      EncodeGenerator(args[i], device, call->add_args());
    } else {
      EncodeValue(args[i], call->add_args());
    }
  }
  return command;
}

void RunInferred(const c10::FunctionSchema& schema, int device, std::vector<c10::IValue>& args,
                 const std::vector<c10::IValue>& meta_args, torch::jit::Stack& meta_returns,
                 torch::jit::Stack* stack) {
  const auto& arguments = schema.arguments();
  const auto& returns = schema.returns();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (IsWritten(arguments[i])) ApplyMetadata(args[i], meta_args[i]);
  }
  bool pure_view = IsPureView(schema);
  flagos::v1::Command command;
  google::protobuf::RepeatedPtrField<flagos::v1::TensorRef> outputs;
  std::vector<c10::IValue> results;
  results.reserve(returns.size());
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::AliasInfo* alias = AliasOf(returns[j]);
    if (alias != nullptr && alias->isWrite()) {
      results.push_back(args[AliasedArgument(schema, j)]);
    } else if (alias != nullptr) {
      results.push_back(MakeViews(args[AliasedArgument(schema, j)], meta_returns[j]));
    } else {
      results.push_back(AllocateOutputs(meta_returns[j], device, &outputs));
    }
  }
  if (!pure_view) {
    command = MakeOpCall(schema, device, args);
    command.mutable_op()->mutable_outputs()->Swap(&outputs);
    Enqueue(std::move(command), Describe(schema));
  }
  for (c10::IValue& r : results) stack->push_back(std::move(r));
}

void RunSynchronously(const c10::FunctionSchema& schema, int device,
                      const std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  flagos::v1::Command command = MakeOpCall(schema, device, args);
  command.mutable_op()->set_want_values(true);
  flagos::v1::Completion completion = Call(std::move(command), Describe(schema));
  const auto& arguments = schema.arguments();
  const auto& returns = schema.returns();
  // One value per return, then one per written tensor argument: none when it
  // was written in place, the new contents when the op resized it.
  size_t written = 0;
  for (const c10::Argument& a : arguments) {
    if (IsWritten(a) && a.real_type()->kind() == c10::TypeKind::TensorType) ++written;
  }
  const size_t values = static_cast<size_t>(completion.values_size());
  TORCH_CHECK(values == returns.size() || values == returns.size() + written, "flagos: ",
              Describe(schema), ": the daemon returned ", values, " values for ",
              returns.size(), " returns and ", written, " written arguments");
  size_t extra = returns.size();
  for (size_t i = 0; i < arguments.size() && values > returns.size(); ++i) {
    if (!IsWritten(arguments[i]) || arguments[i].real_type()->kind() != c10::TypeKind::TensorType) {
      continue;
    }
    const flagos::v1::Value& v = completion.values(static_cast<int>(extra++));
    if (!v.has_host_tensor()) continue;
    const at::Tensor& target = args[i].toTensor();
    at::Tensor result = DecodeResult(v, device).toTensor();
    target.resize_(result.sizes());
    EnqueueDeviceCopy(target, result);
  }
  for (size_t j = 0; j < returns.size(); ++j) {
    if (IsWritten(returns[j])) {
      stack->push_back(args[AliasedArgument(schema, j)]);
    } else {
      stack->push_back(DecodeResult(completion.values(static_cast<int>(j)), device));
    }
  }
}

bool IsPythonNotImplemented(python_error& e) {
  e.persist();
  pybind11::gil_scoped_acquire gil;
  return e.type != nullptr && PyErr_GivenExceptionMatches(e.type, PyExc_NotImplementedError) != 0;
}

void FlagosFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - nargs),
                                std::make_move_iterator(stack->end()));
  torch::jit::drop(*stack, nargs);
  const int device = FindDevice(args);

  bool inferable = ReturnsOnlyTensors(schema) && !op.hasTag(at::Tag::dynamic_output_shape);
  std::vector<c10::IValue> meta_args;
  torch::jit::Stack meta_stack;
  if (inferable) {
    MetaMirror mirror;
    meta_args.reserve(nargs);
    for (const c10::IValue& a : args) meta_args.push_back(mirror.Convert(a));
    meta_stack = meta_args;
    try {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
    } catch (const c10::NotImplementedError&) {
      inferable = false;  // no meta kernel: ask the daemon
    } catch (pybind11::error_already_set& e) {
      // A meta kernel written in Python that cannot infer this call (e.g.
      // boolean-mask indexing, whose output size depends on the data).
      pybind11::gil_scoped_acquire gil;
      if (!e.matches(PyExc_NotImplementedError)) throw;
      inferable = false;
    } catch (python_error& e) {
      if (!IsPythonNotImplemented(e)) throw;
      inferable = false;
    }
  }
  if (inferable) {
    RunInferred(schema, device, args, meta_args, meta_stack, stack);
  } else {
    RunSynchronously(schema, device, args, stack);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&FlagosFallback>());
}

}  // namespace torch_fl
