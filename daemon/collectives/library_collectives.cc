// (ATen TU: compiled in collective_ops.cc's unity group, so its names live
// in a namespace of their own.)
#include "collectives/library_collectives.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/communicators.h"
#include "collectives/groups_between_daemons.h"
#include "collectives/rank_between_daemons.h"
#include "flagos/device_memory_tensor.h"
#include "flagos/op_executor.h"

namespace flagos::daemon {
namespace library_route {
namespace {

constexpr char kNamespace[] = "flagos_c10d";

enum class Kind { kNone, kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll };

Kind KindOf(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  const std::string prefix = absl::StrCat(kNamespace, "::");
  if (!absl::StartsWith(name, prefix) || !op.operator_name().overload_name.empty()) {
    return Kind::kNone;
  }
  const absl::string_view base = absl::string_view(name).substr(prefix.size());
  if (base == "all_reduce_") return Kind::kAllReduce;
  if (base == "broadcast_") return Kind::kBroadcast;
  if (base == "all_gather_into_tensor_") return Kind::kAllGather;
  if (base == "reduce_scatter_tensor_") return Kind::kReduceScatter;
  if (base == "all_to_all_single_") return Kind::kAllToAll;
  return Kind::kNone;
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllGather: return "all_gather";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kNone: break;
  }
  return "?";
}

std::optional<CollectiveElement> ElementOf(at::ScalarType type) {
  switch (type) {
    case at::kByte: return CollectiveElement::kUInt8;
    case at::kInt: return CollectiveElement::kInt32;
    case at::kLong: return CollectiveElement::kInt64;
    case at::kHalf: return CollectiveElement::kFloat16;
    case at::kBFloat16: return CollectiveElement::kBFloat16;
    case at::kFloat: return CollectiveElement::kFloat32;
    case at::kDouble: return CollectiveElement::kFloat64;
    default: return std::nullopt;
  }
}

// c10d's ReduceOp values the client sends (sum 0, avg 1, product 2, min 3,
// max 4, bitwise 5-7); avg and the bitwise ones have no library op.
std::optional<CollectiveReduction> ReductionOf(int64_t op) {
  switch (op) {
    case 0: return CollectiveReduction::kSum;
    case 2: return CollectiveReduction::kProduct;
    case 3: return CollectiveReduction::kMin;
    case 4: return CollectiveReduction::kMax;
    default: return std::nullopt;
  }
}

const char* ReductionName(CollectiveReduction op) {
  switch (op) {
    case CollectiveReduction::kSum: return "sum";
    case CollectiveReduction::kProduct: return "product";
    case CollectiveReduction::kMin: return "min";
    case CollectiveReduction::kMax: return "max";
  }
  return "?";
}

DevicePtr Address(const at::Tensor& t) { return reinterpret_cast<DevicePtr>(t.data_ptr()); }

uint64_t Bytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

// One rank's part of a round: what it issues on its stream.
struct RankPart {
  Kind kind = Kind::kNone;
  int device = 0;
  StreamHandle stream = 0;
  DevicePtr send = 0;
  DevicePtr recv = 0;
  uint64_t count = 0;  // all_reduce/broadcast: elements; gather: sent; scatter: received;
                       // all_to_all: to each rank
  CollectiveElement type = CollectiveElement::kFloat32;
  CollectiveReduction op = CollectiveReduction::kSum;
  int root = 0;
};

// A communicator's ranks in the collective library. Slot r is touched by
// rank r's part only (one round at a time), and by Abort/destruction once
// no round runs (communicators.h).
class LibraryCommunicator final : public CommunicatorState {
 public:
  LibraryCommunicator(absl::StatusOr<std::string> id, int nranks)
      : id_(std::move(id)), ranks_(nranks), devices_(nranks, -1) {}

  void Abort() override {
    for (const std::unique_ptr<CollectiveRank>& rank : ranks_) {
      if (rank != nullptr) rank->Abort();
    }
  }

