// Sessions and the daemon's threads: admission of streams waiting to open (fair per
// connection and per user, bounded), the session limit, stats and the kernel's word on a
// session's user, threads that do not grow with sessions and streams, one worker shared
// fairly, and a client that leaves mid-kernel.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "admission/pending_opens.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

// Streams that never send `open` hold a server thread each, outside
// --max-sessions: at most max_pending_opens wait at once, each until the
// open deadline, then they are cancelled and others are served.
TEST_F(ServerTest, StreamsThatNeverOpenAreBoundedAndCancelled) {
  std::vector<std::unique_ptr<RawSession>> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<RawSession>(stub_.get()));
  for (int i = 0; i < 200 && server_->pending_opens() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_->pending_opens(), 3u);

  RawSession refused(stub_.get());
  v1::ServerMessage reply;
  EXPECT_FALSE(refused.stream().Read(&reply));
  grpc::Status status = refused.stream().Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "3 connections are waiting to open a session already (each may wait 2s for its "
            "`open`); try again");

  for (auto& stream : idle) {  // cancelled at the deadline, with no help from the client
    EXPECT_FALSE(stream->stream().Read(&reply));
    EXPECT_EQ(stream->stream().Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  idle.clear();
  RawSession served(stub_.get());
  served.Open();
  EXPECT_NE(served.AllocateOk(64), 0u);
  // A cancelled stream's ticket is returned when its server thread sees the
  // cancel, which may be after its client did (under load: ASan, ctest -j2).
  for (int i = 0; i < 500 && server_->pending_opens() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->pending_opens(), 0u);
}

// Fair admission: the streams waiting for `open` are shared out, so that no
// connection or user can keep the others from opening sessions.
class FairAdmissionTest : public ServerTest {
 protected:
  void Configure(ServerOptions* options) override {
    options->max_sessions = 8;
    options->max_pending_opens = 64;  // one user: 64 / 4 = 16 of them
    options->open_deadline = absl::Seconds(20);
  }

  // A stub on a connection of its own (channels with the same arguments
  // would otherwise share one connection).
  std::unique_ptr<v1::Flagos::Stub> NewConnection() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("flagos.test.connection", ++connections_);
    return v1::Flagos::NewStub(
        grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), args));
  }

  // Waits until `n` streams wait for their `open`.
  void AwaitPending(size_t n) {
    for (int i = 0; i < 500 && server_->pending_opens() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(server_->pending_opens(), n);
  }

  // The status a stream that was refused before `open` ends with.
  static grpc::Status Refusal(RawSession& session) {
    v1::ServerMessage reply;
    EXPECT_FALSE(session.stream().Read(&reply));
    return session.stream().Finish();
  }

  int connections_ = 0;
};

TEST_F(FairAdmissionTest, OneConnectionCannotHoldEveryWaitingSlot) {
  // 200 streams on one connection that never send `open`.
  std::unique_ptr<v1::Flagos::Stub> greedy = NewConnection();
  std::vector<std::unique_ptr<RawSession>> idle;
  for (int i = 0; i < kMaxPendingOpensPerConnection; ++i) {
    idle.push_back(std::make_unique<RawSession>(greedy.get()));
  }
  AwaitPending(kMaxPendingOpensPerConnection);
  int refused = 0;
  std::string message;
  for (int i = 0; i < 196; ++i) {
    RawSession more(greedy.get());
    grpc::Status status = Refusal(more);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    refused += status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? 1 : 0;
    message = status.error_message();
  }
  EXPECT_EQ(refused, 196);
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("has ", kMaxPendingOpensPerConnection,
                                                      " session streams waiting to send `open` "
                                                      "already, the most one connection may")))
      << message;
  EXPECT_EQ(server_->pending_opens(), kMaxPendingOpensPerConnection);
  // Another connection opens a session at once, and it works.
  std::unique_ptr<v1::Flagos::Stub> other = NewConnection();
  RawSession served(other.get());
  const uint64_t id = served.Open();
  if (id == 0) FAIL() << served.stream().Finish().error_message();
  EXPECT_NE(served.AllocateOk(64), 0u);
}

