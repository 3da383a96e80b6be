// The DeviceRuntime contract, checked against every registered backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "conformance.h"

namespace flagos::conformance {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return bytes;
}

class RuntimeConformanceTest : public ::testing::TestWithParam<BackendRegistration> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = GetParam().create();
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
    ASSERT_GE(runtime_->DeviceCount(), 1);
  }

  void TearDown() override {
    for (const auto& [ptr, device] : allocations_) (void)runtime_->Free(device, ptr);
  }

  bool Has(Slot slot) const { return runtime_->capabilities().Has(slot); }

  // Malloc that the fixture frees at the end.
  DevicePtr MustMalloc(int device, uint64_t nbytes) {
    absl::StatusOr<DevicePtr> ptr = runtime_->Malloc(device, nbytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status();
    if (!ptr.ok()) return 0;
    allocations_[*ptr] = device;
    return *ptr;
  }

  absl::Status MustFree(int device, DevicePtr ptr) {
    allocations_.erase(ptr);
    return runtime_->Free(device, ptr);
  }

  std::vector<uint8_t> Read(int device, DevicePtr src, size_t n, StreamHandle stream = 0) {
    std::vector<uint8_t> out(n, 0xcd);
    EXPECT_TRUE(runtime_->CopyDeviceToHost(device, stream, out.data(), src, n).ok());
    EXPECT_TRUE(runtime_->SynchronizeStream(device, stream).ok());
    return out;
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  std::map<DevicePtr, int> allocations_;
};

// ---------------------------------------------------------------- capabilities

TEST_P(RuntimeConformanceTest, EverySlotIsDeclaredWithHowOrWhy) {
  const CapabilityTable& table = runtime_->capabilities();
  int seed_slots = 0;
  for (int i = 0; i < kSlotCount; ++i) {
    const Slot slot = static_cast<Slot>(i);
    EXPECT_TRUE(table.Declared(slot)) << SlotName(slot) << " is not declared by " << runtime_->name();
    EXPECT_FALSE(table.Note(slot).empty()) << SlotName(slot) << ": say how, or why it is a gap";
    if (i < kSeedSlotCount) ++seed_slots;
  }
  EXPECT_EQ(seed_slots, 28);  // the seeds' contract: device 5, memory 9, stream 7, event 7
  EXPECT_EQ(table.ImplementedNames().size() + table.GapDescriptions().size(),
            static_cast<size_t>(kSlotCount));
  // Slots every daemon needs.
  for (Slot slot : {Slot::kGetDeviceCount, Slot::kDeviceProperties, Slot::kMalloc, Slot::kFree,
                    Slot::kMemcpyAsync, Slot::kMemsetAsync, Slot::kDeviceSynchronize,
                    Slot::kStreamCreate, Slot::kStreamSynchronize, Slot::kStreamQuery,
                    Slot::kEventRecord, Slot::kEventQuery, Slot::kLaunchHostFunc,
                    Slot::kStreamDrain}) {
    EXPECT_TRUE(table.Has(slot)) << SlotName(slot);
  }
}

TEST_P(RuntimeConformanceTest, GapsReturnUnimplementedNamingSlotAndBackend) {
  uint8_t buffer[16] = {};
  DeviceRuntime& r = *runtime_;
  const std::map<Slot, std::function<absl::Status()>> calls = {
      {Slot::kDeviceProperties, [&] { return r.GetDeviceProperties(0).status(); }},
      {Slot::kDeviceSynchronize, [&] { return r.SynchronizeDevice(0); }},
      {Slot::kMemoryInfo, [&] { return r.GetMemoryInfo(0).status(); }},
      {Slot::kHostRegister, [&] { return r.HostRegister(buffer, sizeof(buffer)); }},
      {Slot::kEventElapsedTime, [&] { return r.ElapsedTime(0, 1, 2).status(); }},
      {Slot::kDeviceTelemetry, [&] { return r.GetTelemetry(0).status(); }},
  };
  for (const auto& [slot, call] : calls) {
    if (Has(slot)) continue;
    const absl::Status status = call();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << SlotName(slot);
    EXPECT_TRUE(absl::StrContains(status.message(), SlotName(slot))) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), r.name())) << status;
  }
  if (!Has(Slot::kHostAddress)) EXPECT_EQ(r.HostAddress(0, 0), nullptr);
}

// ---------------------------------------------------------------------- device

