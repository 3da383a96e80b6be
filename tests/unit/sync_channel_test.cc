// The daemon's SyncChannel on its own, over a socketpair with raw payloads
// (a TCP client's channel): which replies it answers (up to kMaxSyncWaiting
// commands waiting at once), the raw bytes after a reply's frame, and
// uploads read into the buffers of earlier ones.
#include "transport/sync_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "flagos/v1/wire.h"

namespace flagos::daemon {
namespace {

class SyncChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    client_ = fds[0];
    channel_.Start(
        fds[1],
        [this](v1::SyncRequest& request) {
          absl::MutexLock lock(&mu_);
          requests_.push_back(std::move(request));
          return true;
        },
        /*raw_payloads=*/true);
  }
  void TearDown() override {
    channel_.Stop();
    channel_.CloseFd();
    close(client_);
  }

  // The next reply on the client's end, its raw payload (if any) in its data.
  v1::Completion ReadReply() {
    std::string body;
    EXPECT_EQ(v1::ReadFrame(client_, 1 << 20, &body), v1::FrameResult::kOk);
    v1::Completion completion;
    EXPECT_TRUE(completion.ParseFromString(body));
    if (completion.payload_bytes() > 0) {
      std::string bytes(completion.payload_bytes(), '\0');
      EXPECT_TRUE(v1::ReadBytes(client_, bytes.data(), bytes.size()));
      completion.set_data(std::move(bytes));
    }
    return completion;
  }

  // Sends a copy_to_device request with `payload` raw after it and waits
  // until the channel has handed it over; returns its data.
  std::string Upload(uint64_t seq, const std::string& payload) {
    v1::SyncRequest request;
    request.mutable_command()->set_seq(seq);
    request.mutable_command()->mutable_copy_to_device()->set_addr(4096);
    request.set_payload_bytes(payload.size());
    EXPECT_TRUE(v1::WriteFrameAndPayload(client_, v1::EncodeFrame(request), payload.data(),
                                         payload.size()));
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](SyncChannelTest* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
          return !t->requests_.empty();
        },
        this));
    std::string data =
        std::move(*requests_.front().mutable_command()->mutable_copy_to_device()->mutable_data());
    requests_.erase(requests_.begin());
    return data;
  }

  ReplyWriter replies_{1, [](const v1::ServerMessage&) { return true; },
                       [](const absl::Status&) {}};
  SyncChannel channel_{1, &replies_};
  int client_ = -1;
  absl::Mutex mu_;
  std::vector<v1::SyncRequest> requests_ ABSL_GUARDED_BY(mu_);
};

v1::Completion Done(uint64_t seq) {
  v1::Completion completion;
  completion.set_seq(seq);
  return completion;
}

TEST_F(SyncChannelTest, TwoCommandsWaitAtOnceAThirdIsRefusedTheirRepliesGoOnTheChannel) {
  ASSERT_TRUE(channel_.Expect(5));
  ASSERT_TRUE(channel_.Expect(6));
  EXPECT_FALSE(channel_.Expect(7));  // kMaxSyncWaiting is 2

  // A reply to a command that does not wait here belongs on the stream.
  v1::Completion other = Done(9);
  EXPECT_FALSE(channel_.Answer(other));

  // Answered in the order they come, each once; a slot freed is usable again.
  v1::Completion six = Done(6);
  OwnedBytes bytes = OwnedBytes::ForOverwrite(3 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes.data()[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(channel_.Answer(six, &bytes));
  v1::Completion again = Done(6);
  EXPECT_FALSE(channel_.Answer(again));
  ASSERT_TRUE(channel_.Expect(7));
  v1::Completion five = Done(5);
  five.set_data("held in the message");  // raw too, from the message's data
  ASSERT_TRUE(channel_.Answer(five));
  v1::Completion seven = Done(7);
  ASSERT_TRUE(channel_.Answer(seven));

  const v1::Completion first = ReadReply();
  EXPECT_EQ(first.seq(), 6u);
  ASSERT_EQ(first.data().size(), size_t{3} << 20);
  for (size_t i = 0; i < first.data().size(); i += 4099) {
    ASSERT_EQ(first.data()[i], static_cast<char>(i * 7)) << i;
  }
  const v1::Completion second = ReadReply();
  EXPECT_EQ(second.seq(), 5u);
  EXPECT_EQ(second.data(), "held in the message");
  const v1::Completion third = ReadReply();
  EXPECT_EQ(third.seq(), 7u);
  EXPECT_TRUE(third.data().empty());
}

TEST_F(SyncChannelTest, AnUploadReadIntoAnEarlierUploadsBufferHasExactlyItsOwnBytes) {
  const std::string a(2 << 20, 'a');
  std::string first = Upload(1, a);
  EXPECT_EQ(first, a);
  channel_.RecyclePayload(std::move(first));  // the device has read it

  // Shorter than the pooled buffer: its own length, none of the old bytes.
  const std::string b((3 << 19) + 1, 'b');
  std::string second = Upload(2, b);
  EXPECT_EQ(second, b);
  channel_.RecyclePayload(std::move(second));

  // Longer than it: the rest is read too.
  std::string c(3 << 20, 'c');
  c[c.size() - 1] = 'z';
  EXPECT_EQ(Upload(3, c), c);

  // Small buffers are not kept; an upload without a pooled buffer is whole.
  channel_.RecyclePayload(std::string(100, 'x'));
  const std::string d(1000, 'd');
  EXPECT_EQ(Upload(4, d), d);
}

}  // namespace
}  // namespace flagos::daemon
