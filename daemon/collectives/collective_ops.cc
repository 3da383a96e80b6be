// The flagos_c10d operators: the collectives torch_fl.distributed sends as
// operators on a stream, so that they run in order with the ops before and
// after them, on the tensors' device memory, with nothing passing through
// the client (docs/distributed.md). Their schemas are also defined by the
// client (plugin/torch_fl/distributed.py); the handshake's schema match
// refuses a client whose schemas differ.
//
// Each kernel runs on its stream's worker with the tensors the op runner
// wrapped (the device memory on the cpu backend, host copies on the
// cpu_fallback route), arrives at its communicator (communicators.h) and
// returns once every rank's tensor holds its result. Once all arrived, each
// rank's thread computes its share of the results (n ranks, n threads).
// (ATen TU)
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/collective_ops.h"
#include "collectives/communicators.h"
#include "collectives/groups_between_daemons.h"
#include "collectives/rank_between_daemons.h"
#include "collectives/sync_batch_norm_kernels.h"

namespace flagos::daemon {
namespace {

// c10d's ReduceOp::RedOpType values, which the client sends.
enum class ReduceOp : int64_t {
  kSum = 0, kAvg = 1, kProduct = 2, kMin = 3, kMax = 4, kBand = 5, kBor = 6, kBxor = 7,
};

std::string ReduceOpName(int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  TORCH_CHECK(false, "flagos collective: reduce op ", op,
              " is not one flagosd runs (sum, avg, product, min, max, band, bor, bxor; "
              "torch_fl applies premul_sum's factor before a sum)");
}

// `acc` op= `x`, elementwise.
void ReduceInto(int64_t op, at::Tensor& acc, const at::Tensor& x) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: acc.add_(x); return;
    case ReduceOp::kProduct: acc.mul_(x); return;
    case ReduceOp::kMin: at::minimum_out(acc, acc, x); return;
    case ReduceOp::kMax: at::maximum_out(acc, acc, x); return;
    case ReduceOp::kBand: acc.bitwise_and_(x); return;
    case ReduceOp::kBor: acc.bitwise_or_(x); return;
    case ReduceOp::kBxor: acc.bitwise_xor_(x); return;
  }
}

// The reduction of `inputs` (all of one dtype and size) by `op`.
at::Tensor Reduce(int64_t op, const std::vector<at::Tensor>& inputs) {
  at::Tensor acc = inputs[0].clone(at::MemoryFormat::Contiguous);
  for (size_t i = 1; i < inputs.size(); ++i) ReduceInto(op, acc, inputs[i]);
  if (static_cast<ReduceOp>(op) == ReduceOp::kAvg) {
    const auto n = static_cast<int64_t>(inputs.size());
    if (at::isIntegralType(acc.scalar_type(), /*includeBool=*/true)) {
      acc.div_(n, "trunc");
    } else {
      acc.div_(n);
    }
  }
  return acc;
}

std::string Describe(const char* kind, const at::Tensor& t, const std::string& detail = "") {
  return absl::StrCat(kind, detail.empty() ? "" : "(", detail, detail.empty() ? "" : ")", " ",
                      c10::toString(t.scalar_type()), "[", t.numel(), "]");
}

uint64_t Bytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

absl::Duration Timeout(double timeout_s) {
  return timeout_s > 0 ? absl::Seconds(timeout_s) : absl::InfiniteDuration();
}

// The tensors a rank brings.
struct Buffers {
  at::Tensor out;
  at::Tensor in;
};

// Arrives at `comm` with `buffers` (a Buffers or a struct derived from it);
// once every rank arrived, runs `combine(all ranks' buffers, part)` with
// part = this rank, at the same time as the other ranks run theirs (see
// Communicators::Combine: parts touch disjoint memory); raises the round's
// error on every rank. `combine` may throw (TORCH_CHECK).
template <typename B = Buffers, typename F>
void Run(const std::string& comm, int64_t rank, int64_t nranks, std::string signature,
         B buffers, uint64_t bytes, double timeout_s, F combine) {
  const absl::Status status = Communicators::Get().Arrive(
      comm, static_cast<int>(rank), static_cast<int>(nranks), CollectiveCaller::session(),
      CollectiveCaller::pid(), {std::move(signature), &buffers},
      bytes, Timeout(timeout_s), [&](absl::Span<const CollectiveArrival> arrivals, int part) {
        std::vector<B*> all;
        all.reserve(arrivals.size());
        for (const CollectiveArrival& a : arrivals) all.push_back(static_cast<B*>(a.buffers));
        try {
          combine(all, static_cast<size_t>(part));
        } catch (const c10::Error& e) {
          return absl::InvalidArgumentError(e.what_without_backtrace());
        } catch (const std::exception& e) {
          return absl::InternalError(absl::StrCat("the collective failed in flagosd: ", e.what()));
        }
        return absl::OkStatus();
      });
  TORCH_CHECK(status.ok(), status.message());
}

