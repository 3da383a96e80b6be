#include "sessions/session.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "protocol/command_validation.h"
#include "logging.h"
#include "flagos/v1/wire.h"

namespace flagos::daemon {
namespace {

// A sync-channel request is one command; its arguments may carry host
// tensors by value, within the session stream's own message limit.
constexpr uint32_t kMaxSyncFrameBytes = 256u << 20;

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

// Compares without stopping at the first difference.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
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
      activity_(activity),
      metrics_(metrics),
      grants_(grants),
      replies_(id, std::move(write),
               [this, end = std::move(end)](const absl::Status& status) {
                 absl::MutexLock lock(&end_mu_);
                 if (!stream_gone_) end(status);
               }),
      pools_(std::move(pools)),
      ops_(OpRunner::Create(backend, op_limits)),
      staging_token_(NewToken()) {}

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
  {
    absl::MutexLock lock(&staging_mu_);
    info.set_staging_attached(staging_ != nullptr);
  }
  {
    absl::MutexLock lock(&pinned_mu_);
    info.set_pinned_bytes(pinned_total_bytes_);
    uint64_t registered = 0;
    for (const auto& [id, region] : pinned_) {
      if (region->registered()) registered += region->nbytes();
    }
    info.set_pinned_registered_bytes(registered);
  }
  info.set_torch_version(torch_version_);
  info.set_command_line(command_line_);
  info.set_running_commands(running_commands());
  {
    absl::MutexLock lock(&queues_mu_);
    info.set_streams(static_cast<uint32_t>(queues_.size()));
  }
  return info;
}

uint64_t Session::staging_bytes() const {
  absl::MutexLock lock(&staging_mu_);
  return staging_ == nullptr ? 0 : staging_->data_bytes();
}

absl::Status Session::AttachStaging(const v1::StagingAttach& attach, int fd, int64_t uid) {
  if (!SameSecret(attach.token(), staging_token_)) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "the staging attach for session ", id_,
        " carries the wrong token; only the process that opened the session may attach"));
  }
  if (peer_known_ && uid != uid_) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "the staging attach for session ", id_, " comes from uid ", uid,
        "; the session belongs to uid ", uid_,
        "; only the process that opened the session may attach"));
  }
  {
    absl::MutexLock lock(&staging_mu_);
    if (staging_ != nullptr) {
      close(fd);
      return absl::AlreadyExistsError(
          absl::StrCat("session ", id_, " already has a staging region"));
    }
  }
  absl::StatusOr<std::unique_ptr<StagingRegion>> region = StagingRegion::Map(fd, attach);
  if (!region.ok()) return region.status();
  absl::MutexLock lock(&staging_mu_);
  if (staging_ != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id_, " already has a staging region"));
  }
  staging_ = *std::move(region);
  // Pinned for DMA where the backend can (a gap on the cpu backend, whose
  // copies are memcpy); copies work unpinned either way.
  staging_registered_ =
      backend_.runtime().HostRegister(staging_->data(), staging_->data_bytes()).ok();
  LogInfo(absl::StrCat("session ", id_, " (pid ", pid_, "): staging region of ",
                       staging_->data_bytes(), " bytes attached"));
  return absl::OkStatus();
}

absl::Status Session::AttachPinned(const v1::StagingAttach& attach, int fd) {
  const uint64_t id = attach.pinned().id();
  const uint64_t nbytes = attach.pinned().nbytes();
  absl::Status refused;
  if (!SameSecret(attach.token(), staging_token_)) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        "the pinned-region attach for session ", id_,
        " carries the wrong token; only the process that opened the session may attach"));
  } else if (id == 0) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("session ", id_, ": pinned region id 0 is reserved; mint ids from 1"));
  } else {
    absl::MutexLock lock(&pinned_mu_);
    if (pinned_.contains(id)) {
      refused = absl::AlreadyExistsError(
          absl::StrCat("session ", id_, " already has pinned region ", id));
    } else if (pinned_.size() >= kMaxPinnedRegionsPerSession) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "session ", id_, " already has ", pinned_.size(),
          " pinned regions, the most flagosd allows; free pinned tensors (their cached blocks "
          "go back with the host allocator's empty_cache) or pin fewer, larger buffers"));
    } else if (nbytes > kMaxPinnedBytesPerSession - pinned_total_bytes_) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "session ", id_, ": pinning ", nbytes, " more bytes would exceed the ",
          kMaxPinnedBytesPerSession, " bytes of pinned host memory a session may hold (",
          pinned_total_bytes_, " pinned now)"));
    }
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  absl::StatusOr<std::unique_ptr<PinnedRegion>> region =
      PinnedRegion::Map(id, fd, nbytes, &backend_.runtime());
  if (!region.ok()) return region.status();
  absl::MutexLock lock(&pinned_mu_);
  // Checked again: another attach of the session may have raced this one.
  if (pinned_.contains(id) || nbytes > kMaxPinnedBytesPerSession - pinned_total_bytes_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "session ", id_, ": pinned region ", id, " was attached concurrently, or the session's "
        "pinned bytes reached their bound meanwhile"));
  }
  pinned_total_bytes_ += nbytes;
  pinned_.emplace(id, *std::move(region));
  return absl::OkStatus();
}

uint64_t Session::pinned_bytes() const {
  absl::MutexLock lock(&pinned_mu_);
  return pinned_total_bytes_;
}

absl::StatusOr<std::shared_ptr<PinnedRegion>> Session::Pinned(const v1::Command& command,
                                                              uint64_t region) const {
  absl::MutexLock lock(&pinned_mu_);
  auto it = pinned_.find(region);
  if (it == pinned_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "command ", command.seq(), " (", CommandKindName(command), ") names pinned region ",
        region, ", which session ", id_, " has not attached (or has released)"));
  }
  return it->second;
}

