// (ATen TU)
#include "collectives/rank_between_daemons.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admission/store_networks.h"
#include "collectives/gloo_process_group.h"
#include "collectives/peer_checked_store.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {
namespace {

// c10d's ReduceOp::RedOpType values, as the client sends them.
constexpr int64_t kAvg = 1;

// The group's timeout when the call gives none (c10d's default, 30 min).
std::chrono::milliseconds Millis(double timeout_s) {
  if (timeout_s <= 0) return ::kBackendDefaultTimeout;
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0 + 0.5));
}

std::chrono::milliseconds Millis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return ::kBackendDefaultTimeout;
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// The first line of an exception's message, without c10's backtrace.
std::string Why(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  if (const size_t eol = what.find('\n'); eol != std::string::npos) what.resize(eol);
  return what;
}

// FNV-1a: the same on every daemon, whatever its standard library.
int64_t Fingerprint(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 2);  // non-negative, and so is its negation's negation
}

// `t` as gloo takes it (dense, contiguous); `t` itself when it is.
at::Tensor Dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Copies `result` back into `t` when it was a copy of it.
void Back(at::Tensor& t, const at::Tensor& result) {
  if (!result.is_same(t)) t.copy_(result);
}

bool Overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  return a.numel() > 0 && b.numel() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// avg: gloo sums; the average is the sum divided here.
c10d::ReduceOp GlooOp(int64_t op) {
  return c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(op == kAvg ? 0 : op));
}

void Average(at::Tensor& t, int64_t op, int nranks) {
  if (op != kAvg) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    t.div_(nranks, "trunc");
  } else {
    t.div_(nranks);
  }
}

constexpr int64_t kTextBytes = 512;  // a call's description in the mismatch exchange

}  // namespace

std::unique_ptr<RankBetweenDaemons> RankBetweenDaemons::Join(
    const std::string& comm, int rank, int nranks, int64_t pid, const std::string& store_host,
    int store_port, absl::Duration timeout) {
  TORCH_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, "flagos process group: rank ", rank,
              " of ", nranks, " is not a rank of a group of that size");
  TORCH_CHECK(store_port > 0 && store_port < 65536, "flagos process group: store port ",
              store_port, " is not a TCP port");
  const std::string where = absl::StrCat("communicator ", comm, " (rank ", rank, " of ", nranks,
                                         ", process ", pid, ")");
  WorkerPool::Blocking blocking;
  TORCH_CHECK(blocking.ok(), where, ": ", WorkerPool::kMaxBlocked,
              " collectives already wait for their peers on this device's workers");
  // Only where --store-networks allows, at the address checked.
  const absl::StatusOr<std::string> address = StoreNetworks::Current().Resolve(store_host);
  TORCH_CHECK(address.ok(), where, ": flagosd does not join it: ", address.status().message());
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(store_port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = Millis(timeout);
    store = c10::make_intrusive<c10d::TCPStore>(*address, options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, where, ": flagosd could not reach the c10d Store at ", store_host, ":",
                store_port, " that the process group was formed on (", Why(e),
                "); the daemons of a group that spans daemons meet there, so its address must "
                "be reachable from every rank's flagosd (docs/distributed.md)");
  }
  auto notes = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("flagos/", comm), store);
  // gloo connects to its peers at the addresses they published in the
  // Store: only where --store-networks allows too.
  auto checked = c10::make_intrusive<PeerCheckedStore>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", notes), rank, nranks,
      StoreNetworks::Current());
  c10::intrusive_ptr<c10d::Backend> group;
  try {
    group = NewGlooProcessGroup(checked, rank, nranks, Millis(timeout));
  } catch (const std::exception& e) {
    const std::string refused = checked->refusal();
    TORCH_CHECK(refused.empty(), where, ": flagosd does not join it: ", refused);
    TORCH_CHECK(false, where, ": its daemons could not connect to each other through gloo (",
                Why(e), "); every rank's flagosd must reach the others' over TCP (set "
                "GLOO_SOCKET_IFNAME in flagosd's environment to choose the interface)");
  }
  return std::unique_ptr<RankBetweenDaemons>(
      new RankBetweenDaemons(comm, rank, nranks, pid, std::move(notes), std::move(group)));
}

