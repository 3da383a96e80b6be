// The kunlunxin backend's own behaviour, against the fake libxpurt
// (tests/fakes/xpurt): loading and its errors, vendor error codes, and the
// emulations (memset, stream query, host functions) under a device whose
// work completes late. The fake reads FAKE_XPU_* once, when it is loaded, so
// every test runs in a child process of its own (a death test in the
// "threadsafe" style: a fresh exec of this binary) that sets its environment
// first and exits 0 when every check held; its stderr says what did not.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kunlunxin_runtime.h"
#include "xpurt_symbols.h"

namespace flagos {
namespace {

constexpr char kFakeXpurt[] = FLAGOS_FAKE_XPU_ROOT "/so/libxpurt.so.2";
constexpr char kFakeXpuml[] = FLAGOS_FAKE_XPU_ROOT "/so/libxpuml.so.1";
constexpr uint64_t kFakeMemory = 64ull << 20;

// What a child found wrong; empty when every check held.
class Failures {
 public:
  bool Expect(bool condition, absl::string_view what) {
    if (!condition) absl::StrAppend(&text_, "  ", what, "\n");
    return condition;
  }
  bool ExpectOk(const absl::Status& status, absl::string_view what) {
    return Expect(status.ok(), absl::StrCat(what, ": ", status.ToString()));
  }
  // `status` has `code` and a message containing every one of `parts`.
  bool ExpectError(const absl::Status& status, absl::StatusCode code,
                   std::initializer_list<absl::string_view> parts) {
    bool ok = Expect(status.code() == code,
                     absl::StrCat("expected ", absl::StatusCodeToString(code), ", got ",
                                  status.ToString()));
    for (absl::string_view part : parts) {
      ok &= Expect(absl::StrContains(status.message(), part),
                   absl::StrCat("message lacks '", part, "': ", status.message()));
    }
    return ok;
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// Runs `body` and exits the (child) process: 0 when it found nothing wrong.
[[noreturn]] void RunChild(const std::function<void(Failures&)>& body) {
  Failures failures;
  body(failures);
  if (!failures.text().empty()) std::fprintf(stderr, "checks failed:\n%s", failures.text().c_str());
  std::fflush(stderr);
  std::_Exit(failures.text().empty() ? 0 : 1);
}

#define EXPECT_CHILD_PASSES(...) \
  EXPECT_EXIT(RunChild(__VA_ARGS__), ::testing::ExitedWithCode(0), "")

// The fake as FLAGOS_KUNLUNXIN_XPURT, with these FAKE_XPU_* values; the SDK
// search variables cleared.
void UseFake(const std::string& delay_us = "200", const std::string& fail = "",
             const std::string& devices = "2") {
  setenv("FLAGOS_KUNLUNXIN_XPURT", kFakeXpurt, 1);
  unsetenv("XPU_ROOT");
  unsetenv("FLAGOS_KUNLUNXIN_XDNN_LIB_DIR");
  unsetenv("XPU_VISIBLE_DEVICES");
  setenv("FAKE_XPU_MEMORY", absl::StrCat(kFakeMemory).c_str(), 1);
  setenv("FAKE_XPU_DELAY_US", delay_us.c_str(), 1);
  setenv("FAKE_XPU_DEVICES", devices.c_str(), 1);
  if (fail.empty()) {
    unsetenv("FAKE_XPU_FAIL");
  } else {
    setenv("FAKE_XPU_FAIL", fail.c_str(), 1);
  }
  unsetenv("FAKE_XPU_LIE");
  unsetenv("FAKE_XPUML_TEMPERATURE");
  unsetenv("FAKE_XPUML_POWER_MW");
  unsetenv("FAKE_XPUML_UTILIZATION");
  unsetenv("FAKE_XPUML_NO_TELEMETRY");
}

std::unique_ptr<DeviceRuntime> MustCreate(Failures& f, const KunlunxinRuntimeParams& params = {}) {
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = CreateKunlunxinRuntime(params);
  if (!f.ExpectOk(runtime.status(), "CreateKunlunxinRuntime")) return nullptr;
  return *std::move(runtime);
}

std::string TempDir() {
  char pattern[] = "/tmp/flagos-kunlunxin-XXXXXX";
  const char* dir = mkdtemp(pattern);
  return dir == nullptr ? std::string("/tmp") : std::string(dir);
}

// The fake's introspection (fake_xpurt.h), reached through the global scope
// libxpurt was loaded into.
template <typename Fn>
Fn FakeProbe(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 13 + (i >> 9));
  return bytes;
}

// ------------------------------------------------------------------ loading

TEST(KunlunxinLoadingTest, MissingRuntimeNamesWhereItLookedAndWhatToSet) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    const std::string root = TempDir();
    unsetenv("FLAGOS_KUNLUNXIN_XPURT");
    unsetenv("FLAGOS_KUNLUNXIN_XDNN_LIB_DIR");
    setenv("XPU_ROOT", root.c_str(), 1);
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = CreateKunlunxinRuntime({});
    f.ExpectError(runtime.status(), absl::StatusCode::kFailedPrecondition,
                  {"libxpurt (the Kunlun XPU runtime) was not found", root + "/so",
                   root + "/lib", root + "/xcudart/lib", "/usr/local/xpu/so", "loader path",
                   "libxpurt.so.2", "XPU_ROOT", "FLAGOS_KUNLUNXIN_XPURT",
                   "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR", "docs/vendors/kunlunxin/installation.md"});
  });
}

TEST(KunlunxinLoadingTest, NamedRuntimeThatDoesNotExistIsReported) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("FLAGOS_KUNLUNXIN_XPURT", "/nonexistent/libxpurt.so.2", 1);
    f.ExpectError(CreateKunlunxinRuntime({}).status(), absl::StatusCode::kFailedPrecondition,
                  {"FLAGOS_KUNLUNXIN_XPURT", "/nonexistent/libxpurt.so.2", "does not exist"});
  });
}

