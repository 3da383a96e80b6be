#include "protocol/command_validation.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace flagos::daemon {
namespace {

struct DtypeInfo {
  const char* name;
  int itemsize;  // 0: not accepted
};

// Indexed by c10::ScalarType (torch/headeronly/core/ScalarType.h).
constexpr DtypeInfo kDtypes[] = {
    {"uint8", 1},          {"int8", 1},           {"int16", 2},
    {"int32", 4},          {"int64", 8},          {"float16", 2},
    {"float32", 4},        {"float64", 8},        {"complex32", 4},
    {"complex64", 8},      {"complex128", 16},    {"bool", 1},
    {"qint8", 0},          {"quint8", 0},         {"qint32", 0},
    {"bfloat16", 2},       {"quint4x2", 0},       {"quint2x4", 0},
    {"bits1x8", 0},        {"bits2x4", 0},        {"bits4x2", 0},
    {"bits8", 0},          {"bits16", 0},         {"float8_e5m2", 1},
    {"float8_e4m3fn", 1},  {"float8_e5m2fnuz", 1}, {"float8_e4m3fnuz", 1},
    {"uint16", 2},         {"uint32", 4},         {"uint64", 8},
    {"uint1", 0},          {"uint2", 0},          {"uint3", 0},
    {"uint4", 0},          {"uint5", 0},          {"uint6", 0},
    {"uint7", 0},          {"int1", 0},           {"int2", 0},
    {"int3", 0},           {"int4", 0},           {"int5", 0},
    {"int6", 0},           {"int7", 0},           {"float8_e8m0fnu", 1},
    {"float4_e2m1fn_x2", 1},
};
constexpr int kDtypeCount = sizeof(kDtypes) / sizeof(kDtypes[0]);

constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

absl::Status CheckShape(const google::protobuf::RepeatedField<int64_t>& sizes,
                        const google::protobuf::RepeatedField<int64_t>* strides, int dtype,
                        absl::string_view what) {
  if (sizes.size() > kMaxTensorRank) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has rank ", sizes.size(),
                                                   "; flagosd accepts at most ", kMaxTensorRank,
                                                   " dimensions"));
  }
  if (strides != nullptr && strides->size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", sizes.size(), " sizes but ",
                                                   strides->size(),
                                                   " strides; each dimension needs both"));
  }
  for (int i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has negative size ", sizes[i],
                                                     " in dimension ", i, " (sizes [",
                                                     absl::StrJoin(sizes, ", "), "])"));
    }
    if (strides != nullptr && (*strides)[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has negative stride ", (*strides)[i],
                                                     " in dimension ", i,
                                                     "; flagosd accepts only strides >= 0"));
    }
  }
  if (ItemSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", DtypeName(dtype),
        ", which flagosd does not accept (plain numeric and bool dtypes only)"));
  }
  return absl::OkStatus();
}

// numel, or INVALID_ARGUMENT when it does not fit int64.
absl::StatusOr<int64_t> Numel(const google::protobuf::RepeatedField<int64_t>& sizes,
                              absl::string_view what) {
  int64_t numel = 1;
  for (int64_t size : sizes) {
    if (size == 0) return 0;
  }
  for (int64_t size : sizes) {
    if (__builtin_mul_overflow(numel, size, &numel)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " with sizes [",
                                                     absl::StrJoin(sizes, ", "),
                                                     "] has more elements than fit in 64 bits"));
    }
  }
  return numel;
}

}  // namespace

int ItemSize(int dtype) {
  if (dtype < 0 || dtype >= kDtypeCount) return 0;
  return kDtypes[dtype].itemsize;
}

std::string DtypeName(int dtype) {
  if (dtype < 0 || dtype >= kDtypeCount) return absl::StrCat("dtype ", dtype);
  return kDtypes[dtype].name;
}

