#include "stream_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <stdexcept>
#include <vector>

#include "absl/synchronization/notification.h"

namespace flagos::daemon {
namespace {

TEST(StreamQueueTest, TasksRunInPushOrder) {
  std::vector<int> order;
  absl::Notification done;
  {
    StreamQueue queue("test");
    for (int i = 0; i < 100; ++i) queue.Push([&order, i] { order.push_back(i); });
    queue.Push([&done] { done.Notify(); });
    done.WaitForNotification();
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(StreamQueueTest, PushAllRunsAfterEarlierPushesInOrder) {
  std::vector<int> order;
  absl::Notification done;
  {
    StreamQueue queue("test");
    queue.Push([&order] { order.push_back(0); });
    std::vector<StreamQueue::Task> tasks;
    for (int i = 1; i < 50; ++i) tasks.push_back([&order, i] { order.push_back(i); });
    queue.PushAll(&tasks);
    EXPECT_TRUE(tasks.empty());
    queue.Push([&done] { done.Notify(); });
    done.WaitForNotification();
  }
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(StreamQueueTest, PushAllAfterStopDropsTheTasks) {
  std::atomic<int> ran{0};
  StreamQueue queue("test");
  queue.Stop();
  std::vector<StreamQueue::Task> tasks;
  for (int i = 0; i < 3; ++i) tasks.push_back([&ran] { ++ran; });
  queue.PushAll(&tasks);
  EXPECT_TRUE(tasks.empty());
  EXPECT_EQ(queue.pending(), 0u);
  EXPECT_EQ(ran.load(), 0);
}

TEST(StreamQueueTest, StopDropsTasksNotYetStarted) {
  std::atomic<int> ran{0};
  absl::Notification started;
  absl::Notification release;
  StreamQueue queue("test");
  queue.Push([&] {
    started.Notify();
    release.WaitForNotification();
    ++ran;
  });
  for (int i = 0; i < 10; ++i) queue.Push([&ran] { ++ran; });
  started.WaitForNotification();
  EXPECT_EQ(queue.pending(), 11u);
  std::thread stopper([&queue] { queue.Stop(); });
  // Stop drops the queued tasks at once, then waits for the running one.
  while (queue.pending() != 1) std::this_thread::yield();
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran.load(), 1);
  queue.Push([&ran] { ++ran; });  // dropped after Stop
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(queue.pending(), 0u);
}

TEST(StreamQueueTest, ThrowingTaskDoesNotStopTheQueue) {
  absl::Notification done;
  StreamQueue queue("test");
  queue.Push([] { throw std::runtime_error("boom"); });
  queue.Push([&done] { done.Notify(); });
  done.WaitForNotification();
  EXPECT_TRUE(done.HasBeenNotified());
}

}  // namespace
}  // namespace flagos::daemon