TEST(KunlunxinLoadingTest, RelativeRuntimePathIsInvalid) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("FLAGOS_KUNLUNXIN_XPURT", "libxpurt.so.2", 1);
    f.ExpectError(CreateKunlunxinRuntime({}).status(), absl::StatusCode::kInvalidArgument,
                  {"FLAGOS_KUNLUNXIN_XPURT", "absolute"});
  });
}

TEST(KunlunxinLoadingTest, LibraryWithoutTheRuntimeFunctionsIsRefused) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("FLAGOS_KUNLUNXIN_XPURT", kFakeXpuml, 1);
    f.ExpectError(CreateKunlunxinRuntime({}).status(), absl::StatusCode::kFailedPrecondition,
                  {kFakeXpuml, "xpu_device_count", "xpu_event_query", "required"});
  });
}

TEST(KunlunxinLoadingTest, XpuRootFindsTheRuntimeInItsSoDirectory) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    unsetenv("FLAGOS_KUNLUNXIN_XPURT");
    setenv("XPU_ROOT", FLAGOS_FAKE_XPU_ROOT, 1);
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.Expect(runtime->DeviceCount() == 2, "two devices");
    // libxpuml sits beside it and answers for the same devices.
    f.Expect(absl::StrContains(runtime->capabilities().Note(Slot::kMemoryInfo), "libxpuml"),
             runtime->capabilities().Note(Slot::kMemoryInfo));
  });
}

TEST(KunlunxinLoadingTest, MissingXdnnLibraryIsNamedWithItsDirectory) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    const std::string dir = TempDir();
    setenv("FLAGOS_KUNLUNXIN_XDNN_LIB_DIR", dir.c_str(), 1);
    f.ExpectError(CreateKunlunxinRuntime({}).status(), absl::StatusCode::kFailedPrecondition,
                  {"libxpu_blas.so", dir, "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR", "torch_xmlir"});
  });
}

TEST(KunlunxinLoadingTest, NoDevicesIsAFailedPrecondition) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("200", "", "0");
    f.ExpectError(CreateKunlunxinRuntime({}).status(), absl::StatusCode::kFailedPrecondition,
                  {"reports no devices", kFakeXpurt, "/dev/xpu"});
  });
}

// ---------------------------------------------------------------- device

TEST(KunlunxinDeviceTest, PropertiesDescribeEachDevice) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("200", "", "3");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.Expect(runtime->DeviceCount() == 3, "three devices");
    for (int d = 0; d < 3; ++d) {
      absl::StatusOr<DeviceProperties> p = runtime->GetDeviceProperties(d);
      if (!f.ExpectOk(p.status(), "GetDeviceProperties")) continue;
      f.Expect(p->name == absl::StrCat("Kunlun P800 (kunlunxin device ", d, ")"), p->name);
      f.Expect(p->total_memory == kFakeMemory, absl::StrCat("total ", p->total_memory));
    }
    f.ExpectError(runtime->GetDeviceProperties(3).status(), absl::StatusCode::kInvalidArgument,
                  {"device 3 does not exist"});
  });
}

TEST(KunlunxinDeviceTest, TheSlotTableDeclaresEverySlot) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    const CapabilityTable& table = runtime->capabilities();
    f.Expect(kSlotCount == 35, "35 slots");
    for (int i = 0; i < kSlotCount; ++i) {
      const Slot slot = static_cast<Slot>(i);
      f.Expect(table.Declared(slot), absl::StrCat(SlotName(slot), " is not declared"));
      f.Expect(!table.Note(slot).empty(), absl::StrCat(SlotName(slot), " has no note"));
    }
    f.Expect(table.status(Slot::kMemset) == SlotStatus::kEmulated, "memset is emulated");
    f.Expect(table.status(Slot::kStreamQuery) == SlotStatus::kEmulated, "stream query emulated");
    f.Expect(table.status(Slot::kLaunchHostFunc) == SlotStatus::kEmulated, "host func emulated");
    f.Expect(table.status(Slot::kStreamDrain) == SlotStatus::kEmulated, "stream drain emulated");
    f.Expect(table.status(Slot::kEventElapsedTime) == SlotStatus::kGap, "elapsed time is a gap");
    f.Expect(table.status(Slot::kHostAddress) == SlotStatus::kGap, "host address is a gap");
    f.Expect(table.status(Slot::kHostRegister) == SlotStatus::kImplemented,
             "host register is implemented (the fake exports it)");
    f.Expect(table.status(Slot::kDeviceTelemetry) == SlotStatus::kImplemented,
             "device telemetry is implemented (the fake libxpuml has the calls)");
  });
}

TEST(KunlunxinDeviceTest, ASecondRuntimeDoesNotMakeTheCurrentDeviceStale) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> a = MustCreate(f);
    std::unique_ptr<DeviceRuntime> b = MustCreate(f);
    if (a == nullptr || b == nullptr) return;
    absl::StatusOr<StreamHandle> stream = a->CreateStream(1);
    absl::StatusOr<DevicePtr> ptr = a->Malloc(1, 4096);
    if (!f.ExpectOk(stream.status(), "CreateStream") || !f.ExpectOk(ptr.status(), "Malloc")) return;
    // b moves this thread's vendor device to 0; a must set 1 again (the
    // fake refuses work on device 1's stream while device 0 is current).
    absl::StatusOr<DevicePtr> other = b->Malloc(0, 4096);
    f.ExpectOk(other.status(), "Malloc on the second runtime");
    const std::vector<uint8_t> in = Pattern(4096, 3);
    f.ExpectOk(a->CopyHostToDevice(1, *stream, *ptr, in.data(), in.size()), "copy after b ran");
    std::vector<uint8_t> out(4096);
    f.ExpectOk(a->CopyDeviceToHost(1, *stream, out.data(), *ptr, out.size()), "read back");
    f.ExpectOk(a->SynchronizeStream(1, *stream), "sync");
    f.Expect(out == in, "bytes round-trip");
    f.ExpectOk(a->Free(1, *ptr), "free");
    if (other.ok()) f.ExpectOk(b->Free(0, *other), "free on b");
    f.ExpectOk(a->DestroyStream(1, *stream), "destroy");
  });
}

