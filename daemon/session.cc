#include "session.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command_validation.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

absl::string_view CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case absl::StatusCode::kNotFound: return "NOT_FOUND";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal: return "INTERNAL";
    case absl::StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    default: return "ERROR";
  }
}

}  // namespace

Session::Session(uint64_t id, const v1::SessionOpen& open, const Backend& backend, ReplyFn reply)
    : id_(id),
      pid_(open.pid()),
      client_(open.client()),
      backend_(backend),
      reply_(std::move(reply)),
      ops_(OpRunner::Create(backend)) {}

Session::~Session() { Close(); }

v1::SessionInfo Session::Info() const {
  v1::SessionInfo info;
  info.set_id(id_);
  info.set_pid(pid_);
  info.set_uid(0);  // peer credentials are not available through gRPC
  info.set_client(client_);
  info.set_segment_bytes(segments_.total_bytes());
  info.set_segments(segments_.size());
  info.set_commands(commands_.load(std::memory_order_relaxed));
  return info;
}

absl::Status Session::HandleBatch(v1::CommandBatch* batch) {
  if (batch->commands_size() > kMaxCommandsPerBatch) {
    return absl::InvalidArgumentError(absl::StrCat("a batch carries ", batch->commands_size(),
                                                   " commands; the limit is ",
                                                   kMaxCommandsPerBatch));
  }
  for (v1::Command& command : *batch->mutable_commands()) {
    commands_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t seq = command.seq();
    const absl::string_view kind = CommandKindName(command);
    try {
      Dispatch(std::move(command));
    } catch (const std::exception& e) {
      ReplyError(seq, kind,
                 absl::InternalError(absl::StrCat("flagosd failed to handle the command: ",
                                                  e.what())));
    }
  }
  return absl::OkStatus();
}

void Session::Dispatch(v1::Command command) {
  const uint64_t seq = command.seq();
  const absl::string_view kind = CommandKindName(command);
  if (has_seq_ && seq <= last_seq_) {
    ReplyError(seq, kind,
               absl::InvalidArgumentError(absl::StrCat(
                   "command ", seq, " (", kind, ") does not follow command ", last_seq_,
                   ": sequence numbers must strictly increase within a session")));
    return;
  }
  has_seq_ = true;
  last_seq_ = seq;

  const int device_count = backend_.runtime().DeviceCount();
  const auto check_device = [&]() {
    return CheckDevice(command.device(), device_count,
                       absl::StrCat("command ", seq, " (", kind, ")"));
  };
  switch (command.kind_case()) {
    case v1::Command::kRegisterOp: {
      const v1::RegisterOp& r = command.register_op();
      if (absl::Status s = ops_->Register(r.op_id(), r.name(), r.overload()); !s.ok()) {
        ReplyError(seq, kind, s);
      }
      return;
    }
    case v1::Command::kAllocate:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return Allocate(seq, command.device(), command.allocate().nbytes());
    case v1::Command::kFree:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return ScheduleFree(seq, command.device(), command.free().addr());
    case v1::Command::kSync: {
      if (command.device() >= device_count) return ReplyError(seq, kind, check_device());
      AfterQueuedCommands(command.device(), [this, seq] {
        v1::Completion completion;
        completion.set_seq(seq);
        reply_(std::move(completion));
      });
      return;
    }
    case v1::Command::kCopyDeviceToDevice:
      if (absl::Status s = CheckDevice(command.copy_device_to_device().src_device(), device_count,
                                       absl::StrCat("command ", seq, " (", kind, ") source"));
          !s.ok()) {
        return ReplyError(seq, kind, s);
      }
      [[fallthrough]];
    case v1::Command::kOp:
    case v1::Command::kCopyToDevice:
    case v1::Command::kCopyFromDevice:
    case v1::Command::kMemset:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return Enqueue(std::move(command));
    case v1::Command::KIND_NOT_SET:
      return ReplyError(seq, kind,
                        absl::InvalidArgumentError(absl::StrCat(
                            "command ", seq, " has no kind set (a newer client's command?)")));
  }
}

void Session::Allocate(uint64_t seq, int device, uint64_t nbytes) {
  DeviceRuntime& runtime = backend_.runtime();
  absl::StatusOr<DevicePtr> ptr = runtime.Malloc(device, nbytes);
  if (absl::IsResourceExhausted(ptr.status())) {
    // Frees the client already sent may still wait behind queued work:
    // let them finish, then try once more.
    bool waited = false;
    {
      absl::MutexLock lock(&free_mu_);
      if (pending_frees_ > 0) {
        free_mu_.Await(absl::Condition(
            +[](int* pending) { return *pending == 0; }, &pending_frees_));
        waited = true;
      }
    }
    if (waited) ptr = runtime.Malloc(device, nbytes);
  }
  if (!ptr.ok()) return ReplyError(seq, "allocate", ptr.status());
  if (absl::Status s = segments_.Insert(device, *ptr, nbytes); !s.ok()) {
    (void)runtime.Free(device, *ptr);
    return ReplyError(seq, "allocate",
                      absl::InternalError(absl::StrCat("the backend returned memory that this "
                                                       "session already holds: ",
                                                       s.message())));
  }
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_addr(*ptr);
  reply_(std::move(completion));
}

