// Runs one session's ATen operators: resolves registered op names through
// the c10 dispatcher, decodes an OpCall's Values into a boxed stack using
// the op's schema, calls the backend's OpExecutor and copies the results
// into the client's output tensors.
//
// Decoding, per schema argument type:
//   none -> None (Optional types only); i / d / b / c / s -> int, float,
//   bool, complex, str (ScalarType, Layout, MemoryFormat as i); Scalar from
//   i, d, b or c; tensor -> a tensor over device memory (address range
//   checked first; an undefined ref is an undefined tensor, None for
//   Tensor?); host_tensor -> a tensor holding a copy of the bytes on the
//   op's device; ints / doubles / bools -> int[] / float[] / bool[]; list ->
//   Tensor[], Tensor?[] or a list of the schema's element type; device ->
//   the backend's device (type "cpu" stays on the CPU); generator -> a fresh
//   generator seeded from (seed, offset) only, so the same (seed, offset)
//   always draws the same numbers on any thread (they differ from what
//   torch's own CPU generator draws for that seed).
//   Missing trailing arguments take the schema's defaults.
//   out= arguments (kwarg-only Tensor(a!)) are replaced by resizable
//   tensors of the same shape for the call (kernels may use them as scratch
//   space and resize them) and copied into device memory after it; their
//   final sizes must equal the ref's.
//
// Returns, in schema order: a return that aliases a written argument
// (Tensor(a!)) was written in place; every other tensor return (lists
// flattened) is copied into the next `outputs` ref (undefined refs are
// skipped; sizes must match) unless `outputs` is empty. With want_values
// the completion carries exactly one Value per schema return, in order:
// non-tensor returns as values, tensor returns as host_tensor (a list of
// them for Tensor[]; none for an undefined tensor) when `outputs` is empty,
// and none for returns the client already holds (written in place, or
// copied into `outputs`).
//
// Which operators are served at all is op_servability.h's (and
// `flagosd --list-served-ops`). The pieces of a call live in files of their
// own: op_call_context.h, op_argument_decoder.h, op_result_encoder.h,
// op_out_variant.h, op_generators.h, held_results.h.
//
// This header does not include ATen; op_runner.cc does.
//
// Thread safety: Register, Run, RouteOf and PlaceResult may be called
// concurrently.
//
// Lock order: the session calls Run and PlaceResult holding its memory_mu_
// for reading (and its dispatch_mu_ too when the sync channel's thread runs
// a command itself), and Register holding its dispatch_mu_
// (sessions/session.h).
// The runner's own locks come after it and are leaves: the registry's
// (held to insert or find an op), HeldResults' (to keep or take a
// result), and the daemon-wide default-generator lock (op_generators.h,
// held across one random op's kernel: CPU work, which takes ATen's
// generator mutex and may wait for ATen's intra-op threads). None of them
// is held while another lock of the daemon is taken, and none while
// waiting for the device (the cpu_fallback route's Fetch, PlaceResult's
// SynchronizeStream).
#ifndef FLAGOS_DAEMON_OPS_OP_RUNNER_H_
#define FLAGOS_DAEMON_OPS_OP_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "execution/backend.h"
#include "flagos/v1/flagos.pb.h"
#include "ops/op_limits.h"

namespace flagos::daemon {

class PreparedOpCall;  // ops/prepared_op_call.h

// What one Run did, for the metrics: the route the call took (a call the
// native kernels declined, flagos/op_executor.h's DeclinedError, ran again
// on cpu_fallback: route kCpuFallback, declined true) and the bytes the
// cpu_fallback route copied between the device and the host.
struct OpRunStats {
  OpRoute route = OpRoute::kNative;
  bool declined = false;
  uint64_t fallback_bytes_to_host = 0;
  uint64_t fallback_bytes_to_device = 0;
};

class OpRunner {
 public:
  // OK when [addr, addr + nbytes) on `device` is memory the session may use;
  // otherwise the error to report.
  using RangeCheck = absl::FunctionRef<absl::Status(int device, uint64_t addr, uint64_t nbytes)>;

