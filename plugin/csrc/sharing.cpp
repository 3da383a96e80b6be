#include "sharing.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "device_allocator.h"
#include "runtime.h"

namespace torch_fl {
namespace {

// The context of a shared storage's DataPtr in the sending process: the
// allocator's own DataPtr, kept until no receiver uses the block.
struct SentBlock {
  int device = 0;
  uint64_t addr = 0;
  uint64_t generation = 0;  // the session it was shared in
  c10::DataPtr original;
};

// The context of a storage opened from another process's grant.
struct ImportedSegment {
  int device = 0;
  uint64_t segment = 0;  // the segment's first address, as import_memory said
  uint64_t generation = 0;  // the session that holds it
};

std::mutex& LimboMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

// Dead shared storages whose blocks a receiver may still use.
std::vector<std::unique_ptr<SentBlock>>& Limbo() {
  static auto* limbo = new std::vector<std::unique_ptr<SentBlock>>();
  return *limbo;
}

// Whether no receiver uses `block` any more (or the session is gone, so
// nothing can).
bool Unused(const SentBlock& block) {
  flagos::client::Connection* live = LiveSession(block.generation);
  if (live == nullptr) return true;
  flagos::v1::Command command;
  command.set_device(block.device);
  command.mutable_query_export()->set_addr(block.addr);
  absl::StatusOr<flagos::v1::Completion> completion =
      live->Call(std::move(command), "ask whether receivers still use a shared block");
  // An error means the daemon no longer knows the segment: nobody uses it.
  return !completion.ok() || completion->ready();
}

void DeleteSent(void* context) {
  std::unique_ptr<SentBlock> block(static_cast<SentBlock*>(context));
  {
    std::lock_guard<std::mutex> lock(LimboMutex());
    Limbo().push_back(std::move(block));
  }
  CollectSharedBlocks();
}

void DeleteImported(void* context) {
  std::unique_ptr<ImportedSegment> imported(static_cast<ImportedSegment*>(context));
  // After the session ended the daemon has released its holds already.
  flagos::client::Connection* live = LiveSession(imported->generation);
  if (live == nullptr) return;
  try {
    flagos::v1::Command command;
    command.set_device(imported->device);
    command.mutable_release_import()->set_addr(imported->segment);
    live->Enqueue(std::move(command), "release a tensor another process shared");
  } catch (...) {
  }
}

}  // namespace

SharedStorageHandle ShareStorage(const c10::Storage& storage) {
  CollectSharedBlocks();
  const c10::DataPtr& data = storage.data_ptr();
  TORCH_CHECK(data.device().type() == c10::DeviceType::PrivateUse1,
              "flagos: cannot share a storage on ", data.device(), " as a flagos storage");
  SharedStorageHandle handle;
  handle.device = data.device().index();
  handle.nbytes = storage.nbytes();
  const uint64_t addr = reinterpret_cast<uint64_t>(data.get());
  flagos::client::Connection& session = Session();
  CheckGeneration(DeviceAllocator().GenerationOf(data), "the shared tensor's memory");
  const uint64_t generation = CurrentGeneration();
  flagos::v1::Command command;
  command.set_device(handle.device);
  command.mutable_export_memory()->set_addr(addr);
  flagos::v1::Completion completion =
      ValueOrThrow(session.Call(std::move(command), "share a tensor with another process"));
  handle.grant = completion.grant();
  handle.offset = addr - completion.addr();
  // From now on the block outlives the storage until receivers are done.
  static std::mutex wrap_mu;
  std::lock_guard<std::mutex> lock(wrap_mu);
  if (storage.data_ptr().get_deleter() == DeviceAllocator().raw_deleter()) {
    auto* sent = new SentBlock{handle.device, addr, generation, {}};
    c10::DataPtr wrapped(storage.data_ptr().get(), sent, &DeleteSent, storage.device());
    sent->original = storage.set_data_ptr(std::move(wrapped));
  }
  return handle;
}

c10::Storage OpenSharedStorage(const SharedStorageHandle& handle) {
  flagos::v1::Command command;
  command.set_device(handle.device);
  command.mutable_import_memory()->set_grant(handle.grant);
  flagos::client::Connection& session = Session();
  const uint64_t generation = CurrentGeneration();
  flagos::v1::Completion completion = ValueOrThrow(
      session.Call(std::move(command), "open a tensor another process shared"));
  c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(handle.device));
  auto* imported = new ImportedSegment{handle.device, completion.addr(), generation};
  // Owns the hold from here: released when the storage dies, or below.
  c10::DataPtr data(reinterpret_cast<void*>(completion.addr() + handle.offset), imported,
                    &DeleteImported, device);
  TORCH_CHECK(handle.offset <= completion.segment_nbytes() &&
                  handle.nbytes <= completion.segment_nbytes() - handle.offset,
              "flagos: a shared storage of ", handle.nbytes, " bytes at offset ", handle.offset,
              " does not fit the ", completion.segment_nbytes(),
              "-byte segment its grant names; the sender's message is corrupt");
  return c10::Storage(c10::Storage::use_byte_size_t(), handle.nbytes, std::move(data),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

void CollectSharedBlocks() {
  std::vector<std::unique_ptr<SentBlock>> candidates;
  {
    std::lock_guard<std::mutex> lock(LimboMutex());
    candidates.swap(Limbo());
  }
  if (candidates.empty()) return;
  std::vector<std::unique_ptr<SentBlock>> kept;
  for (auto& block : candidates) {
    bool unused = true;
    try {
      unused = Unused(*block);
    } catch (...) {
    }
    // Releasing the original gives the block back to the allocator.
    if (!unused) kept.push_back(std::move(block));
  }
  candidates.clear();
  std::lock_guard<std::mutex> lock(LimboMutex());
  for (auto& block : kept) Limbo().push_back(std::move(block));
}

const c10::DataPtr* SharedBlockOriginal(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &DeleteSent) return nullptr;
  return &static_cast<const SentBlock*>(ptr.get_context())->original;
}

uint64_t ImportedGeneration(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &DeleteImported) return 0;
  return static_cast<const ImportedSegment*>(ptr.get_context())->generation;
}

}  // namespace torch_fl
