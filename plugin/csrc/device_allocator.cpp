#include "device_allocator.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph_capture.h"
#include "runtime.h"
#include "sharing.h"

namespace torch_fl {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatType;

constexpr uint64_t kMinBlock = 512;
constexpr uint64_t kSmallRequest = 1ull << 20;
constexpr uint64_t kSegmentGranularity = 2ull << 20;

uint64_t RoundUp(uint64_t n, uint64_t m) { return (n + m - 1) / m * m; }

// A (device, stream) that used a block besides its own stream.
using StreamUse = std::pair<int, uint64_t>;

// Where a free block may be reused: the stream the segment belongs to, or
// a graph pool's key (kGraphPoolBit set; graph_capture.h).
struct Block {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t segment = 0;  // address of the owning segment
  uint64_t stream = 0;   // the segment's stream or graph pool
  uint64_t requested = 0;
  bool free = true;
  std::set<StreamUse> stream_uses;  // recordStream, while allocated
};

// A segment belongs to the stream that was current when it was allocated;
// so do all its blocks.
struct Segment {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t stream = 0;
  uint64_t allocated_blocks = 0;
};

// (stream, size, addr): free blocks of one stream, smallest first.
using FreeKey = std::tuple<uint64_t, uint64_t, uint64_t>;

void StatAdd(Stat& stat, int64_t amount) {
  stat.current += amount;
  stat.peak = std::max(stat.peak, stat.current);
  if (amount > 0) stat.allocated += amount;
  if (amount < 0) stat.freed += -amount;
}

void StatAdd(c10::CachingDeviceAllocator::StatArray& stats, int64_t amount) {
  StatAdd(stats[static_cast<size_t>(StatType::AGGREGATE)], amount);
}

// The context of a block's DataPtr: its address and the session it was
// carved for (a later session may hand out the same addresses).
struct BlockTag {
  uint64_t addr = 0;
  uint64_t generation = 0;
};

struct DevicePool {
  std::map<uint64_t, Block> blocks;                        // by address
  std::set<FreeKey> free_blocks;
  std::map<uint64_t, Segment> segments;                    // by address
  DeviceStats stats;
};

// The blocks and segments of the current session. When the session is lost
// they are forgotten (their memory is gone with it) at the next call that
// looks at them, and the statistics start again from zero; blocks of the
// lost session come back to Free, which drops them.
class Pools {
 public:
  c10::DataPtr Allocate(int device, size_t nbytes);
  void Free(const BlockTag& tag);
  void RecordStream(const BlockTag& tag, c10::Stream stream);
  void EmptyCache();
  int DeviceOf(const void* ptr);
  DeviceStats Stats(int device);
  void ResetAccumulated(int device);
  void ResetPeak(int device);
  void HoldGraphPool(uint64_t key);
  void ReleaseGraphPool(uint64_t key);

 private:
  DevicePool& Pool(int device);
  // REQUIRES: mu_ held. A free block of `stream` with room for `size`.
  static std::set<FreeKey>::iterator FindFree(DevicePool& pool, uint64_t stream, uint64_t size);
  // REQUIRES: mu_ held, FindFree found a block. Returns the address of a
  // block of exactly `size`.
  uint64_t TakeBlock(DevicePool& pool, uint64_t stream, uint64_t size, uint64_t requested);
  // REQUIRES: mu_ held. Orders later work on the block's stream after the
  // work enqueued so far on each stream in `uses` (an event recorded there,
  // waited for on the block's stream), so the block can be reused at once.
  void AwaitStreamUses(int device, uint64_t stream, const std::set<StreamUse>& uses);
  // REQUIRES: mu_ held. Merges each run of adjacent free blocks of a
  // segment into one block.
  static void MergeFreeBlocks(DevicePool& pool);
  // REQUIRES: mu_ held. Frees every wholly free segment of `pool`.
  void ReleaseFreeSegments(int device, DevicePool& pool);
  // REQUIRES: mu_ held. Forgets a lost session's blocks and segments once
  // the current generation is `generation`.
  void FollowGenerationLocked(uint64_t generation);

