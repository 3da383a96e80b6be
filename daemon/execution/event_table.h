// A session's events (flagos.proto RecordEvent ... DestroyEvent): client-
// minted event ids, each naming its latest record, and the issued state of
// every record.
//
// One record_event makes one EventRecord; an event id names its latest
// record. The record's task on its stream queue creates and records the
// backend event, then marks the record issued (MarkIssued) and runs what
// waited for it. With the CPU backend an issued record has completed.
//
// Thread safety: the id table (Latest, Add, Erase, Clear, size, contains) is
// the session's reading thread's only; the issued state (WhenIssued,
// MarkIssued, Abandon, IssuedState) may be used from any thread. mu_ is a
// leaf: the actions it hands back run after it is released.
#ifndef FLAGOS_DAEMON_EXECUTION_EVENT_TABLE_H_
#define FLAGOS_DAEMON_EXECUTION_EVENT_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

// Events (client-minted ids) one session may have live at once.
inline constexpr size_t kMaxEventsPerSession = 1u << 18;

struct EventRecord {
  EventRecord(DeviceRuntime* runtime, int device, bool timing)
      : runtime(runtime), device(device), timing(timing) {}
  ~EventRecord();  // destroys the backend event
  EventRecord(const EventRecord&) = delete;
  EventRecord& operator=(const EventRecord&) = delete;

  DeviceRuntime* const runtime;
  const int device;
  const bool timing;
  // Guarded by the EventTable's mutex; `handle` is written once, before
  // `issued`, so that who saw `issued` (or runs in on_issued) reads it
  // without the lock.
  bool issued = false;
  EventHandle handle = 0;  // 0: the backend record failed (reported then)
  std::vector<std::function<void()>> on_issued;
};

class EventTable {
 public:
  struct State {
    bool issued = false;
    EventHandle handle = 0;
  };

  explicit EventTable(DeviceRuntime* runtime) : runtime_(runtime) {}

  EventTable(const EventTable&) = delete;
  EventTable& operator=(const EventTable&) = delete;

  // ---- the id table (reading thread only).
  // The latest record of `event`; nullptr when it was never recorded (or
  // destroyed since).
  std::shared_ptr<EventRecord> Latest(uint64_t event) const;
  bool contains(uint64_t event) const { return events_.contains(event); }
  size_t size() const { return events_.size(); }
  // A new record of `event` on `device`, which becomes its latest.
  std::shared_ptr<EventRecord> Add(uint64_t event, int device, bool timing);
  // Forgets `event` (commands that hold its record keep it); false when it
  // does not exist.
  bool Erase(uint64_t event) { return events_.erase(event) != 0; }
  // Forgets every event: the records no command holds destroy their
  // backend events.
  void Clear() { events_.clear(); }

  // ---- issued state (any thread).
  // Runs `action` once every record is issued: now, in the calling thread,
  // when they all are, else on the thread issuing the last one. Dropped
  // unrun when a record is abandoned.
  void WhenIssued(const std::vector<std::shared_ptr<EventRecord>>& records,
                  std::function<void()> action);
  // Marks `record` issued with `handle` (0: the record failed) and hands
  // back what waited for it, for the caller to run.
  std::vector<std::function<void()>> MarkIssued(EventRecord& record, EventHandle handle);
  // Marks a record whose task will never run issued (without a backend
  // event) and drops its on_issued actions, outside the lock, unrun.
  void Abandon(EventRecord& record);
  State IssuedState(const EventRecord& record);

 private:
  DeviceRuntime* const runtime_;
  // Guards every EventRecord's issued state.
  absl::Mutex mu_;
  // Event id → its latest record. Reading thread only.
  absl::flat_hash_map<uint64_t, std::shared_ptr<EventRecord>> events_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_EVENT_TABLE_H_
