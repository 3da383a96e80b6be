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
  for (size_t i = 1; i < kMaxRepeatedOpCalls; ++i) calls.Put(i % 2, absl::StrCat(i), call, 0);
  EXPECT_EQ(calls.size(), kMaxRepeatedOpCalls);
  EXPECT_NE(calls.Find(1, "1"), nullptr);
  // Full: it starts over with the new call.
  calls.Put(0, "new", call, 0);
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls.Find(1, "1"), nullptr);
  EXPECT_NE(calls.Find(0, "new"), nullptr);
  calls.Clear();
  EXPECT_EQ(calls.size(), 0u);
  EXPECT_EQ(calls.Find(0, "new"), nullptr);
}

TEST(RepeatedOpCallsTest, ACallIsSeenBeforeTheSecondTimeItComes) {
  RepeatedOpCalls calls(2);
  EXPECT_FALSE(calls.SeenBefore(0, "abc"));
  EXPECT_TRUE(calls.SeenBefore(0, "abc"));
  EXPECT_TRUE(calls.SeenBefore(0, "abc"));
  EXPECT_FALSE(calls.SeenBefore(1, "abc"));  // another device's is another call
  EXPECT_FALSE(calls.SeenBefore(0, std::string(kMaxRepeatedOpCallBytes + 1, 'x')));
  EXPECT_FALSE(calls.SeenBefore(0, std::string(kMaxRepeatedOpCallBytes + 1, 'x')));
  // Many other calls since: forgotten (a slot keeps the last one).
  for (int i = 0; i < 64 * static_cast<int>(kSeenOpCallSlots); ++i) {
    calls.SeenBefore(0, absl::StrCat("other ", i));
  }
  EXPECT_FALSE(calls.SeenBefore(0, "abc"));
}

}  // namespace
}  // namespace flagos::daemon
