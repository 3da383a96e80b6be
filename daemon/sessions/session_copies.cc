// Session: what a queued command does on its stream (ops, place_result,
// copies, memset), issued to the device and released or replied once the
// device has completed it.
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/communicators.h"
#include "execution/completion_fences.h"
#include "protocol/command_validation.h"
#include "sessions/session.h"

namespace flagos::daemon {

absl::Status Session::ReplyWhenComplete(int device, StreamHandle backend_stream,
                                        v1::Completion completion,
                                        std::shared_ptr<OwnedBytes> data) {
  DeviceRuntime& runtime = backend_.runtime();
  auto reply = [this, completion = std::move(completion),
                data = std::move(data)](absl::Status status) mutable {
    if (!status.ok()) return ReplyError(completion.seq(), "copy_from_device", status);
    Reply(std::move(completion), data != nullptr ? std::move(*data) : OwnedBytes());
  };
  WhenStreamCompletes(runtime, device, backend_stream, std::move(reply));
  return absl::OkStatus();
}

void Session::CountCopy(int device, CopyDirection direction, uint64_t nbytes) {
  if (DeviceMetrics* metrics = MetricsFor(device)) metrics->CountCopy(direction, nbytes);
}

std::optional<absl::Status> Session::RunQueued(absl::FunctionRef<absl::Status()> body) {
  // The client is gone: what has not started is dropped, as Close drops
  // what is still queued.
  if (detached_.load(std::memory_order_acquire)) return std::nullopt;
  running_.fetch_add(1, std::memory_order_relaxed);
  struct Finished {
    std::atomic<uint32_t>& running;
    ~Finished() { running.fetch_sub(1, std::memory_order_relaxed); }
  } finished{running_};
  try {
    absl::ReaderMutexLock lock(&memory_mu_);
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("flagosd failed to execute the command: ", e.what()));
  } catch (...) {
    return absl::InternalError("flagosd failed to execute the command (unknown exception)");
  }
}

void Session::Execute(v1::Command& command, StreamHandle backend_stream,
                      absl::string_view op_bytes) {
  v1::Completion completion;
  completion.set_seq(command.seq());
  bool reply = false;
  const std::optional<absl::Status> status = RunQueued([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (op_bytes.empty()) return ExecuteLocked(command, backend_stream, &completion, &reply);
    // Sent as bytes the session may see again: what the run prepares is
    // kept (session_repeated_ops.cc).
    const uint64_t removals = MemoryRemovals();
    std::shared_ptr<const PreparedOpCall> prepared;
    absl::Status s = ExecuteLocked(command, backend_stream, &completion, &reply, &prepared);
    if (s.ok() && prepared != nullptr) {
      repeated_ops_.Put(command.device(), op_bytes, std::move(prepared), removals);
    }
    return s;
  });
  if (!status.has_value()) return;
  if (!status->ok()) return ReplyError(command.seq(), CommandKindName(command), *status);
  if (reply) Reply(std::move(completion));
}

