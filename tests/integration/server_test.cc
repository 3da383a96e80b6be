// flagosd end to end in-process: a Server on a unix socket in a temporary
// directory, driven through the generated stub with raw Session streams.
#include "transport/server.h"

#include "admission/pending_opens.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <iostream>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "execution/backend.h"
#include "observability/device_probe.h"
#include "cpu_kernel_facts.h"
#include "ops/op_runner.h"
#include "ops/op_schema_match.h"
#include "ops/op_servability.h"
#include "../unit/tensor_refs.h"
#include "observability/metrics.h"
#include "flagos/v1/flagos.grpc.pb.h"

namespace flagos::daemon {
namespace {

constexpr int kFloat = 6;
constexpr int kLong = 4;
constexpr uint64_t kDeviceMemory = 64ull << 20;
// What sessions can have of each device: the health check's probe holds
// the rest from the start (observability/device_probe.h).
constexpr uint64_t kSessionMemory = kDeviceMemory - DeviceProbe::kProbeBytes;
constexpr int kInvalidArgument = static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
constexpr int kNotFound = static_cast<int>(grpc::StatusCode::NOT_FOUND);
constexpr int kFailedPrecondition = static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION);
constexpr int kResourceExhausted = static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED);

std::string FloatBytes(std::initializer_list<float> values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

v1::TensorRef Ref(uint64_t addr, std::initializer_list<int64_t> sizes, int dtype = kFloat,
                  int device = 0) {
  return test_refs::MakeRef(addr, sizes, dtype, device);
}

v1::Value TensorValue(const v1::TensorRef& ref) {
  v1::Value value;
  *value.mutable_tensor() = ref;
  return value;
}

v1::Value IntValue(int64_t i) {
  v1::Value value;
  value.set_i(i);
  return value;
}

v1::Value DoubleValue(double d) {
  v1::Value value;
  value.set_d(d);
  return value;
}

v1::Value NoneValue() {
  v1::Value value;
  value.set_none(true);
  return value;
}

v1::Command Allocate(uint64_t nbytes, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_allocate()->set_nbytes(nbytes);
  return command;
}

v1::Command Free(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_free()->set_addr(addr);
  return command;
}

v1::Command CopyTo(uint64_t addr, std::string data, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_copy_to_device()->set_addr(addr);
  command.mutable_copy_to_device()->set_data(std::move(data));
  return command;
}

v1::Command CopyFrom(uint64_t addr, uint64_t nbytes, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_copy_from_device()->set_addr(addr);
  command.mutable_copy_from_device()->set_nbytes(nbytes);
  return command;
}

v1::Command RegisterOp(uint32_t op_id, const std::string& name, const std::string& overload) {
  v1::Command command;
  command.mutable_register_op()->set_op_id(op_id);
  command.mutable_register_op()->set_name(name);
  command.mutable_register_op()->set_overload(overload);
  // As torch_fl does: the schema of the op in this (the daemon's) torch.
  command.mutable_register_op()->set_schema(OwnSchemaText(name, overload).value_or(""));
  return command;
}

v1::Command Op(uint32_t op_id, std::vector<v1::Value> args, std::vector<v1::TensorRef> outputs,
               bool want_values = false) {
  v1::Command command;
  v1::OpCall* call = command.mutable_op();
  call->set_op_id(op_id);
  for (v1::Value& arg : args) *call->add_args() = std::move(arg);
  for (v1::TensorRef& out : outputs) *call->add_outputs() = std::move(out);
  call->set_want_values(want_values);
  return command;
}

v1::Command Sync(int device = -1) {
  v1::Command command;
  command.set_device(device);
  command.mutable_sync();
  return command;
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

TEST_F(ServerTest, NegotiateDescribesTheDaemon) {
  grpc::ClientContext context;
  v1::NegotiateRequest request;
  request.set_min_version(1);
  request.set_max_version(3);
  v1::NegotiateResponse response;
  grpc::Status status = stub_->Negotiate(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.version(), 1u);
  EXPECT_EQ(response.daemon_version(), "0.1.0");
  EXPECT_EQ(response.backend(), "cpu");
  EXPECT_EQ(response.torch_version(), TorchVersion());
  ASSERT_EQ(response.devices_size(), 2);
  const v1::DeviceInfo& device = response.devices(1);
  EXPECT_EQ(device.index(), 1);
  EXPECT_EQ(device.total_memory(), kDeviceMemory);
  EXPECT_EQ(device.used_memory(), 0u);
  EXPECT_NE(std::find(device.capabilities().begin(), device.capabilities().end(), "malloc"),
            device.capabilities().end());
  bool set_device_gap = false;
  for (const std::string& gap : device.gaps()) {
    set_device_gap |= absl::StartsWith(gap, "set_device: ");
  }
  EXPECT_TRUE(set_device_gap);
}

TEST_F(ServerTest, NegotiateCarriesTheBackendsKernelFacts) {
  grpc::ClientContext context;
  v1::NegotiateRequest request;
  request.set_min_version(1);
  request.set_max_version(1);
  v1::NegotiateResponse response;
  ASSERT_TRUE(stub_->Negotiate(&context, request, &response).ok());
  // ATen's CPU kernels keep batch norm's statistics in the input's reduced
  // precision and return none in eval mode; the meta functions say neither.
  const v1::KernelFact* batch_norm = nullptr;
  for (const v1::KernelFact& fact : response.kernel_facts()) {
    if (fact.op() == "aten::native_batch_norm") batch_norm = &fact;
  }
  ASSERT_NE(batch_norm, nullptr);
  EXPECT_FALSE(batch_norm->always());
  EXPECT_TRUE(batch_norm->reduced_precision_input());
  EXPECT_TRUE(batch_norm->eval_mode());
  EXPECT_EQ(static_cast<size_t>(response.kernel_facts_size()), CpuKernelFacts().size());
}

TEST_F(ServerTest, NegotiateReportsTheCompositeOpsTheBackendRunsWhole) {
  v1::NegotiateResponse response = NegotiateResponseOf();
  ASSERT_TRUE(response.has_composite_ops());
  const auto& ops = response.composite_ops().ops();
  const auto reported = [&](absl::string_view op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  };
  // Composite implementations with a CPU kernel of their own: run whole.
  EXPECT_TRUE(reported("aten::linalg_vector_norm"));
  EXPECT_TRUE(reported("aten::add.Tensor"));
  EXPECT_TRUE(reported("aten::narrow_copy"));
  // A composite without a CPU kernel (add.Scalar wraps add.Tensor), and a
  // CPU kernel without a composite: not composite ops that run whole.
  EXPECT_FALSE(reported("aten::add.Scalar"));
  EXPECT_FALSE(reported("aten::linalg_vector_norm.out"));
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  // register_op serves every one of them.
  const std::string served = ListServedOps();
  for (const std::string& op : ops) {
    EXPECT_TRUE(absl::StrContains(served, absl::StrCat("\n", op, "\tserved")))
        << op << " is reported but not served";
  }
}

TEST_F(ServerTest, DecomposedOpsAreLeftOutOfTheReport) {
  BackendOptions options = DefaultBackendOptions();
  options.decompose_ops = {"aten::linalg_vector_norm", "aten::narrow_copy"};
  Restart(options, DefaultServerOptions());
  v1::NegotiateResponse response = NegotiateResponseOf();
  const auto& ops = response.composite_ops().ops();
  EXPECT_EQ(std::find(ops.begin(), ops.end(), "aten::linalg_vector_norm"), ops.end());
  EXPECT_EQ(std::find(ops.begin(), ops.end(), "aten::narrow_copy"), ops.end());
  EXPECT_NE(std::find(ops.begin(), ops.end(), "aten::add.Tensor"), ops.end());
}

TEST_F(ServerTest, DecomposingAnOpThatIsNotACompositeRunWholeIsRefused) {
  BackendOptions options = DefaultBackendOptions();
  options.decompose_ops = {"aten::linalg_vector_norm.out"};
  absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create(options);
  ASSERT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(backend.status().message(),
                                "--decompose-ops names aten::linalg_vector_norm.out"))
      << backend.status();
}

TEST_F(ServerTest, KernelFactsFollowTheRoute) {
  // On the cpu_fallback route the kernels are ATen CPU's too: the same
  // facts, for every overload.
  BackendOptions options = DefaultBackendOptions();
  options.force_route = "cpu_fallback";
  Restart(options, DefaultServerOptions());
  v1::NegotiateResponse response = NegotiateResponseOf();
  ASSERT_EQ(static_cast<size_t>(response.kernel_facts_size()), CpuKernelFacts().size());
  for (int i = 0; i < response.kernel_facts_size(); ++i) {
    const v1::KernelFact& fact = response.kernel_facts(i);
    EXPECT_EQ(fact.op(), CpuKernelFacts()[i].op);
    EXPECT_EQ(fact.always(), CpuKernelFacts()[i].always);
    EXPECT_EQ(fact.reduced_precision_input(), CpuKernelFacts()[i].reduced_precision_input);
    EXPECT_EQ(fact.eval_mode(), CpuKernelFacts()[i].eval_mode);
    EXPECT_EQ(fact.mixed_dtype_operands(), CpuKernelFacts()[i].mixed_dtype_operands);
    EXPECT_EQ(fact.overloads_size(), 0) << fact.op();
  }
}

TEST_F(ServerTest, NegotiateWithoutCommonVersionNamesBothRanges) {
  grpc::ClientContext context;
  v1::NegotiateRequest request;
  request.set_min_version(2);
  request.set_max_version(3);
  v1::NegotiateResponse response;
  grpc::Status status = stub_->Negotiate(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "[2, 3]")) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "[1, 1]")) << status.error_message();
}

TEST_F(ServerTest, SessionMustStartWithOpen) {
  RawSession session(stub_.get());
  session.Send({Sync()});
  EXPECT_EQ(session.End().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A message whose bytes do not parse ends its session with INVALID_ARGUMENT
// (not OK, as gRPC's own Read would have it: it cannot tell a bad message
// from the end of the stream), before `open` and after; no other session is
// touched and the daemon serves on.
TEST_F(ServerTest, MessagesThatDoNotParseEndTheSessionWithInvalidArgument) {
  const std::string marker(4096, '\x6b');
  RawSession b(stub_.get());
  b.Open("b");
  const uint64_t b_addr = b.AllocateOk(marker.size());
  for (const v1::Completion& e : b.RunAndSync({CopyTo(b_addr, marker)})) ADD_FAILURE() << e.message();

  // Field 2 (batch) framed as bytes that are no CommandBatch: a tag of an
  // unterminated varint.
  v1::ClientMessage malformed;
  malformed.GetReflection()->MutableUnknownFields(&malformed)->AddLengthDelimited(
      2, std::string("\xff\xff\xff\xff", 4));
  // An op argument nested 1000 lists deep (protobuf's parser stops at 100).
  v1::ClientMessage deep;
  {
    v1::Command command = Op(1, {}, {});
    command.set_seq(1);
    v1::Value* value = command.mutable_op()->add_args();
    for (int i = 0; i < 1000; ++i) value = value->mutable_list()->add_values();
    value->set_i(1);
    *deep.mutable_batch()->add_commands() = std::move(command);
  }
  for (const bool opened : {false, true}) {
    for (const v1::ClientMessage* bad : {&malformed, &deep}) {
      RawSession a(stub_.get());
      if (opened) a.Open("a");
      ASSERT_TRUE(a.stream().Write(*bad));
      const grpc::Status status = a.End();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
      EXPECT_TRUE(absl::StrContains(status.error_message(), "is not a flagos.v1.ClientMessage"))
          << status.error_message();
      EXPECT_TRUE(absl::StrContains(status.error_message(), "nested deeper than protobuf's limit"))
          << status.error_message();
    }
  }
  EXPECT_EQ(b.Call(CopyFrom(b_addr, marker.size())).data(), marker);
  RawSession c(stub_.get());
  EXPECT_GT(c.Open("c"), 0u);
  EXPECT_EQ(c.Call(Sync()).code(), 0);
  EXPECT_TRUE(c.End().ok());
}

void AppendVarint(std::string* bytes, uint64_t v) {
  for (; v >= 0x80; v >>= 7) bytes->push_back(static_cast<char>(v | 0x80));
  bytes->push_back(static_cast<char>(v));
}

// `command` without its seq, then a seq field for each of `seqs`, in order
// (a field may appear more than once on the wire; protobuf keeps the last).
std::string WithSeqs(v1::Command command, std::initializer_list<uint64_t> seqs) {
  command.clear_seq();
  std::string bytes = command.SerializeAsString();
  for (uint64_t seq : seqs) {
    bytes.push_back('\x08');  // field 1 (seq), varint
    AppendVarint(&bytes, seq);
  }
  return bytes;
}

// The flagos client writes each command's seq after its other fields
// (client/src/encoded_batch.h); a hostile client may write it more than once.
// flagosd reads what protobuf reads, the last one: a command whose last seq
// repeats an earlier command's is refused and not run, whatever seq came
// before it on the wire, and one whose last seq is the next runs.
TEST_F(ServerTest, ACommandIsNumberedByTheLastSeqOnTheWire) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(16);  // seq 1
  const std::string refused(16, 'r');
  const std::string ran(16, 'k');
  const uint64_t next = session.TakeSeq();
  std::string batch;
  for (const std::string& command : {WithSeqs(CopyTo(addr, refused), {next + 100, 1}),
                                     WithSeqs(CopyTo(addr, ran), {1, next})}) {
    batch.push_back('\x0a');  // CommandBatch field 1 (commands), length-delimited
    AppendVarint(&batch, command.size());
    batch += command;
  }
  v1::ClientMessage message;
  message.GetReflection()->MutableUnknownFields(&message)->AddLengthDelimited(2, batch);
  ASSERT_TRUE(session.stream().Write(message));
  const std::vector<v1::Completion> errors = session.RunAndSync({});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].seq(), 1u);
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "sequence numbers must strictly increase"))
      << errors[0].message();
  EXPECT_EQ(session.Call(CopyFrom(addr, 16)).data(), ran);
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, SessionWithAnUnknownVersionIsRefused) {
  RawSession session(stub_.get());
  v1::ClientMessage message;
  message.mutable_open()->set_version(7);
  ASSERT_TRUE(session.stream().Write(message));
  EXPECT_EQ(session.End().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServerTest, CopiesRoundTripThroughDeviceMemory) {
  RawSession session(stub_.get());
  EXPECT_GT(session.Open(), 0u);
  const uint64_t addr = session.AllocateOk(1024);
  session.Send({CopyTo(addr + 16, FloatBytes({1.5f, -2, 3, 4}))});
  v1::Completion data = session.Call(CopyFrom(addr + 16, 16));
  ASSERT_EQ(data.code(), 0) << data.message();
  EXPECT_EQ(Floats(data.data()), (std::vector<float>{1.5f, -2, 3, 4}));
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, MemsetAndDeviceToDeviceCopyAcrossDevices) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t a = session.AllocateOk(64, 0);
  const uint64_t b = session.AllocateOk(64, 1);
  v1::Command memset;
  memset.set_device(0);
  memset.mutable_memset()->set_addr(a);
  memset.mutable_memset()->set_nbytes(64);
  memset.mutable_memset()->set_value(0x7f);
  v1::Command copy;
  copy.set_device(1);
  copy.mutable_copy_device_to_device()->set_src(a);
  copy.mutable_copy_device_to_device()->set_src_device(0);
  copy.mutable_copy_device_to_device()->set_dst(b);
  copy.mutable_copy_device_to_device()->set_nbytes(64);
  EXPECT_TRUE(session.RunAndSync({memset, copy}).empty());
  v1::Completion data = session.Call(CopyFrom(b, 64, 1));
  EXPECT_EQ(data.data(), std::string(64, '\x7f'));
}