  // Rank `rank`'s context on `device`, joined the first time (every rank
  // joins at once: InitRank waits for all).
  absl::StatusOr<CollectiveRank*> Join(DeviceCollectives& library, int rank, int device) {
    if (!id_.ok()) return id_.status();
    if (ranks_[rank] != nullptr) {
      if (devices_[rank] != device) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, " joined the collective library's communicator on device ",
            devices_[rank], ", and now calls a collective on device ", device,
            ": a rank keeps one device for the life of its process group"));
      }
      return ranks_[rank].get();
    }
    absl::StatusOr<std::unique_ptr<CollectiveRank>> joined =
        library.InitRank(device, *id_, rank, static_cast<int>(ranks_.size()));
    if (!joined.ok()) return joined.status();
    ranks_[rank] = *std::move(joined);
    devices_[rank] = device;
    return ranks_[rank].get();
  }

 private:
  const absl::StatusOr<std::string> id_;
  std::vector<std::unique_ptr<CollectiveRank>> ranks_;
  std::vector<int> devices_;
};

absl::Status Issue(CollectiveRank& rank, const RankPart& p) {
  switch (p.kind) {
    case Kind::kAllReduce: return rank.AllReduce(p.stream, p.send, p.recv, p.count, p.type, p.op);
    case Kind::kBroadcast:
      return rank.Broadcast(p.stream, p.send, p.recv, p.count, p.type, p.root);
    case Kind::kAllGather: return rank.AllGather(p.stream, p.send, p.count, p.recv, p.type);
    case Kind::kReduceScatter:
      return rank.ReduceScatter(p.stream, p.send, p.recv, p.count, p.type, p.op);
    case Kind::kAllToAll: return rank.AllToAll(p.stream, p.send, p.count, p.recv, p.type);
    case Kind::kNone: break;
  }
  return absl::InternalError("not a collective");
}

class LibraryCollectiveExecutor final : public OpExecutor {
 public:
  LibraryCollectiveExecutor(DeviceCollectives& library, DeviceRuntime& runtime,
                            std::unique_ptr<OpExecutor> inner)
      : library_(library),
        runtime_(runtime),
        devices_(runtime.DeviceCount()),
        inner_(std::move(inner)) {}

  c10::Device AtenDevice(int device) const override { return PrivateUse1Device(device); }

  at::Tensor WrapDeviceMemory(int device, DevicePtr ptr, c10::IntArrayRef sizes,
                              c10::IntArrayRef strides, c10::ScalarType dtype) override {
    return DeviceMemoryTensor(device, ptr, sizes, strides, dtype);
  }

  absl::Status Call(int device, StreamHandle stream, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack) override {
    const Kind kind = KindOf(op);
    if (kind != Kind::kNone) return RunCollective(kind, device, stream, stack);
    if (inner_ == nullptr) return DeclinedError("this backend has no native op kernels");
    return inner_->Call(device, stream, op, stack);
  }

  absl::Status CallInto(int device, StreamHandle stream, const c10::OperatorHandle& op,
                        torch::jit::Stack* stack, const std::vector<at::Tensor>& outputs) override {
    if (inner_ == nullptr || KindOf(op) != Kind::kNone) {
      return DeclinedError("no native kernel writes this call into given outputs");
    }
    return inner_->CallInto(device, stream, op, stack, outputs);
  }

  bool host_addressable() const override { return false; }

  bool HasKernel(const c10::OperatorHandle& op) const override {
    return KindOf(op) != Kind::kNone || (inner_ != nullptr && inner_->HasKernel(op));
  }

  const std::vector<KernelFact>& kernel_facts() const override {
    static const std::vector<KernelFact> kNone;
    return inner_ != nullptr ? inner_->kernel_facts() : kNone;
  }

