// daemon/transport/listen_endpoint.h: --listen values, and the unix socket
// file's housekeeping before and after listening (in a temporary directory).
#include "transport/listen_endpoint.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

ListenEndpoint ParseOk(absl::string_view spec) {
  absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint(spec);
  EXPECT_TRUE(endpoint.ok()) << spec << ": " << endpoint.status();
  return endpoint.ok() ? *std::move(endpoint) : ListenEndpoint();
}

void ExpectRefused(absl::string_view spec) {
  absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint(spec);
  ASSERT_FALSE(endpoint.ok()) << spec << " parsed";
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument) << spec;
  EXPECT_EQ(endpoint.status().message(),
            absl::StrCat("--listen ", spec, ": expected unix:///path/to/socket or host:port"));
}

// ---- parsing

TEST(ParseListenEndpointTest, AUnixUriWithThreeSlashesNamesAnAbsolutePath) {
  const ListenEndpoint endpoint = ParseOk("unix:///tmp/flagos/d.sock");
  EXPECT_EQ(endpoint.uri, "unix:///tmp/flagos/d.sock");
  EXPECT_EQ(endpoint.unix_path, "/tmp/flagos/d.sock");
  EXPECT_EQ(endpoint.mode, 0600u);
  EXPECT_FALSE(endpoint.loopback);
}

TEST(ParseListenEndpointTest, UnixWithOneSlashOrARelativePathIsAcceptedToo) {
  EXPECT_EQ(ParseOk("unix:/tmp/d.sock").unix_path, "/tmp/d.sock");
  EXPECT_EQ(ParseOk("unix:run/d.sock").unix_path, "run/d.sock");
  EXPECT_EQ(ParseOk("unix:d.sock").unix_path, "d.sock");
}

TEST(ParseListenEndpointTest, TheSystemSocketIsSharedWithItsGroup) {
  const ListenEndpoint endpoint = ParseOk(kDefaultListen);
  EXPECT_EQ(endpoint.unix_path, "/run/flagosd/flagosd.sock");
  EXPECT_EQ(endpoint.mode, 0660u);
  EXPECT_TRUE(endpoint.system_socket);
  EXPECT_EQ(endpoint.group, "");  // named by ResolveSocketGroup, at start
}

TEST(ParseListenEndpointTest, TheSystemSocketSpelledWithOneSlashIsStillTheSystemSocket) {
  EXPECT_EQ(ParseOk("unix:/run/flagosd/flagosd.sock").mode, 0660u);
  EXPECT_TRUE(ParseOk("unix:/run/flagosd/flagosd.sock").system_socket);
}

TEST(ParseListenEndpointTest, EveryOtherSocketIsTheOwnersOnly) {
  EXPECT_EQ(ParseOk("unix:///run/flagosd/other.sock").mode, 0600u);
  EXPECT_EQ(ParseOk("unix:///run/flagosd/flagosd.sock.old").mode, 0600u);
  EXPECT_FALSE(ParseOk("unix:///run/flagosd/other.sock").system_socket);
}

// ---- the socket's group (--socket-group)

// A group name no system has: the lookup fails the way a missing `flagos`
// group does on a node where nobody created it.
constexpr char kMissingGroup[] = "flagos-test-no-such-group";

TEST(ResolveSocketGroupTest, AMissingGroupFailsNamingTheGroupTheSocketAndTheFix) {
  ASSERT_EQ(getgrnam(kMissingGroup), nullptr) << kMissingGroup << " exists on this machine";
  ListenEndpoint endpoint = ParseOk(kDefaultListen);
  const absl::Status status = ResolveSocketGroup(endpoint, kMissingGroup);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            absl::StrCat("the socket unix:///run/flagosd/flagosd.sock is to belong to group `",
                         kMissingGroup, "` (--socket-group), but no such group exists: create "
                         "it with `addgroup --system ", kMissingGroup, "` (or `groupadd --system ",
                         kMissingGroup, "`) and add the users who may connect to it, or name "
                         "another group with --socket-group=NAME"));
  EXPECT_EQ(endpoint.group, "");
}

