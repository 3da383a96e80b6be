#include "memory/memory_quotas.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace flagos::daemon {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(MemoryQuotasTest, ASessionMayHoldUpToItsLimitPerDevice) {
  MemoryQuotas quotas(MemoryLimits{64 * kMiB, 0});
  EXPECT_TRUE(quotas.Reserve(1, 1000, 0, 48 * kMiB).ok());
  EXPECT_TRUE(quotas.Reserve(1, 1000, 0, 16 * kMiB).ok());  // exactly the limit
  const absl::Status over = quotas.Reserve(1, 1000, 0, 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "allocating 1 bytes on flagos:0 would take session 1 (uid 1000) beyond its "
            "limit: it holds 64MiB (67108864 bytes) there, and --session-memory-limit is 64MiB "
            "(67108864 bytes) per session and device; free tensors (and "
            "torch.flagos.empty_cache()) or ask the node's administrator for a larger limit");
  // Another device, and another session, have limits of their own.
  EXPECT_TRUE(quotas.Reserve(1, 1000, 1, 64 * kMiB).ok());
  EXPECT_TRUE(quotas.Reserve(2, 1000, 0, 64 * kMiB).ok());
  quotas.Release(1, 1000, 0, 48 * kMiB);
  EXPECT_EQ(quotas.session_bytes(1, 0), 16 * kMiB);
  EXPECT_TRUE(quotas.Reserve(1, 1000, 0, 48 * kMiB).ok());
}

TEST(MemoryQuotasTest, AUsersSessionsShareItsLimitAndTheErrorNamesThem) {
  MemoryQuotas quotas(MemoryLimits{0, 100 * kMiB});
  EXPECT_TRUE(quotas.Reserve(3, 1000, 0, 60 * kMiB).ok());
  EXPECT_TRUE(quotas.Reserve(5, 1000, 0, 30 * kMiB).ok());
  EXPECT_TRUE(quotas.Reserve(7, 1001, 0, 100 * kMiB).ok());  // another user
  const absl::Status over = quotas.Reserve(9, 1000, 0, 20 * kMiB);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(
      over.message(),
      "allocating 20MiB (20971520 bytes) on flagos:0 for session 9 would take uid 1000 beyond "
      "its limit: its sessions hold 90MiB (94371840 bytes) there (session 3: 60MiB, session 5: "
      "30MiB), and --uid-memory-limit is 100MiB (104857600 bytes) per user and device"))
      << over;
  EXPECT_EQ(quotas.uid_bytes(1000, 0), 90 * kMiB);
  // Session 3 ends: its memory is the user's again.
  quotas.Release(3, 1000, 0, 60 * kMiB);
  EXPECT_TRUE(quotas.Reserve(9, 1000, 0, 20 * kMiB).ok());
  EXPECT_EQ(quotas.uid_bytes(1000, 0), 50 * kMiB);
  EXPECT_EQ(quotas.uid_bytes(1001, 0), 100 * kMiB);
}

TEST(MemoryQuotasTest, SessionsWithoutAUserCountTogether) {
  MemoryQuotas quotas(MemoryLimits{0, 10 * kMiB});
  EXPECT_TRUE(quotas.Reserve(1, -1, 0, 8 * kMiB).ok());
  const absl::Status over = quotas.Reserve(2, -1, 0, 4 * kMiB);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.message(), "the sessions without a user (TCP)")) << over;
}

TEST(MemoryQuotasTest, WithoutLimitsEverythingIsCountedNothingRefused) {
  MemoryQuotas quotas(MemoryLimits{});
  EXPECT_TRUE(quotas.Reserve(1, 0, 0, uint64_t{1} << 50).ok());
  EXPECT_EQ(quotas.uid_bytes(0, 0), uint64_t{1} << 50);
  quotas.Release(1, 0, 0, uint64_t{1} << 50);
  EXPECT_EQ(quotas.uid_bytes(0, 0), 0u);
}

}  // namespace
}  // namespace flagos::daemon
