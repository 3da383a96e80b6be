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
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <vector>

#include "command_arena.h"
#include "copy.h"
#include "fallback.h"
#include "generator.h"
#include "graph_capture.h"
#include "op_schema.h"
#include "runtime.h"
#include "shape_inference.h"
#include "storage.h"
#include "tensor_codec.h"

namespace torch_fl {
namespace {

using Args = c10::ArrayRef<c10::IValue>;

template <typename F>
void ForEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ForEachTensor(e, f);
  }
}

// The flagos device of the call. As on CUDA, a CPU tensor may join a flagos
// operation only as a 0-dim value read by it (or as indices of advanced
// indexing); anything else is a device mismatch. A CPU tensor the op writes
// (in place, out=), even a 0-dim one, is one too: the daemon cannot write
// it, and CUDA refuses it the same way.
int FindDevice(const OpTraits& traits, Args args) {
  int found = -1;
  bool host_operand = false;
  bool host_written = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool written = i < traits.written.size() && traits.written[i];
    ForEachTensor(args[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      const c10::Device device = t.device();
      if (device.type() != kFlagos) {
        host_operand |= device.is_cpu() && t.dim() > 0;
        host_written |= written;
        return;
      }
      int d = device.index();
      TORCH_CHECK(found < 0 || found == d,
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, flagos:", found, " and flagos:", d, "!");
      found = d;
    });
  }
  if (found >= 0) {
    TORCH_CHECK(!host_written,
                "Expected all tensors to be on the same device, but found at least two "
                "devices, flagos:", found, " and cpu! (", traits.name,
                " writes a CPU tensor; move it with .to(\"flagos\"), or compute on the CPU)");
    TORCH_CHECK(!host_operand || traits.allows_host_operands,
                "Expected all tensors to be on the same device, but found at least two "
                "devices, flagos:", found, " and cpu! (", traits.name,
                "; move the CPU tensor with .to(\"flagos\"))");
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

// A new output for `m` (undefined when the kernel leaves it so), appended to
// the call's `outputs` (OpCall.outputs, in order).
at::Tensor AllocateOutput(const TensorMeta& m, int device,
                          c10::SmallVectorImpl<at::Tensor>* outputs) {
  at::Tensor out;
  if (m.defined) {
    out = at::empty_strided(
        m.sizes, m.strides,
        at::TensorOptions().dtype(m.dtype).device(kFlagos, static_cast<c10::DeviceIndex>(device)));
  }
  outputs->push_back(out);
  return out;
}

// The argument a return aliases, with AliasedArgument's error for a schema
// where it aliases none.
size_t Aliased(const c10::OperatorHandle& op, const OpTraits& traits, size_t ret) {
  const size_t i = traits.returns[ret].aliased;
  return i != OpTraits::kNoArgument ? i : AliasedArgument(op.schema(), ret);
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
  if (AnyCapture()) {
    // Captured into a graph: each replay draws from the generator's state
    // then (graph_capture.h).
    const bool is_default = generator.unsafeGetGeneratorImpl() ==
                            DefaultGenerator(device).unsafeGetGeneratorImpl();
    if (std::optional<uint64_t> relative = CaptureRelativeOffset(device, is_default, offset)) {
      out->mutable_generator()->set_offset(*relative);
      out->mutable_generator()->set_replay_relative(true);
    }
  }
}

// The session's id for the op, minted (and registered with the daemon) on
// first use. Ids are the process's for its whole life (runtime.cpp mints
// each once, and registers them all again with a session that replaces a
// lost one), so the first answer is kept with the op's traits.
uint32_t OpIdOf(const OpTraits& traits) {
  uint32_t id = traits.op_id.load(std::memory_order_acquire);
  if (id != 0) return id;
  id = OpId(traits.name, traits.overload);
  traits.op_id.store(id, std::memory_order_release);
  return id;
}

// Fills `command` (which may hold outputs already) with the op call.
void EncodeOpCall(const OpTraits& traits, int device, Args args, flagos::v1::Command* command) {
  command->set_device(device);
  auto* call = command->mutable_op();
  call->set_op_id(OpIdOf(traits));
  call->mutable_args()->Reserve(static_cast<int>(args.size()));
  bool has_generator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (traits.generator[i]) {
      EncodeGenerator(args[i], device, call->add_args());
      has_generator = true;
    } else {
      EncodeValue(args[i], call->add_args());
    }
  }
  if (!has_generator && traits.nondeterministic_seeded) {
    // A random op without a Generator argument (native_dropout) draws from
    // the device's default generator all the same.
    flagos::v1::Value state;
    EncodeGenerator(c10::IValue(), device, &state);
    *call->mutable_implicit_generator() = state.generator();
  }
}

// Enqueues the asynchronous call as its wire bytes (OpCallWire) and returns
// true when every argument is of a kind the wire writer takes and no graph
// capture runs; false, sending nothing, otherwise.
bool EnqueueOnWire(const OpTraits& traits, int device, Args args,
                   c10::ArrayRef<at::Tensor> outputs, uint64_t generation) {
  // A random op draws from a generator, whose state EncodeGenerator sends;
  // a capture holds Command objects (checked again at the send).
  if (traits.nondeterministic_seeded || AnyCapture()) return false;
  thread_local OpCallWire wire;
  wire.Clear();
  for (size_t i = 0; i < args.size(); ++i) {
    if (traits.generator[i] || !AddWireArg(args[i], &wire)) return false;
  }
  for (const at::Tensor& t : outputs) wire.AddOutput(TensorRefFieldsOf(t));
  return EnqueueOpCallWire(device, OpIdOf(traits), wire, traits.describe, generation);
}

// Enqueues the asynchronous call: straight as wire bytes where it can, else
// as a Command built on an arena in this frame (CommandArena: no heap
// allocation or destruction per message), which Enqueue serializes.
void EnqueueCall(const OpTraits& traits, int device, Args args,
                 c10::ArrayRef<at::Tensor> outputs, uint64_t generation) {
  if (EnqueueOnWire(traits, device, args, outputs, generation)) return;
  CommandArena arena;
  flagos::v1::Command& command = arena.NewCommand();
  auto* refs = command.mutable_op()->mutable_outputs();
  for (const at::Tensor& t : outputs) EncodeTensorRef(t, refs->Add());
  EncodeOpCall(traits, device, args, &command);
  Enqueue(command, traits.describe, std::nullopt, generation);
}

// One value per return, in schema order.
using Results = c10::SmallVectorImpl<c10::IValue>;

// Runs the call asynchronously. A return that is a written argument is that
// argument in `results`, or None when `written_results` is false (a caller
// holding `args` borrowed returns the argument itself: a copy of a tensor
// only Python holds would take the GIL to pin its PyObject).
void RunInferred(const c10::OperatorHandle& op, const OpTraits& traits, int device, Args args,
                 const InferredCall& inferred, bool written_results, Results* results) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (!inferred.written[i].empty()) ApplyMetadata(args[i], inferred.written[i]);
  }
  const uint64_t generation = CurrentGeneration();  // before any address is encoded
  c10::SmallVector<at::Tensor, 2> outputs;
  const size_t nreturns = traits.returns.size();
  for (size_t j = 0; j < nreturns; ++j) {
    const OpTraits::Return& ret = traits.returns[j];
    if (ret.kind == OpTraits::ReturnKind::kWritten) {
      const size_t aliased = Aliased(op, traits, j);
      results->push_back(written_results ? args[aliased] : c10::IValue());
      continue;
    }
    const std::vector<TensorMeta>& metas = inferred.returns[j];
    if (ret.tensor) {
      // One tensor (as ReturnValue did: the first of its metas).
      const TensorMeta& m = metas.at(0);
      if (ret.kind == OpTraits::ReturnKind::kView) {
        results->push_back(MakeView(args[Aliased(op, traits, j)].toTensor(), m));
      } else {
        at::Tensor first = AllocateOutput(m, device, &outputs);
        for (size_t k = 1; k < metas.size(); ++k) AllocateOutput(metas[k], device, &outputs);
        results->push_back(std::move(first));
      }
      continue;
    }
    std::vector<at::Tensor> tensors;
    tensors.reserve(metas.size());
    if (ret.kind == OpTraits::ReturnKind::kView) {
      const at::Tensor& base = args[Aliased(op, traits, j)].toTensor();
      for (const TensorMeta& m : metas) tensors.push_back(MakeView(base, m));
    } else {
      for (const TensorMeta& m : metas) tensors.push_back(AllocateOutput(m, device, &outputs));
    }
    results->push_back(c10::IValue(c10::List<at::Tensor>(std::move(tensors))));
  }
  if (!traits.pure_view) EnqueueCall(traits, device, args, outputs, generation);
}

