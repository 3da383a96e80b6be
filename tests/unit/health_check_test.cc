// HealthCheck over the cpu backend's runtime: each device's probe goes
// through the device's worker pool and the device's stream, the listener's
// through a Negotiate. The faults are injected where they happen: jobs that
// hold every worker of a pool, and a runtime (the cpu one, wrapped) whose
// device holds its host functions or does not deliver a copy.
#include "observability/health_check.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cpu_runtime.h"
#include "delegating_runtime.h"
#include "execution/worker_pool.h"
#include "flagos/v1/flagos.grpc.pb.h"

namespace flagos::daemon {
namespace {

constexpr int kDevices = 2;
constexpr int kWorkers = 2;
// Long enough for a probe that can complete to complete however loaded the
// machine is; a check expected to fail waits kShort.
constexpr absl::Duration kLong = absl::Seconds(30);
constexpr absl::Duration kShort = absl::Milliseconds(200);

// The cpu runtime, with faults per device: host functions held instead of
// run (a device that stops completing work), device-to-host copies that
// report success and copy nothing.
class FaultyRuntime : public DelegatingRuntime {
 public:
  explicit FaultyRuntime(std::unique_ptr<DeviceRuntime> inner)
      : DelegatingRuntime(std::move(inner)) {}

  void HoldHostFuncs(int device) {
    absl::MutexLock lock(&mu_);
    hold_[device] = true;
  }
  // Runs the held functions; later ones run at once again.
  void ReleaseHostFuncs(int device) {
    std::vector<HostFunc> held;
    {
      absl::MutexLock lock(&mu_);
      hold_[device] = false;
      held.swap(held_[device]);
    }
    for (HostFunc& fn : held) std::move(fn)(absl::OkStatus());
  }
  int held_host_funcs(int device) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_[device].size());
  }
  void DropCopiesToHost(int device) {
    absl::MutexLock lock(&mu_);
    drop_to_host_[device] = true;
  }
  int copies_to_device(int device) {
    absl::MutexLock lock(&mu_);
    return copies_to_device_[device];
  }

  absl::Status CopyHostToDevice(int device, StreamHandle stream, DevicePtr dst, const void* src,
                                uint64_t nbytes) override {
    {
      absl::MutexLock lock(&mu_);
      ++copies_to_device_[device];
    }
    return inner().CopyHostToDevice(device, stream, dst, src, nbytes);
  }
  absl::Status CopyDeviceToHost(int device, StreamHandle stream, void* dst, DevicePtr src,
                                uint64_t nbytes) override {
    {
      absl::MutexLock lock(&mu_);
      if (drop_to_host_[device]) return absl::OkStatus();
    }
    return inner().CopyDeviceToHost(device, stream, dst, src, nbytes);
  }
  // Functions held back here are not waited for (the probe never drains:
  // DrainStream is the inner runtime's).
  absl::Status LaunchHostFunc(int device, StreamHandle stream, HostFunc fn) override {
    {
      absl::MutexLock lock(&mu_);
      if (hold_[device]) {
        held_[device].push_back(std::move(fn));
        return absl::OkStatus();
      }
    }
    return inner().LaunchHostFunc(device, stream, std::move(fn));
  }

 private:
  absl::Mutex mu_;
  bool hold_[kDevices] ABSL_GUARDED_BY(mu_) = {};
  std::vector<HostFunc> held_[kDevices] ABSL_GUARDED_BY(mu_);
  bool drop_to_host_[kDevices] ABSL_GUARDED_BY(mu_) = {};
  int copies_to_device_[kDevices] ABSL_GUARDED_BY(mu_) = {};
};

// The listener: answers Negotiate only.
class NegotiateOnly final : public v1::Flagos::Service {
  grpc::Status Negotiate(grpc::ServerContext*, const v1::NegotiateRequest* request,
                         v1::NegotiateResponse* response) override {
    response->set_version(request->max_version());
    return grpc::Status::OK;
  }
};

class HealthCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CpuRuntimeParams params;
    params.devices = kDevices;
    params.memory_per_device = 64ull << 20;
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> cpu = CreateCpuRuntime(params);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    runtime_ = std::make_unique<FaultyRuntime>(*std::move(cpu));
    for (int d = 0; d < kDevices; ++d) {
      pools_.push_back(std::make_unique<WorkerPool>(absl::StrCat("flagos:", d, " workers"),
                                                    kWorkers));
    }
    grpc::ServerBuilder builder;
    builder.RegisterService(&listener_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    health_.reset();
    server_->Shutdown();
  }

  HealthCheck& Health(HealthCheck::Connect connect = nullptr) {
    if (connect == nullptr) {
      connect = [server = server_.get()] { return server->InProcessChannel({}); };
    }
    std::vector<WorkerPool*> pools;
    for (const auto& pool : pools_) pools.push_back(pool.get());
    health_ = std::make_unique<HealthCheck>(runtime_.get(), pools, "in-process",
                                            std::move(connect));
    return *health_;
  }

  // Occupies every worker of device `d`'s pool until the returned
  // notification is notified. The jobs share it: a worker may still be
  // returning from WaitForNotification after the test body has ended (seen
  // under ctest -j2: "Mutex unlocked when destroyed" on a stack notification).
  std::shared_ptr<absl::Notification> WedgePool(int d) {
    auto release = std::make_shared<absl::Notification>();
    for (int i = 0; i < kWorkers; ++i) {
      pools_[d]->Schedule([release] { release->WaitForNotification(); });
    }
    return release;
  }

  std::unique_ptr<FaultyRuntime> runtime_;  // outlives the pools and the check
  std::vector<std::unique_ptr<WorkerPool>> pools_;
  NegotiateOnly listener_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthCheck> health_;
};

