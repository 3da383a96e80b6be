// daemon/admission/remote_access.h: which endpoint configurations are
// refused and why, the bearer token check, reading --token-file, and the
// files TcpServerCredentials reads. No server runs here (the token check on
// live calls is tests/python/test_remote_access.py's).
#include "admission/remote_access.h"

#include <gtest/gtest.h>
#include <grpcpp/security/server_credentials.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

ListenEndpoint Endpoint(absl::string_view spec) {
  absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint(spec);
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return endpoint.ok() ? *std::move(endpoint) : ListenEndpoint();
}

RemoteAccessOptions Tls(bool cert = true, bool key = true, bool token = true) {
  RemoteAccessOptions options;
  if (cert) options.tls_cert_file = "/etc/flagos/server.pem";
  if (key) options.tls_key_file = "/etc/flagos/server.key";
  if (token) options.token_file = "/etc/flagos/token";
  return options;
}

// ---- CheckTcpEndpoint

TEST(CheckTcpEndpointTest, UnixSocketsNeedNeitherTlsNorToken) {
  EXPECT_TRUE(CheckTcpEndpoint(Endpoint("unix:///tmp/d.sock"), RemoteAccessOptions{}).ok());
  EXPECT_TRUE(CheckTcpEndpoint(Endpoint(kDefaultListen), RemoteAccessOptions{}).ok());
}

TEST(CheckTcpEndpointTest, PlaintextOnLoopbackIsRefusedUnlessAskedFor) {
  const absl::Status status = CheckTcpEndpoint(Endpoint("127.0.0.1:5000"), RemoteAccessOptions{});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "--listen=127.0.0.1:5000: plaintext TCP is refused unless asked for with "
            "--insecure-tcp (loopback only: anyone on this node may connect, with no user "
            "known); or give --tls-cert, --tls-key and --token-file");
}

TEST(CheckTcpEndpointTest, InsecureTcpAllowsPlaintextOnEveryLoopbackSpelling) {
  RemoteAccessOptions options;
  options.insecure_tcp = true;
  for (absl::string_view spec : {"127.0.0.1:5000", "localhost:5000", "[::1]:5000"}) {
    const absl::Status status = CheckTcpEndpoint(Endpoint(spec), options);
    EXPECT_TRUE(status.ok()) << spec << ": " << status;
  }
}

TEST(CheckTcpEndpointTest, PlaintextOffLoopbackIsRefusedEvenWithInsecureTcp) {
  RemoteAccessOptions options;
  options.insecure_tcp = true;
  options.token_file = "/etc/flagos/token";  // a token alone does not make it safe
  const absl::Status status = CheckTcpEndpoint(Endpoint("0.0.0.0:5000"), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "--listen=0.0.0.0:5000: TCP on a non-loopback address needs TLS and a token: give "
            "--tls-cert, --tls-key and --token-file (docs/operations.md, \"A client on another "
            "node\"), or listen on a unix socket");
}

TEST(CheckTcpEndpointTest, TlsNeedsBothTheCertificateAndTheKey) {
  for (const RemoteAccessOptions& options : {Tls(true, false), Tls(false, true)}) {
    const absl::Status status = CheckTcpEndpoint(Endpoint("10.0.0.1:5000"), options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), "--listen=10.0.0.1:5000: TLS needs both --tls-cert and --tls-key");
  }
}

TEST(CheckTcpEndpointTest, TlsWithoutATokenIsRefusedSayingHowToMakeOne) {
  const absl::Status status =
      CheckTcpEndpoint(Endpoint("10.0.0.1:5000"), Tls(true, true, /*token=*/false));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "--listen=10.0.0.1:5000: a TCP endpoint needs a bearer token as well as TLS: give "
            "--token-file (a file holding a random token of at least 16 characters, e.g. "
            "`openssl rand -hex 32`)");
}

TEST(CheckTcpEndpointTest, TlsWithATokenMayListenOnAnyAddress) {
  for (absl::string_view spec : {"0.0.0.0:5000", "10.0.0.1:5000", "127.0.0.1:5000"}) {
    const absl::Status status = CheckTcpEndpoint(Endpoint(spec), Tls());
    EXPECT_TRUE(status.ok()) << spec << ": " << status;
  }
}

TEST(CheckTcpEndpointTest, TlsWithoutATokenIsRefusedOnLoopbackToo) {
  RemoteAccessOptions options = Tls(true, true, /*token=*/false);
  options.insecure_tcp = true;
  EXPECT_EQ(CheckTcpEndpoint(Endpoint("127.0.0.1:5000"), options).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- BearerTokenMatches

TEST(BearerTokenMatchesTest, TheExactBearerHeaderMatches) {
  EXPECT_TRUE(BearerTokenMatches(absl::StrCat("Bearer ", kToken), kToken));
}

TEST(BearerTokenMatchesTest, ATokenDifferingInAnyOneByteDoesNotMatch) {
  const std::string token = kToken;
  for (size_t i = 0; i < token.size(); ++i) {
    std::string wrong = token;
    wrong[i] ^= 0x01;
    EXPECT_FALSE(BearerTokenMatches(absl::StrCat("Bearer ", wrong), token)) << "byte " << i;
  }
}

TEST(BearerTokenMatchesTest, APrefixOrAnExtensionOfTheTokenDoesNotMatch) {
  const std::string token = kToken;
  EXPECT_FALSE(BearerTokenMatches(absl::StrCat("Bearer ", token.substr(0, token.size() - 1)),
                                  token));
  EXPECT_FALSE(BearerTokenMatches(absl::StrCat("Bearer ", token, "0"), token));
  EXPECT_FALSE(BearerTokenMatches("Bearer ", token));
}

TEST(BearerTokenMatchesTest, TheHeaderMustSayBearerExactly) {
  EXPECT_FALSE(BearerTokenMatches(kToken, kToken));
  EXPECT_FALSE(BearerTokenMatches(absl::StrCat("bearer ", kToken), kToken));
  EXPECT_FALSE(BearerTokenMatches(absl::StrCat("Basic ", kToken), kToken));
  EXPECT_FALSE(BearerTokenMatches(absl::StrCat("Bearer  ", kToken), kToken));
  EXPECT_FALSE(BearerTokenMatches(absl::StrCat(" Bearer ", kToken), kToken));
  EXPECT_FALSE(BearerTokenMatches("", kToken));
}

// ---- files

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/flagos-remote.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr) << std::strerror(errno);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << contents;
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  std::string dir_;
};

