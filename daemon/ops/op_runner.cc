// The op runner's orchestration (op_runner.h): the session's registered
// operators and, per call, the order of the work: bounds and argument rules,
// the cpu_fallback route's host copies, decoding (op_argument_decoder.h),
// the kernel (through its out= overload when it can, op_out_variant.h),
// out= arguments, returns (op_result_encoder.h) and the copies back.
#include "ops/op_runner.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Flags.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "execution/backend.h"
#include "flagos/op_executor.h"
#include "logging.h"
#include "ops/held_results.h"
#include "ops/host_mirror.h"
#include "ops/op_argument_decoder.h"
#include "ops/op_argument_rules.h"
#include "ops/op_call_context.h"
#include "ops/op_error_context.h"
#include "ops/op_generators.h"
#include "ops/op_host_budget.h"
#include "ops/op_limits.h"
#include "ops/op_out_variant.h"
#include "ops/op_result_encoder.h"
#include "ops/op_routes.h"
#include "ops/op_schema_match.h"
#include "ops/op_servability.h"
#include "ops/prepared_op_call.h"
#include "ops/stack_lease.h"
#include "protocol/command_validation.h"

// c10's CPU allocator (c10/core/impl/alloc_cpu.cpp).
C10_DECLARE_bool(caffe2_cpu_allocator_do_zero_fill);

namespace flagos::daemon {
namespace {

// A registered operator and what every call of it needs, worked out once.
struct RegisteredOp {
  RegisteredOp(const c10::OperatorHandle& handle, std::string name, OpRoute route,
               BoundArgumentRules rules)
      : handle(handle),
        name(std::move(name)),
        route(route),
        rules(std::move(rules)),
        out_variant(FindOutVariant(handle)) {
    for (const c10::Argument& argument : handle.schema().arguments()) {
      has_out_arguments |= argument.is_out();
    }
  }

  c10::OperatorHandle handle;
  // "aten::add.Tensor": errors name the op so.
  std::string name;
  OpRoute route;
  // What its kernel assumes of its arguments' sizes (op_argument_rules.h).
  BoundArgumentRules rules;
  bool has_out_arguments = false;
  // The out= overload that writes the results straight into the client's
  // output tensors; unset once it failed where the functional op did not
  // (kernels such as mse_loss.out resize their out tensor as scratch space,
  // which memory over a segment cannot do).
  std::optional<c10::OperatorHandle> out_variant;
  mutable std::atomic<bool> out_variant_works{true};
  // Set once the native kernels declined a call (logged once per op).
  mutable std::atomic<bool> declined_logged{false};
};

class OpRunnerImpl final : public OpRunner {
 public:
  OpRunnerImpl(const Backend& backend, const OpLimits& limits)
      : backend_(backend), limits_(limits) {
    for (auto& slot : dense_) slot.store(nullptr, std::memory_order_relaxed);
  }

