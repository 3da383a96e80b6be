#include "cpu_runtime.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "flagos/hostcopy/bulk_copy.h"

namespace flagos {
namespace {

using Clock = std::chrono::steady_clock;

std::string Hex(uint64_t value) { return absl::StrFormat("0x%x", value); }

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// One emulated device: its allocations, streams and events.
class CpuDevice {
 public:
  CpuDevice(int index, uint64_t total) : index_(index), total_(total) {}

  ~CpuDevice() {
    // Sessions free their segments; whatever is left is unmapped here so the
    // runtime never leaks host memory.
    for (const auto& [ptr, allocation] : allocations_) {
      munmap(reinterpret_cast<void*>(ptr), allocation.mapped_bytes);
    }
  }

  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  uint64_t total() const { return total_; }

  absl::StatusOr<DevicePtr> Malloc(uint64_t nbytes) {
    if (nbytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Prefix(), "cannot allocate 0 bytes: allocations must be at least 1 byte"));
    }
    {
      absl::MutexLock lock(&mu_);
      if (nbytes > total_ - used_) {
        return absl::ResourceExhaustedError(absl::StrCat(
            Prefix(), "cannot allocate ", nbytes, " bytes: ", used_, " of ", total_,
            " bytes in use; free tensors, call torch.flagos.empty_cache(), or start flagosd "
            "with a larger --device-memory"));
      }
      used_ += nbytes;  // reserved before mapping so concurrent callers see it
    }
    const uint64_t mapped = (nbytes + PageSize() - 1) / PageSize() * PageSize();
    void* memory = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) {
      const int err = errno;
      absl::MutexLock lock(&mu_);
      used_ -= nbytes;
      return absl::ResourceExhaustedError(
          absl::StrCat(Prefix(), "cannot allocate ", nbytes, " bytes: mmap failed (",
                       std::strerror(err), "); the host is out of memory"));
    }
    const DevicePtr ptr = reinterpret_cast<DevicePtr>(memory);
    absl::MutexLock lock(&mu_);
    allocations_[ptr] = Allocation{nbytes, mapped};
    return ptr;
  }

  absl::Status Free(DevicePtr ptr) {
    Allocation allocation;
    {
      absl::MutexLock lock(&mu_);
      auto it = allocations_.find(ptr);
      if (it == allocations_.end()) {
        return absl::NotFoundError(absl::StrCat(
            Prefix(), "cannot free ", Hex(ptr),
            ": it is not the start of a live allocation on this device (freed twice, or "
            "allocated on another device?)"));
      }
      allocation = it->second;
      allocations_.erase(it);
      used_ -= allocation.nbytes;
    }
    munmap(reinterpret_cast<void*>(ptr), allocation.mapped_bytes);
    return absl::OkStatus();
  }

  MemoryInfo GetMemoryInfo() const {
    absl::MutexLock lock(&mu_);
    return MemoryInfo{total_, total_ - used_};
  }

  // OK when [ptr, ptr + nbytes) lies inside one live allocation.
  absl::Status CheckRange(DevicePtr ptr, uint64_t nbytes, absl::string_view what) const {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.upper_bound(ptr);
    if (it != allocations_.begin()) {
      --it;
      const uint64_t offset = ptr - it->first;
      if (offset <= it->second.nbytes && nbytes <= it->second.nbytes - offset) {
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(), what, " range ", Hex(ptr), " + ", nbytes,
                     " bytes is not inside one live allocation of this device"));
  }

  absl::StatusOr<StreamHandle> CreateStream() {
    absl::MutexLock lock(&mu_);
    const StreamHandle stream = next_stream_++;
    streams_.insert(stream);
    return stream;
  }

  absl::Status DestroyStream(StreamHandle stream) {
    if (stream == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Prefix(), "the default stream (0) cannot be destroyed"));
    }
    absl::MutexLock lock(&mu_);
    if (streams_.erase(stream) == 0) return UnknownStream(stream);
    return absl::OkStatus();
  }

  absl::Status CheckStream(StreamHandle stream) const {
    if (stream == 0) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    if (!streams_.contains(stream)) return UnknownStream(stream);
    return absl::OkStatus();
  }

  absl::StatusOr<EventHandle> CreateEvent(bool enable_timing) {
    absl::MutexLock lock(&mu_);
    const EventHandle event = next_event_++;
    events_[event] = Event{enable_timing, false, {}};
    return event;
  }

  absl::Status DestroyEvent(EventHandle event) {
    absl::MutexLock lock(&mu_);
    if (events_.erase(event) == 0) return UnknownEvent(event);
    return absl::OkStatus();
  }

  absl::Status RecordEvent(EventHandle event, StreamHandle stream) {
    // Work issued before this call has completed (synchronous execution), so
    // the event's completion time is now.
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&mu_);
    if (stream != 0 && !streams_.contains(stream)) return UnknownStream(stream);
    auto it = events_.find(event);
    if (it == events_.end()) return UnknownEvent(event);
    it->second.recorded = true;
    it->second.time = now;
    return absl::OkStatus();
  }

  absl::Status CheckEvent(EventHandle event) const {
    absl::MutexLock lock(&mu_);
    if (!events_.contains(event)) return UnknownEvent(event);
    return absl::OkStatus();
  }

  absl::StatusOr<float> ElapsedTime(EventHandle start, EventHandle end) const {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Clock::time_point> start_time = TimingPoint(start);
    if (!start_time.ok()) return start_time.status();
    absl::StatusOr<Clock::time_point> end_time = TimingPoint(end);
    if (!end_time.ok()) return end_time.status();
    return std::chrono::duration<float, std::milli>(*end_time - *start_time).count();
  }

 private:
  struct Allocation {
    uint64_t nbytes = 0;        // what the caller asked for (the budget counts this)
    uint64_t mapped_bytes = 0;  // rounded up to whole pages
  };
  struct Event {
    bool timing = false;
    bool recorded = false;
    Clock::time_point time;
  };

  std::string Prefix() const { return absl::StrCat("flagos cpu device ", index_, ": "); }

  absl::Status UnknownStream(StreamHandle stream) const {
    return absl::NotFoundError(
        absl::StrCat(Prefix(), "stream ", stream, " does not exist (destroyed, or never created)"));
  }
  absl::Status UnknownEvent(EventHandle event) const {
    return absl::NotFoundError(
        absl::StrCat(Prefix(), "event ", event, " does not exist (destroyed, or never created)"));
  }

  absl::StatusOr<Clock::time_point> TimingPoint(EventHandle event) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = events_.find(event);
    if (it == events_.end()) return UnknownEvent(event);
    if (!it->second.timing) {
      return absl::FailedPreconditionError(absl::StrCat(
          Prefix(), "event ", event,
          " was created without timing; create it with enable_timing=True to measure time"));
    }
    if (!it->second.recorded) {
      return absl::FailedPreconditionError(absl::StrCat(
          Prefix(), "event ", event, " has not been recorded; record it before elapsed_time"));
    }
    return it->second.time;
  }

  // Constant after construction.
  const int index_;
  const uint64_t total_;

  mutable absl::Mutex mu_;
  std::map<DevicePtr, Allocation> allocations_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<StreamHandle> streams_ ABSL_GUARDED_BY(mu_);
  StreamHandle next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<EventHandle, Event> events_ ABSL_GUARDED_BY(mu_);
  EventHandle next_event_ ABSL_GUARDED_BY(mu_) = 1;
};