TEST_F(FairAdmissionTest, OneUserCannotHoldEveryWaitingSlot) {
  // Every connection here is this process's user: a quarter of the 64, on
  // four connections of four streams each.
  std::vector<std::unique_ptr<v1::Flagos::Stub>> stubs;
  std::vector<std::unique_ptr<RawSession>> idle;
  for (int c = 0; c < 4; ++c) {
    stubs.push_back(NewConnection());
    for (size_t i = 0; i < kMaxPendingOpensPerConnection; ++i) {
      idle.push_back(std::make_unique<RawSession>(stubs.back().get()));
    }
  }
  AwaitPending(16);
  stubs.push_back(NewConnection());
  RawSession refused(stubs.back().get());
  grpc::Status status = Refusal(refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(
      status.error_message(),
      absl::StrCat("uid ", getuid(), " has 16 session streams waiting to send `open` already, "
                   "the most one user may of the daemon's 64")))
      << status.error_message();
  // Once one of them opens, the user may wait with another.
  EXPECT_NE(idle[0]->Open(), 0u);
  AwaitPending(15);
  RawSession next(stubs.back().get());
  EXPECT_NE(next.Open(), 0u);
}

class AdmissionPerUidTest : public FairAdmissionTest {
 protected:
  void Configure(ServerOptions* options) override {
    FairAdmissionTest::Configure(options);
    options->max_sessions_per_uid = 2;
  }
};

TEST_F(AdmissionPerUidTest, StreamsWaitingToOpenCountAgainstMaxSessionsPerUid) {
  std::unique_ptr<v1::Flagos::Stub> first = NewConnection();
  RawSession live(first.get());
  EXPECT_NE(live.Open(), 0u);
  std::unique_ptr<v1::Flagos::Stub> second = NewConnection();
  RawSession waiting(second.get());
  AwaitPending(1);
  // One session open and one stream about to open: the user's two.
  std::unique_ptr<v1::Flagos::Stub> third = NewConnection();
  RawSession refused(third.get());
  grpc::Status status = Refusal(refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(),
                                absl::StrCat("uid ", getuid(), " has 1 session streams waiting "
                                             "to send `open`, as many as the sessions "
                                             "--max-sessions-per-uid still lets it open")))
      << status.error_message();
  // Both open: the next is refused as a third session.
  EXPECT_NE(waiting.Open(), 0u);
  std::unique_ptr<v1::Flagos::Stub> fourth = NewConnection();
  RawSession third_session(fourth.get());
  status = Refusal(third_session);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(),
                                absl::StrCat("uid ", getuid(), " has 2 sessions open, the most "
                                             "--max-sessions-per-uid=2 allows one user")))
      << status.error_message();
}

TEST_F(ServerTest, StatsCountSessionsSegmentsAndCommands) {
  RawSession session(stub_.get());
  const uint64_t id = session.Open();
  session.AllocateOk(1000);
  session.AllocateOk(24, 1);
  v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.backend(), "cpu");
  EXPECT_EQ(stats.devices(0).used_memory(), 1000u);
  EXPECT_EQ(stats.devices(1).used_memory(), 24u);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).id(), id);
  EXPECT_EQ(stats.sessions(0).pid(), getpid());
  EXPECT_EQ(stats.sessions(0).client(), "server_test");
  EXPECT_EQ(stats.sessions(0).segments(), 2u);
  EXPECT_EQ(stats.sessions(0).segment_bytes(), 1024u);
  EXPECT_EQ(stats.sessions(0).commands(), 2u);
  EXPECT_GE(stats.sessions_total(), 1u);
}

