// A raw client of flagosd's Session stream for the integration tests
// (tests/integration/server_*_test.cc): builders of the protocol's commands
// and values, and RawSession, which numbers commands, sends them as batches
// and reads their completions by seq.
#ifndef FLAGOS_TESTS_INTEGRATION_RAW_SESSION_H_
#define FLAGOS_TESTS_INTEGRATION_RAW_SESSION_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../unit/tensor_refs.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "ops/op_schema_match.h"

namespace flagos::daemon {

inline constexpr int kFloat = 6;
inline constexpr int kLong = 4;
inline constexpr int kInvalidArgument = static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
inline constexpr int kNotFound = static_cast<int>(grpc::StatusCode::NOT_FOUND);
inline constexpr int kFailedPrecondition = static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION);
inline constexpr int kResourceExhausted = static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED);

inline std::string FloatBytes(std::initializer_list<float> values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

inline std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

inline v1::TensorRef Ref(uint64_t addr, std::initializer_list<int64_t> sizes,
                         int dtype = kFloat, int device = 0) {
  return test_refs::MakeRef(addr, sizes, dtype, device);
}

inline v1::Value TensorValue(const v1::TensorRef& ref) {
  v1::Value value;
  *value.mutable_tensor() = ref;
  return value;
}

inline v1::Value IntValue(int64_t i) {
  v1::Value value;
  value.set_i(i);
  return value;
}

inline v1::Value DoubleValue(double d) {
  v1::Value value;
  value.set_d(d);
  return value;
}

inline v1::Value NoneValue() {
  v1::Value value;
  value.set_none(true);
  return value;
}

inline v1::Command Allocate(uint64_t nbytes, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_allocate()->set_nbytes(nbytes);
  return command;
}

inline v1::Command Free(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_free()->set_addr(addr);
  return command;
}

inline v1::Command CopyTo(uint64_t addr, std::string data, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_copy_to_device()->set_addr(addr);
  command.mutable_copy_to_device()->set_data(std::move(data));
  return command;
}

inline v1::Command CopyFrom(uint64_t addr, uint64_t nbytes, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_copy_from_device()->set_addr(addr);
  command.mutable_copy_from_device()->set_nbytes(nbytes);
  return command;
}

inline v1::Command RegisterOp(uint32_t op_id, const std::string& name,
                              const std::string& overload) {
  v1::Command command;
  command.mutable_register_op()->set_op_id(op_id);
  command.mutable_register_op()->set_name(name);
  command.mutable_register_op()->set_overload(overload);
  // As torch_fl does: the schema of the op in this (the daemon's) torch.
  command.mutable_register_op()->set_schema(OwnSchemaText(name, overload).value_or(""));
  return command;
}

inline v1::Command Op(uint32_t op_id, std::vector<v1::Value> args,
                      std::vector<v1::TensorRef> outputs, bool want_values = false) {
  v1::Command command;
  v1::OpCall* call = command.mutable_op();
  call->set_op_id(op_id);
  for (v1::Value& arg : args) *call->add_args() = std::move(arg);
  for (v1::TensorRef& out : outputs) *call->add_outputs() = std::move(out);
  call->set_want_values(want_values);
  return command;
}

inline v1::Command Sync(int device = -1) {
  v1::Command command;
  command.set_device(device);
  command.mutable_sync();
  return command;
}

inline v1::Command RecordEvent(uint64_t event, bool timing = false, int device = 0,
                               uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_record_event()->set_event(event);
  command.mutable_record_event()->set_enable_timing(timing);
  return command;
}

inline v1::Command WaitEvent(uint64_t event, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_wait_event()->set_event(event);
  return command;
}

// A 1-d view of `numel` elements with stride 0: every element is the one
// at `addr`, so a few bytes of a segment name any number of elements.
inline v1::TensorRef StrideZeroRef(uint64_t addr, int64_t numel, int dtype = kFloat) {
  v1::TensorRef ref;
  ref.set_addr(addr);
  ref.set_dtype(dtype);
  ref.add_sizes(numel);
  ref.add_strides(0);
  return ref;
}

// A raw Session stream.
class RawSession {
 public:
  explicit RawSession(v1::Flagos::Stub* stub) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub->Session(&context_);
  }

  uint64_t Open(const std::string& client = "server_test", const std::string& torch_version = "",
                const std::string& command_line = "") {
    v1::ClientMessage message;
    message.mutable_open()->set_version(1);
    message.mutable_open()->set_pid(getpid());
    message.mutable_open()->set_client(client);
    message.mutable_open()->set_torch_version(torch_version);
    message.mutable_open()->set_command_line(command_line);
    EXPECT_TRUE(stream_->Write(message));
    v1::ServerMessage reply;
    EXPECT_TRUE(stream_->Read(&reply));
    EXPECT_TRUE(reply.has_opened());
    return reply.opened().session_id();
  }

  // Sends the commands as one batch, numbering them; returns the last seq.
  uint64_t Send(std::vector<v1::Command> commands) {
    v1::ClientMessage message;
    for (v1::Command& command : commands) {
      command.set_seq(++seq_);
      *message.mutable_batch()->add_commands() = std::move(command);
    }
    EXPECT_TRUE(stream_->Write(message));
    return seq_;
  }

  // Reads until the completion of `seq`; earlier ones land in errors().
  // One message may carry several completions (the daemon batches those
  // waiting): the ones after `seq`'s are kept for the next call.
  v1::Completion WaitFor(uint64_t seq) {
    while (true) {
      while (!unread_.empty()) {
        v1::Completion completion = std::move(unread_.front());
        unread_.pop_front();
        if (completion.seq() == seq) return completion;
        others_.push_back(std::move(completion));
      }
      v1::ServerMessage reply;
      if (!stream_->Read(&reply)) {
        ADD_FAILURE() << "the session ended while waiting for command " << seq;
        return v1::Completion();
      }
      for (v1::Completion& completion : *reply.mutable_completions()) {
        unread_.push_back(std::move(completion));
      }
    }
  }

  v1::Completion Call(v1::Command command) { return WaitFor(Send({std::move(command)})); }

  // The next seq, for a command the test writes itself.
  uint64_t TakeSeq() { return ++seq_; }

  // Sends `commands` and a sync; returns the completions before the sync's.
  std::vector<v1::Completion> RunAndSync(std::vector<v1::Command> commands) {
    commands.push_back(Sync());
    const uint64_t seq = Send(std::move(commands));
    others_.clear();
    v1::Completion sync = WaitFor(seq);
    EXPECT_EQ(sync.code(), 0) << sync.message();
    std::vector<v1::Completion> others;
    others.swap(others_);
    return others;
  }

  uint64_t AllocateOk(uint64_t nbytes, int device = 0) {
    v1::Completion completion = Call(Allocate(nbytes, device));
    EXPECT_EQ(completion.code(), 0) << completion.message();
    EXPECT_NE(completion.addr(), 0u);
    return completion.addr();
  }

  grpc::Status End() {
    stream_->WritesDone();
    v1::ServerMessage reply;
    while (stream_->Read(&reply)) {
    }
    return stream_->Finish();
  }

  grpc::ClientContext& context() { return context_; }
  grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>& stream() { return *stream_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  uint64_t seq_ = 0;
  std::deque<v1::Completion> unread_;
  std::vector<v1::Completion> others_;
};

// What one float32 host tensor value of a completion holds.
inline float OnlyFloat(const v1::Completion& completion) {
  EXPECT_EQ(completion.code(), 0) << completion.message();
  if (completion.values_size() != 1) return -1;
  std::vector<float> values = Floats(completion.values(0).host_tensor().data());
  return values.size() == 1 ? values[0] : -1;
}

// The session computes the norm of [3, 4] right: it is served on.
inline void ExpectNormServed(RawSession& session, uint32_t norm_op) {
  const uint64_t addr = session.AllocateOk(8);
  session.Send({CopyTo(addr, FloatBytes({3, 4}))});
  EXPECT_EQ(OnlyFloat(session.Call(Op(norm_op, {TensorValue(Ref(addr, {2}))}, {}, true))), 5.0f);
}

}  // namespace flagos::daemon

#endif  // FLAGOS_TESTS_INTEGRATION_RAW_SESSION_H_
