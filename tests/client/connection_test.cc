// Connection against FakeDaemon: reaching the daemon, the handshake, calls,
// asynchronous errors, batching, the daemon going away, and Close.
#include "flagos/client/connection.h"

#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "fake_daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flagos::client {
namespace {

using ::flagos::testing::FakeDaemon;
using ::flagos::testing::FakeDaemonOptions;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(2);
// What "promptly" means for a failure that must not wait out a timeout.
constexpr absl::Duration kPrompt = absl::Seconds(1);

std::unique_ptr<Connection> OpenOrDie(const FakeDaemon& daemon) {
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(daemon.endpoint(), kTimeout, "connection_test");
  EXPECT_TRUE(connection.ok()) << connection.status();
  return connection.ok() ? *std::move(connection) : nullptr;
}

// Batches leave only when full or flushed (no idle-flush thread), so tests
// of the batch bounds do not depend on timing.
std::unique_ptr<Connection> OpenWithoutIdleFlush(const FakeDaemon& daemon) {
  ConnectionOptions options;
  options.idle_flush = absl::InfiniteDuration();
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(daemon.endpoint(), kTimeout, "connection_test", options);
  EXPECT_TRUE(connection.ok()) << connection.status();
  return connection.ok() ? *std::move(connection) : nullptr;
}

v1::Command Allocate(uint64_t nbytes) {
  v1::Command command;
  command.mutable_allocate()->set_nbytes(nbytes);
  return command;
}

v1::Command Memset(uint64_t addr) {
  v1::Command command;
  command.mutable_memset()->set_addr(addr);
  command.mutable_memset()->set_nbytes(16);
  return command;
}

v1::Command Op(uint32_t op_id, bool want_values = false) {
  v1::Command command;
  command.mutable_op()->set_op_id(op_id);
  command.mutable_op()->set_want_values(want_values);
  return command;
}

TEST(ConnectionOpen, FailsPromptlyWhenTheSocketIsMissing) {
  FakeDaemon daemon;  // only for its temporary directory
  const std::string endpoint = "unix://" + daemon.directory() + "/absent.sock";
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(endpoint, kTimeout, "connection_test");
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(1));
  ASSERT_EQ(connection.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(connection.status().message(),
              AllOf(HasSubstr("flagosd at " + endpoint), HasSubstr("no such socket"),
                    HasSubstr("flagosd --listen=" + endpoint), HasSubstr("FLAGOS_ENDPOINT")));
}

TEST(ConnectionOpen, FailsPromptlyWhenNobodyListensOnTheSocket) {
  FakeDaemon daemon;
  const std::string path = daemon.directory() + "/stale.sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);  // bound, not listening

  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open("unix://" + path, kTimeout, "connection_test");
  EXPECT_LT(absl::Now() - start, kPrompt);
  close(fd);
  unlink(path.c_str());
  ASSERT_EQ(connection.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(connection.status().message(),
              AllOf(HasSubstr("flagosd at unix://" + path), HasSubstr("connection refused")));
}

TEST(ConnectionOpen, ReportsARefusedTcpConnectionWithoutWaitingForTheDeadline) {
  // A bound but not listening port on loopback refuses connections.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(endpoint, kTimeout, "connection_test");
  close(fd);
  ASSERT_EQ(connection.status().code(), absl::StatusCode::kUnavailable);
  // "connection refused", not "no connection within <timeout>": the refusal
  // was seen at once.
  EXPECT_THAT(connection.status().message(),
              AllOf(HasSubstr("flagosd at " + endpoint), HasSubstr("connection refused")));
}

TEST(ConnectionOpen, FailsWithFailedPreconditionOnAnIncompatibleVersion) {
  FakeDaemon daemon(FakeDaemonOptions{.version = 2});
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(daemon.endpoint(), kTimeout, "connection_test");
  ASSERT_EQ(connection.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(connection.status().message(),
              AllOf(HasSubstr(daemon.endpoint()), HasSubstr("protocol version 2"),
                    HasSubstr("versions 1 to 1")));
}

TEST(ConnectionOpen, FailsWithinTheTimeoutWhenTheSessionIsNeverOpened) {
  FakeDaemon daemon(FakeDaemonOptions{.open_sessions = false});
  const absl::Duration timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(daemon.endpoint(), timeout, "connection_test");
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(1));
  ASSERT_EQ(connection.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(connection.status().message(),
              AllOf(HasSubstr(daemon.endpoint()), HasSubstr("did not open the session")));
  EXPECT_TRUE(daemon.WaitForSessionsEnded(1, kTimeout));  // the attempt was cancelled
}

TEST(ConnectionOpen, ReportsTheDaemonAndSendsOpen) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  EXPECT_EQ(connection->endpoint(), daemon.endpoint());
  EXPECT_EQ(connection->info().version(), 1u);
  EXPECT_EQ(connection->info().backend(), "fake");
  EXPECT_EQ(connection->info().devices_size(), 2);
  EXPECT_EQ(connection->session_id(), FakeDaemon::kSessionId);
  const v1::SessionOpen open = daemon.last_open();
  EXPECT_EQ(open.version(), 1u);
  EXPECT_EQ(open.pid(), getpid());
  EXPECT_EQ(open.client(), "connection_test");
  EXPECT_FALSE(connection->closed());
}

TEST(ConnectionCall, ReturnsTheCompletion) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  absl::StatusOr<v1::Completion> first = connection->Call(Allocate(1024), "allocate 1024 bytes");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->seq(), 1u);
  EXPECT_EQ(first->addr(), FakeDaemon::kFirstAddress);
  absl::StatusOr<v1::Completion> second = connection->Call(Allocate(64), "allocate 64 bytes");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->seq(), 2u);
  EXPECT_EQ(second->addr(), FakeDaemon::kFirstAddress + 1024);
}