TEST_P(RuntimeConformanceTest, DevicesDescribeThemselves) {
  for (int d = 0; d < runtime_->DeviceCount(); ++d) {
    absl::StatusOr<DeviceProperties> properties = runtime_->GetDeviceProperties(d);
    ASSERT_TRUE(properties.ok()) << properties.status();
    EXPECT_EQ(properties->index, d);
    EXPECT_FALSE(properties->name.empty());
    EXPECT_GE(properties->total_memory, 16ull << 20);
  }
}

TEST_P(RuntimeConformanceTest, DevicesOutOfRangeAreInvalidArguments) {
  const int count = runtime_->DeviceCount();
  EXPECT_EQ(runtime_->GetDeviceProperties(count).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->Malloc(-1, 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->Malloc(count, 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->SynchronizeDevice(count).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(RuntimeConformanceTest, TelemetryFiguresArePlausibleWhenReported) {
  if (!Has(Slot::kDeviceTelemetry)) GTEST_SKIP() << "a declared gap of " << runtime_->name();
  for (int d = 0; d < runtime_->DeviceCount(); ++d) {
    absl::StatusOr<DeviceTelemetry> t = runtime_->GetTelemetry(d);
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->utilization) {
      EXPECT_GE(*t->utilization, 0.0);
      EXPECT_LE(*t->utilization, 1.0);
    }
    if (t->power_watts) EXPECT_GE(*t->power_watts, 0.0);
    if (t->memory_total_bytes && t->memory_used_bytes) {
      EXPECT_LE(*t->memory_used_bytes, *t->memory_total_bytes);
    }
  }
  EXPECT_EQ(runtime_->GetTelemetry(runtime_->DeviceCount()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------- memory

TEST_P(RuntimeConformanceTest, MallocReturnsDistinctAlignedAllocations) {
  std::vector<std::pair<DevicePtr, uint64_t>> ranges;
  for (uint64_t nbytes : {1ull, 63ull, 64ull, 4096ull, 100000ull, 1ull << 20}) {
    const DevicePtr ptr = MustMalloc(0, nbytes);
    ASSERT_NE(ptr, 0u);
    EXPECT_EQ(ptr % 64, 0u) << "allocations must be at least 64-byte aligned";
    ranges.emplace_back(ptr, nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first) << "allocations overlap";
  }
}

TEST_P(RuntimeConformanceTest, MemoryInfoFollowsAllocations) {
  const uint64_t total = runtime_->GetDeviceProperties(0)->total_memory;
  absl::StatusOr<MemoryInfo> before = runtime_->GetMemoryInfo(0);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->total_bytes, total);
  EXPECT_LE(before->free_bytes, total);
  const uint64_t nbytes = 8ull << 20;
  const DevicePtr ptr = MustMalloc(0, nbytes);
  absl::StatusOr<MemoryInfo> during = runtime_->GetMemoryInfo(0);
  ASSERT_TRUE(during.ok());
  EXPECT_LE(during->free_bytes + nbytes, before->free_bytes);
  ASSERT_TRUE(MustFree(0, ptr).ok());
  EXPECT_GE(runtime_->GetMemoryInfo(0)->free_bytes, before->free_bytes);
}

TEST_P(RuntimeConformanceTest, MallocBeyondTheDeviceIsResourceExhausted) {
  const uint64_t total = runtime_->GetDeviceProperties(0)->total_memory;
  absl::StatusOr<DevicePtr> ptr = runtime_->Malloc(0, total + 1);
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(ptr.status().message().empty());
}

TEST_P(RuntimeConformanceTest, FreeingTwiceIsNotFound) {
  const DevicePtr ptr = MustMalloc(0, 4096);
  ASSERT_TRUE(MustFree(0, ptr).ok());
  EXPECT_EQ(runtime_->Free(0, ptr).code(), absl::StatusCode::kNotFound);
}

TEST_P(RuntimeConformanceTest, HostDeviceRoundTripKeepsEveryByte) {
  const uint64_t size = (1ull << 20) + 64;
  const DevicePtr ptr = MustMalloc(0, size);
  for (uint64_t offset : {0ull, 1ull, 4093ull}) {
    for (uint64_t n : {1ull, 3ull, 4096ull, 1ull << 20}) {
      if (offset + n > size) continue;
      const std::vector<uint8_t> in = Pattern(n, static_cast<uint8_t>(offset + n));
      ASSERT_TRUE(runtime_->CopyHostToDevice(0, 0, ptr + offset, in.data(), n).ok());
      EXPECT_EQ(Read(0, ptr + offset, n), in) << "offset " << offset << " bytes " << n;
    }
  }
}

TEST_P(RuntimeConformanceTest, HostAddressShowsTheDeviceBytesWhenAvailable) {
  const DevicePtr ptr = MustMalloc(0, 256);
  const std::vector<uint8_t> in = Pattern(256, 9);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, 0, ptr, in.data(), 256).ok());
  ASSERT_TRUE(runtime_->SynchronizeDevice(0).ok());
  void* host = runtime_->HostAddress(0, ptr);
  if (host == nullptr) GTEST_SKIP() << runtime_->name() << " memory is not host-addressable";
  EXPECT_EQ(std::memcmp(host, in.data(), 256), 0);
}

TEST_P(RuntimeConformanceTest, DeviceToDeviceCopyWithinAndAcrossDevices) {
  const DevicePtr a = MustMalloc(0, 8192);
  const DevicePtr b = MustMalloc(0, 8192);
  const std::vector<uint8_t> in = Pattern(8192, 1);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, 0, a, in.data(), 8192).ok());
  ASSERT_TRUE(runtime_->CopyDeviceToDevice(0, 0, b, 0, a + 100, 4000).ok());
  EXPECT_EQ(Read(0, b, 4000), std::vector<uint8_t>(in.begin() + 100, in.begin() + 4100));
  if (runtime_->DeviceCount() < 2) GTEST_SKIP() << "one device: no cross-device copy";
  const DevicePtr c = MustMalloc(1, 8192);
  ASSERT_TRUE(runtime_->CopyDeviceToDevice(1, 0, c, 0, a, 8192).ok());
  EXPECT_EQ(Read(1, c, 8192), in);
}

TEST_P(RuntimeConformanceTest, MemsetFillsExactlyItsRange) {
  const DevicePtr ptr = MustMalloc(0, 1024);
  const std::vector<uint8_t> zeros(1024, 0);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, 0, ptr, zeros.data(), 1024).ok());
  ASSERT_TRUE(runtime_->Memset(0, 0, ptr + 10, 0xab, 100).ok());
  const std::vector<uint8_t> out = Read(0, ptr, 1024);
  for (int i = 0; i < 1024; ++i) {
    ASSERT_EQ(out[i], (i >= 10 && i < 110) ? 0xab : 0) << "byte " << i;
  }
}

