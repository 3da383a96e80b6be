#include "execution/worker_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

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

TEST(WorkerPoolTest, AJobGoesToThePreferredWorkerWhenItIsIdle) {
  WorkerPool pool("test", 4);
  std::atomic<int> first{WorkerPool::kAnyWorker};
  absl::Notification ran_first;
  pool.Schedule([&] {
    first = pool.CurrentWorker();
    ran_first.Notify();
  });
  ran_first.WaitForNotification();
  ASSERT_GE(first.load(), 0);
  ASSERT_LT(first.load(), 4);
  EXPECT_EQ(pool.CurrentWorker(), WorkerPool::kAnyWorker);  // not a worker thread
  // Each of many jobs, scheduled once the previous one finished and its
  // worker is idle again (a job signals before its worker goes idle: wait
  // until the pool has every worker idle), runs on the worker asked for.
  for (int i = 0; i < 50; ++i) {
    while (pool.idle_workers() != 4) std::this_thread::yield();
    std::atomic<int> ran_on{WorkerPool::kAnyWorker};
    absl::Notification done;
    pool.Schedule(
        [&] {
          ran_on = pool.CurrentWorker();
          done.Notify();
        },
        first.load());
    done.WaitForNotification();
    EXPECT_EQ(ran_on.load(), first.load());
  }
}

TEST(WorkerPoolTest, AJobGoesToTheWorkerThatWentIdleLast) {
  WorkerPool pool("test", 3);
  while (pool.idle_workers() != 3) std::this_thread::yield();
  std::atomic<int> last{WorkerPool::kAnyWorker};
  absl::Notification done;
  pool.Schedule([&] {
    last = pool.CurrentWorker();
    done.Notify();
  });
  done.WaitForNotification();
  while (pool.idle_workers() != 3) std::this_thread::yield();
  for (int i = 0; i < 20; ++i) {
    std::atomic<int> ran_on{WorkerPool::kAnyWorker};
    absl::Notification again;
    pool.Schedule([&] {
      ran_on = pool.CurrentWorker();
      again.Notify();
    });
    again.WaitForNotification();
    EXPECT_EQ(ran_on.load(), last.load());
    while (pool.idle_workers() != 3) std::this_thread::yield();
  }
}

TEST(WorkerPoolTest, HasTheWorkersItWasGivenAndAtLeastOne) {
  EXPECT_EQ(WorkerPool("test", 3).workers(), 3);
  EXPECT_EQ(WorkerPool("test", 0).workers(), 1);
  EXPECT_GE(DefaultWorkersPerDevice(), 4);
}

// Each of `n` jobs waits (inside a Blocking scope) until all `n` run at
// once, as the ranks of one collective wait for each other: on a pool of
// fewer workers that needs the spares Blocking stands in.
TEST(WorkerPoolTest, JobsWaitingForEachOtherInBlockingScopesAllRunOnOneWorker) {
  constexpr int kJobs = 12;
  WorkerPool pool("test", 1);
  absl::Mutex mu;
  int arrived = 0;
  absl::BlockingCounter done(kJobs);
  std::atomic<int> most_blocked{0};
  for (int i = 0; i < kJobs; ++i) {
    pool.Schedule([&] {
      WorkerPool::Blocking blocking;
      EXPECT_TRUE(blocking.ok());
      absl::MutexLock lock(&mu);
      ++arrived;
      most_blocked = std::max(most_blocked.load(), pool.blocked());
      mu.Await(absl::Condition(+[](int* n) { return *n == kJobs; }, &arrived));
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(most_blocked.load(), kJobs);
  // The spares retire once the jobs no longer wait: back to the one worker.
  while (pool.threads() != 1) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.blocked(), 0);
  EXPECT_EQ(pool.workers(), 1);
  // And it still runs jobs (on a retired spare's slot or the worker).
  absl::Notification again;
  pool.Schedule([&] { again.Notify(); });
  again.WaitForNotification();
}

TEST(WorkerPoolTest, ABlockingScopeOffAWorkerThreadDoesNothing) {
  WorkerPool pool("test", 2);
  WorkerPool::Blocking blocking;
  EXPECT_TRUE(blocking.ok());
  EXPECT_EQ(pool.blocked(), 0);
  EXPECT_EQ(pool.threads(), 2);
}

TEST(WorkerPoolTest, BlockingScopesBeyondTheLimitAreRefused) {
  WorkerPool pool("test", 1);
  absl::Notification release;
  absl::BlockingCounter waiting(WorkerPool::kMaxBlocked);
  absl::BlockingCounter finished(WorkerPool::kMaxBlocked + 1);
  std::atomic<int> refused{0};
  for (int i = 0; i < WorkerPool::kMaxBlocked; ++i) {
    pool.Schedule([&] {
      WorkerPool::Blocking blocking;
      EXPECT_TRUE(blocking.ok());
      waiting.DecrementCount();
      release.WaitForNotification();
      finished.DecrementCount();
    });
  }
  waiting.Wait();
  absl::Notification checked;
  pool.Schedule([&] {
    WorkerPool::Blocking blocking;
    if (!blocking.ok()) ++refused;
    checked.Notify();
    finished.DecrementCount();
  });
  checked.WaitForNotification();  // it runs: the pool had a worker for it
  EXPECT_EQ(refused.load(), 1);
  release.Notify();
  finished.Wait();
  EXPECT_EQ(refused.load(), 1);
}

}  // namespace
}  // namespace flagos::daemon
