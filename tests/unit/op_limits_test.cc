#include "ops/op_limits.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <limits>

namespace flagos::daemon {
namespace {

v1::Value Tensor(std::initializer_list<int64_t> sizes) {
  v1::Value value;
  for (int64_t size : sizes) value.mutable_tensor()->add_sizes(size);
  return value;
}

TEST(OpLimitsTest, DefaultsAreFloorsOrDerivedFromDeviceMemory) {
  const OpLimits small = DefaultOpLimits(64ull << 20);
  EXPECT_EQ(small.max_elements, 1ull << 32);
  EXPECT_EQ(small.max_host_memory_bytes, 1ull << 30);
  const OpLimits big = DefaultOpLimits(96ull << 30);
  EXPECT_EQ(big.max_elements, 4 * (96ull << 30));
  EXPECT_EQ(big.max_host_memory_bytes, 96ull << 30);
  EXPECT_EQ(DefaultOpLimits(std::numeric_limits<uint64_t>::max()).max_elements,
            std::numeric_limits<uint64_t>::max());
}

TEST(OpLimitsTest, CountsArgumentsListElementsHostTensorsAndOutputs) {
  v1::OpCall call;
  *call.add_args() = Tensor({3, 4});  // 12
  call.add_args()->set_i(1 << 30);    // not a tensor
  v1::Value list;
  *list.mutable_list()->add_values() = Tensor({5});
  *list.mutable_list()->add_values() = Tensor({100});
  *call.add_args() = list;                                    // 105
  call.add_args()->mutable_host_tensor()->add_sizes(7);       // 7
  call.add_outputs()->add_sizes(2);                           // 2
  v1::TensorRef* undefined = call.add_outputs();
  undefined->set_undefined(true);
  undefined->add_sizes(1000);
  const OpCallElements count = CountOpCallElements(call);
  EXPECT_EQ(count.total, 12u + 105u + 7u + 2u);
  EXPECT_EQ(count.largest, 100u);
  EXPECT_FALSE(count.output);
  EXPECT_EQ(count.index, 2);
  EXPECT_EQ(count.element, 1);
  ASSERT_NE(count.largest_sizes, nullptr);
  EXPECT_EQ(count.largest_sizes->at(0), 100);
}

TEST(OpLimitsTest, TheLargestMayBeAnOutput) {
  v1::OpCall call;
  *call.add_args() = Tensor({3});
  call.add_outputs()->add_sizes(9);
  const OpCallElements count = CountOpCallElements(call);
  EXPECT_TRUE(count.output);
  EXPECT_EQ(count.index, 0);
  EXPECT_EQ(count.element, -1);
}

TEST(OpLimitsTest, CountsSaturateAndIgnoreMalformedSizes) {
  v1::OpCall call;
  *call.add_args() = Tensor({int64_t{1} << 40, int64_t{1} << 40});  // > 2^64
  *call.add_args() = Tensor({int64_t{1} << 62});
  *call.add_args() = Tensor({-5, 3});  // refused later; counts 0
  *call.add_args() = Tensor({0, int64_t{1} << 62});
  const OpCallElements count = CountOpCallElements(call);
  EXPECT_EQ(count.total, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(count.largest, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(count.index, 0);
}

}  // namespace
}  // namespace flagos::daemon
