// SessionRegistry: admission under --max-sessions, and retired (closing)
// sessions, which hold no slot while their close runs on a thread of its own.
#include "sessions/session_registry.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"

namespace flagos::daemon {
namespace {

TEST(SessionRegistryTest, ARetiredSessionFreesItsSlotWhileItsCloseStillRuns) {
  SessionRegistry registry(1);
  absl::StatusOr<uint64_t> first = registry.Admit([] {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(absl::IsResourceExhausted(registry.Admit([] {}).status()));
  absl::Notification closing, release;
  // Retire returns while `close` waits: it runs on a thread of its own.
  registry.Retire(*first, [&] {
    closing.Notify();
    release.WaitForNotification();
  });
  closing.WaitForNotification();
  absl::StatusOr<uint64_t> second = registry.Admit([] {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(release.HasBeenNotified());
  EXPECT_TRUE(absl::IsResourceExhausted(registry.Admit([] {}).status()));
  release.Notify();
  registry.WaitClosed();
  registry.Remove(*second);
  EXPECT_TRUE(registry.Admit([] {}).ok());
}

TEST(SessionRegistryTest, OneUsersSessionsAreBoundedOthersAndUnknownUsersAreNot) {
  SessionRegistry registry(8, 2);
  absl::StatusOr<uint64_t> first = registry.Admit([] {}, 1000);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(registry.Admit([] {}, 1000).ok());
  const absl::Status third = registry.Admit([] {}, 1000).status();
  EXPECT_TRUE(absl::IsResourceExhausted(third)) << third;
  EXPECT_EQ(third.message(),
            "uid 1000 has 2 sessions open, the most --max-sessions-per-uid=2 allows one user; "
            "end another of its processes, or ask the node's administrator for a larger limit");
  EXPECT_TRUE(registry.Admit([] {}, 1001).ok());
  EXPECT_TRUE(registry.Admit([] {}, -1).ok());
  EXPECT_TRUE(registry.Admit([] {}, -1).ok());
  EXPECT_TRUE(registry.Admit([] {}, -1).ok());
  registry.Remove(*first);
  EXPECT_TRUE(registry.Admit([] {}, 1000).ok());
}

TEST(SessionRegistryTest, AtMostMaxClosingSessionsCloseAtOnce) {
  SessionRegistry registry(1);
  ASSERT_EQ(registry.max_closing(), kMinMaxClosingSessions);
  absl::Notification release;
  for (size_t i = 0; i < kMinMaxClosingSessions; ++i) {
    absl::StatusOr<uint64_t> id = registry.Admit([] {});
    ASSERT_TRUE(id.ok()) << "session " << i << ": " << id.status();
    registry.Retire(*id, [&release] { release.WaitForNotification(); });
  }
  absl::StatusOr<uint64_t> refused = registry.Admit([] {});
  EXPECT_EQ(refused.status(),
            absl::ResourceExhaustedError(
                "flagosd is still closing 16 sessions whose clients left while their commands "
                "ran (at most max(--max-sessions, 16) close at once); retry when their commands "
                "have returned, or start flagosd with a larger --max-sessions"));
  release.Notify();
  registry.WaitClosed();
  EXPECT_TRUE(registry.Admit([] {}).ok());
  EXPECT_EQ(SessionRegistry(300).max_closing(), 300u);
}

TEST(SessionRegistryTest, CancelAllDoesNotCancelARetiredSession) {
  SessionRegistry registry(2);
  int cancels = 0;
  absl::StatusOr<uint64_t> retired = registry.Admit([&cancels] { ++cancels; });
  absl::StatusOr<uint64_t> live = registry.Admit([&cancels] { cancels += 10; });
  ASSERT_TRUE(retired.ok() && live.ok());
  registry.Retire(*retired, [] {});
  registry.CancelAll();
  EXPECT_EQ(cancels, 10);
  registry.WaitClosed();
  EXPECT_EQ(registry.Admit([] {}).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace flagos::daemon