TEST_P(RuntimeConformanceTest, ZeroByteTransfersSucceed) {
  const DevicePtr ptr = MustMalloc(0, 64);
  uint8_t byte = 0;
  EXPECT_TRUE(runtime_->CopyHostToDevice(0, 0, ptr, &byte, 0).ok());
  EXPECT_TRUE(runtime_->CopyDeviceToHost(0, 0, &byte, ptr, 0).ok());
  EXPECT_TRUE(runtime_->CopyDeviceToDevice(0, 0, ptr, 0, ptr, 0).ok());
  EXPECT_TRUE(runtime_->Memset(0, 0, ptr, 1, 0).ok());
}

// --------------------------------------------------------------------- streams

TEST_P(RuntimeConformanceTest, StreamsAreDistinctAndDestroyable) {
  absl::StatusOr<StreamHandle> a = runtime_->CreateStream(0);
  absl::StatusOr<StreamHandle> b = runtime_->CreateStream(0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, 0u);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(runtime_->DestroyStream(0, *a).ok());
  EXPECT_EQ(runtime_->DestroyStream(0, *a).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(runtime_->DestroyStream(0, *b).ok());
}

TEST_P(RuntimeConformanceTest, WorkOnOneStreamRunsInOrder) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  const DevicePtr a = MustMalloc(0, 1 << 20);
  const DevicePtr b = MustMalloc(0, 1 << 20);
  const std::vector<uint8_t> in = Pattern(1 << 20, 3);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, stream, a, in.data(), in.size()).ok());
  ASSERT_TRUE(runtime_->CopyDeviceToDevice(0, stream, b, 0, a, in.size()).ok());
  ASSERT_TRUE(runtime_->Memset(0, stream, b, 0, 16).ok());
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE(runtime_->CopyDeviceToHost(0, stream, out.data(), b, out.size()).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(0, stream).ok());
  EXPECT_TRUE(*runtime_->QueryStream(0, stream));
  std::vector<uint8_t> expected = in;
  std::fill(expected.begin(), expected.begin() + 16, 0);
  EXPECT_EQ(out, expected);
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, SynchronizeDeviceWaitsForEveryStream) {
  const DevicePtr ptr = MustMalloc(0, 4 << 20);
  std::vector<StreamHandle> streams;
  std::vector<std::vector<uint8_t>> inputs;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(*runtime_->CreateStream(0));
    inputs.push_back(Pattern(1 << 20, static_cast<uint8_t>(i)));
    ASSERT_TRUE(runtime_
                    ->CopyHostToDevice(0, streams.back(), ptr + (uint64_t{1} << 20) * i,
                                       inputs.back().data(), 1 << 20)
                    .ok());
  }
  ASSERT_TRUE(runtime_->SynchronizeDevice(0).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(*runtime_->QueryStream(0, streams[i]));
    EXPECT_EQ(Read(0, ptr + (uint64_t{1} << 20) * i, 1 << 20), inputs[i]) << "stream " << i;
    EXPECT_TRUE(runtime_->DestroyStream(0, streams[i]).ok());
  }
}