  absl::Status Register(uint32_t op_id, const std::string& name, const std::string& overload,
                        const std::string& schema,
                        const std::string& client_torch_version) override {
    if (name.size() + overload.size() > kMaxOpNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register_op: an operator name of ", name.size() + overload.size(),
          " bytes (starting '", absl::CEscape(name.substr(0, 32)), "'); the limit is ",
          kMaxOpNameBytes));
    }
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
      return absl::NotFoundError(absl::StrCat(
          "operator ", full_name, " is not registered in flagosd's torch ", TorchVersion(),
          " (the client's is ", client_torch_version.empty() ? "unknown" : client_torch_version,
          ")"));
    }
    if (absl::Status s = CheckClientSchema(handle->schema(), schema, client_torch_version,
                                           full_name);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckServable(handle->schema(), full_name); !s.ok()) return s;
    absl::StatusOr<BoundArgumentRules> rules = BindArgumentRules(handle->schema());
    if (!rules.ok()) return rules.status();
    std::string registered_name = OperatorFullName(handle->operator_name());
    OpRoute route = backend_.routes().RouteOf(registered_name);
    // Native kernels over device memory run only what they bind.
    if (const OpExecutor* native = backend_.native_executor();
        route == OpRoute::kNative && native != nullptr && !native->host_addressable() &&
        !native->HasKernel(*handle)) {
      route = OpRoute::kCpuFallback;
    }
    auto registered = std::make_unique<RegisteredOp>(*handle, std::move(registered_name), route,
                                                     *std::move(rules));
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = ops_.try_emplace(op_id, std::move(registered));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register_op ", full_name, ": op id ", op_id,
          " is already registered in this session (as ", it->second->name, "); mint a new id"));
    }
    if (op_id < kDenseOps) dense_[op_id].store(it->second.get(), std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status PlaceResult(int device, StreamHandle stream, const v1::PlaceResult& place,
                           RangeCheck check) override {
    // Found now, forgotten once the destination checked out (a bad
    // place_result leaves it held).
    std::optional<at::Tensor> held = held_.Find(place.id());
    if (!held.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "place_result: no held result ", place.id(),
          " in this session (placed already, or never held: hold_results on the op)"));
    }
    const v1::TensorRef& dst = place.dst();
    absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(dst);
    if (!extent.ok()) return extent.status();
    const bool same_shape =
        c10::IntArrayRef(dst.sizes().data(), dst.sizes_size()) == held->sizes() &&
        dst.dtype() == static_cast<int>(held->scalar_type());
    const uint64_t nbytes = held->nbytes();
    if (!same_shape || extent->nbytes != nbytes ||
        !c10::IntArrayRef(dst.strides().data(), dst.strides_size())
             .equals(c10::contiguous_strides(held->sizes()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "place_result ", place.id(), ": the destination must be contiguous with sizes ",
          SizesString(held->sizes()), " and dtype ", c10::toString(held->scalar_type())));
    }
    if (dst.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat("place_result ", place.id(),
                                                     ": the destination is on ",
                                                     DeviceName(dst.device()), ", the command on ",
                                                     DeviceName(device)));
    }
    if (nbytes > 0) {
      if (absl::Status s = check(device, extent->begin, nbytes); !s.ok()) return s;
    }
    held_.Take(place.id());
    if (nbytes == 0) return absl::OkStatus();
    DeviceRuntime& runtime = backend_.runtime();
    if (absl::Status s = runtime.CopyHostToDevice(device, stream, extent->begin,
                                                  held->const_data_ptr(), nbytes);
        !s.ok()) {
      return s;
    }
    // The bytes stay alive until the device has read them.
    auto keep = std::make_shared<at::Tensor>(*std::move(held));
    if (!runtime.LaunchHostFunc(device, stream, [keep](absl::Status) mutable { keep.reset(); })
             .ok()) {
      return runtime.SynchronizeStream(device, stream);
    }
    return absl::OkStatus();
  }

  absl::Status Run(int device, StreamHandle stream, const v1::OpCall& call, RangeCheck check,
                   v1::Completion* completion, OpRunStats* stats,
                   std::shared_ptr<const PreparedOpCall>* prepare) override {
    OpRunStats ignored;
    if (stats == nullptr) stats = &ignored;
    try {
      absl::Status s = RunUnguarded(device, stream, call, check, completion, stats,
                                    /*force_fallback=*/false, prepare);
      if (IsDeclined(s)) {
        // Nothing was issued: the same call on the cpu_fallback route.
        if (const RegisteredOp* op = Find(call.op_id());
            op != nullptr && !op->declined_logged.exchange(true, std::memory_order_relaxed)) {
          LogInfo(absl::StrCat(backend_.name(), ": the native kernels declined ", op->name,
                               " (", s.message(), "); it ran on cpu_fallback, and so do later "
                               "calls they decline (flagosd_native_declined_total counts them)"));
        }
        completion->clear_values();
        stats->declined = true;
        s = RunUnguarded(device, stream, call, check, completion, stats, /*force_fallback=*/true,
                         /*prepare=*/nullptr);
      }
      return s;
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("op id ", call.op_id(), ": ",
                                                     e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("op id ", call.op_id(), ": ", e.what()));
    }
  }

  absl::StatusOr<bool> RunPrepared(const PreparedOpCall& call, StreamHandle stream) override {
    if (!call.Intact()) return false;
    try {
      StackLease lease;
      torch::jit::Stack& stack = lease.get();
      stack.assign(call.stack().begin(), call.stack().end());
      // Its tensors were wrapped, and their ranges checked, when it was
      // prepared: nothing is wrapped now.
      const auto no_range = [](int, uint64_t, uint64_t) {
        return absl::InternalError("a prepared call wraps no memory");
      };
      OpCallContext context(backend_, call.device(), stream, call.op_name(), no_range,
                            /*mirror=*/nullptr, limits_.max_host_memory_bytes);
      absl::Status s = call.outputs().empty()
                           ? context.CallKernel(call.op(), &stack)
                           : context.CallKernelInto(call.op(), &stack, call.outputs());
      if (IsDeclined(s)) return false;  // nothing issued: Run takes cpu_fallback
      if (!s.ok()) return s;
      if (call.outputs_must_stay() && !call.Intact()) {
        return absl::InternalError(absl::StrCat(
            call.op_name(), ": its out= kernel moved an output it left in place when the call was "
            "prepared; the results are not where the client reads them: report this with the op "
            "and its arguments"));
      }
      return true;
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat(call.op_name(), ": ",
                                                     e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(call.op_name(), ": ", e.what()));
    }
  }

  OpRoute RouteOf(uint32_t op_id) override {
    const RegisteredOp* op = Find(op_id);
    return op == nullptr ? OpRoute::kNative : op->route;
  }

 private:
  // Ids below this (clients mint them from 1) are found without a lock.
  static constexpr uint32_t kDenseOps = 4096;

  const RegisteredOp* Find(uint32_t op_id) {
    if (op_id < kDenseOps) {
      if (const RegisteredOp* op = dense_[op_id].load(std::memory_order_acquire)) return op;
    }
    absl::ReaderMutexLock lock(&mu_);
    auto it = ops_.find(op_id);
    return it == ops_.end() ? nullptr : it->second.get();
  }

  absl::Status RunUnguarded(int device, StreamHandle stream, const v1::OpCall& call,
                            RangeCheck check, v1::Completion* completion, OpRunStats* stats,
                            bool force_fallback, std::shared_ptr<const PreparedOpCall>* prepare) {
    const RegisteredOp* registered = Find(call.op_id());
    if (registered == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("op id ", call.op_id(),
                                                     " is not registered in this session; send "
                                                     "register_op before using it"));
    }
    const c10::OperatorHandle& op = registered->handle;
    const std::string& op_name = registered->name;
    const c10::FunctionSchema& schema = op.schema();
    const std::vector<c10::Argument>& arguments = schema.arguments();
    if (static_cast<size_t>(call.args_size()) > arguments.size()) {
      return absl::InvalidArgumentError(absl::StrCat(op_name, " takes ", arguments.size(),
                                                     " arguments but the command sends ",
                                                     call.args_size()));
    }
    // Before anything is decoded or copied: the call's work is bounded.
    if (const OpCallElements elements = CountOpCallElements(call);
        elements.total > limits_.max_elements) {
      return TooManyElements(op_name, arguments, elements);
    }
    // Before any kernel: arguments whose kernel trusts their sizes have them.
    if (!registered->rules.empty()) {
      if (absl::Status s = registered->rules.Check(call, op_name); !s.ok()) return s;
    }
    // The route: native kernels over memory the host cannot address
    // cannot hand results back by value.
    const OpExecutor* native = backend_.native_executor();
    const bool device_memory = native != nullptr && !native->host_addressable();
    OpRoute route = force_fallback ? OpRoute::kCpuFallback : registered->route;
    if (route == OpRoute::kNative && device_memory && call.want_values()) {
      route = OpRoute::kCpuFallback;
    }
    stats->route = route;
    // cpu_fallback: the device memory the call names is copied to the host
    // first (and written back at the end).
    std::optional<HostMirror> mirror;
    if (route == OpRoute::kCpuFallback) {
      mirror.emplace(backend_.runtime(), device, stream);
    }
    absl::Cleanup count_bytes = [&] {
      if (!mirror.has_value()) return;
      stats->fallback_bytes_to_host += mirror->bytes_fetched();
      stats->fallback_bytes_to_device += mirror->bytes_written_back();
    };
    OpCallContext context(backend_, device, stream, op_name, check,
                        mirror.has_value() ? &*mirror : nullptr, limits_.max_host_memory_bytes);
    // A call that, once decoded, is nothing but its kernel call can be run
    // again as it is (prepared_op_call.h): its decoded stack is kept.
    const bool preparing = prepare != nullptr && !mirror.has_value() && !call.want_values() &&
                           !call.hold_results() && !call.has_implicit_generator();
    std::optional<torch::jit::Stack> kept;
    if (call.want_values() && call.hold_results()) context.set_held_results(&held_);
    if (mirror.has_value()) {
      for (int i = 0; i < call.args_size() && i < static_cast<int>(arguments.size()); ++i) {
        if (absl::Status s = context.MirrorValue(call.args(i), arguments[i].is_out(),
                                                 ValueWhere::Argument(arguments[i].name(), i));
            !s.ok()) {
          return s;
        }
      }
      for (int i = 0; i < call.outputs_size(); ++i) {
        if (absl::Status s = context.MirrorRef(call.outputs(i), /*write_only=*/true,
                                               ValueWhere::Output(i));
            !s.ok()) {
          return s;
        }
      }
      if (absl::Status s = mirror->Fetch(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(op_name, ": reading its operands for the "
                                                   "cpu_fallback route: ", s.message()));
      }
    }
    StackLease lease;
    torch::jit::Stack& stack = lease.get();
    stack.reserve(arguments.size() + call.outputs_size());
    // Results written once: a functional op whose client sent an output for
    // every return runs as its out= overload, straight into those outputs.
    const bool into_outputs =
        registered->out_variant.has_value() &&
        (!device_memory || mirror.has_value() || native->HasKernel(*registered->out_variant)) &&
        registered->out_variant_works.load(std::memory_order_relaxed) && !call.want_values() &&
        call.outputs_size() == static_cast<int>(schema.returns().size()) &&
        std::none_of(call.outputs().begin(), call.outputs().end(), [](const v1::TensorRef& ref) {
          return ref.undefined() || ref.conj() || ref.neg();
        });
    if (into_outputs) {
      absl::Status s = DecodeArguments(context, arguments, call, &stack);
      // What each output is made as: an out= kernel may change its out
      // tensor in place (max_unpool2d.out restrides it to the input's memory
      // format), which would leave the bytes in another layout.
      std::vector<std::pair<at::Tensor, const void*>> made;
      for (int i = 0; s.ok() && i < call.outputs_size(); ++i) {
        context.set_writing(true);
        absl::StatusOr<at::Tensor> out = context.WrapTensor(call.outputs(i), ValueWhere::Output(i));
        if (out.ok()) {
          made.emplace_back(*out, out->data_ptr());
          stack.push_back(c10::IValue(*std::move(out)));
        } else {
          s = out.status();
        }
      }
      context.set_writing(false);
      if (s.ok()) {
        if (mirror.has_value()) mirror->Snapshot();
        if (preparing) kept = stack;
        s = CallOp(context, *registered->out_variant, call, &stack);
        if (s.ok() && OutputsIntact(call, made)) {
          if (kept.has_value()) {
            Prepare(prepare, kept, *registered->out_variant, *registered, device, {},
                    /*outputs_must_stay=*/true);
          }
          return WriteBack(op_name, mirror);
        }
        kept.reset();
      }
      // Kernels over device memory: a refusal reruns on cpu_fallback, an
      // error is the call's (the functional op cannot do better there).
      if (device_memory && !mirror.has_value()) return s.ok() ? OutputsMoved(op_name) : s;
      // The functional op below says what is wrong, or does what the out=
      // kernel could not (then the out= overload is not tried again).
      stack.clear();
    }
    if (absl::Status s = DecodeArguments(context, arguments, call, &stack); !s.ok()) {
      return s;
    }
    // Kernels over device memory write a functional op's results straight
    // into the client's outputs (they have no memory of their own to
    // return them in).
    if (device_memory && !mirror.has_value() && !call.want_values() &&
        call.outputs_size() > 0 && !registered->has_out_arguments &&
        std::none_of(schema.returns().begin(), schema.returns().end(),
                     [](const c10::Argument& r) { return r.alias_info() != nullptr; })) {
      std::vector<at::Tensor> outputs;
      context.set_writing(true);
      for (int i = 0; i < call.outputs_size(); ++i) {
        // An undefined output is a result the client does not want
        // (convolution_backward's grad_input for a first layer).
        if (call.outputs(i).conj() || call.outputs(i).neg()) {
          return DeclinedError("a conjugate or negative-view output");
        }
        absl::StatusOr<at::Tensor> out = context.WrapTensor(call.outputs(i), ValueWhere::Output(i));
        if (!out.ok()) return out.status();
        outputs.push_back(*std::move(out));
      }
      context.set_writing(false);
      if (preparing) kept = stack;
      absl::Status s = context.CallKernelInto(op, &stack, outputs);
      if (s.ok() && kept.has_value()) {
        Prepare(prepare, kept, op, *registered, device, std::move(outputs),
                /*outputs_must_stay=*/false);
      }
      return s;
    }
    // out= arguments: kernels may resize them internally (mse_loss.out uses
    // its out tensor as scratch space), which memory over a segment cannot
    // do. The kernel gets a resizable tensor of the same shape; its result
    // is copied into the segment afterwards.
    // Kernels over device memory write them where they are.
    std::vector<OutArgument> outs;
    if (registered->has_out_arguments && !(device_memory && !mirror.has_value())) {
      outs = ReplaceOutArguments(arguments, &stack);
    }
    context.set_writing(false);
    // On an error before WriteBack the mirror's buffers are released at
    // once: the only device work on them, Fetch's copies, has completed.
    if (mirror.has_value()) mirror->Snapshot();
    // Prepared only when nothing follows the kernel call (no out= scratch
    // to copy, no result to copy or send).
    if (preparing && outs.empty() && call.outputs_size() == 0) kept = stack;
    if (absl::Status s = CallOp(context, op, call, &stack); !s.ok()) return s;
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
      if (absl::Status s = CopyInto(context, out.destination, out.scratch,
                                            ValueWhere::OutArgument(*out.name));
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = TakeReturns(context, schema, call, &stack, completion); !s.ok()) return s;
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
          if (*out->name != arguments[i].name()) continue;
          if (absl::Status s = EncodeByValue(context, out->scratch, value); !s.ok()) return s;
        }
      }
    }
    if (into_outputs) registered->out_variant_works.store(false, std::memory_order_relaxed);
    if (kept.has_value()) {
      Prepare(prepare, kept, op, *registered, device, {}, /*outputs_must_stay=*/false);
    }
    return WriteBack(op_name, mirror);
  }

  // Sets *prepare to the call `kept` (engaged) holds the stack of, unless
  // the stack holds a generator (decoded afresh from its (seed, offset) on
  // every call: run again, the one kept would draw further).
  static void Prepare(std::shared_ptr<const PreparedOpCall>* prepare,
                      std::optional<torch::jit::Stack>& kept, const c10::OperatorHandle& op, const RegisteredOp& registered, int device,
                      std::vector<at::Tensor> outputs, bool outputs_must_stay) {
    if (std::any_of(kept->begin(), kept->end(),
                    [](const c10::IValue& v) { return v.isGenerator(); })) {
      return;
    }
    *prepare = std::make_shared<const PreparedOpCall>(op, registered.name, device,
                                                      *std::move(kept), std::move(outputs),
                                                      outputs_must_stay);
  }

  // RESOURCE_EXHAUSTED for a call naming more elements than
  // --max-op-elements, naming its largest tensor.
  absl::Status TooManyElements(const std::string& op_name,
                               const std::vector<c10::Argument>& arguments,
                               const OpCallElements& elements) const {
    std::string where;
    if (elements.output) {
      where = ValueWhere::Output(elements.index).str();
    } else if (static_cast<size_t>(elements.index) < arguments.size()) {
      where = ValueWhere::Argument(arguments[elements.index].name(), elements.index).str();
    } else {
      where = absl::StrCat("argument #", elements.index);
    }
    if (elements.element >= 0) absl::StrAppend(&where, " element ", elements.element);
    const std::string total = elements.total == std::numeric_limits<uint64_t>::max()
                                  ? std::string("more than 2^64")
                                  : absl::StrCat(elements.total);
    return absl::ResourceExhaustedError(absl::StrCat(
        op_name, ": the call names ", total, " tensor elements, more than the ",
        limits_.max_elements, " an op may process (--max-op-elements); the largest is ", where,
        " with ", elements.largest, " elements (sizes [",
        absl::StrJoin(*elements.largest_sizes, ", "), "]); split the work into smaller calls, or "
        "start flagosd with a larger --max-op-elements"));
  }

  // An out= kernel over device memory that moved its outputs elsewhere.
  static absl::Status OutputsMoved(const std::string& op_name) {
    return absl::InternalError(absl::StrCat(
        op_name, ": the native kernel replaced its output tensors instead of writing them"));
  }

  // cpu_fallback: copies what the kernel wrote back to the device.
  static absl::Status WriteBack(const std::string& op_name, std::optional<HostMirror>& mirror) {
    if (!mirror.has_value()) return absl::OkStatus();
    absl::Status s = mirror->WriteBack();
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(op_name, ": writing its results back for the "
                                               "cpu_fallback route: ", s.message()));
  }

  // Runs the op; a random op without a Generator argument draws from
  // ATen's default generator alone, seeded from the command's implicit
  // (seed, offset) (op_generators.h), so its numbers depend on that pair
  // only, like those of an op that takes a generator.
  static absl::Status CallOp(OpCallContext& context, const c10::OperatorHandle& op,
                             const v1::OpCall& call, torch::jit::Stack* stack) {
    if (!call.has_implicit_generator()) return context.CallKernel(op, stack);
    ImplicitGeneratorLock lock(context.KernelDevice(0), call.implicit_generator());
    return context.CallKernel(op, stack);
  }


  const Backend& backend_;
  const OpLimits limits_;
  HeldResults held_{kMaxHeldResults};
  // A leaf (op_runner.h, "Lock order"): held only to insert into or read
  // ops_, never across a call.
  absl::Mutex mu_;
  // Entries are never removed: pointers to them stay valid.
  absl::flat_hash_map<uint32_t, std::unique_ptr<RegisteredOp>> ops_ ABSL_GUARDED_BY(mu_);
  // ops_[id] for ids below kDenseOps, readable without mu_.
  std::array<std::atomic<const RegisteredOp*>, kDenseOps> dense_;
};

}  // namespace

std::unique_ptr<OpRunner> OpRunner::Create(const Backend& backend, const OpLimits& limits) {
  // Every host buffer ATen hands a kernel (results, out= scratch, the
  // cpu_fallback route's copies) starts as zeroes: the daemon's heap holds
  // other sessions' bytes, and a kernel may leave part of its output unwritten
  // (aten::empty writes none of it). The budgeting allocator below wraps
  // ATen's, which does the clearing.
  FLAGS_caffe2_cpu_allocator_do_zero_fill = true;
  static const bool installed = [] {
    const bool ok = InstallOpHostBudgetAllocator();
    if (!ok) {
      LogWarning("another CPU allocator of higher priority is installed in c10: the host memory "
                 "of op kernels is not bounded (--max-op-host-memory has no effect)");
    }
    return ok;
  }();
  (void)installed;
  return std::make_unique<OpRunnerImpl>(backend, limits);
}

}  // namespace flagos::daemon
