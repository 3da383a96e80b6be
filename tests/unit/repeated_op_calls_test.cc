// RepeatedOpCalls (sessions/repeated_op_calls.h): a session's prepared op
// calls by device and OpCall bytes, bounded, and the table that lets a
// call be prepared only the second time it comes.
#include "sessions/repeated_op_calls.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "ops/prepared_op_call.h"

namespace flagos::daemon {
namespace {

std::shared_ptr<const PreparedOpCall> Call() {
  return std::make_shared<const PreparedOpCall>(
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::add_", "Tensor"), "aten::add_.Tensor",
      /*device=*/0, torch::jit::Stack{at::zeros({2}), at::ones({2}), 1.0},
      std::vector<at::Tensor>{}, /*outputs_must_stay=*/false);
}

TEST(RepeatedOpCallsTest, FoundByDeviceAndBytes) {
  RepeatedOpCalls calls(2);
  const auto call = Call();
  calls.Put(0, "abc", call, /*removals=*/3);
  std::shared_ptr<const RepeatedOpCalls::Entry> found = calls.Find(0, "abc");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->call, call);
  EXPECT_EQ(found->removals, 3u);
  EXPECT_EQ(calls.Find(1, "abc"), nullptr);  // the same bytes on another device
  EXPECT_EQ(calls.Find(0, "abd"), nullptr);
  EXPECT_EQ(calls.Find(0, "ab"), nullptr);
  EXPECT_EQ(calls.Find(2, "abc"), nullptr);   // no such device
  EXPECT_EQ(calls.Find(-1, "abc"), nullptr);
  calls.Put(2, "abc", call, 0);                // not kept
  calls.Put(-1, "abc", call, 0);
  EXPECT_EQ(calls.size(), 1u);
}

TEST(RepeatedOpCallsTest, APutReplacesTheEntryOfTheSameCall) {
  RepeatedOpCalls calls(1);
  calls.Put(0, "abc", Call(), 1);
  const auto newer = Call();
  calls.Put(0, "abc", newer, 2);
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls.Find(0, "abc")->call, newer);
  EXPECT_EQ(calls.Find(0, "abc")->removals, 2u);
}

TEST(RepeatedOpCallsTest, BoundedInCallsAndBytes) {
  RepeatedOpCalls calls(2);
  const auto call = Call();
  calls.Put(0, std::string(kMaxRepeatedOpCallBytes + 1, 'x'), call, 0);
  EXPECT_EQ(calls.size(), 0u);
  calls.Put(0, std::string(kMaxRepeatedOpCallBytes, 'x'), call, 0);
  EXPECT_EQ(calls.size(), 1u);
  for (size_t i = 1; i < kMaxRepeatedOpCalls; ++i) {
    EXPECT_TRUE(calls.MakeRoom());
    calls.Put(i % 2, absl::StrCat(i), call, 0);
  }
  EXPECT_EQ(calls.size(), kMaxRepeatedOpCalls);
  // Full, and no sweep due (fewer lookups than calls kept): no room, a
  // new call is not kept, the old ones stay.
  EXPECT_FALSE(calls.MakeRoom());
  calls.Put(0, "new", call, 0);
  EXPECT_EQ(calls.size(), kMaxRepeatedOpCalls);
  EXPECT_EQ(calls.Find(0, "new"), nullptr);
  EXPECT_NE(calls.Find(1, "1"), nullptr);
  // A call kept is still replaced when full.
  const auto newer = Call();
  calls.Put(1, "1", newer, 5);
  EXPECT_EQ(calls.Find(1, "1")->call, newer);
  calls.Clear();
  EXPECT_EQ(calls.size(), 0u);
  EXPECT_EQ(calls.Find(1, "1"), nullptr);
  EXPECT_TRUE(calls.MakeRoom());
}

// Fills `calls` with "0" .. "n-1" on device 0.
void Fill(RepeatedOpCalls& calls, size_t n) {
  const auto call = Call();
  for (size_t i = 0; i < n; ++i) calls.Put(0, absl::StrCat(i), call, 0);
}

TEST(RepeatedOpCallsTest, WhenFullASweepDropsTheCallsNotFoundSinceTheSweepBefore) {
  RepeatedOpCalls calls(1);
  Fill(calls, kMaxRepeatedOpCalls);
  // A sweep is due after as many lookups as calls kept; the first one
  // drops nothing (every call was kept or found since it began) and starts
  // a period.
  for (size_t i = 0; i < kMaxRepeatedOpCalls; ++i) EXPECT_EQ(calls.Find(0, "missing"), nullptr);
  EXPECT_FALSE(calls.MakeRoom());
  EXPECT_EQ(calls.size(), kMaxRepeatedOpCalls);
  // In the new period the first quarter is found again, the rest not.
  const size_t quarter = kMaxRepeatedOpCalls / 4;
  for (size_t i = 0; i < quarter; ++i) EXPECT_NE(calls.Find(0, absl::StrCat(i)), nullptr);
  EXPECT_FALSE(calls.MakeRoom());  // not due yet
  for (size_t i = quarter; i < kMaxRepeatedOpCalls; ++i) calls.Find(0, "missing");
  EXPECT_TRUE(calls.MakeRoom());   // due: the three quarters not found go
  EXPECT_EQ(calls.size(), quarter);
  for (size_t i = 0; i < kMaxRepeatedOpCalls; ++i) {
    EXPECT_EQ(calls.Find(0, absl::StrCat(i)) != nullptr, i < quarter) << i;
  }
  calls.Put(0, "new", Call(), 0);
  EXPECT_NE(calls.Find(0, "new"), nullptr);
}