// The calling session's rank in `comm` when its group spans daemons (it
// joined with join_group; groups_between_daemons.h), else null: the
// collective meets its peers in this daemon's communicators.
std::shared_ptr<RankBetweenDaemons> Between(c10::string_view comm) {
  return GroupsBetweenDaemons::Get().Find(CollectiveCaller::session(), std::string(comm));
}

// Runs `collective` on a rank between daemons, counting it for /metrics.
template <typename F>
void Counted(uint64_t bytes, F collective) {
  try {
    collective();
  } catch (...) {
    GroupsBetweenDaemons::Get().Count(0, /*ok=*/false);
    throw;
  }
  GroupsBetweenDaemons::Get().Count(bytes, /*ok=*/true);
}

// The `part`-th of `parts` near-equal ranges of [0, n).
std::pair<int64_t, int64_t> Share(int64_t n, size_t part, size_t parts) {
  const int64_t chunk = (n + static_cast<int64_t>(parts) - 1) / static_cast<int64_t>(parts);
  const int64_t begin = std::min(n, static_cast<int64_t>(part) * chunk);
  return {begin, std::min(n, begin + chunk)};
}

at::Tensor& AllReduce(at::Tensor& self, c10::string_view comm, int64_t rank, int64_t nranks,
                      int64_t op, double timeout_s) {
  std::string signature = Describe("all_reduce", self, ReduceOpName(op));
  if (auto between = Between(comm)) {
    Counted(Bytes(self), [&] { between->AllReduce(self, op, signature, timeout_s); });
    return self;
  }
  Run(std::string(comm), rank, nranks, std::move(signature), {self, self}, Bytes(self), timeout_s,
      [op](const std::vector<Buffers*>& all, size_t part) {
        bool contiguous = true;
        for (Buffers* b : all) contiguous = contiguous && b->out.is_contiguous();
        if (!contiguous) {
          // Views: part 0 reduces all of it.
          if (part != 0) return;
          std::vector<at::Tensor> inputs;
          for (Buffers* b : all) inputs.push_back(b->in);
          const at::Tensor result = Reduce(op, inputs);
          for (Buffers* b : all) b->out.copy_(result.view(b->out.sizes()));
          return;
        }
        // Each part reduces its share of the elements into rank 0's tensor
        // (in place: every rank's input is its output) and copies it to the
        // others'; no other part reads or writes that share.
        const auto [begin, end] = Share(all[0]->out.numel(), part, all.size());
        if (begin == end) return;
        const auto share = [begin = begin, end = end](const at::Tensor& t) {
          return t.view({-1}).slice(0, begin, end);
        };
        at::Tensor acc = share(all[0]->out);
        for (size_t s = 1; s < all.size(); ++s) ReduceInto(op, acc, share(all[s]->in));
        if (static_cast<ReduceOp>(op) == ReduceOp::kAvg) {
          const auto n = static_cast<int64_t>(all.size());
          if (at::isIntegralType(acc.scalar_type(), /*includeBool=*/true)) {
            acc.div_(n, "trunc");
          } else {
            acc.div_(n);
          }
        }
        for (size_t s = 1; s < all.size(); ++s) share(all[s]->out).copy_(acc);
      });
  return self;
}

at::Tensor& Broadcast(at::Tensor& self, c10::string_view comm, int64_t rank, int64_t nranks,
                      int64_t root, double timeout_s) {
  TORCH_CHECK(root >= 0 && root < nranks, "flagos broadcast: root ", root, " is not a rank of ",
              nranks);
  std::string signature = Describe("broadcast", self, absl::StrCat("root ", root));
  if (auto between = Between(comm)) {
    Counted(Bytes(self), [&] { between->Broadcast(self, root, signature, timeout_s); });
    return self;
  }
  // Each rank's part copies the root's tensor into its own.
  Run(std::string(comm), rank, nranks, std::move(signature), {self, self}, Bytes(self), timeout_s,
      [root](const std::vector<Buffers*>& all, size_t part) {
        if (static_cast<int64_t>(part) == root) return;
        all[part]->out.copy_(all[root]->in.reshape(all[part]->out.sizes()));
      });
  return self;
}

