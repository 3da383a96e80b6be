#include "ops/host_mirror.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {

void HostMirror::Add(uint64_t begin, uint64_t nbytes, bool read) {
  ranges_.push_back(Range{begin / kAlignment * kAlignment, begin + nbytes, read, nullptr});
}

absl::Status HostMirror::Fetch() {
  std::sort(ranges_.begin(), ranges_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // Merge overlapping ranges (not merely adjacent ones: two tensors that
  // touch may lie in two allocations).
  std::vector<Range> merged;
  for (const Range& range : ranges_) {
    if (!merged.empty() && range.begin < merged.back().end) {
      merged.back().end = std::max(merged.back().end, range.end);
      merged.back().read |= range.read;
    } else {
      merged.push_back(range);
    }
  }
  ranges_ = std::move(merged);
  bool any_read = false;
  for (Range& range : ranges_) {
    const uint64_t nbytes = range.end - range.begin;
    range.host = Allocate(nbytes);
    if (!range.read) continue;
    if (absl::Status s =
            runtime_.CopyDeviceToHost(device_, stream_, range.host, range.begin, nbytes);
        !s.ok()) {
      // Copies issued before this one may still be writing into buffers:
      // keep them until the stream is done with them.
      (void)runtime_.SynchronizeStream(device_, stream_);
      return s;
    }
    bytes_fetched_ += nbytes;
    any_read = true;
  }
  // The kernel runs on the host next: the bytes must have arrived. A slow
  // device keeps this job waiting, so it waits as a blocked job: its pool
  // runs the other streams' jobs on a spare thread meanwhile (worker_pool.h).
  if (!any_read) return absl::OkStatus();
  WorkerPool::Blocking blocking;
  return runtime_.SynchronizeStream(device_, stream_);
}

char* HostMirror::Allocate(uint64_t nbytes) {
  buffers_.emplace_back(static_cast<char*>(::operator new[](nbytes, std::align_val_t{kAlignment})));
  return buffers_.back().get();
}

void HostMirror::Snapshot() {
  for (Range& range : ranges_) {
    if (!range.read) continue;
    range.snapshot = Allocate(range.end - range.begin);
    std::memcpy(range.snapshot, range.host, range.end - range.begin);
  }
}

const HostMirror::Range* HostMirror::Find(uint64_t addr) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                             [](uint64_t a, const Range& r) { return a < r.begin; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

char* HostMirror::Address(uint64_t addr) const {
  const Range* range = Find(addr);
  return range == nullptr ? nullptr : range->host + (addr - range->begin);
}

void HostMirror::MarkWritten(uint64_t begin, uint64_t nbytes) {
  if (nbytes > 0) written_.push_back(Written{begin, begin + nbytes});
}

absl::Status HostMirror::WriteBack() {
  // Bytes a kernel changed without its schema saying so.
  for (const Range& range : ranges_) {
    if (range.snapshot == nullptr) continue;
    const uint64_t nbytes = range.end - range.begin;
    if (std::memcmp(range.snapshot, range.host, nbytes) == 0) continue;
    uint64_t first = 0;
    while (range.snapshot[first] == range.host[first]) ++first;
    uint64_t last = nbytes;
    while (range.snapshot[last - 1] == range.host[last - 1]) --last;
    written_.push_back(Written{range.begin + first, range.begin + last});
  }
  std::sort(written_.begin(), written_.end(),
            [](const Written& a, const Written& b) { return a.begin < b.begin; });
  absl::Status status;
  uint64_t i = 0;
  while (i < written_.size() && status.ok()) {
    uint64_t begin = written_[i].begin;
    uint64_t end = written_[i].end;
    // Overlapping written ranges lie in one mirrored range (those are
    // disjoint); merely adjacent ones may not.
    for (++i; i < written_.size() && written_[i].begin < end; ++i) {
      end = std::max(end, written_[i].end);
    }
    const Range* range = Find(begin);
    if (range == nullptr || end > range->end) {
      status = absl::InternalError(absl::StrCat(
          "cpu_fallback: a written range at 0x", absl::Hex(begin), " was not mirrored"));
      break;
    }
    status = runtime_.CopyHostToDevice(device_, stream_, begin, range->host + (begin - range->begin),
                                       end - begin);
    if (status.ok()) bytes_written_back_ += end - begin;
  }
  if (buffers_.empty()) return status;
  // The buffers go with a host function: released once the stream has run
  // the copies above. If even that cannot be issued, wait here instead.
  auto buffers = std::make_shared<std::vector<Buffer>>(std::move(buffers_));
  absl::Status launched = runtime_.LaunchHostFunc(
      device_, stream_, [buffers](absl::Status) mutable { buffers->clear(); });
  if (!launched.ok()) {
    (void)runtime_.SynchronizeStream(device_, stream_);
    if (status.ok()) status = launched;
  }
  return status;
}

}  // namespace flagos::daemon