TEST_F(ServerTest, OpWritesItsResultIntoTheOutputTensor) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(48);
  const v1::TensorRef a = Ref(addr, {2, 2});
  const v1::TensorRef b = Ref(addr + 16, {2, 2});
  const v1::TensorRef out = Ref(addr + 32, {2, 2});
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({1, 2, 3, 4, 10, 20, 30, 40})),
      RegisterOp(1, "aten::add", "Tensor"),
      Op(1, {TensorValue(a), TensorValue(b), IntValue(2)}, {out}),
  });
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.seq() << ": " << e.message();
  v1::Completion data = session.Call(CopyFrom(addr + 32, 16));
  EXPECT_EQ(Floats(data.data()), (std::vector<float>{21, 42, 63, 84}));
}

TEST_F(ServerTest, InPlaceOpWritesThroughItsArgument) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(16);
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({1, 2, 3, 4})),
      RegisterOp(5, "aten::mul_", "Scalar"),
      Op(5, {TensorValue(Ref(addr, {4})), DoubleValue(0.5)}, {}),
  });
  EXPECT_TRUE(errors.empty()) << errors[0].message();
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr, 16)).data()),
            (std::vector<float>{0.5f, 1, 1.5f, 2}));
}

// Untrusted clients (a raw protocol speaker, not torch_fl): operators that
// would build tensors over unchecked memory or touch the host are refused at
// register_op, naming the op; the session and the daemon go on.
TEST_F(ServerTest, ViewsFilesAndStoragesAreRefusedAtRegisterOp) {
  RawSession session(stub_.get());
  session.Open();
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::_reshape_alias", ""),
      RegisterOp(2, "aten::as_strided", ""),
      RegisterOp(3, "aten::from_file", ""),
      RegisterOp(4, "aten::set_", "source_Storage"),
      RegisterOp(5, "aten::view", ""),
      RegisterOp(7, "c10d::allreduce_", ""),
  });
  ASSERT_EQ(errors.size(), 6u);
  const char* names[] = {"aten::_reshape_alias", "aten::as_strided", "aten::from_file",
                         "aten::set_.source_Storage", "aten::view", "c10d::allreduce_"};
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_EQ(errors[i].code(), static_cast<int>(absl::StatusCode::kPermissionDenied))
        << errors[i].message();
    EXPECT_TRUE(absl::StrContains(errors[i].message(),
                                  absl::StrCat("register_op ", names[i], ": flagosd does not run")))
        << errors[i].message();
  }
  EXPECT_TRUE(absl::StrContains(errors[2].message(), "host files")) << errors[2].message();
  EXPECT_TRUE(absl::StrContains(errors[5].message(), "not an ATen operator")) << errors[5].message();
  // Served on: an ordinary op in the same session.
  const uint64_t addr = session.AllocateOk(16);
  EXPECT_TRUE(session
                  .RunAndSync({CopyTo(addr, FloatBytes({1, 2, 3, 4})),
                               RegisterOp(6, "aten::mul_", "Scalar"),
                               Op(6, {TensorValue(Ref(addr, {4})), DoubleValue(2)}, {})})
                  .empty());
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr, 16)).data()), (std::vector<float>{2, 4, 6, 8}));
}

// Issue 10, finding 2: aten::_cummax_helper writes self.size(dim) elements
// at values' stride. A one-element `values` (its own extent: 4 bytes of the
// attacker's segment) with a stride reaching another session's segment
// would write there; the daemon checks values' and indices' sizes against
// self's before the kernel runs.
TEST_F(ServerTest, AKernelCannotWriteThroughAMutatedArgumentIntoAnotherSession) {
  RawSession first(stub_.get());
  first.Open("first");
  RawSession second(stub_.get());
  second.Open("second");
  const uint64_t first_addr = first.AllocateOk(4096);
  const uint64_t second_addr = second.AllocateOk(4096);
  // Strides are never negative: the session at the lower address attacks.
  const bool first_attacks = first_addr < second_addr;
  RawSession& a = first_attacks ? first : second;
  RawSession& b = first_attacks ? second : first;
  const uint64_t a_addr = std::min(first_addr, second_addr);
  const uint64_t b_addr = std::max(first_addr, second_addr);
  ASSERT_EQ((b_addr - a_addr) % sizeof(float), 0u);
  const std::string marker = FloatBytes({7, 7, 7, 7});
  ASSERT_TRUE(b.RunAndSync({CopyTo(b_addr, marker)}).empty());

  const v1::TensorRef self = Ref(a_addr, {2});
  v1::TensorRef values = Ref(a_addr + 64, {1});
  values.set_strides(0, static_cast<int64_t>((b_addr - a_addr - 64) / sizeof(float)));
  const v1::TensorRef indices = Ref(a_addr + 128, {2}, kLong);
  std::vector<v1::Completion> errors = a.RunAndSync({
      CopyTo(a_addr, FloatBytes({1, 2})),
      RegisterOp(1, "aten::_cummax_helper", ""),
      Op(1, {TensorValue(self), TensorValue(values), TensorValue(indices), IntValue(0)}, {}),
  });
  EXPECT_EQ(errors.size(), 1u);
  for (const v1::Completion& e : errors) {
    EXPECT_EQ(e.code(), kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(
        e.message(),
        "aten::_cummax_helper: argument 'values' (#1) must have the sizes of argument 'self' "
        "(#0), [2], but has sizes [1]"))
        << e.message();
  }
  EXPECT_EQ(Floats(b.Call(CopyFrom(b_addr, marker.size())).data()),
            (std::vector<float>{7, 7, 7, 7}))
      << "the kernel wrote into the other session's segment";

  // The same op with arguments of the right sizes runs, in the same session.
  errors = a.RunAndSync({Op(1,
                            {TensorValue(self), TensorValue(Ref(a_addr + 64, {2})),
                             TensorValue(indices), IntValue(0)},
                            {})});
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.message();
  EXPECT_EQ(Floats(a.Call(CopyFrom(a_addr + 64, 8)).data()), (std::vector<float>{1, 2}));
  EXPECT_EQ(b.Call(CopyFrom(b_addr, marker.size())).data(), marker);

  // The daemon is alive and serves another client.
  RawSession other(stub_.get());
  other.Open("other");
  const uint64_t addr = other.AllocateOk(16);
  EXPECT_TRUE(other
                  .RunAndSync({CopyTo(addr, FloatBytes({1, 2, 3, 4})),
                               RegisterOp(1, "aten::mul_", "Scalar"),
                               Op(1, {TensorValue(Ref(addr, {4})), DoubleValue(2)}, {})})
                  .empty());
  EXPECT_EQ(Floats(other.Call(CopyFrom(addr, 16)).data()), (std::vector<float>{2, 4, 6, 8}));
}

// Issue 10, crash 5: _cummax_helper with a values stride of 2^31-1 wrote
// 8 GiB past values (a segfault). A one-element values is refused by its
// sizes; one of self's sizes with that stride spans beyond the segment.
TEST_F(ServerTest, AHugeStrideOnAMutatedArgumentIsRefusedNotCrashed) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4096);
  const std::string marker = FloatBytes({7, 7, 7, 7});
  constexpr int64_t kStride = (int64_t{1} << 31) - 1;
  v1::TensorRef one = Ref(addr + 64, {1});
  one.set_strides(0, kStride);
  v1::TensorRef two = Ref(addr + 64, {2});
  two.set_strides(0, kStride);
  const v1::TensorRef self = Ref(addr, {2});
  const v1::TensorRef indices = Ref(addr + 128, {2}, kLong);
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({1, 2})),
      CopyTo(addr + 256, marker),
      RegisterOp(1, "aten::_cummin_helper", ""),
      Op(1, {TensorValue(self), TensorValue(one), TensorValue(indices), IntValue(0)}, {}),
      Op(1, {TensorValue(self), TensorValue(two), TensorValue(indices), IntValue(0)}, {}),
      Op(1, {TensorValue(self), TensorValue(Ref(addr + 64, {2})), TensorValue(one), IntValue(0)},
         {}),
  });
  ASSERT_EQ(errors.size(), 3u);
  for (const v1::Completion& e : errors) EXPECT_EQ(e.code(), kInvalidArgument) << e.message();
  EXPECT_TRUE(absl::StrContains(
      errors[0].message(),
      "aten::_cummin_helper: argument 'values' (#1) must have the sizes of argument 'self' "
      "(#0), [2], but has sizes [1]"))
      << errors[0].message();
  EXPECT_TRUE(absl::StrContains(errors[1].message(), "outside this session's segments"))
      << errors[1].message();
  EXPECT_TRUE(absl::StrContains(
      errors[2].message(),
      "aten::_cummin_helper: argument 'indices' (#2) must have the sizes of argument 'self' "
      "(#0), [2], but has sizes [1]"))
      << errors[2].message();
  EXPECT_EQ(session.Call(CopyFrom(addr + 256, marker.size())).data(), marker);
  RawSession other(stub_.get());
  other.Open("other");
  EXPECT_EQ(other.Call(CopyFrom(other.AllocateOk(16), 16)).code(), 0);
}

// torch.quasirandom.SobolEngine's kernels index their tensors by int
// arguments (_sobol_engine_ff_ writes quasi[j] for j < dimension): no
// argument rule bounds them, and torch_fl never forwards them (the engine
// keeps its state on the CPU), so register_op refuses them.
TEST_F(ServerTest, SobolEngineKernelsAreRefusedAtRegisterOp) {
  RawSession session(stub_.get());
  session.Open();
  const char* names[] = {"aten::_sobol_engine_ff_", "aten::_sobol_engine_scramble_",
                         "aten::_sobol_engine_initialize_state_", "aten::_sobol_engine_draw"};
  std::vector<v1::Command> commands;
  for (int i = 0; i < 4; ++i) commands.push_back(RegisterOp(i + 1, names[i], ""));
  std::vector<v1::Completion> errors = session.RunAndSync(std::move(commands));
  ASSERT_EQ(errors.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(errors[i].code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_TRUE(absl::StrContains(
        errors[i].message(),
        absl::StrCat("register_op ", names[i],
                     ": flagosd does not run this operator: its kernel indexes its tensors by "
                     "its int arguments")))
        << errors[i].message();
  }
}

// _cummax_helper's kernel walks every dimension but `dim` without wrapping
// it: a negative dim corrupted flagosd's heap even with tensors of one
// shape. It must be a dimension of self, 0 <= dim < self.dim().
TEST_F(ServerTest, AnUnwrappedDimensionOfACumulativeHelperIsRefused) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4096);
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({3, 1, 2, 6, 5, 4})),
      RegisterOp(1, "aten::_cummax_helper", ""),
      Op(1, {TensorValue(Ref(addr, {2, 3})), TensorValue(Ref(addr + 64, {2, 3})),
             TensorValue(Ref(addr + 128, {2, 3}, kLong)), IntValue(-1)},
         {}),
      Op(1, {TensorValue(Ref(addr, {2, 3})), TensorValue(Ref(addr + 64, {2, 3})),
             TensorValue(Ref(addr + 128, {2, 3}, kLong)), IntValue(1)},
         {}),
  });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(errors[0].message(),
                                "aten::_cummax_helper: argument 'dim' (#3) must be a dimension of "
                                "argument 'self' (#0) (0..1, not wrapped), but is -1"))
      << errors[0].message();
  // dim 1, in range, ran: the running maximum of each row.
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 64, 24)).data()),
            (std::vector<float>{3, 3, 3, 6, 6, 6}));
}

// Rules of other shapes (op_argument_rules.h): state lists of the fused
// optimizers are dense and of their parameters' sizes; batch norm's
// statistics have one element per channel.
TEST_F(ServerTest, FusedOptimizerAndBatchNormStateIsCheckedAgainstItsParameters) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4096);
  const auto list = [](std::initializer_list<v1::TensorRef> refs) {
    v1::Value value;
    value.mutable_list();
    for (const v1::TensorRef& ref : refs) *value.mutable_list()->add_values()->mutable_tensor() = ref;
    return value;
  };
  v1::TensorRef broadcast = Ref(addr + 512, {16});
  broadcast.set_strides(0, 0);
  v1::Value momentum = DoubleValue(0.9);
  v1::Value no;
  no.set_b(false);
  v1::Value yes;
  yes.set_b(true);
  const v1::TensorRef param = Ref(addr, {16});
  const v1::TensorRef grad = Ref(addr + 64, {16});
  v1::Value input = TensorValue(Ref(addr + 1024, {2, 16, 1}));
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::_fused_sgd_", ""),
      // weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step
      Op(1, {list({param}), list({grad}), list({Ref(addr + 128, {4})}), DoubleValue(0), momentum,
             DoubleValue(0.1), DoubleValue(0), no, no, no},
         {}),
      Op(1, {list({param}), list({grad}), list({broadcast}), DoubleValue(0), momentum,
             DoubleValue(0.1), DoubleValue(0), no, no, no},
         {}),
      RegisterOp(2, "aten::native_batch_norm", ""),
      Op(2, {input, NoneValue(), NoneValue(), TensorValue(Ref(addr + 256, {1})),
             TensorValue(Ref(addr + 320, {16})), yes, DoubleValue(0.1), DoubleValue(1e-5)},
         {}),
  });
  ASSERT_EQ(errors.size(), 3u);
  for (const v1::Completion& e : errors) EXPECT_EQ(e.code(), kInvalidArgument) << e.message();
  EXPECT_TRUE(absl::StrContains(errors[0].message(),
                                "aten::_fused_sgd_: argument 'momentum_buffer_list' (#2) element 0 "
                                "must have the sizes of argument 'self' (#0), [16], but has sizes [4]"))
      << errors[0].message();
  EXPECT_TRUE(absl::StrContains(errors[1].message(),
                                "aten::_fused_sgd_: argument 'momentum_buffer_list' (#2) element 0 "
                                "must be dense"))
      << errors[1].message();
  EXPECT_TRUE(absl::StrContains(errors[2].message(),
                                "aten::native_batch_norm: argument 'running_mean' (#3) must have "
                                "sizes [16] (the channels of argument 'input' (#0))"))
      << errors[2].message();
}