// out holds nranks blocks of `block` elements each (a contiguous layout).
at::Tensor Blocks(const at::Tensor& t, int64_t nranks, const char* what, const char* which) {
  TORCH_CHECK(t.is_contiguous(), "flagos ", what, ": the ", which,
              " tensor must be contiguous (call .contiguous() first)");
  TORCH_CHECK(t.numel() % nranks == 0, "flagos ", what, ": the ", which, " tensor's ",
              t.numel(), " elements do not split into ", nranks, " equal blocks, one per rank");
  return t.view({nranks, t.numel() / nranks});
}

at::Tensor& AllGather(at::Tensor& out, const at::Tensor& input, c10::string_view comm,
                      int64_t rank, int64_t nranks, double timeout_s) {
  TORCH_CHECK(out.numel() == input.numel() * nranks, "flagos all_gather: the output has ",
              out.numel(), " elements, ", nranks, " ranks x ", input.numel(), " input elements are ",
              input.numel() * nranks);
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), "flagos all_gather: output dtype ",
              out.scalar_type(), " differs from input dtype ", input.scalar_type());
  std::string signature = Describe("all_gather", input);
  if (auto between = Between(comm)) {
    Counted(Bytes(input), [&] { between->AllGather(out, input, signature, timeout_s); });
    return out;
  }
  // Each rank's part fills its own output. An input may be its rank's own
  // output block (FSDP2 gathers in place): that block is not copied onto
  // itself, and no other part writes it.
  Run(std::string(comm), rank, nranks, std::move(signature), {out, input}, Bytes(input),
      timeout_s, [nranks](const std::vector<Buffers*>& all, size_t part) {
        const at::Tensor blocks = Blocks(all[part]->out, nranks, "all_gather", "output");
        for (size_t s = 0; s < all.size(); ++s) {
          const at::Tensor source = all[s]->in.reshape({-1});
          if (blocks[s].data_ptr() != source.data_ptr()) blocks[s].copy_(source);
        }
      });
  return out;
}

at::Tensor& ReduceScatter(at::Tensor& out, const at::Tensor& input, c10::string_view comm,
                          int64_t rank, int64_t nranks, int64_t op, double timeout_s) {
  TORCH_CHECK(input.numel() == out.numel() * nranks, "flagos reduce_scatter: the input has ",
              input.numel(), " elements, ", nranks, " ranks x ", out.numel(),
              " output elements are ", out.numel() * nranks);
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), "flagos reduce_scatter: output dtype ",
              out.scalar_type(), " differs from input dtype ", input.scalar_type());
  std::string signature = Describe("reduce_scatter", input, ReduceOpName(op));
  if (auto between = Between(comm)) {
    Counted(Bytes(input), [&] { between->ReduceScatter(out, input, op, signature, timeout_s); });
    return out;
  }
  // Each rank's part reduces block r of every input into its own output
  // (through a temporary: the output may be that rank's own input block).
  Run(std::string(comm), rank, nranks, std::move(signature), {out, input}, Bytes(input),
      timeout_s,
      [op, nranks](const std::vector<Buffers*>& all, size_t part) {
        std::vector<at::Tensor> blocks;
        for (Buffers* b : all) {
          blocks.push_back(Blocks(b->in, nranks, "reduce_scatter", "input")[part]);
        }
        all[part]->out.copy_(Reduce(op, blocks).view(all[part]->out.sizes()));
      });
  return out;
}

// Rank r's output block s (output_splits[s] rows of its output) is rank s's
// input block r (input_splits[r] rows of its input); empty splits mean
// nranks equal blocks. A row is the elements of one index of dim 0 (of a
// flattened tensor: one element), which every rank's tensors share.
std::vector<int64_t> Splits(const at::Tensor& t, at::IntArrayRef splits, int64_t nranks,
                            const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  if (splits.empty()) {
    TORCH_CHECK(rows % nranks == 0, "flagos all_to_all: the ", which, " tensor's ", rows,
                " rows do not split into ", nranks, " equal blocks, one per rank (pass split sizes)");
    return std::vector<int64_t>(nranks, rows / nranks);
  }
  TORCH_CHECK(static_cast<int64_t>(splits.size()) == nranks, "flagos all_to_all: ", splits.size(),
              " ", which, " split sizes for a group of ", nranks, " ranks");
  int64_t total = 0;
  for (int64_t n : splits) {
    TORCH_CHECK(n >= 0, "flagos all_to_all: a negative ", which, " split size (", n, ")");
    total += n;
  }
  TORCH_CHECK(total == rows, "flagos all_to_all: the ", which, " split sizes add up to ", total,
              " rows, the ", which, " tensor has ", rows);
  return {splits.begin(), splits.end()};
}

