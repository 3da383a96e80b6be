// A FIFO of work for one (session, device, stream). Commands a client issues
// on one stream run in the order issued, one at a time; different streams
// run concurrently. A queue has no thread of its own: when it gets work it
// schedules itself once on its device's WorkerPool, whose worker runs its
// tasks (a bounded number per turn, then, if another queue waits for a
// worker, it goes to the back of the pool's ready list, so that a busy
// stream cannot hold a worker from the others) and releases it when it runs
// out. It asks the pool for the worker that
// ran its last turn (kept warm for it if free: WorkerPool::Schedule).
//
// A task must not block waiting for another queue's work (with a bounded
// pool every worker could be waiting). A task that depends on another queue
// is a gate (PushGate): the queue parks, holding no worker, until the gate's
// Resume is called, typically by the task it waits for.
//
// Thread safety: every method may be called from any thread (Stop not from
// one of this queue's tasks). Tasks run on the pool's workers, one at a
// time per queue, each after the one pushed before it has finished.
#ifndef FLAGOS_DAEMON_EXECUTION_STREAM_QUEUE_H_
#define FLAGOS_DAEMON_EXECUTION_STREAM_QUEUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "execution/device_activity.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {

class StreamQueue {
 private:
  struct Core;

 public:
  using Task = absl::AnyInvocable<void() &&>;

  // Lets a queue parked by a gate go on. Copyable; may be called from any
  // thread, any number of times (the first call counts), also after the
  // queue stopped or was destroyed (then it does nothing).
  class Resume {
   public:
    void operator()() const;

   private:
    friend class StreamQueue;
    Resume(std::weak_ptr<Core> core, uint64_t gate) : core_(std::move(core)), gate_(gate) {}
    std::weak_ptr<Core> core_;
    uint64_t gate_;
  };
  // Runs in the queue's turn like a task and is given the Resume of this
  // gate: nothing pushed after it runs until that Resume is called (at
  // once, inside the gate, when what it waits for is done already).
  using Gate = absl::AnyInvocable<void(Resume) &&>;

  // Tasks one worker runs of one queue before it lets other queues that wait
  // for a worker go first.
  static constexpr int kTasksPerTurn = 64;

  // `name` appears in log lines ("session 3 flagos:0 stream 7"). `pool`
  // (must outlive the queue) runs the tasks. `busy` (may be null; must
  // outlive the queue) is told when the queue starts running tasks after
  // being idle or parked, and when it runs out of them or parks.
  StreamQueue(std::string name, WorkerPool* pool, BusyClock* busy = nullptr);
  // Stop().
  ~StreamQueue();

  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;

  // Appends `task`. After Stop() the task is dropped unexecuted. A task that
  // throws is logged and does not stop the queue.
  void Push(Task task);
  // Appends `tasks` in order, as many Pushes would, with one lock and at most
  // one wake-up of a worker (a batch of commands for one stream costs one
  // wake-up rather than one per command). Leaves `tasks` empty.
  void PushAll(std::vector<Task>* tasks);
  // Appends `gate` (see Gate). A gate that throws is logged and resumes
  // the queue.
  void PushGate(Gate gate);

  // Drops every task not yet started (a parked queue's included), waits for
  // the running one to finish; nothing of this queue runs afterwards.
  // Idempotent. Must not be called from a task of this queue.
  void Stop();

  // Tasks pushed and not yet finished (a parked gate counts as one).
  uint64_t pending() const;

 private:
  // Runs up to kTasksPerTurn tasks of `core` on a worker.
  static void Drain(const std::shared_ptr<Core>& core);
  // Puts `core` on its pool's ready list.
  static void Schedule(const std::shared_ptr<Core>& core);

  // Shared with the pool's ready list and with Resumes, which may outlive
  // the queue.
  const std::shared_ptr<Core> core_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_STREAM_QUEUE_H_