TEST_F(ServerTest, EnumArgumentsOutOfRangeAreRefusedNotCrashed) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(16);
  v1::Value sizes;
  sizes.mutable_ints()->add_values(4);
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::empty", "memory_format"),
      RegisterOp(2, "aten::zeros", ""),
      RegisterOp(3, "aten::empty_like", ""),
      Op(1, {sizes, IntValue(200)}, {Ref(addr, {4})}),
      Op(2, {sizes, IntValue(-1)}, {Ref(addr, {4})}),
      Op(1, {sizes, NoneValue(), IntValue(99)}, {Ref(addr, {4})}),
      Op(3, {TensorValue(Ref(addr, {4})), NoneValue(), NoneValue(), NoneValue(), NoneValue(),
             IntValue(17)},
         {Ref(addr, {4})}),
  });
  ASSERT_EQ(errors.size(), 4u);
  const char* expected[] = {"200 is not a ScalarType", "-1 is not a ScalarType",
                            "99 is not a Layout", "17 is not a MemoryFormat"};
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_EQ(errors[i].code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
        << errors[i].message();
    EXPECT_TRUE(absl::StrContains(errors[i].message(), expected[i])) << errors[i].message();
  }
  // Alive, and serving.
  EXPECT_EQ(session.Call(CopyFrom(addr, 16)).code(), 0);
}

// Streams that never send `open` hold a server thread each, outside
// --max-sessions: at most max_pending_opens wait at once, each until the
// open deadline, then they are cancelled and others are served.
TEST_F(ServerTest, StreamsThatNeverOpenAreBoundedAndCancelled) {
  std::vector<std::unique_ptr<RawSession>> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<RawSession>(stub_.get()));
  for (int i = 0; i < 200 && server_->pending_opens() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_->pending_opens(), 3u);

  RawSession refused(stub_.get());
  v1::ServerMessage reply;
  EXPECT_FALSE(refused.stream().Read(&reply));
  grpc::Status status = refused.stream().Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "3 connections are waiting to open a session already (each may wait 2s for its "
            "`open`); try again");

  for (auto& stream : idle) {  // cancelled at the deadline, with no help from the client
    EXPECT_FALSE(stream->stream().Read(&reply));
    EXPECT_EQ(stream->stream().Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  idle.clear();
  RawSession served(stub_.get());
  served.Open();
  EXPECT_NE(served.AllocateOk(64), 0u);
  // A cancelled stream's ticket is returned when its server thread sees the
  // cancel, which may be after its client did (under load: ASan, ctest -j2).
  for (int i = 0; i < 500 && server_->pending_opens() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->pending_opens(), 0u);
}

// Fair admission: the streams waiting for `open` are shared out, so that no
// connection or user can keep the others from opening sessions.
class FairAdmissionTest : public ServerTest {
 protected:
  void Configure(ServerOptions* options) override {
    options->max_sessions = 8;
    options->max_pending_opens = 64;  // one user: 64 / 4 = 16 of them
    options->open_deadline = absl::Seconds(20);
  }

  // A stub on a connection of its own (channels with the same arguments
  // would otherwise share one connection).
  std::unique_ptr<v1::Flagos::Stub> NewConnection() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("flagos.test.connection", ++connections_);
    return v1::Flagos::NewStub(
        grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), args));
  }

  // Waits until `n` streams wait for their `open`.
  void AwaitPending(size_t n) {
    for (int i = 0; i < 500 && server_->pending_opens() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(server_->pending_opens(), n);
  }

  // The status a stream that was refused before `open` ends with.
  static grpc::Status Refusal(RawSession& session) {
    v1::ServerMessage reply;
    EXPECT_FALSE(session.stream().Read(&reply));
    return session.stream().Finish();
  }

  int connections_ = 0;
};

TEST_F(FairAdmissionTest, OneConnectionCannotHoldEveryWaitingSlot) {
  // 200 streams on one connection that never send `open`.
  std::unique_ptr<v1::Flagos::Stub> greedy = NewConnection();
  std::vector<std::unique_ptr<RawSession>> idle;
  for (int i = 0; i < kMaxPendingOpensPerConnection; ++i) {
    idle.push_back(std::make_unique<RawSession>(greedy.get()));
  }
  AwaitPending(kMaxPendingOpensPerConnection);
  int refused = 0;
  std::string message;
  for (int i = 0; i < 196; ++i) {
    RawSession more(greedy.get());
    grpc::Status status = Refusal(more);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    refused += status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? 1 : 0;
    message = status.error_message();
  }
  EXPECT_EQ(refused, 196);
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("has ", kMaxPendingOpensPerConnection,
                                                      " session streams waiting to send `open` "
                                                      "already, the most one connection may")))
      << message;
  EXPECT_EQ(server_->pending_opens(), kMaxPendingOpensPerConnection);
  // Another connection opens a session at once, and it works.
  std::unique_ptr<v1::Flagos::Stub> other = NewConnection();
  RawSession served(other.get());
  const uint64_t id = served.Open();
  if (id == 0) FAIL() << served.stream().Finish().error_message();
  EXPECT_NE(served.AllocateOk(64), 0u);
}

TEST_F(FairAdmissionTest, OneUserCannotHoldEveryWaitingSlot) {
  // Every connection here is this process's user: a quarter of the 64, on
  // four connections of four streams each.
  std::vector<std::unique_ptr<v1::Flagos::Stub>> stubs;
  std::vector<std::unique_ptr<RawSession>> idle;
  for (int c = 0; c < 4; ++c) {
    stubs.push_back(NewConnection());
    for (size_t i = 0; i < kMaxPendingOpensPerConnection; ++i) {
      idle.push_back(std::make_unique<RawSession>(stubs.back().get()));
    }
  }
  AwaitPending(16);
  stubs.push_back(NewConnection());
  RawSession refused(stubs.back().get());
  grpc::Status status = Refusal(refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(
      status.error_message(),
      absl::StrCat("uid ", getuid(), " has 16 session streams waiting to send `open` already, "
                   "the most one user may of the daemon's 64")))
      << status.error_message();
  // Once one of them opens, the user may wait with another.
  EXPECT_NE(idle[0]->Open(), 0u);
  AwaitPending(15);
  RawSession next(stubs.back().get());
  EXPECT_NE(next.Open(), 0u);
}

class AdmissionPerUidTest : public FairAdmissionTest {
 protected:
  void Configure(ServerOptions* options) override {
    FairAdmissionTest::Configure(options);
    options->max_sessions_per_uid = 2;
  }
};

TEST_F(AdmissionPerUidTest, StreamsWaitingToOpenCountAgainstMaxSessionsPerUid) {
  std::unique_ptr<v1::Flagos::Stub> first = NewConnection();
  RawSession live(first.get());
  EXPECT_NE(live.Open(), 0u);
  std::unique_ptr<v1::Flagos::Stub> second = NewConnection();
  RawSession waiting(second.get());
  AwaitPending(1);
  // One session open and one stream about to open: the user's two.
  std::unique_ptr<v1::Flagos::Stub> third = NewConnection();
  RawSession refused(third.get());
  grpc::Status status = Refusal(refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(),
                                absl::StrCat("uid ", getuid(), " has 1 session streams waiting "
                                             "to send `open`, as many as the sessions "
                                             "--max-sessions-per-uid still lets it open")))
      << status.error_message();
  // Both open: the next is refused as a third session.
  EXPECT_NE(waiting.Open(), 0u);
  std::unique_ptr<v1::Flagos::Stub> fourth = NewConnection();
  RawSession third_session(fourth.get());
  status = Refusal(third_session);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(),
                                absl::StrCat("uid ", getuid(), " has 2 sessions open, the most "
                                             "--max-sessions-per-uid=2 allows one user")))
      << status.error_message();
}

// Finding 3 of the untrusted-client review: memory a kernel gets from the
// daemon's heap held other sessions' bytes (aten::empty writes nothing). B
// moves marker bytes through host tensors; A's empty, returned by value and
// into its own segment through out= scratch, holds zeroes.
TEST_F(ServerTest, NoSessionSeesBytesItDidNotWrite) {
  constexpr int kBytes = 64 << 10;  // below malloc's mmap threshold: heap reuse
  constexpr int kUint8 = 0;         // c10::ScalarType::Byte
  const std::string marker(kBytes, '\x5a');
  {
    RawSession b(stub_.get());
    b.Open("b");
    const uint64_t addr = b.AllocateOk(kBytes);
    std::vector<v1::Command> commands = {CopyTo(addr, marker), RegisterOp(1, "aten::clone", "")};
    std::vector<v1::Completion> errors = b.RunAndSync(std::move(commands));
    for (const v1::Completion& e : errors) ADD_FAILURE() << e.message();
    for (int i = 0; i < 32; ++i) {  // host tensors of B's bytes, made and freed
      v1::Completion c = b.Call(Op(1, {TensorValue(Ref(addr, {kBytes}, kUint8))}, {}, true));
      ASSERT_EQ(c.code(), 0) << c.message();
      ASSERT_EQ(c.values(0).host_tensor().data(), marker);
    }
  }
  RawSession a(stub_.get());
  a.Open("a");
  const uint64_t addr = a.AllocateOk(kBytes);
  v1::Value sizes;
  sizes.mutable_ints()->add_values(kBytes);
  a.Send({RegisterOp(1, "aten::empty", "memory_format"), RegisterOp(2, "aten::empty", "out")});
  for (int i = 0; i < 32; ++i) {
    v1::Completion c = a.Call(Op(1, {sizes, IntValue(kUint8)}, {}, true));
    ASSERT_EQ(c.code(), 0) << c.message();
    const std::string& bytes = c.values(0).host_tensor().data();
    ASSERT_EQ(bytes.size(), static_cast<size_t>(kBytes));
    ASSERT_EQ(bytes.find('\x5a'), std::string::npos) << "aten::empty returned B's bytes";
  }
  std::vector<v1::Completion> errors =
      a.RunAndSync({Op(2, {sizes, NoneValue(), TensorValue(Ref(addr, {kBytes}, kUint8))}, {})});
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.message();
  EXPECT_EQ(a.Call(CopyFrom(addr, kBytes)).data().find('\x5a'), std::string::npos)
      << "empty.out wrote B's bytes into A's segment";
}

// A client's free text reaches operators' terminals (flagos-smi) and every
// GetStats reply: huge or hostile text is cut and made printable at `open`.
TEST_F(ServerTest, ClientTextIsCappedAndMadePrintable) {
  // Parsing a 149 MB `open` can take longer than the fixture's 2 s open
  // deadline on a loaded machine.
  ServerOptions options = DefaultServerOptions();
  options.open_deadline = absl::Seconds(60);
  Restart(DefaultBackendOptions(), options);
  RawSession session(stub_.get());
  const std::string escape = "\x1b[2J\x1b]0;owned\x07\n";
  session.Open(escape + std::string(140 << 20, 'n'), escape + std::string(1 << 20, 'v'),
               escape + std::string(8 << 20, 'c'));
  v1::GetStatsResponse stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  const v1::SessionInfo& info = stats.sessions(0);
  EXPECT_EQ(info.client().size(), 256u);
  EXPECT_EQ(info.torch_version().size(), 64u);
  EXPECT_EQ(info.command_line().size(), 4096u);
  for (const std::string* text : {&info.client(), &info.torch_version(), &info.command_line()}) {
    EXPECT_TRUE(absl::EndsWith(*text, "..."));
    for (char c : *text) {
      ASSERT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7f) << "a control character";
    }
  }
  // Served on.
  const uint64_t addr = session.AllocateOk(16);
  EXPECT_EQ(session.Call(CopyFrom(addr, 16)).code(), 0);
}

TEST_F(ServerTest, AnOversizedOpNameIsRefusedWithoutBeingEchoed) {
  RawSession session(stub_.get());
  session.Open();
  std::vector<v1::Completion> errors =
      session.RunAndSync({RegisterOp(1, std::string(1 << 20, 'x'), "")});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "the limit is 256")) << errors[0].message();
  EXPECT_LT(errors[0].message().size(), 300u);
}