TEST_F(ServerTest, ASessionsUserAndProcessAreTheKernelsNotTheClientsWord) {
  // The client claims another pid; the session's connection says who it is.
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream =
      stub_->Session(&context);
  v1::ClientMessage open;
  open.mutable_open()->set_version(1);
  open.mutable_open()->set_pid(1);
  ASSERT_TRUE(stream->Write(open));
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_opened());
  // A unix-socket session is offered the staging region.
  EXPECT_FALSE(reply.opened().staging_socket().empty());
  v1::GetStatsResponse stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  const v1::SessionInfo& info = stats.sessions(0);
  EXPECT_TRUE(info.credentials_from_kernel());
  EXPECT_EQ(info.pid(), getpid());
  EXPECT_EQ(info.uid(), getuid());
  EXPECT_EQ(info.gid(), getgid());
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, SessionsBeyondTheLimitAreRefused) {
  std::vector<std::unique_ptr<RawSession>> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(std::make_unique<RawSession>(stub_.get()));
    sessions.back()->Open();
  }
  RawSession extra(stub_.get());
  v1::ClientMessage message;
  message.mutable_open()->set_version(1);
  ASSERT_TRUE(extra.stream().Write(message));
  EXPECT_EQ(extra.End().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}


// The threads of this process (the test's server and its client).
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

v1::Command Memset(uint64_t addr, uint64_t nbytes, int value, int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_memset()->set_addr(addr);
  command.mutable_memset()->set_nbytes(nbytes);
  command.mutable_memset()->set_value(value);
  return command;
}

v1::Command CopyAcross(uint64_t dst, int device, uint64_t stream, uint64_t src, int src_device,
                       uint64_t nbytes) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_copy_device_to_device()->set_dst(dst);
  command.mutable_copy_device_to_device()->set_src(src);
  command.mutable_copy_device_to_device()->set_src_device(src_device);
  command.mutable_copy_device_to_device()->set_nbytes(nbytes);
  return command;
}

// Each of `streams` streams (1..streams, on device stream % 2) memsets its
// own chunk `rounds` times with the byte `stream`; stream 1 (device 1) then
// records event 1, which stream 2 (device 0) waits for before it copies
// stream 1's chunk into its own. A sync ends the batch. Returns the
// commands; `chunk(device, stream)` is the address of a stream's chunk.
template <typename ChunkFn>
std::vector<v1::Command> BusyStreams(int streams, int rounds, uint64_t chunk_bytes,
                                     ChunkFn chunk) {
  std::vector<v1::Command> commands;
  for (int round = 0; round < rounds; ++round) {
    for (int stream = 1; stream <= streams; ++stream) {
      const int device = stream % 2;
      commands.push_back(Memset(chunk(device, stream), chunk_bytes, stream, device, stream));
    }
  }
  commands.push_back(RecordEvent(1, false, 1, 1));
  commands.push_back(WaitEvent(1, 0, 2));
  commands.push_back(CopyAcross(chunk(0, 2), 0, 2, chunk(1, 1), 1, chunk_bytes));
  commands.push_back(Sync());
  return commands;
}

// 64 sessions x 8 streams on a daemon with 4 workers per device (2
// devices). The bound (docs/operations.md, "Threads"): the workers exist
// from the start; a session adds the one gRPC thread that reads its stream
// and its reply writer (and the sync channel's, which a raw session does
// not attach), and no
// number of streams or of commands queued on them adds any. gRPC's sync
// server may keep a few spare threads for new calls, and its core a few
// more under load: kGrpcSpareThreads. (One thread per stream, the design
// before the pool, is 512 threads more.)
class ManySessionsTest : public ServerTest {
 protected:
  static constexpr int kSessions = 64;
  static constexpr int kStreams = 8;
  static constexpr int kWorkersPerDevice = 4;
  static constexpr int kGrpcSpareThreads = 16;
  void Configure(ServerOptions* options) override {
    options->max_sessions = kSessions;
    options->workers_per_device = kWorkersPerDevice;
  }
};

