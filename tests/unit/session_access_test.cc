#include "admission/session_access.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "absl/strings/match.h"
#include "admission/peer_credentials.h"

namespace flagos::daemon {
namespace {

// A uid and gid that are neither root nor this process's.
constexpr int64_t kStranger = 4242420;

PeerCredentials Peer(int64_t uid, int64_t gid, std::vector<gid_t> groups = {}) {
  PeerCredentials peer;
  peer.pid = 77;
  peer.uid = uid;
  peer.gid = gid;
  peer.groups = std::move(groups);
  return peer;
}

TEST(SessionAccessTest, WithoutRulesEveryPeerAndTcpMayOpen) {
  const SessionAccess open_to_all;
  EXPECT_FALSE(open_to_all.restricted());
  EXPECT_TRUE(open_to_all.Check(Peer(kStranger, kStranger)).ok());
  EXPECT_TRUE(open_to_all.Check(std::nullopt).ok());
}

TEST(SessionAccessTest, ListedUidsAndGroupsMayOpenOthersAreRefusedByName) {
  SessionAccess access;
  access.uids = {1000};
  access.gids = {27};
  EXPECT_TRUE(access.Check(Peer(1000, kStranger)).ok());
  EXPECT_TRUE(access.Check(Peer(kStranger, 27)).ok());                   // primary group
  EXPECT_TRUE(access.Check(Peer(kStranger, kStranger, {5, 27})).ok());  // supplementary
  const absl::Status refused = access.Check(Peer(kStranger, kStranger, {5}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(),
            "uid 4242420 (gid 4242420, pid 77) may not open a session: this flagosd admits "
            "only --allow-uid=1000 --allow-gid=27; ask the node's administrator to add the "
            "user or one of its groups");
}

TEST(SessionAccessTest, RootAndTheDaemonsOwnUserAlwaysMayTcpNeverWhenRestricted) {
  SessionAccess access;
  access.uids = {kStranger + 1};
  EXPECT_TRUE(access.Check(Peer(0, kStranger)).ok());
  EXPECT_TRUE(access.Check(Peer(geteuid(), kStranger)).ok());
  const absl::Status tcp = access.Check(std::nullopt);
  EXPECT_EQ(tcp.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(tcp.message(), "a TCP connection carries no user")) << tcp;
  EXPECT_TRUE(absl::StrContains(tcp.message(), "--allow-uid=4242421")) << tcp;
}

TEST(SessionAccessTest, NamesAndNumbersParseUnknownNamesAreRefused) {
  absl::StatusOr<std::vector<int64_t>> users = ParseAllowedUsers({"root", "1234"});
  ASSERT_TRUE(users.ok()) << users.status();
  EXPECT_EQ(*users, (std::vector<int64_t>{0, 1234}));
  absl::StatusOr<std::vector<int64_t>> groups = ParseAllowedGroups({"root", "27"});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(*groups, (std::vector<int64_t>{0, 27}));
  const absl::Status unknown = ParseAllowedUsers({"no-such-user-here"}).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(unknown.message(), "--allow-uid: no passwd named "
                                                   "'no-such-user-here'"))
      << unknown;
  EXPECT_FALSE(ParseAllowedGroups({"-5"}).ok());
}

TEST(PeerCredentialsTest, ASocketPairsPeerIsThisProcess) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fds[0]);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, getpid());
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(ReadPeerCredentials(fds[0]).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PeerCredentialsTest, OnlyTheDaemonsOwnAcceptsNameADescriptor) {
  EXPECT_EQ(AcceptedDescriptor("fd:17"), 17);
  EXPECT_EQ(AcceptedDescriptor("ipv4:127.0.0.1:5000"), std::nullopt);
  EXPECT_EQ(AcceptedDescriptor("unix:/run/flagosd/flagosd.sock"), std::nullopt);
  EXPECT_EQ(AcceptedDescriptor("fd:x"), std::nullopt);
  EXPECT_EQ(AcceptedDescriptor("fd:-3"), std::nullopt);
}

}  // namespace
}  // namespace flagos::daemon
