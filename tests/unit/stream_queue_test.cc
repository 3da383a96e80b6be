#include "execution/stream_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <stdexcept>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace flagos::daemon {
namespace {

TEST(StreamQueueTest, TasksRunInPushOrder) {
  WorkerPool pool("test", 2);
  std::vector<int> order;
  absl::Notification done;
  {
    StreamQueue queue("test", &pool);
    for (int i = 0; i < 100; ++i) queue.Push([&order, i] { order.push_back(i); });
    queue.Push([&done] { done.Notify(); });
    done.WaitForNotification();
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(StreamQueueTest, PushAllRunsAfterEarlierPushesInOrder) {
  WorkerPool pool("test", 2);
  std::vector<int> order;
  absl::Notification done;
  {
    StreamQueue queue("test", &pool);
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
  WorkerPool pool("test", 2);
  std::atomic<int> ran{0};
  StreamQueue queue("test", &pool);
  queue.Stop();
  std::vector<StreamQueue::Task> tasks;
  for (int i = 0; i < 3; ++i) tasks.push_back([&ran] { ++ran; });
  queue.PushAll(&tasks);
  EXPECT_TRUE(tasks.empty());
  EXPECT_EQ(queue.pending(), 0u);
  EXPECT_EQ(ran.load(), 0);
}

TEST(StreamQueueTest, StopDropsTasksNotYetStarted) {
  WorkerPool pool("test", 2);
  std::atomic<int> ran{0};
  absl::Notification started;
  absl::Notification release;
  StreamQueue queue("test", &pool);
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
  WorkerPool pool("test", 2);
  absl::Notification done;
  StreamQueue queue("test", &pool);
  queue.Push([] { throw std::runtime_error("boom"); });
  queue.Push([&done] { done.Notify(); });
  done.WaitForNotification();
  EXPECT_TRUE(done.HasBeenNotified());
}

// However many workers the pool has, a queue runs one task at a time, in
// order.
TEST(StreamQueueTest, OneTaskOfAQueueAtATimeOnAPoolOfManyWorkers) {
  WorkerPool pool("test", 4);
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::vector<int> order;
  absl::Notification done;
  {
    StreamQueue queue("test", &pool);
    for (int i = 0; i < 1000; ++i) {
      queue.Push([&, i] {
        if (inside.fetch_add(1) != 0) ++overlaps;
        order.push_back(i);
        inside.fetch_sub(1);
      });
    }
    queue.Push([&done] { done.Notify(); });
    done.WaitForNotification();
  }
  EXPECT_EQ(overlaps.load(), 0);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[i], i);
}

// Two queues of one pool run at once: a task of the first waits for a task
// of the second, pushed later.
TEST(StreamQueueTest, QueuesOfOnePoolRunConcurrently) {
  WorkerPool pool("test", 2);
  absl::Notification second_ran;
  absl::Notification first_saw_it;
  StreamQueue first("first", &pool);
  StreamQueue second("second", &pool);
  first.Push([&] {
    // A deadlock guard, not a timing check: on one worker this never ends.
    if (second_ran.WaitForNotificationWithTimeout(absl::Seconds(60))) first_saw_it.Notify();
  });
  second.Push([&] { second_ran.Notify(); });
  EXPECT_TRUE(first_saw_it.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

// A queue with more than a turn's worth of tasks lets the pool's other
// ready queues go first: on one worker, the second queue's task runs after
// at most kTasksPerTurn tasks of the first.
TEST(StreamQueueTest, ABusyQueueYieldsTheWorkerAfterATurn) {
  WorkerPool pool("test", 1);
  absl::Mutex mu;
  std::vector<std::string> order;
  absl::Notification second_pushed;
  absl::Notification done;
  StreamQueue first("first", &pool);
  StreamQueue second("second", &pool);
  first.Push([&] { second_pushed.WaitForNotification(); });
  for (int i = 0; i < 2 * StreamQueue::kTasksPerTurn; ++i) {
    first.Push([&] {
      absl::MutexLock lock(&mu);
      order.push_back("first");
    });
  }
  second.Push([&] {
    absl::MutexLock lock(&mu);
    order.push_back("second");
  });
  second_pushed.Notify();
  first.Push([&done] { done.Notify(); });
  done.WaitForNotification();
  absl::MutexLock lock(&mu);
  const auto at = std::find(order.begin(), order.end(), "second");
  ASSERT_NE(at, order.end());
  EXPECT_EQ(at - order.begin(), StreamQueue::kTasksPerTurn - 1);
}

// With no other queue waiting for a worker, a busy queue keeps the worker
// it runs on past a turn: moving it to an idle worker would only trade a
// warm thread for a cold one.
TEST(StreamQueueTest, ABusyQueueKeepsItsWorkerWhenNoOtherWaits) {
  WorkerPool pool("test", 2);
  absl::Mutex mu;
  std::vector<int> workers;
  absl::Notification release;
  absl::Notification done;
  StreamQueue queue("queue", &pool);
  queue.Push([&] { release.WaitForNotification(); });  // the rest queue up behind it
  for (int i = 0; i < 3 * StreamQueue::kTasksPerTurn; ++i) {
    queue.Push([&] {
      absl::MutexLock lock(&mu);
      workers.push_back(pool.CurrentWorker());
    });
  }
  queue.Push([&done] { done.Notify(); });
  release.Notify();
  done.WaitForNotification();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(workers.size(), static_cast<size_t>(3 * StreamQueue::kTasksPerTurn));
  EXPECT_GE(workers.front(), 0);
  EXPECT_EQ(std::count(workers.begin(), workers.end(), workers.front()),
            static_cast<std::ptrdiff_t>(workers.size()));
}

// A gate parks its queue without holding a worker: on a one-worker pool the
// other queue runs, resumes the parked one, and its next task runs after.
TEST(StreamQueueTest, AParkedQueueHoldsNoWorkerAndRunsOnWhenResumed) {
  WorkerPool pool("test", 1);
  absl::Mutex mu;
  std::vector<std::string> order;
  std::optional<StreamQueue::Resume> resume;  // guarded by mu
  absl::Notification done;
  StreamQueue waiting("waiting", &pool);
  StreamQueue other("other", &pool);
  waiting.PushGate([&](StreamQueue::Resume r) {
    absl::MutexLock lock(&mu);
    order.push_back("gate");
    resume = r;
  });
  waiting.Push([&] {
    absl::MutexLock lock(&mu);
    order.push_back("after the gate");
    done.Notify();
  });
  // Waits until the gate parked the queue, so that `other` runs second.
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(+[](std::optional<StreamQueue::Resume>* r) { return r->has_value(); },
                             &resume));
  }
  EXPECT_EQ(waiting.pending(), 2u);  // the parked gate and the task behind it
  other.Push([&] {
    std::optional<StreamQueue::Resume> r;
    {
      absl::MutexLock lock(&mu);
      order.push_back("other");
      r = resume;
    }
    (*r)();
    (*r)();  // a second call changes nothing
  });
  done.WaitForNotification();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<std::string>{"gate", "other", "after the gate"}));
}

TEST(StreamQueueTest, AGateResumedAtOnceLetsTheQueueGoOn) {
  WorkerPool pool("test", 1);
  std::vector<int> order;
  absl::Notification done;
  StreamQueue queue("test", &pool);
  queue.Push([&order] { order.push_back(1); });
  queue.PushGate([&order](StreamQueue::Resume resume) {
    order.push_back(2);
    resume();
  });
  queue.Push([&] {
    order.push_back(3);
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(StreamQueueTest, StopDropsWhatWaitsBehindAParkedGate) {
  WorkerPool pool("test", 1);
  std::atomic<int> ran{0};
  absl::Notification parked;
  std::optional<StreamQueue::Resume> resume;
  StreamQueue queue("test", &pool);
  queue.PushGate([&](StreamQueue::Resume r) {
    resume = r;
    parked.Notify();
  });
  queue.Push([&ran] { ++ran; });
  parked.WaitForNotification();
  queue.Stop();
  EXPECT_EQ(queue.pending(), 0u);
  (*resume)();  // after Stop: nothing to resume
  // The pool is free and the queue runs nothing: a task on another queue
  // runs, and this queue's did not.
  absl::Notification other_ran;
  StreamQueue other("other", &pool);
  other.Push([&other_ran] { other_ran.Notify(); });
  other_ran.WaitForNotification();
  EXPECT_EQ(ran.load(), 0);
}

TEST(StreamQueueTest, AResumeOutlivesItsQueue) {
  WorkerPool pool("test", 1);
  absl::Notification parked;
  std::optional<StreamQueue::Resume> resume;
  {
    StreamQueue queue("test", &pool);
    queue.PushGate([&](StreamQueue::Resume r) {
      resume = r;
      parked.Notify();
    });
    parked.WaitForNotification();
  }
  (*resume)();  // the queue is gone: does nothing
  SUCCEED();
}

}  // namespace
}  // namespace flagos::daemon
