// SessionConnection's host <-> device copies (session_connection.h): through
// the shared staging region, inline on the stream, raw on a TCP session's
// sync channel, and from or into pinned regions.
#include "session_connection.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "flagos/hostcopy/bulk_copy.h"

namespace flagos::client {
namespace {

// A TCP session's uploads from this size on travel raw on the sync channel
// (RawCopyOnSyncChannel); smaller ones inline on the session stream,
// without waiting.
constexpr uint64_t kMinRawUploadBytes = 256 << 10;

}  // namespace

absl::StatusOr<StagingRegion::Chunk> SessionConnection::ClaimChunk(uint64_t nbytes) {
  for (int attempt = 0;; ++attempt) {
    if (std::optional<StagingRegion::Chunk> chunk = staging_->TryClaim(nbytes)) return *chunk;
    // The ring is full of chunks the daemon has not consumed yet: make sure
    // it has them, then back off (spin briefly, then sleep).
    if (attempt == 0) {
      if (absl::Status s = Flush(); !s.ok()) return s;
    }
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = UnusableLocked(); !s.ok()) return s;
    }
    if (attempt < 64) {
      sched_yield();
    } else {
      absl::SleepFor(absl::Microseconds(std::min(20 * (attempt - 63), 500)));
    }
  }
}

absl::Status SessionConnection::Upload(int device, uint64_t stream, uint64_t addr,
                                       const void* src, uint64_t nbytes,
                                       const std::string& describe) {
  const char* bytes = static_cast<const char*>(src);
  if (staging_ == nullptr && sync_raw_payloads_ && nbytes >= kMinRawUploadBytes) {
    // A TCP session's bulk bytes go raw on the sync channel: no copy into
    // a message, no HTTP/2 framing; the daemon acknowledges each piece once
    // it has it queued, and the next piece is on its way meanwhile.
    return RawCopyOnSyncChannel(device, stream, addr, const_cast<char*>(bytes), nbytes,
                                /*upload=*/true, describe);
  }
  for (uint64_t done = 0; done < nbytes;) {
    v1::Command command;
    command.set_device(device);
    command.set_stream(stream);
    v1::CopyToDevice* copy = command.mutable_copy_to_device();
    copy->set_addr(addr + done);
    uint64_t n;
    if (staging_ != nullptr) {
      n = std::min(nbytes - done, staging_->max_chunk());
      absl::StatusOr<StagingRegion::Chunk> chunk = ClaimChunk(n);
      if (!chunk.ok()) return chunk.status();
      hostcopy::BulkCopy(chunk->data, bytes + done, n);
      copy->mutable_staged()->set_offset(chunk->offset);
      copy->mutable_staged()->set_nbytes(n);
    } else {
      n = std::min(nbytes - done, kMaxCopyChunk);
      copy->set_data(bytes + done, n);
    }
    if (Enqueue(command, describe) == 0) {
      absl::MutexLock lock(&mu_);
      return UnusableLocked();
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status SessionConnection::Download(int device, uint64_t stream, void* dst, uint64_t addr,
                                         uint64_t nbytes, const std::string& describe) {
  char* out = static_cast<char*>(dst);
  struct InFlight {
    uint64_t ticket;
    StagingRegion::Chunk chunk;
    uint64_t done;  // where its bytes go in `out`
  };
  std::deque<InFlight> in_flight;
  absl::Status first_error;
  // A fresh destination (the tensor `.cpu()` allocates) faults in 2 MiB
  // pages rather than 4 KiB ones.
  hostcopy::PrepareDestination(out, nbytes);
  if (staging_ == nullptr && sync_raw_payloads_) {
    // A TCP session's download: raw on the sync channel, pipelined.
    return RawCopyOnSyncChannel(device, stream, addr, out, nbytes, /*upload=*/false, describe);
  }
  // Waits for the oldest chunk, copies it out and frees it.
  const auto finish_oldest = [&]() {
    InFlight f = in_flight.front();
    in_flight.pop_front();
    absl::StatusOr<v1::Completion> completion = Await(f.ticket);
    if (completion.ok() && first_error.ok()) {
      hostcopy::BulkCopy(out + f.done, f.chunk.data, f.chunk.nbytes);
    }
    staging_->Release(f.chunk.offset);
    if (!completion.ok() && first_error.ok()) first_error = completion.status();
  };
  for (uint64_t done = 0; done < nbytes && first_error.ok();) {
    v1::Command command;
    command.set_device(device);
    command.set_stream(stream);
    v1::CopyFromDevice* copy = command.mutable_copy_from_device();
    copy->set_addr(addr + done);
    if (staging_ == nullptr) {
      const uint64_t n = std::min(nbytes - done, kMaxCopyChunk);
      copy->set_nbytes(n);
      absl::StatusOr<v1::Completion> completion = Call(std::move(command), describe);
      if (!completion.ok()) return completion.status();
      if (absl::Status s = TakeDownloadedBytes(*completion, absl::Span<char>(out + done, n),
                                               describe);
          !s.ok()) {
        return s;
      }
      done += n;
      continue;
    }
    const uint64_t n = std::min(nbytes - done, staging_->max_chunk());
    std::optional<StagingRegion::Chunk> chunk;
    while (!(chunk = staging_->TryClaim(n)) && !in_flight.empty()) finish_oldest();
    if (!chunk) {
      absl::StatusOr<StagingRegion::Chunk> claimed = ClaimChunk(n);
      if (!claimed.ok()) {
        first_error = claimed.status();
        break;
      }
      chunk = *claimed;
    }
    copy->set_nbytes(n);
    copy->mutable_staged()->set_offset(chunk->offset);
    copy->mutable_staged()->set_nbytes(n);
    if (n == nbytes) {
      // One chunk: a plain call (the sync channel's short path).
      absl::StatusOr<v1::Completion> completion = Call(std::move(command), describe);
      if (completion.ok()) hostcopy::BulkCopy(out, chunk->data, n);
      staging_->Release(chunk->offset);
      return completion.status();
    }
    absl::StatusOr<uint64_t> ticket = Submit(std::move(command), describe);
    if (!ticket.ok()) {
      staging_->Release(chunk->offset);
      first_error = ticket.status();
      break;
    }
    in_flight.push_back({*ticket, *chunk, done});
    done += n;
  }
  // Every submitted chunk is awaited before it is freed: the daemon may
  // still be writing into it.
  while (!in_flight.empty()) finish_oldest();
  return first_error;
}

absl::StatusOr<PinnedBlock> SessionConnection::AllocatePinned(uint64_t nbytes) {
  if (nbytes == 0) {
    return absl::InvalidArgumentError("flagos: a pinned block holds at least one byte");
  }
  PinnedBlock block;
  if (staging_ == nullptr) {
    // No shared memory with the daemon (TCP, or staging off): ordinary
    // memory, copied like any host memory.
    const uint64_t size = (nbytes + 4095) / 4096 * 4096;
    block.data = static_cast<char*>(std::aligned_alloc(4096, size));
    if (block.data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("flagos: cannot allocate ", size, " bytes of host memory to pin"));
    }
    block.nbytes = size;
    return block;
  }
  uint64_t id;
  {
    absl::MutexLock lock(&pinned_mu_);
    id = next_pinned_id_++;
  }
  absl::StatusOr<std::unique_ptr<PinnedRegion>> region = PinnedRegion::Create(id, nbytes);
  if (!region.ok()) return region.status();
  std::string socket;
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = UnusableLocked(); !s.ok()) return s;
    socket = staging_socket_;
    token = staging_token_;
  }
  if (absl::Status s = (*region)->Attach(socket, session_id(), token, absl::Now() + kAttachTimeout);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("flagos: cannot pin ", nbytes, " bytes of host memory "
                                               "with flagosd at ", endpoint_, ": ", s.message()));
  }
  block.region = id;
  block.data = (*region)->data();
  block.nbytes = (*region)->nbytes();
  absl::MutexLock lock(&pinned_mu_);
  pinned_.emplace(id, *std::move(region));
  return block;
}

