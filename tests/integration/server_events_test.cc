// Events and stream queries over the Session stream: record and wait across streams and
// devices, query and synchronize, elapsed time, unknown events, and the events a session
// leaves destroyed at its end.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

// ------------------------------------------------------------------ events

v1::Command QueryEvent(uint64_t event) {
  v1::Command command;
  command.mutable_query_event()->set_event(event);
  return command;
}

v1::Command SynchronizeEvent(uint64_t event) {
  v1::Command command;
  command.mutable_synchronize_event()->set_event(event);
  return command;
}

v1::Command ElapsedTime(uint64_t start, uint64_t end) {
  v1::Command command;
  command.mutable_elapsed_time()->set_start(start);
  command.mutable_elapsed_time()->set_end(end);
  return command;
}

v1::Command DestroyEvent(uint64_t event) {
  v1::Command command;
  command.mutable_destroy_event()->set_event(event);
  return command;
}

v1::Command QueryStream(int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_query_stream();
  return command;
}

v1::Command SyncStream(int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_sync()->set_stream_only(true);
  return command;
}

TEST_F(ServerTest, WaitEventOrdersAnotherStreamAfterTheRecord) {
  RawSession session(stub_.get());
  session.Open();
  constexpr uint64_t kBytes = 8 << 20;
  const uint64_t addr = session.AllocateOk(kBytes);
  // Stream 1 writes 8 MiB, then records event 7; stream 2 waits for it and
  // reads the last bytes: it must see them written.
  session.Send({CopyTo(addr, std::string(kBytes, 'w'), 0, 1), RecordEvent(7, false, 0, 1),
                WaitEvent(7, 0, 2)});
  v1::Completion tail = session.Call(CopyFrom(addr + kBytes - 8, 8, 0, 2));
  ASSERT_EQ(tail.code(), 0) << tail.message();
  EXPECT_EQ(tail.data(), std::string(8, 'w'));
  v1::Completion query = session.Call(QueryEvent(7));
  ASSERT_EQ(query.code(), 0) << query.message();
  EXPECT_TRUE(query.ready());
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, WaitEventAcrossDevices) {
  RawSession session(stub_.get());
  session.Open();
  constexpr uint64_t kBytes = 8 << 20;
  const uint64_t src = session.AllocateOk(kBytes, 1);
  const uint64_t dst = session.AllocateOk(kBytes, 0);
  v1::Command copy;
  copy.set_device(0);
  copy.set_stream(3);
  copy.mutable_copy_device_to_device()->set_src(src);
  copy.mutable_copy_device_to_device()->set_src_device(1);
  copy.mutable_copy_device_to_device()->set_dst(dst);
  copy.mutable_copy_device_to_device()->set_nbytes(kBytes);
  session.Send({CopyTo(src, std::string(kBytes, 'x'), 1, 5), RecordEvent(3, false, 1, 5),
                WaitEvent(3, 0, 3), copy});
  v1::Completion data = session.Call(CopyFrom(dst + kBytes - 4, 4, 0, 3));
  ASSERT_EQ(data.code(), 0) << data.message();
  EXPECT_EQ(data.data(), "xxxx");
}

TEST_F(ServerTest, QueryAndSynchronizeEvents) {
  RawSession session(stub_.get());
  session.Open();
  // An event never recorded counts as complete; synchronizing it returns.
  v1::Completion never = session.Call(QueryEvent(41));
  ASSERT_EQ(never.code(), 0) << never.message();
  EXPECT_TRUE(never.ready());
  EXPECT_EQ(session.Call(SynchronizeEvent(41)).code(), 0);
  // Waiting for an event never recorded is a no-op.
  EXPECT_TRUE(session.RunAndSync({WaitEvent(41, 0, 1)}).empty());

  const uint64_t addr = session.AllocateOk(4 << 20);
  session.Send({CopyTo(addr, std::string(4 << 20, 'a'), 0, 2), RecordEvent(42, false, 0, 2)});
  v1::Completion done = session.Call(SynchronizeEvent(42));
  ASSERT_EQ(done.code(), 0) << done.message();
  v1::Completion query = session.Call(QueryEvent(42));
  EXPECT_TRUE(query.ready());
  // After synchronize_event the record's earlier work is visible.
  EXPECT_EQ(session.Call(CopyFrom(addr + (4 << 20) - 1, 1, 0, 2)).data(), "a");
}