TEST(ResolveSocketGroupTest, AnExistingGroupIsNamedWithItsGid) {
  const group* own = getgrgid(getegid());
  ASSERT_NE(own, nullptr) << "the test's own group " << getegid() << " has no name";
  const std::string name = own->gr_name;
  ListenEndpoint endpoint = ParseOk("unix:///tmp/d.sock");
  const absl::Status status = ResolveSocketGroup(endpoint, name);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(endpoint.group, name);
  EXPECT_EQ(endpoint.gid, getegid());
}

TEST(ResolveSocketGroupTest, NoGroupNamesNone) {
  ListenEndpoint endpoint = ParseOk(kDefaultListen);
  ASSERT_TRUE(ResolveSocketGroup(endpoint, "").ok());
  EXPECT_EQ(endpoint.group, "");
}

TEST(ResolveSocketGroupTest, TcpEndpointsHaveNoSocketFileAndSoNoGroup) {
  ListenEndpoint endpoint = ParseOk("127.0.0.1:1");
  ASSERT_TRUE(ResolveSocketGroup(endpoint, kMissingGroup).ok());
  EXPECT_EQ(endpoint.group, "");
}

TEST(ParseListenEndpointTest, AnEmptyUnixPathIsRefused) {
  for (absl::string_view spec : {"unix:", "unix://"}) {
    absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint(spec);
    ASSERT_FALSE(endpoint.ok()) << spec;
    EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(endpoint.status().message(),
              absl::StrCat("--listen ", spec, ": the unix socket path is empty"));
  }
}

TEST(ParseListenEndpointTest, APathLongerThanTheSystemLimitIsRefusedWithBothLengths) {
  const size_t limit = sizeof(sockaddr_un{}.sun_path) - 1;  // 107 on Linux
  const std::string longest = "/" + std::string(limit - 1, 'a');
  EXPECT_EQ(ParseOk("unix://" + longest).unix_path, longest);
  const std::string too_long = longest + "a";
  absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint("unix://" + too_long);
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      endpoint.status().message(),
      absl::StrCat(": the unix socket path is ", limit + 1, " bytes long; the system limit is ",
                   limit, "; choose a shorter path")))
      << endpoint.status();
}

TEST(ParseListenEndpointTest, TcpHostPortHasNoSocketFile) {
  const ListenEndpoint endpoint = ParseOk("10.1.2.3:50051");
  EXPECT_EQ(endpoint.uri, "10.1.2.3:50051");
  EXPECT_TRUE(endpoint.unix_path.empty());
  EXPECT_FALSE(endpoint.loopback);
}

TEST(ParseListenEndpointTest, LocalhostAndLoopbackAddressesAreLoopback) {
  for (absl::string_view spec :
       {"localhost:50051", "127.0.0.1:1", "127.255.0.9:65535", "[::1]:0"}) {
    EXPECT_TRUE(ParseOk(spec).loopback) << spec;
  }
}

TEST(ParseListenEndpointTest, OtherHostsAndTheWildcardAreNotLoopback) {
  for (absl::string_view spec :
       {"0.0.0.0:50051", "[::]:50051", ":50051", "example.com:443", "128.0.0.1:1"}) {
    EXPECT_FALSE(ParseOk(spec).loopback) << spec;
  }
}

TEST(ParseListenEndpointTest, AHostNameThatMerelyStartsWith127IsNotLoopback) {
  // DNS decides where such a name points: plaintext must not rely on it.
  EXPECT_FALSE(ParseOk("127.example.com:80").loopback);
  EXPECT_FALSE(ParseOk("127.0.0.1.example.com:80").loopback);
}

TEST(ParseListenEndpointTest, TcpWithoutAValidPortIsRefused) {
  ExpectRefused("localhost");
  ExpectRefused("localhost:");
  ExpectRefused("localhost:http");
  ExpectRefused("localhost:-1");
  ExpectRefused("localhost:65536");
  ExpectRefused("");
}

