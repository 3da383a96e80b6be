#include "pinned_allocator.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include "runtime.h"

namespace torch_fl {
namespace {

// A block and the session generation whose connection allocated it.
struct LiveBlock {
  flagos::client::PinnedBlock block;
  uint64_t generation = 0;
};

// The blocks live now, by start address (for FindPinned and free_block).
struct LiveBlocks {
  std::mutex mu;
  std::map<uintptr_t, LiveBlock> blocks;
};

LiveBlocks& Live() {
  static auto* live = new LiveBlocks();
  return *live;
}

using Block = at::HostBlock<c10::Stream>;

struct FlagosPinnedImpl final : public at::CachingHostAllocatorImpl<c10::Stream, c10::Event> {
 private:
  void allocate_host_memory(size_t size, void** ptr) override {
    flagos::client::Connection& session = Session();
    const uint64_t generation = CurrentGeneration();
    flagos::client::PinnedBlock block = ValueOrThrow(session.AllocatePinned(size));
    *ptr = block.data;
    std::lock_guard<std::mutex> lock(Live().mu);
    Live().blocks.emplace(reinterpret_cast<uintptr_t>(block.data), LiveBlock{block, generation});
  }

  void free_block(Block* block) override {
    LiveBlock live;
    {
      std::lock_guard<std::mutex> lock(Live().mu);
      auto it = Live().blocks.find(reinterpret_cast<uintptr_t>(block->ptr_));
      if (it == Live().blocks.end()) return;
      live = it->second;
      Live().blocks.erase(it);
    }
    // The connection that allocated it, live or lost, unmaps it (and tells
    // the daemon, if its session still runs).
    if (flagos::client::Connection* owner = ConnectionOf(live.generation)) {
      owner->FreePinned(live.block);
    }
  }

  void record_stream(std::optional<std::vector<c10::Event>>& events,
                     c10::Stream stream) override {
    c10::Event event(c10::DeviceType::PrivateUse1);
    // A block freed after the session closed at exit (a pinned tensor kept
    // in a global) waits for nothing: the daemon ended the session's work.
    // An event never recorded counts as complete.
    if (!SessionClosedAtExit()) event.record(stream);
    events->push_back(std::move(event));
  }

  bool query_event(c10::Event& event) override { return event.query(); }

  c10::Stream get_current_stream() const override {
    const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
    return guard.getStream(c10::Device(c10::DeviceType::PrivateUse1,
                                       static_cast<c10::DeviceIndex>(CurrentDevice())));
  }

  bool stream_is_capturing(c10::Stream /*stream*/) const override { return false; }
};

void DeletePinned(void* ctx);

struct FlagosPinnedAllocator final
    : public at::CachingHostAllocatorInterface<FlagosPinnedImpl, DeletePinned> {};

FlagosPinnedAllocator& Instance() {
  // Never destroyed: tensors may outlive static destruction at exit.
  static auto* allocator = new FlagosPinnedAllocator();
  return *allocator;
}

// A deleter: nothing may escape it (an exception here would terminate the
// process, at exit for a pinned tensor that outlives the session). A
// failure is reported and the block is left to the process's end.
void DeletePinned(void* ctx) {
  try {
    Instance().free(ctx);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_fl: freeing a pinned host block failed: %s\n", e.what());
  }
}

// PrivateUse1's host allocator (at::getHostAllocator), so that torch's
// device-generic code finds it as it finds CUDA's.
const bool kRegistered = [] {
  at::setHostAllocator(c10::DeviceType::PrivateUse1, &Instance());
  return true;
}();

}  // namespace

at::HostAllocator& PinnedAllocator() { return Instance(); }

std::optional<PinnedLocation> FindPinned(const void* ptr, uint64_t nbytes) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(Live().mu);
  auto it = Live().blocks.upper_bound(address);
  if (it == Live().blocks.begin()) return std::nullopt;
  --it;
  const uint64_t offset = address - it->first;
  const flagos::client::PinnedBlock& block = it->second.block;
  if (offset >= block.nbytes || nbytes > block.nbytes - offset) return std::nullopt;
  // A lost session's region means nothing to the current session.
  const uint64_t region = it->second.generation == CurrentGeneration() ? block.region : 0;
  return PinnedLocation{region, offset, block.data, block.nbytes};
}

void RecordUse(void* block_ptr, c10::Stream stream) {
  Instance().record_event(block_ptr, nullptr, stream);
}

}  // namespace torch_fl