  std::mutex mu_;
  uint64_t generation_ = 0;  // of the session the pools below belong to
  std::unordered_map<int, DevicePool> pools_;
  std::unordered_map<uint64_t, int> block_device_;  // live block addr → device
  // Graph pools some graph still uses (key → graphs): their segments stay.
  std::unordered_map<uint64_t, int> held_pools_;
};

Pools& GlobalPools() {
  static auto* pools = new Pools();  // never destroyed: tensors die at exit
  return *pools;
}

void DeleteBlock(void* ctx) {
  std::unique_ptr<BlockTag> tag(static_cast<BlockTag*>(ctx));
  if (tag != nullptr) GlobalPools().Free(*tag);
}

DevicePool& Pools::Pool(int device) { return pools_[device]; }

void Pools::FollowGenerationLocked(uint64_t generation) {
  if (generation == generation_) return;
  pools_.clear();
  block_device_.clear();
  generation_ = generation;
}

std::set<FreeKey>::iterator Pools::FindFree(DevicePool& pool, uint64_t stream, uint64_t size) {
  auto it = pool.free_blocks.lower_bound({stream, size, 0});
  if (it != pool.free_blocks.end() && std::get<0>(*it) != stream) return pool.free_blocks.end();
  return it;
}

uint64_t Pools::TakeBlock(DevicePool& pool, uint64_t stream, uint64_t size, uint64_t requested) {
  auto it = FindFree(pool, stream, size);
  TORCH_INTERNAL_ASSERT(it != pool.free_blocks.end());
  uint64_t addr = std::get<2>(*it);
  pool.free_blocks.erase(it);
  Block& block = pool.blocks.at(addr);
  if (block.size - size >= kMinBlock) {
    Block rest;
    rest.addr = addr + size;
    rest.size = block.size - size;
    rest.segment = block.segment;
    rest.stream = block.stream;
    pool.blocks.emplace(rest.addr, rest);
    pool.free_blocks.insert({rest.stream, rest.size, rest.addr});
    block.size = size;
  }
  block.free = false;
  block.requested = requested;
  pool.segments.at(block.segment).allocated_blocks++;
  return addr;
}

c10::DataPtr Pools::Allocate(int device, size_t nbytes) {
  c10::Device c10_device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  if (nbytes == 0) return c10::DataPtr(nullptr, nullptr, &DeleteBlock, c10_device);
  uint64_t size = RoundUp(nbytes, kMinBlock);
  // The block serves work on the current stream: reused only by later
  // allocations on that stream, whose work the daemon runs after this one's;
  // or, while that stream captures a graph, by the graph pool's.
  uint64_t stream = CurrentStream(device);
  if (const uint64_t pool_key = CapturePoolKey(device, stream)) stream = pool_key;
  // The session first (it may open a new one), outside mu_: opening one may
  // call into Python, whose tensor frees take mu_.
  flagos::client::Connection& session = Session();
  const uint64_t generation = CurrentGeneration();
  std::lock_guard<std::mutex> lock(mu_);
  FollowGenerationLocked(generation);
  DevicePool& pool = Pool(device);
  // Free blocks are merged only when none fits as they are: a loop that
  // allocates the same sizes in the same order each step then gets the
  // same blocks each step (device_allocator.h).
  if (FindFree(pool, stream, size) == pool.free_blocks.end()) MergeFreeBlocks(pool);
  if (FindFree(pool, stream, size) == pool.free_blocks.end()) {
    uint64_t segment_size =
        size <= kSmallRequest ? kSegmentGranularity : RoundUp(size, kSegmentGranularity);
    flagos::v1::Command command;
    command.set_device(device);
    command.mutable_allocate()->set_nbytes(segment_size);
    // On this session's connection: if it ended meanwhile, the call fails
    // and the loss is reported (no segment of another session lands here).
    auto completion = session.Call(command, "allocate segment");
    if (!completion.ok() && completion.status().code() == absl::StatusCode::kResourceExhausted) {
      ReleaseFreeSegments(device, pool);
      pool.stats.num_alloc_retries++;
      completion = session.Call(command, "allocate segment");
    }
    if (!completion.ok() && completion.status().code() == absl::StatusCode::kResourceExhausted) {
      pool.stats.num_ooms++;
      constexpr size_t agg = static_cast<size_t>(StatType::AGGREGATE);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "flagos: out of memory on flagos:", device,
                       ": tried to allocate ", nbytes, " bytes (",
                       pool.stats.allocated_bytes[agg].current, " bytes allocated by tensors, ",
                       pool.stats.reserved_bytes[agg].current,
                       " bytes reserved by this process); the daemon said: ",
                       completion.status().message());
    }
    ThrowIfError(completion.status());
    Segment segment;
    segment.addr = completion->addr();
    segment.size = segment_size;
    segment.stream = stream;
    pool.segments.emplace(segment.addr, segment);
    Block block;
    block.addr = segment.addr;
    block.size = segment_size;
    block.segment = segment.addr;
    block.stream = stream;
    pool.blocks.emplace(block.addr, block);
    pool.free_blocks.insert({block.stream, block.size, block.addr});
    StatAdd(pool.stats.segment, 1);
    StatAdd(pool.stats.reserved_bytes, static_cast<int64_t>(segment_size));
    pool.stats.num_device_alloc++;
  }
  uint64_t addr = TakeBlock(pool, stream, size, nbytes);
  block_device_[addr] = device;
  StatAdd(pool.stats.allocation, 1);
  StatAdd(pool.stats.active, 1);
  StatAdd(pool.stats.allocated_bytes, static_cast<int64_t>(size));
  StatAdd(pool.stats.active_bytes, static_cast<int64_t>(size));
  StatAdd(pool.stats.requested_bytes, static_cast<int64_t>(nbytes));
  void* ptr = reinterpret_cast<void*>(addr);
  return c10::DataPtr(ptr, new BlockTag{addr, generation}, &DeleteBlock, c10_device);
}