TEST(ParseListenEndpointTest, ABarePathIsRefusedWithTheSpellingThatWorks) {
  absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint("/tmp/flagos/d.sock");
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(endpoint.status().message(),
            "--listen /tmp/flagos/d.sock: a unix socket is written with its scheme: "
            "--listen=unix:///tmp/flagos/d.sock");
  EXPECT_TRUE(ParseOk("unix:///tmp/flagos/d.sock").unix_path == "/tmp/flagos/d.sock");
}

// ---- the socket file

class UnixSocketFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/flagos-listen.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr) << std::strerror(errno);
    dir_ = dir;
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  ListenEndpoint Endpoint(const std::string& relative) {
    return ParseOk(absl::StrCat("unix://", dir_, "/", relative));
  }

  // A socket bound to `path`, listening or not; closed at the end of the test.
  void Bind(const std::string& path, bool listen_on_it) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    fds_.push_back(fd);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
        << path << ": " << std::strerror(errno);
    if (listen_on_it) ASSERT_EQ(listen(fd, 4), 0);
  }

  // A socket file nobody listens on (its process is gone).
  void StaleSocket(const std::string& path) {
    Bind(path, /*listen_on_it=*/false);
    close(fds_.back());
    fds_.pop_back();
  }

  static mode_t Mode(const std::string& path) {
    struct stat info;
    EXPECT_EQ(lstat(path.c_str(), &info), 0) << path;
    return info.st_mode & 07777;
  }

  static bool Exists(const std::string& path) {
    struct stat info;
    return lstat(path.c_str(), &info) == 0;
  }

  std::string dir_;
  std::vector<int> fds_;
};

TEST_F(UnixSocketFileTest, PrepareCreatesTheMissingParentDirectoriesWithMode0755) {
  const ListenEndpoint endpoint = Endpoint("run/flagosd/d.sock");
  ASSERT_TRUE(PrepareUnixSocket(endpoint).ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/run/flagosd"));
  EXPECT_EQ(Mode(dir_ + "/run/flagosd"), 0755u);
  EXPECT_FALSE(Exists(endpoint.unix_path));  // the socket is the listener's to make
}

TEST_F(UnixSocketFileTest, PrepareLeavesAnExistingParentDirectoryAlone) {
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  ASSERT_TRUE(PrepareUnixSocket(Endpoint("d.sock")).ok());
  EXPECT_EQ(Mode(dir_), 0700u);
}

TEST_F(UnixSocketFileTest, PrepareRemovesAStaleSocket) {
  const ListenEndpoint endpoint = Endpoint("d.sock");
  StaleSocket(endpoint.unix_path);
  ASSERT_TRUE(Exists(endpoint.unix_path));
  const absl::Status status = PrepareUnixSocket(endpoint);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_FALSE(Exists(endpoint.unix_path));
}

TEST_F(UnixSocketFileTest, PrepareRefusesASocketAnotherProcessListensOn) {
  const ListenEndpoint endpoint = Endpoint("d.sock");
  Bind(endpoint.unix_path, /*listen_on_it=*/true);
  const absl::Status status = PrepareUnixSocket(endpoint);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            absl::StrCat("another process (a running flagosd?) already listens on ", endpoint.uri,
                         "; stop it or choose another --listen"));
  EXPECT_TRUE(Exists(endpoint.unix_path));
}

TEST_F(UnixSocketFileTest, PrepareRefusesAPathThatIsNotASocketAndKeepsTheFile) {
  const ListenEndpoint endpoint = Endpoint("d.sock");
  const int fd = open(endpoint.unix_path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  close(fd);
  const absl::Status status = PrepareUnixSocket(endpoint);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            absl::StrCat(endpoint.unix_path,
                         " exists and is not a socket; remove it or choose another --listen"));
  EXPECT_TRUE(std::filesystem::is_regular_file(endpoint.unix_path));
}