TEST_F(ServerTest, StreamQueryAndStreamSync) {
  RawSession session(stub_.get());
  session.Open();
  // A stream never used has no work.
  v1::Completion idle = session.Call(QueryStream(1, 6));
  ASSERT_EQ(idle.code(), 0) << idle.message();
  EXPECT_TRUE(idle.ready());
  EXPECT_EQ(session.Call(SyncStream(1, 6)).code(), 0);

  const uint64_t addr = session.AllocateOk(1 << 20, 1);
  // Right after a stream sync, or a copy the client waited for, the stream
  // is idle.
  for (int i = 0; i < 20; ++i) {
    session.Send({CopyTo(addr, std::string(1 << 20, 's'), 1, 6)});
    v1::Completion synced = session.Call(SyncStream(1, 6));
    ASSERT_EQ(synced.code(), 0) << synced.message();
    v1::Completion query = session.Call(QueryStream(1, 6));
    ASSERT_EQ(query.code(), 0) << query.message();
    EXPECT_TRUE(query.ready()) << "after sync " << i;
    ASSERT_EQ(session.Call(CopyFrom(addr, 4, 1, 6)).data(), "ssss");
    EXPECT_TRUE(session.Call(QueryStream(1, 6)).ready()) << "after copy " << i;
  }
  // stream_only needs a real device.
  v1::Completion bad = session.Call(SyncStream(-1, 0));
  EXPECT_EQ(bad.code(), kInvalidArgument);
}

TEST_F(ServerTest, ElapsedTimeBetweenTimingEvents) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(8 << 20);
  session.Send({RecordEvent(1, true), CopyTo(addr, std::string(8 << 20, 't')),
                RecordEvent(2, true)});
  v1::Completion elapsed = session.Call(ElapsedTime(1, 2));
  ASSERT_EQ(elapsed.code(), 0) << elapsed.message();
  EXPECT_GE(elapsed.elapsed_ms(), 0.0);
  // Reversed, the same interval is negative or zero.
  v1::Completion reversed = session.Call(ElapsedTime(2, 1));
  ASSERT_EQ(reversed.code(), 0) << reversed.message();
  EXPECT_EQ(reversed.elapsed_ms(), -elapsed.elapsed_ms());
}

TEST_F(ServerTest, ElapsedTimeWithoutTimingIsAnError) {
  RawSession session(stub_.get());
  session.Open();
  session.Send({RecordEvent(1, true), RecordEvent(2, false)});
  v1::Completion elapsed = session.Call(ElapsedTime(1, 2));
  EXPECT_EQ(elapsed.code(), kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(elapsed.message(), "event 2 was recorded without timing"))
      << elapsed.message();
  EXPECT_TRUE(absl::StrContains(elapsed.message(), "enable_timing=True")) << elapsed.message();
}

TEST_F(ServerTest, UnknownEventsAreErrors) {
  RawSession session(stub_.get());
  session.Open();
  session.Send({RecordEvent(1, true)});
  v1::Completion elapsed = session.Call(ElapsedTime(1, 99));
  EXPECT_EQ(elapsed.code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(elapsed.message(), "event 99 has not been recorded"))
      << elapsed.message();
  // destroy_event owes no reply: its error comes as a completion of its own.
  std::vector<v1::Completion> errors = session.RunAndSync({DestroyEvent(99)});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "event 99 does not exist"))
      << errors[0].message();
  // Event id 0 is never an event.
  errors = session.RunAndSync({RecordEvent(0), WaitEvent(0)});
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  EXPECT_EQ(errors[1].code(), kInvalidArgument);
  EXPECT_EQ(session.Call(QueryEvent(0)).code(), kInvalidArgument);
  // A destroyed event is forgotten: elapsed_time no longer knows it.
  EXPECT_TRUE(session.RunAndSync({DestroyEvent(1)}).empty());
  EXPECT_EQ(session.Call(ElapsedTime(1, 1)).code(), kNotFound);
  // The session goes on.
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, EndOfSessionDestroysItsEvents) {
  {
    RawSession session(stub_.get());
    session.Open();
    session.Send({RecordEvent(1, true), RecordEvent(2, false, 0, 4), RecordEvent(3, true, 1, 0)});
    // Every record has run (and made its backend event) before the end: a
    // record still queued when the session ends is dropped, not run.
    for (uint64_t event : {1, 2, 3}) {
      EXPECT_EQ(session.Call(SynchronizeEvent(event)).code(), 0) << "event " << event;
    }
    EXPECT_TRUE(session.End().ok());
  }
  StatsAfterSessionsEnd();
  // The CPU backend numbers events per device from 1: every event the
  // session created is gone. A record still held by a task that ran on a
  // worker goes when that task's closure does, which may be just after the
  // session left the registry: look again for a while.
  std::vector<std::string> live;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    live.clear();
    for (int device = 0; device < 2; ++device) {
      absl::StatusOr<EventHandle> next = backend_->runtime().CreateEvent(device, false);
      ASSERT_TRUE(next.ok()) << next.status();
      EXPECT_GT(*next, 1u);
      for (EventHandle h = 1; h < *next; ++h) {
        // Events this loop made are destroyed below; only the session's count.
        if (absl::IsNotFound(backend_->runtime().QueryEvent(device, h).status())) continue;
        live.push_back(absl::StrCat("device ", device, " event ", h));
      }
      ASSERT_TRUE(backend_->runtime().DestroyEvent(device, *next).ok());
    }
    if (live.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(live.empty()) << absl::StrJoin(live, ", ");
}

}  // namespace
}  // namespace flagos::daemon
