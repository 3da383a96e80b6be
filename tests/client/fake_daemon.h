// FakeDaemon: an in-process flagosd stand-in for the client tests, serving
// flagos.v1.Flagos on a unix socket in a fresh temporary directory.
//
// Negotiate answers `version` with two fake devices. A session answers
// `opened`, then: allocate (addresses from kFirstAddress up; more than
// kDeviceBytes fails with RESOURCE_EXHAUSTED), sync (unless told not to),
// op with want_values (one value: the op id), and op kFailingOpId, which
// fails without a reply owed. It records every batch for the tests to check.
#ifndef FLAGOS_TESTS_CLIENT_FAKE_DAEMON_H_
#define FLAGOS_TESTS_CLIENT_FAKE_DAEMON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "grpcpp/server.h"

namespace flagos::testing {

struct FakeDaemonOptions {
  uint32_t version = 1;          // what Negotiate chooses
  bool open_sessions = true;     // false: never answer `open`
  bool answer_syncs = true;      // false: sync markers never complete
};

class FakeDaemon final : public v1::Flagos::Service {
 public:
  static constexpr uint64_t kFirstAddress = 0x7f0000000000;
  static constexpr uint64_t kDeviceBytes = 1ull << 30;
  static constexpr uint32_t kFailingOpId = 999;
  static constexpr uint64_t kSessionId = 7;

  explicit FakeDaemon(FakeDaemonOptions options = {});
  ~FakeDaemon() override;

  // "unix:///tmp/.../flagosd.sock".
  const std::string& endpoint() const { return endpoint_; }
  // The temporary directory the socket lives in (removed on destruction).
  const std::string& directory() const { return directory_; }

  // Stops serving now, cancelling every session.
  void Shutdown();

  // Commands per batch received so far, in order.
  std::vector<int> batch_sizes() const;
  // Every command seq received so far, in order.
  std::vector<uint64_t> seqs() const;
  // The `open` of the latest session.
  v1::SessionOpen last_open() const;
  int sessions_ended() const;

  // Waits until at least `count` batches (sessions) arrived (ended).
  bool WaitForBatches(int count, absl::Duration timeout) const;
  bool WaitForSessionsEnded(int count, absl::Duration timeout) const;

  grpc::Status Negotiate(grpc::ServerContext* context, const v1::NegotiateRequest* request,
                         v1::NegotiateResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;
  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream) override;

 private:
  // Answers one command into `reply` if it owes one or failed.
  void Execute(const v1::Command& command, v1::ServerMessage* reply);
  void FillDevices(google::protobuf::RepeatedPtrField<v1::DeviceInfo>* devices) const;

  const FakeDaemonOptions options_;
  std::string directory_;
  std::string endpoint_;
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_address_ ABSL_GUARDED_BY(mu_) = kFirstAddress;
  std::vector<int> batch_sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> seqs_ ABSL_GUARDED_BY(mu_);
  v1::SessionOpen last_open_ ABSL_GUARDED_BY(mu_);
  int sessions_opened_ ABSL_GUARDED_BY(mu_) = 0;
  int sessions_ended_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flagos::testing

#endif  // FLAGOS_TESTS_CLIENT_FAKE_DAEMON_H_
