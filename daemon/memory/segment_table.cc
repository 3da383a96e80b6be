#include "memory/segment_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flagos::daemon {

std::optional<Segment> SegmentTable::Floor(int device, const Intervals& intervals,
                                           DevicePtr addr) {
  auto it = intervals.upper_bound(addr);
  if (it == intervals.begin()) return std::nullopt;
  --it;
  return Segment{device, it->first, it->second};
}

absl::Status SegmentTable::Insert(int device, DevicePtr addr, uint64_t nbytes) {
  uint64_t end = 0;
  if (nbytes == 0 || __builtin_add_overflow(addr, nbytes, &end)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "segment 0x%x + %d bytes on flagos:%d is empty or wraps around", addr, nbytes, device));
  }
  absl::MutexLock lock(&mu_);
  Intervals& intervals = devices_[device];
  // The first segment starting at or after addr must start at or after end;
  // the one before must end at or before addr.
  auto next = intervals.lower_bound(addr);
  const bool overlaps_next = next != intervals.end() && next->first < end;
  bool overlaps_previous = false;
  if (next != intervals.begin()) {
    auto previous = std::prev(next);
    overlaps_previous = previous->first + previous->second > addr;
  }
  if (overlaps_next || overlaps_previous) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "segment 0x%x + %d bytes on flagos:%d overlaps a segment the session already holds",
        addr, nbytes, device));
  }
  intervals.emplace(addr, nbytes);
  device_bytes_[device] += nbytes;
  total_bytes_ += nbytes;
  ++count_;
  return absl::OkStatus();
}

absl::StatusOr<Segment> SegmentTable::Remove(int device, DevicePtr addr) {
  absl::MutexLock lock(&mu_);
  auto device_it = devices_.find(device);
  if (device_it != devices_.end()) {
    auto it = device_it->second.find(addr);
    if (it != device_it->second.end()) {
      Segment segment{device, it->first, it->second};
      device_it->second.erase(it);
      device_bytes_[device] -= segment.nbytes;
      total_bytes_ -= segment.nbytes;
      --count_;
      removals_.fetch_add(1, std::memory_order_acq_rel);
      return segment;
    }
  }
  return absl::NotFoundError(absl::StrFormat(
      "no segment of this session starts at 0x%x on flagos:%d (freed twice, or not an address "
      "returned by allocate)",
      addr, device));
}

std::optional<Segment> SegmentTable::Lookup(int device, DevicePtr addr) const {
  absl::MutexLock lock(&mu_);
  auto device_it = devices_.find(device);
  if (device_it == devices_.end()) return std::nullopt;
  std::optional<Segment> segment = Floor(device, device_it->second, addr);
  if (!segment.has_value() || addr - segment->addr >= segment->nbytes) return std::nullopt;
  return segment;
}

bool SegmentTable::Contains(int device, DevicePtr addr, uint64_t nbytes) const {
  absl::MutexLock lock(&mu_);
  auto device_it = devices_.find(device);
  if (device_it == devices_.end()) return false;
  std::optional<Segment> segment = Floor(device, device_it->second, addr);
  if (!segment.has_value()) return false;
  const uint64_t offset = addr - segment->addr;
  return offset <= segment->nbytes && nbytes <= segment->nbytes - offset;
}

std::vector<Segment> SegmentTable::TakeAll() {
  absl::MutexLock lock(&mu_);
  std::vector<Segment> segments;
  segments.reserve(count_);
  for (const auto& [device, intervals] : devices_) {
    for (const auto& [addr, nbytes] : intervals) segments.push_back(Segment{device, addr, nbytes});
  }
  devices_.clear();
  device_bytes_.clear();
  total_bytes_ = 0;
  count_ = 0;
  removals_.fetch_add(1, std::memory_order_acq_rel);
  return segments;
}

uint64_t SegmentTable::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

uint64_t SegmentTable::device_bytes(int device) const {
  absl::MutexLock lock(&mu_);
  auto it = device_bytes_.find(device);
  return it == device_bytes_.end() ? 0 : it->second;
}

uint64_t SegmentTable::size() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

}  // namespace flagos::daemon