TEST(KunlunxinDeviceTest, ManyThreadsOnBothDevicesAtOnce) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("500");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    constexpr int kThreads = 8;
    absl::Mutex mu;
    Failures shared;  // guarded by mu
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Failures local;
        for (int round = 0; round < 6; ++round) {
          // Each thread alternates devices, so its vendor current device
          // moves between every call.
          const int device = (t + round) % 2;
          absl::StatusOr<StreamHandle> stream = runtime->CreateStream(device);
          absl::StatusOr<DevicePtr> ptr = runtime->Malloc(device, 64 << 10);
          if (!local.ExpectOk(stream.status(), "CreateStream") ||
              !local.ExpectOk(ptr.status(), "Malloc")) {
            break;
          }
          const std::vector<uint8_t> in = Pattern(64 << 10, static_cast<uint8_t>(t * 7 + round));
          std::vector<uint8_t> out(in.size(), 0);
          std::atomic<bool> ran{false};
          local.ExpectOk(runtime->CopyHostToDevice(device, *stream, *ptr, in.data(), in.size()),
                         "upload");
          local.ExpectOk(runtime->Memset(device, *stream, *ptr, 0x11, 100), "memset");
          local.ExpectOk(runtime->CopyDeviceToHost(device, *stream, out.data(), *ptr, out.size()),
                         "download");
          local.ExpectOk(
              runtime->LaunchHostFunc(device, *stream, [&](absl::Status) { ran.store(true); }),
              "LaunchHostFunc");
          (void)runtime->QueryStream(device, *stream);
          local.ExpectOk(runtime->DestroyStream(device, *stream), "DestroyStream");
          std::vector<uint8_t> expected = in;
          std::fill(expected.begin(), expected.begin() + 100, 0x11);
          local.Expect(out == expected, "round trip");
          local.Expect(ran.load(), "host function ran before DestroyStream returned");
          local.ExpectOk(runtime->Free(device, *ptr), "Free");
        }
        absl::MutexLock lock(&mu);
        shared.Expect(local.text().empty(), absl::StrCat("thread ", t, ":\n", local.text()));
      });
    }
    for (std::thread& thread : threads) thread.join();
    absl::MutexLock lock(&mu);
    f.Expect(shared.text().empty(), shared.text());
  });
}

TEST(KunlunxinDeviceTest, AFailedSetDeviceIsReportedAndRetried) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    // Creation sets each of the two devices once; the third call is the
    // first Malloc's.
    UseFake("200", "xpu_set_device:3:-701");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DevicePtr> failed = runtime->Malloc(0, 64);
    f.ExpectError(failed.status(), absl::StatusCode::kInvalidArgument,
                  {"xpu_set_device", "701", "XPUERR_INVALID_DEVICE"});
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 64);
    if (f.ExpectOk(ptr.status(), "Malloc after the failure")) {
      f.ExpectOk(runtime->Free(0, *ptr), "Free");
    }
  });
}

// ---------------------------------------------------------------- memory

TEST(KunlunxinMemoryTest, OutOfDeviceMemoryIsResourceExhaustedWithWhatToDo) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("200", "xpu_malloc:0:-705");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.ExpectError(runtime->Malloc(0, 4096).status(), absl::StatusCode::kResourceExhausted,
                  {"705", "XPUERR_NOMEM", "xpu_malloc", "empty_cache", "kunlunxin device 0"});
  });
}

TEST(KunlunxinMemoryTest, FreeOfAnUnknownPointerIsNotFound) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 4096);
    if (!f.ExpectOk(ptr.status(), "Malloc")) return;
    f.ExpectError(runtime->Free(1, *ptr), absl::StatusCode::kNotFound, {"not the start"});
    f.ExpectOk(runtime->Free(0, *ptr), "Free");
    f.ExpectError(runtime->Free(0, *ptr), absl::StatusCode::kNotFound, {"freed twice"});
    f.ExpectError(runtime->Malloc(0, 0).status(), absl::StatusCode::kInvalidArgument, {"0 bytes"});
  });
}

TEST(KunlunxinMemoryTest, MemoryInfoCountsOwnAllocationsWithoutLibxpuml) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("XPU_VISIBLE_DEVICES", "0,1", 1);  // libxpuml's indices are then not trusted
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.Expect(absl::StrContains(runtime->capabilities().Note(Slot::kMemoryInfo),
                               "counts only flagosd's own allocations"),
             runtime->capabilities().Note(Slot::kMemoryInfo));
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(1, 1 << 20);
    if (!f.ExpectOk(ptr.status(), "Malloc")) return;
    absl::StatusOr<MemoryInfo> info = runtime->GetMemoryInfo(1);
    if (f.ExpectOk(info.status(), "GetMemoryInfo")) {
      f.Expect(info->total_bytes == kFakeMemory, "total");
      f.Expect(info->free_bytes == kFakeMemory - (1 << 20),
               absl::StrCat("free ", info->free_bytes));
    }
    f.ExpectOk(runtime->Free(1, *ptr), "Free");
  });
}

TEST(KunlunxinMemoryTest, AbnormalDeviceIsInternalNamingTheCode) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("200", "xpu_memcpy_async:0:-713");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 4096);
    if (!f.ExpectOk(ptr.status(), "Malloc")) return;
    const std::vector<uint8_t> in(4096, 1);
    f.ExpectError(runtime->CopyHostToDevice(0, 0, *ptr, in.data(), in.size()),
                  absl::StatusCode::kInternal,
                  {"713", "XPUERR_ABNORMAL", "abnormal", "xpu_memcpy_async", "dmesg"});
    f.ExpectOk(runtime->Free(0, *ptr), "Free");
  });
}

