// LaunchWindow: a stream queue runs at most two windows ahead of its device
// (the fences the test holds back stand for a device that has not finished),
// what lies beyond stays in the queue where Stop drops it, and on a runtime
// whose work completes at return nothing waits.
#include "execution/launch_window.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cpu_runtime.h"
#include "delegating_runtime.h"
#include "execution/stream_queue.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {
namespace {

constexpr uint64_t kWindow = LaunchWindow::kOpsPerWindow;

std::unique_ptr<DeviceRuntime> Cpu() {
  CpuRuntimeParams params;
  params.devices = 1;
  params.memory_per_device = 1 << 20;
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> cpu = CreateCpuRuntime(params);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  return *std::move(cpu);
}

// A device that completes nothing until the test says so: host functions
// (the windows' fences) are held until Complete.
class HeldFences : public DelegatingRuntime {
 public:
  HeldFences() : DelegatingRuntime(Cpu()) {}

  absl::Status LaunchHostFunc(int /*device*/, StreamHandle /*stream*/, HostFunc fn) override {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::move(fn));
    return absl::OkStatus();
  }
  // Waits until `n` fences were issued; false after 30 s (a hang).
  bool WaitForFences(size_t n) {
    std::pair<HeldFences*, size_t> arg(this, n);
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](std::pair<HeldFences*, size_t>* arg) {
                                      arg->first->mu_.AssertHeld();
                                      return arg->first->held_.size() >= arg->second;
                                    },
                                    &arg),
                                absl::Seconds(30));
  }
  size_t fences() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  // The device completes the work before fence `i`.
  void Complete(size_t i) {
    HostFunc fn;
    {
      absl::MutexLock lock(&mu_);
      fn = std::move(held_.at(i));
    }
    std::move(fn)(absl::OkStatus());
  }

 private:
  absl::Mutex mu_;
  std::vector<HostFunc> held_ ABSL_GUARDED_BY(mu_);
};

// Pushes `tasks` one-command tasks (each counted) that count their runs.
void PushCounted(LaunchWindow& window, StreamQueue& queue, int tasks, std::atomic<int>* ran) {
  for (int i = 0; i < tasks; ++i) {
    window.Count(1);
    queue.Push([ran] { ++*ran; });
  }
}

// Waits until `ran` reaches `n` or 30 s passed; returns it.
int Settle(const std::atomic<int>& ran, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (ran.load() < n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return ran.load();
}

// A queue over a device that holds its fences back.
class LaunchWindowTest : public ::testing::Test {
 protected:
  ~LaunchWindowTest() override { queue_.Stop(); }

  HeldFences runtime_;
  WorkerPool pool_{"test", 2};
  StreamQueue queue_{"test", &pool_};
  LaunchWindow window_{&runtime_, 0, 0, &queue_};
  std::atomic<int> ran_{0};
};

TEST_F(LaunchWindowTest, TheQueueRunsTwoWindowsAheadOfTheDeviceAndNoFurther) {
  PushCounted(window_, queue_, 5 * kWindow, &ran_);
  // Window 1 ran, its fence was issued; window 2 ran, its fence was issued,
  // and the queue parked on window 1's.
  ASSERT_TRUE(runtime_.WaitForFences(2));
  EXPECT_EQ(Settle(ran_, 2 * kWindow), 2 * kWindow);
  absl::SleepFor(absl::Milliseconds(50));  // a wrong queue would run on meanwhile
  EXPECT_EQ(ran_.load(), 2 * kWindow);
  EXPECT_EQ(runtime_.fences(), 2u);
  // The device finished window 1: window 3 runs, then the queue parks on 2.
  runtime_.Complete(0);
  ASSERT_TRUE(runtime_.WaitForFences(3));
  EXPECT_EQ(Settle(ran_, 3 * kWindow), 3 * kWindow);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ran_.load(), 3 * kWindow);
  // Completing out of order changes nothing: the gate waits for its own.
  runtime_.Complete(2);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ran_.load(), 3 * kWindow);
  runtime_.Complete(1);
  EXPECT_EQ(Settle(ran_, 5 * kWindow), 5 * kWindow);
}

TEST_F(LaunchWindowTest, StopDropsWhatLiesBeyondTheWindowsOnTheDevice) {
  PushCounted(window_, queue_, 40 * kWindow, &ran_);
  ASSERT_TRUE(runtime_.WaitForFences(2));
  queue_.Stop();  // the client died: the parked queue drops the rest
  runtime_.Complete(0);
  runtime_.Complete(1);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ran_.load(), 2 * kWindow);
}

TEST_F(LaunchWindowTest, ACommandWorthManyOpsFillsAWindowOfItsOwn) {
  // A replay of 3 windows' worth of commands, then three more.
  for (uint64_t ops : {3 * kWindow, uint64_t{1}, 3 * kWindow, 3 * kWindow}) {
    window_.Count(ops);
    queue_.Push([this] { ++ran_; });
  }
  // [big] fence [1, ...] - the second big one overflows the window: fence,
  // then the queue parks on the first fence before running it.
  ASSERT_TRUE(runtime_.WaitForFences(2));
  EXPECT_EQ(Settle(ran_, 2), 2);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ran_.load(), 2);
  runtime_.Complete(0);
  EXPECT_EQ(Settle(ran_, 3), 3);
  runtime_.Complete(1);
  EXPECT_EQ(Settle(ran_, 4), 4);
}

TEST(LaunchWindowOnCpuTest, OnARuntimeWhoseWorkCompletesAtReturnNothingWaits) {
  std::unique_ptr<DeviceRuntime> runtime = Cpu();
  WorkerPool pool("test", 2);
  StreamQueue queue("test", &pool);
  LaunchWindow window(runtime.get(), 0, 0, &queue);
  std::atomic<int> ran{0};
  PushCounted(window, queue, 10 * kWindow + 7, &ran);
  EXPECT_EQ(Settle(ran, 10 * kWindow + 7), 10 * kWindow + 7);
  queue.Stop();
}

}  // namespace
}  // namespace flagos::daemon