// ---------------------------------------------------------------------- events

TEST_P(RuntimeConformanceTest, RecordedEventCompletes) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  const EventHandle event = *runtime_->CreateEvent(0, /*enable_timing=*/false);
  const DevicePtr ptr = MustMalloc(0, 1 << 20);
  const std::vector<uint8_t> in = Pattern(1 << 20, 5);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, stream, ptr, in.data(), in.size()).ok());
  ASSERT_TRUE(runtime_->RecordEvent(0, event, stream).ok());
  ASSERT_TRUE(runtime_->SynchronizeEvent(0, event).ok());
  EXPECT_TRUE(*runtime_->QueryEvent(0, event));
  EXPECT_TRUE(runtime_->DestroyEvent(0, event).ok());
  EXPECT_EQ(runtime_->DestroyEvent(0, event).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, StreamWaitEventOrdersWorkAcrossStreams) {
  const StreamHandle producer = *runtime_->CreateStream(0);
  const StreamHandle consumer = *runtime_->CreateStream(0);
  const EventHandle ready = *runtime_->CreateEvent(0, false);
  // The producer writes 24 chunks, the first 23 eight times over (some 20
  // ms of copying), the last one at the very end; the consumer reads only
  // the last, which a consumer not held back by the event would read long
  // before the producer gets to it.
  constexpr uint64_t kChunk = 1 << 20;
  constexpr int kChunks = 24;
  constexpr int kRounds = 8;
  const DevicePtr a = MustMalloc(0, kChunk * kChunks);
  const DevicePtr b = MustMalloc(0, kChunk);
  const std::vector<uint8_t> zeros(kChunk * kChunks, 0);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, producer, a, zeros.data(), zeros.size()).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(0, producer).ok());
  const std::vector<uint8_t> in = Pattern(kChunk * kChunks, 11);
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < kChunks - 1; ++i) {
      ASSERT_TRUE(runtime_
                      ->CopyHostToDevice(0, producer, a + i * kChunk, in.data() + i * kChunk,
                                         kChunk)
                      .ok());
    }
  }
  const uint64_t last = kChunk * (kChunks - 1);
  ASSERT_TRUE(
      runtime_->CopyHostToDevice(0, producer, a + last, in.data() + last, kChunk).ok());
  ASSERT_TRUE(runtime_->RecordEvent(0, ready, producer).ok());
  ASSERT_TRUE(runtime_->StreamWaitEvent(0, consumer, ready).ok());
  ASSERT_TRUE(runtime_->CopyDeviceToDevice(0, consumer, b, 0, a + last, kChunk).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(0, consumer).ok());
  EXPECT_EQ(Read(0, b, kChunk), std::vector<uint8_t>(in.begin() + last, in.end()))
      << "the consumer did not wait for the producer's event";
  ASSERT_TRUE(runtime_->SynchronizeStream(0, producer).ok());
  EXPECT_TRUE(runtime_->DestroyEvent(0, ready).ok());
  EXPECT_TRUE(runtime_->DestroyStream(0, consumer).ok());
  EXPECT_TRUE(runtime_->DestroyStream(0, producer).ok());
}