// The CPU backend's slot table (backends/cpu/README.md explains each).
void DescribeSlots(CapabilityTable* t) {
  constexpr char kNoCurrentDevice[] =
      "flagosd has no current device: every call names its device";
  constexpr char kNoPriorities[] =
      "operations run synchronously in the calling thread; there is no scheduler that a "
      "priority could steer";
  constexpr char kAtReturn[] = ", in the calling thread: complete when the call returns";
  t->Implement(Slot::kGetDeviceCount, "--cpu-devices emulated devices");
  t->DeclareGap(Slot::kGetDevice, kNoCurrentDevice);
  t->DeclareGap(Slot::kSetDevice, kNoCurrentDevice);
  t->DeclareGap(Slot::kDeviceGetStreamPriorityRange, kNoPriorities);
  t->Implement(Slot::kDeviceSynchronize, "nothing is ever pending: every call completes before "
                                         "it returns");
  t->Implement(Slot::kMalloc, "mmap (MAP_NORESERVE) within the device's --device-memory budget");
  t->Implement(Slot::kFree, "munmap");
  t->DeclareGap(Slot::kMallocHost, "device memory is host memory; flagosd's host buffers "
                                   "(staging regions) are shared memory it maps itself");
  t->DeclareGap(Slot::kFreeHost, "device memory is host memory; nothing is allocated by "
                                 "malloc_host");
  t->Implement(Slot::kMemcpy, absl::StrCat("memcpy", kAtReturn));
  t->Implement(Slot::kMemcpyAsync, absl::StrCat("memcpy/memmove", kAtReturn));
  t->DeclareGap(Slot::kPointerGetAttributes,
                "flagosd's segment table knows every device pointer it handed out; the backend "
                "is never asked");
  t->Implement(Slot::kMemset, absl::StrCat("memset", kAtReturn));
  t->Implement(Slot::kMemsetAsync, absl::StrCat("memset", kAtReturn));
  t->DeclareGap(Slot::kStreamCreateWithPriority, kNoPriorities);
  t->Implement(Slot::kStreamCreate, "an id per device (0 is the default stream)");
  t->DeclareGap(Slot::kStreamGetPriority, kNoPriorities);
  t->Implement(Slot::kStreamDestroy, "forgets the id");
  t->Implement(Slot::kStreamQuery, "always complete (synchronous execution)");
  t->Implement(Slot::kStreamSynchronize, "nothing to wait for (synchronous execution)");
  t->Implement(Slot::kStreamWaitEvent, "the event's work completed when it was recorded");
  t->Implement(Slot::kEventCreateWithFlags, "enable_timing selects a timestamped event");
  t->Implement(Slot::kEventCreate, "an id per device");
  t->Implement(Slot::kEventDestroy, "forgets the id");
  t->Implement(Slot::kEventRecord, "stores a steady_clock timestamp; complete at once");
  t->Implement(Slot::kEventSynchronize, "nothing to wait for (synchronous execution)");
  t->Implement(Slot::kEventQuery, "complete once recorded (and before, as in CUDA)");
  t->Implement(Slot::kEventElapsedTime, "milliseconds between the two timestamps");
  t->Implement(Slot::kDeviceProperties, "name 'flagos cpu device N', total = the budget");
  t->Implement(Slot::kMemoryInfo, "budget minus the bytes allocated");
  t->DeclareGap(Slot::kHostRegister, "cpu device memory is host memory and copies are memcpy "
                                     "from any host address, so there is nothing to pin");
  t->Implement(Slot::kHostAddress, "the device address itself (device memory is host memory)");
  t->Implement(Slot::kLaunchHostFunc, "runs the function in the calling thread: the stream's "
                                      "earlier work completed when its calls returned");
  t->Implement(Slot::kStreamDrain, "nothing to wait for: host functions ran in the thread that "
                                   "issued them, before LaunchHostFunc returned");
  t->DeclareGap(Slot::kDeviceTelemetry,
                "the host CPU backend has no device management library to report temperature, "
                "power or utilisation; flagosd's own metrics cover memory and busy time");
}

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(const CpuRuntimeParams& params) {
    for (int i = 0; i < params.devices; ++i) {
      devices_.push_back(std::make_unique<CpuDevice>(i, params.memory_per_device));
    }
    DescribeSlots(&capabilities_);
  }

  absl::string_view name() const override { return kCpuBackendName; }
  const CapabilityTable& capabilities() const override { return capabilities_; }

  int DeviceCount() const override { return static_cast<int>(devices_.size()); }

  absl::StatusOr<DeviceProperties> GetDeviceProperties(int device) const override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return DeviceProperties{device, absl::StrCat("flagos cpu device ", device), (*d)->total()};
  }

  absl::Status SynchronizeDevice(int device) override {
    // Every operation completed before it returned: nothing is pending.
    return Device(device).status();
  }

  // Each allocation is a fresh anonymous mapping: the kernel's zero pages.
  bool MallocReturnsZeroes() const override { return true; }

  absl::StatusOr<DevicePtr> Malloc(int device, uint64_t nbytes) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->Malloc(nbytes);
  }

  absl::Status Free(int device, DevicePtr ptr) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->Free(ptr);
  }

  absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->GetMemoryInfo();
  }

  absl::StatusOr<DeviceTelemetry> GetTelemetry(int /*device*/) const override {
    return SlotGapError(kCpuBackendName, capabilities_, Slot::kDeviceTelemetry);
  }

  absl::Status CopyHostToDevice(int device, StreamHandle stream, DevicePtr dst, const void* src,
                                uint64_t nbytes) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status s = (*d)->CheckRange(dst, nbytes, "destination"); !s.ok()) return s;
    hostcopy::BulkCopy(reinterpret_cast<void*>(dst), src, nbytes);
    return absl::OkStatus();
  }

  absl::Status CopyDeviceToHost(int device, StreamHandle stream, void* dst, DevicePtr src,
                                uint64_t nbytes) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status s = (*d)->CheckRange(src, nbytes, "source"); !s.ok()) return s;
    hostcopy::BulkCopy(dst, reinterpret_cast<const void*>(src), nbytes);
    return absl::OkStatus();
  }

  absl::Status CopyDeviceToDevice(int device, StreamHandle stream, DevicePtr dst, int src_device,
                                  DevicePtr src, uint64_t nbytes) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<CpuDevice*> s_dev = Device(src_device);
    if (!s_dev.ok()) return s_dev.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status s = (*d)->CheckRange(dst, nbytes, "destination"); !s.ok()) return s;
    if (absl::Status s = (*s_dev)->CheckRange(src, nbytes, "source"); !s.ok()) return s;
    hostcopy::BulkCopy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes);
    return absl::OkStatus();
  }

  absl::Status Memset(int device, StreamHandle stream, DevicePtr dst, uint8_t value,
                      uint64_t nbytes) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status s = (*d)->CheckRange(dst, nbytes, "destination"); !s.ok()) return s;
    std::memset(reinterpret_cast<void*>(dst), value, nbytes);
    return absl::OkStatus();
  }

  void* HostAddress(int device, DevicePtr ptr) const override {
    if (!Device(device).ok()) return nullptr;
    return reinterpret_cast<void*>(ptr);
  }

  absl::Status HostRegister(void* /*ptr*/, uint64_t /*nbytes*/) override {
    return SlotGapError(kCpuBackendName, capabilities_, Slot::kHostRegister);
  }
  absl::Status HostUnregister(void* /*ptr*/) override {
    return SlotGapError(kCpuBackendName, capabilities_, Slot::kHostRegister);
  }

  absl::Status LaunchHostFunc(int device, StreamHandle stream, HostFunc fn) override {
    // The stream's earlier work completed when the calls that issued it
    // returned: the function's moment is now.
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    std::move(fn)(absl::OkStatus());
    return absl::OkStatus();
  }

  absl::StatusOr<StreamHandle> CreateStream(int device) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->CreateStream();
  }

  absl::Status DestroyStream(int device, StreamHandle stream) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->DestroyStream(stream);
  }

  absl::Status SynchronizeStream(int device, StreamHandle stream) override {
    // Work on the stream completed before the calls that issued it returned.
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->CheckStream(stream);
  }

  absl::Status DrainStream(int device, StreamHandle stream) override {
    // Host functions ran inside the LaunchHostFunc that issued them.
    return SynchronizeStream(device, stream);
  }

  absl::StatusOr<bool> QueryStream(int device, StreamHandle stream) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    return true;
  }

  absl::Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) override {
    // The work an event marks has completed when RecordEvent returned, so
    // later work on `stream` is already ordered after it.
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckStream(stream); !s.ok()) return s;
    return (*d)->CheckEvent(event);
  }

  absl::StatusOr<EventHandle> CreateEvent(int device, bool enable_timing) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->CreateEvent(enable_timing);
  }

  absl::Status DestroyEvent(int device, EventHandle event) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->DestroyEvent(event);
  }

  absl::Status RecordEvent(int device, EventHandle event, StreamHandle stream) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->RecordEvent(event, stream);
  }

  absl::StatusOr<bool> QueryEvent(int device, EventHandle event) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->CheckEvent(event); !s.ok()) return s;
    return true;  // recorded work is complete; an unrecorded event counts as complete (as in CUDA)
  }

  absl::Status SynchronizeEvent(int device, EventHandle event) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->CheckEvent(event);
  }

  absl::StatusOr<float> ElapsedTime(int device, EventHandle start, EventHandle end) override {
    absl::StatusOr<CpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    return (*d)->ElapsedTime(start, end);
  }

 private:
  absl::StatusOr<CpuDevice*> Device(int device) const {
    if (device < 0 || device >= DeviceCount()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flagos cpu: device ", device, " does not exist (devices are 0..", DeviceCount() - 1,
          "); start flagosd with a larger --cpu-devices to have more"));
    }
    return devices_[device].get();
  }

  std::vector<std::unique_ptr<CpuDevice>> devices_;  // constant after construction
  CapabilityTable capabilities_;                     // constant after construction
};

}  // namespace

absl::Status CpuRuntimeParams::Validate() const {
  if (devices < 1 || devices > kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: devices must be between 1 and ", kMaxDevices, ", got ", devices));
  }
  if (memory_per_device < kMinMemoryPerDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: memory per device must be at least ", kMinMemoryPerDevice,
                     " bytes (1 MiB), got ", memory_per_device));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateCpuRuntime(const CpuRuntimeParams& params) {
  if (absl::Status status = params.Validate(); !status.ok()) return status;
  return std::unique_ptr<DeviceRuntime>(new CpuRuntime(params));
}

}  // namespace flagos