TEST(KunlunxinMemoryTest, MemsetWritesTheValueThroughEveryChunk) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("20000");
    KunlunxinRuntimeParams params;
    params.memset_chunk_bytes = 4096;  // several chunks from one buffer
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f, params);
    if (runtime == nullptr) return;
    const uint64_t size = 3 * 4096 + 200;
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, size);
    absl::StatusOr<StreamHandle> stream = runtime->CreateStream(0);
    if (!f.ExpectOk(ptr.status(), "Malloc") || !f.ExpectOk(stream.status(), "CreateStream")) return;
    const std::vector<uint8_t> zeros(size, 0);
    f.ExpectOk(runtime->CopyHostToDevice(0, *stream, *ptr, zeros.data(), size), "zero");
    f.ExpectOk(runtime->Memset(0, *stream, *ptr + 10, 0x5a, 3 * 4096 + 7), "memset");
    std::vector<uint8_t> out(size, 0xee);
    f.ExpectOk(runtime->CopyDeviceToHost(0, *stream, out.data(), *ptr, size), "read back");
    f.ExpectOk(runtime->SynchronizeStream(0, *stream), "sync");
    for (uint64_t i = 0; i < size; ++i) {
      const uint8_t expected = (i >= 10 && i < 10 + 3 * 4096 + 7) ? 0x5a : 0;
      if (!f.Expect(out[i] == expected, absl::StrCat("byte ", i, " is ", out[i]))) break;
    }
    f.ExpectOk(runtime->DestroyStream(0, *stream), "DestroyStream");
    f.ExpectOk(runtime->Free(0, *ptr), "Free");
  });
}

TEST(KunlunxinMemoryTest, LargeMemsetOnTheDefaultStreamWritesEveryByte) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("20000");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    const uint64_t size = (40ull << 20) + 3;  // three 16 MiB chunks, the last one short
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(1, size);
    if (!f.ExpectOk(ptr.status(), "Malloc")) return;
    f.ExpectOk(runtime->Memset(1, 0, *ptr, 0xc3, size), "memset");
    std::vector<uint8_t> out(size, 0);
    f.ExpectOk(runtime->CopyDeviceToHost(1, 0, out.data(), *ptr, size), "read back");
    f.ExpectOk(runtime->SynchronizeDevice(1), "sync");
    uint64_t wrong = 0;
    for (uint8_t byte : out) wrong += byte != 0xc3;
    f.Expect(wrong == 0, absl::StrCat(wrong, " bytes were not set"));
    f.ExpectOk(runtime->Free(1, *ptr), "Free");
  });
}

// ---------------------------------------------------------------- streams

TEST(KunlunxinStreamTest, QueryIsFalseWhileWorkIsPendingAndTrueAfterSync) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("50000");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 1 << 20);
    absl::StatusOr<StreamHandle> stream = runtime->CreateStream(0);
    absl::StatusOr<EventHandle> event = runtime->CreateEvent(0, false);
    if (!f.ExpectOk(ptr.status(), "Malloc") || !f.ExpectOk(stream.status(), "CreateStream") ||
        !f.ExpectOk(event.status(), "CreateEvent")) {
      return;
    }
    absl::StatusOr<bool> idle = runtime->QueryStream(0, *stream);
    f.Expect(idle.ok() && *idle, "a new stream is idle");
    const std::vector<uint8_t> in = Pattern(1 << 20, 1);
    f.ExpectOk(runtime->CopyHostToDevice(0, *stream, *ptr, in.data(), in.size()), "copy");
    f.ExpectOk(runtime->RecordEvent(0, *event, *stream), "record");
    absl::StatusOr<bool> pending = runtime->QueryStream(0, *stream);
    f.Expect(pending.ok() && !*pending, "stream query is false while the copy is pending");
    absl::StatusOr<bool> event_pending = runtime->QueryEvent(0, *event);
    f.Expect(event_pending.ok() && !*event_pending, "event query is false while pending");
    f.ExpectOk(runtime->SynchronizeStream(0, *stream), "sync");
    absl::StatusOr<bool> done = runtime->QueryStream(0, *stream);
    f.Expect(done.ok() && *done, "stream query is true after sync");
    absl::StatusOr<bool> event_done = runtime->QueryEvent(0, *event);
    f.Expect(event_done.ok() && *event_done, "event query is true after sync");
    f.ExpectOk(runtime->DestroyEvent(0, *event), "DestroyEvent");
    f.ExpectOk(runtime->DestroyStream(0, *stream), "DestroyStream");
    f.ExpectOk(runtime->Free(0, *ptr), "Free");
  });
}

TEST(KunlunxinStreamTest, StreamsBeyondTheVendorLimitAreResourceExhausted) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    std::vector<std::pair<int, StreamHandle>> streams;
    for (int i = 0; i < 256; ++i) {
      absl::StatusOr<StreamHandle> s = runtime->CreateStream(i % 2);
      if (!f.ExpectOk(s.status(), absl::StrCat("stream ", i))) break;
      streams.emplace_back(i % 2, *s);
    }
    f.ExpectError(runtime->CreateStream(0).status(), absl::StatusCode::kResourceExhausted,
                  {"256", "streams"});
    for (const auto& [device, s] : streams) {
      f.ExpectOk(runtime->DestroyStream(device, s), "destroy");
    }
    absl::StatusOr<StreamHandle> again = runtime->CreateStream(0);
    if (f.ExpectOk(again.status(), "a stream after destroying")) {
      f.ExpectOk(runtime->DestroyStream(0, *again), "destroy");
    }
    auto live = FakeProbe<int (*)()>("fake_xpu_live_streams");
    if (f.Expect(live != nullptr, "fake_xpu_live_streams")) {
      f.Expect(live() == 0, "no live streams");
    }
  });
}

