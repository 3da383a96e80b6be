// The CPU backend's dtype widening (CUDA's dtypes that ATen's CPU kernels
// lack) through CpuOpExecutor::Call, against CUDA's definitions; and the
// table against its page, docs/reference/dtype-widening.md.
#include "cpu_dtype_widening.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "cpu_op_executor.h"

namespace flagos {
namespace {

c10::OperatorHandle Op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

std::string DtypeName(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Bool: return "bool";
    default: return c10::toString(t);
  }
}

class CpuDtypeWideningTest : public ::testing::Test {
 protected:
  absl::Status Call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    return executor_.Call(0, 0, op, stack);
  }
  CpuOpExecutor executor_;
};

TEST_F(CpuDtypeWideningTest, HistcOfInt32CountsLikeCudaInInt32) {
  // Bounds 0.9 and 6.7 are read as 0 and 6 (CUDA truncates them to int64);
  // bins of width 2: 7 lies outside, -1 too.
  at::Tensor x = at::tensor({-1, 0, 1, 2, 3, 5, 6, 6, 7}, at::kInt);
  torch::jit::Stack stack{x, int64_t{3}, 0.9, 6.7};
  ASSERT_TRUE(Call(Op("aten::histc"), &stack).ok());
  at::Tensor counts = stack.at(0).toTensor();
  EXPECT_EQ(counts.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(counts, at::tensor({2, 2, 3}, at::kInt))) << counts;
}

TEST_F(CpuDtypeWideningTest, HistcOfInt64WithEqualBoundsTakesTheDataExtremes) {
  at::Tensor x = at::tensor({4, 4, 9, 5}, at::kLong);
  torch::jit::Stack stack{x, int64_t{5}, int64_t{0}, int64_t{0}};
  ASSERT_TRUE(Call(Op("aten::histc"), &stack).ok());
  // [4, 9] in 5 bins: (x - 4) * 5 / 5.
  EXPECT_TRUE(at::equal(stack.at(0).toTensor(), at::tensor({2, 1, 0, 0, 1}, at::kLong)));
}

TEST_F(CpuDtypeWideningTest, HistcOutWritesTheCallersInt32Tensor) {
  at::Tensor x = at::tensor({0, 1, 1, 3}, at::kInt);
  at::Tensor out = at::full({4}, -1, at::kInt);
  torch::jit::Stack stack{x, int64_t{4}, int64_t{0}, int64_t{4}, out};
  ASSERT_TRUE(Call(Op("aten::histc", "out"), &stack).ok());
  ASSERT_EQ(stack.size(), 1u);
  EXPECT_TRUE(stack.at(0).toTensor().is_same(out));
  EXPECT_TRUE(at::equal(out, at::tensor({1, 2, 0, 1}, at::kInt))) << out;
}

TEST_F(CpuDtypeWideningTest, AbsOfBoolInPlaceKeepsTheCallersBoolTensor) {
  at::Tensor x = at::tensor({1, 0, 1}).to(at::kBool);
  torch::jit::Stack stack{x};
  ASSERT_TRUE(Call(Op("aten::abs_"), &stack).ok());
  EXPECT_TRUE(stack.at(0).toTensor().is_same(x));
  EXPECT_EQ(x.scalar_type(), at::kBool);
  EXPECT_TRUE(at::equal(x, at::tensor({1, 0, 1}).to(at::kBool)));
}

TEST_F(CpuDtypeWideningTest, TraceOfBoolReturnsInt64AsCudaDoes) {
  at::Tensor x = at::eye(3, at::kBool);
  torch::jit::Stack stack{x};
  ASSERT_TRUE(Call(Op("aten::trace"), &stack).ok());
  EXPECT_EQ(stack.at(0).toTensor().scalar_type(), at::kLong);
  EXPECT_EQ(stack.at(0).toTensor().item<int64_t>(), 3);
}

TEST_F(CpuDtypeWideningTest, AvgPool3dOfHalfIsTheFloatResultRounded) {
  at::manual_seed(0);
  at::Tensor x = at::randn({1, 2, 4, 4, 4}).to(at::kHalf);
  const std::vector<int64_t> k{2, 2, 2};
  // A boxed call takes every argument: ceil_mode, count_include_pad, divisor_override.
  torch::jit::Stack stack{x, k, k, std::vector<int64_t>{0, 0, 0}, false, true, c10::IValue()};
  ASSERT_TRUE(Call(Op("aten::avg_pool3d"), &stack).ok());
  at::Tensor expected = at::avg_pool3d(x.to(at::kFloat), k, k).to(at::kHalf);
  EXPECT_EQ(stack.at(0).toTensor().scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(stack.at(0).toTensor(), expected));
}

TEST_F(CpuDtypeWideningTest, DtypesTheCpuKernelHasRunUnchanged) {
  torch::jit::Stack floats{at::ones({3}), int64_t{2}, int64_t{0}, int64_t{0}};
  EXPECT_EQ(FindDtypeWidening(Op("aten::histc"), floats), nullptr);
  torch::jit::Stack ints{at::ones({3}, at::kInt), at::ones({3}, at::kInt), int64_t{1}};
  EXPECT_EQ(FindDtypeWidening(Op("aten::add", "Tensor"), ints), nullptr);
}

TEST_F(CpuDtypeWideningTest, ADtypeCudaLacksTooKeepsTheKernelsError) {
  torch::jit::Stack stack{at::tensor({1, 0}).to(at::kBool), int64_t{2}, int64_t{0}, int64_t{0}};
  absl::Status status = Call(Op("aten::histc"), &stack);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_NE(status.message().find("not implemented for 'Bool'"), std::string::npos) << status;
}

TEST(CpuDtypeWideningTable, ItsPageListsExactlyItsRows) {
  const std::string path = FLAGOS_SOURCE_DIR "/docs/reference/dtype-widening.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << "cannot read " << path;
  std::set<std::string> documented;
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind("| `aten::", 0) != 0) continue;
    std::stringstream cells(line);
    std::string skip, op, missing, compute;
    std::getline(cells, skip, '|');
    std::getline(cells, op, '|');
    std::getline(cells, missing, '|');
    std::getline(cells, compute, '|');
    documented.insert(absl::StrCat(op, "|", missing, "|", compute));
  }
  std::set<std::string> table;
  for (const DtypeWidening& w : CpuDtypeWidenings()) {
    table.insert(absl::StrCat(" `", w.op, "` | ", DtypeName(w.missing), " | ",
                              DtypeName(w.compute), " "));
  }
  EXPECT_EQ(documented, table) << "update docs/reference/dtype-widening.md's table";
}

TEST(CpuDtypeWideningTable, EveryOperatorExists) {
  for (const DtypeWidening& w : CpuDtypeWidenings()) {
    EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({w.op, ""}).has_value()) << w.op;
  }
}

}  // namespace
}  // namespace flagos
