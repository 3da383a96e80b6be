// ReplyWriter on its own: a fake stream (a function that records or blocks)
// and a socketpair as the sync channel.
#include "transport/reply_writer.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "flagos/v1/wire.h"

namespace flagos::daemon {
namespace {

v1::Completion Done(uint64_t seq, std::string data = "") {
  v1::Completion completion;
  completion.set_seq(seq);
  completion.set_data(std::move(data));
  return completion;
}

// The session stream: records what was written; blocks while `held`.
struct FakeStream {
  absl::Mutex mu;
  bool held ABSL_GUARDED_BY(mu) = false;
  bool broken ABSL_GUARDED_BY(mu) = false;
  std::vector<uint64_t> seqs ABSL_GUARDED_BY(mu);
  int messages ABSL_GUARDED_BY(mu) = 0;
  std::vector<absl::Status> ends ABSL_GUARDED_BY(mu);

  ReplyWriter::WriteFn Write() {
    return [this](const v1::ServerMessage& message) {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](FakeStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return !s->held || s->broken; },
          this));
      if (broken) return false;
      ++messages;
      for (const v1::Completion& completion : message.completions()) {
        seqs.push_back(completion.seq());
      }
      return true;
    };
  }
  ReplyWriter::EndFn End() {
    return [this](const absl::Status& status) {
      absl::MutexLock lock(&mu);
      ends.push_back(status);
      broken = true;  // as a cancelled stream: a blocked Write returns false
    };
  }
};

TEST(ReplyWriterTest, StreamCompletionsArriveInOrderBatchedWhenSeveralWait) {
  FakeStream stream;
  {
    absl::MutexLock lock(&stream.mu);
    stream.held = true;  // the first write blocks: the others wait together
  }
  ReplyWriter writer(1, stream.Write(), stream.End());
  for (uint64_t seq = 1; seq <= 100; ++seq) writer.PostCompletion(Done(seq));
  {
    absl::MutexLock lock(&stream.mu);
    stream.held = false;
  }
  writer.Finish();
  absl::MutexLock lock(&stream.mu);
  std::vector<uint64_t> expected;
  for (uint64_t seq = 1; seq <= 100; ++seq) expected.push_back(seq);
  EXPECT_EQ(stream.seqs, expected);
  // The first write (one or more) blocked; the rest went as one message.
  EXPECT_LE(stream.messages, 2);
  EXPECT_TRUE(stream.ends.empty());
}

TEST(ReplyWriterTest, PostingPastTheBoundEndsTheSessionOnceWithoutBlocking) {
  FakeStream stream;
  {
    absl::MutexLock lock(&stream.mu);
    stream.held = true;  // a client that never reads
  }
  ReplyWriter writer(7, stream.Write(), stream.End(), /*max_unread_bytes=*/1 << 20);
  for (uint64_t seq = 1; seq <= 64; ++seq) {
    writer.PostCompletion(Done(seq, std::string(64 << 10, 'x')));
  }
  writer.Finish();
  EXPECT_EQ(writer.unread_bytes(), 0u) << "everything pending is dropped";
  absl::MutexLock lock(&stream.mu);
  ASSERT_EQ(stream.ends.size(), 1u);
  EXPECT_EQ(stream.ends[0], ReplyWriter::UnreadRepliesExceeded(7, 1 << 20));
  EXPECT_EQ(stream.ends[0].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(stream.seqs.empty());
}

TEST(ReplyWriterTest, SyncFramesTheSocketCannotTakeNowFollowInOrder) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FakeStream stream;
  ReplyWriter writer(1, stream.Write(), stream.End());
  // Far more than a socket buffer, posted before anyone reads.
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    writer.PostSyncFrame(fds[0], v1::EncodeFrame(Done(seq, std::string(1 << 20, 'a' + seq))));
  }
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    std::string body;
    ASSERT_EQ(v1::ReadFrame(fds[1], 2 << 20, &body), v1::FrameResult::kOk);
    v1::Completion completion;
    ASSERT_TRUE(completion.ParseFromString(body));
    EXPECT_EQ(completion.seq(), seq);
    EXPECT_TRUE(completion.data() == std::string(1 << 20, 'a' + seq));
  }
  writer.Finish();
  close(fds[0]);
  close(fds[1]);
}

TEST(ReplyWriterTest, StopDropsWhatIsPendingAndWritesNothingAfter) {
  FakeStream stream;
  {
    absl::MutexLock lock(&stream.mu);
    stream.held = true;
  }
  ReplyWriter writer(1, stream.Write(), stream.End());
  writer.PostCompletion(Done(1));
  writer.PostCompletion(Done(2));
  {
    absl::MutexLock lock(&stream.mu);
    stream.broken = true;  // the stream is cancelled: the blocked write fails
  }
  writer.Stop();
  writer.PostCompletion(Done(3));
  absl::MutexLock lock(&stream.mu);
  EXPECT_TRUE(stream.seqs.empty());
  EXPECT_EQ(writer.unread_bytes(), 0u);
}

}  // namespace
}  // namespace flagos::daemon