TEST_F(ServerTest, HeldResultsStayInTheDaemonUntilPlaced) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  session.Send({CopyTo(addr, FloatBytes({0, 7, 0, 9})), RegisterOp(1, "aten::nonzero", "")});
  v1::Command op = Op(1, {TensorValue(Ref(addr, {4}))}, {}, true);
  op.mutable_op()->set_hold_results(true);
  v1::Completion nonzero = session.Call(std::move(op));
  ASSERT_EQ(nonzero.code(), 0) << nonzero.message();
  ASSERT_EQ(nonzero.values_size(), 1);
  ASSERT_TRUE(nonzero.values(0).has_held()) << "the result's bytes came back to the client";
  const v1::HeldTensor& held = nonzero.values(0).held();
  EXPECT_EQ(std::vector<int64_t>(held.sizes().begin(), held.sizes().end()),
            (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(held.dtype(), kLong);

  // A destination of the wrong shape is refused and the result kept.
  v1::Command bad;
  bad.mutable_place_result()->set_id(held.id());
  *bad.mutable_place_result()->mutable_dst() = Ref(addr + 16, {3}, kLong);
  v1::Command place;
  place.mutable_place_result()->set_id(held.id());
  *place.mutable_place_result()->mutable_dst() = Ref(addr + 32, {2, 1}, kLong);
  // A destination outside the session's segments is refused too.
  v1::Command outside;
  outside.mutable_place_result()->set_id(held.id());
  *outside.mutable_place_result()->mutable_dst() = Ref(addr + (1 << 20), {2, 1}, kLong);
  v1::Command again = place;  // placed already: not found
  std::vector<v1::Completion> errors = session.RunAndSync({bad, outside, place, again});
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[0].code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << errors[0].message();
  EXPECT_EQ(errors[1].code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << errors[1].message();
  EXPECT_EQ(errors[2].code(), static_cast<int>(absl::StatusCode::kNotFound)) << errors[2].message();
  std::string bytes = session.Call(CopyFrom(addr + 32, 16)).data();
  std::vector<int64_t> indices(2);
  std::memcpy(indices.data(), bytes.data(), 16);
  EXPECT_EQ(indices, (std::vector<int64_t>{1, 3}));
}

TEST_F(ServerTest, OpWithWantValuesReturnsScalarsAndHostTensors) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(16);
  session.Send({CopyTo(addr, FloatBytes({0, 7, 0, 9})), RegisterOp(1, "aten::nonzero", ""),
                RegisterOp(2, "aten::_local_scalar_dense", "")});
  v1::Completion nonzero = session.Call(Op(1, {TensorValue(Ref(addr, {4}))}, {}, true));
  ASSERT_EQ(nonzero.code(), 0) << nonzero.message();
  ASSERT_EQ(nonzero.values_size(), 1);
  const v1::HostTensor& indices = nonzero.values(0).host_tensor();
  EXPECT_EQ(std::vector<int64_t>(indices.sizes().begin(), indices.sizes().end()),
            (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(indices.dtype(), kLong);
  std::vector<int64_t> index_values(2);
  ASSERT_EQ(indices.data().size(), 16u);
  std::memcpy(index_values.data(), indices.data().data(), 16);
  EXPECT_EQ(index_values, (std::vector<int64_t>{1, 3}));

  v1::Completion item = session.Call(Op(2, {TensorValue(Ref(addr + 4, {}))}, {}, true));
  ASSERT_EQ(item.code(), 0) << item.message();
  ASSERT_EQ(item.values_size(), 1);
  EXPECT_EQ(item.values(0).d(), 7.0);
}

TEST_F(ServerTest, WantValuesCarriesOneValuePerReturn) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  const v1::TensorRef matrix = Ref(addr, {2, 3});
  const v1::TensorRef values = Ref(addr + 32, {2});
  v1::TensorRef indices = Ref(addr + 48, {2}, kLong);
  session.Send({CopyTo(addr, FloatBytes({1, 9, 2, 8, 3, 7})), RegisterOp(1, "aten::max", "dim"),
                RegisterOp(2, "aten::add_", "Tensor")});
  // Tensor returns copied into outputs come back as none.
  v1::Completion max = session.Call(
      Op(1, {TensorValue(matrix), IntValue(1), [] { v1::Value v; v.set_b(false); return v; }()},
         {values, indices}, /*want_values=*/true));
  ASSERT_EQ(max.code(), 0) << max.message();
  ASSERT_EQ(max.values_size(), 2);
  EXPECT_TRUE(max.values(0).has_none());
  EXPECT_TRUE(max.values(1).has_none());
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 32, 8)).data()), (std::vector<float>{9, 8}));
  std::string index_bytes = session.Call(CopyFrom(addr + 48, 16)).data();
  std::vector<int64_t> index_values(2);
  std::memcpy(index_values.data(), index_bytes.data(), 16);
  EXPECT_EQ(index_values, (std::vector<int64_t>{1, 0}));
  // A return written in place comes back as none, and so does the written
  // argument behind it (it kept its size).
  v1::Completion add = session.Call(
      Op(2, {TensorValue(values), TensorValue(values), IntValue(1)}, {}, /*want_values=*/true));
  ASSERT_EQ(add.code(), 0) << add.message();
  ASSERT_EQ(add.values_size(), 2);
  EXPECT_TRUE(add.values(0).has_none());
  EXPECT_TRUE(add.values(1).has_none());
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 32, 8)).data()), (std::vector<float>{18, 16}));
}

TEST_F(ServerTest, SynchronousPathReturnsResizedOutArgumentsByValue) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  const v1::TensorRef input = Ref(addr, {4});
  const v1::TensorRef empty_out = Ref(addr + 32, {0}, kLong);
  session.Send({CopyTo(addr, FloatBytes({0, 5, 0, 7})), RegisterOp(1, "aten::nonzero", "out")});
  v1::Completion nonzero =
      session.Call(Op(1, {TensorValue(input), TensorValue(empty_out)}, {}, /*want_values=*/true));
  ASSERT_EQ(nonzero.code(), 0) << nonzero.message();
  // One value for the return (held by the client: none), one for `out`.
  ASSERT_EQ(nonzero.values_size(), 2);
  EXPECT_TRUE(nonzero.values(0).has_none());
  ASSERT_TRUE(nonzero.values(1).has_host_tensor());
  const v1::HostTensor& out = nonzero.values(1).host_tensor();
  EXPECT_EQ(std::vector<int64_t>(out.sizes().begin(), out.sizes().end()),
            (std::vector<int64_t>{2, 1}));
  std::vector<int64_t> indices(2);
  ASSERT_EQ(out.data().size(), 16u);
  std::memcpy(indices.data(), out.data().data(), 16);
  EXPECT_EQ(indices, (std::vector<int64_t>{1, 3}));
}

TEST_F(ServerTest, ListArgumentsAndDefaultsFollowTheSchema) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(256);
  const v1::TensorRef a = Ref(addr, {2});
  const v1::TensorRef b = Ref(addr + 8, {2});
  const v1::TensorRef index = Ref(addr + 16, {2}, kLong);
  const v1::TensorRef cat_out = Ref(addr + 64, {4});
  const v1::TensorRef index_out = Ref(addr + 96, {2});
  const v1::TensorRef sum_out = Ref(addr + 128, {});
  std::string index_bytes(16, '\0');
  const int64_t picks[2] = {1, 0};
  std::memcpy(index_bytes.data(), picks, 16);
  v1::Value tensors;
  *tensors.mutable_list()->add_values() = TensorValue(a);
  *tensors.mutable_list()->add_values() = TensorValue(b);
  v1::Value optional_tensors;
  *optional_tensors.mutable_list()->add_values() = TensorValue(index);
  v1::Value dims;
  dims.mutable_ints()->add_values(0);
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({1, 2, 3, 4})),
      CopyTo(addr + 16, index_bytes),
      RegisterOp(1, "aten::cat", ""),
      RegisterOp(2, "aten::index", "Tensor"),
      RegisterOp(3, "aten::sum", "dim_IntList"),
      Op(1, {tensors, IntValue(0)}, {cat_out}),              // Tensor[]
      Op(2, {TensorValue(a), optional_tensors}, {index_out}),  // Tensor?[]
      Op(3, {TensorValue(cat_out), dims}, {sum_out}),          // int[1]?, defaults after
  });
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.seq() << ": " << e.message();
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 64, 16)).data()),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 96, 8)).data()), (std::vector<float>{2, 1}));
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 128, 4)).data()), (std::vector<float>{10}));
}

TEST_F(ServerTest, OutVariantMayUseItsOutTensorAsScratch) {
  // aten::mse_loss.out resizes `out` to the input's shape internally before
  // reducing into it; the segment behind `out` cannot grow.
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  const v1::TensorRef input = Ref(addr, {2, 2});
  const v1::TensorRef target = Ref(addr + 16, {2, 2});
  const v1::TensorRef out = Ref(addr + 32, {});
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({1, 2, 3, 4, 1, 1, 1, 1})),
      RegisterOp(1, "aten::mse_loss", "out"),
      Op(1, {TensorValue(input), TensorValue(target), IntValue(1), TensorValue(out)}, {}),
  });
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.seq() << ": " << e.message();
  // mean of (0, 1, 4, 9)
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 32, 4)).data()), (std::vector<float>{3.5f}));
  // Nothing beyond `out` was touched.
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 36, 4)).data()), (std::vector<float>{0}));
}

TEST_F(ServerTest, OutputWithWrongSizesIsAnError) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::neg", ""),
      Op(1, {TensorValue(Ref(addr, {4}))}, {Ref(addr + 16, {2})}),
  });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "aten::neg")) << errors[0].message();
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "[2]")) << errors[0].message();
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "[4]")) << errors[0].message();
}

TEST_F(ServerTest, KernelErrorsNameTheOpWithoutABacktrace) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::mm", ""),
      Op(1, {TensorValue(Ref(addr, {2, 3})), TensorValue(Ref(addr, {2, 3}))}, {Ref(addr, {2, 3})}),
  });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(errors[0].message(), "aten::mm: ")) << errors[0].message();
  EXPECT_FALSE(absl::StrContains(errors[0].message(), "Exception raised from"));
}

TEST_F(ServerTest, RandomOpDependsOnlyOnSeedAndOffset) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(3 * 64);
  const auto uniform = [&](uint64_t dst, uint64_t seed, uint64_t offset) {
    v1::Value generator;
    generator.mutable_generator()->set_seed(seed);
    generator.mutable_generator()->set_offset(offset);
    return Op(1, {TensorValue(Ref(dst, {16})), DoubleValue(0), DoubleValue(1), generator}, {});
  };
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::uniform_", ""),
      uniform(addr, 42, 0),
      uniform(addr + 64, 42, 0),
      uniform(addr + 128, 42, 16),
  });
  ASSERT_TRUE(errors.empty()) << errors[0].message();
  const std::string first = session.Call(CopyFrom(addr, 64)).data();
  EXPECT_EQ(session.Call(CopyFrom(addr + 64, 64)).data(), first);
  EXPECT_NE(session.Call(CopyFrom(addr + 128, 64)).data(), first);
  for (float f : Floats(first)) {
    EXPECT_GE(f, 0.0f);
    EXPECT_LT(f, 1.0f);
  }
}

TEST_F(ServerTest, RandomOpWithoutAGeneratorArgumentUsesTheImplicitState) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(8192);
  const v1::TensorRef input = Ref(addr, {256});
  constexpr int kBool = 11;  // c10::ScalarType::Bool
  // Output k at addr + 1024 * (k + 1), its mask at addr + 4096 + 256 * k.
  const auto dropout = [&](uint64_t out, uint64_t seed, uint64_t offset) {
    const uint64_t mask = addr + 4096 + (out - addr - 1024) / 4;
    v1::Value train;
    train.set_b(true);
    v1::Command command = Op(2, {TensorValue(input), DoubleValue(0.5), train},
                             {Ref(out, {256}), Ref(mask, {256}, kBool)});
    command.mutable_op()->mutable_implicit_generator()->set_seed(seed);
    command.mutable_op()->mutable_implicit_generator()->set_offset(offset);
    return command;
  };
  std::vector<v1::Completion> errors = session.RunAndSync({
      RegisterOp(1, "aten::fill_", "Scalar"),
      Op(1, {TensorValue(input), DoubleValue(1.0)}, {}),
      RegisterOp(2, "aten::native_dropout", ""),
      dropout(addr + 1024, 7, 3),
      dropout(addr + 2048, 7, 3),
      dropout(addr + 3072, 7, 4),
  });
  ASSERT_TRUE(errors.empty()) << errors[0].message();
  const std::string first = session.Call(CopyFrom(addr + 1024, 1024)).data();
  EXPECT_EQ(session.Call(CopyFrom(addr + 2048, 1024)).data(), first);
  EXPECT_NE(session.Call(CopyFrom(addr + 3072, 1024)).data(), first);
  for (float f : Floats(first)) EXPECT_TRUE(f == 0.0f || f == 2.0f) << f;
}

TEST_F(ServerTest, AddressOutsideTheSegmentsIsAnErrorAndTheSessionGoesOn) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  std::vector<v1::Completion> errors = session.RunAndSync({CopyTo(addr + 60, std::string(8, 'x'))});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "outside this session's segments on flagos:0"))
      << errors[0].message();

  // An op reading beyond the segment fails the same way.
  errors = session.RunAndSync({RegisterOp(1, "aten::neg", ""),
                               Op(1, {TensorValue(Ref(addr, {32}))}, {Ref(addr, {32})})});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);

  // The session still works.
  session.Send({CopyTo(addr, FloatBytes({5}))});
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr, 4)).data()), (std::vector<float>{5}));
}

TEST_F(ServerTest, AnotherSessionsMemoryIsOutOfReach) {
  RawSession owner(stub_.get());
  owner.Open();
  const uint64_t addr = owner.AllocateOk(64);
  RawSession intruder(stub_.get());
  intruder.Open();
  v1::Completion read = intruder.Call(CopyFrom(addr, 64));
  EXPECT_EQ(read.code(), kInvalidArgument);
  EXPECT_TRUE(read.data().empty());
}

TEST_F(ServerTest, MalformedCommandsAreErrorCompletions) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  v1::TensorRef rank65 = Ref(addr, {});
  for (int i = 0; i < 65; ++i) {
    rank65.add_sizes(1);
    rank65.add_strides(1);
  }
  v1::TensorRef mismatched = Ref(addr, {4});
  mismatched.add_strides(1);
  v1::TensorRef negative = Ref(addr, {4});
  negative.set_sizes(0, -4);
  v1::TensorRef bad_dtype = Ref(addr, {4}, /*dtype=*/99);
  v1::TensorRef bad_device = Ref(addr, {4}, kFloat, /*device=*/9);
  v1::Command no_kind;
  v1::Command bad_command_device = CopyFrom(addr, 4, /*device=*/5);
  std::vector<v1::Command> commands = {RegisterOp(1, "aten::neg", "")};
  for (const v1::TensorRef& ref : {rank65, mismatched, negative, bad_dtype, bad_device}) {
    commands.push_back(Op(1, {TensorValue(ref)}, {Ref(addr, {4})}));
  }
  commands.push_back(Op(1, {IntValue(3)}, {Ref(addr, {4})}));              // wrong kind
  commands.push_back(Op(1, {TensorValue(Ref(addr, {4})), IntValue(1)}, {}));  // too many args
  commands.push_back(Op(77, {}, {}));                                       // unknown op id
  commands.push_back(no_kind);
  commands.push_back(bad_command_device);
  commands.push_back(RegisterOp(0, "aten::neg", ""));  // op id 0
  commands.push_back(RegisterOp(1, "aten::abs", ""));  // duplicate op id
  std::vector<v1::Completion> errors = session.RunAndSync(commands);
  ASSERT_EQ(errors.size(), commands.size() - 1);
  for (const v1::Completion& e : errors) {
    EXPECT_EQ(e.code(), kInvalidArgument) << e.seq() << ": " << e.message();
    EXPECT_FALSE(e.message().empty());
  }
  // Still serving.
  EXPECT_EQ(session.Call(CopyFrom(addr, 4)).code(), 0);
}

TEST_F(ServerTest, UnknownOperatorIsNotFound) {
  RawSession session(stub_.get());
  session.Open();
  v1::Completion completion = session.Call(RegisterOp(1, "aten::no_such_op", "Tensor"));
  // register_op replies only on error; Call waits for that reply.
  EXPECT_EQ(completion.code(), kNotFound);
  EXPECT_EQ(completion.message(), absl::StrCat("operator aten::no_such_op.Tensor is not registered "
                                               "in flagosd's torch ",
                                               TorchVersion(), " (the client's is unknown)"));
}

v1::Command RegisterOpWithSchema(uint32_t op_id, const std::string& name,
                                 const std::string& overload, const std::string& schema) {
  v1::Command command = RegisterOp(op_id, name, overload);
  command.mutable_register_op()->set_schema(schema);
  return command;
}