RankBetweenDaemons::RankBetweenDaemons(std::string comm, int rank, int nranks, int64_t pid,
                                       c10::intrusive_ptr<c10d::Store> notes,
                                       c10::intrusive_ptr<c10d::Backend> group)
    : comm_(std::move(comm)),
      rank_(rank),
      nranks_(nranks),
      pid_(pid),
      notes_(std::move(notes)),
      group_(std::move(group)) {}

RankBetweenDaemons::~RankBetweenDaemons() = default;

void RankBetweenDaemons::Run(const std::string& signature, double timeout_s, const Issue& issue,
                             Check check, const Precheck& precheck) {
  RunBody(signature, timeout_s,
          [&](std::chrono::milliseconds timeout) { issue(timeout)->wait(); }, check, precheck,
          "gloo between the daemons");
}

void RankBetweenDaemons::RunBody(const std::string& signature, double timeout_s,
                                 const std::function<void(std::chrono::milliseconds)>& body,
                                 Check check, const Precheck& precheck,
                                 absl::string_view engine) {
  const std::chrono::milliseconds timeout = Millis(timeout_s);
  // Collectives one at a time, in order; a send or recv does not wait for
  // them (its peer may first need this rank's other one).
  std::optional<absl::MutexLock> in_order;
  if (check == Check::kSameCall) in_order.emplace(&order_mu_);
  std::string what;
  std::string broken;
  {
    absl::MutexLock lock(&mu_);
    what = check == Check::kSameCall
               ? absl::StrCat("collective #", next_++, " on communicator ", comm_)
               : absl::StrCat(signature, " on communicator ", comm_);
    broken = broken_;
  }
  TORCH_CHECK(broken.empty(), what, " (", signature, ", between daemons): ", broken);
  // Waiting for the peers holds this stream's worker: the pool stands a
  // spare in for it (ranks of the group may share this daemon's devices).
  WorkerPool::Blocking blocking;
  TORCH_CHECK(blocking.ok(), what, " (", signature, "): ", WorkerPool::kMaxBlocked,
              " collectives already wait for their peers on this device's workers");
  std::string mismatch;
  std::string failure;
  // The comparison runs through gloo whatever carries the collective.
  absl::string_view failed_in = "gloo between the daemons";
  try {
    if (check == Check::kSameCall) {
      mismatch = CheckSameCall(signature, timeout, precheck ? precheck(timeout) : std::string());
    }
    failed_in = engine;
    if (mismatch.empty()) body(timeout);
  } catch (const std::exception& e) {
    const std::string left = PeersThatLeft();
    failure = absl::StrCat(left, left.empty() ? "" : "; ", failed_in, ": ", Why(e),
                           "; the process group is broken; restart the job");
  }
  if (failure.empty() && mismatch.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.empty()) {
      broken_ = failure.empty() ? absl::StrCat(mismatch, "; the process group is broken") : failure;
    }
  }
  if (!failure.empty()) TORCH_CHECK(false, what, " (", signature, ", between daemons): ", failure);
  TORCH_CHECK(false, what, ": ", mismatch);
}

