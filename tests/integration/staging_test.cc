// The shared-memory data plane end to end in-process: a Server on a unix
// socket in a temporary directory, a real client Connection that attaches
// its staging region, and attach attempts that must be refused.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "execution/backend.h"
#include "cpu_runtime.h"
#include "flagos/client/connection.h"
#include <grpcpp/grpcpp.h>

#include "flagos/v1/flagos.grpc.pb.h"
#include "flagos/v1/flagos.pb.h"
#include "flagos/v1/wire.h"
#include "gtest/gtest.h"
#include "ops/op_schema_match.h"
#include "transport/server.h"
#include "memory/pinned_region.h"  // the daemon's
#include "memory/staging_region.h"  // the daemon's
#include "../../client/src/pinned_region.h"
#include "../../client/src/staging_region.h"

namespace flagos {
namespace {

constexpr uint64_t kDeviceMemory = 512ull << 20;

class StagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/flagosd_staging_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    endpoint_ = absl::StrCat("unix://", dir_, "/flagosd.sock");
    daemon::BackendOptions backend_options;
    backend_options.name = "cpu";
    backend_options.cpu_devices = 1;
    backend_options.device_memory = kDeviceMemory;
    auto backend = daemon::Backend::Create(backend_options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    daemon::ServerOptions server_options;
    server_options.listen = {endpoint_};
    auto server = daemon::Server::Start(server_options, backend_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    server_.reset();
    backend_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<client::Connection> Connect() {
    auto connection = client::Connection::Open(endpoint_, absl::Seconds(5), "staging_test");
    EXPECT_TRUE(connection.ok()) << connection.status();
    return connection.ok() ? *std::move(connection) : nullptr;
  }

  v1::SessionInfo OnlySession(client::Connection& connection) {
    auto stats = connection.GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    for (const v1::SessionInfo& s : stats->sessions()) {
      if (s.id() == connection.session_id()) return s;
    }
    ADD_FAILURE() << "session " << connection.session_id() << " is not listed";
    return {};
  }

  uint64_t Allocate(client::Connection& connection, uint64_t nbytes) {
    v1::Command command;
    command.mutable_allocate()->set_nbytes(nbytes);
    auto completion = connection.Call(command, "allocate");
    EXPECT_TRUE(completion.ok()) << completion.status();
    return completion.ok() ? completion->addr() : 0;
  }

  std::string dir_;
  std::string endpoint_;
  std::unique_ptr<daemon::Backend> backend_;
  std::unique_ptr<daemon::Server> server_;
};

std::vector<uint8_t> Pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  uint32_t x = seed * 2654435761u + 1;
  for (uint64_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    bytes[i] = static_cast<uint8_t>(x >> 24);
  }
  return bytes;
}

TEST_F(StagingTest, LargeCopiesMoveThroughTheRegionNotTheStream) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging()) << "a unix-socket session attaches a staging region";
  constexpr uint64_t kBytes = 200ull << 20;  // several laps of the 64 MiB ring
  const uint64_t addr = Allocate(*connection, kBytes);
  const v1::SessionInfo before = OnlySession(*connection);
  EXPECT_TRUE(before.staging_attached());
  EXPECT_EQ(before.uid(), getuid());

  const std::vector<uint8_t> up = Pattern(kBytes, 7);
  ASSERT_TRUE(connection->Upload(0, 0, addr, up.data(), kBytes, "upload").ok());
  std::vector<uint8_t> down(kBytes, 0);
  ASSERT_TRUE(connection->Download(0, 0, down.data(), addr, kBytes, "download").ok());
  EXPECT_TRUE(up == down);

  const v1::SessionInfo after = OnlySession(*connection);
  EXPECT_EQ(after.staged_bytes() - before.staged_bytes(), 2 * kBytes);
  // A few hundred commands of a few dozen bytes each, however large the copy.
  EXPECT_LT(after.stream_bytes_received() - before.stream_bytes_received(), 256u << 10);
  EXPECT_LT(after.stream_bytes_sent() - before.stream_bytes_sent(), 256u << 10);
}