void Session::ScheduleFree(uint64_t seq, int device, DevicePtr addr) {
  {
    absl::MutexLock lock(&free_mu_);
    ++pending_frees_;
  }
  AfterQueuedCommands(device, [this, seq, device, addr] {
    ExecuteFree(seq, device, addr);
    absl::MutexLock lock(&free_mu_);
    --pending_frees_;
  });
}

void Session::ExecuteFree(uint64_t seq, int device, DevicePtr addr) {
  absl::Status status;
  {
    absl::WriterMutexLock lock(&memory_mu_);
    absl::StatusOr<Segment> segment = segments_.Remove(device, addr);
    status = segment.ok() ? backend_.runtime().Free(device, addr) : segment.status();
  }
  if (!status.ok()) ReplyError(seq, "free", status);
}

absl::StatusOr<Session::StreamState*> Session::QueueFor(int device, uint64_t stream) {
  absl::MutexLock lock(&queues_mu_);
  auto it = queues_.find({device, stream});
  if (it != queues_.end()) return it->second.get();
  if (queues_.size() >= static_cast<size_t>(kMaxStreamsPerSession)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session already uses ", queues_.size(), " streams, the most flagosd allows (",
        kMaxStreamsPerSession, "); reuse streams"));
  }
  auto state = std::make_unique<StreamState>();
  state->device = device;
  if (stream != 0) {
    absl::StatusOr<StreamHandle> handle = backend_.runtime().CreateStream(device);
    if (!handle.ok()) return handle.status();
    state->backend_stream = *handle;
  }
  state->queue = std::make_unique<StreamQueue>(
      absl::StrCat("session ", id_, " ", DeviceName(device), " stream ", stream));
  StreamState* raw = state.get();
  queues_.emplace(std::make_pair(device, stream), std::move(state));
  return raw;
}

void Session::Enqueue(v1::Command command) {
  absl::StatusOr<StreamState*> state = QueueFor(command.device(), command.stream());
  if (!state.ok()) return ReplyError(command.seq(), CommandKindName(command), state.status());
  const StreamHandle backend_stream = (*state)->backend_stream;
  // Upload bytes wait in memory until their queue runs them; past the limit
  // the reading thread stops reading, which backs the client off through
  // gRPC flow control.
  const uint64_t payload =
      command.has_copy_to_device() ? command.copy_to_device().data().size() : 0;
  if (payload > 0) {
    absl::MutexLock lock(&payload_mu_);
    const auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(payload_mu_) {
      return queued_payload_bytes_ <= kMaxQueuedPayloadBytes;
    };
    payload_mu_.Await(absl::Condition(&has_room));
    queued_payload_bytes_ += payload;
  }
  // A copy from another device reads what that device's queues write: it
  // waits for every earlier command there (guarded by gate_mu_).
  std::shared_ptr<bool> source_ready;
  if (command.has_copy_device_to_device() &&
      command.copy_device_to_device().src_device() != command.device()) {
    source_ready = std::make_shared<bool>(false);
    AfterQueuedCommands(command.copy_device_to_device().src_device(), [this, source_ready] {
      absl::MutexLock lock(&gate_mu_);
      *source_ready = true;
    });
  }
  (*state)->queue->Push(
      [this, command = std::move(command), backend_stream, source_ready, payload]() {
        if (source_ready == nullptr || WaitUntilReady(*source_ready)) {
          Execute(command, backend_stream);
        }
        if (payload > 0) {
          absl::MutexLock lock(&payload_mu_);
          queued_payload_bytes_ -= payload;
        }
      });
}

bool Session::WaitUntilReady(const bool& ready) {
  absl::MutexLock lock(&gate_mu_);
  const auto ready_or_closing = [this, &ready]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_) {
    return ready || closing_;
  };
  gate_mu_.Await(absl::Condition(&ready_or_closing));
  return ready;
}

void Session::AfterQueuedCommands(int device, std::function<void()> action) {
  std::vector<StreamQueue*> queues;
  {
    absl::MutexLock lock(&queues_mu_);
    for (const auto& [key, state] : queues_) {
      if (device < 0 || key.first == device) queues.push_back(state->queue.get());
    }
  }
  if (queues.empty()) {
    action();
    return;
  }
  struct Barrier {
    std::atomic<size_t> remaining;
    std::function<void()> action;
  };
  auto barrier = std::make_shared<Barrier>();
  barrier->remaining.store(queues.size());
  barrier->action = std::move(action);
  for (StreamQueue* queue : queues) {
    queue->Push([barrier] {
      if (barrier->remaining.fetch_sub(1) == 1) barrier->action();
    });
  }
}

