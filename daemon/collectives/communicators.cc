#include "collectives/communicators.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {

struct Communicators::Round {
  explicit Round(int nranks) : arrivals(nranks), present(nranks, false) {}
  std::vector<CollectiveArrival> arrivals;
  std::vector<bool> present;
  int first = -1;      // the rank that arrived first: whose signature the others match
  int arrived = 0;
  int left = 0;        // arrived ranks that have returned
  bool running = false;  // every rank arrived: each runs its part of the collective
  int parts_done = 0;
  absl::Status part_status;  // the first part's error
  bool done = false;
  uint64_t bytes = 0;
  absl::Status status;
};

struct Communicators::Communicator {
  explicit Communicator(int n)
      : nranks(n), next_seq(n, 0), destroyed(n, false), session(n, 0), pid(n, -1) {}
  const int nranks;
  std::vector<uint64_t> next_seq;  // each rank's next collective
  std::vector<bool> destroyed;
  std::vector<uint64_t> session;   // each rank's session, 0 before its first collective
  std::vector<int64_t> pid;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Round>> rounds;
  int waiting = 0;                 // ranks inside Arrive
  absl::Status broken;             // the error that broke it, OK while it works
  std::shared_ptr<CommunicatorState> state;  // the collective library's, if any
};

namespace {
thread_local uint64_t caller_session = 0;
thread_local int64_t caller_pid = -1;
}  // namespace

CollectiveCaller::CollectiveCaller(uint64_t session, int64_t pid)
    : prev_session_(caller_session), prev_pid_(caller_pid) {
  caller_session = session;
  caller_pid = pid;
}

CollectiveCaller::~CollectiveCaller() {
  caller_session = prev_session_;
  caller_pid = prev_pid_;
}

uint64_t CollectiveCaller::session() { return caller_session; }
int64_t CollectiveCaller::pid() { return caller_pid; }

Communicators& Communicators::Get() {
  static Communicators* const kCommunicators = new Communicators();
  return *kCommunicators;
}

absl::Status Communicators::Arrive(const std::string& key, int rank, int nranks,
                                   uint64_t session, int64_t pid, CollectiveArrival arrival,
                                   uint64_t bytes, absl::Duration timeout, Combine combine) {
  if (nranks < 1 || nranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective on communicator ", key, ": a group of ", nranks,
        " ranks; one flagosd forms groups of 1 to ", kMaxRanks,
        " ranks (each rank is a session of this daemon)"));
  }
  if (rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective on communicator ", key, ": rank ", rank, " of ", nranks,
        " is not a rank of a group of that size"));
  }
  std::vector<std::shared_ptr<CommunicatorState>> dropped;  // released after the lock
  absl::MutexLock lock(&mu_);
  if (auto it = broken_.find(key); it != broken_.end()) return it->second;
  std::unique_ptr<Communicator>& slot = comms_[key];
  if (slot == nullptr) slot = std::make_unique<Communicator>(nranks);
  if (slot->nranks != nranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective on communicator ", key, ": rank ", rank, " says the group has ", nranks,
        " ranks, an earlier rank said ", slot->nranks,
        ": every rank must create the process group with the same world size"));
  }
  Communicator* comm = slot.get();
  if (comm->session[rank] == 0) {
    comm->session[rank] = session;
    comm->pid[rank] = pid;
  } else if (comm->session[rank] != session) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective on communicator ", key, ": rank ", rank, " is already process ",
        comm->pid[rank], " (session ", comm->session[rank], "), not process ", pid,
        ": every rank of a process group must be a different process (check RANK and "
        "LOCAL_RANK)"));
  }
  ++comm->waiting;
  absl::Status status = ArriveLocked(comm, key, rank, std::move(arrival), bytes, timeout, combine);
  --comm->waiting;
  MaybeForget(key, &dropped);
  return status;
}