TEST_F(StagingTest, WithoutTheRegionBytesTravelInline) {
  setenv("FLAGOS_STAGING", "0", 1);
  auto connection = Connect();
  unsetenv("FLAGOS_STAGING");
  ASSERT_NE(connection, nullptr);
  ASSERT_FALSE(connection->staging());
  constexpr uint64_t kBytes = 20ull << 20;
  const uint64_t addr = Allocate(*connection, kBytes);
  const v1::SessionInfo before = OnlySession(*connection);
  const std::vector<uint8_t> up = Pattern(kBytes, 3);
  ASSERT_TRUE(connection->Upload(0, 0, addr, up.data(), kBytes, "upload").ok());
  std::vector<uint8_t> down(kBytes, 0);
  ASSERT_TRUE(connection->Download(0, 0, down.data(), addr, kBytes, "download").ok());
  EXPECT_TRUE(up == down);
  const v1::SessionInfo after = OnlySession(*connection);
  EXPECT_FALSE(after.staging_attached());
  EXPECT_GE(after.stream_bytes_received() - before.stream_bytes_received(), kBytes);
  EXPECT_GE(after.stream_bytes_sent() - before.stream_bytes_sent(), kBytes);
}

TEST_F(StagingTest, ManySmallUploadsReuseTheRing) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging());
  const uint64_t addr = Allocate(*connection, 2ull << 20);
  // 78 × 512 chunks of one slot each: more than the ring holds at once.
  constexpr uint32_t kUploads = 78 * 512;
  for (uint32_t i = 0; i < kUploads; ++i) {
    ASSERT_TRUE(connection->Upload(0, 0, addr + (i % 512) * 4, &i, 4, "upload").ok());
  }
  std::vector<uint32_t> back(512);
  ASSERT_TRUE(connection->Download(0, 0, back.data(), addr, 512 * 4, "download").ok());
  for (uint32_t k = 0; k < 512; ++k) EXPECT_EQ(back[k], kUploads - 512 + k) << k;
}

TEST_F(StagingTest, StagedBytesOutsideTheDataAreaAreAnErrorAndTheSessionGoesOn) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging());
  const uint64_t addr = Allocate(*connection, 1 << 20);
  v1::Command command;
  auto* copy = command.mutable_copy_from_device();
  copy->set_addr(addr);
  copy->set_nbytes(4096);
  copy->mutable_staged()->set_offset(client::kStagingBytes);  // one past the end
  copy->mutable_staged()->set_nbytes(4096);
  auto completion = connection->Call(command, "bad staged copy");
  ASSERT_FALSE(completion.ok());
  EXPECT_NE(completion.status().message().find("outside the session's staging data area"),
            std::string::npos)
      << completion.status();
  uint32_t value = 42, back = 0;
  ASSERT_TRUE(connection->Upload(0, 0, addr, &value, 4, "upload").ok());
  ASSERT_TRUE(connection->Download(0, 0, &back, addr, 4, "download").ok());
  EXPECT_EQ(back, 42u);
}

TEST_F(StagingTest, TheSyncChannelRaisesAnEarlierAsynchronousError) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging());
  const uint64_t addr = Allocate(*connection, 1 << 20);
  // Fails when it runs (outside every segment) and owes no reply: its error
  // travels on the session stream while the download below is answered on
  // the sync channel; the download must still raise it.
  v1::Command bad;
  bad.mutable_memset()->set_addr(addr + (4 << 20));
  bad.mutable_memset()->set_nbytes(16);
  connection->Enqueue(bad, "the bad memset");
  uint32_t back = 0;
  absl::Status status = connection->Download(0, 0, &back, addr, 4, "download");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("the bad memset"), std::string::npos) << status;
  // Raised once; the session goes on.
  EXPECT_TRUE(connection->Download(0, 0, &back, addr, 4, "download").ok());
}

