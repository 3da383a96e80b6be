#include "bkcl_collectives.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kunlunxin_runtime.h"

namespace flagos {
namespace {

using kunlunxin::BkclApi;
using kunlunxin::BkclStatus;
namespace bkcl = kunlunxin::bkcl;

int ToBkcl(CollectiveElement type) {
  switch (type) {
    case CollectiveElement::kUInt8: return bkcl::kUint8;
    case CollectiveElement::kInt32: return bkcl::kInt32;
    case CollectiveElement::kInt64: return bkcl::kInt64;
    case CollectiveElement::kFloat16: return bkcl::kFloat16;
    case CollectiveElement::kBFloat16: return bkcl::kBfloat16;
    case CollectiveElement::kFloat32: return bkcl::kFloat;
    case CollectiveElement::kFloat64: return bkcl::kFloat64;
  }
  return -1;
}

int ToBkcl(CollectiveReduction op) {
  switch (op) {
    case CollectiveReduction::kSum: return bkcl::kAdd;
    case CollectiveReduction::kProduct: return bkcl::kProduct;
    case CollectiveReduction::kMin: return bkcl::kMin;
    case CollectiveReduction::kMax: return bkcl::kMax;
  }
  return -1;
}

void* Ptr(DevicePtr p) { return reinterpret_cast<void*>(p); }

class BkclRank final : public CollectiveRank {
 public:
  BkclRank(const BkclApi& api, KunlunxinStreams& streams, int device, bkcl::Context context)
      : api_(api), streams_(streams), device_(device), context_(context) {}

  ~BkclRank() override {
    // Nothing to do with a failure here: the context is gone either way.
    (void)api_.bkcl_destroy_context(context_);
  }

  absl::Status AllReduce(StreamHandle stream, DevicePtr send, DevicePtr recv, uint64_t count,
                         CollectiveElement type, CollectiveReduction op) override {
    return Issue(stream, "bkcl_all_reduce", [&](void* s) {
      return api_.bkcl_all_reduce(context_, Ptr(send), Ptr(recv), count, ToBkcl(type),
                                  ToBkcl(op), s);
    });
  }

  absl::Status Broadcast(StreamHandle stream, DevicePtr send, DevicePtr recv, uint64_t count,
                         CollectiveElement type, int root) override {
    return Issue(stream, "bkcl_broadcast", [&](void* s) {
      return api_.bkcl_broadcast(context_, Ptr(send), Ptr(recv), count, ToBkcl(type), root, s);
    });
  }

  absl::Status AllGather(StreamHandle stream, DevicePtr send, uint64_t send_count, DevicePtr recv,
                         CollectiveElement type) override {
    return Issue(stream, "bkcl_all_gather", [&](void* s) {
      return api_.bkcl_all_gather(context_, Ptr(send), send_count, Ptr(recv), ToBkcl(type), s);
    });
  }

  absl::Status ReduceScatter(StreamHandle stream, DevicePtr send, DevicePtr recv,
                             uint64_t recv_count, CollectiveElement type,
                             CollectiveReduction op) override {
    return Issue(stream, "bkcl_reduce_scatter", [&](void* s) {
      return api_.bkcl_reduce_scatter(context_, Ptr(send), Ptr(recv), recv_count, ToBkcl(type),
                                      ToBkcl(op), s);
    });
  }

  absl::Status AllToAll(StreamHandle stream, DevicePtr send, uint64_t count, DevicePtr recv,
                        CollectiveElement type) override {
    if (api_.bkcl_all_to_all == nullptr) {
      return absl::UnimplementedError("this libbkcl has no bkcl_all_to_all");
    }
    return Issue(stream, "bkcl_all_to_all", [&](void* s) {
      return api_.bkcl_all_to_all(context_, Ptr(send), count, Ptr(recv), ToBkcl(type), s);
    });
  }

  void Abort() override {
    if (api_.bkcl_comm_abort != nullptr) (void)api_.bkcl_comm_abort(context_);
  }

 private:
  template <typename F>
  absl::Status Issue(StreamHandle stream, const char* call, F f) {
    return streams_.IssueOnStream(device_, stream, [&](void* xpu_stream) {
      return BkclStatus(f(xpu_stream), device_, call);
    });
  }

  const BkclApi& api_;
  KunlunxinStreams& streams_;
  const int device_;
  const bkcl::Context context_;
};

class BkclCollectives final : public DeviceCollectives {
 public:
  BkclCollectives(std::unique_ptr<kunlunxin::BkclLibrary> library, KunlunxinStreams& streams)
      : library_(std::move(library)), streams_(streams) {
    description_ = absl::StrCat("BKCL (", library_->path(), ")");
    if (!library_->missing_optional().empty()) {
      absl::StrAppend(&description_, " without ",
                      absl::StrJoin(library_->missing_optional(), ", "));
    }
  }

  const std::string& description() const override { return description_; }
  bool has_all_to_all() const override { return library_->api().bkcl_all_to_all != nullptr; }

  absl::StatusOr<std::string> NewUniqueId() override {
    bkcl::UniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (absl::Status s = BkclStatus(library_->api().bkcl_get_unique_id(&id), -1,
                                    "bkcl_get_unique_id");
        !s.ok()) {
      return s;
    }
    return std::string(id.internal, sizeof(id.internal));
  }

  absl::StatusOr<std::unique_ptr<CollectiveRank>> InitRank(int device,
                                                           const std::string& unique_id,
                                                           int rank, int nranks) override {
    if (unique_id.size() != sizeof(bkcl::UniqueId)) {
      return absl::InvalidArgumentError(absl::StrCat("a BKCL unique id of ", unique_id.size(),
                                                     " bytes; BKCL's are ",
                                                     sizeof(bkcl::UniqueId)));
    }
    bkcl::UniqueId id;
    std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
    bkcl::Context context = nullptr;
    // bkcl_init_rank binds the context to the thread's current device.
    absl::Status s = streams_.OnDevice(device, [&]() {
      return BkclStatus(library_->api().bkcl_init_rank(&context, rank, nranks, &id), device,
                        absl::StrCat("bkcl_init_rank (rank ", rank, " of ", nranks, ")"));
    });
    if (!s.ok()) return s;
    return std::make_unique<BkclRank>(library_->api(), streams_, device, context);
  }

 private:
  const std::unique_ptr<kunlunxin::BkclLibrary> library_;
  KunlunxinStreams& streams_;
  std::string description_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCollectives>> CreateBkclCollectives(
    DeviceRuntime& runtime, const kunlunxin::BkclSearch& search) {
  KunlunxinStreams* streams = AsKunlunxinStreams(runtime);
  if (streams == nullptr) {
    return absl::InvalidArgumentError("BKCL runs only on the kunlunxin runtime");
  }
  absl::StatusOr<std::unique_ptr<kunlunxin::BkclLibrary>> library =
      kunlunxin::BkclLibrary::Load(search.WithEnvironment());
  if (!library.ok()) return library.status();
  return std::make_unique<BkclCollectives>(*std::move(library), *streams);
}

}  // namespace flagos
