// The kunlunxin runtime's bookkeeping of one device: its live allocations
// (pointer → size), its streams and its events, each behind a small
// integer handle mapped to the vendor's XPUStream / XPUEvent. No vendor call
// is made here: the runtime makes them, outside this class's lock.
//
// Thread safety: every method may be called from any thread. Streams and
// events are handed out as shared_ptr, so one being destroyed stays valid
// memory for a caller still holding it.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XPU_DEVICE_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XPU_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "flagos/runtime.h"
#include "host_func_queue.h"

namespace flagos::kunlunxin {

// "kunlunxin device N: ", the start of every message about one device.
std::string DevicePrefix(int device);
// "0x1f00".
std::string HexAddress(uint64_t value);

// One stream of one device: the vendor's handle (nullptr: the device's NULL
// stream) and the queue of its host functions.
struct XpuStream {
  explicit XpuStream(void* vendor_handle) : handle(vendor_handle) {}

  // Counts a piece of work once the vendor accepted it.
  void MarkIssued() { issued.fetch_add(1, std::memory_order_acq_rel); }
  // Everything counted up to `upto` (an earlier `issued`) has completed.
  void MarkCompleted(uint64_t upto);
  // True when the work counted in `issued_now` is known complete.
  bool KnownIdle(uint64_t issued_now) const {
    return completed.load(std::memory_order_acquire) >= issued_now;
  }

  void* const handle;
  HostFuncQueue host_funcs;
  // Work issued, and the highest issue count known complete (set by a
  // successful synchronisation or query): a stream seen idle with nothing
  // issued since is idle without asking the device.
  std::atomic<uint64_t> issued{0};
  std::atomic<uint64_t> completed{0};
};

struct XpuEvent {
  XpuEvent(void* vendor_handle, bool enable_timing)
      : handle(vendor_handle), timing(enable_timing) {}

  void* const handle;
  const bool timing;  // accepted and remembered; libxpurt has no elapsed time
  // Set once a record was issued: an event never recorded is complete
  // without asking the vendor (as in CUDA).
  std::atomic<bool> recorded{false};

  // The stream of the latest record and its issue count then: once the
  // record is seen complete, so is that stream's work up to it.
  void Recorded(const std::shared_ptr<XpuStream>& stream) {
    absl::MutexLock lock(&mu);
    last_stream = stream;
    last_issue = stream->issued.load(std::memory_order_acquire);
  }
  void SeenComplete() {
    absl::MutexLock lock(&mu);
    if (std::shared_ptr<XpuStream> stream = last_stream.lock()) stream->MarkCompleted(last_issue);
  }
  absl::Mutex mu;
  std::weak_ptr<XpuStream> last_stream ABSL_GUARDED_BY(mu);
  uint64_t last_issue ABSL_GUARDED_BY(mu) = 0;
};

class XpuDevice {
 public:
  // `total`: main memory in bytes (attribute 5); `model`: attribute 4.
  XpuDevice(int index, uint64_t total, uint64_t model);

  XpuDevice(const XpuDevice&) = delete;
  XpuDevice& operator=(const XpuDevice&) = delete;

  int index() const { return index_; }
  uint64_t total() const { return total_; }
  uint64_t model() const { return model_; }

  // ---- allocations
  // INTERNAL when `ptr` is already live (the vendor handed it out twice).
  absl::Status Track(DevicePtr ptr, uint64_t nbytes);
  // Removes the allocation starting at `ptr`: its size, or NOT_FOUND.
  absl::StatusOr<uint64_t> Untrack(DevicePtr ptr);
  // OK when [ptr, ptr + nbytes) lies inside one live allocation, else
  // INVALID_ARGUMENT naming `what` ("source", "destination").
  absl::Status CheckRange(DevicePtr ptr, uint64_t nbytes, absl::string_view what) const;
  // Bytes and number of allocations held.
  std::pair<uint64_t, size_t> Allocated() const;
  // Forgets every allocation and returns them (for the runtime's shutdown).
  std::vector<DevicePtr> TakeAllocations();

  // ---- streams (0 is the NULL stream, always there)
  absl::StatusOr<std::shared_ptr<XpuStream>> FindStream(StreamHandle stream) const;
  StreamHandle AddStream(std::shared_ptr<XpuStream> stream);
  // NOT_FOUND for an unknown stream; never removes stream 0.
  absl::StatusOr<std::shared_ptr<XpuStream>> RemoveStream(StreamHandle stream);
  // The NULL stream first, then the created ones.
  std::vector<std::shared_ptr<XpuStream>> Streams() const;
  std::vector<std::shared_ptr<XpuStream>> TakeCreatedStreams();

  // ---- events
  EventHandle AddEvent(std::shared_ptr<XpuEvent> event);
  absl::StatusOr<std::shared_ptr<XpuEvent>> FindEvent(EventHandle event) const;
  absl::StatusOr<std::shared_ptr<XpuEvent>> RemoveEvent(EventHandle event);
  std::vector<std::shared_ptr<XpuEvent>> TakeEvents();

 private:
  absl::Status UnknownStream(StreamHandle stream) const;
  absl::Status UnknownEvent(EventHandle event) const;

  // Constant after construction.
  const int index_;
  const uint64_t total_;
  const uint64_t model_;
  const std::shared_ptr<XpuStream> null_stream_;

  mutable absl::Mutex mu_;
  std::map<DevicePtr, uint64_t> allocations_ ABSL_GUARDED_BY(mu_);
  uint64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<StreamHandle, std::shared_ptr<XpuStream>> streams_ ABSL_GUARDED_BY(mu_);
  StreamHandle next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<EventHandle, std::shared_ptr<XpuEvent>> events_ ABSL_GUARDED_BY(mu_);
  EventHandle next_event_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace flagos::kunlunxin

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XPU_DEVICE_H_