TEST_F(StagingTest, TheSyncChannelServesAfterLongIdlePeriods) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging());
  const uint64_t addr = Allocate(*connection, 1 << 20);
  uint32_t value = 7, back = 0;
  ASSERT_TRUE(connection->Upload(0, 0, addr, &value, 4, "upload").ok());
  // Longer than the attach's 2 s socket timeouts, which must not carry over.
  absl::SleepFor(absl::Milliseconds(2500));
  ASSERT_TRUE(connection->Download(0, 0, &back, addr, 4, "download").ok());
  EXPECT_EQ(back, 7u);
}

TEST_F(StagingTest, AttachNeedsTheSessionsToken) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging());
  const std::string socket = server_->staging_socket();
  ASSERT_FALSE(socket.empty());
  auto region = client::StagingRegion::Create(1 << 20, 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);

  absl::StatusOr<int> wrong = (*region)->Attach(socket, connection->session_id(),
                                                std::string(16, 'x'), deadline);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
  absl::StatusOr<int> missing =
      (*region)->Attach(socket, 999999, std::string(16, 'x'), deadline);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
}

// A raw client (not flagos_client): a session stream, opened, with a
// staging region attached; `fd` is the sync channel.
struct RawSyncClient {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Flagos::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream;
  v1::SessionOpened opened;
  std::unique_ptr<client::StagingRegion> region;
  int fd = -1;
};

