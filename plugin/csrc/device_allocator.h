// FlagosDeviceAllocator: the c10 caching allocator of flagos device memory.
//
// The daemon hands the session segments (AllocateSegment, a synchronous
// call); tensors are carved out of them here as blocks, without a round trip.
// Freed blocks return to a per-device pool as they are. An allocation takes
// the smallest free block that fits, of one size the lowest address, split
// when larger; only when none fits are adjacent free blocks merged (then a
// new segment asked for if still none fits), and before segments are given
// back. So a loop that allocates the same sizes in the same order each step
// gets the same blocks each step, and sends the same op calls byte for
// byte, which flagosd runs prepared (daemon/sessions/repeated_op_calls.h);
// merging each block with its free neighbours when freed had a training
// step's tensors land elsewhere each step. empty_cache() gives wholly free
// segments back (FreeSegment, ordered after every earlier command on the
// device).
//
// Stream-aware, like CUDA's: a segment, and every block carved from it,
// belongs to the stream that was current when the segment was allocated,
// and a free block is reused only by allocations on that stream, whose work
// the daemon runs after the work of the block's previous user. A tensor used
// on other streams too must say so with Tensor.record_stream(s)
// (recordStream): when such a block is freed, the allocator enqueues, for
// each recorded stream, an event recorded there and waited for on the
// block's stream (then destroyed), so later work on the block's stream runs
// after the other streams' work up to the free, and the block goes back to
// its pool at once, with no round trip.
//
// When the session is lost (runtime.h) its blocks and segments are
// forgotten and the statistics start again from zero; the lost session's
// DataPtrs keep their generation, which CheckGeneration refuses.
//
// Small requests (≤ 1 MiB) share 2 MiB segments; larger ones get segments
// rounded up to 2 MiB. When a segment cannot be had, the cache is emptied
// and the allocation retried once; then torch.OutOfMemoryError is raised.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>

namespace torch_fl {

class FlagosDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Allocates on an explicit device (allocate() uses the current device).
  c10::DataPtr AllocateOn(int device, size_t nbytes);
  // The device owning `ptr`, or -1 if it is not a live flagos allocation.
  int DeviceOf(const void* ptr);
  // The session generation (runtime.h) whose memory `ptr` names: a block of
  // this allocator, a block shared with other processes, or a storage
  // opened from another process's grant; 0 for none (an empty storage).
  uint64_t GenerationOf(const c10::DataPtr& ptr);
};

FlagosDeviceAllocator& DeviceAllocator();

// Graph pools (graph_capture.h): a pool's key has kGraphPoolBit set (no
// stream id does). While a capture runs on a stream, allocations there take
// blocks of the graph's pool, which only later allocations of that pool
// reuse; the pool's segments are not given back (empty_cache) while a graph
// holds it. Hold when a graph starts using the pool, release when it is
// reset.
inline constexpr uint64_t kGraphPoolBit = uint64_t{1} << 63;
void HoldGraphPool(uint64_t key);
void ReleaseGraphPool(uint64_t key);

}  // namespace torch_fl