std::string RankBetweenDaemons::CheckSameCall(const std::string& signature,
                                              std::chrono::milliseconds timeout,
                                              const std::string& problem) {
  // Max of (h, -h, problem): every rank learns whether all called alike.
  const int64_t h = Fingerprint(signature);
  at::Tensor mine = at::tensor({h, -h, problem.empty() ? int64_t{0} : int64_t{1}}, at::kLong);
  std::vector<at::Tensor> io{mine};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  max.timeout = timeout;
  group_->allreduce(io, max)->wait();
  const auto* v = mine.const_data_ptr<int64_t>();
  if (v[0] == h && -v[1] == h && v[2] == 0) return "";
  // Someone differs: every rank shows the others what it called (or what it
  // found wrong), and all report the same.
  const std::string text = problem.empty() ? absl::StrCat("S", signature) : absl::StrCat("P", problem);
  at::Tensor in = at::zeros({kTextBytes}, at::kByte);
  std::memcpy(in.mutable_data_ptr(), text.data(),
              std::min<size_t>(text.size(), kTextBytes - 1));
  at::Tensor all = at::empty({nranks_ * kTextBytes}, at::kByte);
  c10d::AllgatherOptions gather;
  gather.timeout = timeout;
  group_->_allgather_base(all, in, gather)->wait();
  std::vector<std::string> said(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    said[r] = std::string(reinterpret_cast<const char*>(all.const_data_ptr<uint8_t>()) +
                          r * kTextBytes);
  }
  for (int r = 0; r < nranks_; ++r) {
    if (!said[r].empty() && said[r][0] == 'P') return said[r].substr(1);
  }
  for (int r = 1; r < nranks_; ++r) {
    if (said[r] != said[0]) {
      return absl::StrCat("rank 0 called ", said[0].substr(1), ", rank ", r, " called ",
                               said[r].substr(1),
                               ": every rank must call the same collectives in the same order "
                               "with the same sizes");
    }
  }
  return "the ranks' calls differ in what their descriptions do not show";
}

std::string RankBetweenDaemons::PeersThatLeft() {
  std::vector<std::string> left;
  try {
    for (int r = 0; r < nranks_; ++r) {
      const std::string key = absl::StrCat("left/", r);
      if (r == rank_ || !notes_->check({key})) continue;
      const std::vector<uint8_t> note = notes_->get(key);
      left.emplace_back(note.begin(), note.end());
    }
  } catch (const std::exception&) {
    // The Store is gone too (the job is ending): what gloo said must do.
  }
  return absl::StrJoin(left, "; ");
}

void RankBetweenDaemons::NoteLeft() {
  const std::string note = absl::StrCat(
      "rank ", rank_, " (process ", pid_,
      ") left the process group: its session with flagosd closed (the process exited, was "
      "killed or lost the daemon) without destroying the group");
  try {
    notes_->set(absl::StrCat("left/", rank_), std::vector<uint8_t>(note.begin(), note.end()));
  } catch (const std::exception&) {
    // The Store is gone: the peers' errors say what gloo saw.
  }
}

void RankBetweenDaemons::AllReduce(at::Tensor& t, int64_t reduce_op, const std::string& signature,
                                   double timeout_s) {
  at::Tensor dense = Dense(t);
  Run(signature, timeout_s, [&](std::chrono::milliseconds timeout) {
    std::vector<at::Tensor> io{dense};
    c10d::AllreduceOptions options;
    options.reduceOp = GlooOp(reduce_op);
    options.timeout = timeout;
    return group_->allreduce(io, options);
  });
  Average(dense, reduce_op, nranks_);
  Back(t, dense);
}

void RankBetweenDaemons::Broadcast(at::Tensor& t, int64_t root, const std::string& signature,
                                   double timeout_s) {
  at::Tensor dense = Dense(t);
  Run(signature, timeout_s, [&](std::chrono::milliseconds timeout) {
    std::vector<at::Tensor> io{dense};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout;
    return group_->broadcast(io, options);
  });
  Back(t, dense);
}

void RankBetweenDaemons::AllGather(at::Tensor& out, const at::Tensor& in,
                                   const std::string& signature, double timeout_s) {
  at::Tensor dense_out = Dense(out);
  // An input may be this rank's own output block (FSDP2 gathers in place).
  at::Tensor dense_in = Overlap(in, dense_out) ? in.contiguous().clone() : Dense(in);
  Run(signature, timeout_s, [&](std::chrono::milliseconds timeout) {
    c10d::AllgatherOptions options;
    options.timeout = timeout;
    // Flat: gloo takes the output as size-many blocks of the input's shape.
    at::Tensor flat_out = dense_out.view({-1});
    at::Tensor flat_in = dense_in.view({-1});
    return group_->_allgather_base(flat_out, flat_in, options);
  });
  Back(out, dense_out);
}

