#include "worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"

namespace flagos::daemon {
namespace {

TEST(WorkerPoolTest, RunsEveryScheduledJob) {
  std::atomic<int> ran{0};
  absl::BlockingCounter done(1000);
  WorkerPool pool("test", 3);
  for (int i = 0; i < 1000; ++i) {
    pool.Schedule([&] {
      ++ran;
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(ran.load(), 1000);
}

TEST(WorkerPoolTest, OneWorkerRunsJobsInScheduleOrder) {
  std::vector<int> order;
  absl::Notification done;
  WorkerPool pool("test", 1);
  for (int i = 0; i < 100; ++i) pool.Schedule([&order, i] { order.push_back(i); });
  pool.Schedule([&done] { done.Notify(); });
  done.WaitForNotification();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerPoolTest, AJobThatThrowsDoesNotStopItsWorker) {
  absl::Notification done;
  WorkerPool pool("test", 1);
  pool.Schedule([] { throw std::runtime_error("boom"); });
  pool.Schedule([&done] { done.Notify(); });
  done.WaitForNotification();
  EXPECT_TRUE(done.HasBeenNotified());
}

TEST(WorkerPoolTest, DestructionDropsJobsNotStartedAndWaitsForTheRunningOne) {
  absl::Notification started;
  absl::Notification release;
  std::atomic<int> ran{0};
  auto capture = std::make_shared<int>(0);
  auto pool = std::make_unique<WorkerPool>("test", 1);
  pool->Schedule([&] {
    started.Notify();
    release.WaitForNotification();
    ++ran;
  });
  for (int i = 0; i < 5; ++i) pool->Schedule([capture, &ran] { ++ran; });
  started.WaitForNotification();
  EXPECT_EQ(capture.use_count(), 6);
  std::thread destroyer([&pool] { pool.reset(); });
  // The queued jobs are dropped (their captures released) before the
  // running one finishes.
  while (capture.use_count() != 1) std::this_thread::yield();
  release.Notify();
  destroyer.join();
  EXPECT_EQ(ran.load(), 1);
}

TEST(WorkerPoolTest, HasTheWorkersItWasGivenAndAtLeastOne) {
  EXPECT_EQ(WorkerPool("test", 3).workers(), 3);
  EXPECT_EQ(WorkerPool("test", 0).workers(), 1);
  EXPECT_GE(DefaultWorkersPerDevice(), 4);
}

}  // namespace
}  // namespace flagos::daemon
