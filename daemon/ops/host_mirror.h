// Host copies of the device memory one cpu_fallback operator touches.
//
// The cpu_fallback route runs ATen's CPU kernel on host memory: every range
// of device memory the call names is mirrored into a host buffer, the kernel
// runs over the buffers, and the ranges it wrote are copied back. Ranges
// that overlap share one buffer, so arguments that alias each other (an
// in-place op whose output is a view of its input) alias on the host too.
//
// Completion (flagos/runtime.h): Fetch issues the device→host copies on the
// op's stream and waits for that stream, so the kernel reads bytes the
// device has finished writing. On a worker of a WorkerPool it waits inside a
// WorkerPool::Blocking scope: however slow the device, a waiting fallback op
// does not keep the pool's other streams from running. WriteBack issues the host→device copies and
// hands the buffers to a host function on the stream: they are released
// when the device has read them, never earlier.
//
// Some kernels write arguments their schema does not mark as written
// (native_batch_norm updates running_mean and running_var in place): a
// range read from the device is snapshotted before the kernel runs, and
// the bytes between the first and the last one the kernel changed are
// copied back too.
//
// A written range is copied back whole, from its first to its last byte:
// the bytes between the elements of a strided written tensor go back as
// they were read, which another stream writing those very bytes at the same
// time would lose (a race CUDA programs avoid anyway).
//
// Thread safety: one call's object, used by one thread.
#ifndef FLAGOS_DAEMON_OPS_HOST_MIRROR_H_
#define FLAGOS_DAEMON_OPS_HOST_MIRROR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

class HostMirror {
 public:
  // Device allocations are at least this aligned (runtime contract), so a
  // range widened down to it stays inside its allocation; host buffers are
  // as aligned, so every element keeps its natural alignment.
  static constexpr uint64_t kAlignment = 64;

  HostMirror(DeviceRuntime& runtime, int device, StreamHandle stream)
      : runtime_(runtime), device_(device), stream_(stream) {}

  // Adds [begin, begin + nbytes) (nbytes > 0). `read`: the kernel may read
  // bytes there (false for a dense output, which it only writes).
  // REQUIRES: before Fetch.
  void Add(uint64_t begin, uint64_t nbytes, bool read);
  // Merges the ranges, allocates their buffers, copies the ones read from
  // the device and waits for the stream.
  absl::Status Fetch();
  // The host address of device address `addr`. REQUIRES: after Fetch, and
  // `addr` inside an added range.
  char* Address(uint64_t addr) const;
  // The kernel may write [begin, begin + nbytes): copied back by WriteBack.
  void MarkWritten(uint64_t begin, uint64_t nbytes);
  // Snapshots the ranges read from the device, so that WriteBack finds the
  // bytes a kernel changed without saying so. Call right before the kernel.
  void Snapshot();
  // Issues the copies of every written range back to the device, then
  // releases the buffers once the stream has run them. Call once, last.
  absl::Status WriteBack();

  uint64_t bytes_fetched() const { return bytes_fetched_; }
  uint64_t bytes_written_back() const { return bytes_written_back_; }

 private:
  struct Range {
    uint64_t begin = 0;  // aligned down to kAlignment
    uint64_t end = 0;
    bool read = false;
    char* host = nullptr;      // into buffers_
    char* snapshot = nullptr;  // into buffers_: the bytes as read, or null
  };
  struct Written {
    uint64_t begin;
    uint64_t end;
  };
  struct AlignedDelete {
    void operator()(char* p) const { ::operator delete[](p, std::align_val_t{kAlignment}); }
  };
  using Buffer = std::unique_ptr<char[], AlignedDelete>;

  const Range* Find(uint64_t addr) const;
  char* Allocate(uint64_t nbytes);

  DeviceRuntime& runtime_;
  const int device_;
  const StreamHandle stream_;
  std::vector<Range> ranges_;  // sorted and disjoint after Fetch
  std::vector<Written> written_;
  std::vector<Buffer> buffers_;
  uint64_t bytes_fetched_ = 0;
  uint64_t bytes_written_back_ = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_HOST_MIRROR_H_