absl::Status Session::CheckRange(const v1::Command& command, int device, uint64_t addr,
                                 uint64_t nbytes) const {
  if (segments_.Contains(device, addr, nbytes)) return absl::OkStatus();
  return OutsideSegmentsError(command.seq(), CommandKindName(command), addr, nbytes, device);
}

void Session::Execute(const v1::Command& command, StreamHandle backend_stream) {
  v1::Completion completion;
  completion.set_seq(command.seq());
  bool reply = false;
  absl::Status status;
  try {
    absl::ReaderMutexLock lock(&memory_mu_);
    status = ExecuteLocked(command, backend_stream, &completion, &reply);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("flagosd failed to execute the command: ", e.what()));
  } catch (...) {
    status = absl::InternalError("flagosd failed to execute the command (unknown exception)");
  }
  if (!status.ok()) return ReplyError(command.seq(), CommandKindName(command), status);
  if (reply) reply_(std::move(completion));
}

absl::Status Session::ExecuteLocked(const v1::Command& command, StreamHandle backend_stream,
                                    v1::Completion* completion, bool* reply) {
  DeviceRuntime& runtime = backend_.runtime();
  const int device = command.device();
  switch (command.kind_case()) {
    case v1::Command::kOp: {
      *reply = command.op().want_values();
      return ops_->Run(
          device, command.op(),
          [&](int d, uint64_t addr, uint64_t nbytes) {
            return CheckRange(command, d, addr, nbytes);
          },
          completion);
    }
    case v1::Command::kCopyToDevice: {
      const v1::CopyToDevice& copy = command.copy_to_device();
      if (absl::Status s = CheckRange(command, device, copy.addr(), copy.data().size()); !s.ok()) {
        return s;
      }
      return runtime.CopyHostToDevice(device, backend_stream, copy.addr(), copy.data().data(),
                                      copy.data().size());
    }
    case v1::Command::kCopyFromDevice: {
      const v1::CopyFromDevice& copy = command.copy_from_device();
      if (copy.nbytes() > kMaxCopyFromDeviceBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "command ", command.seq(), " (copy_from_device): ", copy.nbytes(),
            " bytes in one copy; the limit is ", kMaxCopyFromDeviceBytes,
            "; split the copy into several commands"));
      }
      if (absl::Status s = CheckRange(command, device, copy.addr(), copy.nbytes()); !s.ok()) {
        return s;
      }
      std::string data(copy.nbytes(), '\0');
      if (absl::Status s = runtime.CopyDeviceToHost(device, backend_stream, data.data(),
                                                    copy.addr(), copy.nbytes());
          !s.ok()) {
        return s;
      }
      completion->set_data(std::move(data));
      *reply = true;
      return absl::OkStatus();
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
      return runtime.CopyDeviceToDevice(device, backend_stream, copy.dst(), copy.src_device(),
                                        copy.src(), copy.nbytes());
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

void Session::ReplyError(uint64_t seq, absl::string_view kind, const absl::Status& status) {
  LogWarning(absl::StrCat("session ", id_, " (pid ", pid_, "): command ", seq, " (", kind,
                          ") failed: ", CodeName(status.code()), ": ", status.message()));
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_code(static_cast<int>(status.code()));
  completion.set_message(std::string(status.message()));
  reply_(std::move(completion));
}

Session::CloseSummary Session::Close() {
  CloseSummary summary;
  if (closed_) return summary;
  closed_ = true;
  {
    absl::MutexLock lock(&gate_mu_);
    closing_ = true;  // releases commands waiting for another device
  }
  absl::flat_hash_map<std::pair<int, uint64_t>, std::unique_ptr<StreamState>> queues;
  {
    absl::MutexLock lock(&queues_mu_);
    queues.swap(queues_);
  }
  for (auto& [key, state] : queues) state->queue->Stop();
  for (auto& [key, state] : queues) {
    if (state->backend_stream != 0) {
      if (absl::Status s = backend_.runtime().DestroyStream(state->device, state->backend_stream);
          !s.ok()) {
        LogWarning(absl::StrCat("session ", id_, ": ", s.message()));
      }
    }
  }
  absl::WriterMutexLock lock(&memory_mu_);
  for (const Segment& segment : segments_.TakeAll()) {
    if (absl::Status s = backend_.runtime().Free(segment.device, segment.addr); !s.ok()) {
      LogError(absl::StrCat("session ", id_, ": freeing segment ",
                            absl::StrFormat("0x%x", segment.addr), " on ",
                            DeviceName(segment.device), " failed: ", s.message()));
      continue;
    }
    ++summary.segments;
    summary.bytes += segment.nbytes;
  }
  return summary;
}

}  // namespace flagos::daemon
