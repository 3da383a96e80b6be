// daemon/ops/op_routes.h: the ops.conf format (routes, comments, the
// default, errors naming the line) and the confs embedded into flagosd.
#include "ops/op_routes.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace flagos::daemon {
namespace {

OpRoutes ParseOk(absl::string_view text) {
  absl::StatusOr<OpRoutes> routes = OpRoutes::Parse(text, "test.conf");
  EXPECT_TRUE(routes.ok()) << routes.status();
  return routes.ok() ? *std::move(routes) : OpRoutes();
}

absl::Status ParseError(absl::string_view text) {
  absl::StatusOr<OpRoutes> routes = OpRoutes::Parse(text, "backends/x/ops.conf");
  EXPECT_FALSE(routes.ok()) << "parsed: " << text;
  return routes.status();
}

std::string SourceFile(const std::string& relative) {
  std::ifstream in(std::string(FLAGOS_SOURCE_DIR) + "/" + relative, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << relative;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(OpRouteNameTest, NamesAreTheWordsOfTheFile) {
  EXPECT_EQ(OpRouteName(OpRoute::kNative), "native");
  EXPECT_EQ(OpRouteName(OpRoute::kCpuFallback), "cpu_fallback");
}

TEST(OpRoutesTest, ANamespaceRouteCoversItsUnlistedOperatorsOnly) {
  OpRoutes routes = ParseOk(
      "default = cpu_fallback\n"
      "flagos_c10d::send_ = cpu_fallback\n"
      "aten::mm = native\n");
  routes.RouteNamespace("flagos_c10d", OpRoute::kNative);
  EXPECT_EQ(routes.RouteOf("flagos_c10d::all_reduce_"), OpRoute::kNative);
  EXPECT_EQ(routes.RouteOf("flagos_c10d::send_"), OpRoute::kCpuFallback);  // the file names it
  EXPECT_EQ(routes.RouteOf("aten::mm"), OpRoute::kNative);
  EXPECT_EQ(routes.RouteOf("aten::add.Tensor"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("flagos_c10d_x::op"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("no_namespace"), OpRoute::kCpuFallback);
}

TEST(OpRoutesTest, ListedOperatorsTakeTheirRoute) {
  const OpRoutes routes = ParseOk(
      "aten::add.Tensor = native\n"
      "aten::mm = cpu_fallback\n"
      "aten::relu=native\n");
  EXPECT_EQ(routes.RouteOf("aten::add.Tensor"), OpRoute::kNative);
  EXPECT_EQ(routes.RouteOf("aten::mm"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::relu"), OpRoute::kNative);
  EXPECT_EQ(routes.size(), 3u);
  EXPECT_EQ(routes.native_count(), 2u);
}

TEST(OpRoutesTest, UnlistedOperatorsAndOverloadsTakeTheDefault) {
  const OpRoutes routes = ParseOk(
      "default = native\n"
      "aten::relu = cpu_fallback\n");
  EXPECT_EQ(routes.default_route(), OpRoute::kNative);
  EXPECT_EQ(routes.RouteOf("aten::sigmoid"), OpRoute::kNative);
  // "aten::relu" names the default overload only.
  EXPECT_EQ(routes.RouteOf("aten::relu"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::relu.out"), OpRoute::kNative);
  // The default line is not an operator.
  EXPECT_EQ(routes.size(), 1u);
  EXPECT_EQ(routes.native_count(), 0u);
}

TEST(OpRoutesTest, WithoutADefaultLineTheDefaultIsCpuFallback) {
  const OpRoutes routes = ParseOk("aten::add.Tensor = native\n");
  EXPECT_EQ(routes.default_route(), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::mul.Tensor"), OpRoute::kCpuFallback);
}

TEST(OpRoutesTest, AnEmptyFileRoutesEverythingToCpuFallback) {
  const OpRoutes routes = ParseOk("");
  EXPECT_EQ(routes.size(), 0u);
  EXPECT_EQ(routes.default_route(), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::add.Tensor"), OpRoute::kCpuFallback);
}

TEST(OpRoutesTest, CommentsBlankLinesAndSurroundingSpaceAreIgnored) {
  const OpRoutes routes = ParseOk(
      "# backends/x/ops.conf\n"
      "\n"
      "   \t\n"
      "  default =   native   # everything else\n"
      "\taten::add.Tensor\t=\tcpu_fallback # slow for now\n"
      "# aten::mm = cpu_fallback\n"
      "aten::sub.Tensor = cpu_fallback\r\n"
      "aten::mul.Tensor = cpu_fallback");  // the last line has no newline
  EXPECT_EQ(routes.default_route(), OpRoute::kNative);
  EXPECT_EQ(routes.RouteOf("aten::add.Tensor"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::sub.Tensor"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::mul.Tensor"), OpRoute::kCpuFallback);
  EXPECT_EQ(routes.RouteOf("aten::mm"), OpRoute::kNative);  // commented out
  EXPECT_EQ(routes.size(), 3u);
}

TEST(OpRoutesTest, ALineWithoutAnEqualsSignIsRefusedByOriginAndLine) {
  const absl::Status status = ParseError(
      "# comment\n"
      "\n"
      "aten::add.Tensor native\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "backends/x/ops.conf:3: expected 'op.overload = route'");
}

TEST(OpRoutesTest, AnUnknownRouteIsRefusedNamingTheRoutes) {
  const absl::Status status = ParseError("aten::add.Tensor = native\naten::mm = fast\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "backends/x/ops.conf:2: unknown route 'fast' (routes are native and cpu_fallback)");
}

TEST(OpRoutesTest, AMissingRouteIsAnUnknownEmptyRoute) {
  const absl::Status status = ParseError("aten::mm =  # to do\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "backends/x/ops.conf:1: unknown route '' (routes are native and cpu_fallback)");
}

TEST(OpRoutesTest, RoutesAreCaseSensitive) {
  const absl::Status status = ParseError("aten::mm = Native\n");
  EXPECT_EQ(status.message(),
            "backends/x/ops.conf:1: unknown route 'Native' (routes are native and cpu_fallback)");
}

TEST(OpRoutesTest, ANameWithoutANamespaceIsRefused) {
  const absl::Status status = ParseError("default = native\nadd.Tensor = native\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "backends/x/ops.conf:2: 'add.Tensor' is not an operator name such as "
            "aten::add.Tensor");
}

TEST(OpRoutesTest, AnEmptyNameIsRefused) {
  const absl::Status status = ParseError("= native\n");
  EXPECT_EQ(status.message(),
            "backends/x/ops.conf:1: '' is not an operator name such as aten::add.Tensor");
}

TEST(OpRoutesTest, AnOperatorRoutedTwiceIsRefusedAtItsSecondLine) {
  const absl::Status status = ParseError(
      "aten::add.Tensor = native\n"
      "aten::mm = native\n"
      "aten::add.Tensor = native\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "backends/x/ops.conf:3: aten::add.Tensor is routed twice");
}

TEST(OpRoutesTest, TheDefaultGivenTwiceIsRefused) {
  const absl::Status status = ParseError("default = native\n#\ndefault = native\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "backends/x/ops.conf:3: the default route is given twice");
}

TEST(EmbeddedOpsConfTest, EachBackendsConfIsItsFileVerbatim) {
  EXPECT_EQ(EmbeddedOpsConf("cpu"), SourceFile("backends/cpu/ops.conf"));
  EXPECT_EQ(EmbeddedOpsConf("kunlunxin"), SourceFile("backends/kunlunxin/ops.conf"));
}

TEST(EmbeddedOpsConfTest, ABackendWithoutAConfHasNone) {
  EXPECT_TRUE(EmbeddedOpsConf("cuda").empty());
  EXPECT_TRUE(EmbeddedOpsConf("").empty());
}

TEST(EmbeddedOpsConfTest, TheCpuBackendRoutesEveryOperatorNatively) {
  // backends/cpu/README.md: its kernels are ATen's CPU kernels, the reference.
  absl::StatusOr<OpRoutes> routes = OpRoutes::Parse(EmbeddedOpsConf("cpu"), "cpu");
  ASSERT_TRUE(routes.ok()) << routes.status();
  EXPECT_EQ(routes->default_route(), OpRoute::kNative);
  EXPECT_GT(routes->size(), 0u);
  EXPECT_EQ(routes->native_count(), routes->size());
  EXPECT_EQ(routes->RouteOf("aten::add.Tensor"), OpRoute::kNative);
}

TEST(EmbeddedOpsConfTest, TheKunlunxinBackendFallsBackToTheCpuByDefault) {
  absl::StatusOr<OpRoutes> routes = OpRoutes::Parse(EmbeddedOpsConf("kunlunxin"), "kunlunxin");
  ASSERT_TRUE(routes.ok()) << routes.status();
  EXPECT_EQ(routes->default_route(), OpRoute::kCpuFallback);
  EXPECT_GT(routes->size(), 0u);
}

}  // namespace
}  // namespace flagos::daemon