TEST(ConnectionCall, ReturnsValuesOfAnOpThatWantsThem) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  absl::StatusOr<v1::Completion> completion = connection->Call(Op(5, true), "aten::_local_scalar");
  ASSERT_TRUE(completion.ok()) << completion.status();
  ASSERT_EQ(completion->values_size(), 1);
  EXPECT_EQ(completion->values(0).i(), 5);
}

TEST(ConnectionCall, ReturnsTheCommandsOwnError) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  absl::StatusOr<v1::Completion> completion =
      connection->Call(Allocate(FakeDaemon::kDeviceBytes + 1), "allocate a huge segment");
  ASSERT_EQ(completion.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(completion.status().message(),
              AllOf(HasSubstr("allocate a huge segment"), HasSubstr("fake device out of memory")));
  EXPECT_TRUE(connection->TakeAsyncError().ok());
}

TEST(ConnectionCall, SynchronizesAfterACommandThatOwesNoReply) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  EXPECT_TRUE(connection->Call(Memset(FakeDaemon::kFirstAddress), "memset").ok());
  absl::StatusOr<v1::Completion> failed =
      connection->Call(Op(FakeDaemon::kFailingOpId), "aten::boom");
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.status().message(), HasSubstr("aten::boom"));
  EXPECT_THAT(daemon.seqs(), ElementsAre(1, 2, 3, 4));  // each followed by a sync marker
}

TEST(ConnectionAsyncError, SurfacesOnceAtTheNextSynchronize) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  EXPECT_EQ(connection->Enqueue(Op(1), "aten::fine"), 1u);
  EXPECT_EQ(connection->Enqueue(Op(FakeDaemon::kFailingOpId), "aten::boom.Tensor"), 2u);
  EXPECT_EQ(connection->Enqueue(Op(2), "aten::after"), 3u);
  const absl::Status status = connection->Synchronize(-1);
  ASSERT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(),
            "flagos: aten::boom.Tensor failed asynchronously: fake kernel failed on purpose");
  EXPECT_TRUE(connection->Synchronize(-1).ok());
  EXPECT_TRUE(connection->TakeAsyncError().ok());
}

TEST(ConnectionAsyncError, KeepsTheFirstAndCountsTheRest) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  connection->Enqueue(Op(FakeDaemon::kFailingOpId), "first");
  connection->Enqueue(Op(FakeDaemon::kFailingOpId), "second");
  connection->Enqueue(Op(FakeDaemon::kFailingOpId), "third");
  const absl::Status status = connection->Synchronize(0);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("flagos: first failed"),
                                      HasSubstr("and 2 later asynchronous errors")));
}