// Runs the call on the daemon and waits for its results (one per return;
// written arguments as in RunInferred).
void RunSynchronously(const c10::OperatorHandle& op, const OpTraits& traits, int device,
                      Args args, bool written_results, Results* results) {
  const c10::FunctionSchema& schema = op.schema();
  const uint64_t generation = CurrentGeneration();  // before any address is encoded
  flagos::v1::Command command;
  EncodeOpCall(traits, device, args, &command);
  command.mutable_op()->set_want_values(true);
  // Tensor results stay in the daemon until placed into device memory.
  command.mutable_op()->set_hold_results(true);
  flagos::v1::Completion completion =
      Call(std::move(command), traits.describe, std::nullopt, generation);
  const auto& arguments = schema.arguments();
  const auto& returns = schema.returns();
  // One value per return, then one per written tensor argument: none when it
  // was written in place, the new contents when the op resized it.
  const size_t written = traits.written_tensors;
  const size_t values = static_cast<size_t>(completion.values_size());
  TORCH_CHECK(values == returns.size() || values == returns.size() + written, "flagos: ",
              traits.describe, ": the daemon returned ", values, " values for ",
              returns.size(), " returns and ", written, " written arguments");
  size_t extra = returns.size();
  for (size_t i = 0; i < arguments.size() && values > returns.size(); ++i) {
    if (!traits.written[i] || arguments[i].real_type()->kind() != c10::TypeKind::TensorType) {
      continue;
    }
    const flagos::v1::Value& v = completion.values(static_cast<int>(extra++));
    if (!v.has_host_tensor()) continue;
    const at::Tensor& target = args[i].toTensor();
    at::Tensor result = DecodeResult(v, device, generation).toTensor();
    target.resize_(result.sizes());
    EnqueueDeviceCopy(target, result);
  }
  for (size_t j = 0; j < returns.size(); ++j) {
    if (IsWritten(returns[j])) {
      const size_t aliased = AliasedArgument(schema, j);
      results->push_back(written_results ? args[aliased] : c10::IValue());
    } else {
      c10::IValue value = DecodeResult(completion.values(static_cast<int>(j)), device, generation);
      // A kernel may leave a Tensor return undefined (a fused RNN cell's
      // bias gradients without a bias); the wire carries it as None.
      if (value.isNone() && returns[j].real_type()->kind() == c10::TypeKind::TensorType) {
        value = c10::IValue(at::Tensor());
      }
      results->push_back(std::move(value));
    }
  }
}