TEST_P(RuntimeConformanceTest, ElapsedTimeMeasuresTheTimeBetweenEvents) {
  if (!Has(Slot::kEventElapsedTime)) GTEST_SKIP() << "a declared gap of " << runtime_->name();
  const EventHandle start = *runtime_->CreateEvent(0, /*enable_timing=*/true);
  const EventHandle end = *runtime_->CreateEvent(0, /*enable_timing=*/true);
  ASSERT_TRUE(runtime_->RecordEvent(0, start, 0).ok());
  ASSERT_TRUE(runtime_->SynchronizeEvent(0, start).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_TRUE(runtime_->RecordEvent(0, end, 0).ok());
  ASSERT_TRUE(runtime_->SynchronizeEvent(0, end).ok());
  absl::StatusOr<float> ms = runtime_->ElapsedTime(0, start, end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 24.0f);
  EXPECT_LT(*ms, 5000.0f);
}

TEST_P(RuntimeConformanceTest, ElapsedTimeNeedsRecordedTimingEvents) {
  if (!Has(Slot::kEventElapsedTime)) GTEST_SKIP() << "a declared gap of " << runtime_->name();
  const EventHandle timing = *runtime_->CreateEvent(0, true);
  const EventHandle unrecorded = *runtime_->CreateEvent(0, true);
  const EventHandle plain = *runtime_->CreateEvent(0, false);
  ASSERT_TRUE(runtime_->RecordEvent(0, timing, 0).ok());
  ASSERT_TRUE(runtime_->RecordEvent(0, plain, 0).ok());
  EXPECT_EQ(runtime_->ElapsedTime(0, timing, unrecorded).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->ElapsedTime(0, plain, timing).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ------------------------------------------------- completion (async devices)

TEST_P(RuntimeConformanceTest, HostFuncRunsOnceTheStreamsEarlierWorkCompleted) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  const DevicePtr ptr = MustMalloc(0, 1 << 20);
  const std::vector<uint8_t> in = Pattern(1 << 20, 21);
  std::vector<uint8_t> out(in.size(), 0);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, stream, ptr, in.data(), in.size()).ok());
  ASSERT_TRUE(runtime_->CopyDeviceToHost(0, stream, out.data(), ptr, out.size()).ok());
  absl::Notification ran;
  bool bytes_there = false;
  ASSERT_TRUE(runtime_
                  ->LaunchHostFunc(0, stream,
                                   [&](absl::Status status) {
                                     EXPECT_TRUE(status.ok()) << status;
                                     bytes_there = out == in;
                                     ran.Notify();
                                   })
                  .ok());
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(bytes_there) << "the host function ran before the copy it follows completed";
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, HostFuncsOfOneStreamRunInIssueOrder) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  absl::Mutex mu;
  std::vector<int> order;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(runtime_
                    ->LaunchHostFunc(0, stream,
                                     [&, i](absl::Status) {
                                       absl::MutexLock lock(&mu);
                                       order.push_back(i);
                                     })
                    .ok());
  }
  // DestroyStream runs every pending host function first.
  ASSERT_TRUE(runtime_->DestroyStream(0, stream).ok());
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
}

