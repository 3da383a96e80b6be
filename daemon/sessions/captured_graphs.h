// The graphs a session's client captured (torch.accelerator.Graph on
// flagos; flagos.proto DefineGraph, ReplayGraph, DestroyGraph), by the
// client's id: their commands, checked once as they are defined, and which
// of them draw random numbers relative to each replay's generator state.
//
// A graph holds only commands a stream runs without the host: op (no
// want_values, no hold_results), memset, and copy_device_to_device within
// its device. Its parts append until the last; a part that is refused
// drops the whole graph (the client never replays half of one).
//
// Thread safety: all methods may be called concurrently; a graph Get
// returned stays valid (and unchanged) after Destroy or Clear.
#ifndef FLAGOS_DAEMON_SESSIONS_CAPTURED_GRAPHS_H_
#define FLAGOS_DAEMON_SESSIONS_CAPTURED_GRAPHS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// Bounds of one session's graphs (docs/protocol.md, "Limits").
inline constexpr size_t kMaxGraphsPerSession = 4096;
inline constexpr size_t kMaxGraphCommandsPerSession = 1u << 20;
// Their commands' bytes (as encoded on the wire).
inline constexpr size_t kMaxGraphBytesPerSession = 1u << 30;

class PreparedOpCall;  // ops/prepared_op_call.h

// A graph's ops as the op runner decoded them once (OpRunner::Run's
// `prepare`), by command index; null for a command that runs as sent
// (not an op, a random op, an op that is more than its kernel call).
using PreparedCalls = std::vector<std::shared_ptr<const PreparedOpCall>>;

struct CapturedGraph {
  int device = 0;
  std::vector<v1::Command> commands;
  size_t bytes = 0;  // the commands' encoded size
  // Indices into `commands`, ascending, of the ops with a replay_relative
  // generator (an argument or implicit_generator).
  std::vector<uint32_t> random_ops;

  // Set by the first replay that ran every command without error
  // (sessions/session_graphs.cc), then only read.
  std::shared_ptr<const PreparedCalls> prepared() const {
    absl::MutexLock lock(&prepared_mu_);
    return prepared_calls_;
  }
  void set_prepared(std::shared_ptr<const PreparedCalls> calls) const {
    absl::MutexLock lock(&prepared_mu_);
    if (prepared_calls_ == nullptr) prepared_calls_ = std::move(calls);
  }
  // The session's count of removed segments (Session::MemoryRemovals) when
  // a replay last checked every range the graph names: while it is
  // unchanged the prepared calls' memory is still the session's.
  mutable std::atomic<uint64_t> ranges_checked_at{0};

 private:
  mutable absl::Mutex prepared_mu_;
  mutable std::shared_ptr<const PreparedCalls> prepared_calls_ ABSL_GUARDED_BY(prepared_mu_);
};

// Sets every replay_relative generator of `call` to draw from `rng`: its
// seed, and rng's offset plus its own; the mark is cleared.
void DrawFrom(const v1::GeneratorValue& rng, v1::OpCall* call);

class CapturedGraphs {
 public:
  // Checks one command of a part beyond its kind (the session: its
  // addresses against the session's segments); `index` counts from the
  // graph's first command.
  using CommandCheck = absl::FunctionRef<absl::Status(const v1::Command& command, size_t index)>;

  // Appends `part`'s commands (moved out) to graph part.graph() of
  // `device`, creating it: INVALID_ARGUMENT naming the command for one a
  // graph cannot hold, or what `check` says; FAILED_PRECONDITION for a
  // graph already complete or on another device; RESOURCE_EXHAUSTED past
  // the bounds above (graphs, commands, bytes). On any error the graph is
  // dropped.
  absl::Status Define(int device, v1::DefineGraph& part, CommandCheck check);
  // A complete graph; NOT_FOUND (naming what to do) otherwise.
  absl::StatusOr<std::shared_ptr<const CapturedGraph>> Get(uint64_t id) const;
  // NOT_FOUND when there is no such graph (complete or not).
  absl::Status Destroy(uint64_t id);
  void Clear();

 private:
  struct Entry {
    std::shared_ptr<CapturedGraph> graph;
    bool complete = false;
  };
  // REQUIRES: mu_ held. Drops graph `id` (present).
  void DropLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> graphs_ ABSL_GUARDED_BY(mu_);
  size_t commands_ ABSL_GUARDED_BY(mu_) = 0;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSIONS_CAPTURED_GRAPHS_H_
