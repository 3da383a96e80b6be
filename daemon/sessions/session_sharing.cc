// Session: device memory shared between sessions (export_memory,
// import_memory, release_import, query_export over MemoryGrants).
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logging.h"
#include "protocol/command_validation.h"
#include "sessions/session.h"

namespace flagos::daemon {

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

}  // namespace flagos::daemon
