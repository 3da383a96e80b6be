// Completion fences: running something once work issued before it has
// completed on the device, never by assuming a backend call's return means
// the device is done (backends/include/flagos/runtime.h).
//   - WhenStreamCompletes: once the work issued so far to one stream has
//     completed (a host function on the stream, or a synchronisation here
//     when the runtime has none);
//   - AfterQueuedWork: once every command already queued on some queues has
//     executed, the device has completed it and the host functions it
//     issued have returned (each stream drained: DrainStream), so the
//     replies those commands owe are posted before the action runs;
//   - ReadyGate: the gate a queue parks on until such a fence fires (a copy
//     from another device until the source device is done; a stream that
//     has issued a full launch window until the window before it completed:
//     execution/launch_window.h).
// None of them holds a worker while the device works, and none waits for
// another queue's work on a worker.
#ifndef FLAGOS_DAEMON_EXECUTION_COMPLETION_FENCES_H_
#define FLAGOS_DAEMON_EXECUTION_COMPLETION_FENCES_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "execution/stream_queue.h"
#include "execution/stream_table.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

// Runs `done` once the work issued so far to `stream` of `device` has
// completed: in a backend thread (LaunchHostFunc), or here after waiting for
// the stream when the runtime cannot launch host functions. `done` gets the
// stream's error, if any.
void WhenStreamCompletes(DeviceRuntime& runtime, int device, StreamHandle stream,
                         DeviceRuntime::HostFunc done);

// Runs `action` once every command already queued on `streams` has executed,
// the device has completed its work and the host functions issued on those
// streams before have returned (each stream drained: a download's reply and
// a copy's release are posted by such a function, and a sync's reply must
// come after them): in the calling thread when nothing is queued, else on
// the worker that finishes last. `action` gets the first error a stream
// drain reported. Host functions take no session lock, so the caller may
// hold dispatch_mu_.
// The caller must be the only thread that pushes to the queues (a session's
// dispatch): an idle queue then has issued all its work. The queues must
// outlive the tasks pushed to them (a stopped queue drops them unrun).
void AfterQueuedWork(DeviceRuntime& runtime, const std::vector<SessionStream*>& streams,
                     std::function<void(absl::Status)> action);

// What a parked queue waits for: a fence fired (MarkReady; for a copy from
// another device, every earlier command on the source device executed), and
// the Resume of the queue when it parked first (Park). Shared by the fence
// and the gate.
class ReadyGate {
 public:
  // The fence fired: resumes the parked queue, if it parked.
  void MarkReady();
  // The queue reached the gate: resumes at once when the fence fired, else
  // keeps `resume` for MarkReady.
  void Park(StreamQueue::Resume resume);

 private:
  absl::Mutex mu_;  // a leaf: resumes run after it is released
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<StreamQueue::Resume> resume_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_COMPLETION_FENCES_H_