TEST_F(ManySessionsTest, ThreadCountDoesNotGrowWithSessionsTimesBusyStreams) {
  EXPECT_EQ(server_->workers_per_device(), kWorkersPerDevice);
  Stats();  // the client channel is connected and its threads exist
  const int at_start = ThreadCount();
  constexpr uint64_t kChunk = 128 << 10;
  // Per device: chunks for streams 0..kStreams (index stream / 2).
  constexpr uint64_t kSegment = (kStreams / 2 + 1) * kChunk;
  std::vector<std::unique_ptr<RawSession>> sessions;
  std::vector<std::array<uint64_t, 2>> segments;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(std::make_unique<RawSession>(stub_.get()));
    sessions.back()->Open();
    segments.push_back({sessions.back()->AllocateOk(kSegment, 0),
                        sessions.back()->AllocateOk(kSegment, 1)});
  }
  const int sessions_open = ThreadCount();
  std::vector<uint64_t> syncs;
  for (int i = 0; i < kSessions; ++i) {
    const auto chunk = [&segments, i](int device, int stream) {
      return segments[i][device] + (stream / 2) * kChunk;
    };
    syncs.push_back(sessions[i]->Send(BusyStreams(kStreams, 100, kChunk, chunk)));
  }
  int busy = ThreadCount();
  for (int i = 0; i < kSessions; ++i) {
    v1::Completion sync = sessions[i]->WaitFor(syncs[i]);
    EXPECT_EQ(sync.code(), 0) << sync.message();
    busy = std::max(busy, ThreadCount());
  }
  std::cout << "threads: " << at_start << " at start (" << kWorkersPerDevice
            << " workers x 2 devices included), " << sessions_open << " with " << kSessions
            << " sessions open, at most " << busy << " with " << kSessions << " x " << kStreams
            << " streams busy\n";
  RecordProperty("threads_at_start", at_start);
  RecordProperty("threads_sessions_open", sessions_open);
  RecordProperty("threads_busy_max", busy);
  EXPECT_LE(sessions_open, at_start + 2 * kSessions + kGrpcSpareThreads);
  EXPECT_LE(busy, at_start + 2 * kSessions + kGrpcSpareThreads);
  // Every session's streams ran in order: stream 2 copied stream 1's bytes
  // after waiting for its event.
  for (int i = 0; i < kSessions; ++i) {
    v1::Completion data =
        sessions[i]->Call(CopyFrom(segments[i][0] + kChunk + kChunk - 4, 4, 0, 2));
    ASSERT_EQ(data.code(), 0) << data.message();
    EXPECT_EQ(data.data(), std::string(4, '\x01')) << "session " << i;
  }
  for (auto& session : sessions) EXPECT_TRUE(session->End().ok());
}

TEST_F(ServerTest, StartRefusesWorkersPerDeviceOutOfRangeNamingTheFlag) {
  EXPECT_GE(server_->workers_per_device(), 4);  // the default
  for (int workers : {-1, kMaxWorkersPerDevice + 1}) {
    ServerOptions options;
    options.listen = {absl::StrCat("unix://", dir_, "/other.sock")};
    options.workers_per_device = workers;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options, backend_.get());
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(server.status().message(), "--workers-per-device must be"))
        << server.status();
  }
}

// One worker per device: a stream that waits for another stream's event,
// or for another device's work, parks its queue and leaves the worker to
// the stream it waits for (were it to block the worker, nothing would run).
class OneWorkerTest : public ServerTest {
 protected:
  void Configure(ServerOptions* options) override { options->workers_per_device = 1; }
};

TEST_F(OneWorkerTest, WaitsAcrossStreamsAndDevicesDoNotStarveTheOnlyWorker) {
  RawSession session(stub_.get());
  session.Open();
  constexpr uint64_t kChunk = 1 << 20;
  const uint64_t a = session.AllocateOk(4 * kChunk, 0);
  const uint64_t b = session.AllocateOk(4 * kChunk, 1);
  // Stream 1 gets work first (so it is first on the ready list), then
  // waits for event 5, which stream 2 records after its own work.
  session.Send({Memset(a, kChunk, 1, 0, 1), Memset(a + kChunk, kChunk, 2, 0, 2),
                RecordEvent(5, false, 0, 2), WaitEvent(5, 0, 1),
                CopyAcross(a + 2 * kChunk, 0, 1, a + kChunk, 0, kChunk),
                // Device 1's stream 3 waits for device 0's event 6 (after
                // stream 1's copy); device 0's stream 4 copies from device
                // 1 after everything queued there.
                RecordEvent(6, false, 0, 1), WaitEvent(6, 1, 3), Memset(b, kChunk, 3, 1, 3),
                CopyAcross(a + 3 * kChunk, 0, 4, b, 1, kChunk)});
  std::vector<v1::Completion> errors = session.RunAndSync({});
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.seq() << ": " << e.message();
  EXPECT_EQ(session.Call(CopyFrom(a + 3 * kChunk - 4, 4, 0, 1)).data(), std::string(4, '\x02'));
  EXPECT_EQ(session.Call(CopyFrom(a + 4 * kChunk - 4, 4, 0, 4)).data(), std::string(4, '\x03'));
  EXPECT_TRUE(session.End().ok());
}

