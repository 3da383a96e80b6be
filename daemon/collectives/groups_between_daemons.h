// The ranks this daemon's sessions hold in torch.distributed process groups
// that span daemons (rank_between_daemons.h), by session and communicator.
//
// A client whose group's ranks are not all sessions of its own daemon
// (torch_fl.distributed finds out at the group's creation) joins each of its
// ranks here with the flagos_c10d join_group operator; the collectives of
// that communicator then run through the rank's gloo group instead of this
// daemon's communicators (communicators.h). A rank ends when its process
// destroys the group (destroy_communicator) or its session closes: then the
// daemon first leaves a note for the peers (NoteSessionLeft, before the
// session's streams drain) and ends its ranks once the streams drained
// (LeaveSession): its gloo connections close, and a peer waiting on it fails
// at once, naming it.
//
// Thread safety: every method may be called from any thread.
#ifndef FLAGOS_DAEMON_COLLECTIVES_GROUPS_BETWEEN_DAEMONS_H_
#define FLAGOS_DAEMON_COLLECTIVES_GROUPS_BETWEEN_DAEMONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flagos::daemon {

class RankBetweenDaemons;

// Counts /metrics shows.
struct BetweenDaemonsCounts {
  uint64_t collectives = 0;  // completed by this daemon's ranks (one per rank)
  uint64_t bytes = 0;        // those ranks' inputs
  uint64_t failed = 0;
  uint64_t ranks = 0;  // ranks alive now
};

class GroupsBetweenDaemons {
 public:
  static GroupsBetweenDaemons& Get();

  // Session `session` (process `pid`) joins communicator `comm` as rank
  // `rank` of `nranks`, meeting its peers in the TCPStore at `host`:`port`.
  // Returns once every rank joined. ALREADY_EXISTS when the session holds a
  // rank of it already.
  absl::Status Join(uint64_t session, int64_t pid, const std::string& comm, int rank, int nranks,
                    const std::string& host, int port, absl::Duration timeout);

  // The session's rank in `comm`, or null (a communicator of this daemon).
  std::shared_ptr<RankBetweenDaemons> Find(uint64_t session, const std::string& comm) const;

  // The session's rank in `comm` is done (ignored when it has none).
  void Leave(uint64_t session, const std::string& comm);

  // The session is closing: notes for the peers (see above). Then, once its
  // streams drained, LeaveSession ends its ranks.
  void NoteSessionLeft(uint64_t session);
  void LeaveSession(uint64_t session);

  void Count(uint64_t bytes, bool ok);
  BetweenDaemonsCounts counts() const;

 private:
  using Key = std::pair<uint64_t, std::string>;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<RankBetweenDaemons>> ranks_ ABSL_GUARDED_BY(mu_);
  uint64_t collectives_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_GROUPS_BETWEEN_DAEMONS_H_
