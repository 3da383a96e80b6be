// Communicators formed by the sessions of one daemon: the ranks of a
// torch.distributed process group whose flagos tensors live on this daemon's
// devices (torch_fl.distributed, docs/distributed.md).
//
// A communicator is named by the key its rank 0 published in the c10d Store
// and lives until every rank destroyed it (or none is waiting and it broke).
// Each rank's k-th collective on a communicator meets the other ranks' k-th
// one, as in NCCL: a Round. Every rank that arrives waits (holding its
// worker) until all have arrived; then each rank runs its part of the
// collective over every rank's buffers, on its own thread (rank r computes
// the r-th share of the result, so n ranks reduce with n threads), and all
// return the same status once every part is done. A rank that does not arrive within the collective's timeout, or
// whose collective differs from its peers' (kind, dtype, sizes, root, op),
// fails the round for every rank, naming who and what, and breaks the
// communicator: every later collective on it fails at once with that error,
// as a NCCL communicator that hit an error is aborted.
//
// Each rank belongs to the session that first ran a collective as that
// rank (CollectiveCaller names it). When a session closes (its process
// exited, crashed or lost the daemon) LeaveSession breaks every
// communicator it still had a rank in: the peers waiting in a round, and
// every later collective, fail at once naming the rank and its process,
// instead of waiting out the timeout; and nothing outlives the job.
//
// A rank waiting for its peers holds its stream's worker, inside a
// WorkerPool::Blocking scope: the device's pool runs the other ranks' work on
// spare threads, so that a group may have more ranks on one device than the
// device has workers (--workers-per-device). At most WorkerPool::kMaxBlocked
// ranks wait per device at once; a rank beyond that fails its round
// (RESOURCE_EXHAUSTED) rather than wait.
//
// Thread safety: every method may be called from any thread.
#ifndef FLAGOS_DAEMON_COLLECTIVES_COMMUNICATORS_H_
#define FLAGOS_DAEMON_COLLECTIVES_COMMUNICATORS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace flagos::daemon {

// What a rank brings to a collective: a description its peers must match
// (`signature`, e.g. "all_reduce sum float32[1024]") and its buffers (opaque
// here; the collective's kernel knows their type).
struct CollectiveArrival {
  std::string signature;
  void* buffers = nullptr;
};

// Counts the daemon shows on /metrics and GetStats.
struct CollectiveCounts {
  uint64_t collectives = 0;   // rounds completed (one per collective, not per rank)
  uint64_t by_library = 0;    // of those, run by the backend's collective library (BKCL)
  uint64_t bytes = 0;         // bytes the completed rounds' ranks contributed
  uint64_t failed = 0;        // rounds that ended in an error
  uint64_t communicators = 0; // communicators alive now
};

// What a backend's collective library keeps for a communicator's life (its
// ranks' contexts, device_collectives.h): made by the first round that asks
// for it (Communicators::State) and destroyed once the communicator is
// forgotten, outside the daemon's locks; Abort() first when it broke (a
// rank's part may wait on the device for peers that will not come).
class CommunicatorState {
 public:
  virtual ~CommunicatorState() = default;
  virtual void Abort() {}
};

// The session whose operator runs on this thread: set by the session
// around an op call, read by the collective kernels (whose schemas carry
// no session).
class CollectiveCaller {
 public:
  CollectiveCaller(uint64_t session, int64_t pid);
  ~CollectiveCaller();
  CollectiveCaller(const CollectiveCaller&) = delete;
  CollectiveCaller& operator=(const CollectiveCaller&) = delete;

  // 0 and -1 on a thread that runs no session's op.
  static uint64_t session();
  static int64_t pid();

 private:
  uint64_t prev_session_;
  int64_t prev_pid_;
};

class Communicators {
 public:
  // Runs part `part` of a round's collective over every rank's arrival
  // (index = rank). Each rank calls its own with part = its rank, once all
  // have arrived, at the same time as the others: the parts must touch
  // disjoint memory (a collective that does not split does all its work in
  // part 0 and none in the others).
  using Combine =
      absl::FunctionRef<absl::Status(absl::Span<const CollectiveArrival>, int part)>;

  // The daemon's communicators.
  static Communicators& Get();

  // Rank `rank` of `nranks`, of session `session` (process `pid`),
  // arrives at its next collective on communicator `key` (created by the
  // first arrival). Returns when the round is over: its status, the same
  // for every rank. `bytes` counts towards /metrics. INVALID_ARGUMENT when
  // another session already is that rank.
  absl::Status Arrive(const std::string& key, int rank, int nranks, uint64_t session,
                      int64_t pid, CollectiveArrival arrival, uint64_t bytes,
                      absl::Duration timeout, Combine combine);

  // Session `session` closed: each communicator in which it holds a rank
  // not yet destroyed breaks (UNAVAILABLE naming the rank and process) and
  // the rounds waiting on it fail, except a round whose collective already
  // runs (it finishes: it may be writing into the session's memory, which
  // the session frees only after its streams drained). Call before the
  // session's streams are drained: its own waiting ranks are released.
  void LeaveSession(uint64_t session);

  // Rank `rank` is done with communicator `key`: once every rank has said
  // so (or the communicator broke and no rank is waiting in it), it is
  // forgotten. Unknown keys are ignored (a rank that never ran a collective).
  void Destroy(const std::string& key, int rank);

  // Communicator `key`'s library state, made by `make` if it has none.
  // Call from a round's Combine (the communicator exists while one runs);
  // nullptr for a communicator that is gone.
  std::shared_ptr<CommunicatorState> State(
      const std::string& key, absl::FunctionRef<std::unique_ptr<CommunicatorState>()> make);

  // A round that the backend's collective library ran completed (counted
  // once per round, by its rank 0).
  void CountLibraryCollective();

  CollectiveCounts counts() const;

  // The largest group one daemon forms: each rank is a session of its own,
  // and a communicator's state grows with its ranks.
  static constexpr int kMaxRanks = 4096;

 private:
  struct Round;
  struct Communicator;

  absl::Status ArriveLocked(Communicator* comm, const std::string& key, int rank,
                            CollectiveArrival arrival, uint64_t bytes, absl::Duration timeout,
                            Combine combine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets communicator `key` when it is done or broke and nobody waits in
  // it; its library state goes to `dropped`, for the caller to release
  // after unlocking.
  void MaybeForget(const std::string& key, std::vector<std::shared_ptr<CommunicatorState>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Remembers why communicator `key` broke, once it is forgotten: a rank
  // that arrives later fails at once instead of forming it anew and
  // waiting for ranks that are gone. The oldest are dropped beyond
  // kMaxBrokenRemembered.
  void RememberBroken(const std::string& key, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kMaxBrokenRemembered = 4096;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Communicator>> comms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Status> broken_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> broken_order_ ABSL_GUARDED_BY(mu_);
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t by_library_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_COMMUNICATORS_H_
