#include "memory/memory_grants.h"

#include <gtest/gtest.h>

#include <string>

namespace flagos::daemon {
namespace {

constexpr uint64_t kOwner = 1;
constexpr uint64_t kReceiver = 2;
constexpr int64_t kUid = 1000;
const Segment kSegment{0, 0x10000, 4096};

TEST(MemoryGrantsTest, OneGrantPerSegmentAndEachExportCountsOnePendingImport) {
  MemoryGrants grants(MemoryGrants::Policy::kSameUser);
  absl::StatusOr<std::string> first = grants.Export(kOwner, kUid, kSegment, true);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 16u);
  absl::StatusOr<std::string> second = grants.Export(kOwner, kUid, kSegment, true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_TRUE(grants.InUse(0, kSegment.addr));  // two exports unclaimed
  ASSERT_TRUE(grants.Import(kReceiver, kUid, *first, 0).ok());
  ASSERT_TRUE(grants.Release(kReceiver, 0, kSegment.addr).ok());
  EXPECT_TRUE(grants.InUse(0, kSegment.addr));  // one export still unclaimed
  ASSERT_TRUE(grants.Import(kReceiver, kUid, *first, 0).ok());
  absl::StatusOr<bool> unheld = grants.Release(kReceiver, 0, kSegment.addr);
  ASSERT_TRUE(unheld.ok());
  EXPECT_FALSE(*unheld);  // the owner still holds it
  EXPECT_FALSE(grants.InUse(0, kSegment.addr));
  EXPECT_TRUE(grants.DropOwner(0, kSegment.addr));
  EXPECT_EQ(grants.shared_segments(), 0u);
}

TEST(MemoryGrantsTest, TheLastHolderFreesAndTheGrantDiesWithTheMemory) {
  MemoryGrants grants(MemoryGrants::Policy::kSameUser);
  const std::string grant = *grants.Export(kOwner, kUid, kSegment, true);
  ASSERT_TRUE(grants.Import(kReceiver, kUid, grant, 0).ok());
  ASSERT_TRUE(grants.Import(kReceiver, kUid, grant, 0).ok());
  EXPECT_FALSE(grants.DropOwner(0, kSegment.addr));  // the receiver holds it
  EXPECT_EQ(grants.orphaned_bytes(0), 4096u);
  EXPECT_EQ(grants.orphaned_bytes(1), 0u);
  // Still valid while the memory lives.
  ASSERT_TRUE(grants.Import(3, kUid, grant, 0).ok());
  EXPECT_EQ(*grants.Release(kReceiver, 0, kSegment.addr), false);
  EXPECT_TRUE(grants.DropSession(3).empty());  // kReceiver holds one more
  EXPECT_EQ(*grants.Release(kReceiver, 0, kSegment.addr), true);
  EXPECT_EQ(grants.orphaned_bytes(0), 0u);
  absl::StatusOr<Segment> late = grants.Import(kReceiver, kUid, grant, 0);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(late.status().message().find("keep a shared tensor alive in the sender"),
            std::string::npos)
      << late.status();
  absl::StatusOr<bool> twice = grants.Release(kReceiver, 0, kSegment.addr);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kNotFound);
}

TEST(MemoryGrantsTest, AnEndedSessionDropsAllItsHolds) {
  MemoryGrants grants(MemoryGrants::Policy::kSameUser);
  const Segment other{1, 0x20000, 512};
  const std::string a = *grants.Export(kOwner, kUid, kSegment, true);
  const std::string b = *grants.Export(kOwner, kUid, other, true);
  ASSERT_TRUE(grants.Import(kReceiver, kUid, a, 0).ok());
  ASSERT_TRUE(grants.Import(kReceiver, kUid, a, 0).ok());
  ASSERT_TRUE(grants.Import(kReceiver, kUid, b, 1).ok());
  EXPECT_FALSE(grants.DropOwner(1, other.addr));
  // The owner still holds kSegment; nobody holds `other` once kReceiver goes.
  std::vector<Segment> unheld = grants.DropSession(kReceiver);
  ASSERT_EQ(unheld.size(), 1u);
  EXPECT_EQ(unheld[0].addr, other.addr);
  EXPECT_EQ(unheld[0].device, 1);
  EXPECT_FALSE(grants.InUse(0, kSegment.addr));
}

TEST(MemoryGrantsTest, SameUserPolicyNamesBothUsersAndTheFlag) {
  MemoryGrants grants(MemoryGrants::Policy::kSameUser);
  const std::string grant = *grants.Export(kOwner, kUid, kSegment, true);
  absl::StatusOr<Segment> other_user = grants.Import(kReceiver, 1001, grant, 0);
  EXPECT_EQ(other_user.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other_user.status().message(),
            "session 2 (uid 1001) may not use device memory of session 1 (uid 1000): flagosd "
            "shares memory only between processes of one user; the operator may allow more "
            "with --memory-sharing=any-user");
  absl::StatusOr<Segment> unknown = grants.Import(kReceiver, -1, grant, 0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<Segment> wrong_device = grants.Import(kReceiver, kUid, grant, 1);
  EXPECT_EQ(wrong_device.status().code(), absl::StatusCode::kInvalidArgument);
  // A session whose user flagosd does not know cannot export either.
  absl::StatusOr<std::string> no_uid = grants.Export(kOwner, -1, kSegment, true);
  EXPECT_EQ(no_uid.status().code(), absl::StatusCode::kPermissionDenied);
  // None of the refused imports holds anything.
  EXPECT_TRUE(grants.DropOwner(0, kSegment.addr));
}

TEST(MemoryGrantsTest, AnyUserAndOffPolicies) {
  MemoryGrants any(MemoryGrants::Policy::kAnyUser);
  const std::string grant = *any.Export(kOwner, -1, kSegment, true);
  EXPECT_TRUE(any.Import(kReceiver, 1001, grant, 0).ok());
  MemoryGrants off(MemoryGrants::Policy::kOff);
  absl::StatusOr<std::string> refused = off.Export(kOwner, kUid, kSegment, true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("--memory-sharing=off"), std::string::npos);
  EXPECT_EQ(MemoryGrants::ParsePolicy("bogus").status().message(),
            "--memory-sharing=bogus is not a sharing policy: use same-user, any-user or off");
  EXPECT_EQ(*MemoryGrants::ParsePolicy("any-user"), MemoryGrants::Policy::kAnyUser);
}

TEST(MemoryGrantsTest, AnUnknownGrantIsNotFoundWithoutEchoingIt) {
  MemoryGrants grants(MemoryGrants::Policy::kAnyUser);
  absl::StatusOr<Segment> unknown =
      grants.Import(kReceiver, kUid, std::string("\x01\x02\x03\x04secretsecret", 16), 0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("01020304..."), std::string::npos);
  EXPECT_EQ(unknown.status().message().find("secret"), std::string::npos);
}

}  // namespace
}  // namespace flagos::daemon
