// Session: construction, Info, dispatch of a batch's commands, replies,
// Detach and Close (session.h says where the rest lives).
#include "sessions/session.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/communicators.h"
#include "collectives/groups_between_daemons.h"
#include "logging.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {
namespace {

// A random secret for the staging attach (SessionOpened.staging_token).
std::string NewToken() {
  std::string token(16, '\0');
  size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t n = getrandom(token.data() + filled, token.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return token;
}

// At most `limit` bytes of `text`, cut at a UTF-8 character boundary and
// marked with "..." when cut, with control characters (which would reach
// operators' terminals through flagos-smi and the log) made spaces.
std::string Capped(const std::string& text, size_t limit) {
  std::string out = text;
  if (out.size() > limit) {
    size_t end = limit - 3;
    while (end > 0 && (static_cast<unsigned char>(out[end]) & 0xC0) == 0x80) --end;
    out = absl::StrCat(out.substr(0, end), "...");
  }
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

}  // namespace

Session::Session(uint64_t id, const v1::SessionOpen& open, const Backend& backend,
                 ReplyWriter::WriteFn write, ReplyWriter::EndFn end,
                 std::vector<WorkerPool*> pools, DeviceActivity* activity, Metrics* metrics,
                 const OpLimits& op_limits, MemoryGrants* grants,
                 std::optional<PeerCredentials> peer, MemoryQuotas* quotas)
    : id_(id),
      pid_(peer ? peer->pid : open.pid()),
      peer_known_(peer.has_value()),
      uid_(peer ? peer->uid : -1),
      gid_(peer ? peer->gid : -1),
      quotas_(quotas),
      client_(Capped(open.client(), kMaxClientNameBytes)),
      torch_version_(Capped(open.torch_version(), kMaxTorchVersionBytes)),
      command_line_(Capped(open.command_line(), kMaxCommandLineBytes)),
      backend_(backend),
      metrics_(metrics),
      grants_(grants),
      replies_(id, std::move(write),
               [this, end = std::move(end)](const absl::Status& status) {
                 absl::MutexLock lock(&end_mu_);
                 if (!stream_gone_) end(status);
               }),
      ops_(OpRunner::Create(backend, op_limits)),
      sync_(id, &replies_),
      staging_token_(NewToken()),
      regions_(id, &backend.runtime()),
      streams_(id, &backend.runtime(), std::move(pools), activity),
      events_(&backend.runtime()),
      repeated_ops_(backend.runtime().DeviceCount()) {}

Session::~Session() { Close(); }

v1::SessionInfo Session::Info() const {
  v1::SessionInfo info;
  info.set_id(id_);
  info.set_pid(pid_);
  info.set_uid(static_cast<uint32_t>(std::max<int64_t>(uid_, 0)));
  info.set_gid(gid_);
  info.set_credentials_from_kernel(peer_known_);
  info.set_client(client_);
  info.set_segment_bytes(segments_.total_bytes());
  info.set_segments(segments_.size());
  info.set_imported_segments(imported_.size());
  info.set_imported_bytes(imported_.total_bytes());
  info.set_commands(commands_.load(std::memory_order_relaxed));
  info.set_stream_bytes_received(stream_bytes_received_.load(std::memory_order_relaxed));
  info.set_stream_bytes_sent(stream_bytes_sent_.load(std::memory_order_relaxed));
  info.set_staged_bytes(staged_bytes_.load(std::memory_order_relaxed));
  info.set_staging_attached(regions_.has_staging());
  info.set_pinned_bytes(regions_.pinned_bytes());
  info.set_pinned_registered_bytes(regions_.pinned_registered_bytes());
  info.set_torch_version(torch_version_);
  info.set_command_line(command_line_);
  info.set_running_commands(running_commands());
  info.set_streams(static_cast<uint32_t>(streams_.size()));
  info.set_sync_channel_attached(sync_.started());
  info.set_sync_bytes_received(sync_.bytes_received());
  info.set_sync_bytes_sent(sync_.bytes_sent());
  info.set_sync_requests(sync_.requests());
  return info;
}

absl::Status Session::HandleBatch(v1::CommandBatch* batch, std::shared_ptr<const void> keep) {
  if (batch->commands_size() > kMaxCommandsPerBatch) {
    return absl::InvalidArgumentError(absl::StrCat("a batch carries ", batch->commands_size(),
                                                   " commands; the limit is ",
                                                   kMaxCommandsPerBatch));
  }
  if (keep == nullptr) {
    // A move between two heap messages swaps their contents.
    auto owned = std::make_shared<v1::CommandBatch>(std::move(*batch));
    batch = owned.get();
    keep = std::move(owned);
  }
  absl::MutexLock lock(&dispatch_mu_);
  for (v1::Command& command : *batch->mutable_commands()) {
    commands_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t seq = command.seq();
    const absl::string_view kind = CommandKindName(command);
    try {
      Dispatch(command, keep);
    } catch (const std::exception& e) {
      ReplyError(seq, kind,
                 absl::InternalError(absl::StrCat("flagosd failed to handle the command: ",
                                                  e.what())));
    }
  }
  return absl::OkStatus();
}

absl::Status Session::HandleScannedBatch(const std::vector<ScannedCommand>& commands,
                                         google::protobuf::Arena* arena,
                                         std::shared_ptr<const void> keep) {
  if (commands.size() > static_cast<size_t>(kMaxCommandsPerBatch)) {
    return absl::InvalidArgumentError(absl::StrCat("a batch carries ", commands.size(),
                                                   " commands; the limit is ",
                                                   kMaxCommandsPerBatch));
  }
  // Every command is found or parsed before any is dispatched: a batch
  // that does not parse runs nothing, as when protobuf parses it whole.
  std::vector<ScannedWork>& work = scanned_work_;
  work.assign(commands.size(), ScannedWork());
  for (size_t i = 0; i < commands.size(); ++i) {
    const ScannedCommand& scanned = commands[i];
    if (scanned.op_only) {
      work[i].repeated = repeated_ops_.Find(scanned.device, scanned.op);
      if (work[i].repeated != nullptr) continue;
      // Prepared when it runs if it came before and can be kept
      // (repeated_op_calls.h).
      work[i].prepare =
          repeated_ops_.SeenBefore(scanned.device, scanned.op) && repeated_ops_.MakeRoom();
    }
    v1::Command* command = google::protobuf::Arena::CreateMessage<v1::Command>(arena);
    if (!command->ParseFromArray(scanned.bytes.data(), static_cast<int>(scanned.bytes.size()))) {
      work.clear();
      return absl::InvalidArgumentError(absl::StrCat(
          "a session message is not a flagos.v1.ClientMessage: its command #", i, " (",
          scanned.bytes.size(), " bytes) is malformed wire data, or holds values nested deeper "
          "than protobuf's limit of 100 levels; the session is ended: send messages serialized "
          "from proto/flagos/v1/flagos.proto"));
    }
    work[i].parsed = command;
  }
  absl::MutexLock lock(&dispatch_mu_);
  for (size_t i = 0; i < commands.size(); ++i) {
    commands_.fetch_add(1, std::memory_order_relaxed);
    const ScannedCommand& scanned = commands[i];
    try {
      if (work[i].repeated != nullptr) {
        if (TakeSeq(scanned.seq, "op")) DispatchRepeated(scanned, std::move(work[i].repeated), keep);
        continue;
      }
      Dispatch(*work[i].parsed, keep, /*ordered=*/true,
               work[i].prepare ? scanned.op : absl::string_view());
    } catch (const std::exception& e) {
      const uint64_t seq = work[i].parsed != nullptr ? work[i].parsed->seq() : scanned.seq;
      ReplyError(seq, work[i].parsed != nullptr ? CommandKindName(*work[i].parsed) : "op",
                 absl::InternalError(absl::StrCat("flagosd failed to handle the command: ",
                                                  e.what())));
    }
  }
  work.clear();
  return absl::OkStatus();
}

bool Session::TakeSeq(uint64_t seq, absl::string_view kind) {
  if (has_seq_ && seq <= last_seq_) {
    ReplyError(seq, kind,
               absl::InvalidArgumentError(absl::StrCat(
                   "command ", seq, " (", kind, ") does not follow command ", last_seq_,
                   ": sequence numbers must strictly increase within a session")));
    return false;
  }
  has_seq_ = true;
  last_seq_ = seq;
  return true;
}

void Session::Dispatch(v1::Command& command, const std::shared_ptr<const void>& keep,
                       bool ordered, absl::string_view op_bytes) {
  const uint64_t seq = command.seq();
  const absl::string_view kind = CommandKindName(command);
  if (ordered && !TakeSeq(seq, kind)) return;

  const int device_count = backend_.runtime().DeviceCount();
  const auto check_device = [&]() {
    if (command.device() >= 0 && command.device() < device_count) return absl::OkStatus();
    return CheckDevice(command.device(), device_count,
                       absl::StrCat("command ", seq, " (", kind, ")"));
  };
  switch (command.kind_case()) {
    case v1::Command::kRegisterOp: {
      const v1::RegisterOp& r = command.register_op();
      if (absl::Status s = ops_->Register(r.op_id(), r.name(), r.overload(), r.schema(), torch_version_); !s.ok()) {
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
    case v1::Command::kReleasePinned:
      return ScheduleReleasePinned(seq, command.release_pinned().region());
    case v1::Command::kExportMemory:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return ExportMemory(command);
    case v1::Command::kImportMemory:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return ImportMemory(command);
    case v1::Command::kReleaseImport:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return ScheduleReleaseImport(seq, command.device(), command.release_import().addr());
    case v1::Command::kQueryExport:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return QueryExport(command);
    case v1::Command::kSync:
      if (command.sync().stream_only()) {
        if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
        return SyncStream(command);
      }
      if (command.device() >= device_count) return ReplyError(seq, kind, check_device());
      return SyncDevice(command);
    case v1::Command::kCopyDeviceToDevice:
      if (absl::Status s = CheckDevice(command.copy_device_to_device().src_device(), device_count,
                                       absl::StrCat("command ", seq, " (", kind, ") source"));
          !s.ok()) {
        return ReplyError(seq, kind, s);
      }
      [[fallthrough]];
    case v1::Command::kOp:
    case v1::Command::kPlaceResult:
    case v1::Command::kCopyToDevice:
    case v1::Command::kCopyFromDevice:
    case v1::Command::kMemset:
      if (absl::Status s = check_device(); !s.ok()) {
        regions_.ReleaseStagedUpload(command);
        return ReplyError(seq, kind, s);
      }
      return Enqueue(command, keep, ordered, command.has_op() ? op_bytes : absl::string_view());
    case v1::Command::kRecordEvent:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return RecordEvent(command);
    case v1::Command::kWaitEvent:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return WaitEvent(command);
    case v1::Command::kQueryStream:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return QueryStream(command);
    // These name events only: their device and stream are not used.
    case v1::Command::kQueryEvent:
      return QueryEvent(command);
    case v1::Command::kSynchronizeEvent:
      return SynchronizeEvent(command);
    case v1::Command::kElapsedTime:
      return ElapsedTime(command);
    case v1::Command::kDestroyEvent:
      return DestroyEvent(command);
    case v1::Command::kDefineGraph:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return DefineGraph(command);
    case v1::Command::kReplayGraph:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return ReplayGraph(command);
    case v1::Command::kDestroyGraph:
      return DestroyGraph(command);
    case v1::Command::KIND_NOT_SET:
      return ReplyError(seq, kind,
                        absl::InvalidArgumentError(absl::StrCat(
                            "command ", seq, " has no kind set (a newer client's command?)")));
  }
}

void Session::Reply(v1::Completion completion, OwnedBytes payload) {
  if (sync_.Answer(completion, &payload)) return;
  if (!payload.empty()) completion.set_data(payload.TakeString());
  replies_.PostCompletion(std::move(completion));
}

v1::Completion Session::ErrorCompletion(uint64_t seq, absl::string_view kind,
                                        const absl::Status& status) {
  LogWarning(absl::StrCat("session ", id_, " (pid ", pid_, "): command ", seq, " (", kind,
                          ") failed: ", StatusCodeName(static_cast<int>(status.code())), ": ",
                          status.message()));
  if (metrics_ != nullptr) metrics_->CountCommandError(status.code());
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_code(static_cast<int>(status.code()));
  completion.set_message(std::string(status.message()));
  return completion;
}

void Session::ReplyError(uint64_t seq, absl::string_view kind, const absl::Status& status) {
  Reply(ErrorCompletion(seq, kind, status));
}

v1::Completion Session::Done(uint64_t seq) {
  v1::Completion completion;
  completion.set_seq(seq);
  return completion;
}

DeviceMetrics* Session::MetricsFor(int device) const {
  return metrics_ == nullptr ? nullptr : metrics_->device(device);
}

absl::Status Session::DrainDefaultStream(int device) {
  // The device's work and every host function issued before (the session's
  // among them; other sessions' too, since the default stream is shared).
  return backend_.runtime().DrainStream(device, 0);
}

void Session::Detach() {
  detached_.store(true, std::memory_order_release);
  {
    // A worker may still post a reply that ends the stream: not after this.
    absl::MutexLock lock(&end_mu_);
    stream_gone_ = true;
  }
  // The sync channel goes with the client (its descriptor stays open until
  // Close). Not under dispatch_mu_, which the sync thread holds while it
  // runs a command itself.
  sync_.Detach();
  // The stream is cancelled: a write in progress on it fails at once.
  replies_.Stop();
}

Session::CloseSummary Session::Close() {
  CloseSummary summary;
  if (closed_) return summary;
  closed_ = true;
  {
    absl::MutexLock lock(&dispatch_mu_);
    sync_closing_ = true;  // releases a sync command waiting to dispatch
  }
  // Ends the sync channel's read; its descriptor stays open until no reply
  // can come.
  sync_.Stop();
  // Its ranks leave their process groups: their peers fail now instead of
  // at the timeout, and its own workers waiting in a collective return
  // (before the streams below are drained).
  Communicators::Get().LeaveSession(id_);
  // Its ranks in groups that span daemons leave a note for their peers now,
  // and end once its streams drained (a collective running on them may be
  // writing into its memory; its gloo connections then close).
  GroupsBetweenDaemons::Get().NoteSessionLeft(id_);
  StreamTable::Map queues = streams_.TakeAll();
  for (auto& [key, state] : queues) state->queue->Stop();
  // The device may still be running what the queues issued: wait for it and
  // for the host functions that release and reply (they hold this session).
  DeviceRuntime& runtime = backend_.runtime();
  for (auto& [key, state] : queues) {
    absl::Status s;
    if (state->backend_stream != 0) {
      s = runtime.DestroyStream(state->device, state->backend_stream);
    } else {
      s = DrainDefaultStream(state->device);
    }
    if (!s.ok()) LogWarning(absl::StrCat("session ", id_, ": ", s.message()));
  }
  {
    absl::MutexLock lock(&clear_mu_);
    for (auto& [device, stream] : clear_streams_) {
      if (absl::Status s = runtime.DestroyStream(device, stream); !s.ok()) {
        LogWarning(absl::StrCat("session ", id_, ": ", s.message()));
      }
    }
    clear_streams_.clear();
  }
  GroupsBetweenDaemons::Get().LeaveSession(id_);
  // Every record task has run or was dropped: releasing the table destroys
  // the backend events.
  events_.Clear();
  graphs_.Clear();
  repeated_ops_.Clear();
  // No reply can come now: the last ones go out (unless the stream is
  // gone), then the writer stops; only then is the sync fd closed.
  replies_.Finish();
  sync_.CloseFd();
  // Every copy that used a region has completed.
  regions_.Close();
  FreeAllMemory(&summary);
  return summary;
}

}  // namespace flagos::daemon
