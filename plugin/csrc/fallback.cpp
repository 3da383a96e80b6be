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
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "copy.h"
#include "fallback.h"
#include "generator.h"
#include "op_schema.h"
#include "runtime.h"
#include "shape_inference.h"
#include "storage.h"
#include "tensor_codec.h"

namespace torch_fl {
namespace {



template <typename F>
void ForEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ForEachTensor(e, f);
  }
}

// As on CUDA: a CPU tensor may join a flagos operation only as a 0-dim value
// (or as indices of advanced indexing); anything else is a device mismatch.
void CheckNoHostOperands(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args,
                         int device) {
  const std::string& name = schema.name();
  if (name == "aten::index" || name == "aten::index_put_" || name == "aten::index_put" ||
      name == "aten::_index_put_impl_" || name == "aten::_unsafe_index" ||
      name == "aten::_unsafe_index_put") {
    return;
  }
  for (const c10::IValue& a : args) {
    ForEachTensor(a, [&](const at::Tensor& t) {
      TORCH_CHECK(!(t.defined() && t.device().is_cpu() && t.dim() > 0),
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, flagos:", device, " and cpu! (", schema.name(),
                  "; move the CPU tensor with .to(\"flagos\"))");
    });
  }
}

int FindDevice(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args) {
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
  if (found >= 0) {
    CheckNoHostOperands(schema, args, found);
    return found;
  }
  for (const c10::IValue& a : args) {
    if (a.isDevice() && a.toDevice().type() == kFlagos && a.toDevice().has_index()) {
      return a.toDevice().index();
    }
  }
  return CurrentDevice();
}

// Applies to a written flagos argument the metadata its meta mirror ended
// with (an `out=` resized, an in-place op that restrides).
void ApplyMetadata(const at::Tensor& t, const TensorMeta& m) {
  if (!IsFlagos(t)) return;
  if (t.sizes() == c10::IntArrayRef(m.sizes) && t.strides() == c10::IntArrayRef(m.strides) &&
      t.storage_offset() == m.storage_offset) {
    return;
  }
  if (m.storage_nbytes > t.storage().nbytes()) ResizeStorageBytes(t.storage(), m.storage_nbytes);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides, m.storage_offset);
}

void ApplyMetadata(const c10::IValue& real, const std::vector<TensorMeta>& metas) {
  if (real.isTensor()) {
    ApplyMetadata(real.toTensor(), metas.at(0));
  } else if (real.isList()) {
    auto elements = real.toListRef();
    for (size_t i = 0; i < elements.size() && i < metas.size(); ++i) {
      if (elements[i].isTensor()) ApplyMetadata(elements[i].toTensor(), metas[i]);
    }
  }
}

at::Tensor MakeView(const at::Tensor& base, const TensorMeta& m) {
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(),
      c10::scalarTypeToTypeMeta(m.dtype));
  view.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides, m.storage_offset);
  return view;
}

at::Tensor AllocateOutput(const TensorMeta& m, int device,
                          google::protobuf::RepeatedPtrField<flagos::v1::TensorRef>* refs) {
  flagos::v1::TensorRef* ref = refs->Add();
  if (!m.defined) {
    ref->set_undefined(true);
    return at::Tensor();
  }
  at::Tensor out = at::empty_strided(
      m.sizes, m.strides,
      at::TensorOptions().dtype(m.dtype).device(kFlagos, static_cast<c10::DeviceIndex>(device)));
  EncodeTensorRef(out, ref);
  return out;
}

// A Tensor return is one tensor; a Tensor[] return a list.
c10::IValue ReturnValue(const c10::Argument& ret, std::vector<at::Tensor> tensors) {
  if (ret.real_type()->kind() == c10::TypeKind::TensorType) return c10::IValue(tensors.at(0));
  return c10::IValue(c10::List<at::Tensor>(std::move(tensors)));
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

flagos::v1::Command MakeOpCall(const c10::OperatorHandle& op, int device,
                               const std::vector<c10::IValue>& args) {
  const c10::FunctionSchema& schema = op.schema();
  flagos::v1::Command command;
  command.set_device(device);
  auto* call = command.mutable_op();
  call->set_op_id(OpId(schema.name(), schema.overload_name()));
  bool has_generator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (IsGeneratorArgument(schema.arguments()[i])) {
      EncodeGenerator(args[i], device, call->add_args());
      has_generator = true;
    } else {
      EncodeValue(args[i], call->add_args());
    }
  }
  if (!has_generator && op.hasTag(at::Tag::nondeterministic_seeded)) {
    // A random op without a Generator argument (native_dropout) draws from
    // the device's default generator all the same.
    flagos::v1::Value state;
    EncodeGenerator(c10::IValue(), device, &state);
    *call->mutable_implicit_generator() = state.generator();
  }
  return command;
}

void RunInferred(const c10::OperatorHandle& op, int device, std::vector<c10::IValue>& args,
                 const InferredCall& inferred, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& arguments = schema.arguments();
  const auto& returns = schema.returns();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!inferred.written[i].empty()) ApplyMetadata(args[i], inferred.written[i]);
  }
  google::protobuf::RepeatedPtrField<flagos::v1::TensorRef> outputs;
  std::vector<c10::IValue> results;
  results.reserve(returns.size());
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::AliasInfo* alias = AliasOf(returns[j]);
    std::vector<at::Tensor> tensors;
    if (alias != nullptr && alias->isWrite()) {
      results.push_back(args[AliasedArgument(schema, j)]);
      continue;
    }
    if (alias != nullptr) {
      const at::Tensor& base = args[AliasedArgument(schema, j)].toTensor();
      for (const TensorMeta& m : inferred.returns[j]) tensors.push_back(MakeView(base, m));
    } else {
      for (const TensorMeta& m : inferred.returns[j]) {
        tensors.push_back(AllocateOutput(m, device, &outputs));
      }
    }
    results.push_back(ReturnValue(returns[j], std::move(tensors)));
  }
  if (!IsPureView(schema)) {
    flagos::v1::Command command = MakeOpCall(op, device, args);
    command.mutable_op()->mutable_outputs()->Swap(&outputs);
    Enqueue(std::move(command), Describe(schema));
  }
  for (c10::IValue& r : results) stack->push_back(std::move(r));
}

void RunSynchronously(const c10::OperatorHandle& op, int device,
                      const std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  flagos::v1::Command command = MakeOpCall(op, device, args);
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

void FlagosFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - nargs),
                                std::make_move_iterator(stack->end()));
  torch::jit::drop(*stack, nargs);
  const int device = FindDevice(schema, args);
  std::optional<InferredCall> inferred = InferOnMeta(op, args);
  if (inferred.has_value()) {
    RunInferred(op, device, args, *inferred, stack);
  } else {
    RunSynchronously(op, device, args, stack);
  }
}

}  // namespace

void RunOnDaemon(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  FlagosFallback(op, stack);
}

int ForwardOpsWithCpuKernels() {
  static int forwarded = [] {
    const char* disabled = std::getenv("FLAGOS_COMPOSITE_OPS");
    if (disabled != nullptr && std::string(disabled) == "decompose") return 0;
    // Kept for the life of the process, like every registration.
    auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                       c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    int count = 0;
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
      if (!op.has_value() || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
        continue;
      }
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        continue;
      }
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      library->impl(qualified.c_str(),
                    torch::CppFunction::makeFromBoxedFunction<&FlagosFallback>());
      ++count;
    }
    return count;
  }();
  return forwarded;
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&FlagosFallback>());
}

}  // namespace torch_fl
