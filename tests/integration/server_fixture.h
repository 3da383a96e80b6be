// ServerTest: flagosd's Server in-process, on a unix socket in a temporary
// directory, on the cpu backend (2 devices of kDeviceMemory each), with a
// stub for RawSession streams (raw_session.h). A fixture derived from it
// changes the server's options in Configure.
#ifndef FLAGOS_TESTS_INTEGRATION_SERVER_FIXTURE_H_
#define FLAGOS_TESTS_INTEGRATION_SERVER_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "execution/backend.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "observability/device_probe.h"
#include "raw_session.h"
#include "transport/server.h"

namespace flagos::daemon {

inline constexpr uint64_t kDeviceMemory = 64ull << 20;
// What sessions can have of each device: the health check's probe holds
// the rest from the start (observability/device_probe.h).
inline constexpr uint64_t kSessionMemory = kDeviceMemory - DeviceProbe::kProbeBytes;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/flagosd_server_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    endpoint_ = absl::StrCat("unix://", dir_, "/flagosd.sock");

    Restart(DefaultBackendOptions(), DefaultServerOptions());
  }

  void TearDown() override {
    Stop();
    std::filesystem::remove_all(dir_);
  }

  BackendOptions DefaultBackendOptions() const {
    BackendOptions backend_options;
    backend_options.name = "cpu";
    backend_options.cpu_devices = 2;
    backend_options.device_memory = kDeviceMemory;
    return backend_options;
  }

  // The fixture's options, with Configure's changes.
  ServerOptions DefaultServerOptions() {
    ServerOptions server_options;
    server_options.listen = {endpoint_};
    server_options.max_sessions = 4;
    server_options.max_pending_opens = 3;
    server_options.open_deadline = absl::Seconds(2);
    Configure(&server_options);
    return server_options;
  }

  // A fixture's changes to the server's options.
  virtual void Configure(ServerOptions* /*options*/) {}

  // Serves anew, at the same endpoint, with these options.
  void Restart(const BackendOptions& backend_options, const ServerOptions& server_options) {
    Stop();
    absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create(backend_options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(server_options, backend_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);

    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    channel_ = grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Flagos::NewStub(channel_);
  }

  // Serves anew with the default options but this sharing policy.
  void StartServer(MemoryGrants::Policy memory_sharing) {
    ServerOptions server_options = DefaultServerOptions();
    server_options.memory_sharing = memory_sharing;
    Restart(DefaultBackendOptions(), server_options);
  }

  v1::NegotiateResponse NegotiateResponseOf() {
    grpc::ClientContext context;
    v1::NegotiateRequest request;
    request.set_min_version(1);
    request.set_max_version(1);
    v1::NegotiateResponse response;
    grpc::Status status = stub_->Negotiate(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  void Stop() {
    stub_.reset();
    channel_.reset();
    server_.reset();
    backend_.reset();
  }

  v1::GetStatsResponse Stats() {
    grpc::ClientContext context;
    v1::GetStatsResponse response;
    grpc::Status status = stub_->GetStats(&context, v1::GetStatsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // Polls GetStats (every 10 ms, at most `polls` times) until `done` holds
  // for its answer; returns the last answer.
  v1::GetStatsResponse StatsUntil(const std::function<bool(const v1::GetStatsResponse&)>& done,
                                 int polls = 500) {
    v1::GetStatsResponse stats;
    for (int i = 0; i < polls; ++i) {
      stats = Stats();
      if (done(stats)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return stats;
  }

  // Polls GetStats until no session is live or closing (the daemon closes
  // sessions asynchronously to the client's Finish).
  v1::GetStatsResponse StatsAfterSessionsEnd() {
    return StatsUntil([](const v1::GetStatsResponse& stats) {
      return stats.sessions_size() == 0 && stats.closing_sessions_size() == 0;
    });
  }

  std::string dir_;
  std::string endpoint_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Flagos::Stub> stub_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_TESTS_INTEGRATION_SERVER_FIXTURE_H_
