#include "xpu_device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flagos::kunlunxin {

std::string DevicePrefix(int device) { return absl::StrCat("kunlunxin device ", device, ": "); }

std::string HexAddress(uint64_t value) { return absl::StrFormat("0x%x", value); }

void XpuStream::MarkCompleted(uint64_t upto) {
  uint64_t seen = completed.load(std::memory_order_acquire);
  while (seen < upto && !completed.compare_exchange_weak(seen, upto)) {
  }
}

XpuDevice::XpuDevice(int index, uint64_t total, uint64_t model)
    : index_(index),
      total_(total),
      model_(model),
      null_stream_(std::make_shared<XpuStream>(nullptr)) {}

absl::Status XpuDevice::Track(DevicePtr ptr, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  if (!allocations_.emplace(ptr, nbytes).second) {
    return absl::InternalError(absl::StrCat(
        DevicePrefix(index_), "xpu_malloc returned ", HexAddress(ptr),
        ", which is already a live allocation: the XPU runtime misbehaves; restart flagosd"));
  }
  allocated_ += nbytes;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> XpuDevice::Untrack(DevicePtr ptr) {
  absl::MutexLock lock(&mu_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) {
    return absl::NotFoundError(absl::StrCat(
        DevicePrefix(index_), "cannot free ", HexAddress(ptr),
        ": it is not the start of a live allocation on this device (freed twice, or "
        "allocated on another device?)"));
  }
  const uint64_t nbytes = it->second;
  allocations_.erase(it);
  allocated_ -= nbytes;
  return nbytes;
}

absl::Status XpuDevice::CheckRange(DevicePtr ptr, uint64_t nbytes, absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  auto it = allocations_.upper_bound(ptr);
  if (it != allocations_.begin()) {
    --it;
    const uint64_t offset = ptr - it->first;
    if (offset <= it->second && nbytes <= it->second - offset) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(DevicePrefix(index_), what, " range ", HexAddress(ptr), " + ", nbytes,
                   " bytes is not inside one live allocation of this device"));
}

std::pair<uint64_t, size_t> XpuDevice::Allocated() const {
  absl::MutexLock lock(&mu_);
  return {allocated_, allocations_.size()};
}

std::vector<DevicePtr> XpuDevice::TakeAllocations() {
  absl::MutexLock lock(&mu_);
  std::vector<DevicePtr> ptrs;
  for (const auto& [ptr, nbytes] : allocations_) ptrs.push_back(ptr);
  allocations_.clear();
  allocated_ = 0;
  return ptrs;
}

absl::StatusOr<std::shared_ptr<XpuStream>> XpuDevice::FindStream(StreamHandle stream) const {
  if (stream == 0) return null_stream_;
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return UnknownStream(stream);
  return it->second;
}

StreamHandle XpuDevice::AddStream(std::shared_ptr<XpuStream> stream) {
  absl::MutexLock lock(&mu_);
  const StreamHandle handle = next_stream_++;
  streams_.emplace(handle, std::move(stream));
  return handle;
}

absl::StatusOr<std::shared_ptr<XpuStream>> XpuDevice::RemoveStream(StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return UnknownStream(stream);
  std::shared_ptr<XpuStream> removed = std::move(it->second);
  streams_.erase(it);
  return removed;
}

std::vector<std::shared_ptr<XpuStream>> XpuDevice::Streams() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<XpuStream>> all = {null_stream_};
  for (const auto& [handle, stream] : streams_) all.push_back(stream);
  return all;
}

std::vector<std::shared_ptr<XpuStream>> XpuDevice::TakeCreatedStreams() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<XpuStream>> all;
  for (auto& [handle, stream] : streams_) all.push_back(std::move(stream));
  streams_.clear();
  return all;
}

EventHandle XpuDevice::AddEvent(std::shared_ptr<XpuEvent> event) {
  absl::MutexLock lock(&mu_);
  const EventHandle handle = next_event_++;
  events_.emplace(handle, std::move(event));
  return handle;
}

absl::StatusOr<std::shared_ptr<XpuEvent>> XpuDevice::FindEvent(EventHandle event) const {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return UnknownEvent(event);
  return it->second;
}

absl::StatusOr<std::shared_ptr<XpuEvent>> XpuDevice::RemoveEvent(EventHandle event) {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return UnknownEvent(event);
  std::shared_ptr<XpuEvent> removed = std::move(it->second);
  events_.erase(it);
  return removed;
}

std::vector<std::shared_ptr<XpuEvent>> XpuDevice::TakeEvents() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<XpuEvent>> all;
  for (auto& [handle, event] : events_) all.push_back(std::move(event));
  events_.clear();
  return all;
}

absl::Status XpuDevice::UnknownStream(StreamHandle stream) const {
  return absl::NotFoundError(absl::StrCat(DevicePrefix(index_), "stream ", stream,
                                          " does not exist (destroyed, or never created)"));
}

absl::Status XpuDevice::UnknownEvent(EventHandle event) const {
  return absl::NotFoundError(absl::StrCat(DevicePrefix(index_), "event ", event,
                                          " does not exist (destroyed, or never created)"));
}

}  // namespace flagos::kunlunxin