// Version skew: a client whose torch has another schema for an op is refused
// at register_op, with both schemas and both torch versions; a schema that
// differs only in argument names (which never travel) is the same op.
TEST_F(ServerTest, RegisterOpAdmitsOnlyTheDaemonsSchema) {
  RawSession session(stub_.get());
  session.Open("server_test", "2.99.0");
  const std::string own = OwnSchemaText("aten::add", "Tensor").value();
  ASSERT_EQ(own, "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");

  // alpha's default changed: a client omitting it would mean 2, the daemon 1.
  const std::string other_default =
      "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=2) -> Tensor";
  v1::Completion refused =
      session.Call(RegisterOpWithSchema(1, "aten::add", "Tensor", other_default));
  EXPECT_EQ(refused.code(), kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            absl::StrCat("register_op aten::add.Tensor: the client's schema differs from "
                         "flagosd's, so its arguments would be read in the wrong places. client "
                         "(torch 2.99.0): ",
                         other_default, "; flagosd (torch ", TorchVersion(), "): ", own,
                         ". Use a torch_fl built against flagosd's torch, or a flagosd built "
                         "against the client's"));
  // Re-typed, positional or missing arguments, other aliasing or returns and
  // text that does not parse are refused too.
  for (const std::string& schema : {
           std::string("aten::add.Tensor(Tensor self, int other, *, Scalar alpha=1) -> Tensor"),
           std::string("aten::add.Tensor(Tensor self, Scalar other, *, Scalar alpha=1) -> Tensor"),
           std::string("aten::add.Tensor(Tensor self, Tensor other, Scalar alpha=1) -> Tensor"),
           std::string("aten::add.Tensor(Tensor self, Tensor other) -> Tensor"),
           std::string("aten::add.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> "
                       "Tensor(a!)"),
           std::string("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> "
                       "(Tensor, Tensor)"),
           std::string("not a schema ((("),
       }) {
    v1::Completion c = session.Call(RegisterOpWithSchema(2, "aten::add", "Tensor", schema));
    EXPECT_EQ(c.code(), kFailedPrecondition) << schema;
    EXPECT_TRUE(absl::StrContains(c.message(), "the client's schema differs")) << c.message();
  }
  // Bad schemas are refused before anything parses them.
  v1::Completion empty = session.Call(RegisterOpWithSchema(3, "aten::add", "Tensor", ""));
  EXPECT_EQ(empty.code(), kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(empty.message(), "register_op aten::add.Tensor: no schema"))
      << empty.message();
  v1::Completion huge = session.Call(
      RegisterOpWithSchema(3, "aten::add", "Tensor", own + std::string(1 << 20, ' ')));
  EXPECT_EQ(huge.code(), kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(huge.message(), "the limit is 4096")) << huge.message();
  v1::Completion deep = session.Call(RegisterOpWithSchema(
      3, "aten::add", "Tensor",
      absl::StrCat("aten::add.Tensor(", std::string(1000, '('), "Tensor self) -> Tensor")));
  EXPECT_EQ(deep.code(), kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(deep.message(), "nests brackets deeper than 8")) << deep.message();

  // Other argument names: admitted, and the op runs.
  const uint64_t addr = session.AllocateOk(48);
  std::vector<v1::Completion> errors = session.RunAndSync({
      CopyTo(addr, FloatBytes({1, 2, 3, 4, 10, 20, 30, 40})),
      RegisterOpWithSchema(4, "aten::add", "Tensor",
                           "aten::add.Tensor(Tensor input, Tensor other, *, Scalar scale=1) -> "
                           "Tensor"),
      Op(4, {TensorValue(Ref(addr, {2, 2})), TensorValue(Ref(addr + 16, {2, 2})), IntValue(2)},
         {Ref(addr + 32, {2, 2})}),
  });
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.seq() << ": " << e.message();
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 32, 16)).data()),
            (std::vector<float>{21, 42, 63, 84}));
}

TEST_F(ServerTest, SequenceNumbersMustIncrease) {
  RawSession session(stub_.get());
  session.Open();
  session.Send({Sync()});  // seq 1 (its completion is read below)
  v1::ClientMessage message;
  v1::Command stale = Sync();
  stale.set_seq(1);
  *message.mutable_batch()->add_commands() = stale;
  ASSERT_TRUE(session.stream().Write(message));
  v1::Completion first = session.WaitFor(1);
  EXPECT_EQ(first.code(), 0);
  v1::Completion second = session.WaitFor(1);
  EXPECT_EQ(second.code(), kInvalidArgument);
}

TEST_F(ServerTest, AllocationBeyondDeviceMemoryIsResourceExhausted) {
  RawSession session(stub_.get());
  session.Open();
  v1::Completion completion = session.Call(Allocate(kDeviceMemory + 1));
  EXPECT_EQ(completion.code(), kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(completion.message(), "--device-memory")) << completion.message();
}

TEST_F(ServerTest, FreedSegmentIsOutOfReachAndItsMemoryReturns) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(kSessionMemory);
  std::vector<v1::Completion> errors = session.RunAndSync({Free(addr), CopyTo(addr, "x")});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  errors = session.RunAndSync({Free(addr)});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kNotFound);
  // The whole device is free again.
  session.AllocateOk(kSessionMemory);
}

// Op calls sent again byte for byte (sessions/repeated_op_calls.h): the
// second one is prepared, later ones run prepared (counted in
// flagosd_ops_repeated_total), and every one computes what the call
// computes.
class RepeatedOpCallsTest : public ServerTest {
 protected:
  void Configure(ServerOptions* options) override { options->metrics_listen = "127.0.0.1:0"; }

  // flagosd_ops_repeated_total of `device`.
  double RepeatedOps(int device) {
    for (const prometheus::MetricFamily& family : server_->metrics()->registry()->Collect()) {
      if (family.name != "flagosd_ops_repeated_total") continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          if (label.name == "device" && label.value == absl::StrCat(device)) {
            return metric.counter.value;
          }
        }
      }
    }
    ADD_FAILURE() << "no flagosd_ops_repeated_total for device " << device;
    return -1;
  }

  // `x.mul_(2.0)` over [1, 2, 3, 4] at `addr` (16 bytes of the session's),
  // sent three times, so that the third ran prepared; returns the command.
  v1::Command MulRunPrepared(RawSession& session, uint64_t addr) {
    const v1::Command mul = Op(1, {TensorValue(Ref(addr, {4})), DoubleValue(2.0)}, {});
    session.RunAndSync(
        {CopyTo(addr, FloatBytes({1, 2, 3, 4})), RegisterOp(1, "aten::mul_", "Scalar")});
    for (int i = 0; i < 3; ++i) session.RunAndSync({mul});
    EXPECT_EQ(RepeatedOps(0), 1);
    return mul;
  }
};

TEST_F(RepeatedOpCallsTest, ACallSentAgainRunsPreparedAndComputesWhatItComputes) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(32);
  const v1::Command mul = Op(1, {TensorValue(Ref(addr, {4})), DoubleValue(2.0)}, {});
  for (const v1::Completion& e : session.RunAndSync(
           {CopyTo(addr, FloatBytes({1, 2, 3, 4})), RegisterOp(1, "aten::mul_", "Scalar")})) {
    ADD_FAILURE() << e.message();
  }
  // One batch each; the first is remembered, the second prepared, the
  // rest run prepared.
  for (int i = 0; i < 6; ++i) {
    for (const v1::Completion& e : session.RunAndSync({mul})) ADD_FAILURE() << e.message();
  }
  EXPECT_EQ(RepeatedOps(0), 4);
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr, 16)).data()),
            (std::vector<float>{64, 128, 192, 256}));
  // Several in one batch, on another stream too (the stream is the
  // command's, not the call's).
  v1::Command on_stream = mul;
  on_stream.set_stream(7);
  for (const v1::Completion& e : session.RunAndSync({mul, mul, on_stream})) {
    ADD_FAILURE() << e.message();
  }
  EXPECT_GE(RepeatedOps(0), 6);
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr, 16)).data()),
            (std::vector<float>{512, 1024, 1536, 2048}));
  EXPECT_EQ(RepeatedOps(1), 0);
  EXPECT_TRUE(session.End().ok());
}

TEST_F(RepeatedOpCallsTest, APreparedCallOverFreedMemoryIsRefusedAsTheCallIs) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(16);
  const v1::Command mul = MulRunPrepared(session, addr);
  std::vector<v1::Completion> errors = session.RunAndSync({Free(addr), mul});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument) << errors[0].message();
  EXPECT_EQ(RepeatedOps(0), 1);
  // The memory again, at the same address or not: the same bytes are
  // checked again, and run.
  const uint64_t again = session.AllocateOk(16);
  session.RunAndSync({CopyTo(again, FloatBytes({1, 1, 1, 1}))});
  errors = session.RunAndSync({mul, mul, mul});
  if (again == addr) {
    EXPECT_TRUE(errors.empty()) << errors[0].message();
    EXPECT_EQ(Floats(session.Call(CopyFrom(again, 16)).data()),
              (std::vector<float>{8, 8, 8, 8}));
  } else {
    EXPECT_EQ(errors.size(), 3u);
  }
  EXPECT_TRUE(session.End().ok());
}

TEST_F(RepeatedOpCallsTest, ARepeatedCallOutOfSequenceIsRefusedAndNotRun) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(16);
  const v1::Command mul = MulRunPrepared(session, addr);
  v1::ClientMessage stale;
  v1::Command command = mul;
  command.set_seq(2);
  *stale.mutable_batch()->add_commands() = command;
  ASSERT_TRUE(session.stream().Write(stale));
  const std::vector<v1::Completion> errors = session.RunAndSync({});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "sequence numbers must strictly increase"))
      << errors[0].message();
  EXPECT_EQ(RepeatedOps(0), 1);
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr, 16)).data()), (std::vector<float>{8, 16, 24, 32}));
  EXPECT_TRUE(session.End().ok());
}

// A kernel error in a prepared call (a bad index in device memory, which
// no check before the kernel sees) is the call's error, and the session
// goes on.
TEST_F(RepeatedOpCallsTest, AKernelErrorOfAPreparedCallIsTheCallsError) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  const v1::TensorRef self = Ref(addr, {4});
  v1::TensorRef index = Ref(addr + 16, {2});
  index.set_dtype(kLong);
  const v1::TensorRef out = Ref(addr + 32, {2});
  auto longs = [](std::initializer_list<int64_t> values) {
    return std::string(reinterpret_cast<const char*>(std::data(values)), values.size() * 8);
  };
  session.RunAndSync({CopyTo(addr, FloatBytes({1, 2, 3, 4})), CopyTo(addr + 16, longs({3, 0})),
                      RegisterOp(1, "aten::index_select", "")});
  const v1::Command select = Op(1, {TensorValue(self), IntValue(0), TensorValue(index)}, {out});
  for (int i = 0; i < 3; ++i) {
    for (const v1::Completion& e : session.RunAndSync({select})) ADD_FAILURE() << e.message();
  }
  ASSERT_EQ(RepeatedOps(0), 1);
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 32, 8)).data()), (std::vector<float>{4, 1}));
  session.RunAndSync({CopyTo(addr + 16, longs({1, 9}))});
  std::vector<v1::Completion> errors = session.RunAndSync({select});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument) << errors[0].message();
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "index_select")) << errors[0].message();
  EXPECT_EQ(RepeatedOps(0), 2);
  session.RunAndSync({CopyTo(addr + 16, longs({2, 1}))});
  EXPECT_TRUE(session.RunAndSync({select}).empty());
  EXPECT_EQ(Floats(session.Call(CopyFrom(addr + 32, 8)).data()), (std::vector<float>{3, 2}));
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, FreeWaitsForEarlierCommandsOnEveryStream) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4 << 20);
  std::vector<v1::Command> commands;
  for (uint64_t stream = 1; stream <= 4; ++stream) {
    commands.push_back(CopyTo(addr, std::string(4 << 20, 'a'), 0, stream));
  }
  commands.push_back(Free(addr));
  EXPECT_TRUE(session.RunAndSync(commands).empty());
  EXPECT_EQ(Stats().devices(0).used_memory(), 0u);
}

TEST_F(ServerTest, StatsCountSessionsSegmentsAndCommands) {
  RawSession session(stub_.get());
  const uint64_t id = session.Open();
  session.AllocateOk(1000);
  session.AllocateOk(24, 1);
  v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.backend(), "cpu");
  EXPECT_EQ(stats.devices(0).used_memory(), 1000u);
  EXPECT_EQ(stats.devices(1).used_memory(), 24u);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).id(), id);
  EXPECT_EQ(stats.sessions(0).pid(), getpid());
  EXPECT_EQ(stats.sessions(0).client(), "server_test");
  EXPECT_EQ(stats.sessions(0).segments(), 2u);
  EXPECT_EQ(stats.sessions(0).segment_bytes(), 1024u);
  EXPECT_EQ(stats.sessions(0).commands(), 2u);
  EXPECT_GE(stats.sessions_total(), 1u);
}

TEST_F(ServerTest, ASessionsUserAndProcessAreTheKernelsNotTheClientsWord) {
  // The client claims another pid; the session's connection says who it is.
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream =
      stub_->Session(&context);
  v1::ClientMessage open;
  open.mutable_open()->set_version(1);
  open.mutable_open()->set_pid(1);
  ASSERT_TRUE(stream->Write(open));
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_opened());
  // A unix-socket session is offered the staging region.
  EXPECT_FALSE(reply.opened().staging_socket().empty());
  v1::GetStatsResponse stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  const v1::SessionInfo& info = stats.sessions(0);
  EXPECT_TRUE(info.credentials_from_kernel());
  EXPECT_EQ(info.pid(), getpid());
  EXPECT_EQ(info.uid(), getuid());
  EXPECT_EQ(info.gid(), getgid());
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, EndOfStreamFreesEverySegment) {
  {
    RawSession session(stub_.get());
    session.Open();
    session.AllocateOk(1 << 20);
    session.AllocateOk(1 << 20, 1);
    session.Send({CopyTo(session.AllocateOk(64), "pending work", 0, 3)});
    EXPECT_EQ(Stats().devices(0).used_memory(), (1u << 20) + 64);
    EXPECT_TRUE(session.End().ok());
  }
  v1::GetStatsResponse stats = StatsAfterSessionsEnd();
  EXPECT_EQ(stats.sessions_size(), 0);
  EXPECT_EQ(stats.devices(0).used_memory(), 0u);
  EXPECT_EQ(stats.devices(1).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(1)->free_bytes, kSessionMemory);
}