 private:
  // Fills `part` from the call's arguments, or declines (the host route
  // takes the call; it also raises the errors of malformed calls).
  absl::Status Describe(Kind kind, const std::vector<c10::IValue>& a, RankPart* part,
                        std::string* signature, uint64_t* bytes, std::string* comm,
                        int64_t* rank, int64_t* nranks, double* timeout_s,
                        std::shared_ptr<RankBetweenDaemons>* between) const {
    // Every schema starts with the tensor the op returns (self or out).
    const at::Tensor& first = a[0].toTensor();
    const bool two_tensors = kind == Kind::kAllGather || kind == Kind::kReduceScatter ||
                             kind == Kind::kAllToAll;
    const at::Tensor& input = two_tensors ? a[1].toTensor() : first;
    const size_t c = kind == Kind::kAllToAll ? 4 : (two_tensors ? 2 : 1);  // comm's index
    *comm = a[c].toStringRef();
    *rank = a[c + 1].toInt();
    *nranks = a[c + 2].toInt();
    *timeout_s = a.back().toDouble();
    if (*nranks < 1 || *rank < 0 || *rank >= *nranks) {
      return DeclinedError("a rank outside its group");
    }
    // A group that spans daemons: the library between the daemons' devices
    // (each daemon checks its own ranks' devices when they join it).
    *between = GroupsBetweenDaemons::Get().Find(CollectiveCaller::session(), *comm);
    if (*between == nullptr && *nranks > devices_) {
      return DeclinedError("more ranks than devices: the library runs one rank per device");
    }
    const std::optional<CollectiveElement> type = ElementOf(input.scalar_type());
    if (!type.has_value()) return DeclinedError("a dtype the collective library has no type for");
    if (!first.is_contiguous() || !input.is_contiguous() ||
        first.scalar_type() != input.scalar_type()) {
      return DeclinedError("non-contiguous tensors or two dtypes");
    }
    part->kind = kind;
    part->type = *type;
    part->send = Address(input);
    part->recv = Address(first);
    std::string detail;
    switch (kind) {
      case Kind::kAllReduce:
      case Kind::kReduceScatter: {
        const std::optional<CollectiveReduction> op = ReductionOf(a[c + 3].toInt());
        if (!op.has_value()) return DeclinedError("a reduction the collective library lacks");
        part->op = *op;
        detail = ReductionName(*op);
        if (kind == Kind::kAllReduce) {
          part->count = static_cast<uint64_t>(first.numel());
        } else {
          if (input.numel() != first.numel() * *nranks) return DeclinedError("sizes");
          part->count = static_cast<uint64_t>(first.numel());
        }
        break;
      }
      case Kind::kBroadcast: {
        const int64_t root = a[c + 3].toInt();
        if (root < 0 || root >= *nranks) return DeclinedError("a root outside the group");
        part->root = static_cast<int>(root);
        part->count = static_cast<uint64_t>(first.numel());
        detail = absl::StrCat("root ", root);
        break;
      }
      case Kind::kAllGather:
        if (first.numel() != input.numel() * *nranks) return DeclinedError("sizes");
        part->count = static_cast<uint64_t>(input.numel());
        break;
      case Kind::kAllToAll: {
        if (!library_.has_all_to_all()) return DeclinedError("the library has no all-to-all");
        const auto equal = [&](const c10::IValue& splits, const at::Tensor& t) {
          const std::vector<int64_t> s = splits.toIntVector();
          const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
          if (rows % *nranks != 0) return false;
          for (int64_t n : s) {
            if (n != rows / *nranks) return false;
          }
          return s.empty() || static_cast<int64_t>(s.size()) == *nranks;
        };
        if (!equal(a[2], first) || !equal(a[3], input) || first.numel() != input.numel() ||
            input.numel() % *nranks != 0) {
          return DeclinedError("uneven all_to_all splits");
        }
        part->count = static_cast<uint64_t>(input.numel() / *nranks);
        break;
      }
      case Kind::kNone: return absl::InternalError("not a collective");
    }
    *signature = absl::StrCat(KindName(kind), detail.empty() ? "" : "(", detail,
                              detail.empty() ? "" : ")", " ", c10::toString(input.scalar_type()),
                              "[", input.numel(), "] through the collective library");
    *bytes = Bytes(input);
    return absl::OkStatus();
  }

