#include "execution/event_table.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {

EventRecord::~EventRecord() {
  if (handle == 0) return;
  if (absl::Status s = runtime->DestroyEvent(device, handle); !s.ok()) {
    LogWarning(absl::StrCat("destroying an event on ", DeviceName(device), " failed: ",
                            s.message()));
  }
}

std::shared_ptr<EventRecord> EventTable::Latest(uint64_t event) const {
  auto it = events_.find(event);
  return it == events_.end() ? nullptr : it->second;
}

std::shared_ptr<EventRecord> EventTable::Add(uint64_t event, int device, bool timing) {
  auto record = std::make_shared<EventRecord>(runtime_, device, timing);
  events_[event] = record;
  return record;
}

void EventTable::WhenIssued(const std::vector<std::shared_ptr<EventRecord>>& records,
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
      absl::MutexLock lock(&mu_);
      issued = record->issued;
      if (!issued) record->on_issued.push_back(arrive);
    }
    if (issued) arrive();
  }
  arrive();
}

std::vector<std::function<void()>> EventTable::MarkIssued(EventRecord& record,
                                                          EventHandle handle) {
  std::vector<std::function<void()>> actions;
  absl::MutexLock lock(&mu_);
  record.handle = handle;
  record.issued = true;
  actions.swap(record.on_issued);
  return actions;
}

void EventTable::Abandon(EventRecord& record) {
  std::vector<std::function<void()>> actions;
  {
    absl::MutexLock lock(&mu_);
    record.issued = true;
    actions.swap(record.on_issued);
  }
  // `actions` (which may hold the last references to records) die here,
  // outside the lock, unrun.
}

EventTable::State EventTable::IssuedState(const EventRecord& record) {
  absl::MutexLock lock(&mu_);
  return State{record.issued, record.handle};
}

}  // namespace flagos::daemon
