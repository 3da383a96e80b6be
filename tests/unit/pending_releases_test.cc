// PendingReleases: what a sync waits for among a session's frees and
// releases (daemon/sessions/pending_releases.h).
#include "sessions/pending_releases.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace flagos::daemon {
namespace {

TEST(PendingReleasesTest, WithNothingPendingTheActionRunsAtOnce) {
  PendingReleases releases(2);
  EXPECT_EQ(releases.Latest(), 0u);
  bool ran = false;
  releases.WhenDone(0, releases.Latest(), [&ran] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_EQ(releases.pending(), 0);
}

TEST(PendingReleasesTest, AWaiterRunsWhenTheLastEarlierReleaseOfItsDeviceIsDone) {
  PendingReleases releases(2);
  const PendingReleases::Ticket first = releases.Schedule(0);
  const PendingReleases::Ticket second = releases.Schedule(0);
  int ran = 0;
  releases.WhenDone(0, releases.Latest(), [&ran] { ++ran; });
  EXPECT_EQ(ran, 0);
  // Out of order: the second takes effect first.
  releases.Done(second);
  EXPECT_EQ(ran, 0);
  releases.Done(first);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(releases.pending(), 0);
}

TEST(PendingReleasesTest, AWaiterDoesNotWaitForLaterReleasesOrOtherDevices) {
  PendingReleases releases(2);
  const PendingReleases::Ticket earlier = releases.Schedule(0);
  const PendingReleases::Ticket other_device = releases.Schedule(1);
  const uint64_t upto = releases.Latest();
  const PendingReleases::Ticket later = releases.Schedule(0);
  bool ran = false;
  releases.WhenDone(0, upto, [&ran] { ran = true; });
  EXPECT_FALSE(ran);
  releases.Done(earlier);
  EXPECT_TRUE(ran) << "waited for a release on another device, or one scheduled after it";
  EXPECT_EQ(releases.pending(), 2);
  releases.Done(other_device);
  releases.Done(later);
  EXPECT_EQ(releases.pending(), 0);
}

TEST(PendingReleasesTest, AnAllDeviceWaiterWaitsForEveryDevice) {
  PendingReleases releases(2);
  const PendingReleases::Ticket on0 = releases.Schedule(0);
  const PendingReleases::Ticket on1 = releases.Schedule(1);
  bool ran = false;
  releases.WhenDone(-1, releases.Latest(), [&ran] { ran = true; });
  releases.Done(on0);
  EXPECT_FALSE(ran);
  releases.Done(on1);
  EXPECT_TRUE(ran);
}

TEST(PendingReleasesTest, AnAllDeviceReleaseHoldsUpAWaiterOnAnyDevice) {
  PendingReleases releases(2);
  const PendingReleases::Ticket pinned = releases.Schedule(-1);
  bool ran = false;
  releases.WhenDone(1, releases.Latest(), [&ran] { ran = true; });
  EXPECT_FALSE(ran);
  releases.Done(pinned);
  EXPECT_TRUE(ran);
}

TEST(PendingReleasesTest, DoneTwiceCountsOnce) {
  PendingReleases releases(1);
  const PendingReleases::Ticket a = releases.Schedule(0);
  const PendingReleases::Ticket b = releases.Schedule(0);
  releases.Done(a);
  releases.Done(a);
  EXPECT_EQ(releases.pending(), 1);
  releases.Done(b);
  EXPECT_EQ(releases.pending(), 0);
}

TEST(PendingReleasesTest, AnActionMayScheduleAndWaitAgain) {
  PendingReleases releases(1);
  const PendingReleases::Ticket a = releases.Schedule(0);
  bool inner = false;
  releases.WhenDone(0, releases.Latest(), [&] {
    const PendingReleases::Ticket b = releases.Schedule(0);
    releases.WhenDone(0, releases.Latest(), [&inner] { inner = true; });
    releases.Done(b);
  });
  releases.Done(a);
  EXPECT_TRUE(inner);
}

TEST(PendingReleasesTest, AwaitNonePendingReturnsOnceEveryReleaseIsDone) {
  PendingReleases releases(2);
  std::vector<PendingReleases::Ticket> tickets;
  for (int i = 0; i < 64; ++i) tickets.push_back(releases.Schedule(i % 2));
  std::thread releaser([&] {
    for (const PendingReleases::Ticket& ticket : tickets) releases.Done(ticket);
  });
  releases.AwaitNonePending();
  EXPECT_EQ(releases.pending(), 0);
  releaser.join();
}

}  // namespace
}  // namespace flagos::daemon