void SessionConnection::FreePinned(const PinnedBlock& block) {
  if (block.region == 0) {
    std::free(block.data);
    return;
  }
  std::unique_ptr<PinnedRegion> region;
  {
    absl::MutexLock lock(&pinned_mu_);
    auto it = pinned_.find(block.region);
    if (it == pinned_.end()) return;
    region = std::move(it->second);
    pinned_.erase(it);
  }
  // The daemon keeps its mapping until the commands before this one have
  // completed; this process's view goes now (the caller is done with it).
  // Dropped when the session is over: the daemon released everything then.
  v1::Command command;
  command.mutable_release_pinned()->set_region(block.region);
  Enqueue(command, absl::StrCat("release pinned region ", block.region));
}

absl::Status SessionConnection::EnqueuePinnedChunks(
    int device, uint64_t stream, uint64_t nbytes, const std::string& describe,
    absl::FunctionRef<void(v1::Command*, uint64_t done, uint64_t n)> fill) {
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t n = std::min(nbytes - done, kMaxPinnedCopyChunk);
    v1::Command command;
    command.set_device(device);
    command.set_stream(stream);
    fill(&command, done, n);
    if (Enqueue(command, describe) == 0) {
      absl::MutexLock lock(&mu_);
      return UnusableLocked();
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status SessionConnection::UploadPinned(int device, uint64_t stream, uint64_t addr,
                                             uint64_t region, uint64_t offset, uint64_t nbytes,
                                             const std::string& describe) {
  return EnqueuePinnedChunks(device, stream, nbytes, describe,
                             [&](v1::Command* command, uint64_t done, uint64_t n) {
                               v1::CopyToDevice* copy = command->mutable_copy_to_device();
                               copy->set_addr(addr + done);
                               copy->mutable_pinned()->set_region(region);
                               copy->mutable_pinned()->set_offset(offset + done);
                               copy->mutable_pinned()->set_nbytes(n);
                             });
}

absl::Status SessionConnection::DownloadPinned(int device, uint64_t stream, uint64_t region,
                                               uint64_t offset, uint64_t addr, uint64_t nbytes,
                                               const std::string& describe) {
  return EnqueuePinnedChunks(device, stream, nbytes, describe,
                             [&](v1::Command* command, uint64_t done, uint64_t n) {
                               v1::CopyFromDevice* copy = command->mutable_copy_from_device();
                               copy->set_addr(addr + done);
                               copy->set_nbytes(n);
                               copy->mutable_pinned()->set_region(region);
                               copy->mutable_pinned()->set_offset(offset + done);
                               copy->mutable_pinned()->set_nbytes(n);
                             });
}

}  // namespace flagos::client