TEST_F(ServerTest, ClientThatDiesLeaksNothing) {
  {
    RawSession session(stub_.get());
    session.Open();
    session.AllocateOk(8 << 20);
    session.context().TryCancel();  // as if the process died mid-session
    EXPECT_EQ(session.End().error_code(), grpc::StatusCode::CANCELLED);
  }
  v1::GetStatsResponse stats = StatsAfterSessionsEnd();
  EXPECT_EQ(stats.sessions_size(), 0);
  EXPECT_EQ(stats.devices(0).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
}

TEST_F(ServerTest, SessionsBeyondTheLimitAreRefused) {
  std::vector<std::unique_ptr<RawSession>> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(std::make_unique<RawSession>(stub_.get()));
    sessions.back()->Open();
  }
  RawSession extra(stub_.get());
  v1::ClientMessage message;
  message.mutable_open()->set_version(1);
  ASSERT_TRUE(extra.stream().Write(message));
  EXPECT_EQ(extra.End().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(ServerTest, ShutdownCancelsLiveSessionsAndFreesTheirMemory) {
  RawSession session(stub_.get());
  session.Open();
  session.AllocateOk(1 << 20);
  server_->Shutdown(absl::Seconds(1));
  server_->Wait();
  EXPECT_FALSE(session.End().ok());
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
}

// ------------------------------------------------------- shared segments

v1::Command ExportMemory(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_export_memory()->set_addr(addr);
  return command;
}

v1::Command ImportMemory(const std::string& grant, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_import_memory()->set_grant(grant);
  return command;
}

v1::Command ReleaseImport(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_release_import()->set_addr(addr);
  return command;
}

v1::Command QueryExport(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_query_export()->set_addr(addr);
  return command;
}

TEST_F(ServerTest, ASharedSegmentLivesUntilEveryHolderReleasedIt) {
  // Raw sessions attach no staging region, so flagosd knows no uid for
  // them: the user rule is tested with real processes (test_sharing.py).
  StartServer(MemoryGrants::Policy::kAnyUser);
  RawSession owner(stub_.get());
  owner.Open();
  const uint64_t seg = owner.AllocateOk(4096);
  const std::string marker = "written by the owner before the export";
  owner.Send({CopyTo(seg, marker)});
  v1::Completion exported = owner.Call(ExportMemory(seg + 100));
  ASSERT_EQ(exported.code(), 0) << exported.message();
  EXPECT_EQ(exported.grant().size(), 16u);
  EXPECT_EQ(exported.addr(), seg);
  EXPECT_EQ(exported.segment_nbytes(), 4096u);

  RawSession receiver(stub_.get());
  receiver.Open();
  v1::Completion imported = receiver.Call(ImportMemory(exported.grant()));
  ASSERT_EQ(imported.code(), 0) << imported.message();
  EXPECT_EQ(imported.addr(), seg);
  EXPECT_EQ(imported.segment_nbytes(), 4096u);
  // The same memory, both ways, no copy.
  EXPECT_EQ(receiver.Call(CopyFrom(seg, marker.size())).data(), marker);
  EXPECT_TRUE(receiver.RunAndSync({CopyTo(seg + 4000, "receiver")}).empty());
  EXPECT_EQ(owner.Call(CopyFrom(seg + 4000, 8)).data(), "receiver");
  // Beyond the segment is still out of reach.
  EXPECT_EQ(receiver.Call(CopyFrom(seg + 4090, 8)).code(), kInvalidArgument);

  v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.devices(0).used_memory(), 4096u);  // counted once, for the owner
  for (const v1::SessionInfo& info : stats.sessions()) {
    const bool is_receiver = info.imported_segments() == 1;
    EXPECT_EQ(info.imported_bytes(), is_receiver ? 4096u : 0u);
  }
  v1::Completion in_use = owner.Call(QueryExport(seg + 8));
  ASSERT_EQ(in_use.code(), 0) << in_use.message();
  EXPECT_FALSE(in_use.ready());

  // The owner frees it: the receiver's hold keeps the memory.
  EXPECT_TRUE(owner.RunAndSync({Free(seg)}).empty());
  EXPECT_EQ(owner.Call(CopyFrom(seg, 8)).code(), kInvalidArgument);
  EXPECT_EQ(receiver.Call(CopyFrom(seg, marker.size())).data(), marker);
  EXPECT_EQ(Stats().devices(0).used_memory(), 4096u);

  // A third session imports it too, then dies: its hold goes with it.
  {
    RawSession third(stub_.get());
    third.Open();
    ASSERT_EQ(third.Call(ImportMemory(exported.grant())).code(), 0);
    third.context().TryCancel();
    EXPECT_EQ(third.End().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The daemon sees the cancel a little later, then closes the session on a
  // closer thread; its hold goes when that close is done.
  StatsUntil([](const v1::GetStatsResponse& s) {
    return s.sessions_size() == 2 && s.closing_sessions_size() == 0;
  });
  EXPECT_EQ(receiver.Call(CopyFrom(seg, marker.size())).data(), marker);

  // The last release frees it; the grant dies with the memory.
  EXPECT_TRUE(receiver.RunAndSync({ReleaseImport(seg)}).empty());
  EXPECT_EQ(receiver.Call(CopyFrom(seg, 8)).code(), kInvalidArgument);
  EXPECT_EQ(Stats().devices(0).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
  v1::Completion late = receiver.Call(ImportMemory(exported.grant()));
  EXPECT_EQ(late.code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(late.message(), "freed it or ended before this one received it"))
      << late.message();
  std::vector<v1::Completion> twice = receiver.RunAndSync({ReleaseImport(seg)});
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_EQ(twice[0].code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(twice[0].message(), "holds no imported segment")) << twice[0].message();
}

TEST_F(ServerTest, AnImporterThatDiesReleasesTheMemoryItHeldLast) {
  StartServer(MemoryGrants::Policy::kAnyUser);
  RawSession owner(stub_.get());
  owner.Open();
  const uint64_t seg = owner.AllocateOk(8 << 20, 1);
  v1::Completion exported = owner.Call(ExportMemory(seg, 1));
  ASSERT_EQ(exported.code(), 0) << exported.message();
  {
    RawSession receiver(stub_.get());
    receiver.Open();
    // The grant is for flagos:1.
    EXPECT_EQ(receiver.Call(ImportMemory(exported.grant(), 0)).code(), kInvalidArgument);
    ASSERT_EQ(receiver.Call(ImportMemory(exported.grant(), 1)).code(), 0);
    ASSERT_EQ(receiver.Call(ImportMemory(exported.grant(), 1)).code(), 0);
    EXPECT_TRUE(owner.RunAndSync({Free(seg, 1)}).empty());
    EXPECT_EQ(Stats().devices(1).used_memory(), 8u << 20);
    receiver.context().TryCancel();
    EXPECT_EQ(receiver.End().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The owner too may end: nothing is left.
  EXPECT_TRUE(owner.End().ok());
  v1::GetStatsResponse stats = StatsAfterSessionsEnd();
  EXPECT_EQ(stats.devices(1).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(1)->free_bytes, kSessionMemory);
}

TEST_F(ServerTest, SharingCommandsCheckWhatTheyName) {
  StartServer(MemoryGrants::Policy::kAnyUser);
  RawSession session(stub_.get());
  session.Open();
  const uint64_t seg = session.AllocateOk(64);
  v1::Completion outside = session.Call(ExportMemory(seg + 64));
  EXPECT_EQ(outside.code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(outside.message(), "is in none of this session's segments"))
      << outside.message();
  v1::Completion unknown = session.Call(ImportMemory(std::string(16, 'x')));
  EXPECT_EQ(unknown.code(), kNotFound);
  EXPECT_EQ(session.Call(QueryExport(seg + 64)).code(), kNotFound);
  // Never exported: nobody else uses it.
  v1::Completion idle = session.Call(QueryExport(seg));
  EXPECT_EQ(idle.code(), 0);
  EXPECT_TRUE(idle.ready());
  // A session's own grant: it may hold its own segment twice.
  v1::Completion exported = session.Call(ExportMemory(seg));
  ASSERT_EQ(exported.code(), 0);
  EXPECT_FALSE(session.Call(QueryExport(seg)).ready());  // one export unclaimed
  ASSERT_EQ(session.Call(ImportMemory(exported.grant())).code(), 0);
  EXPECT_TRUE(session.RunAndSync({ReleaseImport(seg)}).empty());
  EXPECT_TRUE(session.Call(QueryExport(seg)).ready());
  EXPECT_TRUE(session.RunAndSync({Free(seg)}).empty());
  EXPECT_EQ(Stats().devices(0).used_memory(), 0u);
}

TEST_F(ServerTest, SharingNeedsTheSessionsUserByDefault) {
  // A unix-socket session's user is its connection's (the kernel's): it
  // may share. A TCP session has no user: it may not.
  ServerOptions options = DefaultServerOptions();
  options.listen.push_back("127.0.0.1:0");
  options.remote_access.insecure_tcp = true;
  Restart(DefaultBackendOptions(), options);
  RawSession session(stub_.get());
  session.Open();
  EXPECT_EQ(session.Call(ExportMemory(session.AllocateOk(64))).code(), 0);
  EXPECT_TRUE(session.End().ok());
  ASSERT_EQ(server_->endpoints().size(), 2u);
  std::unique_ptr<v1::Flagos::Stub> tcp = v1::Flagos::NewStub(
      grpc::CreateChannel(server_->endpoints()[1], grpc::InsecureChannelCredentials()));
  RawSession remote(tcp.get());
  remote.Open();
  v1::Completion refused = remote.Call(ExportMemory(remote.AllocateOk(64)));
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_TRUE(absl::StrContains(refused.message(), "this session came over TCP"))
      << refused.message();
  // Its pid is the client's word, its user unknown.
  v1::GetStatsResponse stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_FALSE(stats.sessions(0).credentials_from_kernel());
  EXPECT_EQ(stats.sessions(0).gid(), -1);
  EXPECT_EQ(stats.sessions(0).pid(), getpid());
  EXPECT_TRUE(remote.End().ok());
  StartServer(MemoryGrants::Policy::kOff);
  RawSession off(stub_.get());
  off.Open();
  v1::Completion disabled = off.Call(ExportMemory(off.AllocateOk(64)));
  EXPECT_EQ(disabled.code(), static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_TRUE(absl::StrContains(disabled.message(), "--memory-sharing=off")) << disabled.message();
}

// ------------------------------------------------------------------ events

v1::Command RecordEvent(uint64_t event, bool timing = false, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_record_event()->set_event(event);
  command.mutable_record_event()->set_enable_timing(timing);
  return command;
}

v1::Command WaitEvent(uint64_t event, int device = 0, uint64_t stream = 0) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_wait_event()->set_event(event);
  return command;
}

v1::Command QueryEvent(uint64_t event) {
  v1::Command command;
  command.mutable_query_event()->set_event(event);
  return command;
}

v1::Command SynchronizeEvent(uint64_t event) {
  v1::Command command;
  command.mutable_synchronize_event()->set_event(event);
  return command;
}

v1::Command ElapsedTime(uint64_t start, uint64_t end) {
  v1::Command command;
  command.mutable_elapsed_time()->set_start(start);
  command.mutable_elapsed_time()->set_end(end);
  return command;
}

v1::Command DestroyEvent(uint64_t event) {
  v1::Command command;
  command.mutable_destroy_event()->set_event(event);
  return command;
}

v1::Command QueryStream(int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_query_stream();
  return command;
}

v1::Command SyncStream(int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_sync()->set_stream_only(true);
  return command;
}

TEST_F(ServerTest, WaitEventOrdersAnotherStreamAfterTheRecord) {
  RawSession session(stub_.get());
  session.Open();
  constexpr uint64_t kBytes = 8 << 20;
  const uint64_t addr = session.AllocateOk(kBytes);
  // Stream 1 writes 8 MiB, then records event 7; stream 2 waits for it and
  // reads the last bytes: it must see them written.
  session.Send({CopyTo(addr, std::string(kBytes, 'w'), 0, 1), RecordEvent(7, false, 0, 1),
                WaitEvent(7, 0, 2)});
  v1::Completion tail = session.Call(CopyFrom(addr + kBytes - 8, 8, 0, 2));
  ASSERT_EQ(tail.code(), 0) << tail.message();
  EXPECT_EQ(tail.data(), std::string(8, 'w'));
  v1::Completion query = session.Call(QueryEvent(7));
  ASSERT_EQ(query.code(), 0) << query.message();
  EXPECT_TRUE(query.ready());
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, WaitEventAcrossDevices) {
  RawSession session(stub_.get());
  session.Open();
  constexpr uint64_t kBytes = 8 << 20;
  const uint64_t src = session.AllocateOk(kBytes, 1);
  const uint64_t dst = session.AllocateOk(kBytes, 0);
  v1::Command copy;
  copy.set_device(0);
  copy.set_stream(3);
  copy.mutable_copy_device_to_device()->set_src(src);
  copy.mutable_copy_device_to_device()->set_src_device(1);
  copy.mutable_copy_device_to_device()->set_dst(dst);
  copy.mutable_copy_device_to_device()->set_nbytes(kBytes);
  session.Send({CopyTo(src, std::string(kBytes, 'x'), 1, 5), RecordEvent(3, false, 1, 5),
                WaitEvent(3, 0, 3), copy});
  v1::Completion data = session.Call(CopyFrom(dst + kBytes - 4, 4, 0, 3));
  ASSERT_EQ(data.code(), 0) << data.message();
  EXPECT_EQ(data.data(), "xxxx");
}

TEST_F(ServerTest, QueryAndSynchronizeEvents) {
  RawSession session(stub_.get());
  session.Open();
  // An event never recorded counts as complete; synchronizing it returns.
  v1::Completion never = session.Call(QueryEvent(41));
  ASSERT_EQ(never.code(), 0) << never.message();
  EXPECT_TRUE(never.ready());
  EXPECT_EQ(session.Call(SynchronizeEvent(41)).code(), 0);
  // Waiting for an event never recorded is a no-op.
  EXPECT_TRUE(session.RunAndSync({WaitEvent(41, 0, 1)}).empty());

  const uint64_t addr = session.AllocateOk(4 << 20);
  session.Send({CopyTo(addr, std::string(4 << 20, 'a'), 0, 2), RecordEvent(42, false, 0, 2)});
  v1::Completion done = session.Call(SynchronizeEvent(42));
  ASSERT_EQ(done.code(), 0) << done.message();
  v1::Completion query = session.Call(QueryEvent(42));
  EXPECT_TRUE(query.ready());
  // After synchronize_event the record's earlier work is visible.
  EXPECT_EQ(session.Call(CopyFrom(addr + (4 << 20) - 1, 1, 0, 2)).data(), "a");
}

TEST_F(ServerTest, StreamQueryAndStreamSync) {
  RawSession session(stub_.get());
  session.Open();
  // A stream never used has no work.
  v1::Completion idle = session.Call(QueryStream(1, 6));
  ASSERT_EQ(idle.code(), 0) << idle.message();
  EXPECT_TRUE(idle.ready());
  EXPECT_EQ(session.Call(SyncStream(1, 6)).code(), 0);

  const uint64_t addr = session.AllocateOk(1 << 20, 1);
  // Right after a stream sync, or a copy the client waited for, the stream
  // is idle.
  for (int i = 0; i < 20; ++i) {
    session.Send({CopyTo(addr, std::string(1 << 20, 's'), 1, 6)});
    v1::Completion synced = session.Call(SyncStream(1, 6));
    ASSERT_EQ(synced.code(), 0) << synced.message();
    v1::Completion query = session.Call(QueryStream(1, 6));
    ASSERT_EQ(query.code(), 0) << query.message();
    EXPECT_TRUE(query.ready()) << "after sync " << i;
    ASSERT_EQ(session.Call(CopyFrom(addr, 4, 1, 6)).data(), "ssss");
    EXPECT_TRUE(session.Call(QueryStream(1, 6)).ready()) << "after copy " << i;
  }
  // stream_only needs a real device.
  v1::Completion bad = session.Call(SyncStream(-1, 0));
  EXPECT_EQ(bad.code(), kInvalidArgument);
}

TEST_F(ServerTest, ElapsedTimeBetweenTimingEvents) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(8 << 20);
  session.Send({RecordEvent(1, true), CopyTo(addr, std::string(8 << 20, 't')),
                RecordEvent(2, true)});
  v1::Completion elapsed = session.Call(ElapsedTime(1, 2));
  ASSERT_EQ(elapsed.code(), 0) << elapsed.message();
  EXPECT_GE(elapsed.elapsed_ms(), 0.0);
  // Reversed, the same interval is negative or zero.
  v1::Completion reversed = session.Call(ElapsedTime(2, 1));
  ASSERT_EQ(reversed.code(), 0) << reversed.message();
  EXPECT_EQ(reversed.elapsed_ms(), -elapsed.elapsed_ms());
}

TEST_F(ServerTest, ElapsedTimeWithoutTimingIsAnError) {
  RawSession session(stub_.get());
  session.Open();
  session.Send({RecordEvent(1, true), RecordEvent(2, false)});
  v1::Completion elapsed = session.Call(ElapsedTime(1, 2));
  EXPECT_EQ(elapsed.code(), kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(elapsed.message(), "event 2 was recorded without timing"))
      << elapsed.message();
  EXPECT_TRUE(absl::StrContains(elapsed.message(), "enable_timing=True")) << elapsed.message();
}

TEST_F(ServerTest, UnknownEventsAreErrors) {
  RawSession session(stub_.get());
  session.Open();
  session.Send({RecordEvent(1, true)});
  v1::Completion elapsed = session.Call(ElapsedTime(1, 99));
  EXPECT_EQ(elapsed.code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(elapsed.message(), "event 99 has not been recorded"))
      << elapsed.message();
  // destroy_event owes no reply: its error comes as a completion of its own.
  std::vector<v1::Completion> errors = session.RunAndSync({DestroyEvent(99)});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "event 99 does not exist"))
      << errors[0].message();
  // Event id 0 is never an event.
  errors = session.RunAndSync({RecordEvent(0), WaitEvent(0)});
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].code(), kInvalidArgument);
  EXPECT_EQ(errors[1].code(), kInvalidArgument);
  EXPECT_EQ(session.Call(QueryEvent(0)).code(), kInvalidArgument);
  // A destroyed event is forgotten: elapsed_time no longer knows it.
  EXPECT_TRUE(session.RunAndSync({DestroyEvent(1)}).empty());
  EXPECT_EQ(session.Call(ElapsedTime(1, 1)).code(), kNotFound);
  // The session goes on.
  EXPECT_TRUE(session.End().ok());
}

TEST_F(ServerTest, EndOfSessionDestroysItsEvents) {
  {
    RawSession session(stub_.get());
    session.Open();
    session.Send({RecordEvent(1, true), RecordEvent(2, false, 0, 4), RecordEvent(3, true, 1, 0)});
    // Every record has run (and made its backend event) before the end: a
    // record still queued when the session ends is dropped, not run.
    for (uint64_t event : {1, 2, 3}) {
      EXPECT_EQ(session.Call(SynchronizeEvent(event)).code(), 0) << "event " << event;
    }
    EXPECT_TRUE(session.End().ok());
  }
  StatsAfterSessionsEnd();
  // The CPU backend numbers events per device from 1: every event the
  // session created is gone. A record still held by a task that ran on a
  // worker goes when that task's closure does, which may be just after the
  // session left the registry: look again for a while.
  std::vector<std::string> live;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    live.clear();
    for (int device = 0; device < 2; ++device) {
      absl::StatusOr<EventHandle> next = backend_->runtime().CreateEvent(device, false);
      ASSERT_TRUE(next.ok()) << next.status();
      EXPECT_GT(*next, 1u);
      for (EventHandle h = 1; h < *next; ++h) {
        // Events this loop made are destroyed below; only the session's count.
        if (absl::IsNotFound(backend_->runtime().QueryEvent(device, h).status())) continue;
        live.push_back(absl::StrCat("device ", device, " event ", h));
      }
      ASSERT_TRUE(backend_->runtime().DestroyEvent(device, *next).ok());
    }
    if (live.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(live.empty()) << absl::StrJoin(live, ", ");
}

// ---------------------------------------------------------------- per-op bounds

constexpr int kDouble = 7;  // c10::ScalarType::Double

// A 1-d view of `numel` elements with stride 0: every element is the one
// at `addr`, so a few bytes of a segment name any number of elements.
v1::TensorRef StrideZeroRef(uint64_t addr, int64_t numel, int dtype = kFloat) {
  v1::TensorRef ref;
  ref.set_addr(addr);
  ref.set_dtype(dtype);
  ref.add_sizes(numel);
  ref.add_strides(0);
  return ref;
}

// The bytes this process's pages take (VmRSS), from /proc.
uint64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      uint64_t kib = 0;
      EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(
                                       absl::StripSuffix(line.substr(6), "kB")),
                                   &kib))
          << line;
      return kib << 10;
    }
  }
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