// A 0-dim tensor as one row.
at::Tensor Rows(const at::Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

int64_t RowNumel(const at::Tensor& t) {
  return t.dim() == 0 ? 1 : c10::multiply_integers(t.sizes().slice(1));
}

struct AllToAllBuffers : Buffers {
  std::vector<int64_t> out_splits;
  std::vector<int64_t> in_splits;
};

at::Tensor& AllToAll(at::Tensor& out, const at::Tensor& input, at::IntArrayRef output_splits,
                     at::IntArrayRef input_splits, c10::string_view comm, int64_t rank,
                     int64_t nranks, double timeout_s) {
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), "flagos all_to_all: output dtype ",
              out.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(out.is_contiguous() && input.is_contiguous(),
              "flagos all_to_all: the tensors must be contiguous (call .contiguous() first)");
  TORCH_CHECK(out.dim() == input.dim() && (out.dim() == 0 || RowNumel(out) == RowNumel(input)),
              "flagos all_to_all: output rows of ", RowNumel(out), " elements, input rows of ",
              RowNumel(input), ": both tensors' rows (dim 0) must have one shape");
  AllToAllBuffers buffers{{out, input},
                          Splits(out, output_splits, nranks, "output"),
                          Splits(input, input_splits, nranks, "input")};
  const std::string signature = absl::StrCat("all_to_all ", c10::toString(input.scalar_type()),
                                             "[rows of ", RowNumel(input), "]");
  if (auto between = Between(comm)) {
    Counted(Bytes(input), [&] {
      between->AllToAll(out, input, buffers.out_splits, buffers.in_splits, signature, timeout_s);
    });
    return out;
  }
  // Part 0 does it all: an input may be its rank's output, so every input
  // is read before any output is written.
  Run(std::string(comm), rank, nranks, signature, std::move(buffers), Bytes(input), timeout_s,
      [](const std::vector<AllToAllBuffers*>& all, size_t part) {
        if (part != 0) return;
        const size_t n = all.size();
        for (size_t r = 0; r < n; ++r) {
          for (size_t s = 0; s < n; ++s) {
            TORCH_CHECK(all[r]->out_splits[s] == all[s]->in_splits[r], "all_to_all: rank ", r,
                        " expects ", all[r]->out_splits[s], " rows from rank ", s,
                        ", which sends it ", all[s]->in_splits[r],
                        ": each rank's output split sizes must be its peers' input split sizes");
          }
        }
        std::vector<std::vector<at::Tensor>> blocks(n);
        for (size_t s = 0; s < n; ++s) {
          for (const at::Tensor& b : Rows(all[s]->in).split_with_sizes(all[s]->in_splits)) {
            blocks[s].push_back(b.clone());
          }
        }
        for (size_t r = 0; r < n; ++r) {
          const std::vector<at::Tensor> outs = Rows(all[r]->out).split_with_sizes(all[r]->out_splits);
          for (size_t s = 0; s < n; ++s) outs[s].copy_(blocks[s][r]);
        }
      });
  return out;
}

// A send and its recv form a round of a two-rank communicator of their own
// (the sender rank 0, the receiver rank 1), named by the group's, the pair
// and the tag: the k-th send from `src` to `dst` with a tag meets the k-th
// matching recv. Its signature is dtype and size, which must match.
std::string PairKey(c10::string_view comm, int64_t src, int64_t dst, int64_t tag) {
  return absl::StrCat(std::string(comm), "/p2p/", src, "->", dst, "/tag", tag);
}

void CheckPeer(const char* what, int64_t rank, int64_t peer, int64_t nranks) {
  TORCH_CHECK(peer >= 0 && peer < nranks && peer != rank, "flagos ", what, ": peer rank ", peer,
              " is not another rank of the group of ", nranks, " (this is rank ", rank, ")");
}

// The round's receiver (rank 1) copies from its sender (rank 0).
void Deliver(const std::vector<Buffers*>& pair, size_t part) {
  if (part == 1) pair[1]->out.copy_(pair[0]->in.reshape(pair[1]->out.sizes()));
}

void Send(const at::Tensor& self, c10::string_view comm, int64_t rank, int64_t nranks,
          int64_t dst, int64_t tag, double timeout_s) {
  CheckPeer("send", rank, dst, nranks);
  if (auto between = Between(comm)) {
    Counted(Bytes(self), [&] { between->Send(self, dst, tag, timeout_s); });
    return;
  }
  Run(PairKey(comm, rank, dst, tag), 0, 2, Describe("send/recv", self), {self, self},
      Bytes(self), timeout_s, Deliver);
}