TEST_F(HealthCheckTest, PassesWhenEveryDeviceCompletesItsProbeAndTheListenerAnswers) {
  HealthCheck& health = Health();
  EXPECT_TRUE(health.Check(kLong).ok());
  EXPECT_TRUE(health.Check(kLong).ok());
  // Each check copied to every device (and back), once.
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(runtime_->copies_to_device(d), 2) << d;
}

TEST_F(HealthCheckTest, ReportsAWedgedWorkerPoolNamingItsDevice) {
  HealthCheck& health = Health();
  const std::shared_ptr<absl::Notification> release = WedgePool(1);
  for (int check = 0; check < 3; ++check) {
    const absl::Status status = health.Check(kShort);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_TRUE(
        absl::StartsWith(status.message(), "the health probe of device flagos:1 has waited "))
        << status;
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  "for one of the 2 workers that run the device's stream queues"))
        << status;
    EXPECT_FALSE(absl::StrContains(status.message(), "flagos:0")) << status;
  }
  std::shared_ptr<const DeviceProbe::Attempt> queued;
  for (const auto& attempt : health.StartDeviceProbes()) {
    if (attempt->device() == 1) queued = attempt;
  }
  ASSERT_NE(queued, nullptr);
  release->Notify();
  ASSERT_TRUE(queued->WaitUntil(absl::Now() + kLong));
  EXPECT_TRUE(queued->status().ok()) << queued->status();
  // Three failed checks queued one probe on the wedged pool, not three.
  EXPECT_EQ(runtime_->copies_to_device(1), 1);
  EXPECT_TRUE(health.Check(kLong).ok());
  EXPECT_EQ(runtime_->copies_to_device(1), 2);
}

TEST_F(HealthCheckTest, ReportsADeviceThatStopsCompletingWorkWithoutHoldingAWorker) {
  HealthCheck& health = Health();
  ASSERT_TRUE(health.Check(kLong).ok());
  runtime_->HoldHostFuncs(1);
  for (int check = 0; check < 3; ++check) {
    const absl::Status status = health.Check(kShort);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_TRUE(absl::StartsWith(
        status.message(),
        "device flagos:1 has not completed the health probe's work (a 64-byte copy to the "
        "device and back, on a stream of its own) issued "))
        << status;
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  "the device or its cpu runtime has stopped completing work"))
        << status;
    EXPECT_FALSE(absl::StrContains(status.message(), "flagos:0")) << status;
  }
  // One probe was issued to the device, not one per check.
  EXPECT_EQ(runtime_->held_host_funcs(1), 1);
  EXPECT_EQ(runtime_->copies_to_device(1), 2);
  // The waiting probe holds no worker: the pool still runs every job.
  absl::Notification ran[kWorkers];
  for (auto& notification : ran) pools_[1]->Schedule([&notification] { notification.Notify(); });
  for (auto& notification : ran) EXPECT_TRUE(notification.WaitForNotificationWithTimeout(kLong));
  // At SIGTERM the shutdown guard is handed the outstanding attempt.
  bool device_1_outstanding = false;
  for (const auto& attempt : health.StartDeviceProbes()) {
    if (attempt->device() == 1) device_1_outstanding = !attempt->done();
  }
  EXPECT_TRUE(device_1_outstanding);
  runtime_->ReleaseHostFuncs(1);
  EXPECT_TRUE(health.Check(kLong).ok());
}

TEST_F(HealthCheckTest, ReportsADeviceThatDoesNotDeliverTheBytes) {
  HealthCheck& health = Health();
  runtime_->DropCopiesToHost(0);
  const absl::Status status = health.Check(kLong);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(),
                               "device flagos:0 returned other bytes than the health probe "
                               "copied to it (byte 0: "))
      << status;
  EXPECT_FALSE(absl::StrContains(status.message(), "flagos:1")) << status;
}

TEST_F(HealthCheckTest, ReportsAListenerThatDoesNotAnswer) {
  HealthCheck& health = Health([] {
    return grpc::CreateChannel("unix:///nonexistent/flagosd.sock",
                               grpc::InsecureChannelCredentials());
  });
  const absl::Status status = health.Check(absl::Seconds(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(
      absl::StartsWith(status.message(), "the listener in-process did not answer Negotiate"))
      << status;
}

TEST_F(HealthCheckTest, DestroyingTheCheckWithAStuckDeviceLeavesItsProbeSafe) {
  HealthCheck& health = Health();
  runtime_->HoldHostFuncs(0);
  EXPECT_EQ(health.Check(kShort).code(), absl::StatusCode::kDeadlineExceeded);
  std::shared_ptr<const DeviceProbe::Attempt> stuck;
  for (const auto& attempt : health.StartDeviceProbes()) {
    if (attempt->device() == 0) stuck = attempt;
  }
  ASSERT_NE(stuck, nullptr);
  health_.reset();  // does not wait for the device
  EXPECT_FALSE(stuck->done());
  // The device completes the work later: the probe's buffers are still
  // there for it, and the attempt ends with what the device did.
  runtime_->ReleaseHostFuncs(0);
  ASSERT_TRUE(stuck->WaitUntil(absl::Now() + kLong));
  EXPECT_TRUE(stuck->status().ok()) << stuck->status();
}

}  // namespace
}  // namespace flagos::daemon