// What one float32 host tensor value of a completion holds.
float OnlyFloat(const v1::Completion& completion) {
  EXPECT_EQ(completion.code(), 0) << completion.message();
  if (completion.values_size() != 1) return -1;
  std::vector<float> values = Floats(completion.values(0).host_tensor().data());
  return values.size() == 1 ? values[0] : -1;
}

// The session computes the norm of [3, 4] right: it is served on.
void ExpectNormServed(RawSession& session, uint32_t norm_op) {
  const uint64_t addr = session.AllocateOk(8);
  session.Send({CopyTo(addr, FloatBytes({3, 4}))});
  EXPECT_EQ(OnlyFloat(session.Call(Op(norm_op, {TensorValue(Ref(addr, {2}))}, {}, true))), 5.0f);
}

TEST_F(ServerTest, DefaultOpLimitsFollowTheDeviceMemory) {
  // 64 MiB devices: the floors.
  EXPECT_EQ(server_->op_limits().max_elements, 1ull << 32);
  EXPECT_EQ(server_->op_limits().max_host_memory_bytes, 1ull << 30);
  const v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.max_op_elements(), 1ull << 32);
  EXPECT_EQ(stats.max_op_host_memory_bytes(), 1ull << 30);
  BackendOptions big = DefaultBackendOptions();
  big.device_memory = 8ull << 30;  // mapped MAP_NORESERVE: nothing is touched
  Restart(big, DefaultServerOptions());
  EXPECT_EQ(server_->op_limits().max_elements, 4 * (8ull << 30));
  EXPECT_EQ(server_->op_limits().max_host_memory_bytes, 8ull << 30);
  ServerOptions set = DefaultServerOptions();
  set.max_op_elements = 1000;
  set.max_op_host_memory_bytes = 4096;
  Restart(big, set);
  EXPECT_EQ(server_->op_limits().max_elements, 1000u);
  EXPECT_EQ(server_->op_limits().max_host_memory_bytes, 4096u);
  EXPECT_EQ(Stats().max_op_elements(), 1000u);
}

// A 4-byte segment viewed as 2^40 elements: linalg_vector_norm would run
// for an hour. It is refused before anything runs.
TEST_F(ServerTest, AnOpOverTooManyElementsIsRefusedBeforeItRuns) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4);
  session.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  v1::Completion c =
      session.Call(Op(1, {TensorValue(StrideZeroRef(addr, int64_t{1} << 40))}, {}, true));
  EXPECT_EQ(c.code(), kResourceExhausted);
  EXPECT_EQ(c.message(),
            "aten::linalg_vector_norm: the call names 1099511627776 tensor elements, more than "
            "the 4294967296 an op may process (--max-op-elements); the largest is argument "
            "'self' (#0) with 1099511627776 elements (sizes [1099511627776]); split the work "
            "into smaller calls, or start flagosd with a larger --max-op-elements");
  ExpectNormServed(session, 1);
  RawSession other(stub_.get());
  other.Open("other");
  other.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  ExpectNormServed(other, 1);
}

// The bound is on the elements of every tensor together: list elements
// each below it add up past it.
TEST_F(ServerTest, TheElementBoundSumsEveryTensorOfTheCall) {
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4);
  session.Send({RegisterOp(1, "aten::_foreach_norm", "Scalar")});
  v1::Value list;
  for (int i = 0; i < 3; ++i) {
    *list.mutable_list()->add_values() = TensorValue(StrideZeroRef(addr, int64_t{1} << 31));
  }
  v1::Completion c = session.Call(Op(1, {list}, {}, true));
  EXPECT_EQ(c.code(), kResourceExhausted);
  EXPECT_EQ(c.message(),
            "aten::_foreach_norm.Scalar: the call names 6442450944 tensor elements, more than "
            "the 4294967296 an op may process (--max-op-elements); the largest is argument "
            "'self' (#0) element 0 with 2147483648 elements (sizes [2147483648]); split the work "
            "into smaller calls, or start flagosd with a larger --max-op-elements");
}

// --max-op-elements: 3.8e9 elements (seconds of work) refused under a
// lower limit; a call at the limit runs.
TEST_F(ServerTest, TheElementBoundIsConfigurable) {
  ServerOptions options = DefaultServerOptions();
  options.max_op_elements = 1 << 20;
  Restart(DefaultBackendOptions(), options);
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(4);
  session.Send({CopyTo(addr, FloatBytes({0.5f})), RegisterOp(1, "aten::linalg_vector_norm", "")});
  v1::Completion c =
      session.Call(Op(1, {TensorValue(StrideZeroRef(addr, 3800000000))}, {}, true));
  EXPECT_EQ(c.code(), kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(c.message(),
                               "aten::linalg_vector_norm: the call names 3800000000 tensor "
                               "elements, more than the 1048576 an op may process"))
      << c.message();
  // sqrt(2^20 * 0.25) = 512, exactly.
  EXPECT_EQ(OnlyFloat(session.Call(Op(1, {TensorValue(StrideZeroRef(addr, 1 << 20))}, {}, true))),
            512.0f);
}

// What a 16 MiB bound says to median's copy of 402653184 float64s.
std::string MedianRefusal() {
  return absl::StrCat("aten::median: its kernel asked for ", uint64_t{402653184} * 8,
                      " bytes of host memory while holding 0; an op's kernel may hold at most ",
                      16 << 20, " bytes (--max-op-host-memory=16MiB); split the work into smaller "
                      "calls, or start flagosd with a larger --max-op-host-memory");
}

// median's CPU kernel copies its input: over a 64-byte segment viewed as
// 402653184 float64 elements, 3 GiB of host memory. Under a 16 MiB bound
// the copy is refused before it is made.
TEST_F(ServerTest, AKernelAskingForMoreHostMemoryThanTheBoundIsRefused) {
  ServerOptions options = DefaultServerOptions();
  options.max_op_host_memory_bytes = 16 << 20;
  Restart(DefaultBackendOptions(), options);
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  session.Send({RegisterOp(1, "aten::median", ""), RegisterOp(2, "aten::linalg_vector_norm", "")});
  const uint64_t resident_before = ResidentBytes();
  v1::Completion c =
      session.Call(Op(1, {TensorValue(StrideZeroRef(addr, 402653184, kDouble))}, {}, true));
  const uint64_t resident_after = ResidentBytes();
  EXPECT_EQ(c.code(), kResourceExhausted);
  EXPECT_EQ(c.message(), MedianRefusal());
  // The 3 GiB copy was never made (zero fill would have touched it all).
  EXPECT_LT(resident_after, resident_before + (512ull << 20));
  // Served on, and right: the median of [1, 5, 3] is 3.
  session.Send({CopyTo(addr, [] {
    std::string bytes(24, '\0');
    const double values[] = {1, 5, 3};
    std::memcpy(bytes.data(), values, 24);
    return bytes;
  }())});
  v1::Completion median = session.Call(Op(1, {TensorValue(Ref(addr, {3}, kDouble))}, {}, true));
  ASSERT_EQ(median.code(), 0) << median.message();
  ASSERT_EQ(median.values_size(), 1);
  double value = 0;
  ASSERT_EQ(median.values(0).host_tensor().data().size(), sizeof(double));
  std::memcpy(&value, median.values(0).host_tensor().data().data(), sizeof(double));
  EXPECT_EQ(value, 3.0);
  ExpectNormServed(session, 2);
  RawSession other(stub_.get());
  other.Open("other");
  other.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  ExpectNormServed(other, 1);
}

// The cpu_fallback route's kernel runs under the same bound.
TEST_F(ServerTest, TheHostMemoryBoundHoldsOnTheCpuFallbackRoute) {
  BackendOptions fallback = DefaultBackendOptions();
  fallback.force_route = "cpu_fallback";
  ServerOptions options = DefaultServerOptions();
  options.max_op_host_memory_bytes = 16 << 20;
  Restart(fallback, options);
  RawSession session(stub_.get());
  session.Open();
  const uint64_t addr = session.AllocateOk(64);
  session.Send({RegisterOp(1, "aten::median", ""), RegisterOp(2, "aten::linalg_vector_norm", "")});
  v1::Completion c =
      session.Call(Op(1, {TensorValue(StrideZeroRef(addr, 402653184, kDouble))}, {}, true));
  EXPECT_EQ(c.code(), kResourceExhausted);
  EXPECT_EQ(c.message(), MedianRefusal());
  ExpectNormServed(session, 2);
}

}  // namespace
}  // namespace flagos::daemon

