#include "execution/stream_queue.h"

#include <atomic>
#include <deque>
#include <exception>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "logging.h"

namespace flagos::daemon {

// One item of the FIFO: a task or a gate (exactly one is set).
struct StreamQueueItem {
  StreamQueue::Task task;
  StreamQueue::Gate gate;
};

struct StreamQueue::Core {
  Core(std::string name, WorkerPool* pool, BusyClock* busy)
      : name(std::move(name)), pool(pool), busy(busy) {}

  // Tells the busy clock that a burst starts / ends (once each).
  void BeginBurst() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (bursting) return;
    bursting = true;
    if (busy != nullptr) busy->Begin();
  }
  void EndBurst() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!bursting) return;
    bursting = false;
    if (busy != nullptr) busy->End();
  }

  const std::string name;
  WorkerPool* const pool;
  BusyClock* const busy;
  // The worker that ran the last turn: asked for again, so that a stream
  // stays on a warm thread while that one is free (WorkerPool::Schedule).
  std::atomic<int> last_worker{WorkerPool::kAnyWorker};

  // Before the BusyClock's lock (BeginBurst, EndBurst); the pool's is taken
  // only without it (Schedule), and tasks and gates run without it.
  mutable absl::Mutex mu;
  std::deque<StreamQueueItem> items ABSL_GUARDED_BY(mu);
  // A job of this queue is on the pool's ready list or running: nobody else
  // schedules it (one task of a queue at a time).
  bool scheduled ABSL_GUARDED_BY(mu) = false;
  // A task or gate is executing.
  bool running ABSL_GUARDED_BY(mu) = false;
  // A gate holds the queue until the Resume of gate number `gate` is called.
  bool parked ABSL_GUARDED_BY(mu) = false;
  uint64_t gate ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // The busy clock was told Begin and not yet End.
  bool bursting ABSL_GUARDED_BY(mu) = false;
};

StreamQueue::StreamQueue(std::string name, WorkerPool* pool, BusyClock* busy)
    : core_(std::make_shared<Core>(std::move(name), pool, busy)) {}

StreamQueue::~StreamQueue() { Stop(); }

void StreamQueue::Schedule(const std::shared_ptr<Core>& core) {
  core->pool->Schedule([core] { Drain(core); },
                       core->last_worker.load(std::memory_order_relaxed));
}

void StreamQueue::Push(Task task) {
  std::vector<Task> tasks;
  tasks.push_back(std::move(task));
  PushAll(&tasks);
}

void StreamQueue::PushAll(std::vector<Task>* tasks) {
  bool schedule = false;
  {
    absl::MutexLock lock(&core_->mu);
    if (!core_->stopping) {
      for (Task& task : *tasks) core_->items.push_back(StreamQueueItem{std::move(task), nullptr});
      schedule = !core_->scheduled && !core_->parked && !core_->items.empty();
      if (schedule) core_->scheduled = true;
    }
  }
  // Tasks dropped after Stop() are destroyed outside the lock.
  tasks->clear();
  if (schedule) Schedule(core_);
}

void StreamQueue::PushGate(Gate gate) {
  bool schedule = false;
  {
    absl::MutexLock lock(&core_->mu);
    if (core_->stopping) return;  // `gate` is destroyed after the lock is released
    core_->items.push_back(StreamQueueItem{nullptr, std::move(gate)});
    schedule = !core_->scheduled && !core_->parked;
    if (schedule) core_->scheduled = true;
  }
  if (schedule) Schedule(core_);
}

void StreamQueue::Resume::operator()() const {
  std::shared_ptr<Core> core = core_.lock();
  if (core == nullptr) return;
  bool schedule = false;
  {
    absl::MutexLock lock(&core->mu);
    if (!core->parked || core->gate != gate_) return;  // resumed already, or stopped
    core->parked = false;
    // The worker still inside the gate goes on by itself (scheduled).
    schedule = !core->scheduled && !core->stopping && !core->items.empty();
    if (schedule) core->scheduled = true;
  }
  if (schedule) Schedule(core);
}

void StreamQueue::Drain(const std::shared_ptr<Core>& core) {
  core->last_worker.store(core->pool->CurrentWorker(), std::memory_order_relaxed);
  for (int ran = 0;; ++ran) {
    // After a turn's worth, give the worker up only if another job waits
    // for one: handing the queue to another worker when none does would
    // move the stream to a cold thread (and leave this one's OpenMP team
    // spinning beside it) for nothing.
    bool yield_turn = false;
    if (ran >= kTasksPerTurn) {
      yield_turn = core->pool->has_waiting_jobs();
      if (!yield_turn) ran = 0;
    }
    StreamQueueItem item;
    uint64_t gate = 0;
    {
      absl::MutexLock lock(&core->mu);
      if (core->stopping || core->parked || core->items.empty()) {
        core->scheduled = false;
        core->EndBurst();
        return;
      }
      if (yield_turn) break;  // still scheduled: requeued below
      core->BeginBurst();
      item = std::move(core->items.front());
      core->items.pop_front();
      core->running = true;
      if (item.gate != nullptr) {
        core->parked = true;
        gate = ++core->gate;
      }
    }
    bool gate_failed = false;
    try {
      if (item.gate != nullptr) {
        std::move(item.gate)(Resume(core, gate));
      } else {
        std::move(item.task)();
      }
    } catch (const std::exception& e) {
      gate_failed = item.gate != nullptr;
      LogError(absl::StrCat(core->name, ": a task threw ", e.what(), "; the queue continues"));
    } catch (...) {
      gate_failed = item.gate != nullptr;
      LogError(absl::StrCat(core->name,
                            ": a task threw a non-standard exception; the queue continues"));
    }
    item = StreamQueueItem();  // captures die outside the lock
    absl::MutexLock lock(&core->mu);
    core->running = false;
    if (gate_failed && core->gate == gate) core->parked = false;
  }
  // A turn's worth ran and more is queued: let the pool's other ready
  // queues go first. The burst goes on.
  Schedule(core);
}

void StreamQueue::Stop() {
  std::deque<StreamQueueItem> dropped;
  {
    absl::MutexLock lock(&core_->mu);
    core_->stopping = true;
    core_->parked = false;  // a later Resume finds nothing to resume
    dropped.swap(core_->items);
  }
  // Destroy dropped tasks outside the lock: their captures may be large
  // (and their destructors may take other locks).
  dropped.clear();
  absl::MutexLock lock(&core_->mu);
  core_->mu.Await(absl::Condition(
      +[](Core* core) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core->mu) { return !core->running; },
      core_.get()));
  core_->EndBurst();
}

uint64_t StreamQueue::pending() const {
  absl::MutexLock lock(&core_->mu);
  return core_->items.size() + ((core_->running || core_->parked) ? 1 : 0);
}

}  // namespace flagos::daemon