void OpenRawSyncClient(const std::string& endpoint, RawSyncClient* c) {
  c->channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  c->stub = v1::Flagos::NewStub(c->channel);
  c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  c->stream = c->stub->Session(&c->context);
  v1::ClientMessage open;
  open.mutable_open()->set_version(1);
  open.mutable_open()->set_pid(getpid());
  ASSERT_TRUE(c->stream->Write(open));
  v1::ServerMessage reply;
  ASSERT_TRUE(c->stream->Read(&reply));
  ASSERT_TRUE(reply.has_opened());
  c->opened = reply.opened();
  ASSERT_FALSE(c->opened.staging_token().empty());
  auto region = client::StagingRegion::Create(1 << 20, 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  c->region = *std::move(region);
  absl::StatusOr<int> fd =
      c->region->Attach(c->opened.staging_socket(), c->opened.session_id(),
                        c->opened.staging_token(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(fd.ok()) << fd.status();
  c->fd = *fd;
}

// A raw client (not flagos_client) on the sync channel: a request with seq 0,
// or one for a command that owes no reply, is answered with its error on the
// channel it came on (a reply by seq would go to the session stream, where
// no one waits); the channel and the session go on.
TEST_F(StagingTest, TheSyncChannelAnswersWhatItCannotServeOnItself) {
  RawSyncClient raw;
  ASSERT_NO_FATAL_FAILURE(OpenRawSyncClient(endpoint_, &raw));
  auto& stream = raw.stream;
  const int* fd = &raw.fd;
  v1::ServerMessage opened;

  const auto ask = [&](v1::Command command) {
    v1::SyncRequest request;
    *request.mutable_command() = std::move(command);
    EXPECT_TRUE(v1::WriteFrame(*fd, request));
    std::string body;
    EXPECT_EQ(v1::ReadFrame(*fd, 1 << 20, &body), v1::FrameResult::kOk);
    v1::Completion completion;
    EXPECT_TRUE(completion.ParseFromString(body));
    return completion;
  };
  v1::Command seq0;
  seq0.mutable_sync();  // seq 0
  v1::Completion refused = ask(seq0);
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(refused.message(),
            "command 0 (sync) cannot use the sync channel: only a command with a nonzero seq "
            "that owes a reply can; send it on the session stream");
  v1::Command no_reply;
  no_reply.set_seq(7);
  no_reply.mutable_free()->set_addr(0x1000);
  v1::Completion also = ask(no_reply);
  EXPECT_EQ(also.seq(), 7u);
  EXPECT_EQ(also.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  // The channel still serves a command it can.
  v1::Command sync;
  sync.set_seq(8);
  sync.set_device(-1);
  sync.mutable_sync();
  v1::Completion served = ask(sync);
  EXPECT_EQ(served.seq(), 8u);
  EXPECT_EQ(served.code(), 0) << served.message();
  close(*fd);
  stream->WritesDone();
  while (stream->Read(&opened)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

// A raw client that sends sync-channel commands owing replies and reads
// neither the channel nor its stream: the daemon sends each reply without
// blocking (what the socket does not take waits for the session's writer),
// so no thread of the device is held and another session goes on; once more
// than kMaxUnreadReplyBytes wait, the session ends with RESOURCE_EXHAUSTED
// and its memory is freed.
TEST_F(StagingTest, ASyncChannelClientThatDoesNotReadIsEnded) {
  RawSyncClient raw;
  ASSERT_NO_FATAL_FAILURE(OpenRawSyncClient(endpoint_, &raw));
  auto& stream = raw.stream;
  const int* fd = &raw.fd;
  const uint64_t deaf_id = raw.opened.session_id();
  v1::ServerMessage reply;
  constexpr uint64_t kReply = 1 << 20;
  v1::ClientMessage allocate;
  v1::Command* command = allocate.mutable_batch()->add_commands();
  command->set_seq(1);
  command->mutable_allocate()->set_nbytes(kReply);
  ASSERT_TRUE(stream->Write(allocate));
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_EQ(reply.completions_size(), 1);
  const uint64_t addr = reply.completions(0).addr();
  // 1 GiB of replies, four times the bound, never read.
  for (uint64_t seq = 2; seq < 2 + 1024; ++seq) {
    v1::SyncRequest request;
    request.mutable_command()->set_seq(seq);
    request.mutable_command()->mutable_copy_from_device()->set_addr(addr);
    request.mutable_command()->mutable_copy_from_device()->set_nbytes(kReply);
    if (!v1::WriteFrame(*fd, request)) break;  // the session ended already
  }

  auto other = Connect();
  ASSERT_NE(other, nullptr);
  const uint64_t mine = Allocate(*other, 4096);
  ASSERT_NE(mine, 0u);
  v1::Command download;
  download.mutable_copy_from_device()->set_addr(mine);
  download.mutable_copy_from_device()->set_nbytes(4096);
  auto data = other->Call(download, "copy_from_device");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->data() == std::string(4096, '\0'));
  // The deaf session ends (and, closing, frees its memory): only the other
  // one is left.
  while (true) {
    auto stats = other->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    if (stats->sessions_size() == 1 && stats->closing_sessions_size() == 0) {
      EXPECT_EQ(stats->sessions(0).id(), other->session_id());
      EXPECT_EQ(stats->devices(0).used_memory(), 4096u);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  while (stream->Read(&reply)) {
  }
  const grpc::Status end = stream->Finish();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << end.error_message();
  EXPECT_EQ(end.error_message(),
            absl::StrCat("session ", deaf_id,
                         " has more than 268435456 bytes of replies it has not read "
                         "(kMaxUnreadReplyBytes): the client does not read its replies; flagosd "
                         "ended the session and freed what it held. Read the session stream (and "
                         "the sync channel) while commands that owe replies are outstanding"));
  close(*fd);
}

// A client whose sync-channel command runs a long kernel (on the channel's
// thread: linalg_vector_norm over a 4-byte segment viewed as 2^31 elements,
// seconds of work) cancels its stream: its session stops being live at once,
// while GetStats lists it as closing with that kernel still running, and it
// is gone, its memory freed, once the kernel returned.
TEST_F(StagingTest, AClientLeavingWhileItsSyncChannelRunsAKernelIsNoLongerLive) {
  RawSyncClient raw;
  ASSERT_NO_FATAL_FAILURE(OpenRawSyncClient(endpoint_, &raw));
  const uint64_t raw_id = raw.opened.session_id();
  v1::ClientMessage message;
  v1::Command* allocate = message.mutable_batch()->add_commands();
  allocate->set_seq(1);
  allocate->mutable_allocate()->set_nbytes(4);
  ASSERT_TRUE(raw.stream->Write(message));
  v1::ServerMessage reply;
  ASSERT_TRUE(raw.stream->Read(&reply));
  ASSERT_EQ(reply.completions_size(), 1);
  const uint64_t addr = reply.completions(0).addr();
  message.Clear();
  v1::Command* upload = message.mutable_batch()->add_commands();
  upload->set_seq(2);
  upload->mutable_copy_to_device()->set_addr(addr);
  const float half = 0.5f;
  upload->mutable_copy_to_device()->set_data(std::string(reinterpret_cast<const char*>(&half), 4));
  v1::Command* reg = message.mutable_batch()->add_commands();
  reg->set_seq(3);
  reg->mutable_register_op()->set_op_id(1);
  reg->mutable_register_op()->set_name("aten::linalg_vector_norm");
  reg->mutable_register_op()->set_schema(
      daemon::OwnSchemaText("aten::linalg_vector_norm", "").value_or(""));
  v1::Command* sync = message.mutable_batch()->add_commands();
  sync->set_seq(4);
  sync->set_device(-1);
  sync->mutable_sync();
  ASSERT_TRUE(raw.stream->Write(message));
  // The upload has run: the stream's queue is idle, so the channel's
  // thread runs the norm itself.
  ASSERT_TRUE(raw.stream->Read(&reply));
  ASSERT_EQ(reply.completions_size(), 1);
  ASSERT_EQ(reply.completions(0).seq(), 4u);
  ASSERT_EQ(reply.completions(0).code(), 0) << reply.completions(0).message();
  v1::SyncRequest request;
  request.set_after_seq(4);
  v1::Command& norm = *request.mutable_command();
  norm.set_seq(5);
  norm.mutable_op()->set_op_id(1);
  norm.mutable_op()->set_want_values(true);
  v1::TensorRef& self = *norm.mutable_op()->add_args()->mutable_tensor();
  self.set_addr(addr);
  self.set_dtype(6);  // float32
  self.add_sizes(int64_t{1} << 31);
  self.add_strides(0);
  ASSERT_TRUE(v1::WriteFrame(raw.fd, request));

  auto other = Connect();
  ASSERT_NE(other, nullptr);
  const auto find = [](const auto& sessions, uint64_t id) -> const v1::SessionInfo* {
    for (const v1::SessionInfo& s : sessions) {
      if (s.id() == id) return &s;
    }
    return nullptr;
  };
  // Polls GetStats (every 10 ms, at most `polls` times) until `done`.
  const auto stats_until = [&](auto done, int polls) {
    absl::StatusOr<v1::GetStatsResponse> stats;
    for (int i = 0; i < polls; ++i) {
      stats = other->GetStats();
      if (!stats.ok() || done(*stats)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return stats;
  };
  absl::StatusOr<v1::GetStatsResponse> stats = stats_until(
      [&](const v1::GetStatsResponse& s) {
        const v1::SessionInfo* mine = find(s.sessions(), raw_id);
        return mine != nullptr && mine->running_commands() == 1;
      },
      500);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_NE(find(stats->sessions(), raw_id), nullptr);
  ASSERT_EQ(find(stats->sessions(), raw_id)->running_commands(), 1u) << "the norm never started";

  raw.context.TryCancel();  // as if the process died mid-kernel
  while (raw.stream->Read(&reply)) {
  }
  EXPECT_EQ(raw.stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  stats = stats_until(
      [&](const v1::GetStatsResponse& s) { return find(s.sessions(), raw_id) == nullptr; }, 500);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(find(stats->sessions(), raw_id), nullptr) << "the cancelled session is still live";
  // No longer live while its kernel still runs.
  const v1::SessionInfo* closing = find(stats->closing_sessions(), raw_id);
  ASSERT_NE(closing, nullptr) << "the kernel returned before the session stopped being live";
  EXPECT_EQ(closing->running_commands(), 1u);
  EXPECT_EQ(closing->segment_bytes(), 4u);
  EXPECT_EQ(stats->devices(0).used_memory(), 4u);
  stats = stats_until(
      [](const v1::GetStatsResponse& s) { return s.closing_sessions_size() == 0; }, 12000);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->closing_sessions_size(), 0);
  EXPECT_EQ(stats->devices(0).used_memory(), 0u);
  EXPECT_EQ(stats->sessions_size(), 1);
  close(raw.fd);
}

TEST(DaemonStagingRegion, AcceptsOnlySealedMemfdsThatHoldTheLayout) {
  v1::StagingAttach layout;
  layout.set_slot_bytes(4096);
  layout.set_slot_count(16);
  layout.set_data_offset(4096);
  const uint64_t size = 4096 + 16 * 4096;

  // A memfd that could still shrink.
  int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, size), 0);
  auto unsealed = daemon::StagingRegion::Map(fd, layout);
  EXPECT_FALSE(unsealed.ok());
  EXPECT_NE(unsealed.status().message().find("F_SEAL_SHRINK"), std::string::npos);

  // Sealed but too small for the layout.
  fd = memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, size - 1), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_FALSE(daemon::StagingRegion::Map(fd, layout).ok());

  // Flags overlapping the data area.
  fd = memfd_create("overlap", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, size), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  v1::StagingAttach overlapping = layout;
  overlapping.set_data_offset(8);
  EXPECT_FALSE(daemon::StagingRegion::Map(fd, overlapping).ok());

  fd = memfd_create("good", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, size), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto region = daemon::StagingRegion::Map(fd, layout);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_TRUE((*region)->Bytes(0, 16 * 4096).ok());
  EXPECT_FALSE((*region)->Bytes(4096, 16 * 4096).ok());
  EXPECT_FALSE((*region)->Bytes(~0ull - 10, 20).ok());
}

TEST(ClientStagingRegion, ClaimsInRingOrderAndReclaimsOnlyFreedChunks) {
  auto region = client::StagingRegion::Create(16 * 4096, 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  client::StagingRegion& ring = **region;
  EXPECT_EQ(ring.max_chunk(), 4u * 4096);
  auto a = ring.TryClaim(4 * 4096);
  auto b = ring.TryClaim(4 * 4096);
  auto c = ring.TryClaim(4 * 4096);
  auto d = ring.TryClaim(3 * 4096 + 1);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(b->offset, 4u * 4096);
  EXPECT_EQ(d->offset, 12u * 4096);
  EXPECT_FALSE(ring.TryClaim(1)) << "the ring is full";
  // Freeing a later chunk frees nothing: space returns in claim order.
  ring.Release(b->offset);
  EXPECT_FALSE(ring.TryClaim(1));
  ring.Release(a->offset);
  auto e = ring.TryClaim(4 * 4096);  // a and b are back: wraps to the start
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset, 0u);
  auto f = ring.TryClaim(4 * 4096);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, 4u * 4096);
  EXPECT_FALSE(ring.TryClaim(1));
}

TEST_F(StagingTest, PinnedRegionsAreCopiedStraightFromAndIntoAndReleased) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->staging());
  const uint64_t n = 3 << 20;
  const uint64_t addr = Allocate(*connection, n);
  auto src = connection->AllocatePinned(n);
  ASSERT_TRUE(src.ok()) << src.status();
  auto dst = connection->AllocatePinned(n);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_GT(src->region, 0u);
  ASSERT_NE(src->region, dst->region);
  EXPECT_EQ(OnlySession(*connection).pinned_bytes(), src->nbytes + dst->nbytes);
  const std::vector<uint8_t> bytes = Pattern(n, 9);
  std::memcpy(src->data, bytes.data(), n);
  std::memset(dst->data, 0, n);
  const uint64_t staged_before = OnlySession(*connection).staged_bytes();
  ASSERT_TRUE(connection->UploadPinned(0, 0, addr, src->region, 0, n, "pinned upload").ok());
  ASSERT_TRUE(connection->DownloadPinned(0, 0, dst->region, 0, addr, n, "pinned download").ok());
  ASSERT_TRUE(connection->Synchronize(0).ok());
  EXPECT_EQ(std::memcmp(dst->data, bytes.data(), n), 0);
  EXPECT_EQ(OnlySession(*connection).staged_bytes(), staged_before);  // no staging copy

  connection->FreePinned(*src);
  connection->FreePinned(*dst);
  ASSERT_TRUE(connection->Synchronize(-1).ok());
  EXPECT_EQ(OnlySession(*connection).pinned_bytes(), 0u);
  // A released region can no longer be named.
  ASSERT_TRUE(connection->UploadPinned(0, 0, addr, src->region, 0, 64, "stale upload").ok());
  absl::Status stale = connection->Synchronize(0);
  EXPECT_EQ(stale.code(), absl::StatusCode::kNotFound) << stale;
  EXPECT_NE(stale.message().find("stale upload"), std::string::npos) << stale;
}

TEST_F(StagingTest, PinnedRangesOutsideTheRegionAreAnErrorAndTheSessionGoesOn) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  const uint64_t addr = Allocate(*connection, 1 << 20);
  auto block = connection->AllocatePinned(4096);
  ASSERT_TRUE(block.ok()) << block.status();
  ASSERT_TRUE(
      connection->DownloadPinned(0, 0, block->region, 4000, addr, 200, "overlong download").ok());
  absl::Status status = connection->Synchronize(0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("lie outside pinned region"), std::string::npos) << status;
  ASSERT_TRUE(connection->UploadPinned(0, 0, addr, block->region, ~0ull - 10, 20, "wrap").ok());
  EXPECT_EQ(connection->Synchronize(0).code(), absl::StatusCode::kInvalidArgument);
  uint32_t value = 42, back = 0;
  ASSERT_TRUE(connection->Upload(0, 0, addr, &value, 4, "upload").ok());
  ASSERT_TRUE(connection->Download(0, 0, &back, addr, 4, "download").ok());
  EXPECT_EQ(back, 42u);
}

TEST_F(StagingTest, PinnedAttachNeedsTheSessionsToken) {
  auto connection = Connect();
  ASSERT_NE(connection, nullptr);
  const std::string socket = server_->staging_socket();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto region = client::PinnedRegion::Create(77, 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::Status wrong =
      (*region)->Attach(socket, connection->session_id(), std::string(16, 'x'), deadline);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied) << wrong;
  absl::Status missing = (*region)->Attach(socket, 999999, std::string(16, 'x'), deadline);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_EQ(OnlySession(*connection).pinned_bytes(), 0u);
}

TEST(DaemonPinnedRegion, AcceptsOnlySealedMemfdsThatHoldTheRegion) {
  auto created = CreateCpuRuntime(CpuRuntimeParams{});
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<DeviceRuntime> runtime = *std::move(created);
  int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  auto unsealed = daemon::PinnedRegion::Map(1, fd, 8192, runtime.get());
  EXPECT_FALSE(unsealed.ok());
  EXPECT_NE(unsealed.status().message().find("F_SEAL_SHRINK"), std::string::npos);

  fd = memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto small = daemon::PinnedRegion::Map(2, fd, 8192, runtime.get());
  EXPECT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("holds 4096 bytes; the region needs 8192"),
            std::string::npos)
      << small.status();

  fd = memfd_create("empty", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_FALSE(daemon::PinnedRegion::Map(3, fd, 0, runtime.get()).ok());

  fd = memfd_create("good", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto region = daemon::PinnedRegion::Map(4, fd, 8192, runtime.get());
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_TRUE((*region)->Bytes(0, 8192).ok());
  EXPECT_TRUE((*region)->Bytes(8192, 0).ok());
  EXPECT_FALSE((*region)->Bytes(4096, 4097).ok());
  EXPECT_FALSE((*region)->Bytes(~0ull - 10, 20).ok());
}

}  // namespace
}  // namespace flagos