TEST_P(RuntimeConformanceTest, DrainStreamReturnsAfterEveryEarlierHostFuncReturned) {
  // What a sync of flagosd relies on: a download's reply is posted by a
  // host function, and the sync's reply must come after it. The functions
  // take a while to return (the sleep widens the window in which a drain
  // that waits for the device only would return first).
  const StreamHandle stream = *runtime_->CreateStream(0);
  const DevicePtr ptr = MustMalloc(0, 1 << 20);
  const std::vector<uint8_t> in = Pattern(1 << 20, 61);
  std::vector<uint8_t> out(in.size(), 0);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, stream, ptr, in.data(), in.size()).ok());
  ASSERT_TRUE(runtime_->CopyDeviceToHost(0, stream, out.data(), ptr, out.size()).ok());
  absl::Mutex mu;
  std::vector<int> returned;
  std::vector<uint8_t> seen;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(runtime_
                    ->LaunchHostFunc(0, stream,
                                     [&, i](absl::Status status) {
                                       EXPECT_TRUE(status.ok()) << status;
                                       absl::SleepFor(absl::Milliseconds(20));
                                       absl::MutexLock lock(&mu);
                                       if (i == 0) seen = out;
                                       returned.push_back(i);
                                     })
                    .ok());
  }
  ASSERT_TRUE(runtime_->DrainStream(0, stream).ok());
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(returned, (std::vector<int>{0, 1, 2}))
        << "DrainStream returned before the host functions issued before it had returned";
    EXPECT_TRUE(seen == in) << "a host function ran before the copy it follows completed";
  }
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, DrainStreamOfTheDefaultStreamAndWithNothingIssued) {
  // Nothing issued: returns at once, on the default stream as on another.
  EXPECT_TRUE(runtime_->DrainStream(0, 0).ok());
  const StreamHandle stream = *runtime_->CreateStream(0);
  EXPECT_TRUE(runtime_->DrainStream(0, stream).ok());
  bool ran = false;
  ASSERT_TRUE(runtime_->LaunchHostFunc(0, 0, [&ran](absl::Status) { ran = true; }).ok());
  ASSERT_TRUE(runtime_->DrainStream(0, 0).ok());
  EXPECT_TRUE(ran);
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, DrainStreamOfAnUnknownStreamOrDeviceFails) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  ASSERT_TRUE(runtime_->DestroyStream(0, stream).ok());
  EXPECT_FALSE(runtime_->DrainStream(0, stream).ok());
  EXPECT_EQ(runtime_->DrainStream(runtime_->DeviceCount(), 0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(RuntimeConformanceTest, UploadSourceMayBeReusedOnceTheCopyCompleted) {
  // A caller that follows the contract: overwrite the host source only
  // after the stream is synchronised. The device must hold the first bytes.
  const DevicePtr ptr = MustMalloc(0, 256 << 10);
  std::vector<uint8_t> source = Pattern(256 << 10, 31);
  const std::vector<uint8_t> first = source;
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, 0, ptr, source.data(), source.size()).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(0, 0).ok());
  std::fill(source.begin(), source.end(), 0);
  EXPECT_EQ(Read(0, ptr, first.size()), first);
}

TEST_P(RuntimeConformanceTest, LargeMemsetOnAStreamIsOrderedAndComplete) {
  const uint64_t n = 40ull << 20;  // several chunks where memset is emulated
  const StreamHandle stream = *runtime_->CreateStream(0);
  const DevicePtr ptr = MustMalloc(0, n);
  ASSERT_TRUE(runtime_->Memset(0, stream, ptr, 0x11, n).ok());
  ASSERT_TRUE(runtime_->Memset(0, stream, ptr + n / 2, 0x22, 4096).ok());
  std::vector<uint8_t> out(n);
  ASSERT_TRUE(runtime_->CopyDeviceToHost(0, stream, out.data(), ptr, n).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(0, stream).ok());
  for (uint64_t i = 0; i < n; i += 4093) {
    const uint8_t want = (i >= n / 2 && i < n / 2 + 4096) ? 0x22 : 0x11;
    ASSERT_EQ(out[i], want) << "byte " << i;
  }
  EXPECT_EQ(out[n - 1], 0x11);
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, QueryTellsPendingFromComplete) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  const EventHandle event = *runtime_->CreateEvent(0, false);
  EXPECT_TRUE(*runtime_->QueryEvent(0, event)) << "a never-recorded event counts as complete";
  const DevicePtr ptr = MustMalloc(0, 4 << 20);
  const std::vector<uint8_t> in = Pattern(4 << 20, 41);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, stream, ptr, in.data(), in.size()).ok());
  ASSERT_TRUE(runtime_->RecordEvent(0, event, stream).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(0, stream).ok());
  EXPECT_TRUE(*runtime_->QueryStream(0, stream));
  EXPECT_TRUE(*runtime_->QueryEvent(0, event));
  EXPECT_TRUE(runtime_->DestroyEvent(0, event).ok());
  EXPECT_TRUE(runtime_->DestroyStream(0, stream).ok());
}

TEST_P(RuntimeConformanceTest, DestroyStreamWaitsForItsWork) {
  const StreamHandle stream = *runtime_->CreateStream(0);
  const DevicePtr ptr = MustMalloc(0, 1 << 20);
  const std::vector<uint8_t> in = Pattern(1 << 20, 51);
  ASSERT_TRUE(runtime_->CopyHostToDevice(0, stream, ptr, in.data(), in.size()).ok());
  ASSERT_TRUE(runtime_->DestroyStream(0, stream).ok());
  EXPECT_EQ(Read(0, ptr, in.size()), in);
}

INSTANTIATE_TEST_SUITE_P(Backends, RuntimeConformanceTest,
                         ::testing::ValuesIn(RegisteredBackends()),
                         [](const ::testing::TestParamInfo<BackendRegistration>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace flagos::conformance
