// PreparedOpCall::Intact: a prepared call (a captured graph's op, run again
// by OpRunner::RunPrepared with no decoding) is runnable only while every
// tensor it holds (on its stack, in a Tensor[] argument, among its outputs)
// is as it was when prepared; a kernel that restrides, resizes or re-points
// one of them makes RunPrepared decline it, and the session runs the command
// as sent instead (sessions/session_graphs.cc).
#include "ops/prepared_op_call.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace flagos::daemon {
namespace {

c10::OperatorHandle Op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Runs the prepared call's kernel once, on a copy of its stack, as
// RunPrepared does (the copy shares the tensors).
void RunOnce(const PreparedOpCall& call) {
  torch::jit::Stack stack(call.stack().begin(), call.stack().end());
  call.op().callBoxed(&stack);
}

PreparedOpCall Prepare(const char* name, const char* overload, torch::jit::Stack stack,
                       std::vector<at::Tensor> outputs = {}) {
  return PreparedOpCall(Op(name, overload), name, /*device=*/0, std::move(stack),
                        std::move(outputs), /*outputs_must_stay=*/false);
}

TEST(PreparedOpCallTest, AnInPlaceKernelThatOnlyWritesBytesLeavesItIntact) {
  at::Tensor a = at::zeros({2, 3});
  PreparedOpCall call = Prepare("aten::add_", "Tensor", {a, at::ones({2, 3}), 1.0});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(call.Intact());
    RunOnce(call);
  }
  EXPECT_TRUE(call.Intact());
  EXPECT_TRUE(at::equal(a, at::full({2, 3}, 3.0)));
}

TEST(PreparedOpCallTest, AKernelThatRestridesItsTensorMakesItNotIntact) {
  at::Tensor a = at::zeros({2, 3});
  PreparedOpCall call = Prepare("aten::t_", "", {a});
  ASSERT_TRUE(call.Intact());
  RunOnce(call);
  EXPECT_FALSE(call.Intact());  // sizes [3, 2], strides [1, 3] now
  RunOnce(call);                // back as made
  EXPECT_TRUE(call.Intact());
}

TEST(PreparedOpCallTest, AResizedTensorIsNotIntact) {
  at::Tensor a = at::zeros({8});
  PreparedOpCall call = Prepare("aten::add_", "Tensor", {a, at::ones({8}), 1.0});
  a.resize_({4});  // same storage, same data pointer, other sizes
  EXPECT_FALSE(call.Intact());
}

TEST(PreparedOpCallTest, ATensorMovedToOtherBytesIsNotIntact) {
  at::Tensor a = at::zeros({4});
  at::Tensor b = at::zeros({4});
  PreparedOpCall call = Prepare("aten::add_", "Tensor", {a, b, 1.0});
  a.set_(at::zeros({4}));  // same sizes and strides, another data pointer
  EXPECT_FALSE(call.Intact());

  at::Tensor c = at::zeros({8});
  PreparedOpCall offset_call = Prepare("aten::add_", "Tensor", {c, at::ones({8}), 1.0});
  c.set_(c.storage(), /*storage_offset=*/0, {8}, {1});
  EXPECT_TRUE(offset_call.Intact());
  c.set_(c.storage(), /*storage_offset=*/2, {6}, {1});
  EXPECT_FALSE(offset_call.Intact());
}

TEST(PreparedOpCallTest, TheTensorsOfATensorListArgumentAreChecked) {
  at::Tensor first = at::zeros({3});
  at::Tensor second = at::zeros({3});
  c10::List<at::Tensor> list({first, second});
  PreparedOpCall call = Prepare("aten::_foreach_add_", "Scalar", {list, 2.0});
  RunOnce(call);
  EXPECT_TRUE(call.Intact());
  EXPECT_TRUE(at::equal(second, at::full({3}, 2.0)));
  second.resize_({1});
  EXPECT_FALSE(call.Intact());
}

TEST(PreparedOpCallTest, TheOutputsAreChecked) {
  at::Tensor out = at::empty({2, 2});
  PreparedOpCall call = Prepare("aten::add", "Tensor", {at::ones({2, 2}), at::ones({2, 2}), 1.0},
                                {out});
  EXPECT_TRUE(call.Intact());
  out.resize_({4});
  EXPECT_FALSE(call.Intact());
}

TEST(PreparedOpCallTest, UndefinedTensorsAndNonTensorArgumentsAreNotChecked) {
  at::Tensor a = at::zeros({2});
  // aten::clamp_(Tensor(a!) self, Scalar? min, Scalar? max): Nones and a Scalar.
  PreparedOpCall call = Prepare("aten::clamp_", "", {a, c10::IValue(), 1.0});
  RunOnce(call);
  EXPECT_TRUE(call.Intact());
  PreparedOpCall with_undefined = Prepare("aten::add", "Tensor", {a, a, 1.0}, {at::Tensor()});
  EXPECT_TRUE(with_undefined.Intact());
}

}  // namespace
}  // namespace flagos::daemon
