// Sharing flagos device memory with other processes (torch.multiprocessing),
// with CUDA IPC's semantics: the receiver gets a storage over the same device
// memory, no copy.
//
// The daemon owns the memory, so it is what grants access: ShareStorage asks
// it for a grant on the segment holding the storage (export_memory, which
// answers once this process's earlier work on the device has completed),
// and OpenSharedStorage, in the receiving process, takes a hold on it
// (import_memory); the receiver's storage releases its hold when it dies
// (release_import, after the receiver's earlier work on the device). Grants
// go only to processes of the sender's user unless flagosd allows more.
//
// As with CUDA, the sender's allocator must not reuse a shared block while a
// receiver may still use it: once shared, a storage's allocator block is
// kept, when the storage dies, until the daemon says no receiver holds the
// segment and no grant sent is still unclaimed (query_export); such blocks
// are given back at the next share, the next death of a shared storage, and
// at empty_cache(). A grant that is never received (a message dropped from a
// queue) keeps its block until this process ends, as with CUDA. A lost
// session (runtime.h) takes its grants and holds with it: nothing is
// released or asked of the next session.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <c10/core/Storage.h>

#include <cstdint>
#include <string>

namespace torch_fl {

struct SharedStorageHandle {
  std::string grant;    // the daemon's secret for the segment
  int device = 0;
  uint64_t offset = 0;  // of the storage's first byte in the segment
  uint64_t nbytes = 0;  // the storage's size
};

// Grants access to `storage`'s memory (a flagos storage of this process,
// allocated here or itself opened from another process's grant). Throws
// c10::Error with the daemon's reason when it refuses.
SharedStorageHandle ShareStorage(const c10::Storage& storage);

// A storage over the memory of `handle` (from ShareStorage in another
// process of the same daemon). Throws c10::Error naming what failed.
c10::Storage OpenSharedStorage(const SharedStorageHandle& handle);

// Gives the allocator back the blocks of dead shared storages that no
// receiver uses any more. Never throws.
void CollectSharedBlocks();

// For a shared storage's DataPtr: the allocator's DataPtr it keeps (so that
// record_stream reaches the block); null for any other DataPtr.
const c10::DataPtr* SharedBlockOriginal(const c10::DataPtr& ptr);

// For a storage opened from another process's grant: the session
// generation (runtime.h) it was opened in; 0 for any other DataPtr.
uint64_t ImportedGeneration(const c10::DataPtr& ptr);

}  // namespace torch_fl
