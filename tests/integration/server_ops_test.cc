// Op calls over the Session stream: outputs and in-place arguments, the argument checks a
// kernel must not get past (views, mutated arguments, strides, enums, optimizer state),
// results held in the daemon or returned by value, schema defaults, kernel errors, and
// random ops as a function of seed and offset.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

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

}  // namespace
}  // namespace flagos::daemon