namespace flagos::daemon {
namespace {

// The threads of this process (the test's server and its client).
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

v1::Command Memset(uint64_t addr, uint64_t nbytes, int value, int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_memset()->set_addr(addr);
  command.mutable_memset()->set_nbytes(nbytes);
  command.mutable_memset()->set_value(value);
  return command;
}

v1::Command CopyAcross(uint64_t dst, int device, uint64_t stream, uint64_t src, int src_device,
                       uint64_t nbytes) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  command.mutable_copy_device_to_device()->set_dst(dst);
  command.mutable_copy_device_to_device()->set_src(src);
  command.mutable_copy_device_to_device()->set_src_device(src_device);
  command.mutable_copy_device_to_device()->set_nbytes(nbytes);
  return command;
}

// Each of `streams` streams (1..streams, on device stream % 2) memsets its
// own chunk `rounds` times with the byte `stream`; stream 1 (device 1) then
// records event 1, which stream 2 (device 0) waits for before it copies
// stream 1's chunk into its own. A sync ends the batch. Returns the
// commands; `chunk(device, stream)` is the address of a stream's chunk.
template <typename ChunkFn>
std::vector<v1::Command> BusyStreams(int streams, int rounds, uint64_t chunk_bytes,
                                     ChunkFn chunk) {
  std::vector<v1::Command> commands;
  for (int round = 0; round < rounds; ++round) {
    for (int stream = 1; stream <= streams; ++stream) {
      const int device = stream % 2;
      commands.push_back(Memset(chunk(device, stream), chunk_bytes, stream, device, stream));
    }
  }
  commands.push_back(RecordEvent(1, false, 1, 1));
  commands.push_back(WaitEvent(1, 0, 2));
  commands.push_back(CopyAcross(chunk(0, 2), 0, 2, chunk(1, 1), 1, chunk_bytes));
  commands.push_back(Sync());
  return commands;
}

// 64 sessions x 8 streams on a daemon with 4 workers per device (2
// devices). The bound (docs/operations.md, "Threads"): the workers exist
// from the start; a session adds the one gRPC thread that reads its stream
// and its reply writer (and the sync channel's, which a raw session does
// not attach), and no
// number of streams or of commands queued on them adds any. gRPC's sync
// server may keep a few spare threads for new calls, and its core a few
// more under load: kGrpcSpareThreads. (One thread per stream, the design
// before the pool, is 512 threads more.)
class ManySessionsTest : public ServerTest {
 protected:
  static constexpr int kSessions = 64;
  static constexpr int kStreams = 8;
  static constexpr int kWorkersPerDevice = 4;
  static constexpr int kGrpcSpareThreads = 16;
  void Configure(ServerOptions* options) override {
    options->max_sessions = kSessions;
    options->workers_per_device = kWorkersPerDevice;
  }
};

TEST_F(ManySessionsTest, ThreadCountDoesNotGrowWithSessionsTimesBusyStreams) {
  EXPECT_EQ(server_->workers_per_device(), kWorkersPerDevice);
  Stats();  // the client channel is connected and its threads exist
  const int at_start = ThreadCount();
  constexpr uint64_t kChunk = 128 << 10;
  // Per device: chunks for streams 0..kStreams (index stream / 2).
  constexpr uint64_t kSegment = (kStreams / 2 + 1) * kChunk;
  std::vector<std::unique_ptr<RawSession>> sessions;
  std::vector<std::array<uint64_t, 2>> segments;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(std::make_unique<RawSession>(stub_.get()));
    sessions.back()->Open();
    segments.push_back({sessions.back()->AllocateOk(kSegment, 0),
                        sessions.back()->AllocateOk(kSegment, 1)});
  }
  const int sessions_open = ThreadCount();
  std::vector<uint64_t> syncs;
  for (int i = 0; i < kSessions; ++i) {
    const auto chunk = [&segments, i](int device, int stream) {
      return segments[i][device] + (stream / 2) * kChunk;
    };
    syncs.push_back(sessions[i]->Send(BusyStreams(kStreams, 100, kChunk, chunk)));
  }
  int busy = ThreadCount();
  for (int i = 0; i < kSessions; ++i) {
    v1::Completion sync = sessions[i]->WaitFor(syncs[i]);
    EXPECT_EQ(sync.code(), 0) << sync.message();
    busy = std::max(busy, ThreadCount());
  }
  std::cout << "threads: " << at_start << " at start (" << kWorkersPerDevice
            << " workers x 2 devices included), " << sessions_open << " with " << kSessions
            << " sessions open, at most " << busy << " with " << kSessions << " x " << kStreams
            << " streams busy\n";
  RecordProperty("threads_at_start", at_start);
  RecordProperty("threads_sessions_open", sessions_open);
  RecordProperty("threads_busy_max", busy);
  EXPECT_LE(sessions_open, at_start + 2 * kSessions + kGrpcSpareThreads);
  EXPECT_LE(busy, at_start + 2 * kSessions + kGrpcSpareThreads);
  // Every session's streams ran in order: stream 2 copied stream 1's bytes
  // after waiting for its event.
  for (int i = 0; i < kSessions; ++i) {
    v1::Completion data =
        sessions[i]->Call(CopyFrom(segments[i][0] + kChunk + kChunk - 4, 4, 0, 2));
    ASSERT_EQ(data.code(), 0) << data.message();
    EXPECT_EQ(data.data(), std::string(4, '\x01')) << "session " << i;
  }
  for (auto& session : sessions) EXPECT_TRUE(session->End().ok());
}

TEST_F(ServerTest, StartRefusesWorkersPerDeviceOutOfRangeNamingTheFlag) {
  EXPECT_GE(server_->workers_per_device(), 4);  // the default
  for (int workers : {-1, kMaxWorkersPerDevice + 1}) {
    ServerOptions options;
    options.listen = {absl::StrCat("unix://", dir_, "/other.sock")};
    options.workers_per_device = workers;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options, backend_.get());
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(server.status().message(), "--workers-per-device must be"))
        << server.status();
  }
}

// One worker per device: a stream that waits for another stream's event,
// or for another device's work, parks its queue and leaves the worker to
// the stream it waits for (were it to block the worker, nothing would run).
class OneWorkerTest : public ServerTest {
 protected:
  void Configure(ServerOptions* options) override { options->workers_per_device = 1; }
};

TEST_F(OneWorkerTest, WaitsAcrossStreamsAndDevicesDoNotStarveTheOnlyWorker) {
  RawSession session(stub_.get());
  session.Open();
  constexpr uint64_t kChunk = 1 << 20;
  const uint64_t a = session.AllocateOk(4 * kChunk, 0);
  const uint64_t b = session.AllocateOk(4 * kChunk, 1);
  // Stream 1 gets work first (so it is first on the ready list), then
  // waits for event 5, which stream 2 records after its own work.
  session.Send({Memset(a, kChunk, 1, 0, 1), Memset(a + kChunk, kChunk, 2, 0, 2),
                RecordEvent(5, false, 0, 2), WaitEvent(5, 0, 1),
                CopyAcross(a + 2 * kChunk, 0, 1, a + kChunk, 0, kChunk),
                // Device 1's stream 3 waits for device 0's event 6 (after
                // stream 1's copy); device 0's stream 4 copies from device
                // 1 after everything queued there.
                RecordEvent(6, false, 0, 1), WaitEvent(6, 1, 3), Memset(b, kChunk, 3, 1, 3),
                CopyAcross(a + 3 * kChunk, 0, 4, b, 1, kChunk)});
  std::vector<v1::Completion> errors = session.RunAndSync({});
  for (const v1::Completion& e : errors) ADD_FAILURE() << e.seq() << ": " << e.message();
  EXPECT_EQ(session.Call(CopyFrom(a + 3 * kChunk - 4, 4, 0, 1)).data(), std::string(4, '\x02'));
  EXPECT_EQ(session.Call(CopyFrom(a + 4 * kChunk - 4, 4, 0, 4)).data(), std::string(4, '\x03'));
  EXPECT_TRUE(session.End().ok());
}

// A client that sends commands owing replies and never reads them: its
// replies wait in its session's outbox (written by the session's own
// writer thread), so the device's only worker goes on serving the other
// session; once more than kMaxUnreadReplyBytes wait, flagosd ends the
// non-reading session with RESOURCE_EXHAUSTED and frees what it held.
TEST_F(OneWorkerTest, AClientThatDoesNotReadItsRepliesHoldsNoWorkerAndIsEnded) {
  // Its own connection, so that HTTP/2's connection window is its own.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Flagos::NewStub(channel);
  RawSession deaf(stub.get());
  const uint64_t deaf_id = deaf.Open("deaf");
  constexpr uint64_t kReply = 1 << 20;
  const uint64_t addr = deaf.AllocateOk(kReply);
  // 1 GiB of replies, four times the bound: never read.
  std::vector<v1::Command> downloads;
  for (int i = 0; i < 1024; ++i) downloads.push_back(CopyFrom(addr, kReply));
  deaf.Send(std::move(downloads));

  RawSession other(stub_.get());
  other.Open("other");
  const uint64_t mine = other.AllocateOk(4096);
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(other.RunAndSync({CopyTo(mine, std::string(4096, static_cast<char>(i)))}).empty());
    v1::Completion data = other.Call(CopyFrom(mine, 4096));
    ASSERT_EQ(data.code(), 0) << data.message();
    EXPECT_TRUE(data.data() == std::string(4096, static_cast<char>(i))) << "copy " << i;
  }
  // The deaf session ends: only the other one is left, holding its 4096
  // bytes, once the deaf one also finished closing (a closing session holds
  // its segments until its running commands returned).
  v1::GetStatsResponse stats = Stats();
  while (stats.sessions_size() != 1 || stats.closing_sessions_size() != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stats = Stats();
  }
  EXPECT_EQ(stats.sessions(0).client(), "other");
  EXPECT_EQ(stats.devices(0).used_memory(), 4096u);

  v1::ServerMessage reply;
  while (deaf.stream().Read(&reply)) {
  }
  const grpc::Status end = deaf.stream().Finish();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << end.error_message();
  EXPECT_EQ(end.error_message(),
            absl::StrCat("session ", deaf_id,
                         " has more than 268435456 bytes of replies it has not read "
                         "(kMaxUnreadReplyBytes): the client does not read its replies; flagosd "
                         "ended the session and freed what it held. Read the session stream (and "
                         "the sync channel) while commands that owe replies are outstanding"));
  EXPECT_TRUE(other.End().ok());
  EXPECT_EQ(StatsAfterSessionsEnd().devices(0).used_memory(), 0u);
}

// ------------------------------------------------- a client that leaves mid-kernel

// One session at a time, and linalg_vector_norm over a 4-byte segment viewed
// as kElements elements with stride 0 (issue 10, finding 8), into a 0-d
// output: a call at the per-op element bound, 1 to 4 s of kernel on this
// project's 2-core machines (the test asserts ordering, not durations).
class ClosingSessionTest : public ServerTest {
 protected:
  static constexpr int64_t kElements = int64_t{1} << 31;
  void Configure(ServerOptions* options) override {
    options->max_sessions = 1;
    options->max_op_elements = kElements + 1;
  }
};

// The client cancels its stream while its kernel runs: its slot is free at
// once (a new session opens at --max-sessions=1 while the kernel still
// runs, GetStats listing the old session as closing), its memory stays held
// and counted until the kernel returned, then is freed; the new session's
// bytes are untouched by the old kernel's result, and the daemon serves on.
TEST_F(ClosingSessionTest, AClientLeavingMidKernelFreesItsSlotAtOnceAndItsMemoryAfter) {
  constexpr uint64_t kOutBytes = 4096;
  auto leaving = std::make_unique<RawSession>(stub_.get());
  const uint64_t leaving_id = leaving->Open("leaving");
  const uint64_t in = leaving->AllocateOk(4);
  const uint64_t out = leaving->AllocateOk(kOutBytes);
  // The copy has run: the one command that runs next is the norm.
  EXPECT_TRUE(leaving
                  ->RunAndSync({CopyTo(in, FloatBytes({0.5f})),
                                RegisterOp(1, "aten::linalg_vector_norm", "")})
                  .empty());
  leaving->Send({Op(1, {TensorValue(StrideZeroRef(in, kElements))}, {Ref(out, {})})});
  v1::GetStatsResponse stats = StatsUntil([](const v1::GetStatsResponse& s) {
    return s.sessions_size() == 1 && s.sessions(0).running_commands() == 1;
  });
  ASSERT_EQ(stats.sessions_size(), 1);
  ASSERT_EQ(stats.sessions(0).running_commands(), 1u) << "the norm never started";
  const uint64_t leaving_bytes = stats.sessions(0).segment_bytes();
  EXPECT_EQ(leaving_bytes, 4 + kOutBytes);

  leaving->context().TryCancel();  // as if the process died mid-kernel
  EXPECT_EQ(leaving->End().error_code(), grpc::StatusCode::CANCELLED);
  stats = StatsUntil([](const v1::GetStatsResponse& s) { return s.sessions_size() == 0; });
  ASSERT_EQ(stats.sessions_size(), 0) << "the cancelled session is still live";

  RawSession next(stub_.get());
  const uint64_t next_id = next.Open("next");
  EXPECT_NE(next_id, 0u) << "no new session at --max-sessions=1 while the old one closes";
  const uint64_t addr = next.AllocateOk(kOutBytes);
  const std::string pattern(kOutBytes, '\x5a');
  next.Send({CopyTo(addr, pattern)});
  EXPECT_EQ(next.Call(CopyFrom(addr, kOutBytes)).data(), pattern);
  stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).id(), next_id);
  // The old kernel still runs now, after the new session opened.
  ASSERT_EQ(stats.closing_sessions_size(), 1)
      << "the old session's kernel returned before the new session opened: raise kElements";
  const v1::SessionInfo& closing = stats.closing_sessions(0);
  EXPECT_EQ(closing.id(), leaving_id);
  ASSERT_EQ(closing.running_commands(), 1u)
      << "the old session's kernel returned before the new session opened: raise kElements";
  EXPECT_EQ(closing.segment_bytes(), leaving_bytes);
  EXPECT_EQ(stats.devices(0).used_memory(), leaving_bytes + kOutBytes);

  // Once the kernel returned the old session is gone with its memory (the
  // poll gives up after 120 s: a loaded machine is slow, not wrong).
  stats = StatsUntil(
      [](const v1::GetStatsResponse& s) { return s.closing_sessions_size() == 0; }, 12000);
  ASSERT_EQ(stats.closing_sessions_size(), 0);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.devices(0).used_memory(), kOutBytes);
  EXPECT_EQ(stats.sessions(0).segment_bytes(), kOutBytes);
  // The old kernel wrote its result into its own segment, not into the new
  // session's bytes.
  EXPECT_EQ(next.Call(CopyFrom(addr, kOutBytes)).data(), pattern);
  next.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  ExpectNormServed(next, 1);
  EXPECT_TRUE(next.End().ok());
  stats = StatsAfterSessionsEnd();
  EXPECT_EQ(stats.sessions_size(), 0);
  EXPECT_EQ(stats.closing_sessions_size(), 0);
  EXPECT_EQ(stats.devices(0).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
  // And a session opens again.
  RawSession after(stub_.get());
  after.Open("after");
  after.Send({RegisterOp(1, "aten::linalg_vector_norm", "")});
  ExpectNormServed(after, 1);
}

}  // namespace
}  // namespace flagos::daemon
