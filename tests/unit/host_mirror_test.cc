// daemon/ops/host_mirror.h: the cpu_fallback route's host copies, on the cpu
// backend's runtime and on the kunlunxin runtime over the fake libxpurt
// (tests/fakes/xpurt), whose device memory the host cannot touch and whose
// copies run after the call returned: there a Fetch that did not wait reads
// stale bytes, and host buffers released before the device read them are
// unmapped under its copy.
#include "ops/host_mirror.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cpu_runtime.h"
#include "delegating_runtime.h"
#include "execution/worker_pool.h"
#ifdef FLAGOS_FAKE_XPU_ROOT
#include "kunlunxin_runtime.h"
#endif

namespace flagos::daemon {
namespace {

struct RuntimeKind {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<DeviceRuntime>>()> create;
};

void PrintTo(const RuntimeKind& kind, std::ostream* os) { *os << kind.name; }

RuntimeKind Cpu() {
  return {"cpu", [] {
            CpuRuntimeParams params;
            params.devices = 1;
            params.memory_per_device = 64ull << 20;
            return CreateCpuRuntime(params);
          }};
}

#ifdef FLAGOS_FAKE_XPU_ROOT
// As tests/conformance/kunlunxin_registration.cc, but with work completing
// 20 ms after it was issued (not 200 us): long after the mirror's calls
// returned, even while the fake starts its stream threads. The fake reads its
// variables once, when loaded; the caller's environment wins.
RuntimeKind KunlunxinFake() {
  return {"kunlunxin_fake", [] {
            setenv("FAKE_XPU_MEMORY", "67108864", /*overwrite=*/0);
            setenv("FAKE_XPU_DELAY_US", "20000", /*overwrite=*/0);
            setenv("FLAGOS_KUNLUNXIN_XPURT", FLAGOS_FAKE_XPU_ROOT "/so/libxpurt.so.2",
                   /*overwrite=*/0);
            return CreateKunlunxinRuntime(KunlunxinRuntimeParams{});
          }};
}
#endif

std::vector<RuntimeKind> Runtimes() {
#ifdef FLAGOS_FAKE_XPU_ROOT
  return {Cpu(), KunlunxinFake()};
#else
  return {Cpu()};
#endif
}

std::vector<char> Pattern(size_t n, uint8_t seed) {
  std::vector<char> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(seed + i * 7 + (i >> 8));
  return bytes;
}

class HostMirrorTest : public ::testing::TestWithParam<RuntimeKind> {
 protected:
  static constexpr int kDevice = 0;

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = GetParam().create();
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
    absl::StatusOr<StreamHandle> stream = runtime_->CreateStream(kDevice);
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *stream;
  }

  void TearDown() override {
    if (runtime_ == nullptr) return;
    EXPECT_TRUE(runtime_->SynchronizeDevice(kDevice).ok());
    for (DevicePtr ptr : allocations_) EXPECT_TRUE(runtime_->Free(kDevice, ptr).ok());
    EXPECT_TRUE(runtime_->DestroyStream(kDevice, stream_).ok());
  }

