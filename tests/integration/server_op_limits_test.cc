// Per-op bounds: the elements an op call may cover and the host memory a kernel may ask for
// (defaults from the device memory, configurable), refused before the kernel runs.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

// ---------------------------------------------------------------- per-op bounds

constexpr int kDouble = 7;  // c10::ScalarType::Double

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
