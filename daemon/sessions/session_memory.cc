// Session: device memory (allocate, free, the frees waiting behind queued
// work, the range check every command's addresses pass) and the host
// regions a client attaches (staging, pinned).
#include <unistd.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logging.h"
#include "protocol/command_validation.h"
#include "sessions/session.h"

namespace flagos::daemon {
namespace {

// Compares without stopping at the first difference.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

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
    // Blocks with dispatch_mu_ held, which the lock order declares: a free
    // executes on a worker (or a backend thread) without dispatch_mu_.
    if (pending_frees_.WaitForNone()) ptr = runtime.Malloc(device, nbytes);
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
  // Numbered, so that a sync sent after it replies only once it ran.
  const PendingFrees::Ticket ticket = pending_frees_.Add(device);
  AfterQueuedWork(device, [this, ticket, release = std::move(release)](
                              absl::Status /*errors are the commands'*/) {
    release();
    pending_frees_.Done(ticket);
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

absl::Status Session::CheckRange(const v1::Command& command, int device, uint64_t addr,
                                 uint64_t nbytes) const {
  if (segments_.Contains(device, addr, nbytes)) return absl::OkStatus();
  if (imported_.Contains(device, addr, nbytes)) return absl::OkStatus();
  return OutsideSegmentsError(command.seq(), CommandKindName(command), addr, nbytes, device);
}

uint64_t Session::staging_bytes() const { return regions_.staging_bytes(); }

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
  if (absl::Status s = regions_.AttachStaging(attach, fd); !s.ok()) return s;
  LogInfo(absl::StrCat("session ", id_, " (pid ", pid_, "): staging region of ",
                       regions_.staging_bytes(), " bytes attached"));
  return absl::OkStatus();
}

absl::Status Session::AttachPinned(const v1::StagingAttach& attach, int fd) {
  if (!SameSecret(attach.token(), staging_token_)) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "the pinned-region attach for session ", id_,
        " carries the wrong token; only the process that opened the session may attach"));
  }
  return regions_.AttachPinned(attach, fd);
}

absl::Status Session::AttachSyncChannel(const v1::SyncAttach& attach) {
  if (!SameSecret(attach.token(), staging_token_)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the sync-channel attach for session ", id_,
        " carries the wrong token; only the process that opened the session may attach"));
  }
  if (sync_.started()) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id_, " has a sync channel already"));
  }
  LogInfo(absl::StrCat("session ", id_, " (pid ", pid_, "): sync channel attached over TCP"));
  return absl::OkStatus();
}

uint64_t Session::pinned_bytes() const { return regions_.pinned_bytes(); }

void Session::ScheduleReleasePinned(uint64_t seq, uint64_t region) {
  // Copies still queued or in flight hold their own reference; the mapping
  // goes when the last of them completes. It follows every device's
  // commands, so a sync on any device sent after it waits for it.
  const PendingFrees::Ticket ticket = pending_frees_.Add(-1);
  AfterQueuedWork(-1, [this, seq, region, ticket](absl::Status /*errors are the commands'*/) {
    if (!regions_.ReleasePinned(region)) {
      ReplyError(seq, "release_pinned",
                 absl::NotFoundError(absl::StrCat("session ", id_, " has no pinned region ",
                                                  region, " to release")));
    }
    pending_frees_.Done(ticket);
  });
}

void Session::FreeAllMemory(CloseSummary* summary) {
  absl::WriterMutexLock lock(&memory_mu_);
  for (const Segment& segment : segments_.TakeAll()) {
    if (quotas_ != nullptr) quotas_->Release(id_, uid_, segment.device, segment.nbytes);
    // A segment other sessions imported lives on until they release it.
    if (grants_ != nullptr && !grants_->DropOwner(segment.device, segment.addr)) continue;
    if (!FreeMemory(segment)) continue;
    ++summary->segments;
    summary->bytes += segment.nbytes;
  }
  if (grants_ != nullptr) {
    // This session's holds on other sessions' segments: the last holder
    // frees.
    for (const Segment& segment : grants_->DropSession(id_)) FreeMemory(segment);
    absl::MutexLock imports_lock(&imports_mu_);
    import_holds_.clear();
    (void)imported_.TakeAll();
  }
}

}  // namespace flagos::daemon