  absl::Status RunCollective(Kind kind, int device, StreamHandle stream,
                             torch::jit::Stack* stack) {
    RankPart part;
    std::string signature;
    std::string comm;
    uint64_t bytes = 0;
    int64_t rank = 0;
    int64_t nranks = 0;
    double timeout_s = 0;
    std::shared_ptr<RankBetweenDaemons> between;
    if (absl::Status s = Describe(kind, *stack, &part, &signature, &bytes, &comm, &rank, &nranks,
                                  &timeout_s, &between);
        !s.ok()) {
      return s;
    }
    part.device = device;
    part.stream = stream;
    if (between != nullptr) {
      if (absl::Status s = RunBetweenDaemons(*between, part, signature, bytes, timeout_s);
          !s.ok()) {
        return s;
      }
      return Returned(stack);
    }
    const int n = static_cast<int>(nranks);
    absl::Status status = Communicators::Get().Arrive(
        comm, static_cast<int>(rank), n, CollectiveCaller::session(), CollectiveCaller::pid(),
        {signature, &part}, bytes,
        timeout_s > 0 ? absl::Seconds(timeout_s) : absl::InfiniteDuration(),
        [&](absl::Span<const CollectiveArrival> arrivals, int me) -> absl::Status {
          // One rank per device, as the library runs them: every part sees
          // the same arrivals, so all fail alike and none joins.
          for (size_t i = 0; i < arrivals.size(); ++i) {
            for (size_t j = i + 1; j < arrivals.size(); ++j) {
              const int di = static_cast<const RankPart*>(arrivals[i].buffers)->device;
              if (di == static_cast<const RankPart*>(arrivals[j].buffers)->device) {
                return absl::InvalidArgumentError(absl::StrCat(
                    "ranks ", i, " and ", j, " are both on flagos:", di, ", and ",
                    library_.description(), " runs one rank per device: give each rank its "
                    "own device (torch.flagos.set_device(LOCAL_RANK))"));
              }
            }
          }
          std::shared_ptr<CommunicatorState> state =
              Communicators::Get().State(comm, [&]() -> std::unique_ptr<CommunicatorState> {
                return std::make_unique<LibraryCommunicator>(library_.NewUniqueId(), n);
              });
          if (state == nullptr) return absl::InternalError("the communicator is gone");
          const RankPart& mine = *static_cast<const RankPart*>(arrivals[me].buffers);
          absl::StatusOr<CollectiveRank*> joined =
              static_cast<LibraryCommunicator*>(state.get())->Join(library_, me, mine.device);
          if (!joined.ok()) return joined.status();
          return Issue(**joined, mine);
        });
    if (!status.ok()) return status;
    if (rank == 0) Communicators::Get().CountLibraryCollective();
    return Returned(stack);
  }

  // The op returns its first argument (self or out), written in place.
  static absl::Status Returned(torch::jit::Stack* stack) {
    c10::IValue result = std::move((*stack)[0]);
    stack->clear();
    stack->push_back(std::move(result));
    return absl::OkStatus();
  }

  // This rank's part of a collective between daemons, through the library
  // (rank_between_daemons.h): it returns once the part completed on the
  // device, as the gloo route's collectives do. Counted per rank, on each
  // daemon.
  absl::Status RunBetweenDaemons(RankBetweenDaemons& between, const RankPart& part,
                                 const std::string& signature, uint64_t bytes, double timeout_s) {
    // Complete once an event recorded after the part is.
    absl::StatusOr<EventHandle> event = runtime_.CreateEvent(part.device, /*enable_timing=*/false);
    if (!event.ok()) return event.status();
    absl::Status failed;
    try {
      between.RunThroughLibrary(
          signature, timeout_s, library_, part.device,
          [&](CollectiveRank& rank) {
            absl::Status issued = Issue(rank, part);
            return issued.ok() ? runtime_.RecordEvent(part.device, *event, part.stream) : issued;
          },
          [&]() { return runtime_.QueryEvent(part.device, *event); });
    } catch (const c10::Error& e) {
      failed = absl::AbortedError(e.what_without_backtrace());
    }
    (void)runtime_.DestroyEvent(part.device, *event);
    if (!failed.ok()) {
      GroupsBetweenDaemons::Get().Count(0, /*ok=*/false);
      return failed;
    }
    GroupsBetweenDaemons::Get().Count(bytes, /*ok=*/true);
    Communicators::Get().CountLibraryCollective();
    return absl::OkStatus();
  }

  DeviceCollectives& library_;
  DeviceRuntime& runtime_;
  const int devices_;
  const std::unique_ptr<OpExecutor> inner_;
};

}  // namespace
}  // namespace library_route

const char* LibraryCollectivesNamespace() { return library_route::kNamespace; }

std::unique_ptr<OpExecutor> CreateLibraryCollectiveExecutor(DeviceCollectives& collectives,
                                                            DeviceRuntime& runtime,
                                                            std::unique_ptr<OpExecutor> inner) {
  return std::make_unique<library_route::LibraryCollectiveExecutor>(collectives, runtime,
                                                                    std::move(inner));
}

}  // namespace flagos::daemon
