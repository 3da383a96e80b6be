#include "staging_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "attach_socket.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

uint64_t RoundUp(uint64_t n, uint64_t m) { return (n + m - 1) / m * m; }

}  // namespace

absl::StatusOr<std::unique_ptr<StagingRegion>> StagingRegion::Create(uint64_t data_bytes,
                                                                     uint64_t slot_bytes) {
  if (slot_bytes == 0 || slot_bytes % 4096 != 0 || data_bytes == 0 ||
      data_bytes % slot_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("staging region: ", data_bytes,
                                                   " bytes in slots of ", slot_bytes,
                                                   " is not a valid layout"));
  }
  const uint64_t slot_count = data_bytes / slot_bytes;
  const uint64_t data_offset = RoundUp(slot_count, 4096);
  const uint64_t size = data_offset + data_bytes;
  const int fd = memfd_create("flagos-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("staging region: memfd_create failed");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status s = Errno("staging region: sizing or sealing the memfd failed");
    close(fd);
    return s;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("staging region: mapping ", size, " bytes failed"));
    close(fd);
    return s;
  }
  return std::unique_ptr<StagingRegion>(new StagingRegion(
      fd, static_cast<char*>(base), size, slot_bytes, slot_count, data_offset));
}

StagingRegion::StagingRegion(int fd, char* base, uint64_t size, uint64_t slot_bytes,
                             uint64_t slot_count, uint64_t data_offset)
    : fd_(fd),
      base_(base),
      size_(size),
      slot_bytes_(slot_bytes),
      slot_count_(slot_count),
      data_offset_(data_offset),
      max_chunk_(std::max<uint64_t>(slot_bytes, slot_count / 4 * slot_bytes)) {}

StagingRegion::~StagingRegion() {
  munmap(base_, size_);
  close(fd_);
}

absl::StatusOr<int> StagingRegion::Attach(const std::string& socket_path, uint64_t session_id,
                                          const std::string& token, absl::Time deadline) {
  v1::StagingAttach attach;
  attach.set_session_id(session_id);
  attach.set_token(token);
  attach.set_slot_bytes(slot_bytes_);
  attach.set_slot_count(slot_count_);
  attach.set_data_offset(data_offset_);
  return SendAttach(socket_path, attach, fd_, deadline);
}

uint8_t StagingRegion::LoadFlag(uint64_t slot) const {
  return std::atomic_ref<uint8_t>(*reinterpret_cast<uint8_t*>(base_ + slot))
      .load(std::memory_order_acquire);
}

void StagingRegion::StoreFlag(uint64_t slot, uint8_t value) {
  std::atomic_ref<uint8_t>(*reinterpret_cast<uint8_t*>(base_ + slot))
      .store(value, std::memory_order_release);
}

void StagingRegion::ReclaimLocked() {
  while (!claimed_.empty() && LoadFlag(claimed_.front().first_slot) == 0) claimed_.pop_front();
  if (claimed_.empty()) head_ = 0;  // start over: the longest contiguous run
}

std::optional<StagingRegion::Chunk> StagingRegion::TryClaim(uint64_t nbytes) {
  if (nbytes == 0 || nbytes > max_chunk_) return std::nullopt;
  const uint64_t slots = (nbytes + slot_bytes_ - 1) / slot_bytes_;
  absl::MutexLock lock(&mu_);
  ReclaimLocked();
  uint64_t start;
  if (claimed_.empty()) {
    start = 0;
  } else {
    const uint64_t tail = claimed_.front().first_slot;
    if (head_ > tail) {
      // Free: [head_, end) and [0, tail).
      if (slot_count_ - head_ >= slots) {
        start = head_;
      } else if (tail >= slots) {
        // Skip the end of the ring: a padding chunk, free at once.
        StoreFlag(head_, 0);
        claimed_.push_back({head_, slot_count_ - head_});
        start = 0;
      } else {
        return std::nullopt;
      }
    } else if (head_ < tail && tail - head_ >= slots) {
      start = head_;  // free: [head_, tail)
    } else {
      return std::nullopt;  // head_ == tail with chunks claimed: full
    }
  }
  StoreFlag(start, 1);
  claimed_.push_back({start, slots});
  head_ = start + slots;
  if (head_ == slot_count_) head_ = 0;
  Chunk chunk;
  chunk.offset = start * slot_bytes_;
  chunk.nbytes = nbytes;
  chunk.data = base_ + data_offset_ + chunk.offset;
  return chunk;
}

void StagingRegion::Release(uint64_t offset) { StoreFlag(offset / slot_bytes_, 0); }

}  // namespace flagos::client