TEST(KunlunxinStreamTest, CrossDeviceCopyWaitsForTheStreamFirst) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("20000");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DevicePtr> src = runtime->Malloc(0, 8192);
    absl::StatusOr<DevicePtr> dst = runtime->Malloc(1, 8192);
    absl::StatusOr<StreamHandle> stream = runtime->CreateStream(1);
    if (!f.ExpectOk(src.status(), "Malloc") || !f.ExpectOk(dst.status(), "Malloc") ||
        !f.ExpectOk(stream.status(), "CreateStream")) {
      return;
    }
    const std::vector<uint8_t> in = Pattern(8192, 5);
    const std::vector<uint8_t> zeros(8192, 0);
    f.ExpectOk(runtime->CopyHostToDevice(0, 0, *src, in.data(), in.size()), "fill source");
    f.ExpectOk(runtime->SynchronizeStream(0, 0), "sync source");
    // Pending on the destination stream: the peer copy must come after it.
    f.ExpectOk(runtime->CopyHostToDevice(1, *stream, *dst, zeros.data(), zeros.size()), "zero");
    f.ExpectOk(runtime->CopyDeviceToDevice(1, *stream, *dst, 0, *src, 8192), "peer copy");
    std::vector<uint8_t> out(8192, 0xee);
    f.ExpectOk(runtime->CopyDeviceToHost(1, *stream, out.data(), *dst, out.size()), "read back");
    f.ExpectOk(runtime->SynchronizeStream(1, *stream), "sync");
    f.Expect(out == in, "the peer copy landed after the zeroing");
    f.ExpectOk(runtime->DestroyStream(1, *stream), "DestroyStream");
    f.ExpectOk(runtime->Free(0, *src), "Free");
    f.ExpectOk(runtime->Free(1, *dst), "Free");
  });
}

// ---------------------------------------------------------------- host functions

TEST(KunlunxinHostFuncTest, RunsAfterTheCopyHasLandedAndNotBefore) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("50000");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 1 << 20);
    absl::StatusOr<StreamHandle> stream = runtime->CreateStream(0);
    if (!f.ExpectOk(ptr.status(), "Malloc") || !f.ExpectOk(stream.status(), "CreateStream")) return;
    const std::vector<uint8_t> in = Pattern(1 << 20, 9);
    f.ExpectOk(runtime->CopyHostToDevice(0, *stream, *ptr, in.data(), in.size()), "upload");
    std::vector<uint8_t> out(in.size(), 0);
    f.ExpectOk(runtime->CopyDeviceToHost(0, *stream, out.data(), *ptr, out.size()), "download");
    absl::Notification ran;
    bool landed = false;
    absl::Status seen = absl::UnknownError("not run");
    f.ExpectOk(runtime->LaunchHostFunc(0, *stream,
                                       [&](absl::Status status) {
                                         landed = out == in;
                                         seen = status;
                                         ran.Notify();
                                       }),
               "LaunchHostFunc");
    f.Expect(!ran.HasBeenNotified(), "the function ran before the stream reached it");
    f.Expect(ran.WaitForNotificationWithTimeout(absl::Seconds(30)), "the function never ran");
    f.Expect(landed, "the downloaded bytes were not there when the function ran");
    f.ExpectOk(seen, "the function's status");
    f.ExpectOk(runtime->DestroyStream(0, *stream), "DestroyStream");
    f.ExpectOk(runtime->Free(0, *ptr), "Free");
  });
}

TEST(KunlunxinHostFuncTest, RunInIssueOrderAndMayCallBackIn) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("2000");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    DeviceRuntime* r = runtime.get();
    absl::StatusOr<StreamHandle> a = r->CreateStream(0);
    absl::StatusOr<StreamHandle> b = r->CreateStream(1);
    absl::StatusOr<DevicePtr> ptr = r->Malloc(0, 4096);
    if (!f.ExpectOk(a.status(), "CreateStream") || !f.ExpectOk(b.status(), "CreateStream") ||
        !f.ExpectOk(ptr.status(), "Malloc")) {
      return;
    }
    absl::Mutex mu;
    std::vector<int> order;
    absl::Status freed = absl::UnknownError("not run");
    absl::Status chained = absl::UnknownError("not run");
    absl::Notification done;
    for (int i = 0; i < 5; ++i) {
      f.ExpectOk(r->LaunchHostFunc(0, *a,
                                   [&, i](absl::Status) {
                                     absl::MutexLock lock(&mu);
                                     order.push_back(i);
                                   }),
                 "LaunchHostFunc");
    }
    // Calls back into the runtime: frees memory and issues on another stream.
    f.ExpectOk(r->LaunchHostFunc(0, *a,
                                 [&, r](absl::Status) {
                                   freed = r->Free(0, *ptr);
                                   chained = r->LaunchHostFunc(1, *b, [&](absl::Status) {
                                     done.Notify();
                                   });
                                 }),
               "LaunchHostFunc");
    f.Expect(done.WaitForNotificationWithTimeout(absl::Seconds(30)), "the chain never finished");
    {
      absl::MutexLock lock(&mu);
      f.Expect(order == std::vector<int>({0, 1, 2, 3, 4}), "host functions ran out of order");
    }
    f.ExpectOk(freed, "Free from a host function");
    f.ExpectOk(chained, "LaunchHostFunc from a host function");
    f.ExpectOk(r->DestroyStream(0, *a), "DestroyStream");
    f.ExpectOk(r->DestroyStream(1, *b), "DestroyStream");
  });
}

