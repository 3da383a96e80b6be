// The host functions of one stream, run in issue order by one thread of
// their own (started by the first Push).
//
// An entry is a wait — blocks until the device has reached the point the
// function follows (the kunlunxin runtime: xpu_event_wait on an event
// recorded on the stream) and returns the device's status — and the
// function, run with that status. Entries run one at a time, in push
// order, with no lock of the queue held, so a function may call back into
// the runtime (Free, LaunchHostFunc on another stream, ...).
//
// Thread safety: any thread may Push; Drain and the destructor must not be
// called from a function this queue runs (they wait for that function).
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_HOST_FUNC_QUEUE_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_HOST_FUNC_QUEUE_H_

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace flagos::kunlunxin {

class HostFuncQueue {
 public:
  using Wait = absl::AnyInvocable<absl::Status() &&>;
  using Func = absl::AnyInvocable<void(absl::Status) &&>;

  HostFuncQueue() = default;
  // Runs every pushed entry, then stops the thread.
  ~HostFuncQueue();

  HostFuncQueue(const HostFuncQueue&) = delete;
  HostFuncQueue& operator=(const HostFuncQueue&) = delete;

  // Queues `fn` to run with the status `wait` returns, after every entry
  // pushed before it.
  void Push(Wait wait, Func fn);

  // Blocks until every entry pushed before the call has run (the thread
  // stays for later pushes). Entries pushed meanwhile are not waited for,
  // so a stream other threads keep feeding cannot hold it up.
  // REQUIRES: !OnQueueThread().
  void Drain();

  // True in the thread that runs this queue's functions.
  bool OnQueueThread() const;

 private:
  struct Entry {
    Wait wait;
    Func fn;
  };

  void Serve();
  bool HasWorkOrStops() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Entries pushed, and entries whose function has returned (and whose
  // captures are destroyed), since construction: Drain waits for the count
  // of pushes it saw.
  uint64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  std::thread::id thread_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::kunlunxin

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_HOST_FUNC_QUEUE_H_