void RankBetweenDaemons::ReduceScatter(at::Tensor& out, const at::Tensor& in, int64_t reduce_op,
                                       const std::string& signature, double timeout_s) {
  at::Tensor dense_out = Overlap(in, out) ? at::empty_like(out, at::MemoryFormat::Contiguous)
                                          : Dense(out);
  at::Tensor dense_in = Dense(in);
  Run(signature, timeout_s, [&](std::chrono::milliseconds timeout) {
    c10d::ReduceScatterOptions options;
    options.reduceOp = GlooOp(reduce_op);
    options.timeout = timeout;
    at::Tensor flat_out = dense_out.view({-1});
    at::Tensor flat_in = dense_in.view({-1});
    return group_->_reduce_scatter_base(flat_out, flat_in, options);
  });
  Average(dense_out, reduce_op, nranks_);
  Back(out, dense_out);
}

void RankBetweenDaemons::AllToAll(at::Tensor& out, const at::Tensor& in,
                                  const std::vector<int64_t>& out_splits,
                                  const std::vector<int64_t>& in_splits,
                                  const std::string& signature, double timeout_s) {
  at::Tensor dense_out = Overlap(in, out) ? at::empty_like(out, at::MemoryFormat::Contiguous)
                                          : Dense(out);
  at::Tensor dense_in = Dense(in);
  Run(signature, timeout_s, [&](std::chrono::milliseconds timeout) {
    c10d::AllToAllOptions options;
    options.timeout = timeout;
    std::vector<int64_t> out_sizes = out_splits;
    std::vector<int64_t> in_sizes = in_splits;
    // A 0-dim tensor is one row.
    at::Tensor rows_out = dense_out.dim() == 0 ? dense_out.view({1}) : dense_out;
    at::Tensor rows_in = dense_in.dim() == 0 ? dense_in.view({1}) : dense_in;
    return group_->alltoall_base(rows_out, rows_in, out_sizes, in_sizes, options);
  }, Check::kSameCall, [&](std::chrono::milliseconds timeout) -> std::string {
    // What each peer sends this rank must be what this rank expects from it.
    at::Tensor sends = at::tensor(in_splits, at::kLong);
    at::Tensor told = at::empty({nranks_}, at::kLong);
    std::vector<int64_t> ones(nranks_, 1);
    c10d::AllToAllOptions options;
    options.timeout = timeout;
    group_->alltoall_base(told, sends, ones, ones, options)->wait();
    for (int s = 0; s < nranks_; ++s) {
      if (told.const_data_ptr<int64_t>()[s] != out_splits[s]) {
        return absl::StrCat("all_to_all: rank ", rank_, " expects ", out_splits[s],
                            " rows from rank ", s, ", which sends it ",
                            told.const_data_ptr<int64_t>()[s],
                            ": each rank's output split sizes must be its peers' input split "
                            "sizes");
      }
    }
    return "";
  });
  Back(out, dense_out);
}

void RankBetweenDaemons::Send(const at::Tensor& t, int64_t dst, int64_t tag, double timeout_s) {
  at::Tensor dense = Dense(t);
  Run(absl::StrCat("send to rank ", dst, " tag ", tag), timeout_s,
      [&](std::chrono::milliseconds) {
        std::vector<at::Tensor> io{dense};
        return group_->send(io, static_cast<int>(dst), static_cast<int>(tag));
      }, Check::kNone);
}

void RankBetweenDaemons::Recv(at::Tensor& t, int64_t src, int64_t tag, double timeout_s) {
  at::Tensor dense = Dense(t);
  Run(absl::StrCat("recv from rank ", src, " tag ", tag), timeout_s,
      [&](std::chrono::milliseconds) {
        std::vector<at::Tensor> io{dense};
        return group_->recv(io, static_cast<int>(src), static_cast<int>(tag));
      }, Check::kNone);
  Back(t, dense);
}

}  // namespace flagos::daemon
