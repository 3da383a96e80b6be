// Session: events (record_event, wait_event, query_event, synchronize_event,
// elapsed_time, destroy_event) over the session's EventTable.
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "protocol/command_validation.h"
#include "sessions/session.h"

namespace flagos::daemon {
namespace {

absl::Status CheckEventId(uint64_t seq, absl::string_view kind, uint64_t event) {
  if (event != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "command ", seq, " (", kind, ") names event 0; event ids are minted by the client and > 0"));
}

}  // namespace

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
    if (record_ != nullptr) session_->events_.Abandon(*record_);
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
  std::vector<std::function<void()>> actions = events_.MarkIssued(record, handle);
  if (!status.ok()) ReplyError(seq, "record_event", status);
  for (std::function<void()>& action : actions) action();
}

void Session::RecordEvent(const v1::Command& command) {
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
  absl::StatusOr<SessionStream*> state = streams_.Get(command.device(), command.stream());
  if (!state.ok()) return ReplyError(seq, "record_event", state.status());
  std::shared_ptr<EventRecord> record =
      events_.Add(event, command.device(), command.record_event().enable_timing());
  (*state)->queue->Push(RecordTask(this, seq, std::move(record), (*state)->backend_stream));
}

void Session::WaitEvent(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const uint64_t event = command.wait_event().event();
  if (absl::Status s = CheckEventId(seq, "wait_event", event); !s.ok()) {
    return ReplyError(seq, "wait_event", s);
  }
  std::shared_ptr<EventRecord> record = events_.Latest(event);
  if (record == nullptr) return;  // never recorded: nothing to wait for
  absl::StatusOr<SessionStream*> state = streams_.Get(command.device(), command.stream());
  if (!state.ok()) return ReplyError(seq, "wait_event", state.status());
  const int device = command.device();
  const StreamHandle backend_stream = (*state)->backend_stream;
  // The queue parks until the record is issued (by its own stream's queue);
  // the worker issuing it resumes this one.
  (*state)->queue->PushGate([this, record](StreamQueue::Resume resume) {
    events_.WhenIssued({record}, [resume] { resume(); });
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
  if (std::shared_ptr<EventRecord> record = events_.Latest(event)) {
    const EventTable::State state = events_.IssuedState(*record);
    if (!state.issued) {
      ready = false;
    } else if (state.handle != 0) {
      absl::StatusOr<bool> done = backend_.runtime().QueryEvent(record->device, state.handle);
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
  std::shared_ptr<EventRecord> record = events_.Latest(event);
  if (record == nullptr) return Reply(Done(seq));
  events_.WhenIssued({record}, [this, seq, record] {
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
    records[i] = events_.Latest(ids[i]);
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
  events_.WhenIssued({start, end}, [this, seq, start, end] {
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
  if (!events_.Erase(event)) {
    ReplyError(seq, "destroy_event",
               absl::NotFoundError(absl::StrCat("command ", seq, " (destroy_event): event ",
                                                event,
                                                " does not exist (never recorded, or destroyed "
                                                "already)")));
  }
}

}  // namespace flagos::daemon