void Session::ScheduleReleasePinned(uint64_t seq, uint64_t region) {
  // Copies still queued or in flight hold their own reference; the mapping
  // goes when the last of them completes.
  AfterQueuedWork(-1, [this, seq, region](absl::Status /*errors are the commands'*/) {
    bool found;
    {
      absl::MutexLock lock(&pinned_mu_);
      auto it = pinned_.find(region);
      found = it != pinned_.end();
      if (found) {
        pinned_total_bytes_ -= it->second->nbytes();
        pinned_.erase(it);
      }
    }
    if (!found) {
      ReplyError(seq, "release_pinned",
                 absl::NotFoundError(absl::StrCat("session ", id_, " has no pinned region ",
                                                  region, " to release")));
    }
  });
}

absl::StatusOr<std::shared_ptr<StagingRegion>> Session::Staging(
    const v1::Command& command) const {
  absl::MutexLock lock(&staging_mu_);
  if (staging_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "command ", command.seq(), " (", CommandKindName(command),
        ") names staged bytes but the session has no staging region; attach one first (or send "
        "the bytes inline)"));
  }
  return staging_;
}

void Session::ReleaseStagedUpload(const v1::Command& command) {
  if (!command.has_copy_to_device() || !command.copy_to_device().has_staged()) return;
  absl::MutexLock lock(&staging_mu_);
  if (staging_ != nullptr) staging_->Release(command.copy_to_device().staged().offset());
}