at::Tensor& Recv(at::Tensor& self, c10::string_view comm, int64_t rank, int64_t nranks,
                 int64_t src, int64_t tag, double timeout_s) {
  CheckPeer("recv", rank, src, nranks);
  if (auto between = Between(comm)) {
    Counted(0, [&] { between->Recv(self, src, tag, timeout_s); });
    return self;
  }
  Run(PairKey(comm, src, rank, tag), 1, 2, Describe("send/recv", self), {self, self}, 0,
      timeout_s, Deliver);
  return self;
}

void DestroyCommunicator(const at::Tensor& /*anchor*/, c10::string_view comm, int64_t rank) {
  GroupsBetweenDaemons::Get().Leave(CollectiveCaller::session(), std::string(comm));
  Communicators::Get().Destroy(std::string(comm), static_cast<int>(rank));
}

// The calling session becomes rank `rank` of `nranks` of communicator
// `comm`, a group whose ranks are sessions of different daemons: they meet
// in the c10d TCPStore at store_host:store_port (the client's), and the
// communicator's collectives then run through gloo between the daemons.
void JoinGroup(const at::Tensor& /*anchor*/, c10::string_view comm, int64_t rank, int64_t nranks,
               c10::string_view store_host, int64_t store_port, double timeout_s) {
  TORCH_CHECK(nranks >= 1 && nranks <= Communicators::kMaxRanks, "flagos join_group: a group of ",
              nranks, " ranks; flagosd forms groups of 1 to ", Communicators::kMaxRanks, " ranks");
  TORCH_CHECK(rank >= 0 && rank < nranks, "flagos join_group: rank ", rank, " of ", nranks,
              " is not a rank of a group of that size");
  const absl::Status s = GroupsBetweenDaemons::Get().Join(
      CollectiveCaller::session(), CollectiveCaller::pid(), std::string(comm),
      static_cast<int>(rank), static_cast<int>(nranks), std::string(store_host),
      static_cast<int>(store_port), Timeout(timeout_s));
  TORCH_CHECK(s.ok(), s.message());
}

}  // namespace

const char* CollectiveOpsNamespace() {
  // SyncBatchNorm's host kernels come with the collectives.
  [[maybe_unused]] static const int kSyncBatchNorm = SyncBatchNormKernelCount();
  return "flagos_c10d";
}

TORCH_LIBRARY(flagos_c10d, m) {
  m.def("all_reduce_(Tensor(a!) self, str comm, int rank, int nranks, int reduce_op, "
        "float timeout_s) -> Tensor(a!)");
  m.def("broadcast_(Tensor(a!) self, str comm, int rank, int nranks, int root, "
        "float timeout_s) -> Tensor(a!)");
  m.def("all_gather_into_tensor_(Tensor(a!) out, Tensor input, str comm, int rank, int nranks, "
        "float timeout_s) -> Tensor(a!)");
  m.def("reduce_scatter_tensor_(Tensor(a!) out, Tensor input, str comm, int rank, int nranks, "
        "int reduce_op, float timeout_s) -> Tensor(a!)");
  m.def("all_to_all_single_(Tensor(a!) out, Tensor input, int[] output_splits, "
        "int[] input_splits, str comm, int rank, int nranks, float timeout_s) -> Tensor(a!)");
  m.def("send_(Tensor self, str comm, int rank, int nranks, int dst, int tag, "
        "float timeout_s) -> ()");
  m.def("recv_(Tensor(a!) self, str comm, int rank, int nranks, int src, int tag, "
        "float timeout_s) -> Tensor(a!)");
  m.def("destroy_communicator(Tensor anchor, str comm, int rank) -> ()");
  m.def("join_group(Tensor anchor, str comm, int rank, int nranks, str store_host, "
        "int store_port, float timeout_s) -> ()");
}

TORCH_LIBRARY_IMPL(flagos_c10d, CPU, m) {
  m.impl("all_reduce_", &AllReduce);
  m.impl("broadcast_", &Broadcast);
  m.impl("all_gather_into_tensor_", &AllGather);
  m.impl("reduce_scatter_tensor_", &ReduceScatter);
  m.impl("all_to_all_single_", &AllToAll);
  m.impl("send_", &Send);
  m.impl("recv_", &Recv);
  m.impl("destroy_communicator", &DestroyCommunicator);
  m.impl("join_group", &JoinGroup);
}

}  // namespace flagos::daemon