// A loop as the session sees it: each step sends calls "0" .. "n-1"; a
// call not found is prepared and put when MakeRoom says it can be kept (as
// if the seen table remembered every call: the worst case). Returns how
// many calls of the step were found; adds the calls prepared to *prepared.
size_t Step(RepeatedOpCalls& calls, size_t n, size_t* prepared) {
  size_t found = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string op = absl::StrCat("step call ", i);
    if (calls.Find(0, op) != nullptr) {
      ++found;
      continue;
    }
    if (calls.MakeRoom()) {
      ++*prepared;
      calls.Put(0, op, Call(), 0);
    }
  }
  return found;
}

TEST(RepeatedOpCallsTest, ALoopWithMoreCallsThanFitKeepsThoseItHas) {
  RepeatedOpCalls calls(1);
  // A loop of 1.25x the bound. Starting over when full (as this table
  // once did) would find fewer each step and prepare calls only to drop
  // them before they come again.
  const size_t n = kMaxRepeatedOpCalls + kMaxRepeatedOpCalls / 4;
  size_t prepared = 0;
  for (int step = 0; step < 4; ++step) {
    prepared = 0;
    const size_t found = Step(calls, n, &prepared);
    if (step >= 2) {
      // Settled: the calls kept are found each step and none is prepared
      // for nothing; the calls that do not fit run as sent.
      EXPECT_EQ(found, kMaxRepeatedOpCalls) << "step " << step;
      EXPECT_EQ(prepared, 0u) << "step " << step;
    }
  }
  EXPECT_EQ(calls.size(), kMaxRepeatedOpCalls);
}

TEST(RepeatedOpCallsTest, ALoopThatChangesShedsTheOldLoopsCalls) {
  RepeatedOpCalls calls(1);
  Fill(calls, kMaxRepeatedOpCalls);  // the old loop's calls, never sent again
  // A new loop of a quarter of the bound: within a few steps every one of
  // its calls is kept and found, and the old ones are gone.
  const size_t n = kMaxRepeatedOpCalls / 4;
  size_t prepared = 0;
  size_t found = 0;
  for (int step = 0; step < 12; ++step) found = Step(calls, n, &prepared);
  EXPECT_EQ(found, n);
  EXPECT_EQ(calls.size(), n);
  EXPECT_EQ(prepared, n);  // each prepared once
}

TEST(RepeatedOpCallsTest, ACallIsSeenBeforeTheSecondTimeItComes) {
  RepeatedOpCalls calls(2);
  EXPECT_FALSE(calls.SeenBefore(0, "abc"));
  EXPECT_TRUE(calls.SeenBefore(0, "abc"));
  EXPECT_TRUE(calls.SeenBefore(0, "abc"));
  EXPECT_FALSE(calls.SeenBefore(1, "abc"));  // another device's is another call
  EXPECT_FALSE(calls.SeenBefore(0, std::string(kMaxRepeatedOpCallBytes + 1, 'x')));
  EXPECT_FALSE(calls.SeenBefore(0, std::string(kMaxRepeatedOpCallBytes + 1, 'x')));
  // kSeenOpCalls other calls since: it started over and forgot it.
  for (size_t i = 0; i < kSeenOpCalls; ++i) calls.SeenBefore(0, absl::StrCat("other ", i));
  EXPECT_FALSE(calls.SeenBefore(0, "abc"));
}

TEST(RepeatedOpCallsTest, EveryCallOfALoopIsSeenAtItsSecondStep) {
  // As many calls as the table remembers, twice in the same order: each is
  // seen the second time (a direct-mapped table of hashes missed every
  // call that shared a slot with another: about half of 3000 calls in
  // 4096 slots).
  RepeatedOpCalls calls(1);
  for (size_t i = 0; i < kSeenOpCalls; ++i) {
    EXPECT_FALSE(calls.SeenBefore(0, absl::StrCat("loop call ", i))) << i;
  }
  for (size_t i = 0; i < kSeenOpCalls; ++i) {
    EXPECT_TRUE(calls.SeenBefore(0, absl::StrCat("loop call ", i))) << i;
  }
}

}  // namespace
}  // namespace flagos::daemon
