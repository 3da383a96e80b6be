// The CPU backend's runtime: every implemented slot, every declared gap, and
// the behaviour specific to host-memory devices. The backend-agnostic
// contract is checked by tests/conformance as well.
#include "cpu_runtime.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"

namespace flagos {
namespace {

constexpr uint64_t kMemory = 4ull << 20;

std::unique_ptr<DeviceRuntime> MakeRuntime(int devices = 2, uint64_t memory = kMemory) {
  CpuRuntimeParams params;
  params.devices = devices;
  params.memory_per_device = memory;
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = CreateCpuRuntime(params);
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  return *std::move(runtime);
}

TEST(CpuRuntimeParamsTest, DefaultsAreTwoDevicesOfEightGiB) {
  CpuRuntimeParams params;
  EXPECT_EQ(params.devices, 2);
  EXPECT_EQ(params.memory_per_device, 8ull << 30);
  EXPECT_TRUE(params.Validate().ok());
}

TEST(CpuRuntimeParamsTest, OutOfRangeValuesAreInvalidArguments) {
  CpuRuntimeParams params;
  params.devices = 0;
  EXPECT_EQ(params.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCpuRuntime(params).status().code(), absl::StatusCode::kInvalidArgument);
  params.devices = 65;
  EXPECT_EQ(params.Validate().code(), absl::StatusCode::kInvalidArgument);
  params.devices = 1;
  params.memory_per_device = 1000;
  EXPECT_EQ(params.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuRuntimeTest, ReportsItsDevices) {
  auto runtime = MakeRuntime(3);
  EXPECT_EQ(runtime->name(), "cpu");
  EXPECT_EQ(runtime->DeviceCount(), 3);
  absl::StatusOr<DeviceProperties> properties = runtime->GetDeviceProperties(2);
  ASSERT_TRUE(properties.ok());
  EXPECT_EQ(properties->index, 2);
  EXPECT_EQ(properties->total_memory, kMemory);
  EXPECT_EQ(properties->name, "flagos cpu device 2");
  EXPECT_EQ(runtime->GetDeviceProperties(3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runtime->SynchronizeDevice(0).ok());
  EXPECT_EQ(runtime->SynchronizeDevice(-1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuRuntimeTest, MallocReturnsAlignedWritableHostMemory) {
  auto runtime = MakeRuntime();
  absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 1000);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(*ptr % 64, 0u);
  EXPECT_EQ(runtime->HostAddress(0, *ptr), reinterpret_cast<void*>(*ptr));
  std::memset(runtime->HostAddress(0, *ptr), 0x5a, 1000);
  EXPECT_EQ(static_cast<unsigned char*>(runtime->HostAddress(0, *ptr))[999], 0x5a);
  EXPECT_EQ(runtime->HostAddress(7, *ptr), nullptr);
  EXPECT_TRUE(runtime->Free(0, *ptr).ok());
}

TEST(CpuRuntimeTest, MemoryInfoCountsAllocatedBytes) {
  auto runtime = MakeRuntime();
  absl::StatusOr<DevicePtr> a = runtime->Malloc(0, 1000);
  absl::StatusOr<DevicePtr> b = runtime->Malloc(0, 24);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<MemoryInfo> info = runtime->GetMemoryInfo(0);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->total_bytes, kMemory);
  EXPECT_EQ(info->free_bytes, kMemory - 1024);
  EXPECT_EQ(runtime->GetMemoryInfo(1)->free_bytes, kMemory);
  ASSERT_TRUE(runtime->Free(0, *a).ok());
  EXPECT_EQ(runtime->GetMemoryInfo(0)->free_bytes, kMemory - 24);
  ASSERT_TRUE(runtime->Free(0, *b).ok());
  EXPECT_EQ(runtime->GetMemoryInfo(0)->free_bytes, kMemory);
}

TEST(CpuRuntimeTest, MallocBeyondTheBudgetSaysWhatToDo) {
  auto runtime = MakeRuntime();
  absl::StatusOr<DevicePtr> held = runtime->Malloc(1, 3ull << 20);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<DevicePtr> ptr = runtime->Malloc(1, 2ull << 20);
  ASSERT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ptr.status().message(),
            "flagos cpu device 1: cannot allocate 2097152 bytes: 3145728 of 4194304 bytes in "
            "use; free tensors, call torch.flagos.empty_cache(), or start flagosd with a larger "
            "--device-memory");
  // The other device has its own budget.
  EXPECT_TRUE(runtime->Malloc(0, 2ull << 20).ok());
}

TEST(CpuRuntimeTest, ZeroByteMallocIsInvalid) {
  auto runtime = MakeRuntime();
  EXPECT_EQ(runtime->Malloc(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuRuntimeTest, FreeChecksThePointerBelongsToTheDevice) {
  auto runtime = MakeRuntime();
  absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 4096);
  ASSERT_TRUE(ptr.ok());
  EXPECT_EQ(runtime->Free(1, *ptr).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(runtime->Free(0, *ptr + 64).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(runtime->Free(0, *ptr).ok());
  EXPECT_EQ(runtime->Free(0, *ptr).code(), absl::StatusCode::kNotFound);
}

TEST(CpuRuntimeTest, CopiesAndMemsetMoveBytes) {
  auto runtime = MakeRuntime();
  DevicePtr a = *runtime->Malloc(0, 256);
  DevicePtr b = *runtime->Malloc(1, 256);
  std::vector<uint8_t> in(256), out(256, 0);
  for (int i = 0; i < 256; ++i) in[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(runtime->CopyHostToDevice(0, 0, a, in.data(), 256).ok());
  ASSERT_TRUE(runtime->CopyDeviceToDevice(1, 0, b, 0, a, 256).ok());
  ASSERT_TRUE(runtime->Memset(1, 0, b + 16, 0xee, 16).ok());
  ASSERT_TRUE(runtime->CopyDeviceToHost(1, 0, out.data(), b, 256).ok());
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(out[i], (i >= 16 && i < 32) ? 0xee : i) << i;
  }
}

TEST(CpuRuntimeTest, CopiesOutsideAnAllocationAreRejected) {
  auto runtime = MakeRuntime();
  DevicePtr a = *runtime->Malloc(0, 256);
  std::vector<uint8_t> buffer(512);
  EXPECT_EQ(runtime->CopyHostToDevice(0, 0, a + 128, buffer.data(), 129).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime->CopyDeviceToHost(1, 0, buffer.data(), a, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime->Memset(0, 0, a - 1, 0, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runtime->CopyHostToDevice(0, 0, a + 256, buffer.data(), 0).ok());
}

TEST(CpuRuntimeTest, StreamsAreIdsWithNothingToWaitFor) {
  auto runtime = MakeRuntime();
  absl::StatusOr<StreamHandle> s1 = runtime->CreateStream(0);
  absl::StatusOr<StreamHandle> s2 = runtime->CreateStream(0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_NE(*s1, 0u);
  EXPECT_NE(*s1, *s2);
  EXPECT_TRUE(runtime->SynchronizeStream(0, *s1).ok());
  EXPECT_TRUE(runtime->SynchronizeStream(0, 0).ok());
  EXPECT_TRUE(*runtime->QueryStream(0, *s1));
  // A stream belongs to its device.
  EXPECT_EQ(runtime->SynchronizeStream(1, *s1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(runtime->DestroyStream(0, *s1).ok());
  EXPECT_EQ(runtime->DestroyStream(0, *s1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(runtime->QueryStream(0, *s1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(runtime->DestroyStream(0, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuRuntimeTest, EventsMeasureHostTime) {
  auto runtime = MakeRuntime();
  EventHandle start = *runtime->CreateEvent(0, /*enable_timing=*/true);
  EventHandle end = *runtime->CreateEvent(0, /*enable_timing=*/true);
  EXPECT_EQ(runtime->ElapsedTime(0, start, end).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(runtime->RecordEvent(0, start, 0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(runtime->RecordEvent(0, end, 0).ok());
  absl::StatusOr<float> ms = runtime->ElapsedTime(0, start, end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 29.0f);
  EXPECT_LT(*ms, 3000.0f);
  EXPECT_TRUE(*runtime->QueryEvent(0, end));
  EXPECT_TRUE(runtime->SynchronizeEvent(0, end).ok());
  StreamHandle stream = *runtime->CreateStream(0);
  EXPECT_TRUE(runtime->StreamWaitEvent(0, stream, end).ok());
  EXPECT_TRUE(runtime->DestroyEvent(0, end).ok());
  EXPECT_EQ(runtime->DestroyEvent(0, end).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(runtime->ElapsedTime(0, start, end).status().code(), absl::StatusCode::kNotFound);
}

TEST(CpuRuntimeTest, ElapsedTimeNeedsTimingEvents) {
  auto runtime = MakeRuntime();
  EventHandle start = *runtime->CreateEvent(0, /*enable_timing=*/false);
  EventHandle end = *runtime->CreateEvent(0, /*enable_timing=*/true);
  ASSERT_TRUE(runtime->RecordEvent(0, start, 0).ok());
  ASSERT_TRUE(runtime->RecordEvent(0, end, 0).ok());
  absl::Status status = runtime->ElapsedTime(0, start, end).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(), "enable_timing")) << status;
}

TEST(CpuRuntimeTest, RecordOnAnUnknownStreamIsNotFound) {
  auto runtime = MakeRuntime();
  EventHandle event = *runtime->CreateEvent(0, true);
  EXPECT_EQ(runtime->RecordEvent(0, event, 12345).code(), absl::StatusCode::kNotFound);
}

TEST(CpuRuntimeTest, CapabilityTableDeclaresEachGapWithItsReason) {
  auto runtime = MakeRuntime();
  const CapabilityTable& table = runtime->capabilities();
  const std::vector<Slot> gaps = {
      Slot::kGetDevice,        Slot::kSetDevice,          Slot::kDeviceGetStreamPriorityRange,
      Slot::kMallocHost,       Slot::kFreeHost,           Slot::kPointerGetAttributes,
      Slot::kStreamCreateWithPriority, Slot::kStreamGetPriority, Slot::kHostRegister,
      Slot::kDeviceTelemetry};
  for (Slot gap : gaps) {
    EXPECT_FALSE(table.Has(gap)) << SlotName(gap);
    EXPECT_FALSE(table.GapReason(gap).empty()) << SlotName(gap);
  }
  EXPECT_EQ(table.ImplementedNames().size() + table.GapDescriptions().size(),
            static_cast<size_t>(kSlotCount));
  EXPECT_EQ(table.GapDescriptions().size(), gaps.size());
  std::vector<std::string> descriptions = table.GapDescriptions();
  EXPECT_TRUE(absl::StartsWith(descriptions[0], "get_device: ")) << descriptions[0];
}

TEST(CpuRuntimeTest, EveryContractMethodIsImplemented) {
  // The gaps above are slots the daemon never needs from a backend whose
  // memory is host memory; every other slot is implemented, none emulated.
  auto runtime = MakeRuntime();
  const CapabilityTable& table = runtime->capabilities();
  for (Slot slot : {Slot::kGetDeviceCount, Slot::kDeviceProperties, Slot::kDeviceSynchronize,
                    Slot::kMalloc, Slot::kFree, Slot::kMemoryInfo, Slot::kMemcpy,
                    Slot::kMemcpyAsync, Slot::kMemset, Slot::kMemsetAsync, Slot::kHostAddress,
                    Slot::kStreamCreate, Slot::kStreamDestroy, Slot::kStreamSynchronize,
                    Slot::kStreamQuery, Slot::kStreamWaitEvent, Slot::kLaunchHostFunc,
                    Slot::kEventCreate, Slot::kEventCreateWithFlags, Slot::kEventDestroy,
                    Slot::kEventRecord, Slot::kEventQuery, Slot::kEventSynchronize,
                    Slot::kEventElapsedTime}) {
    EXPECT_EQ(table.status(slot), SlotStatus::kImplemented) << SlotName(slot);
  }
}

TEST(CpuRuntimeTest, HostRegisterIsAGap) {
  auto runtime = MakeRuntime();
  char buffer[64];
  const absl::Status status = runtime->HostRegister(buffer, sizeof(buffer));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(status.message(), "host_register")) << status;
}

TEST(CpuRuntimeTest, TelemetryIsAGapSayingWhy) {
  auto runtime = MakeRuntime();
  EXPECT_EQ(runtime->capabilities().status(Slot::kDeviceTelemetry), SlotStatus::kGap);
  const absl::Status status = runtime->GetTelemetry(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(status.message(), "cpu backend: device_telemetry is not supported"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "no device management library")) << status;
}

TEST(CpuRuntimeTest, HostFuncRunsInTheCallingThreadAfterEarlierWork) {
  auto runtime = MakeRuntime();
  absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 64);
  ASSERT_TRUE(ptr.ok());
  const char in[8] = "flagos!";
  char out[8] = {};
  ASSERT_TRUE(runtime->CopyHostToDevice(0, 0, *ptr, in, 8).ok());
  ASSERT_TRUE(runtime->CopyDeviceToHost(0, 0, out, *ptr, 8).ok());
  bool ran = false;
  ASSERT_TRUE(runtime->LaunchHostFunc(0, 0, [&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    EXPECT_STREQ(out, "flagos!");
    ran = true;
  }).ok());
  EXPECT_TRUE(ran);
  EXPECT_EQ(runtime->LaunchHostFunc(0, 999, [](absl::Status) {}).code(),
            absl::StatusCode::kNotFound);
}

TEST(CpuRuntimeTest, DestroyingTheRuntimeReleasesLeftoverAllocations) {
  auto runtime = MakeRuntime();
  ASSERT_TRUE(runtime->Malloc(0, 1 << 20).ok());
  runtime.reset();  // must not leak or crash (checked under ASan/valgrind)
  SUCCEED();
}

}  // namespace
}  // namespace flagos
