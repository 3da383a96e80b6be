// The stream queues of one session: one StreamQueue per (device, stream) the
// session used, created on first use, each with its backend stream (none for
// stream 0, the device's default stream, shared with other sessions).
//
// Entries live until TakeAll (the session's Close): a pointer Get or Find
// returned stays valid until then, so callers use it without the table's
// lock. Thread safety: every method may be called from any thread; mu_ is a
// leaf (nothing else is locked under it, and nothing waits while it is held).
#ifndef FLAGOS_DAEMON_EXECUTION_STREAM_TABLE_H_
#define FLAGOS_DAEMON_EXECUTION_STREAM_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "execution/device_activity.h"
#include "execution/launch_window.h"
#include "execution/stream_queue.h"
#include "execution/worker_pool.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

// Streams (FIFO queues on their device's worker pool) one session may use,
// all devices together.
inline constexpr int kMaxStreamsPerSession = 64;

// One (device, stream) of a session.
struct SessionStream {
  int device = 0;
  StreamHandle backend_stream = 0;  // 0: the device's default stream
  std::unique_ptr<StreamQueue> queue;
  // How far the queue's commands may run ahead of the device (counted by
  // the thread that pushes to the queue); set with the queue.
  std::optional<LaunchWindow> window;
};

class StreamTable {
 public:
  using Map = absl::flat_hash_map<std::pair<int, uint64_t>, std::unique_ptr<SessionStream>>;

  // `runtime`, `pools` (one per device, indexed by device) and `activity`
  // (may be null: no busy time) must outlive the table. `session_id` names
  // the queues.
  StreamTable(uint64_t session_id, DeviceRuntime* runtime, std::vector<WorkerPool*> pools,
              DeviceActivity* activity);

  StreamTable(const StreamTable&) = delete;
  StreamTable& operator=(const StreamTable&) = delete;

  // The queue for (device, stream), created on first use (with a backend
  // stream unless stream is 0). RESOURCE_EXHAUSTED beyond
  // kMaxStreamsPerSession.
  absl::StatusOr<SessionStream*> Get(int device, uint64_t stream);
  // The queue for (device, stream) if that stream was used, else null.
  SessionStream* Find(int device, uint64_t stream) const;
  // Every queue of `device` (of every device when device < 0).
  std::vector<SessionStream*> OnDevice(int device) const;
  size_t size() const;
  // Hands every queue over (the table is empty after); pointers returned
  // before stay valid as long as the caller keeps the map.
  Map TakeAll();

 private:
  const uint64_t session_id_;
  DeviceRuntime* const runtime_;
  const std::vector<WorkerPool*> pools_;
  DeviceActivity* const activity_;

  mutable absl::Mutex mu_;
  Map streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_STREAM_TABLE_H_