absl::Status Session::HandleBatch(v1::CommandBatch* batch) {
  if (batch->commands_size() > kMaxCommandsPerBatch) {
    return absl::InvalidArgumentError(absl::StrCat("a batch carries ", batch->commands_size(),
                                                   " commands; the limit is ",
                                                   kMaxCommandsPerBatch));
  }
  absl::MutexLock lock(&dispatch_mu_);
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

void Session::Dispatch(v1::Command command, bool ordered) {
  const uint64_t seq = command.seq();
  const absl::string_view kind = CommandKindName(command);
  if (ordered && has_seq_ && seq <= last_seq_) {
    ReplyError(seq, kind,
               absl::InvalidArgumentError(absl::StrCat(
                   "command ", seq, " (", kind, ") does not follow command ", last_seq_,
                   ": sequence numbers must strictly increase within a session")));
    return;
  }
  if (ordered) {
    has_seq_ = true;
    last_seq_ = seq;
  }

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
    case v1::Command::kSync: {
      if (command.sync().stream_only()) {
        if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
        return SyncStream(command);
      }
      if (command.device() >= device_count) return ReplyError(seq, kind, check_device());
      // Replies once the device has completed every earlier command, not
      // merely run it.
      AfterQueuedWork(command.device(), [this, seq](absl::Status status) {
        if (!status.ok()) return ReplyError(seq, "sync", status);
        v1::Completion completion;
        completion.set_seq(seq);
        Reply(std::move(completion));
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
    case v1::Command::kPlaceResult:
    case v1::Command::kCopyToDevice:
    case v1::Command::kCopyFromDevice:
    case v1::Command::kMemset:
      if (absl::Status s = check_device(); !s.ok()) {
        ReleaseStagedUpload(command);
        return ReplyError(seq, kind, s);
      }
      return Enqueue(std::move(command), ordered);
    case v1::Command::kRecordEvent:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return RecordEvent(std::move(command));
    case v1::Command::kWaitEvent:
      if (absl::Status s = check_device(); !s.ok()) return ReplyError(seq, kind, s);
      return WaitEvent(std::move(command));
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
    case v1::Command::KIND_NOT_SET:
      return ReplyError(seq, kind,
                        absl::InvalidArgumentError(absl::StrCat(
                            "command ", seq, " has no kind set (a newer client's command?)")));
  }
}

void Session::Allocate(uint64_t seq, int device, uint64_t nbytes) {
  DeviceRuntime& runtime = backend_.runtime();
  DeviceMetrics* metrics = MetricsFor(device);
  if (quotas_ != nullptr) {
    if (absl::Status s = quotas_->Reserve(id_, uid_, device, nbytes); !s.ok()) {
      if (metrics != nullptr) metrics->CountOutOfMemory();
      return ReplyError(seq, "allocate", s);
    }
  }
  // Gives the reservation back when the allocation fails.
  const auto refuse = [this, seq, device, nbytes](const absl::Status& status) {
    if (quotas_ != nullptr) quotas_->Release(id_, uid_, device, nbytes);
    ReplyError(seq, "allocate", status);
  };
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
  if (!ptr.ok()) {
    if (metrics != nullptr && absl::IsResourceExhausted(ptr.status())) metrics->CountOutOfMemory();
    return refuse(ptr.status());
  }
  if (absl::Status s = ClearNewSegment(device, *ptr, nbytes); !s.ok()) {
    (void)runtime.Free(device, *ptr);
    return refuse(absl::Status(
        s.code(), absl::StrCat("clearing the new segment of ", nbytes, " bytes: ", s.message())));
  }
  if (absl::Status s = segments_.Insert(device, *ptr, nbytes); !s.ok()) {
    (void)runtime.Free(device, *ptr);
    return refuse(absl::InternalError(absl::StrCat(
        "the backend returned memory that this session already holds: ", s.message())));
  }
  if (metrics != nullptr) metrics->CountAllocation(nbytes);
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_addr(*ptr);
  Reply(std::move(completion));
}

absl::Status Session::ClearNewSegment(int device, DevicePtr ptr, uint64_t nbytes) {
  DeviceRuntime& runtime = backend_.runtime();
  if (runtime.MallocReturnsZeroes()) return absl::OkStatus();
  StreamHandle stream = 0;
  {
    absl::MutexLock lock(&clear_mu_);
    auto it = clear_streams_.find(device);
    if (it == clear_streams_.end()) {
      absl::StatusOr<StreamHandle> created = runtime.CreateStream(device);
      if (!created.ok()) return created.status();
      it = clear_streams_.emplace(device, *created).first;
    }
    stream = it->second;
  }
  if (absl::Status s = runtime.Memset(device, stream, ptr, 0, nbytes); !s.ok()) return s;
  return runtime.SynchronizeStream(device, stream);
}

void Session::ScheduleFree(uint64_t seq, int device, DevicePtr addr) {
  // The memory is freed once the device has completed every earlier
  // command on it (a kernel or copy still running may use it).
  ScheduleRelease(device, [this, seq, device, addr] { ExecuteFree(seq, device, addr); });
}

void Session::ScheduleRelease(int device, std::function<void()> release) {
  {
    absl::MutexLock lock(&free_mu_);
    ++pending_frees_;
  }
  AfterQueuedWork(device, [this, release = std::move(release)](
                              absl::Status /*errors are the commands'*/) {
    release();
    absl::MutexLock lock(&free_mu_);
    --pending_frees_;
  });
}

void Session::ExecuteFree(uint64_t seq, int device, DevicePtr addr) {
  absl::Status status;
  {
    absl::WriterMutexLock lock(&memory_mu_);
    absl::StatusOr<Segment> segment = segments_.Remove(device, addr);
    if (segment.ok() && quotas_ != nullptr) {
      quotas_->Release(id_, uid_, device, segment->nbytes);
    }
    if (!segment.ok()) {
      status = segment.status();
    } else if (grants_ == nullptr || grants_->DropOwner(device, addr)) {
      // Not shared, or no other session holds it any more.
      status = backend_.runtime().Free(device, addr);
    }
  }
  if (!status.ok()) ReplyError(seq, "free", status);
}

bool Session::FreeMemory(const Segment& segment) {
  if (absl::Status s = backend_.runtime().Free(segment.device, segment.addr); !s.ok()) {
    LogError(absl::StrCat("session ", id_, ": freeing segment ",
                          absl::StrFormat("0x%x", segment.addr), " on ",
                          DeviceName(segment.device), " failed: ", s.message()));
    return false;
  }
  return true;
}

absl::Status Session::CheckSharing(const v1::Command& command) const {
  if (grants_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("command ", command.seq(), " (", CommandKindName(command),
                   "): this flagosd shares no device memory between sessions"));
}

absl::StatusOr<Segment> Session::HeldSegment(const v1::Command& command, int device,
                                             DevicePtr addr, bool* owned) const {
  if (std::optional<Segment> segment = segments_.Lookup(device, addr)) {
    *owned = true;
    return *segment;
  }
  if (std::optional<Segment> segment = imported_.Lookup(device, addr)) {
    *owned = false;
    return *segment;
  }
  return absl::NotFoundError(absl::StrCat(
      "command ", command.seq(), " (", CommandKindName(command), "): address ",
      absl::StrFormat("0x%x", addr), " is in none of this session's segments on ",
      DeviceName(device)));
}

void Session::ExportMemory(const v1::Command& command) {
  const uint64_t seq = command.seq();
  if (absl::Status s = CheckSharing(command); !s.ok()) return ReplyError(seq, "export_memory", s);
  // Replies once what the session wrote before has completed, so that the
  // importer reads it.
  AfterQueuedWork(command.device(), [this, command](absl::Status status) {
    if (!status.ok()) return ReplyError(command.seq(), "export_memory", status);
    absl::ReaderMutexLock lock(&memory_mu_);  // no free runs meanwhile
    bool owned = false;
    absl::StatusOr<Segment> segment =
        HeldSegment(command, command.device(), command.export_memory().addr(), &owned);
    if (!segment.ok()) return ReplyError(command.seq(), "export_memory", segment.status());
    absl::StatusOr<std::string> grant =
        grants_->Export(id_, uid_, *segment, owned);
    if (!grant.ok()) return ReplyError(command.seq(), "export_memory", grant.status());
    v1::Completion completion;
    completion.set_seq(command.seq());
    completion.set_grant(*std::move(grant));
    completion.set_addr(segment->addr);
    completion.set_segment_nbytes(segment->nbytes);
    Reply(std::move(completion));
  });
}

void Session::ImportMemory(const v1::Command& command) {
  const uint64_t seq = command.seq();
  if (absl::Status s = CheckSharing(command); !s.ok()) return ReplyError(seq, "import_memory", s);
  Segment segment;
  {
    absl::MutexLock lock(&imports_mu_);
    absl::StatusOr<Segment> imported = grants_->Import(
        id_, uid_, command.import_memory().grant(),
        command.device());
    if (!imported.ok()) return ReplyError(seq, "import_memory", imported.status());
    segment = *imported;
    uint64_t& holds = import_holds_[{segment.device, segment.addr}];
    if (holds++ == 0) {
      if (absl::Status s = imported_.Insert(segment.device, segment.addr, segment.nbytes);
          !s.ok()) {
        LogError(absl::StrCat("session ", id_, ": ", s.message()));
      }
    }
  }
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_addr(segment.addr);
  completion.set_segment_nbytes(segment.nbytes);
  Reply(std::move(completion));
}

void Session::ScheduleReleaseImport(uint64_t seq, int device, DevicePtr addr) {
  ScheduleRelease(device, [this, seq, device, addr] { ExecuteReleaseImport(seq, device, addr); });
}

void Session::ExecuteReleaseImport(uint64_t seq, int device, DevicePtr addr) {
  absl::Status status;
  {
    absl::WriterMutexLock lock(&memory_mu_);
    absl::MutexLock imports_lock(&imports_mu_);
    auto holds = import_holds_.find({device, addr});
    if (grants_ == nullptr || holds == import_holds_.end()) {
      status = absl::NotFoundError(absl::StrFormat(
          "command %d (release_import): this session holds no imported segment at 0x%x on %s "
          "(released twice, or not an address import_memory returned)",
          seq, addr, DeviceName(device)));
    } else {
      if (--holds->second == 0) {
        import_holds_.erase(holds);
        (void)imported_.Remove(device, addr);
      }
      absl::StatusOr<bool> unheld = grants_->Release(id_, device, addr);
      if (!unheld.ok()) {
        status = unheld.status();
      } else if (*unheld) {
        status = backend_.runtime().Free(device, addr);
      }
    }
  }
  if (!status.ok()) ReplyError(seq, "release_import", status);
}

void Session::QueryExport(const v1::Command& command) {
  const uint64_t seq = command.seq();
  if (absl::Status s = CheckSharing(command); !s.ok()) return ReplyError(seq, "query_export", s);
  bool owned = false;
  absl::StatusOr<Segment> segment =
      HeldSegment(command, command.device(), command.query_export().addr(), &owned);
  if (!segment.ok()) return ReplyError(seq, "query_export", segment.status());
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_ready(!grants_->InUse(segment->device, segment->addr));
  Reply(std::move(completion));
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
  if (device < 0 || static_cast<size_t>(device) >= pools_.size() || pools_[device] == nullptr) {
    return absl::InternalError(absl::StrCat("flagosd has no worker pool for ", DeviceName(device),
                                            " (", pools_.size(), " pools)"));
  }
  auto state = std::make_unique<StreamState>();
  state->device = device;
  if (stream != 0) {
    absl::StatusOr<StreamHandle> handle = backend_.runtime().CreateStream(device);
    if (!handle.ok()) return handle.status();
    state->backend_stream = *handle;
  }
  state->queue = std::make_unique<StreamQueue>(
      absl::StrCat("session ", id_, " ", DeviceName(device), " stream ", stream), pools_[device],
      activity_ == nullptr ? nullptr : activity_->clock(device));
  StreamState* raw = state.get();
  queues_.emplace(std::make_pair(device, stream), std::move(state));
  return raw;
}

void Session::Enqueue(v1::Command command, bool ordered) {
  absl::StatusOr<StreamState*> state = QueueFor(command.device(), command.stream());
  if (!state.ok()) {
    ReleaseStagedUpload(command);
    return ReplyError(command.seq(), CommandKindName(command), state.status());
  }
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
  // A copy from another device reads what that device's queues write: its
  // queue parks (holding no worker) until every earlier command there has
  // executed; the queue that finishes last resumes it.
  std::shared_ptr<SourceReady> source_ready;
  if (command.has_copy_device_to_device() &&
      command.copy_device_to_device().src_device() != command.device()) {
    source_ready = std::make_shared<SourceReady>();
    AfterQueuedWork(command.copy_device_to_device().src_device(),
                    [this, source_ready](absl::Status /*errors are the commands'*/) {
                      std::optional<StreamQueue::Resume> resume;
                      {
                        absl::MutexLock lock(&gate_mu_);
                        source_ready->ready = true;
                        resume.swap(source_ready->resume);
                      }
                      if (resume.has_value()) (*resume)();
                    });
  }
  // The client waits for this command's reply, and its queue is idle (only
  // this thread pushes to it): run it here rather than waking a worker,
  // which saves two thread switches on every synchronous round trip. Not an
  // op that came on the session stream: its kernel may run for as long as
  // the per-op bounds allow, and the stream's reading thread must stay free
  // to see the client leave (Detach) meanwhile.
  const bool owes_reply = (command.has_copy_from_device() &&
                           !command.copy_from_device().has_pinned()) ||
                          (command.has_op() && command.op().want_values() && !ordered);
  if (owes_reply && source_ready == nullptr && payload == 0 &&
      (*state)->queue->pending() == 0) {
    Execute(command, backend_stream);
    return;
  }
  if (source_ready != nullptr) {
    (*state)->queue->PushGate([this, source_ready](StreamQueue::Resume resume) {
      {
        absl::MutexLock lock(&gate_mu_);
        if (!source_ready->ready) {
          source_ready->resume = std::move(resume);
          return;
        }
      }
      resume();
    });
  }
  (*state)->queue->Push(
      [this, command = std::move(command), backend_stream, payload]() mutable {
        Execute(command, backend_stream);
        if (payload > 0) {
          absl::MutexLock lock(&payload_mu_);
          queued_payload_bytes_ -= payload;
        }
      });
}

// ------------------------------------------------------------------ events

namespace {

// How long query_stream waits for a busy queue to become idle before it
// answers "not ready".
constexpr absl::Duration kQueryStreamSettle = absl::Milliseconds(1);

absl::Status CheckEventId(uint64_t seq, absl::string_view kind, uint64_t event) {
  if (event != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "command ", seq, " (", kind, ") names event 0; event ids are minted by the client and > 0"));
}

v1::Completion Done(uint64_t seq) {
  v1::Completion completion;
  completion.set_seq(seq);
  return completion;
}

}  // namespace

Session::EventRecord::~EventRecord() {
  if (handle == 0) return;
  if (absl::Status s = runtime->DestroyEvent(device, handle); !s.ok()) {
    LogWarning(absl::StrCat("destroying an event on ", DeviceName(device), " failed: ",
                            s.message()));
  }
}

// The task record_event puts on its stream queue. Dropped unrun (the
// session closed), it abandons the record, which frees what waited for it.
class Session::RecordTask {
 public:
  RecordTask(Session* session, uint64_t seq, std::shared_ptr<EventRecord> record,
             StreamHandle backend_stream)
      : session_(session), seq_(seq), record_(std::move(record)),
        backend_stream_(backend_stream) {}
  RecordTask(RecordTask&& other) noexcept = default;  // leaves other.record_ empty
  RecordTask& operator=(RecordTask&&) = delete;
  ~RecordTask() {
    if (record_ != nullptr) session_->AbandonRecord(*record_);
  }

  void operator()() && {
    std::shared_ptr<EventRecord> record = std::move(record_);
    session_->IssueRecord(seq_, *record, backend_stream_);
  }

 private:
  Session* session_;
  uint64_t seq_;
  std::shared_ptr<EventRecord> record_;
  StreamHandle backend_stream_;
};

std::shared_ptr<Session::EventRecord> Session::LatestRecord(uint64_t event) const {
  auto it = events_.find(event);
  return it == events_.end() ? nullptr : it->second;
}

void Session::IssueRecord(uint64_t seq, EventRecord& record, StreamHandle backend_stream) {
  DeviceRuntime& runtime = backend_.runtime();
  EventHandle handle = 0;
  absl::Status status;
  try {
    absl::StatusOr<EventHandle> created = runtime.CreateEvent(record.device, record.timing);
    if (created.ok()) {
      status = runtime.RecordEvent(record.device, *created, backend_stream);
      if (status.ok()) {
        handle = *created;
      } else {
        (void)runtime.DestroyEvent(record.device, *created);
      }
    } else {
      status = created.status();
    }
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("flagosd failed to record the event: ", e.what()));
  }
  std::vector<std::function<void()>> actions;
  {
    absl::MutexLock lock(&gate_mu_);
    record.handle = handle;
    record.issued = true;
    actions.swap(record.on_issued);
  }
  if (!status.ok()) ReplyError(seq, "record_event", status);
  for (std::function<void()>& action : actions) action();
}

void Session::AbandonRecord(EventRecord& record) {
  std::vector<std::function<void()>> actions;
  {
    absl::MutexLock lock(&gate_mu_);
    record.issued = true;
    actions.swap(record.on_issued);
  }
  // `actions` (which may hold the last references to records) die here,
  // outside the lock, unrun.
}

void Session::WhenIssued(const std::vector<std::shared_ptr<EventRecord>>& records,
                         std::function<void()> action) {
  struct Pending {
    std::atomic<size_t> remaining;
    std::function<void()> action;
  };
  auto pending = std::make_shared<Pending>();
  pending->remaining.store(records.size() + 1);
  pending->action = std::move(action);
  const auto arrive = [pending] {
    if (pending->remaining.fetch_sub(1) == 1) pending->action();
  };
  for (const std::shared_ptr<EventRecord>& record : records) {
    bool issued;
    {
      absl::MutexLock lock(&gate_mu_);
      issued = record->issued;
      if (!issued) record->on_issued.push_back(arrive);
    }
    if (issued) arrive();
  }
  arrive();
}

void Session::RecordEvent(v1::Command command) {
  const uint64_t seq = command.seq();
  const uint64_t event = command.record_event().event();
  if (absl::Status s = CheckEventId(seq, "record_event", event); !s.ok()) {
    return ReplyError(seq, "record_event", s);
  }
  if (!events_.contains(event) && events_.size() >= kMaxEventsPerSession) {
    return ReplyError(seq, "record_event",
                      absl::ResourceExhaustedError(absl::StrCat(
                          "command ", seq, " (record_event): the session already has ",
                          events_.size(), " events, the most flagosd allows (",
                          kMaxEventsPerSession, "); destroy events no longer needed")));
  }
  absl::StatusOr<StreamState*> state = QueueFor(command.device(), command.stream());
  if (!state.ok()) return ReplyError(seq, "record_event", state.status());
  auto record = std::make_shared<EventRecord>(&backend_.runtime(), command.device(),
                                              command.record_event().enable_timing());
  events_[event] = record;
  (*state)->queue->Push(RecordTask(this, seq, std::move(record), (*state)->backend_stream));
}

void Session::WaitEvent(v1::Command command) {
  const uint64_t seq = command.seq();
  const uint64_t event = command.wait_event().event();
  if (absl::Status s = CheckEventId(seq, "wait_event", event); !s.ok()) {
    return ReplyError(seq, "wait_event", s);
  }
  std::shared_ptr<EventRecord> record = LatestRecord(event);
  if (record == nullptr) return;  // never recorded: nothing to wait for
  absl::StatusOr<StreamState*> state = QueueFor(command.device(), command.stream());
  if (!state.ok()) return ReplyError(seq, "wait_event", state.status());
  const int device = command.device();
  const StreamHandle backend_stream = (*state)->backend_stream;
  // The queue parks until the record is issued (by its own stream's queue);
  // the worker issuing it resumes this one.
  (*state)->queue->PushGate([this, record](StreamQueue::Resume resume) {
    WhenIssued({record}, [resume] { resume(); });
  });
  (*state)->queue->Push([this, seq, device, backend_stream, record = std::move(record)] {
    if (record->handle == 0) return;  // the record failed; reported then
    // Issued: the backend orders the rest (same device), or this worker
    // waits for the record to complete (another device).
    DeviceRuntime& runtime = backend_.runtime();
    absl::Status s = record->device == device
                         ? runtime.StreamWaitEvent(device, backend_stream, record->handle)
                         : runtime.SynchronizeEvent(record->device, record->handle);
    if (!s.ok()) ReplyError(seq, "wait_event", s);
  });
}

void Session::QueryEvent(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const uint64_t event = command.query_event().event();
  if (absl::Status s = CheckEventId(seq, "query_event", event); !s.ok()) {
    return ReplyError(seq, "query_event", s);
  }
  bool ready = true;  // an event never recorded counts as complete
  if (std::shared_ptr<EventRecord> record = LatestRecord(event)) {
    bool issued;
    EventHandle handle;
    {
      absl::MutexLock lock(&gate_mu_);
      issued = record->issued;
      handle = record->handle;
    }
    if (!issued) {
      ready = false;
    } else if (handle != 0) {
      absl::StatusOr<bool> done = backend_.runtime().QueryEvent(record->device, handle);
      if (!done.ok()) return ReplyError(seq, "query_event", done.status());
      ready = *done;
    }
  }
  v1::Completion completion = Done(seq);
  completion.set_ready(ready);
  Reply(std::move(completion));
}

void Session::SynchronizeEvent(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const uint64_t event = command.synchronize_event().event();
  if (absl::Status s = CheckEventId(seq, "synchronize_event", event); !s.ok()) {
    return ReplyError(seq, "synchronize_event", s);
  }
  std::shared_ptr<EventRecord> record = LatestRecord(event);
  if (record == nullptr) return Reply(Done(seq));
  WhenIssued({record}, [this, seq, record] {
    if (record->handle != 0) {
      absl::Status s = backend_.runtime().SynchronizeEvent(record->device, record->handle);
      if (!s.ok()) return ReplyError(seq, "synchronize_event", s);
    }
    Reply(Done(seq));
  });
}

void Session::ElapsedTime(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const v1::ElapsedTime& request = command.elapsed_time();
  std::shared_ptr<EventRecord> records[2];
  const uint64_t ids[2] = {request.start(), request.end()};
  for (int i = 0; i < 2; ++i) {
    if (absl::Status s = CheckEventId(seq, "elapsed_time", ids[i]); !s.ok()) {
      return ReplyError(seq, "elapsed_time", s);
    }
    records[i] = LatestRecord(ids[i]);
    if (records[i] == nullptr) {
      return ReplyError(seq, "elapsed_time",
                        absl::NotFoundError(absl::StrCat(
                            "command ", seq, " (elapsed_time): event ", ids[i],
                            " has not been recorded (or was destroyed); record both events "
                            "before asking for the time between them")));
    }
    if (!records[i]->timing) {
      return ReplyError(seq, "elapsed_time",
                        absl::FailedPreconditionError(absl::StrCat(
                            "command ", seq, " (elapsed_time): event ", ids[i],
                            " was recorded without timing; create both events with "
                            "enable_timing=True to measure the time between them")));
    }
  }
  if (records[0]->device != records[1]->device) {
    return ReplyError(seq, "elapsed_time",
                      absl::InvalidArgumentError(absl::StrCat(
                          "command ", seq, " (elapsed_time): the events were recorded on ",
                          DeviceName(records[0]->device), " and ",
                          DeviceName(records[1]->device),
                          "; elapsed time is measured between events of one device")));
  }
  std::shared_ptr<EventRecord> start = records[0];
  std::shared_ptr<EventRecord> end = records[1];
  WhenIssued({start, end}, [this, seq, start, end] {
    if (start->handle == 0 || end->handle == 0) {
      return ReplyError(seq, "elapsed_time",
                        absl::FailedPreconditionError(absl::StrCat(
                            "command ", seq,
                            " (elapsed_time): recording one of the events failed (reported "
                            "with its record_event)")));
    }
    absl::StatusOr<float> ms =
        backend_.runtime().ElapsedTime(start->device, start->handle, end->handle);
    if (!ms.ok()) return ReplyError(seq, "elapsed_time", ms.status());
    v1::Completion completion = Done(seq);
    completion.set_elapsed_ms(*ms);
    Reply(std::move(completion));
  });
}

void Session::DestroyEvent(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const uint64_t event = command.destroy_event().event();
  if (absl::Status s = CheckEventId(seq, "destroy_event", event); !s.ok()) {
    return ReplyError(seq, "destroy_event", s);
  }
  // Commands that wait for the latest record hold it; the backend event
  // goes when the last of them is done.
  if (events_.erase(event) == 0) {
    ReplyError(seq, "destroy_event",
               absl::NotFoundError(absl::StrCat("command ", seq, " (destroy_event): event ",
                                                event,
                                                " does not exist (never recorded, or destroyed "
                                                "already)")));
  }
}

Session::StreamState* Session::ExistingQueue(int device, uint64_t stream) {
  absl::MutexLock lock(&queues_mu_);
  auto it = queues_.find({device, stream});
  return it == queues_.end() ? nullptr : it->second.get();
}

void Session::QueryStream(const v1::Command& command) {
  const uint64_t seq = command.seq();
  StreamState* state = ExistingQueue(command.device(), command.stream());
  bool ready = true;  // a stream never used has no work
  if (state != nullptr) {
    StreamQueue* queue = state->queue.get();
    const StreamHandle backend_stream = state->backend_stream;
    // A task that has replied (the sync or copy the client just saw
    // complete) may still be returning: give the queue a moment to settle
    // before calling it busy, so that a query right after a synchronisation
    // says ready.
    const absl::Time settle_deadline = absl::Now() + kQueryStreamSettle;
    while (queue->pending() != 0 && absl::Now() < settle_deadline) {
      absl::SleepFor(absl::Microseconds(20));
    }
    ready = queue->pending() == 0;
    if (ready) {
      absl::StatusOr<bool> done = backend_.runtime().QueryStream(command.device(), backend_stream);
      if (!done.ok()) return ReplyError(seq, "query_stream", done.status());
      ready = *done;
    }
  }
  v1::Completion completion = Done(seq);
  completion.set_ready(ready);
  Reply(std::move(completion));
}

void Session::SyncStream(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const int device = command.device();
  StreamState* state = ExistingQueue(device, command.stream());
  if (state == nullptr) return Reply(Done(seq));
  const StreamHandle backend_stream = state->backend_stream;
  auto sync = [this, seq, device, backend_stream] {
    absl::Status s = backend_.runtime().SynchronizeStream(device, backend_stream);
    if (!s.ok()) return ReplyError(seq, "sync", s);
    Reply(Done(seq));
  };
  if (state->queue->pending() == 0) return sync();  // idle: answer from this thread
  state->queue->Push(std::move(sync));
}

void Session::AfterQueuedWork(int device, std::function<void(absl::Status)> action) {
  struct Queue {
    StreamQueue* queue;
    int device;
    StreamHandle backend_stream;
  };
  std::vector<Queue> queues;
  {
    absl::MutexLock lock(&queues_mu_);
    for (const auto& [key, state] : queues_) {
      if (device < 0 || key.first == device) {
        queues.push_back(Queue{state->queue.get(), state->device, state->backend_stream});
      }
    }
  }
  struct Barrier {
    std::atomic<size_t> remaining;
    absl::Mutex mu;
    absl::Status first_error ABSL_GUARDED_BY(mu);
    std::function<void(absl::Status)> action;
  };
  auto barrier = std::make_shared<Barrier>();
  barrier->remaining.store(queues.size() + 1);
  barrier->action = std::move(action);
  const auto arrive = [barrier](absl::Status status) {
    if (!status.ok()) {
      absl::MutexLock lock(&barrier->mu);
      if (barrier->first_error.ok()) barrier->first_error = std::move(status);
    }
    if (barrier->remaining.fetch_sub(1) != 1) return;
    absl::Status first;
    {
      absl::MutexLock lock(&barrier->mu);
      first = barrier->first_error;
    }
    barrier->action(std::move(first));
  };
  DeviceRuntime& runtime = backend_.runtime();
  for (const Queue& q : queues) {
    // An idle queue (only this thread pushes to them) has issued all its
    // work: wait for the device here; otherwise after the queue's last task.
    if (q.queue->pending() == 0) {
      arrive(runtime.SynchronizeStream(q.device, q.backend_stream));
      continue;
    }
    q.queue->Push([arrive, q, &runtime] {
      arrive(runtime.SynchronizeStream(q.device, q.backend_stream));
    });
  }
  arrive(absl::OkStatus());
}

absl::Status Session::ReplyWhenComplete(int device, StreamHandle backend_stream,
                                        v1::Completion completion,
                                        std::shared_ptr<std::string> data) {
  DeviceRuntime& runtime = backend_.runtime();
  auto reply = [this, completion = std::move(completion),
                data = std::move(data)](absl::Status status) mutable {
    if (!status.ok()) return ReplyError(completion.seq(), "copy_from_device", status);
    if (data != nullptr) completion.set_data(std::move(*data));
    Reply(std::move(completion));
  };
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  absl::Status launched = runtime.LaunchHostFunc(
      device, backend_stream, [shared](absl::Status status) { (*shared)(std::move(status)); });
  if (launched.ok()) return absl::OkStatus();
  // No host function: wait for the stream here instead.
  (*shared)(runtime.SynchronizeStream(device, backend_stream));
  return absl::OkStatus();
}

void Session::ReleaseWhenComplete(int device, StreamHandle backend_stream,
                                  DeviceRuntime::HostFunc release) {
  DeviceRuntime& runtime = backend_.runtime();
  auto shared = std::make_shared<DeviceRuntime::HostFunc>(std::move(release));
  if (runtime.LaunchHostFunc(device, backend_stream, [shared](absl::Status status) {
        std::move(*shared)(std::move(status));
      }).ok()) {
    return;
  }
  std::move(*shared)(runtime.SynchronizeStream(device, backend_stream));
}

DeviceMetrics* Session::MetricsFor(int device) const {
  return metrics_ == nullptr ? nullptr : metrics_->device(device);
}

void Session::CountCopy(int device, CopyDirection direction, uint64_t nbytes) {
  if (DeviceMetrics* metrics = MetricsFor(device)) metrics->CountCopy(direction, nbytes);
}

absl::Status Session::CheckRange(const v1::Command& command, int device, uint64_t addr,
                                 uint64_t nbytes) const {
  if (segments_.Contains(device, addr, nbytes)) return absl::OkStatus();
  if (imported_.Contains(device, addr, nbytes)) return absl::OkStatus();
  return OutsideSegmentsError(command.seq(), CommandKindName(command), addr, nbytes, device);
}

void Session::Execute(v1::Command& command, StreamHandle backend_stream) {
  // The client is gone: what has not started is dropped, as Close drops
  // what is still queued.
  if (detached_.load(std::memory_order_acquire)) return;
  running_.fetch_add(1, std::memory_order_relaxed);
  struct Finished {
    std::atomic<uint32_t>& running;
    ~Finished() { running.fetch_sub(1, std::memory_order_relaxed); }
  } finished{running_};
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
  if (reply) Reply(std::move(completion));
}

absl::Status Session::ExecuteLocked(v1::Command& command, StreamHandle backend_stream,
                                    v1::Completion* completion, bool* reply) {
  DeviceRuntime& runtime = backend_.runtime();
  const int device = command.device();
  switch (command.kind_case()) {
    case v1::Command::kOp: {
      *reply = command.op().want_values();
      DeviceMetrics* metrics = MetricsFor(device);
      const auto start = metrics == nullptr ? std::chrono::steady_clock::time_point()
                                            : std::chrono::steady_clock::now();
      absl::Status status = ops_->Run(
          device, backend_stream, command.op(),
          [&](int d, uint64_t addr, uint64_t nbytes) {
            return CheckRange(command, d, addr, nbytes);
          },
          completion);
      if (metrics != nullptr) {
        metrics->CountOp(ops_->RouteOf(command.op().op_id()),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                             .count(),
                         status.ok());
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
            Pinned(command, copy.pinned().region());
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
        ReleaseWhenComplete(device, backend_stream, [region = *region](absl::Status) {});
        return absl::OkStatus();
      }
      if (copy.has_staged()) {
        // The chunk is the client's again once the device has read it, or
        // at once when the copy is not issued.
        absl::StatusOr<std::shared_ptr<StagingRegion>> region = Staging(command);
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
        ReleaseWhenComplete(device, backend_stream,
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
      ReleaseWhenComplete(device, backend_stream, [data](absl::Status) {});
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
            Pinned(command, copy.pinned().region());
        if (!region.ok()) return region.status();
        absl::StatusOr<char*> bytes = (*region)->Bytes(copy.pinned().offset(), copy.nbytes());
        if (!bytes.ok()) return bytes.status();
        if (absl::Status s = runtime.CopyDeviceToHost(device, backend_stream, *bytes, copy.addr(),
                                                      copy.nbytes());
            !s.ok()) {
          return s;
        }
        CountCopy(device, CopyDirection::kDeviceToHost, copy.nbytes());
        ReleaseWhenComplete(device, backend_stream, [region = *region](absl::Status) {});
        return absl::OkStatus();
      }
      *reply = true;
      if (copy.has_staged()) {
        if (copy.staged().nbytes() != copy.nbytes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "command ", command.seq(), " (copy_from_device): copies ", copy.nbytes(),
              " bytes into a staged range of ", copy.staged().nbytes(), " bytes"));
        }
        absl::StatusOr<std::shared_ptr<StagingRegion>> region = Staging(command);
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
      auto data = std::make_shared<std::string>(copy.nbytes(), '\0');
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

void Session::Reply(v1::Completion completion) {
  uint64_t waiting = completion.seq();
  if (waiting != 0 && sync_seq_.compare_exchange_strong(waiting, 0)) {
    return WriteSyncReply(std::move(completion));
  }
  if (completion.code() != 0) errors_sent_.fetch_add(1);
  replies_.PostCompletion(std::move(completion));
}

void Session::StartSyncChannel(int fd) {
  absl::MutexLock lock(&dispatch_mu_);
  if (sync_closing_ || sync_fd_ >= 0) {
    close(fd);
    return;
  }
  {
    absl::MutexLock fd_lock(&sync_fd_mu_);
    if (sync_detached_) {
      close(fd);
      return;
    }
    sync_fd_ = fd;
  }
  sync_thread_ = std::thread(&Session::SyncLoop, this);
}

void Session::SyncLoop() {
  while (true) {
    std::string body;
    if (const v1::FrameResult r = v1::ReadFrame(sync_fd_, kMaxSyncFrameBytes, &body);
        r != v1::FrameResult::kOk) {
      // Closed by the client or by Close(); an oversized frame is worth a line.
      if (r == v1::FrameResult::kTooLarge) {
        LogWarning(absl::StrCat("session ", id_, ": a sync-channel frame exceeds ",
                                kMaxSyncFrameBytes, " bytes; closing the channel"));
      }
      shutdown(sync_fd_, SHUT_RDWR);  // the client's waiting call fails, never hangs
      return;
    }
    v1::SyncRequest request;
    if (!request.ParseFromString(body)) {
      LogWarning(absl::StrCat("session ", id_, ": a sync-channel frame is not a SyncRequest; "
                              "closing the channel"));
      shutdown(sync_fd_, SHUT_RDWR);
      return;
    }
    v1::Command& command = *request.mutable_command();
    const uint64_t seq = command.seq();
    commands_.fetch_add(1, std::memory_order_relaxed);
    absl::MutexLock lock(&dispatch_mu_);
    const uint64_t after = request.after_seq();
    const auto caught_up = [this, after]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_) {
      return sync_closing_ || (after == 0 || (has_seq_ && last_seq_ >= after));
    };
    dispatch_mu_.Await(absl::Condition(&caught_up));
    if (sync_closing_) return;
    if (seq == 0 || !v1::OwesReply(command)) {
      // Answered here, on the channel it came on: the client waits on it
      // (a reply by seq would go to the session stream).
      WriteSyncReply(ErrorCompletion(
          seq, CommandKindName(command),
          absl::InvalidArgumentError(absl::StrCat(
              "command ", seq, " (", CommandKindName(command),
              ") cannot use the sync channel: only a command with a nonzero seq that owes a "
              "reply can; send it on the session stream"))));
      continue;
    }
    sync_seq_.store(seq);
    try {
      Dispatch(std::move(command), /*ordered=*/false);
    } catch (const std::exception& e) {
      ReplyError(seq, "sync channel",
                 absl::InternalError(absl::StrCat("flagosd failed to handle the command: ",
                                                  e.what())));
    }
  }
}

void Session::WriteSyncReply(v1::Completion completion) {
  completion.set_errors_before(errors_sent_.load());
  // Without blocking; a client gone is seen by SyncLoop.
  replies_.PostSyncFrame(sync_fd_, v1::EncodeFrame(completion));
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

absl::Status Session::DrainDefaultStream(int device) {
  DeviceRuntime& runtime = backend_.runtime();
  absl::Status status = runtime.SynchronizeStream(device, 0);
  // Host functions of a stream run in order: once this one ran, every
  // earlier one of the session has.
  absl::Notification drained;
  if (runtime.LaunchHostFunc(device, 0, [&drained](absl::Status) { drained.Notify(); }).ok()) {
    drained.WaitForNotification();
  }
  return status;
}

void Session::Detach() {
  detached_.store(true, std::memory_order_release);
  {
    // A worker may still post a reply that ends the stream: not after this.
    absl::MutexLock lock(&end_mu_);
    stream_gone_ = true;
  }
  {
    // The sync channel goes with the client: its reads end and a sync send
    // the writer has in progress fails (the client may not read). The
    // descriptor stays open until Close. Not under dispatch_mu_, which the
    // sync thread holds while it runs a command itself.
    absl::MutexLock lock(&sync_fd_mu_);
    sync_detached_ = true;
    if (sync_fd_ >= 0) shutdown(sync_fd_, SHUT_RDWR);
  }
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
  // Ends SyncLoop's read. The descriptor stays open (so its number cannot
  // be reused by another session's connection) until no reply can come.
  if (sync_fd_ >= 0) shutdown(sync_fd_, SHUT_RDWR);
  if (sync_thread_.joinable()) sync_thread_.join();
  absl::flat_hash_map<std::pair<int, uint64_t>, std::unique_ptr<StreamState>> queues;
  {
    absl::MutexLock lock(&queues_mu_);
    queues.swap(queues_);
  }
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
  // Every record task has run or was dropped: releasing the table destroys
  // the backend events.
  events_.clear();
  // No reply can come now: the last ones go out (unless the stream is
  // gone), then the writer stops; only then is the sync fd closed.
  replies_.Finish();
  if (sync_fd_ >= 0) {
    close(sync_fd_);
    sync_fd_ = -1;
  }
  {
    absl::MutexLock lock(&staging_mu_);
    if (staging_ != nullptr && staging_registered_) {
      (void)runtime.HostUnregister(staging_->data());
      staging_registered_ = false;
    }
  }
  {
    // Every copy that used a region has completed: this unmaps them.
    absl::flat_hash_map<uint64_t, std::shared_ptr<PinnedRegion>> pinned;
    {
      absl::MutexLock lock(&pinned_mu_);
      pinned.swap(pinned_);
      pinned_total_bytes_ = 0;
    }
  }
  absl::WriterMutexLock lock(&memory_mu_);
  for (const Segment& segment : segments_.TakeAll()) {
    if (quotas_ != nullptr) quotas_->Release(id_, uid_, segment.device, segment.nbytes);
    // A segment other sessions imported lives on until they release it.
    if (grants_ != nullptr && !grants_->DropOwner(segment.device, segment.addr)) continue;
    if (!FreeMemory(segment)) continue;
    ++summary.segments;
    summary.bytes += segment.nbytes;
  }
  if (grants_ != nullptr) {
    // This session's holds on other sessions' segments: the last holder
    // frees.
    for (const Segment& segment : grants_->DropSession(id_)) FreeMemory(segment);
    absl::MutexLock imports_lock(&imports_mu_);
    import_holds_.clear();
    (void)imported_.TakeAll();
  }
  return summary;
}

}  // namespace flagos::daemon