void RunCall(const c10::OperatorHandle& op, const OpTraits& traits, Args args,
             bool written_results, Results* results) {
  const int device = FindDevice(traits, args);
  std::shared_ptr<const InferredCall> inferred = InferOnMeta(op, traits, args);
  if (inferred != nullptr) {
    RunInferred(op, traits, device, args, *inferred, written_results, results);
  } else {
    RunSynchronously(op, traits, device, args, written_results, results);
  }
}

void FlagosFallbackWith(const c10::OperatorHandle& op, const OpTraits& traits,
                        torch::jit::Stack* stack) {
  const size_t nargs = traits.written.size();
  // The arguments stay on the stack until the results replace them.
  const Args args(stack->data() + (stack->size() - nargs), nargs);
  c10::SmallVector<c10::IValue, 4> results;
  RunCall(op, traits, args, /*written_results=*/true, &results);
  torch::jit::drop(*stack, nargs);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
}

void FlagosFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  FlagosFallbackWith(op, TraitsOf(op), stack);
}

}  // namespace

void RunOnDaemon(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  FlagosFallback(op, stack);
}

void RunOnDaemon(const c10::OperatorHandle& op, const OpTraits& traits,
                 torch::jit::Stack* stack) {
  FlagosFallbackWith(op, traits, stack);
}

void RunOnDaemonUnboxed(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                        c10::SmallVectorImpl<c10::IValue>* results) {
  const OpTraits& traits = TraitsOf(op);
  TORCH_CHECK(args.size() == traits.written.size(), "flagos: internal: ", traits.describe,
              " takes ", traits.written.size(), " arguments, got ", args.size());
  RunCall(op, traits, args, /*written_results=*/false, results);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&FlagosFallback>());
}

}  // namespace torch_fl
