#include "execution/stream_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {

StreamTable::StreamTable(uint64_t session_id, DeviceRuntime* runtime,
                         std::vector<WorkerPool*> pools, DeviceActivity* activity)
    : session_id_(session_id), runtime_(runtime), pools_(std::move(pools)), activity_(activity) {}

absl::StatusOr<SessionStream*> StreamTable::Get(int device, uint64_t stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find({device, stream});
  if (it != streams_.end()) return it->second.get();
  if (streams_.size() >= static_cast<size_t>(kMaxStreamsPerSession)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session already uses ", streams_.size(), " streams, the most flagosd allows (",
        kMaxStreamsPerSession, "); reuse streams"));
  }
  if (device < 0 || static_cast<size_t>(device) >= pools_.size() || pools_[device] == nullptr) {
    return absl::InternalError(absl::StrCat("flagosd has no worker pool for ", DeviceName(device),
                                            " (", pools_.size(), " pools)"));
  }
  auto state = std::make_unique<SessionStream>();
  state->device = device;
  if (stream != 0) {
    absl::StatusOr<StreamHandle> handle = runtime_->CreateStream(device);
    if (!handle.ok()) return handle.status();
    state->backend_stream = *handle;
  }
  state->queue = std::make_unique<StreamQueue>(
      absl::StrCat("session ", session_id_, " ", DeviceName(device), " stream ", stream),
      pools_[device], activity_ == nullptr ? nullptr : activity_->clock(device));
  state->window.emplace(runtime_, device, state->backend_stream, state->queue.get());
  SessionStream* raw = state.get();
  streams_.emplace(std::make_pair(device, stream), std::move(state));
  return raw;
}

SessionStream* StreamTable::Find(int device, uint64_t stream) const {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find({device, stream});
  return it == streams_.end() ? nullptr : it->second.get();
}

std::vector<SessionStream*> StreamTable::OnDevice(int device) const {
  std::vector<SessionStream*> streams;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, state] : streams_) {
    if (device < 0 || key.first == device) streams.push_back(state.get());
  }
  return streams;
}

size_t StreamTable::size() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

StreamTable::Map StreamTable::TakeAll() {
  Map taken;
  absl::MutexLock lock(&mu_);
  taken.swap(streams_);
  return taken;
}

}  // namespace flagos::daemon