absl::Status Communicators::ArriveLocked(Communicator* comm, const std::string& key, int rank,
                                         CollectiveArrival arrival, uint64_t bytes,
                                         absl::Duration timeout, Combine combine) {
  if (!comm->broken.ok()) return comm->broken;
  const uint64_t seq = comm->next_seq[rank]++;
  std::unique_ptr<Round>& slot = comm->rounds[seq];
  if (slot == nullptr) slot = std::make_unique<Round>(comm->nranks);
  Round* round = slot.get();
  const std::string what = absl::StrCat("collective #", seq, " on communicator ", key);
  const auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    round->status = std::move(s);
    round->done = true;
    comm->broken = round->status;
    ++failed_;
  };
  if (!round->done) {
    if (round->first >= 0 && arrival.signature != round->arrivals[round->first].signature) {
      fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": rank ", rank, " called ", arrival.signature, ", rank ", round->first,
          " called ", round->arrivals[round->first].signature,
          ": every rank must call the same collectives in the same order with the same sizes")));
    } else {
      if (round->first < 0) round->first = rank;
      round->arrivals[rank] = std::move(arrival);
      round->present[rank] = true;
      round->bytes += bytes;
    }
  }
  ++round->arrived;
  if (!round->done && round->arrived == comm->nranks) {
    round->running = true;  // every rank now runs its part
  } else if (!round->done) {
    // Waiting here holds this stream's worker: the pool stands a spare in
    // for it, so that the peers' ranks on the same device get workers.
    WorkerPool::Blocking blocking;
    if (!blocking.ok()) {
      fail(absl::ResourceExhaustedError(absl::StrCat(
          what, " (", round->arrivals[round->first].signature, "): ", WorkerPool::kMaxBlocked,
          " collectives already wait for their peers on this device's workers; the process "
          "group is broken: run fewer process groups or ranks per device at once")));
    }
    const absl::Time deadline = absl::Now() + timeout;
    const auto started = [round]() { return round->running || round->done; };
    while (!started()) {
      if (mu_.AwaitWithDeadline(absl::Condition(&started), deadline)) break;
      std::vector<int> missing;
      for (int r = 0; r < comm->nranks; ++r) {
        if (!round->present[r]) missing.push_back(r);
      }
      fail(absl::DeadlineExceededError(absl::StrCat(
          what, " (", round->arrivals[round->first].signature, "): rank",
          missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
          " did not join it within ", absl::FormatDuration(timeout),
          " (crashed, stopped, or called a different collective): the process group "
          "is broken; restart the job")));
    }
  }
  if (round->running && !round->done) {
    // This rank's part, without the lock (it may take a while); then wait
    // for the others' (bounded: they run, none waits for anything).
    mu_.Unlock();
    absl::Status s = combine(round->arrivals, rank);
    mu_.Lock();
    if (!s.ok() && round->part_status.ok()) round->part_status = std::move(s);
    if (++round->parts_done == comm->nranks) {
      round->running = false;
      if (round->part_status.ok()) {
        round->done = true;
        ++completed_;
        bytes_ += round->bytes;
      } else {
        fail(absl::Status(round->part_status.code(),
                          absl::StrCat(what, ": ", round->part_status.message())));
      }
    } else {
      mu_.Await(absl::Condition(&round->done));
    }
  }
  absl::Status status = round->status;
  if (++round->left == round->arrived && round->done) comm->rounds.erase(seq);
  return status;
}

void Communicators::Destroy(const std::string& key, int rank) {
  std::vector<std::shared_ptr<CommunicatorState>> dropped;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto it = comms_.find(key);
  if (it == comms_.end()) return;
  if (rank >= 0 && rank < it->second->nranks) it->second->destroyed[rank] = true;
  MaybeForget(key, &dropped);
}

std::shared_ptr<CommunicatorState> Communicators::State(
    const std::string& key, absl::FunctionRef<std::unique_ptr<CommunicatorState>()> make) {
  absl::MutexLock lock(&mu_);
  auto it = comms_.find(key);
  if (it == comms_.end()) return nullptr;
  if (it->second->state == nullptr) it->second->state = make();
  return it->second->state;
}

void Communicators::CountLibraryCollective() {
  absl::MutexLock lock(&mu_);
  ++by_library_;
}

void Communicators::LeaveSession(uint64_t session) {
  if (session == 0) return;
  std::vector<std::shared_ptr<CommunicatorState>> dropped;  // released after the lock
  absl::MutexLock lock(&mu_);
  std::vector<std::string> touched;
  for (auto& [key, comm] : comms_) {
    std::vector<int> gone;
    for (int r = 0; r < comm->nranks; ++r) {
      if (comm->session[r] == session && !comm->destroyed[r]) gone.push_back(r);
    }
    if (gone.empty()) continue;
    touched.push_back(key);
    for (int r : gone) comm->destroyed[r] = true;
    if (!comm->broken.ok()) continue;
    comm->broken = absl::UnavailableError(absl::StrCat(
        "communicator ", key, ": rank ", gone[0], " (process ", comm->pid[gone[0]],
        ") left the process group: its session with flagosd closed (the process exited, was "
        "killed or lost the daemon) without destroying the group; the process group is "
        "broken; restart the job"));
    for (auto& [seq, round] : comm->rounds) {
      if (round->done || round->running) continue;
      round->status = comm->broken;
      round->done = true;
      ++failed_;
    }
  }
  for (const std::string& key : touched) MaybeForget(key, &dropped);
}

void Communicators::MaybeForget(const std::string& key,
                                std::vector<std::shared_ptr<CommunicatorState>>* dropped) {
  auto it = comms_.find(key);
  if (it == comms_.end()) return;
  Communicator* comm = it->second.get();
  if (comm->waiting > 0) return;
  bool all_destroyed = true;
  for (bool d : comm->destroyed) all_destroyed = all_destroyed && d;
  // A broken communicator is forgotten as soon as no rank waits in it (a
  // rank that crashed never destroys it), and remembered as broken.
  if (!comm->broken.ok()) RememberBroken(key, comm->broken);
  if (all_destroyed || !comm->broken.ok()) {
    if (comm->state != nullptr) {
      // Wakes the ranks' device work that waits for a peer which failed.
      if (!comm->broken.ok()) comm->state->Abort();
      dropped->push_back(std::move(comm->state));
    }
    comms_.erase(it);
  }
}

void Communicators::RememberBroken(const std::string& key, const absl::Status& why) {
  if (!broken_.emplace(key, why).second) return;
  broken_order_.push_back(key);
  if (broken_order_.size() > kMaxBrokenRemembered) {
    broken_.erase(broken_order_.front());
    broken_order_.pop_front();
  }
}

CollectiveCounts Communicators::counts() const {
  absl::MutexLock lock(&mu_);
  return {completed_, by_library_, bytes_, failed_, comms_.size()};
}

}  // namespace flagos::daemon