  DevicePtr Allocate(uint64_t nbytes) {
    absl::StatusOr<DevicePtr> ptr = runtime_->Malloc(kDevice, nbytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status();
    if (!ptr.ok()) return 0;
    allocations_.push_back(*ptr);
    return *ptr;
  }

  // Device memory holding `bytes`, written and complete.
  DevicePtr AllocateHolding(const std::vector<char>& bytes) {
    const DevicePtr ptr = Allocate(bytes.size());
    EXPECT_TRUE(
        runtime_->CopyHostToDevice(kDevice, stream_, ptr, bytes.data(), bytes.size()).ok());
    EXPECT_TRUE(runtime_->SynchronizeStream(kDevice, stream_).ok());
    return ptr;
  }

  // What the device holds at [ptr, ptr + nbytes), once every issued work is done.
  std::vector<char> DeviceBytes(DevicePtr ptr, uint64_t nbytes) {
    std::vector<char> bytes(nbytes);
    EXPECT_TRUE(runtime_->CopyDeviceToHost(kDevice, stream_, bytes.data(), ptr, nbytes).ok());
    EXPECT_TRUE(runtime_->SynchronizeStream(kDevice, stream_).ok());
    return bytes;
  }

  HostMirror Mirror() { return HostMirror(*runtime_, kDevice, stream_); }

  std::unique_ptr<DeviceRuntime> runtime_;
  StreamHandle stream_ = 0;
  std::vector<DevicePtr> allocations_;
};

TEST_P(HostMirrorTest, FetchReturnsWithTheDeviceBytesOnTheHost) {
  const std::vector<char> bytes = Pattern(1 << 20, 3);
  const DevicePtr ptr = AllocateHolding(bytes);
  HostMirror mirror = Mirror();
  mirror.Add(ptr, bytes.size(), /*read=*/true);
  ASSERT_TRUE(mirror.Fetch().ok());
  EXPECT_EQ(std::memcmp(mirror.Address(ptr), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(mirror.bytes_fetched(), bytes.size());
  EXPECT_EQ(mirror.bytes_written_back(), 0u);
}

TEST_P(HostMirrorTest, FetchIsOrderedAfterEarlierWorkOnItsStream) {
  // Written on the op's stream and not waited for: Fetch's copies follow it.
  const std::vector<char> bytes = Pattern(256 << 10, 9);
  const DevicePtr ptr = Allocate(bytes.size());
  ASSERT_TRUE(runtime_->CopyHostToDevice(kDevice, stream_, ptr, bytes.data(), bytes.size()).ok());
  HostMirror mirror = Mirror();
  mirror.Add(ptr, bytes.size(), /*read=*/true);
  ASSERT_TRUE(mirror.Fetch().ok());
  EXPECT_EQ(std::memcmp(mirror.Address(ptr), bytes.data(), bytes.size()), 0);
}

TEST_P(HostMirrorTest, OverlappingRangesShareOneHostCopy) {
  // An in-place op whose output is a view of its input.
  const std::vector<char> bytes = Pattern(4096, 5);
  const DevicePtr ptr = AllocateHolding(bytes);
  HostMirror mirror = Mirror();
  mirror.Add(ptr, 2048, /*read=*/true);
  mirror.Add(ptr + 1024, 2048, /*read=*/true);
  ASSERT_TRUE(mirror.Fetch().ok());
  EXPECT_EQ(mirror.Address(ptr + 1024), mirror.Address(ptr) + 1024);
  EXPECT_EQ(mirror.Address(ptr + 3000), mirror.Address(ptr) + 3000);
  EXPECT_EQ(mirror.bytes_fetched(), 3072u);  // once, not 4096
  // A write through the view is seen through the base.
  mirror.Address(ptr + 1500)[0] = 'V';
  EXPECT_EQ(mirror.Address(ptr)[1500], 'V');
}

TEST_P(HostMirrorTest, HostCopiesKeepTheDeviceAddressesAlignment) {
  const std::vector<char> bytes = Pattern(4096, 1);
  const DevicePtr ptr = AllocateHolding(bytes);
  ASSERT_EQ(ptr % HostMirror::kAlignment, 0u);
  HostMirror mirror = Mirror();
  // An argument starting 100 bytes in: its range widens down to the 64-byte
  // boundary, so the host copy sits at the same offset from one.
  mirror.Add(ptr + 100, 900, /*read=*/true);
  ASSERT_TRUE(mirror.Fetch().ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mirror.Address(ptr + 100)) % HostMirror::kAlignment,
            100 % HostMirror::kAlignment);
  EXPECT_EQ(std::memcmp(mirror.Address(ptr + 100), bytes.data() + 100, 900), 0);
  EXPECT_EQ(mirror.bytes_fetched(), 1000u - 64u);  // [64, 1000)
}

TEST_P(HostMirrorTest, ARangeOnlyWrittenIsNotFetched) {
  const DevicePtr ptr = Allocate(4096);
  HostMirror mirror = Mirror();
  mirror.Add(ptr, 4096, /*read=*/false);
  ASSERT_TRUE(mirror.Fetch().ok());
  EXPECT_EQ(mirror.bytes_fetched(), 0u);
}

TEST_P(HostMirrorTest, WriteBackCopiesTheMarkedRangesToTheDevice) {
  const std::vector<char> before = Pattern(4096, 11);
  const DevicePtr ptr = AllocateHolding(before);
  const std::vector<char> result = Pattern(1024, 99);
  {
    HostMirror mirror = Mirror();
    mirror.Add(ptr, 4096, /*read=*/true);
    ASSERT_TRUE(mirror.Fetch().ok());
    std::memcpy(mirror.Address(ptr + 1024), result.data(), result.size());
    mirror.MarkWritten(ptr + 1024, result.size());
    ASSERT_TRUE(mirror.WriteBack().ok());
    EXPECT_EQ(mirror.bytes_written_back(), 1024u);
  }
  std::vector<char> expected = before;
  std::memcpy(expected.data() + 1024, result.data(), result.size());
  EXPECT_EQ(DeviceBytes(ptr, 4096), expected);
}

TEST_P(HostMirrorTest, WithoutASnapshotUnmarkedChangesStayOnTheHost) {
  const std::vector<char> before = Pattern(4096, 12);
  const DevicePtr ptr = AllocateHolding(before);
  {
    HostMirror mirror = Mirror();
    mirror.Add(ptr, 4096, /*read=*/true);
    ASSERT_TRUE(mirror.Fetch().ok());
    mirror.Address(ptr)[10] ^= 0x55;
    ASSERT_TRUE(mirror.WriteBack().ok());
    EXPECT_EQ(mirror.bytes_written_back(), 0u);
  }
  EXPECT_EQ(DeviceBytes(ptr, 4096), before);
}

TEST_P(HostMirrorTest, ASnapshotFindsBytesAKernelChangedWithoutSayingSo) {
  // native_batch_norm updates running_mean in place, unannotated.
  const std::vector<char> before = Pattern(4096, 13);
  const DevicePtr ptr = AllocateHolding(before);
  std::vector<char> expected = before;
  {
    HostMirror mirror = Mirror();
    mirror.Add(ptr, 4096, /*read=*/true);
    ASSERT_TRUE(mirror.Fetch().ok());
    mirror.Snapshot();
    mirror.Address(ptr)[300] ^= 0x5a;
    mirror.Address(ptr)[700] ^= 0x5a;
    expected[300] ^= 0x5a;
    expected[700] ^= 0x5a;
    ASSERT_TRUE(mirror.WriteBack().ok());
    // From the first changed byte to the last, both included.
    EXPECT_EQ(mirror.bytes_written_back(), 401u);
  }
  EXPECT_EQ(DeviceBytes(ptr, 4096), expected);
}

TEST_P(HostMirrorTest, ASnapshotOfUnchangedBytesWritesNothingBack) {
  const std::vector<char> before = Pattern(4096, 14);
  const DevicePtr ptr = AllocateHolding(before);
  HostMirror mirror = Mirror();
  mirror.Add(ptr, 4096, /*read=*/true);
  ASSERT_TRUE(mirror.Fetch().ok());
  mirror.Snapshot();
  ASSERT_TRUE(mirror.WriteBack().ok());
  EXPECT_EQ(mirror.bytes_written_back(), 0u);
}

TEST_P(HostMirrorTest, OverlappingWrittenRangesGoBackOnce) {
  const std::vector<char> before = Pattern(4096, 15);
  const DevicePtr ptr = AllocateHolding(before);
  std::vector<char> expected = before;
  {
    HostMirror mirror = Mirror();
    mirror.Add(ptr, 4096, /*read=*/true);
    ASSERT_TRUE(mirror.Fetch().ok());
    for (int i = 256; i < 1024; ++i) {
      mirror.Address(ptr)[i] = 'w';
      expected[i] = 'w';
    }
    mirror.MarkWritten(ptr + 256, 512);
    mirror.MarkWritten(ptr + 512, 512);
    ASSERT_TRUE(mirror.WriteBack().ok());
    EXPECT_EQ(mirror.bytes_written_back(), 768u);
  }
  EXPECT_EQ(DeviceBytes(ptr, 4096), expected);
}

TEST_P(HostMirrorTest, WrittenBytesReachTheDeviceAfterTheMirrorIsGone) {
  // The host buffer is a mapping of its own, unmapped when freed (glibc
  // would otherwise raise its threshold after the first such free), and
  // nothing is mapped after it: released before the device's copy ran, the
  // copy would fault. (Under ASan or TSan, whose allocators ignore mallopt,
  // the sanitizer reports that use after free instead.)
  constexpr uint64_t kBytes = 8 << 20;
  (void)mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const DevicePtr ptr = Allocate(kBytes);
  const std::vector<char> result = Pattern(kBytes, 21);
  std::vector<char> read_back(kBytes);
  {
    HostMirror mirror = Mirror();
    mirror.Add(ptr, kBytes, /*read=*/false);
    ASSERT_TRUE(mirror.Fetch().ok());
    std::memcpy(mirror.Address(ptr), result.data(), kBytes);
    mirror.MarkWritten(ptr, kBytes);
    ASSERT_TRUE(mirror.WriteBack().ok());
    EXPECT_EQ(mirror.bytes_written_back(), kBytes);
  }
  // Ordered after the write-back on the same stream, with no wait between.
  ASSERT_TRUE(
      runtime_->CopyDeviceToHost(kDevice, stream_, read_back.data(), ptr, kBytes).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(kDevice, stream_).ok());
  EXPECT_EQ(read_back, result);
}

TEST_P(HostMirrorTest, AWrittenRangeThatWasNeverAddedIsAnInternalError) {
  const std::vector<char> before = Pattern(4096, 16);
  const DevicePtr ptr = AllocateHolding(before);
  HostMirror mirror = Mirror();
  mirror.Add(ptr, 1024, /*read=*/true);
  ASSERT_TRUE(mirror.Fetch().ok());
  mirror.MarkWritten(ptr + 2048, 64);
  const absl::Status status = mirror.WriteBack();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(status.message(), "was not mirrored")) << status;
  EXPECT_EQ(mirror.bytes_written_back(), 0u);
  EXPECT_EQ(DeviceBytes(ptr, 4096), before);
}

TEST_P(HostMirrorTest, FetchReturnsTheRuntimesErrorForAStreamThatDoesNotExist) {
  const std::vector<char> bytes = Pattern(4096, 17);
  const DevicePtr ptr = AllocateHolding(bytes);
  const StreamHandle destroyed = [&] {
    absl::StatusOr<StreamHandle> stream = runtime_->CreateStream(kDevice);
    EXPECT_TRUE(stream.ok()) << stream.status();
    EXPECT_TRUE(runtime_->DestroyStream(kDevice, *stream).ok());
    return *stream;
  }();
  HostMirror mirror(*runtime_, kDevice, destroyed);
  mirror.Add(ptr, 4096, /*read=*/true);
  const absl::Status status = mirror.Fetch();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(mirror.bytes_fetched(), 0u);
}

// A device that completes the fallback op's copies only once another job
// of the same one-worker pool has run: its stream synchronisation waits for
// `released`. If the waiting fallback op held the pool's only worker, the
// other job could never run (and this test would time out, failing).
class GatedRuntime : public DelegatingRuntime {
 public:
  using DelegatingRuntime::DelegatingRuntime;
  absl::Status SynchronizeStream(int device, StreamHandle stream) override {
    if (!released.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      return absl::DeadlineExceededError("the other job never ran");
    }
    return inner().SynchronizeStream(device, stream);
  }
  absl::Notification released;
};

TEST(HostMirrorWorkerTest, AFetchWaitingForTheDeviceLeavesThePoolToOtherStreams) {
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> cpu = Cpu().create();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  GatedRuntime runtime(*std::move(cpu));
  absl::StatusOr<DevicePtr> ptr = runtime.Malloc(0, 4096);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  absl::Status fetched = absl::UnknownError("not run");
  absl::Notification fetch_done;
  {
    WorkerPool pool("test", /*workers=*/1);
    pool.Schedule([&] {
      HostMirror mirror(runtime, 0, /*stream=*/0);
      mirror.Add(*ptr, 4096, /*read=*/true);
      fetched = mirror.Fetch();
      fetch_done.Notify();
    });
    // The fallback op's job holds the only worker; this one runs beside it.
    pool.Schedule([&] { runtime.released.Notify(); });
    EXPECT_TRUE(fetch_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  }
  EXPECT_TRUE(fetched.ok()) << fetched;
  EXPECT_TRUE(runtime.Free(0, *ptr).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, HostMirrorTest, ::testing::ValuesIn(Runtimes()),
                         [](const ::testing::TestParamInfo<RuntimeKind>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace flagos::daemon