absl::Status Session::ExecuteLocked(v1::Command& command, StreamHandle backend_stream,
                                    v1::Completion* completion, bool* reply,
                                    std::shared_ptr<const PreparedOpCall>* prepare) {
  DeviceRuntime& runtime = backend_.runtime();
  const int device = command.device();
  switch (command.kind_case()) {
    case v1::Command::kOp: {
      *reply = command.op().want_values();
      DeviceMetrics* metrics = MetricsFor(device);
      const auto start = metrics == nullptr ? std::chrono::steady_clock::time_point()
                                            : std::chrono::steady_clock::now();
      const CollectiveCaller caller(id_, pid_);  // for the flagos_c10d kernels
      OpRunStats run;
      absl::Status status = ops_->Run(
          device, backend_stream, command.op(),
          [&](int d, uint64_t addr, uint64_t nbytes) {
            return CheckRange(command, d, addr, nbytes);
          },
          completion, &run, prepare);
      if (metrics != nullptr) {
        metrics->CountOp(run.route,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                             .count(),
                         status.ok());
        metrics->CountCpuFallbackBytes(run.fallback_bytes_to_host, run.fallback_bytes_to_device);
        if (run.declined) metrics->CountNativeDeclined();
      }
      return status;
    }
    case v1::Command::kPlaceResult:
      return ops_->PlaceResult(device, backend_stream, command.place_result(),
                               [&](int d, uint64_t addr, uint64_t nbytes) {
                                 return CheckRange(command, d, addr, nbytes);
                               });
    case v1::Command::kCopyToDevice: {
      const v1::CopyToDevice& copy = command.copy_to_device();
      if (copy.has_pinned()) {
        // Straight from the client's pinned region, which stays mapped
        // until the device has read it.
        absl::StatusOr<std::shared_ptr<PinnedRegion>> region =
            regions_.Pinned(command, copy.pinned().region());
        if (!region.ok()) return region.status();
        const uint64_t nbytes = copy.pinned().nbytes();
        absl::StatusOr<char*> bytes = (*region)->Bytes(copy.pinned().offset(), nbytes);
        if (!bytes.ok()) return bytes.status();
        if (absl::Status s = CheckRange(command, device, copy.addr(), nbytes); !s.ok()) return s;
        if (absl::Status s =
                runtime.CopyHostToDevice(device, backend_stream, copy.addr(), *bytes, nbytes);
            !s.ok()) {
          return s;
        }
        CountCopy(device, CopyDirection::kHostToDevice, nbytes);
        WhenStreamCompletes(runtime, device, backend_stream, [region = *region](absl::Status) {});
        return absl::OkStatus();
      }
      if (copy.has_staged()) {
        // The chunk is the client's again once the device has read it, or
        // at once when the copy is not issued.
        absl::StatusOr<std::shared_ptr<StagingRegion>> region = regions_.Staging(command);
        if (!region.ok()) return region.status();
        const uint64_t offset = copy.staged().offset();
        const uint64_t nbytes = copy.staged().nbytes();
        absl::StatusOr<char*> bytes = (*region)->Bytes(offset, nbytes);
        absl::Status s = bytes.ok() ? CheckRange(command, device, copy.addr(), nbytes)
                                    : bytes.status();
        if (s.ok()) s = runtime.CopyHostToDevice(device, backend_stream, copy.addr(), *bytes, nbytes);
        if (!s.ok()) {
          (*region)->Release(offset);
          return s;
        }
        staged_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
        CountCopy(device, CopyDirection::kHostToDevice, nbytes);
        WhenStreamCompletes(runtime, device, backend_stream,
                            [region = *region, offset](absl::Status) { region->Release(offset); });
        return absl::OkStatus();
      }
      if (absl::Status s = CheckRange(command, device, copy.addr(), copy.data().size()); !s.ok()) {
        return s;
      }
      // The bytes stay alive until the device has read them.
      auto data = std::make_shared<std::string>(
          std::move(*command.mutable_copy_to_device()->mutable_data()));
      if (absl::Status s = runtime.CopyHostToDevice(device, backend_stream, copy.addr(),
                                                    data->data(), data->size());
          !s.ok()) {
        return s;
      }
      CountCopy(device, CopyDirection::kHostToDevice, data->size());
      WhenStreamCompletes(runtime, device, backend_stream, [this, data](absl::Status) {
        // Read by the device: the next raw upload may land in them.
        sync_.RecyclePayload(std::move(*data));
      });
      return absl::OkStatus();
    }
    case v1::Command::kCopyFromDevice: {
      const v1::CopyFromDevice& copy = command.copy_from_device();
      // Into pinned memory nothing travels in the reply; any range of the
      // region may be copied at once.
      if (!copy.has_pinned() && copy.nbytes() > kMaxCopyFromDeviceBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "command ", command.seq(), " (copy_from_device): ", copy.nbytes(),
            " bytes in one copy; the limit is ", kMaxCopyFromDeviceBytes,
            "; split the copy into several commands"));
      }
      if (absl::Status s = CheckRange(command, device, copy.addr(), copy.nbytes()); !s.ok()) {
        return s;
      }
      if (copy.has_pinned()) {
        // Straight into the client's pinned region, ordered on the stream
        // like a kernel: no reply; the region stays mapped until the device
        // has written it.
        if (copy.pinned().nbytes() != copy.nbytes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "command ", command.seq(), " (copy_from_device): copies ", copy.nbytes(),
              " bytes into a pinned range of ", copy.pinned().nbytes(), " bytes"));
        }
        absl::StatusOr<std::shared_ptr<PinnedRegion>> region =
            regions_.Pinned(command, copy.pinned().region());
        if (!region.ok()) return region.status();
        absl::StatusOr<char*> bytes = (*region)->Bytes(copy.pinned().offset(), copy.nbytes());
        if (!bytes.ok()) return bytes.status();
        if (absl::Status s = runtime.CopyDeviceToHost(device, backend_stream, *bytes, copy.addr(),
                                                      copy.nbytes());
            !s.ok()) {
          return s;
        }
        CountCopy(device, CopyDirection::kDeviceToHost, copy.nbytes());
        WhenStreamCompletes(runtime, device, backend_stream, [region = *region](absl::Status) {});
        return absl::OkStatus();
      }
      *reply = true;
      if (copy.has_staged()) {
        if (copy.staged().nbytes() != copy.nbytes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "command ", command.seq(), " (copy_from_device): copies ", copy.nbytes(),
              " bytes into a staged range of ", copy.staged().nbytes(), " bytes"));
        }
        absl::StatusOr<std::shared_ptr<StagingRegion>> region = regions_.Staging(command);
        if (!region.ok()) return region.status();
        absl::StatusOr<char*> bytes = (*region)->Bytes(copy.staged().offset(), copy.nbytes());
        if (!bytes.ok()) return bytes.status();
        if (absl::Status s = runtime.CopyDeviceToHost(device, backend_stream, *bytes, copy.addr(),
                                                      copy.nbytes());
            !s.ok()) {
          return s;
        }
        staged_bytes_.fetch_add(copy.nbytes(), std::memory_order_relaxed);
        CountCopy(device, CopyDirection::kDeviceToHost, copy.nbytes());
        // The client reads the chunk when it sees the reply: only once the
        // device has written it.
        *reply = false;
        return ReplyWhenComplete(device, backend_stream, std::move(*completion), nullptr);
      }
      // Filled by the device (no zero fill first); sent raw after the reply's
      // frame on a TCP client's sync channel, in its data otherwise.
      auto data = std::make_shared<OwnedBytes>(OwnedBytes::ForOverwrite(copy.nbytes()));
      if (absl::Status s = runtime.CopyDeviceToHost(device, backend_stream, data->data(),
                                                    copy.addr(), copy.nbytes());
          !s.ok()) {
        return s;
      }
      CountCopy(device, CopyDirection::kDeviceToHost, copy.nbytes());
      *reply = false;
      return ReplyWhenComplete(device, backend_stream, std::move(*completion), std::move(data));
    }
    case v1::Command::kCopyDeviceToDevice: {
      const v1::CopyDeviceToDevice& copy = command.copy_device_to_device();
      if (absl::Status s = CheckRange(command, device, copy.dst(), copy.nbytes()); !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckRange(command, copy.src_device(), copy.src(), copy.nbytes());
          !s.ok()) {
        return s;
      }
      if (absl::Status s = runtime.CopyDeviceToDevice(device, backend_stream, copy.dst(),
                                                      copy.src_device(), copy.src(),
                                                      copy.nbytes());
          !s.ok()) {
        return s;
      }
      CountCopy(device, CopyDirection::kDeviceToDevice, copy.nbytes());
      return absl::OkStatus();
    }
    case v1::Command::kMemset: {
      const v1::Memset& memset = command.memset();
      if (memset.value() > 0xff) {
        return absl::InvalidArgumentError(absl::StrCat("command ", command.seq(),
                                                       " (memset): value ", memset.value(),
                                                       " is not a byte (0..255)"));
      }
      if (absl::Status s = CheckRange(command, device, memset.addr(), memset.nbytes()); !s.ok()) {
        return s;
      }
      return runtime.Memset(device, backend_stream, memset.addr(),
                            static_cast<uint8_t>(memset.value()), memset.nbytes());
    }
    default:
      return absl::InternalError(absl::StrCat("command ", command.seq(), " (",
                                              CommandKindName(command),
                                              ") cannot run on a stream queue"));
  }
}

}  // namespace flagos::daemon
