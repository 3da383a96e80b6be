#include "fake_daemon.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace flagos::testing {

FakeDaemon::FakeDaemon(FakeDaemonOptions options) : options_(options) {
  char pattern[] = "/tmp/flagos_client_test.XXXXXX";
  if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  directory_ = pattern;
  endpoint_ = "unix://" + directory_ + "/flagosd.sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort(endpoint_, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) throw std::runtime_error("cannot serve on " + endpoint_);
}

FakeDaemon::~FakeDaemon() {
  Shutdown();
  server_->Wait();
  std::remove((directory_ + "/flagosd.sock").c_str());
  rmdir(directory_.c_str());
}

void FakeDaemon::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
}

std::vector<int> FakeDaemon::batch_sizes() const {
  absl::MutexLock lock(&mu_);
  return batch_sizes_;
}

std::vector<uint64_t> FakeDaemon::seqs() const {
  absl::MutexLock lock(&mu_);
  return seqs_;
}

v1::SessionOpen FakeDaemon::last_open() const {
  absl::MutexLock lock(&mu_);
  return last_open_;
}

int FakeDaemon::sessions_ended() const {
  absl::MutexLock lock(&mu_);
  return sessions_ended_;
}

bool FakeDaemon::WaitForBatches(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(batch_sizes_.size()) >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
}

bool FakeDaemon::WaitForSessionsEnded(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sessions_ended_ >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
}

void FakeDaemon::FillDevices(google::protobuf::RepeatedPtrField<v1::DeviceInfo>* devices) const {
  for (int index = 0; index < 2; ++index) {
    v1::DeviceInfo* device = devices->Add();
    device->set_index(index);
    device->set_name("fake device");
    device->set_total_memory(kDeviceBytes);
  }
}

grpc::Status FakeDaemon::Negotiate(grpc::ServerContext*, const v1::NegotiateRequest*,
                                   v1::NegotiateResponse* response) {
  response->set_version(options_.version);
  response->set_daemon_version("fake 0.0");
  response->set_backend("fake");
  FillDevices(response->mutable_devices());
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                                  v1::GetStatsResponse* response) {
  response->set_backend("fake");
  FillDevices(response->mutable_devices());
  absl::MutexLock lock(&mu_);
  response->set_sessions_total(sessions_opened_);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::Session(
    grpc::ServerContext*, grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream) {
  v1::ClientMessage message;
  if (!stream->Read(&message) || !message.has_open()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message must be `open`");
  }
  {
    absl::MutexLock lock(&mu_);
    last_open_ = message.open();
    ++sessions_opened_;
  }
  if (options_.open_sessions) {
    v1::ServerMessage opened;
    opened.mutable_opened()->set_session_id(kSessionId);
    stream->Write(opened);
  }
  while (stream->Read(&message)) {
    if (!message.has_batch()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected a batch");
    }
    {
      absl::MutexLock lock(&mu_);
      batch_sizes_.push_back(message.batch().commands_size());
      for (const v1::Command& command : message.batch().commands()) {
        seqs_.push_back(command.seq());
      }
    }
    v1::ServerMessage reply;
    for (const v1::Command& command : message.batch().commands()) Execute(command, &reply);
    if (reply.completions_size() > 0) stream->Write(reply);
  }
  absl::MutexLock lock(&mu_);
  ++sessions_ended_;
  return grpc::Status::OK;
}

void FakeDaemon::Execute(const v1::Command& command, v1::ServerMessage* reply) {
  switch (command.kind_case()) {
    case v1::Command::kAllocate: {
      v1::Completion* completion = reply->add_completions();
      completion->set_seq(command.seq());
      absl::MutexLock lock(&mu_);
      const uint64_t nbytes = command.allocate().nbytes();
      if (next_address_ - kFirstAddress + nbytes > kDeviceBytes) {
        completion->set_code(static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
        completion->set_message("fake device out of memory");
        return;
      }
      completion->set_addr(next_address_);
      next_address_ += nbytes;
      return;
    }
    case v1::Command::kSync:
      if (options_.answer_syncs) reply->add_completions()->set_seq(command.seq());
      return;
    case v1::Command::kOp:
      if (command.op().op_id() == kFailingOpId) {
        v1::Completion* completion = reply->add_completions();
        completion->set_seq(command.seq());
        completion->set_code(static_cast<int>(grpc::StatusCode::INTERNAL));
        completion->set_message("fake kernel failed on purpose");
      } else if (command.op().want_values()) {
        v1::Completion* completion = reply->add_completions();
        completion->set_seq(command.seq());
        completion->add_values()->set_i(command.op().op_id());
      }
      return;
    default:
      return;
  }
}

}  // namespace flagos::testing