absl::StatusOr<TensorExtent> ComputeTensorExtent(const v1::TensorRef& ref) {
  constexpr absl::string_view kWhat = "tensor";
  if (absl::Status s = CheckShape(ref.sizes(), &ref.strides(), ref.dtype(), kWhat); !s.ok()) {
    return s;
  }
  if (ref.storage_offset() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor has negative storage offset ", ref.storage_offset()));
  }
  TensorExtent extent;
  extent.itemsize = ItemSize(ref.dtype());
  absl::StatusOr<int64_t> numel = Numel(ref.sizes(), kWhat);
  if (!numel.ok()) return numel.status();
  extent.numel = *numel;

  const auto overflow = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor at ", absl::StrFormat("0x%x", ref.addr()), " with storage offset ",
        ref.storage_offset(), ", sizes [", absl::StrJoin(ref.sizes(), ", "), "] and strides [",
        absl::StrJoin(ref.strides(), ", "), "] spans beyond the 64-bit address space"));
  };
  uint64_t offset_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(ref.storage_offset()),
                             static_cast<uint64_t>(extent.itemsize), &offset_bytes) ||
      __builtin_add_overflow(ref.addr(), offset_bytes, &extent.begin)) {
    return overflow();
  }
  if (extent.numel == 0) return extent;

  // Offset (in elements) of the farthest element.
  uint64_t last = 0;
  for (int i = 0; i < ref.sizes_size(); ++i) {
    uint64_t term = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(ref.sizes(i) - 1),
                               static_cast<uint64_t>(ref.strides(i)), &term) ||
        __builtin_add_overflow(last, term, &last)) {
      return overflow();
    }
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(last, uint64_t{1}, &last) ||
      __builtin_mul_overflow(last, static_cast<uint64_t>(extent.itemsize), &extent.nbytes) ||
      __builtin_add_overflow(extent.begin, extent.nbytes, &end)) {
    return overflow();
  }
  return extent;
}

absl::StatusOr<int64_t> CheckHostTensor(const v1::HostTensor& tensor) {
  constexpr absl::string_view kWhat = "host tensor";
  if (absl::Status s = CheckShape(tensor.sizes(), nullptr, tensor.dtype(), kWhat); !s.ok()) {
    return s;
  }
  absl::StatusOr<int64_t> numel = Numel(tensor.sizes(), kWhat);
  if (!numel.ok()) return numel.status();
  const int itemsize = ItemSize(tensor.dtype());
  uint64_t expected = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(*numel), static_cast<uint64_t>(itemsize),
                             &expected) ||
      expected != tensor.data().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host tensor with sizes [", absl::StrJoin(tensor.sizes(), ", "), "] and dtype ",
        DtypeName(tensor.dtype()), " needs ", *numel, " x ", itemsize, " bytes but carries ",
        tensor.data().size()));
  }
  return *numel;
}

absl::string_view CommandKindName(const v1::Command& command) {
  switch (command.kind_case()) {
    case v1::Command::kRegisterOp: return "register_op";
    case v1::Command::kOp: return "op";
    case v1::Command::kAllocate: return "allocate";
    case v1::Command::kFree: return "free";
    case v1::Command::kCopyToDevice: return "copy_to_device";
    case v1::Command::kCopyFromDevice: return "copy_from_device";
    case v1::Command::kCopyDeviceToDevice: return "copy_device_to_device";
    case v1::Command::kMemset: return "memset";
    case v1::Command::kSync: return "sync";
    case v1::Command::kRecordEvent: return "record_event";
    case v1::Command::kWaitEvent: return "wait_event";
    case v1::Command::kQueryEvent: return "query_event";
    case v1::Command::kSynchronizeEvent: return "synchronize_event";
    case v1::Command::kElapsedTime: return "elapsed_time";
    case v1::Command::kDestroyEvent: return "destroy_event";
    case v1::Command::kQueryStream: return "query_stream";
    case v1::Command::kPlaceResult: return "place_result";
    case v1::Command::kReleasePinned: return "release_pinned";
    case v1::Command::kExportMemory: return "export_memory";
    case v1::Command::kImportMemory: return "import_memory";
    case v1::Command::kReleaseImport: return "release_import";
    case v1::Command::kQueryExport: return "query_export";
    case v1::Command::kDefineGraph: return "define_graph";
    case v1::Command::kReplayGraph: return "replay_graph";
    case v1::Command::kDestroyGraph: return "destroy_graph";
    case v1::Command::KIND_NOT_SET: return "empty";
  }
  return "unknown";
}

std::string DeviceName(int device) { return absl::StrCat("flagos:", device); }

absl::Status CheckDevice(int device, int device_count, absl::string_view what) {
  if (device >= 0 && device < device_count) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " names device ", device,
                                                 ", but this flagosd has devices 0..",
                                                 device_count - 1));
}

absl::Status OutsideSegmentsError(uint64_t seq, absl::string_view kind, uint64_t addr,
                                  uint64_t nbytes, int device) {
  return absl::InvalidArgumentError(absl::StrCat(
      "command ", seq, " (", kind, "): address ", absl::StrFormat("0x%x", addr), " + ", nbytes,
      " bytes is outside this session's segments on ", DeviceName(device)));
}

}  // namespace flagos::daemon
