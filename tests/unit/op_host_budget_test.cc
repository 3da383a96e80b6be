// The budgeting CPU allocator, through ATen's host tensors.
#include "ops/op_host_budget.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/Flags.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

C10_DECLARE_bool(caffe2_cpu_allocator_do_zero_fill);

namespace flagos::daemon {
namespace {

class OpHostBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(InstallOpHostBudgetAllocator()); }
};

at::Tensor Bytes(int64_t n) { return at::empty({n}, at::TensorOptions().dtype(at::kByte)); }

TEST_F(OpHostBudgetTest, InstallingTwiceKeepsOneAllocator) {
  c10::Allocator* installed = c10::GetCPUAllocator();
  EXPECT_TRUE(InstallOpHostBudgetAllocator());
  EXPECT_EQ(c10::GetCPUAllocator(), installed);
}

TEST_F(OpHostBudgetTest, ChargesAllocationsAndUnchargesTheirFrees) {
  OpHostBudget budget(1 << 20);
  {
    at::Tensor a = Bytes(300000);
    at::Tensor b = Bytes(200000);
    EXPECT_EQ(budget.charged_bytes(), 500000u);
  }
  EXPECT_EQ(budget.charged_bytes(), 0u);
  // Freed memory may be taken again: three times the limit in turn.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Bytes(1 << 20).numel(), 1 << 20);
  EXPECT_FALSE(budget.refused());
}

TEST_F(OpHostBudgetTest, AnAllocationBeyondTheLimitIsRefusedAndRecorded) {
  OpHostBudget budget(1 << 20);
  at::Tensor held = Bytes(600000);
  EXPECT_THROW(Bytes(600000), c10::OutOfMemoryError);
  EXPECT_TRUE(budget.refused());
  EXPECT_EQ(budget.refused_bytes(), 600000u);
  EXPECT_EQ(budget.charged_when_refused(), 600000u);
  EXPECT_EQ(budget.charged_bytes(), 600000u);  // nothing was allocated
  EXPECT_THROW(Bytes(int64_t{1} << 50), c10::OutOfMemoryError);
  EXPECT_EQ(budget.refused_bytes(), 600000u);  // the first refusal stays
}

TEST_F(OpHostBudgetTest, AllocationsOutsideABudgetAreNotCharged) {
  at::Tensor before = Bytes(1 << 20);
  OpHostBudget budget(1024);
  at::Tensor other_thread;
  std::thread([&] { other_thread = Bytes(1 << 20); }).join();
  EXPECT_EQ(budget.charged_bytes(), 0u);
  before.reset();  // uncharged memory freed under a budget: nothing changes
  EXPECT_EQ(budget.charged_bytes(), 0u);
}

TEST_F(OpHostBudgetTest, NestedBudgetsChargeTheInnerOne) {
  OpHostBudget outer(1 << 20);
  at::Tensor a = Bytes(1000);
  {
    OpHostBudget inner(1 << 20);
    at::Tensor b = Bytes(2000);
    EXPECT_EQ(inner.charged_bytes(), 2000u);
    EXPECT_EQ(outer.charged_bytes(), 1000u);
  }
  at::Tensor c = Bytes(4000);
  EXPECT_EQ(outer.charged_bytes(), 5000u);
}

TEST_F(OpHostBudgetTest, MemoryMayOutliveItsBudgetAndBeFreedOnAnotherThread) {
  at::Tensor kept;
  {
    OpHostBudget budget(1 << 20);
    kept = Bytes(4096);
    std::memset(kept.data_ptr(), 7, 4096);
  }
  EXPECT_EQ(kept.data_ptr<uint8_t>()[4095], 7);
  std::thread([moved = std::move(kept)]() mutable { moved.reset(); }).join();
}

// oneDNN takes its scratch space through raw_allocate, which needs the
// data pointer to be the context.
TEST_F(OpHostBudgetTest, TheRawInterfaceWorksUnderABudgetAndOutside) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* outside = allocator->raw_allocate(1000);
  {
    OpHostBudget budget(1 << 20);
    void* inside = allocator->raw_allocate(3000);
    EXPECT_EQ(budget.charged_bytes(), 3000u);
    std::memset(inside, 1, 3000);
    allocator->raw_deallocate(inside);
    EXPECT_EQ(budget.charged_bytes(), 0u);
    allocator->raw_deallocate(outside);
    EXPECT_EQ(budget.charged_bytes(), 0u);
  }
  at::DataPtr empty = allocator->allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
}

TEST_F(OpHostBudgetTest, FreshChargedMemoryIsZeroFilled) {
  FLAGS_caffe2_cpu_allocator_do_zero_fill = true;
  OpHostBudget budget(1 << 20);
  for (int i = 0; i < 8; ++i) {
    at::Tensor t = Bytes(64 << 10);
    const uint8_t* data = t.data_ptr<uint8_t>();
    for (int64_t j = 0; j < t.numel(); ++j) ASSERT_EQ(data[j], 0) << "byte " << j;
    std::memset(t.data_ptr(), 0x5a, t.numel());
  }
}

}  // namespace
}  // namespace flagos::daemon