TEST(KunlunxinHostFuncTest, DestroyStreamRunsThePendingFunctionsFirst) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("20000");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<StreamHandle> stream = runtime->CreateStream(1);
    if (!f.ExpectOk(stream.status(), "CreateStream")) return;
    std::atomic<int> ran{0};
    for (int i = 0; i < 3; ++i) {
      f.ExpectOk(runtime->LaunchHostFunc(1, *stream, [&](absl::Status) { ran.fetch_add(1); }),
                 "LaunchHostFunc");
    }
    f.ExpectOk(runtime->DestroyStream(1, *stream), "DestroyStream");
    f.Expect(ran.load() == 3, absl::StrCat(ran.load(), " of 3 functions ran before DestroyStream "
                                           "returned"));
  });
}

TEST(KunlunxinHostFuncTest, DrainStreamFromItsOwnHostFuncIsRefused) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("200");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    DeviceRuntime* r = runtime.get();
    absl::StatusOr<StreamHandle> stream = r->CreateStream(0);
    if (!f.ExpectOk(stream.status(), "CreateStream")) return;
    absl::Status own = absl::UnknownError("not run");
    absl::Status other = absl::UnknownError("not run");
    absl::Notification ran;
    f.ExpectOk(r->LaunchHostFunc(0, *stream,
                                 [&, r](absl::Status) {
                                   // It would wait for itself; another stream is fine.
                                   own = r->DrainStream(0, *stream);
                                   other = r->DrainStream(0, 0);
                                   ran.Notify();
                                 }),
               "LaunchHostFunc");
    f.Expect(ran.WaitForNotificationWithTimeout(absl::Seconds(30)), "the function never ran");
    f.Expect(own.code() == absl::StatusCode::kFailedPrecondition,
             absl::StrCat("DrainStream from its own host function: ", own.ToString()));
    f.Expect(absl::StrContains(own.message(), "its own host functions"), own.ToString());
    f.ExpectOk(other, "DrainStream of another stream from a host function");
    f.ExpectOk(r->DrainStream(0, *stream), "DrainStream");
    f.ExpectOk(r->DestroyStream(0, *stream), "DestroyStream");
  });
}

TEST(KunlunxinHostFuncTest, AFailedWaitReachesTheFunction) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("200", "xpu_event_wait:0:-713");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::Notification ran;
    absl::Status seen;
    f.ExpectOk(runtime->LaunchHostFunc(0, 0,
                                       [&](absl::Status status) {
                                         seen = status;
                                         ran.Notify();
                                       }),
               "LaunchHostFunc");
    f.Expect(ran.WaitForNotificationWithTimeout(absl::Seconds(30)), "the function never ran");
    f.ExpectError(seen, absl::StatusCode::kInternal, {"713", "xpu_event_wait"});
  });
}

TEST(KunlunxinHostFuncTest, DestroyingTheRuntimeLeavesTheDeviceClean) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("20000");
    std::atomic<int> ran{0};
    {
      std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
      if (runtime == nullptr) return;
      absl::StatusOr<StreamHandle> stream = runtime->CreateStream(0);
      absl::StatusOr<DevicePtr> ptr = runtime->Malloc(0, 1 << 20);
      absl::StatusOr<EventHandle> event = runtime->CreateEvent(1, true);
      if (!f.ExpectOk(stream.status(), "CreateStream") || !f.ExpectOk(ptr.status(), "Malloc") ||
          !f.ExpectOk(event.status(), "CreateEvent")) {
        return;
      }
      f.ExpectOk(runtime->Memset(0, *stream, *ptr, 1, 1 << 20), "memset");
      f.ExpectOk(runtime->LaunchHostFunc(0, *stream, [&](absl::Status) { ran.fetch_add(1); }),
                 "LaunchHostFunc");
    }
    f.Expect(ran.load() == 1, "the pending host function ran before the runtime went away");
    auto streams = FakeProbe<int (*)()>("fake_xpu_live_streams");
    auto events = FakeProbe<int (*)()>("fake_xpu_live_events");
    auto used = FakeProbe<uint64_t (*)(int)>("fake_xpu_memory_used");
    if (!f.Expect(streams && events && used, "the fake's probes")) return;
    f.Expect(streams() == 0, absl::StrCat(streams(), " streams left"));
    f.Expect(events() == 0, absl::StrCat(events(), " events left"));
    f.Expect(used(0) == 0 && used(1) == 0, "device memory left allocated");
  });
}

// ---------------------------------------------------------------- telemetry

// FLAGOS_KUNLUNXIN_XPURT names a link to the fake libxpurt in a folder of its
// own, with `xpuml` linked beside it as libxpuml.so.1 (none when empty), so
// that the libxpuml found is that one or none at all.
void UseFakeXpurtBeside(Failures& f, const std::string& xpuml) {
  const std::string dir = TempDir();
  const std::string xpurt = dir + "/libxpurt.so.2";
  f.Expect(symlink(kFakeXpurt, xpurt.c_str()) == 0, "link the fake libxpurt");
  if (!xpuml.empty()) {
    f.Expect(symlink(xpuml.c_str(), (dir + "/libxpuml.so.1").c_str()) == 0, "link libxpuml");
  }
  setenv("FLAGOS_KUNLUNXIN_XPURT", xpurt.c_str(), 1);
}

// What the fake libxpuml the runtime loaded says of `device`'s memory.
bool XpumlMemoryOf(Failures& f, int device, XpumlMemory* memory) {
  void* xpuml = dlopen(kFakeXpuml, RTLD_NOW | RTLD_NOLOAD);
  if (!f.Expect(xpuml != nullptr, "the runtime loaded the fake libxpuml")) return false;
  auto handle_by_index =
      reinterpret_cast<int (*)(unsigned int, void**)>(dlsym(xpuml, "xpumlDeviceGetHandleByIndex"));
  auto memory_info =
      reinterpret_cast<int (*)(void*, XpumlMemory*)>(dlsym(xpuml, "xpumlDeviceGetMemoryInfo"));
  void* handle = nullptr;
  return f.Expect(handle_by_index != nullptr && memory_info != nullptr, "libxpuml's functions") &&
         f.Expect(handle_by_index(device, &handle) == 0, "xpumlDeviceGetHandleByIndex") &&
         f.Expect(memory_info(handle, memory) == 0, "xpumlDeviceGetMemoryInfo");
}