TEST_F(TokenFileTest, TheTokenIsTheFileWithoutSurroundingWhitespace) {
  const std::string path = Write("token", absl::StrCat(" \t", kToken, "\r\n\n"));
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kToken);
}

TEST_F(TokenFileTest, AMissingFileIsNamedWithItsFlag) {
  const std::string path = dir_ + "/absent";
  const absl::Status status = ReadTokenFile(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            absl::StrCat("--token-file=", path,
                         ": cannot read the file; check the path and that flagosd's user may "
                         "read it"));
}

TEST_F(TokenFileTest, ADirectoryIsRefusedAsADirectory) {
  const absl::Status status = ReadTokenFile(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            absl::StrCat("--token-file=", dir_, ": is a directory; give the file itself"));
}

TEST_F(TokenFileTest, TokensFrom16To4096CharactersAreAccepted) {
  for (size_t length : {kMinTokenBytes, kMaxTokenBytes}) {
    const std::string token(length, 'x');
    absl::StatusOr<std::string> read = ReadTokenFile(Write("token", token + "\n"));
    ASSERT_TRUE(read.ok()) << length << ": " << read.status();
    EXPECT_EQ(*read, token);
  }
}

TEST_F(TokenFileTest, ATokenTooShortOrTooLongIsRefusedWithItsLength) {
  EXPECT_EQ(kMinTokenBytes, 16u);
  EXPECT_EQ(kMaxTokenBytes, 4096u);
  for (size_t length : {size_t{0}, kMinTokenBytes - 1, kMaxTokenBytes + 1}) {
    const std::string path = Write("token", std::string(length, 'x') + "\n");
    const absl::Status status = ReadTokenFile(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << length;
    EXPECT_EQ(status.message(),
              absl::StrCat("--token-file=", path, ": the token must be 16 to 4096 characters (it "
                           "has ", length, "); write one with `openssl rand -hex 32 > ", path,
                           "`"));
  }
}

TEST_F(TokenFileTest, ATokenWithASpaceOrAControlOrNonAsciiByteIsRefused) {
  for (const std::string& token :
       {std::string("0123456789 abcdef"), std::string("0123456789\tabcdef"),
        std::string("0123456789\x7f" "abcdef"), std::string("0123456789\xc3\xa9" "abcdef")}) {
    const std::string path = Write("token", token);
    const absl::Status status = ReadTokenFile(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << token;
    EXPECT_EQ(status.message(),
              absl::StrCat("--token-file=", path, ": the token must be printable ASCII without "
                           "spaces (it travels in an HTTP/2 header)"));
  }
}

// ---- TcpServerCredentials

TEST_F(TokenFileTest, PlaintextCredentialsNeedNoFiles) {
  RemoteAccessOptions options;
  options.insecure_tcp = true;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      TcpServerCredentials(options);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_NE(*credentials, nullptr);
}

TEST_F(TokenFileTest, AnUnreadableTlsFileIsNamedWithItsFlag) {
  const std::string present = Write("present.pem", "not checked before the token\n");
  const std::string absent = dir_ + "/absent.pem";
  const std::string token = Write("token", kToken);
  struct Case {
    RemoteAccessOptions options;
    std::string flag;
  };
  const Case cases[] = {
      {{absent, present, "", token}, "--tls-cert"},
      {{present, absent, "", token}, "--tls-key"},
      {{present, present, absent, token}, "--tls-client-ca"},
  };
  for (const Case& c : cases) {
    const absl::Status status = TcpServerCredentials(c.options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << c.flag;
    EXPECT_EQ(status.message(),
              absl::StrCat(c.flag, "=", absent,
                           ": cannot read the file; check the path and that flagosd's user may "
                           "read it"));
  }
}

TEST_F(TokenFileTest, ABadTokenFileFailsTheTlsCredentials) {
  const std::string pem = Write("server.pem", "not checked before the token\n");
  const std::string short_token = Write("token", "short\n");
  RemoteAccessOptions options{pem, pem, "", short_token};
  const absl::Status status = TcpServerCredentials(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(status.message(),
                               absl::StrCat("--token-file=", short_token,
                                            ": the token must be 16 to 4096 characters (it has "
                                            "5)")))
      << status;
}

}  // namespace
}  // namespace flagos::daemon
