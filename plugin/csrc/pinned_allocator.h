// FlagosPinnedAllocator: the caching allocator of pinned host memory
// (pin_memory(), torch.empty(..., pin_memory=True), DataLoader(pin_memory=
// True)), flagos's equivalent of CUDA's page-locked memory.
//
// Each block is a pinned region of the session (Connection::AllocatePinned):
// shared memory that only this process and the daemon map, so the daemon
// copies straight from and into it, and the client copies nothing. Over TCP
// (or with staging off) a block is ordinary memory with the same copy
// semantics. The caching is torch's CachingHostAllocatorImpl, as CUDA's
// CachingHostAllocator uses it: sizes round up to powers of two, and a freed
// block that asynchronous copies used (recorded with RecordUse) is reused
// only once an event recorded on each of those streams at the free has
// completed. empty_cache() gives free blocks back (the daemon unmaps each
// region after every earlier command has completed).
//
// A block outlives a lost session (runtime.h): its bytes are this
// process's, so it stays usable as ordinary memory (FindPinned reports
// region 0 for it: copies go through staging), and its region is unmapped
// by the lost session's connection when the block is freed.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>

namespace torch_fl {

// Where pinned host memory lies: the region and the byte offset in it.
struct PinnedLocation {
  uint64_t region = 0;  // 0: ordinary memory (no region shared with the daemon)
  uint64_t offset = 0;
  // The start and size of the block (block_ptr is what RecordUse takes).
  void* block_ptr = nullptr;
  uint64_t block_bytes = 0;
};

// The allocator (registered as PrivateUse1's host allocator).
at::HostAllocator& PinnedAllocator();

// The block holding [ptr, ptr + nbytes), if pinned memory of this process
// holds all of it.
std::optional<PinnedLocation> FindPinned(const void* ptr, uint64_t nbytes = 1);

// Records that the block at `block_ptr` is used by work enqueued on
// `stream`: when freed, it is reused only after that work has completed.
void RecordUse(void* block_ptr, c10::Stream stream);

}  // namespace torch_fl