TEST(ConnectionAsyncError, IsAvailableFromTakeAsyncErrorAfterAFlush) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  connection->Enqueue(Op(FakeDaemon::kFailingOpId), "");  // no description: named by seq
  ASSERT_TRUE(connection->Flush().ok());
  absl::Status error;
  const absl::Time deadline = absl::Now() + kTimeout;
  while (error.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    error = connection->TakeAsyncError();
  }
  EXPECT_EQ(error.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(error.message(), HasSubstr("flagos: command 1 failed asynchronously"));
  EXPECT_TRUE(connection->TakeAsyncError().ok());
}

TEST(ConnectionBatching, SendsABatchWhenItHoldsMaxBatchCommands) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenWithoutIdleFlush(daemon);
  ASSERT_NE(connection, nullptr);
  for (int i = 0; i < kMaxBatchCommands; ++i) connection->Enqueue(Memset(i), "memset");
  ASSERT_TRUE(daemon.WaitForBatches(1, kTimeout));
  connection->Enqueue(Memset(0), "memset");
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_THAT(daemon.batch_sizes(), ElementsAre(kMaxBatchCommands));
  ASSERT_TRUE(connection->Synchronize(-1).ok());
  EXPECT_THAT(daemon.batch_sizes(), ElementsAre(kMaxBatchCommands, 2));  // memset + sync
  const std::vector<uint64_t> seqs = daemon.seqs();
  ASSERT_EQ(seqs.size(), kMaxBatchCommands + 2u);
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i + 1);
}

TEST(ConnectionBatching, SendsABatchWhenItHoldsMaxBatchBytes) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenWithoutIdleFlush(daemon);
  ASSERT_NE(connection, nullptr);
  const int chunks = static_cast<int>(kMaxBatchBytes / kMaxCopyChunk);
  for (int i = 0; i < chunks; ++i) {
    v1::Command command;
    command.mutable_copy_to_device()->set_addr(FakeDaemon::kFirstAddress + i * kMaxCopyChunk);
    command.mutable_copy_to_device()->set_data(std::string(kMaxCopyChunk, 'x'));
    connection->Enqueue(std::move(command), "copy to device");
  }
  ASSERT_TRUE(daemon.WaitForBatches(1, kTimeout));
  EXPECT_THAT(daemon.batch_sizes(), ElementsAre(chunks));
}

TEST(ConnectionBatching, ABatchLeftIdleIsSentWithoutAFlush) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  connection->Enqueue(Memset(0), "memset");
  ASSERT_TRUE(daemon.WaitForBatches(1, kTimeout)) << "the idle batch was never sent";
  EXPECT_THAT(daemon.batch_sizes(), ElementsAre(1));
  // Again after the flusher went to sleep for want of work.
  absl::SleepFor(absl::Milliseconds(50));
  connection->Enqueue(Memset(1), "memset");
  ASSERT_TRUE(daemon.WaitForBatches(2, kTimeout)) << "the idle batch was never sent";
  EXPECT_THAT(daemon.batch_sizes(), ElementsAre(1, 1));
}

TEST(ConnectionBatching, FlushSendsThePendingBatch) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenWithoutIdleFlush(daemon);
  ASSERT_NE(connection, nullptr);
  connection->Enqueue(Memset(0), "memset");
  connection->Enqueue(Memset(16), "memset");
  ASSERT_TRUE(connection->Flush().ok());
  ASSERT_TRUE(daemon.WaitForBatches(1, kTimeout));
  EXPECT_THAT(daemon.batch_sizes(), ElementsAre(2));
  EXPECT_TRUE(connection->Flush().ok());  // nothing pending: nothing sent
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(daemon.batch_sizes().size(), 1u);
}

