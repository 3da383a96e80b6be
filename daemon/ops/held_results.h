// Tensor results a session's calls asked the daemon to keep
// (OpCall.hold_results), by id, until a place_result moves one into device
// memory (OpRunner::PlaceResult) and forgets it.
//
// Header only (its tensors are ATen's; it is included by ATen translation
// units alone).
//
// Thread safety: every method may be called concurrently (the session's
// workers hold and place results at once). `mu_` is a leaf: nothing else is
// locked, and nothing waits, while it is held; callers may hold the
// session's locks (Session::memory_mu_, for reading) when they call in.
#ifndef FLAGOS_DAEMON_OPS_HELD_RESULTS_H_
#define FLAGOS_DAEMON_OPS_HELD_RESULTS_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class HeldResults {
 public:
  // At most `max_held` results are held at once.
  explicit HeldResults(size_t max_held) : max_held_(max_held) {}

  // Keeps `tensor` (a contiguous host tensor) and returns its id;
  // RESOURCE_EXHAUSTED when max_held are held already.
  absl::StatusOr<uint64_t> Hold(at::Tensor tensor) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (held_.size() >= max_held_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the session holds ", held_.size(), " results not yet placed, the most flagosd keeps (",
          max_held_, "); send place_result for them"));
    }
    const uint64_t id = next_id_++;
    held_.emplace(id, std::move(tensor));
    return id;
  }

  // The result held as `id` (still held), or nullopt.
  std::optional<at::Tensor> Find(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return std::nullopt;
    return it->second;
  }

  // The result held as `id`, no longer held, or nullopt.
  std::optional<at::Tensor> Take(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return std::nullopt;
    at::Tensor tensor = std::move(it->second);
    held_.erase(it);
    return tensor;
  }

 private:
  const size_t max_held_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, at::Tensor> held_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_HELD_RESULTS_H_