TEST(KunlunxinTelemetryTest, ReportsLibxpumlsFiguresAtTheFakesDefaults) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    const CapabilityTable& table = runtime->capabilities();
    f.Expect(table.status(Slot::kDeviceTelemetry) == SlotStatus::kImplemented,
             table.Note(Slot::kDeviceTelemetry));
    for (absl::string_view call : {"xpumlDeviceGetTemperature", "xpumlDeviceGetPowerUsage",
                                   "xpumlDeviceGetUtilizationRates", "xpumlDeviceGetMemoryInfo"}) {
      f.Expect(absl::StrContains(table.Note(Slot::kDeviceTelemetry), call),
               absl::StrCat("the note names ", call, ": ", table.Note(Slot::kDeviceTelemetry)));
    }
    absl::StatusOr<DevicePtr> ptr = runtime->Malloc(1, 1 << 20);
    if (!f.ExpectOk(ptr.status(), "Malloc")) return;
    absl::StatusOr<DeviceTelemetry> t = runtime->GetTelemetry(1);
    XpumlMemory memory{};
    if (f.ExpectOk(t.status(), "GetTelemetry") && XpumlMemoryOf(f, 1, &memory)) {
      f.Expect(t->temperature_celsius == 45.0, "temperature 45 degrees C");
      f.Expect(t->power_watts == 150.0, "power 150 W (150000 mW)");
      f.Expect(t->utilization == 0.0, "utilisation present and 0");
      f.Expect(t->memory_total_bytes == memory.global_total && memory.global_total == kFakeMemory,
               absl::StrCat("memory total ", t->memory_total_bytes.value_or(0)));
      f.Expect(t->memory_used_bytes == memory.global_used && memory.global_used >= (1u << 20),
               absl::StrCat("memory used ", t->memory_used_bytes.value_or(0), ", libxpuml says ",
                            memory.global_used));
    }
    f.ExpectOk(runtime->Free(1, *ptr), "Free");
  });
}

TEST(KunlunxinTelemetryTest, ReportsTheFiguresTheLibrarySets) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("FAKE_XPUML_TEMPERATURE", "71", 1);
    setenv("FAKE_XPUML_POWER_MW", "212500", 1);
    setenv("FAKE_XPUML_UTILIZATION", "37", 1);
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<DeviceTelemetry> t = runtime->GetTelemetry(0);
    if (!f.ExpectOk(t.status(), "GetTelemetry")) return;
    f.Expect(t->temperature_celsius == 71.0, "temperature 71 degrees C");
    f.Expect(t->power_watts == 212.5, "power 212.5 W (212500 mW)");
    f.Expect(t->utilization == 0.37, "utilisation 37% as the fraction 0.37");
  });
}

TEST(KunlunxinTelemetryTest, FiguresTheDeviceDoesNotReportAreAbsentAndMemoryStays) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("FAKE_XPUML_NO_TELEMETRY", "1", 1);  // the three calls return 3 (not supported)
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.Expect(runtime->capabilities().status(Slot::kDeviceTelemetry) == SlotStatus::kImplemented,
             "the calls exist: the slot is implemented");
    absl::StatusOr<DeviceTelemetry> t = runtime->GetTelemetry(0);
    XpumlMemory memory{};
    if (!f.ExpectOk(t.status(), "GetTelemetry") || !XpumlMemoryOf(f, 0, &memory)) return;
    f.Expect(!t->temperature_celsius.has_value(), "temperature absent");
    f.Expect(!t->power_watts.has_value(), "power absent");
    f.Expect(!t->utilization.has_value(), "utilisation absent");
    f.Expect(t->memory_total_bytes == memory.global_total, "memory total present");
    f.Expect(t->memory_used_bytes == memory.global_used, "memory used present");
  });
}

TEST(KunlunxinTelemetryTest, AnOlderLibxpumlWithoutTheCallsStillLoads) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    UseFakeXpurtBeside(f, FLAGOS_FAKE_OLD_XPUML);
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    const CapabilityTable& table = runtime->capabilities();
    f.Expect(absl::StrContains(table.Note(Slot::kMemoryInfo), "xpumlDeviceGetMemoryInfo"),
             absl::StrCat("memory info still from libxpuml: ", table.Note(Slot::kMemoryInfo)));
    f.Expect(table.status(Slot::kDeviceTelemetry) == SlotStatus::kImplemented,
             "telemetry implemented (memory figures)");
    for (absl::string_view call : {"does not export xpumlDeviceGetTemperature",
                                   "does not export xpumlDeviceGetPowerUsage",
                                   "does not export xpumlDeviceGetUtilizationRates"}) {
      f.Expect(absl::StrContains(table.Note(Slot::kDeviceTelemetry), call),
               absl::StrCat("the note says it ", call, ": ", table.Note(Slot::kDeviceTelemetry)));
    }
    absl::StatusOr<DeviceTelemetry> t = runtime->GetTelemetry(1);
    if (!f.ExpectOk(t.status(), "GetTelemetry")) return;
    f.Expect(!t->temperature_celsius && !t->power_watts && !t->utilization,
             "temperature, power and utilisation absent");
    f.Expect(t->memory_total_bytes == kFakeMemory, "memory total present");
    f.Expect(t->memory_used_bytes.has_value(), "memory used present");
  });
}