  // Calls are bounded by `limits` (op_limits.h): a call naming more tensor
  // elements than limits.max_elements, or whose kernel asks for more host
  // memory than limits.max_host_memory_bytes (op_host_budget.h), fails
  // with RESOURCE_EXHAUSTED naming the op, what it asked, the limit and
  // the flag that raises it.
  static std::unique_ptr<OpRunner> Create(const Backend& backend, const OpLimits& limits);
  virtual ~OpRunner() = default;

  // Resolves aten op `name`.`overload` and records it under `op_id`, with
  // its route on this backend, if `schema` (the client's, from its torch
  // `client_torch_version`) is flagosd's own (op_schema_match.h).
  // INVALID_ARGUMENT for op id 0, >= 2^31 or already registered; NOT_FOUND
  // when no such operator exists in this flagosd's torch;
  // FAILED_PRECONDITION when the schemas differ; PERMISSION_DENIED for an
  // operator flagosd does not serve. The op's argument rules
  // (op_argument_rules.h) are bound to its schema here.
  virtual absl::Status Register(uint32_t op_id, const std::string& name,
                                const std::string& overload, const std::string& schema,
                                const std::string& client_torch_version) = 0;

  // Runs `call` on `device`, ordered on `stream`, by the op's route
  // (Backend::routes(): native kernels, or cpu_fallback: operands copied
  // to the host, ATen's CPU kernel, results copied back; the host copies
  // are released once the stream has run the copies back). Every tensor's
  // range goes through `check` before use, and before anything is decoded
  // the call must satisfy its op's argument rules (op_argument_rules.h:
  // INVALID_ARGUMENT naming the argument otherwise). A tensor of no
  // elements reaches the kernel over no memory, not the address sent. Fills `completion->values` as
  // described above; values are complete when Run returns. Errors name the
  // op.
  //
  // On a backend whose native kernels run on memory the host cannot
  // address (kunlunxin's xdnn), a native call whose results must travel by
  // value (want_values) takes cpu_fallback, and a call the kernels decline
  // (nothing issued) runs again on cpu_fallback; `stats` (may be null)
  // says what happened.
  //
  // `prepare` (may be null): when the call, once decoded, is nothing but a
  // kernel call (ops/prepared_op_call.h says which), *prepare gets it as a
  // PreparedOpCall after it ran without error, for RunPrepared.
  virtual absl::Status Run(int device, StreamHandle stream, const v1::OpCall& call,
                           RangeCheck check, v1::Completion* completion,
                           OpRunStats* stats = nullptr,
                           std::shared_ptr<const PreparedOpCall>* prepare = nullptr) = 0;

  // Runs `call` again, on `stream` of its device, as Run ran it: no
  // decoding, no argument rules, no range check (the caller knows the
  // memory it names is still the session's). False, with nothing issued,
  // when it cannot run prepared (a kernel changed one of its tensors since,
  // or the native kernels decline it now): the caller runs the command
  // with Run instead. Errors name the op.
  virtual absl::StatusOr<bool> RunPrepared(const PreparedOpCall& call, StreamHandle stream) = 0;

  // The route of registered op `op_id` (kNative for an unknown id).
  virtual OpRoute RouteOf(uint32_t op_id) = 0;

  // Held results (OpCall.hold_results): tensor returns kept here, reported
  // as `held`, until PlaceResult copies one into `place.dst` on `stream`
  // (its bytes released once the device has read them) and forgets it.
  // NOT_FOUND for an unknown id; INVALID_ARGUMENT unless dst is contiguous
  // with the result's sizes and dtype. At most kMaxHeldResults are held;
  // beyond, the op fails with RESOURCE_EXHAUSTED.
  static constexpr size_t kMaxHeldResults = 4096;
  virtual absl::Status PlaceResult(int device, StreamHandle stream, const v1::PlaceResult& place,
                                   RangeCheck check) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_RUNNER_H_
