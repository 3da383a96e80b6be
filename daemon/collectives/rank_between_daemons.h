// One rank, in this daemon, of a torch.distributed process group whose ranks
// are sessions of different daemons (several nodes, or a private daemon per
// rank): its collectives run through torch's ProcessGroupGloo inside flagosd
// (gloo_process_group.h), between the daemons over TCP, on the tensors the
// op runner hands the flagos_c10d kernels (the device memory on the cpu
// backend, host copies on the cpu_fallback route).
//
// The ranks meet in the c10d Store the client's process group was formed on
// (a TCPStore: its address comes from the client), under the communicator's
// key. Before each collective the ranks compare what they called (a
// fingerprint of the signature, one small allreduce): a rank whose kind,
// dtype, size, root or op differs fails the collective on every rank naming
// both calls, instead of a hang or a wrong answer, and all_to_all first
// exchanges its split sizes. A collective that fails (a peer gone, the
// timeout) breaks the rank: each later one fails at once with that error.
// When a rank's session closes, its daemon leaves a note in the Store
// (NoteLeft); a peer's failed collective names the ranks that left. On a
// backend with a collective library (BKCL), the collectives it can take run
// through it instead, between the daemons' devices (RunThroughLibrary).
//
// Thread safety: one rank's collectives run one at a time, in the order its
// kernels call them (a mutex): each may be called from any thread.
// (ATen TU)
#ifndef FLAGOS_DAEMON_COLLECTIVES_RANK_BETWEEN_DAEMONS_H_
#define FLAGOS_DAEMON_COLLECTIVES_RANK_BETWEEN_DAEMONS_H_

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flagos/device_collectives.h"

namespace flagos::daemon {

class RankBetweenDaemons {
 public:
  // Rank `rank` of `nranks` of communicator `comm`, of process `pid`: meets
  // its peers in the TCPStore at `store_host`:`store_port` (returns once
  // every rank joined; throws c10::Error naming what failed, after at most
  // `timeout`).
  static std::unique_ptr<RankBetweenDaemons> Join(const std::string& comm, int rank, int nranks,
                                                  int64_t pid, const std::string& store_host,
                                                  int store_port, absl::Duration timeout);
  ~RankBetweenDaemons();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  // The collectives. `signature` describes the call as its peers must match
  // it (collective_ops.cc's); each returns once this rank's tensors hold
  // their results, or throws c10::Error naming the collective and why.
  void AllReduce(at::Tensor& t, int64_t reduce_op, const std::string& signature,
                 double timeout_s);
  void Broadcast(at::Tensor& t, int64_t root, const std::string& signature, double timeout_s);
  void AllGather(at::Tensor& out, const at::Tensor& in, const std::string& signature,
                 double timeout_s);
  void ReduceScatter(at::Tensor& out, const at::Tensor& in, int64_t reduce_op,
                     const std::string& signature, double timeout_s);
  // Splits in rows (dim 0), one per rank.
  void AllToAll(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                const std::vector<int64_t>& in_splits, const std::string& signature,
                double timeout_s);
  // A collective through the devices' collective library (BKCL on
  // kunlunxin) instead of gloo, on the tensors' device memory
  // (library_collectives.h decides which calls take it; every rank of the
  // group must, or the comparison of their calls fails them all): after the
  // same comparison, `issue` issues this rank's part on its stream with the
  // rank's library context, joined by the group's first such call (rank 0's
  // daemon makes the communicator id and publishes it in the Store; the
  // ranks first check that no two of them share a device of one daemon).
  // Then it waits until `done` says the stream completed the part; past the
  // group's timeout the library context is aborted and the rank broken.
  // Throws c10::Error naming the collective and why.
  void RunThroughLibrary(const std::string& signature, double timeout_s,
                         DeviceCollectives& library, int device,
                         const std::function<absl::Status(CollectiveRank&)>& issue,
                         const std::function<absl::StatusOr<bool>()>& done);

  void Send(const at::Tensor& t, int64_t dst, int64_t tag, double timeout_s);
  void Recv(at::Tensor& t, int64_t src, int64_t tag, double timeout_s);

  // This rank's session closed without destroying the group: says so in the
  // Store, for the peers' errors. Best effort (the Store may be gone).
  void NoteLeft();

 private:
  RankBetweenDaemons(std::string comm, int rank, int nranks, int64_t pid,
                     c10::intrusive_ptr<c10d::Store> notes,
                     c10::intrusive_ptr<c10d::Backend> group);

  using Issue = std::function<c10::intrusive_ptr<c10d::Work>(std::chrono::milliseconds)>;
  // Exchanges what the peers need to compare beyond the signature; returns
  // what this rank found wrong ("" if nothing).
  using Precheck = std::function<std::string(std::chrono::milliseconds)>;
  enum class Check { kSameCall, kNone };  // kNone: a send or recv

  // Runs `signature`: `precheck` and the comparison of the ranks' calls
  // (kSameCall), then `issue(timeout)`, whose Work it waits for. A failure
  // breaks the rank; both throw c10::Error.
  void Run(const std::string& signature, double timeout_s, const Issue& issue,
           Check check = Check::kSameCall, const Precheck& precheck = nullptr);
  // Run's steps around `body(timeout)`, which throws what failed; `engine`
  // names what carried it in the error ("gloo between the daemons").
  void RunBody(const std::string& signature, double timeout_s,
               const std::function<void(std::chrono::milliseconds)>& body, Check check,
               const Precheck& precheck, absl::string_view engine);
  // The library context of this rank on `device`, joined the first time
  // (RunThroughLibrary); throws c10::Error. Called with order_mu_ held.
  CollectiveRank& LibraryRank(DeviceCollectives& library, int device,
                              std::chrono::milliseconds timeout);
  // "" when every rank called `signature` and none found a `problem`; else
  // what differs or what was found, the same on every rank.
  std::string CheckSameCall(const std::string& signature, std::chrono::milliseconds timeout,
                            const std::string& problem);
  // What the peers said when they left (NoteLeft), joined; "" if none did.
  std::string PeersThatLeft();

  const std::string comm_;
  const int rank_;
  const int nranks_;
  const int64_t pid_;
  const c10::intrusive_ptr<c10d::Store> notes_;
  const c10::intrusive_ptr<c10d::Backend> group_;

  absl::Mutex order_mu_;  // held through a collective: they run one at a time
  // The rank's context in the devices' collective library (joined by the
  // first collective through it), and its device: touched only inside a
  // collective, order_mu_ held (RunBody's body).
  std::unique_ptr<CollectiveRank> library_rank_;
  int library_device_ = -1;
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;  // the next collective's number
  std::string broken_ ABSL_GUARDED_BY(mu_);  // why the rank broke; "" while it works
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_RANK_BETWEEN_DAEMONS_H_
