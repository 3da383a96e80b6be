// The launch window of one stream queue: how far its commands may run ahead
// of the device. A backend call returns once the work is issued; without a
// bound a queue would hand its device everything the client sent (thousands
// of kernels a replay loop issues in a millisecond), and what is on the
// device can no longer be cancelled: a client that dies, or a session that
// closes, would hold its memory until the device had run all of it.
//
// Commands are counted in windows of kOpsPerWindow. At the end of each
// window the queue passes a gate that issues a fence for that window (a
// host function on the stream: WhenStreamCompletes) and parks, holding no
// worker, until the fence of the window before has fired. So at most two
// windows are on the device at once: one running, the next issued behind it
// (the device is never left idle waiting for the queue), and what lies
// beyond them stays in the queue, where Stop drops it unrun. On a runtime
// whose work completes at return (the CPU backend) the fence fires at once
// and the gate costs one host-function call per window.
//
// Thread safety: Count is called only by the thread that pushes to the
// queue (the session's dispatch), as StreamQueue::Push; the gates it pushes
// run on the queue's workers and the fences in backend threads.
#ifndef FLAGOS_DAEMON_EXECUTION_LAUNCH_WINDOW_H_
#define FLAGOS_DAEMON_EXECUTION_LAUNCH_WINDOW_H_

#include <cstdint>
#include <memory>

#include "execution/stream_queue.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

class ReadyGate;  // execution/completion_fences.h

class LaunchWindow {
 public:
  // Commands in one window (a replayed graph counts as its commands).
  static constexpr uint64_t kOpsPerWindow = 256;

  // The window of `queue`, whose work goes to `stream` of `device` on
  // `runtime` (which must outlive the queue's tasks).
  LaunchWindow(DeviceRuntime* runtime, int device, StreamHandle stream, StreamQueue* queue)
      : runtime_(runtime), device_(device), stream_(stream), queue_(queue) {}

  // To be called before pushing a task that issues `ops` commands to the
  // queue: pushes the gate that ends the window first when these commands
  // would overflow it.
  void Count(uint64_t ops) {
    if (ops_in_window_ == 0 || ops_in_window_ + ops <= kOpsPerWindow) {
      ops_in_window_ += ops;
      return;
    }
    EndWindow(ops);
  }

 private:
  // Pushes the gate that ends the full window; `ops` open the next one.
  void EndWindow(uint64_t ops);

  DeviceRuntime* const runtime_;
  const int device_;
  const StreamHandle stream_;
  StreamQueue* const queue_;
  uint64_t ops_in_window_ = 0;
  // Fires once the previous window's work has completed on the device.
  std::shared_ptr<ReadyGate> previous_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_LAUNCH_WINDOW_H_