// A client that sends commands owing replies and never reads them: its
// replies wait in its session's outbox (written by the session's own
// writer thread), so the device's only worker goes on serving the other
// session; once more than kMaxUnreadReplyBytes wait, flagosd ends the
// non-reading session with RESOURCE_EXHAUSTED and frees what it held.
TEST_F(OneWorkerTest, AClientThatDoesNotReadItsRepliesHoldsNoWorkerAndIsEnded) {
  // Its own connection, so that HTTP/2's connection window is its own.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Flagos::NewStub(channel);
  RawSession deaf(stub.get());
  const uint64_t deaf_id = deaf.Open("deaf");
  constexpr uint64_t kReply = 1 << 20;
  const uint64_t addr = deaf.AllocateOk(kReply);
  // 1 GiB of replies, four times the bound: never read.
  std::vector<v1::Command> downloads;
  for (int i = 0; i < 1024; ++i) downloads.push_back(CopyFrom(addr, kReply));
  deaf.Send(std::move(downloads));

  RawSession other(stub_.get());
  other.Open("other");
  const uint64_t mine = other.AllocateOk(4096);
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(other.RunAndSync({CopyTo(mine, std::string(4096, static_cast<char>(i)))}).empty());
    v1::Completion data = other.Call(CopyFrom(mine, 4096));
    ASSERT_EQ(data.code(), 0) << data.message();
    EXPECT_TRUE(data.data() == std::string(4096, static_cast<char>(i))) << "copy " << i;
  }
  // The deaf session ends: only the other one is left, holding its 4096
  // bytes, once the deaf one also finished closing (a closing session holds
  // its segments until its running commands returned).
  v1::GetStatsResponse stats = Stats();
  while (stats.sessions_size() != 1 || stats.closing_sessions_size() != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stats = Stats();
  }
  EXPECT_EQ(stats.sessions(0).client(), "other");
  EXPECT_EQ(stats.devices(0).used_memory(), 4096u);

  v1::ServerMessage reply;
  while (deaf.stream().Read(&reply)) {
  }
  const grpc::Status end = deaf.stream().Finish();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << end.error_message();
  EXPECT_EQ(end.error_message(),
            absl::StrCat("session ", deaf_id,
                         " has more than 268435456 bytes of replies it has not read "
                         "(kMaxUnreadReplyBytes): the client does not read its replies; flagosd "
                         "ended the session and freed what it held. Read the session stream (and "
                         "the sync channel) while commands that owe replies are outstanding"));
  EXPECT_TRUE(other.End().ok());
  EXPECT_EQ(StatsAfterSessionsEnd().devices(0).used_memory(), 0u);
}

// ------------------------------------------------- a client that leaves mid-kernel

// One session at a time, and linalg_vector_norm over a 4-byte segment viewed
// as kElements elements with stride 0 (issue 10, finding 8), into a 0-d
// output: a call at the per-op element bound, 1 to 4 s of kernel on this
// project's 2-core machines (the test asserts ordering, not durations).
class ClosingSessionTest : public ServerTest {
 protected:
  static constexpr int64_t kElements = int64_t{1} << 31;
  void Configure(ServerOptions* options) override {
    options->max_sessions = 1;
    options->max_op_elements = kElements + 1;
  }
};

