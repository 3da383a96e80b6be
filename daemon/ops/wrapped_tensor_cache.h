// A per-thread cache of the tensors the native route wraps over device
// memory (OpExecutor::WrapDeviceMemory), so that a tiny op costs no tensor
// construction.
//
// Tensors made for earlier calls on this thread are handed out again for
// the same (backend, device, address, sizes, strides, dtype). A tensor is
// reused only when nothing else holds it or its storage (the previous
// call's stack is gone) and it still is exactly as made (a kernel may
// restride an argument in place, or set_ it to other memory). The caller
// checks the range first, as for a fresh tensor: a kept tensor over memory
// since freed is never handed out for an address the session does not hold
// now. WrapDeviceMemory makes a plain view of the memory (it owns nothing),
// so a kept one is the tensor it would make again.
//
// Header only: used by op_call_context.cc alone.
//
// Thread safety: each thread has its own slots; nothing is shared.
#ifndef FLAGOS_DAEMON_OPS_WRAPPED_TENSOR_CACHE_H_
#define FLAGOS_DAEMON_OPS_WRAPPED_TENSOR_CACHE_H_

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/base/attributes.h"

namespace flagos::daemon {

class WrappedTensorCache {
 public:
  static constexpr size_t kSlots = 64;  // direct-mapped, per thread
  static constexpr size_t kMaxRank = 6;

  struct Entry {
    const void* backend = nullptr;
    int device = -1;
    uint64_t addr = 0;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    size_t rank = 0;
    int64_t sizes[kMaxRank] = {};
    int64_t strides[kMaxRank] = {};
    // What the tensor was made as, to notice in-place metadata changes.
    const c10::StorageImpl* storage = nullptr;
    size_t storage_nbytes = 0;
    c10::DispatchKeySet key_set;
    at::Tensor tensor;
  };

  // A lookup's result: the tensor to reuse (hit), or where to keep a new one.
  struct Slot {
    bool hit = false;
    const at::Tensor* tensor = nullptr;
    Entry* entry = nullptr;  // nullptr: not cacheable (rank too high)
    void Keep(const at::Tensor& made) {
      if (entry == nullptr || !made.has_storage()) return;
      entry->tensor = made;
      entry->storage = made.storage().unsafeGetStorageImpl();
      entry->storage_nbytes = made.storage().nbytes();
      entry->key_set = made.key_set();
    }
  };

  static Slot Find(const void* backend, int device, uint64_t addr, c10::IntArrayRef sizes,
                   c10::IntArrayRef strides, c10::ScalarType dtype) {
    Slot slot;
    if (sizes.size() > kMaxRank || strides.size() != sizes.size()) return slot;
    thread_local std::array<Entry, kSlots> entries;
    uint64_t h = addr ^ (static_cast<uint64_t>(dtype) << 56) ^ (sizes.size() << 48);
    for (int64_t size : sizes) h = h * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(size);
    Entry& entry = entries[(h ^ (h >> 29)) % kSlots];
    slot.entry = &entry;
    if (entry.tensor.defined() && entry.backend == backend && entry.device == device &&
        entry.addr == addr && entry.dtype == dtype && entry.rank == sizes.size() &&
        std::equal(sizes.begin(), sizes.end(), entry.sizes) &&
        std::equal(strides.begin(), strides.end(), entry.strides) && Unchanged(entry)) {
      slot.hit = true;
      slot.tensor = &entry.tensor;
      return slot;
    }
    entry.tensor = at::Tensor();  // releases the previous occupant now
    entry.backend = backend;
    entry.device = device;
    entry.addr = addr;
    entry.dtype = dtype;
    entry.rank = sizes.size();
    std::copy(sizes.begin(), sizes.end(), entry.sizes);
    std::copy(strides.begin(), strides.end(), entry.strides);
    return slot;
  }

 private:
  static bool Unchanged(const Entry& entry) {
    const at::Tensor& t = entry.tensor;
    if (t.use_count() != 1 || !t.has_storage()) return false;
    const c10::Storage& storage = t.storage();
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    return storage.unsafeGetStorageImpl() == entry.storage && storage.use_count() == 1 &&
           storage.nbytes() == entry.storage_nbytes &&
           reinterpret_cast<uint64_t>(storage.data_ptr().get()) == entry.addr &&
           impl->storage_offset() == 0 && t.key_set() == entry.key_set &&
           t.scalar_type() == entry.dtype && !t.requires_grad() &&
           Same(t.sizes(), entry.sizes, entry.rank) && Same(t.strides(), entry.strides, entry.rank);
  }
  // IntArrayRef::equals, written out as a loop: whether the compiler
  // inlines that (and std::equal's memcmp) varies with what else the
  // translation unit holds, and a call per comparison is a measurable part
  // of a tiny op.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static bool Same(c10::IntArrayRef a, const int64_t* b, size_t n) {
    if (a.size() != n) return false;
    for (size_t i = 0; i < n; ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_WRAPPED_TENSOR_CACHE_H_