void Pools::Free(const BlockTag& tag) {
  const uint64_t addr = tag.addr;
  std::lock_guard<std::mutex> lock(mu_);
  if (tag.generation != generation_) return;  // its session is lost: nothing to give back
  auto owner = block_device_.find(addr);
  if (owner == block_device_.end()) return;  // session already gone
  const int device = owner->second;
  DevicePool& pool = Pool(device);
  block_device_.erase(owner);
  auto it = pool.blocks.find(addr);
  TORCH_INTERNAL_ASSERT(it != pool.blocks.end() && !it->second.free);
  Block& block = it->second;
  // A graph pool's block is ordered by its graphs' replays, not a stream.
  if (!block.stream_uses.empty() && (block.stream & kGraphPoolBit) == 0) {
    AwaitStreamUses(device, block.stream, block.stream_uses);
    block.stream_uses.clear();
  }
  StatAdd(pool.stats.allocation, -1);
  StatAdd(pool.stats.active, -1);
  StatAdd(pool.stats.allocated_bytes, -static_cast<int64_t>(block.size));
  StatAdd(pool.stats.active_bytes, -static_cast<int64_t>(block.size));
  StatAdd(pool.stats.requested_bytes, -static_cast<int64_t>(block.requested));
  block.free = true;
  pool.segments.at(block.segment).allocated_blocks--;
  // Not merged with its free neighbours (MergeFreeBlocks does that when
  // nothing fits): the next allocation of its size takes it as it is.
  pool.free_blocks.insert({block.stream, block.size, addr});
}

void Pools::MergeFreeBlocks(DevicePool& pool) {
  auto it = pool.blocks.begin();
  while (it != pool.blocks.end()) {
    auto next = std::next(it);
    if (next == pool.blocks.end()) break;
    Block& block = it->second;
    // Blocks tile their segment: the next one of the same segment is adjacent.
    if (!block.free || !next->second.free || next->second.segment != block.segment) {
      it = next;
      continue;
    }
    pool.free_blocks.erase({block.stream, block.size, block.addr});
    pool.free_blocks.erase({next->second.stream, next->second.size, next->first});
    block.size += next->second.size;
    pool.blocks.erase(next);
    pool.free_blocks.insert({block.stream, block.size, block.addr});
  }
}

