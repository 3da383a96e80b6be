// daemon/execution/route_kernel_facts.h: each overload gets the facts of
// the kernels its route runs, native or cpu_fallback.
#include "execution/route_kernel_facts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace flagos::daemon {
namespace {

OpRoutes Routes(absl::string_view conf) {
  absl::StatusOr<OpRoutes> routes = OpRoutes::Parse(conf, "test.conf");
  EXPECT_TRUE(routes.ok()) << routes.status();
  return routes.ok() ? *std::move(routes) : OpRoutes();
}

// Overloads as a torch would have them: native_batch_norm has the default
// one and .out; _embedding_bag only the default one.
std::vector<std::string> Overloads(absl::string_view op) {
  if (op == "aten::native_batch_norm") return {"", "out"};
  if (op == "aten::_embedding_bag") return {""};
  return {};
}

// The native kernels' facts and the cpu_fallback route's differ.
const std::vector<KernelFact> kNativeFacts = {
    {"aten::native_batch_norm", /*always=*/true, false, false},
};
const std::vector<KernelFact> kFallbackFacts = {
    {"aten::native_batch_norm", false, /*reduced_precision_input=*/true, /*eval_mode=*/true},
    {"aten::_embedding_bag", /*always=*/true, false, false},
};

TEST(RouteKernelFactsTest, AllFallbackGetsTheFallbackRoutesFactsForEveryOverload) {
  std::vector<KernelFact> facts = RouteKernelFacts(Routes("default = cpu_fallback\n"), nullptr,
                                                   kFallbackFacts, &Overloads);
  ASSERT_EQ(facts.size(), 2u);
  EXPECT_EQ(facts[0].op, "aten::native_batch_norm");
  EXPECT_FALSE(facts[0].always);
  EXPECT_TRUE(facts[0].reduced_precision_input);
  EXPECT_TRUE(facts[0].eval_mode);
  EXPECT_TRUE(facts[0].overloads.empty());
  EXPECT_EQ(facts[1].op, "aten::_embedding_bag");
  EXPECT_TRUE(facts[1].always);
  EXPECT_TRUE(facts[1].overloads.empty());
}

TEST(RouteKernelFactsTest, AllNativeGetsTheNativeKernelsFactsOnly) {
  std::vector<KernelFact> facts =
      RouteKernelFacts(Routes("default = native\n"), &kNativeFacts, kFallbackFacts, &Overloads);
  ASSERT_EQ(facts.size(), 1u);
  EXPECT_EQ(facts[0].op, "aten::native_batch_norm");
  EXPECT_TRUE(facts[0].always);
  EXPECT_FALSE(facts[0].reduced_precision_input);
  EXPECT_TRUE(facts[0].overloads.empty());
}

TEST(RouteKernelFactsTest, OverloadsOnDifferentRoutesGetTheirRoutesFacts) {
  std::vector<KernelFact> facts = RouteKernelFacts(
      Routes("default = native\naten::native_batch_norm.out = cpu_fallback\n"), &kNativeFacts,
      kFallbackFacts, &Overloads);
  ASSERT_EQ(facts.size(), 2u);
  // The default overload runs the native kernel...
  EXPECT_EQ(facts[0].op, "aten::native_batch_norm");
  EXPECT_TRUE(facts[0].always);
  EXPECT_EQ(facts[0].overloads, std::vector<std::string>{""});
  // ... .out ATen CPU's.
  EXPECT_EQ(facts[1].op, "aten::native_batch_norm");
  EXPECT_FALSE(facts[1].always);
  EXPECT_TRUE(facts[1].reduced_precision_input);
  EXPECT_EQ(facts[1].overloads, std::vector<std::string>{"out"});
}

TEST(RouteKernelFactsTest, AnOpRoutedAwayFromTheKernelsWithTheFactHasNone) {
  // _embedding_bag runs the native kernels, which state nothing about it.
  std::vector<KernelFact> facts = RouteKernelFacts(
      Routes("default = cpu_fallback\naten::_embedding_bag = native\n"), &kNativeFacts,
      kFallbackFacts, &Overloads);
  ASSERT_EQ(facts.size(), 1u);
  EXPECT_EQ(facts[0].op, "aten::native_batch_norm");
  EXPECT_TRUE(facts[0].reduced_precision_input);
  EXPECT_TRUE(facts[0].overloads.empty());
}

TEST(RouteKernelFactsTest, AFactAboutAnOpTorchDoesNotHaveIsDropped) {
  const std::vector<KernelFact> fallback = {{"aten::no_such_op", true, false, false}};
  EXPECT_TRUE(
      RouteKernelFacts(Routes("default = cpu_fallback\n"), nullptr, fallback, &Overloads).empty());
}

}  // namespace
}  // namespace flagos::daemon