// The client cancels its stream while its kernel runs: its slot is free at
// once (a new session opens at --max-sessions=1 while the kernel still
// runs, GetStats listing the old session as closing), its memory stays held
// and counted until the kernel returned, then is freed; the new session's
// bytes are untouched by the old kernel's result, and the daemon serves on.
TEST_F(ClosingSessionTest, AClientLeavingMidKernelFreesItsSlotAtOnceAndItsMemoryAfter) {
  constexpr uint64_t kOutBytes = 4096;
  auto leaving = std::make_unique<RawSession>(stub_.get());
  const uint64_t leaving_id = leaving->Open("leaving");
  const uint64_t in = leaving->AllocateOk(4);
  const uint64_t out = leaving->AllocateOk(kOutBytes);
  // The copy has run: the one command that runs next is the norm.
  EXPECT_TRUE(leaving
                  ->RunAndSync({CopyTo(in, FloatBytes({0.5f})),
                                RegisterOp(1, "aten::linalg_vector_norm", "")})
                  .empty());
  leaving->Send({Op(1, {TensorValue(StrideZeroRef(in, kElements))}, {Ref(out, {})})});
  v1::GetStatsResponse stats = StatsUntil([](const v1::GetStatsResponse& s) {
    return s.sessions_size() == 1 && s.sessions(0).running_commands() == 1;
  });
  ASSERT_EQ(stats.sessions_size(), 1);
  ASSERT_EQ(stats.sessions(0).running_commands(), 1u) << "the norm never started";
  const uint64_t leaving_bytes = stats.sessions(0).segment_bytes();
  EXPECT_EQ(leaving_bytes, 4 + kOutBytes);

  leaving->context().TryCancel();  // as if the process died mid-kernel
  EXPECT_EQ(leaving->End().error_code(), grpc::StatusCode::CANCELLED);
  stats = StatsUntil([](const v1::GetStatsResponse& s) { return s.sessions_size() == 0; });
  ASSERT_EQ(stats.sessions_size(), 0) << "the cancelled session is still live";

  RawSession next(stub_.get());
  const uint64_t next_id = next.Open("next");
  EXPECT_NE(next_id, 0u) << "no new session at --max-sessions=1 while the old one closes";
  const uint64_t addr = next.AllocateOk(kOutBytes);
  const std::string pattern(kOutBytes, '\x5a');
  next.Send({CopyTo(addr, pattern)});
  EXPECT_EQ(next.Call(CopyFrom(addr, kOutBytes)).data(), pattern);
  stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).id(), next_id);
  // The old kernel still runs now, after the new session opened.
  ASSERT_EQ(stats.closing_sessions_size(), 1)
      << "the old session's kernel returned before the new session opened: raise kElements";
  const v1::SessionInfo& closing = stats.closing_sessions(0);
  EXPECT_EQ(closing.id(), leaving_id);
  ASSERT_EQ(closing.running_commands(), 1u)
      << "the old session's kernel returned before the new session opened: raise kElements";
  EXPECT_EQ(closing.segment_bytes(), leaving_bytes);
  EXPECT_EQ(stats.devices(0).used_memory(), leaving_bytes + kOutBytes);

  // Once the kernel returned the old session is gone with its memory (the
  // poll gives up after 120 s: a loaded machine is slow, not wrong).
  stats = StatsUntil(
      [](const v1::GetStatsResponse& s) { return s.closing_sessions_size() == 0; }, 12000);
  ASSERT_EQ(stats.closing_sessions_size(), 0);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.devices(0).used_memory(), kOutBytes);
  EXPECT_EQ(stats.sessions(0).segment_bytes(), kOutBytes);
  // The old kernel wrote its result into its own segment, not into the new
  // session's bytes.
  EXPECT_EQ(next.Call(CopyFrom(addr, kOutBytes)).data(), pattern);
  next.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  ExpectNormServed(next, 1);
  EXPECT_TRUE(next.End().ok());
  stats = StatsAfterSessionsEnd();
  EXPECT_EQ(stats.sessions_size(), 0);
  EXPECT_EQ(stats.closing_sessions_size(), 0);
  EXPECT_EQ(stats.devices(0).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
  // And a session opens again.
  RawSession after(stub_.get());
  after.Open("after");
  after.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  ExpectNormServed(after, 1);
}

}  // namespace
}  // namespace flagos::daemon