TEST(ConnectionLoss, FailsAPendingSynchronizePromptly) {
  FakeDaemon daemon(FakeDaemonOptions{.answer_syncs = false});
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  std::future<absl::Status> pending =
      std::async(std::launch::async, [&] { return connection->Synchronize(-1); });
  ASSERT_TRUE(daemon.WaitForBatches(1, kTimeout));
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);

  const absl::Time shutdown = absl::Now();
  daemon.Shutdown();
  ASSERT_EQ(pending.wait_for(absl::ToChronoSeconds(kPrompt)), std::future_status::ready);
  EXPECT_LT(absl::Now() - shutdown, kPrompt);
  const absl::Status status = pending.get();
  ASSERT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("flagosd at " + daemon.endpoint() + " ended the session"),
                    HasSubstr("device memory is gone")));
  // Afterwards: commands are dropped and every call reports the loss.
  EXPECT_EQ(connection->Enqueue(Memset(0), "memset"), 0u);
  EXPECT_EQ(connection->Call(Allocate(8), "allocate").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(connection->Flush().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(connection->closed());
  EXPECT_TRUE(connection->ended());
  EXPECT_EQ(connection->SessionEnd(), status);
}

TEST(ConnectionLoss, EndedIsSetOnceTheDaemonIsGoneWithoutAnyCall) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  EXPECT_FALSE(connection->ended());
  EXPECT_TRUE(connection->SessionEnd().ok());
  daemon.Shutdown();
  const absl::Time deadline = absl::Now() + kPrompt;
  while (!connection->ended() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(connection->ended());
  EXPECT_EQ(connection->SessionEnd().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(connection->SessionEnd().message(),
              HasSubstr("flagosd at " + daemon.endpoint() + " ended the session"));
}

TEST(ConnectionStats, GetStatsReportsTheDaemon) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  absl::StatusOr<v1::GetStatsResponse> stats = connection->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->backend(), "fake");
  EXPECT_EQ(stats->devices_size(), 2);
  EXPECT_EQ(stats->sessions_total(), 1u);
}

TEST(ConnectionStats, QueryStatsNeedsNoSession) {
  FakeDaemon daemon;
  absl::StatusOr<v1::GetStatsResponse> stats = QueryStats(daemon.endpoint(), kTimeout);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->backend(), "fake");
  EXPECT_EQ(stats->sessions_total(), 0u);
}

TEST(ConnectionStats, QueryStatsFailsOnAMissingSocket) {
  FakeDaemon daemon;
  const std::string endpoint = "unix://" + daemon.directory() + "/absent.sock";
  absl::StatusOr<v1::GetStatsResponse> stats = QueryStats(endpoint, kTimeout);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(stats.status().message(), HasSubstr("no such socket"));
}

TEST(ConnectionClose, SendsPendingCommandsAndEndsTheSession) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  connection->Enqueue(Memset(0), "memset");
  connection->Enqueue(Memset(16), "memset");
  const absl::Time start = absl::Now();
  connection->Close();
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_TRUE(connection->closed());
  EXPECT_TRUE(daemon.WaitForSessionsEnded(1, kTimeout));
  EXPECT_THAT(daemon.seqs(), ElementsAre(1, 2));
}

TEST(ConnectionClose, LaterCallsFailWithFailedPrecondition) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  connection->Close();
  connection->Close();  // idempotent
  EXPECT_EQ(connection->Enqueue(Memset(0), "memset"), 0u);
  const absl::Status status = connection->Synchronize(-1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(daemon.endpoint()), HasSubstr("closed")));
  EXPECT_EQ(connection->Flush().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(connection->GetStats().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(connection->ended());
  EXPECT_EQ(connection->SessionEnd().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ConnectionClose, ReturnsPromptlyAfterTheDaemonIsGone) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  daemon.Shutdown();
  connection->Enqueue(Memset(0), "memset");
  const absl::Time start = absl::Now();
  connection.reset();  // the destructor closes
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST(ConnectionThreads, ConcurrentCallsEachGetTheirOwnCompletion) {
  FakeDaemon daemon;
  std::unique_ptr<Connection> connection = OpenOrDie(daemon);
  ASSERT_NE(connection, nullptr);
  constexpr int kThreads = 8;
  constexpr int kCallsPerThread = 50;
  std::vector<std::vector<uint64_t>> addresses(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        connection->Enqueue(Memset(0), "memset");
        absl::StatusOr<v1::Completion> completion = connection->Call(Allocate(16), "allocate");
        if (completion.ok()) addresses[t].push_back(completion->addr());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<uint64_t> distinct;
  for (const std::vector<uint64_t>& list : addresses) distinct.insert(list.begin(), list.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads * kCallsPerThread));
  const std::vector<uint64_t> seqs = daemon.seqs();
  ASSERT_EQ(seqs.size(), static_cast<size_t>(2 * kThreads * kCallsPerThread));
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i + 1);  // in order on the wire
}

}  // namespace
}  // namespace flagos::client