void Pools::AwaitStreamUses(int device, uint64_t stream, const std::set<StreamUse>& uses) {
  // Called from tensor deleters: never throws; after the session closed or
  // was lost there is nothing left to order.
  flagos::client::Connection* live = LiveSession(generation_);
  if (live == nullptr) return;
  try {
    flagos::client::Connection& session = *live;
    for (const auto& [use_device, use_stream] : uses) {
      const uint64_t event = NewEventId();
      flagos::v1::Command record;
      record.set_device(use_device);
      record.set_stream(use_stream);
      record.mutable_record_event()->set_event(event);
      session.Enqueue(std::move(record), "record_stream: record an event");
      flagos::v1::Command wait;
      wait.set_device(device);
      wait.set_stream(stream);
      wait.mutable_wait_event()->set_event(event);
      session.Enqueue(std::move(wait), "record_stream: wait for the event");
      flagos::v1::Command destroy;
      destroy.set_device(device);
      destroy.mutable_destroy_event()->set_event(event);
      session.Enqueue(std::move(destroy), "record_stream: destroy the event");
    }
  } catch (...) {
  }
}

void Pools::RecordStream(const BlockTag& tag, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "flagos: record_stream needs a flagos stream, got a stream of ", stream.device());
  const uint64_t addr = tag.addr;
  std::lock_guard<std::mutex> lock(mu_);
  if (tag.generation != generation_) return;  // a lost session's block: nothing to order
  auto owner = block_device_.find(addr);
  if (owner == block_device_.end()) return;  // not a block of this allocator
  DevicePool& pool = Pool(owner->second);
  Block& block = pool.blocks.at(addr);
  const StreamUse use{stream.device_index(), static_cast<uint64_t>(stream.id())};
  if (use == StreamUse{owner->second, block.stream}) return;
  block.stream_uses.insert(use);
}

void Pools::ReleaseFreeSegments(int device, DevicePool& pool) {
  MergeFreeBlocks(pool);  // a wholly free segment is then one free block
  for (auto it = pool.segments.begin(); it != pool.segments.end();) {
    Segment& segment = it->second;
    // A graph's work names the segments of its pool at every replay.
    if (segment.allocated_blocks != 0 || held_pools_.count(segment.stream) != 0) {
      ++it;
      continue;
    }
    pool.free_blocks.erase({segment.stream, segment.size, segment.addr});
    pool.blocks.erase(segment.addr);
    StatAdd(pool.stats.segment, -1);
    StatAdd(pool.stats.reserved_bytes, -static_cast<int64_t>(segment.size));
    pool.stats.num_device_free++;
    if (flagos::client::Connection* live = LiveSession(generation_)) {
      flagos::v1::Command command;
      command.set_device(device);
      command.mutable_free()->set_addr(segment.addr);
      live->Enqueue(std::move(command), "free segment");
    }
    it = pool.segments.erase(it);
  }
}

void Pools::HoldGraphPool(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  held_pools_[key]++;
}

void Pools::ReleaseGraphPool(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_pools_.find(key);
  if (it != held_pools_.end() && --it->second == 0) held_pools_.erase(it);
}

void Pools::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  FollowGenerationLocked(CurrentGeneration());
  for (auto& [device, pool] : pools_) ReleaseFreeSegments(device, pool);
}

int Pools::DeviceOf(const void* ptr) {
  uint64_t addr = reinterpret_cast<uint64_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  FollowGenerationLocked(CurrentGeneration());
  for (auto& [device, pool] : pools_) {
    auto it = pool.segments.upper_bound(addr);
    if (it == pool.segments.begin()) continue;
    --it;
    if (addr < it->second.addr + it->second.size) return device;
  }
  return -1;
}

