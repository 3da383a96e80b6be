// Negotiation and the Session stream's protocol: what Negotiate reports (versions, the
// backend's kernel facts, composite ops), opening a session, messages and commands that do
// not parse, seq numbering, op registration against the daemon's schema, client text.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cpu_kernel_facts.h"
#include "ops/op_servability.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

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

}  // namespace
}  // namespace flagos::daemon