TEST_F(UnixSocketFileTest, PrepareRefusesAParentThatCannotBeCreated) {
  // A regular file where a directory of the path should be.
  const int fd = open((dir_ + "/file").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  close(fd);
  const ListenEndpoint endpoint = Endpoint("file/sub/d.sock");
  const absl::Status status = PrepareUnixSocket(endpoint);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(status.message(), absl::StrCat("cannot create ", dir_,
                                                              "/file/sub for the socket ",
                                                              endpoint.uri, ": ")))
      << status;
  EXPECT_TRUE(absl::EndsWith(status.message(), "; create it or choose another --listen"))
      << status;
}

TEST_F(UnixSocketFileTest, TcpEndpointsHaveNoSocketFileToPrepareOrSecure) {
  const ListenEndpoint tcp = ParseOk("127.0.0.1:1");
  EXPECT_TRUE(PrepareUnixSocket(tcp).ok());
  EXPECT_TRUE(SecureUnixSocket(tcp).ok());
}

TEST_F(UnixSocketFileTest, SecureMakesAnOrdinarySocketTheOwnersOnly) {
  const ListenEndpoint endpoint = Endpoint("d.sock");
  Bind(endpoint.unix_path, /*listen_on_it=*/true);
  ASSERT_EQ(chmod(endpoint.unix_path.c_str(), 0777), 0);
  const absl::Status status = SecureUnixSocket(endpoint);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(Mode(endpoint.unix_path), 0600u);
}

// A group other than the test's own that it may give a file to: any group
// for root, one of its supplementary groups otherwise; empty when none.
std::string AnotherGroupOfOurs() {
  std::vector<gid_t> candidates;
  if (geteuid() == 0) {
    setgrent();
    while (const group* g = getgrent()) candidates.push_back(g->gr_gid);
    endgrent();
  } else {
    std::vector<gid_t> groups(getgroups(0, nullptr));
    groups.resize(getgroups(static_cast<int>(groups.size()), groups.data()));
    candidates = groups;
  }
  for (gid_t gid : candidates) {
    if (gid == getegid()) continue;
    if (const group* g = getgrgid(gid); g != nullptr) return g->gr_name;
  }
  return "";
}

TEST_F(UnixSocketFileTest, SecureSharesTheSocketWithItsGroup) {
  const std::string name = AnotherGroupOfOurs();
  if (name.empty()) {
    GTEST_SKIP() << "the test's user may give a file to no group but its own (not root, no "
                    "supplementary groups): run it as root to see the group change";
  }
  ListenEndpoint endpoint = Endpoint("d.sock");
  endpoint.mode = 0660;
  ASSERT_TRUE(ResolveSocketGroup(endpoint, name).ok());
  Bind(endpoint.unix_path, /*listen_on_it=*/true);
  const absl::Status status = SecureUnixSocket(endpoint);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(Mode(endpoint.unix_path), 0660u);
  struct stat after;
  ASSERT_EQ(lstat(endpoint.unix_path.c_str(), &after), 0);
  EXPECT_EQ(after.st_gid, getgrnam(name.c_str())->gr_gid);
  EXPECT_NE(after.st_gid, getegid());
}

TEST_F(UnixSocketFileTest, SecureWithoutAGroupLeavesTheSocketsGroupAlone) {
  ListenEndpoint endpoint = Endpoint("d.sock");
  endpoint.mode = 0660;
  Bind(endpoint.unix_path, /*listen_on_it=*/true);
  struct stat before;
  ASSERT_EQ(lstat(endpoint.unix_path.c_str(), &before), 0);
  ASSERT_TRUE(SecureUnixSocket(endpoint).ok());
  struct stat after;
  ASSERT_EQ(lstat(endpoint.unix_path.c_str(), &after), 0);
  EXPECT_EQ(after.st_gid, before.st_gid);
  EXPECT_EQ(Mode(endpoint.unix_path), 0660u);
}

TEST_F(UnixSocketFileTest, SecureFailsOnAMissingSocketNamingIt) {
  const ListenEndpoint endpoint = Endpoint("never-bound.sock");
  const absl::Status status = SecureUnixSocket(endpoint);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(status.message(),
                               absl::StrCat("cannot set the mode of ", endpoint.unix_path, ": ")))
      << status;
}

}  // namespace
}  // namespace flagos::daemon
