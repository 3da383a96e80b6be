// daemon/admission/pending_opens.h: session streams that have not sent
// `open` yet are bounded in number, and cancelled once their deadline passes.
// Expiry is waited for through the cancel callback, never by sleeping.
#include "admission/pending_opens.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"

namespace flagos::daemon {
namespace {

// Long enough that no ticket expires while a test runs.
constexpr absl::Duration kNever = absl::Hours(1);
// Bounds a wait for a deadline that is due (the test fails, not hangs).
constexpr absl::Duration kWaitBound = absl::Seconds(60);

PendingOpens::Ticket EnterOk(PendingOpens& pending, absl::AnyInvocable<void()> cancel = [] {}) {
  absl::StatusOr<PendingOpens::Ticket> ticket = pending.Enter(std::move(cancel));
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  return *std::move(ticket);
}

TEST(PendingOpensTest, StreamsUpToTheLimitMayWait) {
  PendingOpens pending(2, kNever);
  EXPECT_EQ(pending.waiting(), 0u);
  PendingOpens::Ticket first = EnterOk(pending);
  PendingOpens::Ticket second = EnterOk(pending);
  EXPECT_EQ(pending.waiting(), 2u);
  EXPECT_FALSE(first.expired());
  EXPECT_FALSE(second.expired());
}

TEST(PendingOpensTest, OneMoreThanTheLimitIsResourceExhaustedSayingWhy) {
  PendingOpens pending(2, absl::Seconds(10));
  PendingOpens::Ticket first = EnterOk(pending);
  PendingOpens::Ticket second = EnterOk(pending);
  bool cancelled = false;
  absl::StatusOr<PendingOpens::Ticket> third = pending.Enter([&] { cancelled = true; });
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.status().message(),
            "2 connections are waiting to open a session already (each may wait 10s for its "
            "`open`); try again");
  EXPECT_EQ(pending.waiting(), 2u);
  EXPECT_FALSE(cancelled);
}

TEST(PendingOpensTest, ADestroyedTicketGivesUpItsPlace) {
  PendingOpens pending(1, kNever);
  std::optional<PendingOpens::Ticket> first(EnterOk(pending));
  EXPECT_EQ(pending.Enter([] {}).status().code(), absl::StatusCode::kResourceExhausted);
  first.reset();
  EXPECT_EQ(pending.waiting(), 0u);
  PendingOpens::Ticket second = EnterOk(pending);
  EXPECT_EQ(pending.waiting(), 1u);
}

TEST(PendingOpensTest, AMovedTicketLeavesOnceWhenItsLastOwnerIsDestroyed) {
  PendingOpens pending(2, kNever);
  std::optional<PendingOpens::Ticket> original(EnterOk(pending));
  std::optional<PendingOpens::Ticket> moved(std::move(*original));
  original.reset();  // moved from: leaves nothing
  EXPECT_EQ(pending.waiting(), 1u);
  EXPECT_FALSE(moved->expired());
  moved.reset();
  EXPECT_EQ(pending.waiting(), 0u);
}

TEST(PendingOpensTest, APassedDeadlineCancelsTheStreamOnce) {
  PendingOpens pending(4, absl::Milliseconds(5));
  std::atomic<int> first_cancels = 0;
  absl::Notification first_cancelled;
  PendingOpens::Ticket first = EnterOk(pending, [&] {
    ++first_cancels;
    first_cancelled.Notify();
  });
  ASSERT_TRUE(first_cancelled.WaitForNotificationWithTimeout(kWaitBound));
  EXPECT_TRUE(first.expired());
  // A later ticket's expiry makes the timer pass over the first again.
  absl::Notification second_cancelled;
  PendingOpens::Ticket second = EnterOk(pending, [&] { second_cancelled.Notify(); });
  ASSERT_TRUE(second_cancelled.WaitForNotificationWithTimeout(kWaitBound));
  EXPECT_TRUE(second.expired());
  EXPECT_EQ(first_cancels.load(), 1);
}

TEST(PendingOpensTest, AnExpiredStreamNoLongerCountsAgainstTheLimit) {
  PendingOpens pending(1, absl::Milliseconds(5));
  absl::Notification cancelled;
  PendingOpens::Ticket expired = EnterOk(pending, [&] { cancelled.Notify(); });
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(kWaitBound));
  // Its handler has not returned yet (the ticket lives): a new stream may wait.
  absl::StatusOr<PendingOpens::Ticket> next = pending.Enter([] {});
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST(PendingOpensTest, ATicketDestroyedBeforeItsDeadlineIsNeverCancelled) {
  PendingOpens pending(4, absl::Milliseconds(300));
  std::atomic<bool> destroyed = false;
  std::atomic<bool> cancelled_after_destruction = false;
  std::optional<PendingOpens::Ticket> early(EnterOk(pending, [&] {
    if (destroyed) cancelled_after_destruction = true;
  }));
  early.reset();
  destroyed = true;
  // Deadlines are in Enter's order: once this later one passed, so did the first's.
  absl::Notification later_cancelled;
  PendingOpens::Ticket later = EnterOk(pending, [&] { later_cancelled.Notify(); });
  ASSERT_TRUE(later_cancelled.WaitForNotificationWithTimeout(kWaitBound));
  EXPECT_FALSE(cancelled_after_destruction);
}

TEST(PendingOpensTest, DeadlinesOfManyStreamsEachCancelTheirOwn) {
  PendingOpens pending(8, absl::Milliseconds(5));
  constexpr int kStreams = 5;
  absl::Notification cancelled[kStreams];
  std::optional<PendingOpens::Ticket> tickets[kStreams];
  for (int i = 0; i < kStreams; ++i) {
    tickets[i].emplace(EnterOk(pending, [&cancelled, i] { cancelled[i].Notify(); }));
  }
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(cancelled[i].WaitForNotificationWithTimeout(kWaitBound)) << "stream " << i;
    EXPECT_TRUE(tickets[i]->expired()) << "stream " << i;
  }
}

}  // namespace
}  // namespace flagos::daemon
