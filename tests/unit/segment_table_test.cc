#include "memory/segment_table.h"

#include <gtest/gtest.h>

namespace flagos::daemon {
namespace {

constexpr DevicePtr kBase = 0x10000;

TEST(SegmentTableTest, InsertedSegmentIsFoundByAnyAddressInside) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  for (DevicePtr addr : {kBase, kBase + 1, kBase + 255}) {
    std::optional<Segment> segment = table.Lookup(0, addr);
    ASSERT_TRUE(segment.has_value()) << addr;
    EXPECT_EQ(segment->addr, kBase);
    EXPECT_EQ(segment->nbytes, 256u);
    EXPECT_EQ(segment->device, 0);
  }
  EXPECT_FALSE(table.Lookup(0, kBase - 1).has_value());
  EXPECT_FALSE(table.Lookup(0, kBase + 256).has_value());
}

TEST(SegmentTableTest, SegmentsAreSeparatePerDevice) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  EXPECT_FALSE(table.Lookup(1, kBase).has_value());
  EXPECT_FALSE(table.Contains(1, kBase, 1));
  // The same address on another device is another segment.
  EXPECT_TRUE(table.Insert(1, kBase, 128).ok());
  EXPECT_EQ(table.device_bytes(0), 256u);
  EXPECT_EQ(table.device_bytes(1), 128u);
}

TEST(SegmentTableTest, ContainsAcceptsRangesWhollyInsideOneSegment) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  EXPECT_TRUE(table.Contains(0, kBase, 256));
  EXPECT_TRUE(table.Contains(0, kBase + 10, 246));
  EXPECT_FALSE(table.Contains(0, kBase + 10, 247));
  EXPECT_FALSE(table.Contains(0, kBase - 1, 2));
  EXPECT_FALSE(table.Contains(0, kBase + 256, 1));
}

TEST(SegmentTableTest, EmptyRangeIsContainedInsideOrAtTheEndOfASegment) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  EXPECT_TRUE(table.Contains(0, kBase, 0));
  EXPECT_TRUE(table.Contains(0, kBase + 256, 0));
  EXPECT_FALSE(table.Contains(0, kBase + 257, 0));
  EXPECT_FALSE(table.Contains(0, 0, 0));
}

TEST(SegmentTableTest, RangeSpanningTwoAdjacentSegmentsIsRejected) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  ASSERT_TRUE(table.Insert(0, kBase + 256, 256).ok());
  EXPECT_TRUE(table.Contains(0, kBase + 200, 56));
  EXPECT_TRUE(table.Contains(0, kBase + 256, 56));
  EXPECT_FALSE(table.Contains(0, kBase + 200, 100));
}

TEST(SegmentTableTest, HugeRangeDoesNotWrapAround) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  EXPECT_FALSE(table.Contains(0, kBase + 16, UINT64_MAX));
  EXPECT_FALSE(table.Contains(0, kBase + 16, UINT64_MAX - kBase));
}

TEST(SegmentTableTest, OverlappingInsertIsRejected) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  EXPECT_EQ(table.Insert(0, kBase, 256).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.Insert(0, kBase + 255, 16).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.Insert(0, kBase - 16, 17).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.Insert(0, kBase - 16, 1024).code(), absl::StatusCode::kAlreadyExists);
  // Touching is not overlapping.
  EXPECT_TRUE(table.Insert(0, kBase - 16, 16).ok());
  EXPECT_TRUE(table.Insert(0, kBase + 256, 16).ok());
  EXPECT_EQ(table.size(), 3u);
}

TEST(SegmentTableTest, EmptyOrWrappingSegmentIsRejected) {
  SegmentTable table;
  EXPECT_EQ(table.Insert(0, kBase, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.Insert(0, UINT64_MAX - 8, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.size(), 0u);
}

TEST(SegmentTableTest, RemoveNeedsTheSegmentStart) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 256).ok());
  EXPECT_EQ(table.Remove(0, kBase + 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Remove(1, kBase).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<Segment> removed = table.Remove(0, kBase);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->nbytes, 256u);
  EXPECT_FALSE(table.Contains(0, kBase, 1));
  EXPECT_EQ(table.Remove(0, kBase).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.total_bytes(), 0u);
  EXPECT_EQ(table.size(), 0u);
}

TEST(SegmentTableTest, CountersFollowInsertAndRemove) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 100).ok());
  ASSERT_TRUE(table.Insert(0, kBase + 1000, 50).ok());
  ASSERT_TRUE(table.Insert(1, kBase, 7).ok());
  EXPECT_EQ(table.total_bytes(), 157u);
  EXPECT_EQ(table.device_bytes(0), 150u);
  EXPECT_EQ(table.device_bytes(1), 7u);
  EXPECT_EQ(table.device_bytes(2), 0u);
  EXPECT_EQ(table.size(), 3u);
  ASSERT_TRUE(table.Remove(0, kBase).ok());
  EXPECT_EQ(table.total_bytes(), 57u);
  EXPECT_EQ(table.device_bytes(0), 50u);
}

TEST(SegmentTableTest, RemovalsCountWhatWasRemovedAndNothingElse) {
  SegmentTable table;
  EXPECT_EQ(table.removals(), 0u);
  ASSERT_TRUE(table.Insert(0, kBase, 100).ok());
  ASSERT_TRUE(table.Insert(0, kBase + 1000, 50).ok());
  EXPECT_EQ(table.removals(), 0u);  // an insert leaves every range as it was
  EXPECT_FALSE(table.Remove(0, kBase + 1).ok());
  EXPECT_EQ(table.removals(), 0u);  // a refused remove too
  ASSERT_TRUE(table.Remove(0, kBase).ok());
  EXPECT_EQ(table.removals(), 1u);
  (void)table.TakeAll();
  EXPECT_EQ(table.removals(), 2u);
}

TEST(SegmentTableTest, TakeAllEmptiesTheTable) {
  SegmentTable table;
  ASSERT_TRUE(table.Insert(0, kBase, 100).ok());
  ASSERT_TRUE(table.Insert(1, kBase, 7).ok());
  std::vector<Segment> all = table.TakeAll();
  ASSERT_EQ(all.size(), 2u);
  uint64_t bytes = 0;
  for (const Segment& s : all) bytes += s.nbytes;
  EXPECT_EQ(bytes, 107u);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.total_bytes(), 0u);
  EXPECT_FALSE(table.Contains(0, kBase, 1));
}

}  // namespace
}  // namespace flagos::daemon