TEST(KunlunxinTelemetryTest, WithoutLibxpumlTheSlotIsAGapSayingWhy) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    UseFakeXpurtBeside(f, "");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    const CapabilityTable& table = runtime->capabilities();
    f.Expect(table.status(Slot::kDeviceTelemetry) == SlotStatus::kGap, "telemetry is a gap");
    f.Expect(absl::StrContains(table.GapReason(Slot::kDeviceTelemetry), "libxpuml not found"),
             table.GapReason(Slot::kDeviceTelemetry));
    f.ExpectError(runtime->GetTelemetry(0).status(), absl::StatusCode::kUnimplemented,
                  {"kunlunxin backend", "device_telemetry", "is not supported", "libxpuml"});
  });
}

TEST(KunlunxinTelemetryTest, IsAGapWhenXpuVisibleDevicesIsSet) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    setenv("XPU_VISIBLE_DEVICES", "0,1", 1);  // libxpuml's indices are then not trusted
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.ExpectError(runtime->GetTelemetry(0).status(), absl::StatusCode::kUnimplemented,
                  {"device_telemetry", "XPU_VISIBLE_DEVICES"});
  });
}

TEST(KunlunxinTelemetryTest, ADeviceOutOfRangeIsInvalid) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    f.ExpectError(runtime->GetTelemetry(2).status(), absl::StatusCode::kInvalidArgument,
                  {"device 2 does not exist"});
    f.ExpectError(runtime->GetTelemetry(-1).status(), absl::StatusCode::kInvalidArgument,
                  {"device -1 does not exist"});
  });
}

TEST(KunlunxinTelemetryTest, AScrapeThreadReadsWhileOtherThreadsWork) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake("500");
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    std::atomic<bool> stop{false};
    std::atomic<bool> scraper_done{false};
    std::atomic<int> scrapes{0};
    absl::Mutex mu;
    Failures shared;  // guarded by mu
    std::thread scraper([&] {
      Failures local;
      while (!stop.load()) {
        for (int d = 0; d < 2; ++d) {
          absl::StatusOr<DeviceTelemetry> t = runtime->GetTelemetry(d);
          if (!local.ExpectOk(t.status(), "GetTelemetry")) break;
          local.Expect(t->temperature_celsius == 45.0 && t->power_watts == 150.0 &&
                           t->memory_total_bytes == kFakeMemory &&
                           t->memory_used_bytes <= t->memory_total_bytes,
                       "figures while the device works");
        }
        scrapes.fetch_add(1);
        if (!local.text().empty()) break;
      }
      absl::MutexLock lock(&mu);
      shared.Expect(local.text().empty(), absl::StrCat("scraper:\n", local.text()));
      scraper_done.store(true);
    });
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        Failures local;
        const int device = w % 2;
        for (int round = 0; round < 8; ++round) {
          absl::StatusOr<DevicePtr> ptr = runtime->Malloc(device, 256 << 10);
          if (!local.ExpectOk(ptr.status(), "Malloc")) break;
          const std::vector<uint8_t> in = Pattern(256 << 10, static_cast<uint8_t>(w + round));
          local.ExpectOk(runtime->CopyHostToDevice(device, 0, *ptr, in.data(), in.size()), "copy");
          local.ExpectOk(runtime->SynchronizeStream(device, 0), "sync");
          local.ExpectOk(runtime->Free(device, *ptr), "Free");
        }
        absl::MutexLock lock(&mu);
        shared.Expect(local.text().empty(), absl::StrCat("worker ", w, ":\n", local.text()));
      });
    }
    for (std::thread& worker : workers) worker.join();
    while (scrapes.load() < 10 && !scraper_done.load()) std::this_thread::yield();
    stop.store(true);
    scraper.join();
    absl::MutexLock lock(&mu);
    f.Expect(shared.text().empty(), shared.text());
  });
}

// ---------------------------------------------------------------- events

TEST(KunlunxinEventTest, ElapsedTimeIsAGapSayingSo) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<EventHandle> start = runtime->CreateEvent(0, true);
    absl::StatusOr<EventHandle> end = runtime->CreateEvent(0, true);
    if (!f.ExpectOk(start.status(), "CreateEvent") || !f.ExpectOk(end.status(), "CreateEvent")) {
      return;
    }
    f.ExpectOk(runtime->RecordEvent(0, *start, 0), "record");
    f.ExpectOk(runtime->RecordEvent(0, *end, 0), "record");
    f.ExpectOk(runtime->SynchronizeEvent(0, *end), "sync");
    f.ExpectError(runtime->ElapsedTime(0, *start, *end).status(),
                  absl::StatusCode::kUnimplemented,
                  {"not supported by the kunlunxin backend", "event_elapsed_time"});
    f.ExpectOk(runtime->DestroyEvent(0, *start), "DestroyEvent");
    f.ExpectOk(runtime->DestroyEvent(0, *end), "DestroyEvent");
  });
}

TEST(KunlunxinEventTest, AnEventNeverRecordedIsCompleteAndWaitsForNothing) {
  EXPECT_CHILD_PASSES([](Failures& f) {
    UseFake();
    std::unique_ptr<DeviceRuntime> runtime = MustCreate(f);
    if (runtime == nullptr) return;
    absl::StatusOr<EventHandle> event = runtime->CreateEvent(1, false);
    if (!f.ExpectOk(event.status(), "CreateEvent")) return;
    absl::StatusOr<bool> done = runtime->QueryEvent(1, *event);
    f.Expect(done.ok() && *done, "query");
    f.ExpectOk(runtime->SynchronizeEvent(1, *event), "sync");
    f.ExpectOk(runtime->StreamWaitEvent(1, 0, *event), "stream wait");
    f.ExpectError(runtime->QueryEvent(0, *event).status(), absl::StatusCode::kNotFound,
                  {"does not exist"});
    f.ExpectOk(runtime->DestroyEvent(1, *event), "DestroyEvent");
  });
}

}  // namespace
}  // namespace flagos

int main(int argc, char** argv) {
  // A fresh exec per child, so each loads the fake with its own FAKE_XPU_*.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