DeviceStats Pools::Stats(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  FollowGenerationLocked(CurrentGeneration());
  return Pool(device).stats;
}

void Pools::ResetAccumulated(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceStats& stats = Pool(device).stats;
  for (auto* array : {&stats.allocation, &stats.segment, &stats.active, &stats.allocated_bytes,
                      &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
    for (Stat& stat : *array) {
      stat.allocated = 0;
      stat.freed = 0;
    }
  }
  stats.num_alloc_retries = 0;
  stats.num_ooms = 0;
  stats.num_device_alloc = 0;
  stats.num_device_free = 0;
}

void Pools::ResetPeak(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceStats& stats = Pool(device).stats;
  for (auto* array : {&stats.allocation, &stats.segment, &stats.active, &stats.allocated_bytes,
                      &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
    for (Stat& stat : *array) stat.peak = stat.current;
  }
}

}  // namespace

c10::DataPtr FlagosDeviceAllocator::allocate(size_t nbytes) {
  return GlobalPools().Allocate(CurrentDevice(), nbytes);
}

c10::DataPtr FlagosDeviceAllocator::AllocateOn(int device, size_t nbytes) {
  return GlobalPools().Allocate(device, nbytes);
}

c10::DeleterFnPtr FlagosDeviceAllocator::raw_deleter() const { return &DeleteBlock; }

void FlagosDeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "flagos: Allocator::copy_data on device memory is not supported; "
                              "copy tensors with Tensor.copy_ instead");
}

void FlagosDeviceAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  CollectSharedBlocks();  // blocks of shared storages no receiver uses now
  GlobalPools().EmptyCache();
}

void FlagosDeviceAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (const c10::DataPtr* original = SharedBlockOriginal(ptr)) return recordStream(*original, stream);
  if (ptr.get_deleter() != &DeleteBlock) return;  // not our memory (from_blob ...)
  if (const auto* tag = static_cast<const BlockTag*>(ptr.get_context())) {
    GlobalPools().RecordStream(*tag, stream);
  }
}

uint64_t FlagosDeviceAllocator::GenerationOf(const c10::DataPtr& ptr) {
  if (const c10::DataPtr* original = SharedBlockOriginal(ptr)) return GenerationOf(*original);
  if (ptr.get_deleter() == &DeleteBlock) {
    const auto* tag = static_cast<const BlockTag*>(ptr.get_context());
    return tag == nullptr ? 0 : tag->generation;
  }
  return ImportedGeneration(ptr);
}

DeviceStats FlagosDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  return GlobalPools().Stats(device);
}

void FlagosDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  GlobalPools().ResetAccumulated(device);
}

void FlagosDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  GlobalPools().ResetPeak(device);
}

std::pair<size_t, size_t> FlagosDeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  auto stats = ValueOrThrow(Session().GetStats());
  for (const auto& info : stats.devices()) {
    if (info.index() == device) {
      return {info.total_memory() - info.used_memory(), info.total_memory()};
    }
  }
  TORCH_CHECK(false, "flagos: the daemon reports no device ", static_cast<int>(device));
}

int FlagosDeviceAllocator::DeviceOf(const void* ptr) { return GlobalPools().DeviceOf(ptr); }

void HoldGraphPool(uint64_t key) { GlobalPools().HoldGraphPool(key); }
void ReleaseGraphPool(uint64_t key) { GlobalPools().ReleaseGraphPool(key); }

FlagosDeviceAllocator& DeviceAllocator() {
  static FlagosDeviceAllocator allocator;
  return allocator;
}

// Registered for PrivateUse1 so torch.accelerator memory functions and
// at::empty find it.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &DeviceAllocator());

namespace {

// Tensor.record_stream(stream): the storage's block is not reused before the
// work enqueued on `stream` up to its free has run.
void RecordStreamKernel(at::Tensor& self, c10::Stream stream) {
  DeviceAllocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("record_stream", &RecordStreamKernel); }

}  // namespace torch_fl
