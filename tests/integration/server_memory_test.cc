// Device memory over the Session stream: copies and memsets, addresses checked against the
// session's own segments, allocation beyond the device, frees ordered after earlier work,
// and every segment freed when the session ends, dies or the server shuts down.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

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

TEST_F(ServerTest, ShutdownCancelsLiveSessionsAndFreesTheirMemory) {
  RawSession session(stub_.get());
  session.Open();
  session.AllocateOk(1 << 20);
  server_->Shutdown(absl::Seconds(1));
  server_->Wait();
  EXPECT_FALSE(session.End().ok());
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
}

}  // namespace
}  // namespace flagos::daemon
