// Session: op calls the client sends again byte for byte
// (repeated_op_calls.h). The reading thread finds them among the calls the
// session prepared and queues them without parsing them; the worker runs
// the prepared call while the session's memory is as when its ranges were
// checked and its tensors are as made, and the call as sent (parsed from
// its bytes, checked, prepared again) otherwise.
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/communicators.h"
#include "sessions/session.h"

namespace flagos::daemon {

void Session::DispatchRepeated(const ScannedCommand& command,
                               std::shared_ptr<const RepeatedOpCalls::Entry> entry,
                               const std::shared_ptr<const void>& keep) {
  // The device is one of the backend's: the call was found there.
  absl::StatusOr<SessionStream*> state = streams_.Get(command.device, command.stream);
  if (!state.ok()) return ReplyError(command.seq, "op", state.status());
  const StreamHandle backend_stream = (*state)->backend_stream;
  (*state)->window->Count(1);
  (*state)->queue->Push([this, seq = command.seq, device = command.device,
                         stream = command.stream, op_bytes = command.op, entry = std::move(entry),
                         keep, backend_stream]() {
    ExecuteRepeated(seq, device, stream, op_bytes, *entry, backend_stream);
  });
}

void Session::ExecuteRepeated(uint64_t seq, int device, uint64_t stream,
                              absl::string_view op_bytes, const RepeatedOpCalls::Entry& entry,
                              StreamHandle backend_stream) {
  DeviceMetrics* const metrics = MetricsFor(device);
  const auto start = metrics == nullptr ? std::chrono::steady_clock::time_point()
                                        : std::chrono::steady_clock::now();
  bool ran_prepared = false;
  const std::optional<absl::Status> status = RunQueued([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // memory_mu_ is held: no segment goes away while the call runs.
    const uint64_t removals = MemoryRemovals();
    if (entry.removals == removals) {
      const CollectiveCaller caller(id_, pid_);  // for prepared flagos_c10d kernels
      absl::StatusOr<bool> ran = ops_->RunPrepared(*entry.call, backend_stream);
      if (!ran.ok() || *ran) {
        ran_prepared = true;
        return ran.status();
      }
      // Declined, or a tensor of it changed: as sent, below.
    }
    v1::Command command;
    command.set_seq(seq);
    command.set_device(device);
    command.set_stream(stream);
    if (!command.mutable_op()->ParseFromArray(op_bytes.data(), static_cast<int>(op_bytes.size()))) {
      // It parsed when it was prepared: the bytes are the same.
      return absl::InternalError("a repeated op call no longer parses; report this");
    }
    v1::Completion completion;
    bool reply = false;
    std::shared_ptr<const PreparedOpCall> prepared;
    absl::Status s = ExecuteLocked(command, backend_stream, &completion, &reply, &prepared);
    if (s.ok() && prepared != nullptr) {
      repeated_ops_.Put(device, op_bytes, std::move(prepared), removals);
    }
    return s;
  });
  if (!status.has_value()) return;
  if (ran_prepared && metrics != nullptr) {
    metrics->CountOp(OpRoute::kNative,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                         .count(),
                     status->ok());
    metrics->CountRepeatedOp();
  }
  if (!status->ok()) ReplyError(seq, "op", *status);
}

}  // namespace flagos::daemon
