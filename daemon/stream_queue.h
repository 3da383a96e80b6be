// A FIFO of work for one (session, device, stream), executed in order by
// its own worker thread. Commands a client issues on one stream run in the
// order issued; different streams run concurrently.
//
// Thread safety: Push and Stop may be called from any thread. Tasks run on
// the worker thread only, one at a time.
#ifndef FLAGOS_DAEMON_STREAM_QUEUE_H_
#define FLAGOS_DAEMON_STREAM_QUEUE_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "device_activity.h"

namespace flagos::daemon {

class StreamQueue {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // Starts the worker. `name` appears in log lines ("session 3 flagos:0 stream 7").
  // `busy` (may be null; must outlive the queue) is told when the worker
  // starts running tasks after being idle and when it runs out of them.
  explicit StreamQueue(std::string name, BusyClock* busy = nullptr);
  // Stop().
  ~StreamQueue();

  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;

  // Appends `task`. After Stop() the task is dropped unexecuted. A task that
  // throws is logged and does not stop the queue.
  void Push(Task task);
  // Appends `tasks` in order, as many Pushes would, with one lock and at most
  // one wake-up of the worker (a batch of commands for one stream costs one
  // wake-up rather than one per command). Leaves `tasks` empty.
  void PushAll(std::vector<Task>* tasks);

  // Drops every task not yet started, waits for the running one to finish
  // and joins the worker. Idempotent. Must not be called from a task.
  void Stop();

  // Tasks pushed and not yet finished.
  uint64_t pending() const;

 private:
  void Run();

  const std::string name_;
  BusyClock* const busy_;

  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool running_task_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread worker_;  // last: started when everything above exists
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_STREAM_QUEUE_H_
