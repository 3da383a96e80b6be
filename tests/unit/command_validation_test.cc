#include "protocol/command_validation.h"

#include <gtest/gtest.h>

#include <initializer_list>

namespace flagos::daemon {
namespace {

constexpr int kFloat = 6;
constexpr int kDouble = 7;
constexpr int kBool = 11;
constexpr uint64_t kAddr = 0x100000;

v1::TensorRef Ref(std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
                  int64_t storage_offset = 0, int dtype = kFloat, uint64_t addr = kAddr) {
  v1::TensorRef ref;
  ref.set_addr(addr);
  ref.set_storage_offset(storage_offset);
  for (int64_t s : sizes) ref.add_sizes(s);
  for (int64_t s : strides) ref.add_strides(s);
  ref.set_dtype(dtype);
  return ref;
}

TEST(CommandValidationTest, ContiguousTensorSpansNumelTimesItemsize) {
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(Ref({2, 3}, {3, 1}));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->begin, kAddr);
  EXPECT_EQ(extent->nbytes, 24u);
  EXPECT_EQ(extent->numel, 6);
  EXPECT_EQ(extent->itemsize, 4);
}

TEST(CommandValidationTest, ScalarTensorSpansOneElement) {
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(Ref({}, {}, 0, kDouble));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->nbytes, 8u);
  EXPECT_EQ(extent->numel, 1);
}

TEST(CommandValidationTest, ZeroStrideSpansOneElementPerBroadcastDimension) {
  // A [4, 3] expansion of a 3-element row.
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(Ref({4, 3}, {0, 1}));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->nbytes, 12u);
  EXPECT_EQ(extent->numel, 12);
  // All strides 0: one element.
  extent = ComputeTensorExtent(Ref({5, 7}, {0, 0}));
  ASSERT_TRUE(extent.ok());
  EXPECT_EQ(extent->nbytes, 4u);
}

TEST(CommandValidationTest, ViewWithStorageOffsetStartsAfterTheOffset) {
  // Column 1 of a [4, 5] matrix: offset 1, size 4, stride 5.
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(Ref({4}, {5}, 1));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->begin, kAddr + 4);
  EXPECT_EQ(extent->nbytes, (3 * 5 + 1) * 4u);
}

TEST(CommandValidationTest, TransposedTensorSpansTheSameBytesAsItsBase) {
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(Ref({3, 2}, {1, 3}));
  ASSERT_TRUE(extent.ok());
  EXPECT_EQ(extent->nbytes, 24u);
}

TEST(CommandValidationTest, EmptyTensorSpansNoBytes) {
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(Ref({0, 5}, {5, 1}, 3));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->numel, 0);
  EXPECT_EQ(extent->nbytes, 0u);
  EXPECT_EQ(extent->begin, kAddr + 12);
  // Huge other dimensions do not matter when one is 0.
  extent = ComputeTensorExtent(Ref({0, INT64_MAX}, {INT64_MAX, INT64_MAX}));
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->nbytes, 0u);
}

TEST(CommandValidationTest, SizesWhoseProductOverflowsAreRejected) {
  EXPECT_EQ(ComputeTensorExtent(Ref({1ll << 32, 1ll << 32}, {1, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommandValidationTest, ExtentBeyondTheAddressSpaceIsRejected) {
  // numel fits, but (size - 1) * stride * itemsize does not.
  EXPECT_EQ(ComputeTensorExtent(Ref({2}, {1ll << 62})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTensorExtent(Ref({1ll << 62}, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Address + offset wraps.
  EXPECT_EQ(ComputeTensorExtent(Ref({1}, {1}, 1, kFloat, UINT64_MAX - 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTensorExtent(Ref({1}, {1}, INT64_MAX)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommandValidationTest, RankUpToTheLimitIsAccepted) {
  v1::TensorRef ref = Ref({}, {});
  for (int i = 0; i < kMaxTensorRank; ++i) {
    ref.add_sizes(1);
    ref.add_strides(1);
  }
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(ref);
  ASSERT_TRUE(extent.ok()) << extent.status();
  EXPECT_EQ(extent->nbytes, 4u);
  ref.add_sizes(1);
  ref.add_strides(1);
  absl::Status status = ComputeTensorExtent(ref).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rank 65"), absl::string_view::npos) << status;
}

TEST(CommandValidationTest, MalformedShapesAreRejected) {
  EXPECT_EQ(ComputeTensorExtent(Ref({2, 3}, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTensorExtent(Ref({-1}, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTensorExtent(Ref({2}, {-1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTensorExtent(Ref({2}, {1}, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommandValidationTest, UnknownOrUnsupportedDtypesAreRejected) {
  for (int dtype : {-1, 12 /* qint8 */, 16 /* quint4x2 */, 46, 1000}) {
    EXPECT_EQ(ComputeTensorExtent(Ref({2}, {1}, 0, dtype)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << dtype;
  }
}

TEST(CommandValidationTest, ItemSizesMatchTorch) {
  EXPECT_EQ(ItemSize(0), 1);   // uint8
  EXPECT_EQ(ItemSize(4), 8);   // int64
  EXPECT_EQ(ItemSize(5), 2);   // float16
  EXPECT_EQ(ItemSize(10), 16); // complex128
  EXPECT_EQ(ItemSize(kBool), 1);
  EXPECT_EQ(ItemSize(15), 2);  // bfloat16
  EXPECT_EQ(ItemSize(29), 8);  // uint64
  EXPECT_EQ(DtypeName(kFloat), "float32");
  EXPECT_EQ(DtypeName(99), "dtype 99");
}

TEST(CommandValidationTest, HostTensorMustCarryExactlyItsBytes) {
  v1::HostTensor tensor;
  tensor.add_sizes(2);
  tensor.add_sizes(2);
  tensor.set_dtype(kFloat);
  tensor.set_data(std::string(16, '\0'));
  absl::StatusOr<int64_t> numel = CheckHostTensor(tensor);
  ASSERT_TRUE(numel.ok()) << numel.status();
  EXPECT_EQ(*numel, 4);
  tensor.set_data(std::string(15, '\0'));
  EXPECT_EQ(CheckHostTensor(tensor).status().code(), absl::StatusCode::kInvalidArgument);
  tensor.set_dtype(12);
  EXPECT_EQ(CheckHostTensor(tensor).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CommandValidationTest, CommandKindNamesFollowTheProto) {
  v1::Command command;
  EXPECT_EQ(CommandKindName(command), "empty");
  command.mutable_copy_from_device();
  EXPECT_EQ(CommandKindName(command), "copy_from_device");
  command.mutable_op();
  EXPECT_EQ(CommandKindName(command), "op");
}

TEST(CommandValidationTest, DeviceMustBeInRange) {
  EXPECT_TRUE(CheckDevice(0, 2, "command 1 (op)").ok());
  EXPECT_TRUE(CheckDevice(1, 2, "command 1 (op)").ok());
  EXPECT_EQ(CheckDevice(2, 2, "command 1 (op)").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckDevice(-1, 2, "command 1 (op)").code(), absl::StatusCode::kInvalidArgument);
}

TEST(CommandValidationTest, OutsideSegmentsErrorNamesCommandRangeAndDevice) {
  absl::Status status = OutsideSegmentsError(12, "op", 0xabc0, 64, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "command 12 (op): address 0xabc0 + 64 bytes is outside this session's segments on "
            "flagos:1");
}

}  // namespace
}  // namespace flagos::daemon
