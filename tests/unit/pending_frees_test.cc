// PendingFrees: what an allocate at out-of-memory and a sync wait for among
// a session's frees and releases (daemon/memory/pending_frees.h).
#include "memory/pending_frees.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace flagos::daemon {
namespace {

TEST(PendingFreesTest, WithNothingPendingTheActionRunsAtOnce) {
  PendingFrees frees;
  EXPECT_EQ(frees.Latest(), 0u);
  bool ran = false;
  frees.WhenDone(0, frees.Latest(), [&ran] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_EQ(frees.pending(), 0);
}

TEST(PendingFreesTest, AWaiterRunsWhenTheLastEarlierReleaseOfItsDeviceIsDone) {
  PendingFrees frees;
  const PendingFrees::Ticket first = frees.Add(0);
  const PendingFrees::Ticket second = frees.Add(0);
  int ran = 0;
  frees.WhenDone(0, frees.Latest(), [&ran] { ++ran; });
  EXPECT_EQ(ran, 0);
  // Out of order: the second takes effect first.
  frees.Done(second);
  EXPECT_EQ(ran, 0);
  frees.Done(first);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(frees.pending(), 0);
}

TEST(PendingFreesTest, AWaiterDoesNotWaitForLaterReleasesOrOtherDevices) {
  PendingFrees frees;
  const PendingFrees::Ticket earlier = frees.Add(0);
  const PendingFrees::Ticket other_device = frees.Add(1);
  const uint64_t upto = frees.Latest();
  const PendingFrees::Ticket later = frees.Add(0);
  bool ran = false;
  frees.WhenDone(0, upto, [&ran] { ran = true; });
  EXPECT_FALSE(ran);
  frees.Done(earlier);
  EXPECT_TRUE(ran) << "waited for a release on another device, or one scheduled after it";
  EXPECT_EQ(frees.pending(), 2);
  frees.Done(other_device);
  frees.Done(later);
  EXPECT_EQ(frees.pending(), 0);
}

TEST(PendingFreesTest, AnAllDeviceWaiterWaitsForEveryDevice) {
  PendingFrees frees;
  const PendingFrees::Ticket on0 = frees.Add(0);
  const PendingFrees::Ticket on1 = frees.Add(1);
  bool ran = false;
  frees.WhenDone(-1, frees.Latest(), [&ran] { ran = true; });
  frees.Done(on0);
  EXPECT_FALSE(ran);
  frees.Done(on1);
  EXPECT_TRUE(ran);
}

TEST(PendingFreesTest, AnAllDeviceReleaseHoldsUpAWaiterOnAnyDevice) {
  PendingFrees frees;
  const PendingFrees::Ticket pinned = frees.Add(-1);
  bool ran = false;
  frees.WhenDone(1, frees.Latest(), [&ran] { ran = true; });
  EXPECT_FALSE(ran);
  frees.Done(pinned);
  EXPECT_TRUE(ran);
}

TEST(PendingFreesTest, DoneTwiceCountsOnce) {
  PendingFrees frees;
  const PendingFrees::Ticket a = frees.Add(0);
  const PendingFrees::Ticket b = frees.Add(0);
  frees.Done(a);
  frees.Done(a);
  EXPECT_EQ(frees.pending(), 1);
  frees.Done(b);
  EXPECT_EQ(frees.pending(), 0);
}

TEST(PendingFreesTest, AnActionMayAddAndWaitAgain) {
  PendingFrees frees;
  const PendingFrees::Ticket a = frees.Add(0);
  bool inner = false;
  frees.WhenDone(0, frees.Latest(), [&] {
    const PendingFrees::Ticket b = frees.Add(0);
    frees.WhenDone(0, frees.Latest(), [&inner] { inner = true; });
    frees.Done(b);
  });
  frees.Done(a);
  EXPECT_TRUE(inner);
}

TEST(PendingFreesTest, WaitForNoneSaysWhetherItWaited) {
  PendingFrees frees;
  EXPECT_FALSE(frees.WaitForNone()) << "nothing was pending";
}

TEST(PendingFreesTest, WaitForNoneReturnsOnceEveryFreeIsDone) {
  PendingFrees frees;
  std::vector<PendingFrees::Ticket> tickets;
  for (int i = 0; i < 64; ++i) tickets.push_back(frees.Add(i % 2));
  std::atomic<bool> waiting{false};
  std::thread releaser([&] {
    while (!waiting.load()) std::this_thread::yield();
    for (const PendingFrees::Ticket& ticket : tickets) frees.Done(ticket);
  });
  waiting.store(true);
  // Whether it had to wait depends on the scheduler (the releaser may finish
  // before the call begins; WaitForNoneSaysWhetherItWaited checks the
  // answer): what must hold is that nothing is pending once it returns.
  frees.WaitForNone();
  EXPECT_EQ(frees.pending(), 0);
  releaser.join();
}

}  // namespace
}  // namespace flagos::daemon
