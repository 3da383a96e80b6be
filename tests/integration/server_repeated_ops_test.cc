// Op calls sent again byte for byte run as the calls flagosd prepared
// (sessions/repeated_op_calls.h), counted by flagosd_ops_repeated_total: results, freed
// memory under a prepared call, seq order, kernel errors.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "observability/metrics.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

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

}  // namespace
}  // namespace flagos::daemon
