#include "kunlunxin_runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "host_func_queue.h"
#include "kunlunxin_slots.h"
#include "xpu_device.h"
#include "xpurt_library.h"
#include "xpurt_status.h"
#include "xpurt_symbols.h"

namespace flagos {
namespace {

using kunlunxin::DevicePrefix;
using kunlunxin::HexAddress;
using kunlunxin::kXpuErrBusy;
using kunlunxin::NormalizeXpuCode;
using kunlunxin::XpuCodeText;
using kunlunxin::XpuDevice;
using kunlunxin::XpuEvent;
using kunlunxin::XpumlApi;
using kunlunxin::XpurtApi;
using kunlunxin::XpurtLibrary;
using kunlunxin::XpurtSearch;
using kunlunxin::XpuStream;
using kunlunxin::XpuStatus;

// The vendor's current device is per thread. Each thread remembers which
// runtime last set it, and to what, so that redundant xpu_set_device calls
// are skipped; the runtime id makes a second runtime in the process (whose
// calls move the vendor's current device too) invalidate the cache.
struct CurrentDevice {
  uint64_t runtime = 0;
  int device = -1;
};
thread_local CurrentDevice t_current_device;
std::atomic<uint64_t> g_next_runtime_id{1};

// What flagosd's memory figures and telemetry come from (libxpuml when it
// answers for these devices, else this runtime's own bookkeeping and no
// telemetry).
struct MemorySource {
  const XpumlApi* xpuml = nullptr;   // null: own bookkeeping
  std::vector<void*> xpuml_devices;  // libxpuml's handle per device
  std::string note;                  // why libxpuml is not used, when it is not
};

class KunlunxinRuntime final : public DeviceRuntime, public KunlunxinStreams {
 public:
  KunlunxinRuntime(std::unique_ptr<XpurtLibrary> library, uint64_t memset_chunk_bytes,
                   std::vector<std::unique_ptr<XpuDevice>> devices, MemorySource memory)
      : library_(std::move(library)),
        api_(library_->api()),
        id_(g_next_runtime_id.fetch_add(1)),
        memset_chunk_bytes_(memset_chunk_bytes),
        devices_(std::move(devices)),
        memory_(std::move(memory)),
        host_register_(api_.xpu_host_register != nullptr && api_.xpu_host_unregister != nullptr) {
    kunlunxin::KunlunxinSlotFacts facts;
    facts.host_register = host_register_;
    facts.xpuml_memory = memory_.xpuml != nullptr;
    facts.memory_note = memory_.note;
    facts.memset_chunk_bytes = memset_chunk_bytes_;
    if (memory_.xpuml != nullptr) {
      facts.xpuml_temperature = memory_.xpuml->xpumlDeviceGetTemperature != nullptr;
      facts.xpuml_power = memory_.xpuml->xpumlDeviceGetPowerUsage != nullptr;
      facts.xpuml_utilization = memory_.xpuml->xpumlDeviceGetUtilizationRates != nullptr;
    }
    kunlunxin::DescribeKunlunxinSlots(facts, &capabilities_);
  }

  ~KunlunxinRuntime() override {
    closing_.store(true);
    // Everything issued runs to completion and every host function runs
    // (they may call back in: nothing is torn down yet), then what the
    // sessions left behind is released so the device is left clean.
    for (const auto& device : devices_) {
      const std::vector<std::shared_ptr<XpuStream>> streams = device->Streams();
      if (Use(device->index()).ok()) {
        for (const auto& stream : streams) (void)api_.xpu_wait(stream->handle);
      }
      for (const auto& stream : streams) stream->host_funcs.Drain();
    }
    for (const auto& device : devices_) {
      if (!Use(device->index()).ok()) continue;
      for (const auto& stream : device->TakeCreatedStreams()) {
        (void)api_.xpu_stream_destroy(stream->handle);
      }
      for (const auto& event : device->TakeEvents()) (void)api_.xpu_event_destroy(event->handle);
      for (DevicePtr ptr : device->TakeAllocations()) {
        (void)api_.xpu_free(reinterpret_cast<void*>(ptr));
      }
    }
    // libxpuml stays initialised: its shutdown is not reference-counted on
    // every version, and another runtime in the process may still use it.
  }

  absl::string_view name() const override { return kKunlunxinBackendName; }
  const CapabilityTable& capabilities() const override { return capabilities_; }

  // ---- device

  int DeviceCount() const override { return static_cast<int>(devices_.size()); }

  absl::StatusOr<DeviceProperties> GetDeviceProperties(int device) const override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    const uint64_t model = (*d)->model();
    std::string name = model >= 300 && model <= 599
                           ? absl::StrCat("Kunlun P800 (kunlunxin device ", device, ")")
                           : absl::StrCat("Kunlunxin XPU model ", model, " (device ", device, ")");
    return DeviceProperties{device, std::move(name), (*d)->total()};
  }

  absl::Status SynchronizeDevice(int device) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status s = Use(device); !s.ok()) return s;
    absl::Status first;
    for (const auto& stream : (*d)->Streams()) {
      absl::Status s = Wait(device, *stream);
      if (first.ok()) first = std::move(s);
    }
    return first;
  }

  // ---- memory

  absl::StatusOr<DevicePtr> Malloc(int device, uint64_t nbytes) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (nbytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          DevicePrefix(device), "cannot allocate 0 bytes: allocations must be at least 1 byte"));
    }
    const auto [held, count] = (*d)->Allocated();
    if (nbytes > (*d)->total()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          DevicePrefix(device), "cannot allocate ", nbytes, " bytes: the device has ",
          (*d)->total(), " bytes in all; use smaller tensors or spread them over more devices"));
    }
    if (absl::Status s = Use(device); !s.ok()) return s;
    void* ptr = nullptr;
    if (int rc = api_.xpu_malloc(&ptr, nbytes, kunlunxin::kXpuMemoryKindMain); rc != 0) {
      return XpuStatus(rc, device,
                       absl::StrCat("xpu_malloc of ", nbytes, " bytes (flagosd holds ", held,
                                    " bytes in ", count, " allocations on this device)"));
    }
    if (ptr == nullptr) {
      return absl::InternalError(absl::StrCat(
          DevicePrefix(device), "xpu_malloc of ", nbytes,
          " bytes reported success but returned no address: the XPU runtime at ",
          library_->path(), " misbehaves; restart flagosd, and check the SDK version"));
    }
    const DevicePtr result = reinterpret_cast<DevicePtr>(ptr);
    if (absl::Status s = (*d)->Track(result, nbytes); !s.ok()) return s;
    return result;
  }

  absl::Status Free(int device, DevicePtr ptr) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    // Claimed first, so that two concurrent frees of one pointer cannot both
    // reach the vendor.
    absl::StatusOr<uint64_t> nbytes = (*d)->Untrack(ptr);
    if (!nbytes.ok()) return nbytes.status();
    absl::Status s = Use(device);
    if (s.ok()) {
      s = XpuStatus(api_.xpu_free(reinterpret_cast<void*>(ptr)), device,
                    absl::StrCat("xpu_free of ", HexAddress(ptr)));
    }
    if (!s.ok()) (void)(*d)->Track(ptr, *nbytes);  // still allocated, as far as we know
    return s;
  }

  absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (memory_.xpuml != nullptr) {
      XpumlMemory figures{};
      const int rc = memory_.xpuml->xpumlDeviceGetMemoryInfo(memory_.xpuml_devices[device],
                                                             &figures);
      if (rc != 0) {
        return absl::InternalError(absl::StrCat(DevicePrefix(device),
                                                "xpumlDeviceGetMemoryInfo failed with code ", rc,
                                                " (", XpumlCodeName(rc),
                                                "): check the device with xpu_smi"));
      }
      return MemoryInfo{figures.global_total, std::min(figures.global_free, figures.global_total)};
    }
    const uint64_t held = (*d)->Allocated().first;
    const uint64_t total = (*d)->total();
    return MemoryInfo{total, held < total ? total - held : 0};
  }

  // Each figure from its own libxpuml call, made with the device's libxpuml
  // handle (no current device involved); a call the library lacks, or one
  // that returns non-zero, leaves its figure absent. Nothing of the
  // runtime's is touched but constant members, so any thread may call it;
  // libxpuml's queries are taken to be thread-safe as NVML's are (to be
  // confirmed on a P800).
  absl::StatusOr<DeviceTelemetry> GetTelemetry(int device) const override {
    if (memory_.xpuml == nullptr) {
      return SlotGapError(kKunlunxinBackendName, capabilities_, Slot::kDeviceTelemetry);
    }
    if (absl::StatusOr<XpuDevice*> d = Device(device); !d.ok()) return d.status();
    const XpumlApi& ml = *memory_.xpuml;
    void* handle = memory_.xpuml_devices[device];
    DeviceTelemetry telemetry;
    if (ml.xpumlDeviceGetTemperature != nullptr) {
      unsigned int celsius = 0;
      if (ml.xpumlDeviceGetTemperature(handle, kunlunxin::kXpumlTemperatureXpu, &celsius) == 0) {
        telemetry.temperature_celsius = celsius;
      }
    }
    if (ml.xpumlDeviceGetPowerUsage != nullptr) {
      unsigned int milliwatts = 0;
      if (ml.xpumlDeviceGetPowerUsage(handle, &milliwatts) == 0) {
        telemetry.power_watts = milliwatts / 1000.0;
      }
    }
    if (ml.xpumlDeviceGetUtilizationRates != nullptr) {
      XpumlUtilization rates{};
      // A percentage above 100 is not one: left absent rather than clamped.
      if (ml.xpumlDeviceGetUtilizationRates(handle, &rates) == 0 && rates.xpu <= 100) {
        telemetry.utilization = rates.xpu / 100.0;
      }
    }
    XpumlMemory memory{};
    if (ml.xpumlDeviceGetMemoryInfo(handle, &memory) == 0) {
      telemetry.memory_total_bytes = memory.global_total;
      telemetry.memory_used_bytes = memory.global_used;
    }
    return telemetry;
  }

  absl::Status HostRegister(void* ptr, uint64_t nbytes) override {
    if (!host_register_) {
      return SlotGapError(kKunlunxinBackendName, capabilities_, Slot::kHostRegister);
    }
    if (ptr == nullptr || nbytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kunlunxin backend: cannot register ", nbytes, " bytes at ",
          HexAddress(reinterpret_cast<uint64_t>(ptr)), ": the range must be non-empty"));
    }
    // Registration belongs to the process; device 0 is current for the call.
    if (absl::Status s = Use(0); !s.ok()) return s;
    return XpuStatus(api_.xpu_host_register(ptr, nbytes, 0), -1,
                     absl::StrCat("xpu_host_register of ", nbytes, " bytes at ",
                                  HexAddress(reinterpret_cast<uint64_t>(ptr))));
  }

  absl::Status HostUnregister(void* ptr) override {
    if (!host_register_) {
      return SlotGapError(kKunlunxinBackendName, capabilities_, Slot::kHostRegister);
    }
    if (absl::Status s = Use(0); !s.ok()) return s;
    return XpuStatus(
        api_.xpu_host_unregister(ptr), -1,
        absl::StrCat("xpu_host_unregister of ", HexAddress(reinterpret_cast<uint64_t>(ptr))));
  }

  void* HostAddress(int /*device*/, DevicePtr /*ptr*/) const override { return nullptr; }

  absl::Status CopyHostToDevice(int device, StreamHandle stream, DevicePtr dst, const void* src,
                                uint64_t nbytes) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status r = (*d)->CheckRange(dst, nbytes, "destination"); !r.ok()) return r;
    if (src == nullptr) return NullHostPointer(device, "source");
    return MemcpyAsync(device, stream, **s, reinterpret_cast<void*>(dst), src, nbytes,
                       kunlunxin::kXpuMemcpyHostToDevice, "host to device");
  }

  absl::Status CopyDeviceToHost(int device, StreamHandle stream, void* dst, DevicePtr src,
                                uint64_t nbytes) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status r = (*d)->CheckRange(src, nbytes, "source"); !r.ok()) return r;
    if (dst == nullptr) return NullHostPointer(device, "destination");
    return MemcpyAsync(device, stream, **s, dst, reinterpret_cast<const void*>(src), nbytes,
                       kunlunxin::kXpuMemcpyDeviceToHost, "device to host");
  }

  absl::Status CopyDeviceToDevice(int device, StreamHandle stream, DevicePtr dst, int src_device,
                                  DevicePtr src, uint64_t nbytes) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<XpuDevice*> sd = Device(src_device);
    if (!sd.ok()) return sd.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status r = (*d)->CheckRange(dst, nbytes, "destination"); !r.ok()) return r;
    if (absl::Status r = (*sd)->CheckRange(src, nbytes, "source"); !r.ok()) return r;
    if (src_device == device) {
      return MemcpyAsync(device, stream, **s, reinterpret_cast<void*>(dst),
                         reinterpret_cast<const void*>(src), nbytes,
                         kunlunxin::kXpuMemcpyDeviceToDevice, "device to device");
    }
    if (absl::Status r = Use(device); !r.ok()) return r;
    // libxpurt's peer copy is synchronous and takes no stream: ordering it
    // on `stream` means waiting for the stream's earlier work first. It is
    // complete when the call returns.
    if (absl::Status r = Wait(device, **s); !r.ok()) return r;
    return XpuStatus(
        api_.xpu_memcpy_peer(device, reinterpret_cast<void*>(dst), src_device,
                             reinterpret_cast<const void*>(src), nbytes),
        device,
        absl::StrCat("xpu_memcpy_peer of ", nbytes, " bytes from device ", src_device));
  }

  absl::Status Memset(int device, StreamHandle stream, DevicePtr dst, uint8_t value,
                      uint64_t nbytes) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if (nbytes == 0) return absl::OkStatus();
    if (absl::Status r = (*d)->CheckRange(dst, nbytes, "destination"); !r.ok()) return r;
    if (absl::Status r = Use(device); !r.ok()) return r;
    // One host buffer holding the value, copied chunk by chunk. It belongs
    // to the device until the stream has reached the last copy.
    const uint64_t chunk = std::min(nbytes, memset_chunk_bytes_);
    std::shared_ptr<uint8_t[]> buffer(new (std::nothrow) uint8_t[chunk]);
    if (buffer == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          DevicePrefix(device), "cannot memset ", nbytes, " bytes: no host memory for the ", chunk,
          "-byte fill buffer"));
    }
    std::memset(buffer.get(), value, chunk);
    absl::Status issue;
    uint64_t issued = 0;
    while (issued < nbytes) {
      const uint64_t n = std::min(chunk, nbytes - issued);
      const int rc = api_.xpu_memcpy_async(reinterpret_cast<void*>(dst + issued), buffer.get(), n,
                                           kunlunxin::kXpuMemcpyHostToDevice, (*s)->handle);
      if (rc != 0) {
        issue = XpuStatus(rc, device,
                          absl::StrCat("xpu_memcpy_async host to device (memset of ", nbytes,
                                       " bytes at ", HexAddress(dst), ", chunk at offset ",
                                       issued, ")"));
        break;
      }
      (*s)->MarkIssued();
      issued += n;
    }
    if (issued == 0) return issue;  // nothing refers to the buffer
    absl::Status release = IssueHostFunc(device, **s, [buffer](absl::Status) {});
    if (!release.ok()) {
      // The copies still read the buffer: hold it until they are done. If
      // even that fails the device state is unknown, and the buffer is
      // leaked rather than freed under a copy that may still run.
      if (!Wait(device, **s).ok()) new std::shared_ptr<uint8_t[]>(buffer);
      return issue.ok() ? release : issue;
    }
    return issue;
  }

  // ---- streams

  absl::StatusOr<StreamHandle> CreateStream(int device) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    // The vendor's limit is per process; this runtime counts its own.
    int created = created_streams_.load();
    do {
      if (created >= kunlunxin::kXpuMaxStreams) return TooManyStreams(device, created);
    } while (!created_streams_.compare_exchange_weak(created, created + 1));
    if (absl::Status s = Use(device); !s.ok()) {
      created_streams_.fetch_sub(1);
      return s;
    }
    void* handle = nullptr;
    if (int rc = api_.xpu_stream_create(&handle); rc != 0) {
      created_streams_.fetch_sub(1);
      if (NormalizeXpuCode(rc) == kXpuErrBusy) return TooManyStreams(device, created);
      return XpuStatus(rc, device, "xpu_stream_create");
    }
    if (handle == nullptr) {
      created_streams_.fetch_sub(1);
      return absl::InternalError(absl::StrCat(
          DevicePrefix(device),
          "xpu_stream_create reported success but returned no stream: the XPU runtime at ",
          library_->path(), " misbehaves; restart flagosd"));
    }
    return (*d)->AddStream(std::make_shared<XpuStream>(handle));
  }

  absl::Status DestroyStream(int device, StreamHandle stream) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (stream == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(DevicePrefix(device), "the default stream (0) cannot be destroyed"));
    }
    {
      absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
      if (!s.ok()) return s.status();
      if ((*s)->host_funcs.OnQueueThread()) {
        return absl::FailedPreconditionError(absl::StrCat(
            DevicePrefix(device), "stream ", stream,
            " cannot be destroyed by one of its own host functions (it would wait for itself)"));
      }
    }
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->RemoveStream(stream);
    if (!s.ok()) return s.status();
    absl::Status status = Use(device);
    if (status.ok()) status = Wait(device, **s);
    // Every host function issued before runs; none may hold a lock of ours.
    (*s)->host_funcs.Drain();
    if (absl::Status r = Use(device); r.ok()) {
      absl::Status destroyed = XpuStatus(api_.xpu_stream_destroy((*s)->handle), device,
                                         absl::StrCat("xpu_stream_destroy of stream ", stream));
      if (status.ok()) status = std::move(destroyed);
    } else if (status.ok()) {
      status = std::move(r);
    }
    created_streams_.fetch_sub(1);
    return status;
  }

  absl::Status SynchronizeStream(int device, StreamHandle stream) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if (absl::Status r = Use(device); !r.ok()) return r;
    return Wait(device, **s);
  }

  absl::Status DrainStream(int device, StreamHandle stream) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if ((*s)->host_funcs.OnQueueThread()) {
      return absl::FailedPreconditionError(absl::StrCat(
          DevicePrefix(device), "stream ", stream,
          " cannot be drained by one of its own host functions (it would wait for itself)"));
    }
    absl::Status status = Use(device);
    if (status.ok()) status = Wait(device, **s);
    // The functions issued before this call; later ones are not waited for
    // (they may keep coming from other threads).
    (*s)->host_funcs.Drain();
    return status;
  }

  absl::StatusOr<bool> QueryStream(int device, StreamHandle stream) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    const uint64_t issued = (*s)->issued.load(std::memory_order_acquire);
    if ((*s)->KnownIdle(issued)) return true;
    if (absl::Status r = Use(device); !r.ok()) return r;
    void* event = nullptr;
    if (int rc = api_.xpu_event_create(&event); rc != 0) {
      return XpuStatus(rc, device, "xpu_event_create (to query a stream)");
    }
    int rc = api_.xpu_event_record(event, (*s)->handle);
    if (rc != 0) {
      (void)api_.xpu_event_destroy(event);
      return XpuStatus(rc, device, absl::StrCat("xpu_event_record (to query stream ", stream, ")"));
    }
    rc = api_.xpu_event_query(event);
    (void)api_.xpu_event_destroy(event);
    if (rc == 0) {
      (*s)->MarkCompleted(issued);
      return true;
    }
    if (NormalizeXpuCode(rc) == kXpuErrBusy) return false;
    return XpuStatus(rc, device, absl::StrCat("xpu_event_query (to query stream ", stream, ")"));
  }

  absl::Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    absl::StatusOr<std::shared_ptr<XpuEvent>> e = (*d)->FindEvent(event);
    if (!e.ok()) return e.status();
    if (!(*e)->recorded.load()) return absl::OkStatus();  // nothing to wait for
    if (absl::Status r = Use(device); !r.ok()) return r;
    if (int rc = api_.xpu_stream_wait_event((*s)->handle, (*e)->handle); rc != 0) {
      return XpuStatus(rc, device, absl::StrCat("xpu_stream_wait_event (stream ", stream,
                                                ", event ", event, ")"));
    }
    (*s)->MarkIssued();
    return absl::OkStatus();
  }

  absl::Status LaunchHostFunc(int device, StreamHandle stream, HostFunc fn) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    return IssueHostFunc(device, **s, std::move(fn));
  }

  // ---- events

  absl::StatusOr<EventHandle> CreateEvent(int device, bool enable_timing) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    if (absl::Status r = Use(device); !r.ok()) return r;
    void* handle = nullptr;
    if (int rc = api_.xpu_event_create(&handle); rc != 0) {
      return XpuStatus(rc, device, "xpu_event_create");
    }
    if (handle == nullptr) {
      return absl::InternalError(absl::StrCat(
          DevicePrefix(device),
          "xpu_event_create reported success but returned no event: the XPU runtime at ",
          library_->path(), " misbehaves; restart flagosd"));
    }
    return (*d)->AddEvent(std::make_shared<XpuEvent>(handle, enable_timing));
  }

  absl::Status DestroyEvent(int device, EventHandle event) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuEvent>> e = (*d)->RemoveEvent(event);
    if (!e.ok()) return e.status();
    if (absl::Status r = Use(device); !r.ok()) return r;
    return XpuStatus(api_.xpu_event_destroy((*e)->handle), device,
                     absl::StrCat("xpu_event_destroy of event ", event));
  }

  absl::Status RecordEvent(int device, EventHandle event, StreamHandle stream) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    absl::StatusOr<std::shared_ptr<XpuEvent>> e = (*d)->FindEvent(event);
    if (!e.ok()) return e.status();
    if (absl::Status r = Use(device); !r.ok()) return r;
    if (int rc = api_.xpu_event_record((*e)->handle, (*s)->handle); rc != 0) {
      return XpuStatus(rc, device,
                       absl::StrCat("xpu_event_record (event ", event, ", stream ", stream, ")"));
    }
    (*e)->recorded.store(true);
    (*s)->MarkIssued();
    (*e)->Recorded(*s);
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(int device, EventHandle event) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuEvent>> e = (*d)->FindEvent(event);
    if (!e.ok()) return e.status();
    if (!(*e)->recorded.load()) return true;  // as in CUDA
    if (absl::Status r = Use(device); !r.ok()) return r;
    const int rc = api_.xpu_event_query((*e)->handle);
    if (rc == 0) {
      (*e)->SeenComplete();
      return true;
    }
    if (NormalizeXpuCode(rc) == kXpuErrBusy) return false;
    return XpuStatus(rc, device, absl::StrCat("xpu_event_query of event ", event));
  }

  absl::Status SynchronizeEvent(int device, EventHandle event) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuEvent>> e = (*d)->FindEvent(event);
    if (!e.ok()) return e.status();
    if (!(*e)->recorded.load()) return absl::OkStatus();
    if (absl::Status r = Use(device); !r.ok()) return r;
    absl::Status status = XpuStatus(api_.xpu_event_wait((*e)->handle), device,
                                    absl::StrCat("xpu_event_wait of event ", event));
    if (status.ok()) (*e)->SeenComplete();
    return status;
  }

  absl::StatusOr<float> ElapsedTime(int /*device*/, EventHandle /*start*/,
                                    EventHandle /*end*/) override {
    return SlotGapError(kKunlunxinBackendName, capabilities_, Slot::kEventElapsedTime);
  }

 private:
  absl::StatusOr<XpuDevice*> Device(int device) const {
    if (device < 0 || device >= DeviceCount()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kunlunxin: device ", device, " does not exist (devices are 0..", DeviceCount() - 1,
          ", as libxpurt at ", library_->path(),
          " reports them; XPU_VISIBLE_DEVICES chooses which devices flagosd sees)"));
    }
    return devices_[device].get();
  }

  absl::Status IssueOnStream(int device, StreamHandle stream,
                             absl::FunctionRef<absl::Status(void* xpu_stream)> issue) override {
    absl::StatusOr<XpuDevice*> d = Device(device);
    if (!d.ok()) return d.status();
    absl::StatusOr<std::shared_ptr<XpuStream>> s = (*d)->FindStream(stream);
    if (!s.ok()) return s.status();
    if (absl::Status r = Use(device); !r.ok()) return r;
    absl::Status issued = issue((*s)->handle);
    if (issued.ok()) (*s)->MarkIssued();
    return issued;
  }

  absl::Status OnDevice(int device, absl::FunctionRef<absl::Status()> call) override {
    if (absl::StatusOr<XpuDevice*> d = Device(device); !d.ok()) return d.status();
    if (absl::Status r = Use(device); !r.ok()) return r;
    return call();
  }

  // Makes `device` the vendor's current device on this thread.
  absl::Status Use(int device) const {
    CurrentDevice& current = t_current_device;
    if (current.runtime == id_ && current.device == device) return absl::OkStatus();
    if (int rc = api_.xpu_set_device(device); rc != 0) {
      current = CurrentDevice();
      return XpuStatus(rc, device, "xpu_set_device");
    }
    current = CurrentDevice{id_, device};
    return absl::OkStatus();
  }

  // xpu_wait on `stream`. REQUIRES: Use(device) on this thread.
  absl::Status Wait(int device, XpuStream& stream) {
    const uint64_t issued = stream.issued.load(std::memory_order_acquire);
    if (int rc = api_.xpu_wait(stream.handle); rc != 0) return XpuStatus(rc, device, "xpu_wait");
    stream.MarkCompleted(issued);
    return absl::OkStatus();
  }

  // Issues `fn` on `stream`: an event recorded there, and an entry of the
  // stream's host-function queue that waits for it. On an error `fn` is
  // destroyed without running.
  // Issues one xpu_memcpy_async of `kind` on `xpu_stream` (flagosd's handle
  // `stream`), after making `device` current; `direction` names it in errors.
  absl::Status MemcpyAsync(int device, StreamHandle stream, XpuStream& xpu_stream, void* dst,
                           const void* src, uint64_t nbytes, int kind,
                           absl::string_view direction) {
    if (absl::Status r = Use(device); !r.ok()) return r;
    if (int rc = api_.xpu_memcpy_async(dst, src, nbytes, kind, xpu_stream.handle); rc != 0) {
      return XpuStatus(rc, device, absl::StrCat("xpu_memcpy_async ", direction, " of ", nbytes,
                                                " bytes on stream ", stream));
    }
    xpu_stream.MarkIssued();
    return absl::OkStatus();
  }

  absl::Status IssueHostFunc(int device, XpuStream& stream, HostFunc fn) {
    if (closing_.load()) {
      return absl::FailedPreconditionError(absl::StrCat(
          DevicePrefix(device), "cannot issue a host function: the runtime is shutting down"));
    }
    if (absl::Status r = Use(device); !r.ok()) return r;
    void* event = nullptr;
    if (int rc = api_.xpu_event_create(&event); rc != 0) {
      return XpuStatus(rc, device, "xpu_event_create (for a host function)");
    }
    if (int rc = api_.xpu_event_record(event, stream.handle); rc != 0) {
      (void)api_.xpu_event_destroy(event);
      return XpuStatus(rc, device, "xpu_event_record (for a host function)");
    }
    stream.MarkIssued();
    const uint64_t upto = stream.issued.load(std::memory_order_acquire);
    // The stream outlives its host-function thread (DestroyStream drains it).
    stream.host_funcs.Push(
        [this, device, event, &stream, upto]() -> absl::Status {
          absl::Status status = Use(device);
          if (status.ok()) {
            status = XpuStatus(api_.xpu_event_wait(event), device,
                               "xpu_event_wait (before a host function)");
          }
          (void)api_.xpu_event_destroy(event);
          if (status.ok()) stream.MarkCompleted(upto);
          return status;
        },
        std::move(fn));
    return absl::OkStatus();
  }

  absl::Status NullHostPointer(int device, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(DevicePrefix(device), "the host ", what, " of a copy is a null pointer"));
  }

  absl::Status TooManyStreams(int device, int created) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        DevicePrefix(device), "cannot create a stream: libxpurt allows at most ",
        kunlunxin::kXpuMaxStreams, " streams per process and flagosd holds ", created,
        "; destroy streams you no longer use (torch.flagos.Stream objects)"));
  }

  static const char* XpumlCodeName(int rc) {
    switch (rc) {
      case 1: return "uninitialised";
      case 2: return "invalid argument";
      case 3: return "not supported";
      default: return "unknown";
    }
  }

  // Constant after construction.
  const std::unique_ptr<XpurtLibrary> library_;
  const XpurtApi& api_;
  const uint64_t id_;  // keys this runtime's entries in t_current_device
  const uint64_t memset_chunk_bytes_;
  const std::vector<std::unique_ptr<XpuDevice>> devices_;
  const MemorySource memory_;
  const bool host_register_;
  CapabilityTable capabilities_;

  std::atomic<int> created_streams_{0};
  std::atomic<bool> closing_{false};
};

// Which memory figures to report: libxpuml's when it loads, initialises and
// sees the same devices as libxpurt.
MemorySource ChooseMemorySource(const XpurtLibrary& library, int devices) {
  MemorySource source;
  const XpumlApi* xpuml = library.xpuml();
  if (xpuml == nullptr) {
    source.note = library.xpuml_note();
    return source;
  }
  const char* visible = std::getenv("XPU_VISIBLE_DEVICES");
  if (visible != nullptr && visible[0] != '\0') {
    source.note = "XPU_VISIBLE_DEVICES is set, so libxpuml's device indices may not be libxpurt's";
    return source;
  }
  if (int rc = xpuml->xpumlInit(); rc != 0) {
    source.note = absl::StrCat("xpumlInit failed with code ", rc);
    return source;
  }
  unsigned int count = 0;
  if (int rc = xpuml->xpumlDeviceGetCount(&count); rc != 0) {
    source.note = absl::StrCat("xpumlDeviceGetCount failed with code ", rc);
    return source;
  }
  if (count != static_cast<unsigned int>(devices)) {
    source.note = absl::StrCat("libxpuml reports ", count, " devices and libxpurt ", devices);
    return source;
  }
  for (int i = 0; i < devices; ++i) {
    void* handle = nullptr;
    if (int rc = xpuml->xpumlDeviceGetHandleByIndex(i, &handle); rc != 0 || handle == nullptr) {
      source.note = absl::StrCat("xpumlDeviceGetHandleByIndex(", i, ") failed with code ", rc);
      source.xpuml_devices.clear();
      return source;
    }
    source.xpuml_devices.push_back(handle);
  }
  source.xpuml = xpuml;
  return source;
}

}  // namespace

absl::Status KunlunxinRuntimeParams::Validate() const {
  if (!xpurt_library.empty() && xpurt_library[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "kunlunxin backend: the libxpurt path (FLAGOS_KUNLUNXIN_XPURT) must be absolute, got '",
        xpurt_library, "'"));
  }
  if (memset_chunk_bytes < kMinMemsetChunkBytes || memset_chunk_bytes > kMaxMemsetChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kunlunxin backend: the memset chunk must be between ", kMinMemsetChunkBytes, " and ",
        kMaxMemsetChunkBytes, " bytes, got ", memset_chunk_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateKunlunxinRuntime(
    const KunlunxinRuntimeParams& params) {
  const XpurtSearch search =
      XpurtSearch{params.xpurt_library, params.xpu_root, params.xdnn_lib_dirs}.WithEnvironment();
  KunlunxinRuntimeParams resolved = params;
  resolved.xpurt_library = search.xpurt_file;
  if (absl::Status s = resolved.Validate(); !s.ok()) return s;

  absl::StatusOr<std::unique_ptr<XpurtLibrary>> library = XpurtLibrary::Load(search);
  if (!library.ok()) return library.status();
  const XpurtApi& api = (*library)->api();
  const std::string& path = (*library)->path();

  int count = 0;
  if (int rc = api.xpu_device_count(&count); rc != 0 || count <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kunlunxin backend: libxpurt at ", path, " reports no devices (",
        rc != 0 ? absl::StrCat("xpu_device_count failed: ", XpuCodeText(rc))
                : absl::StrCat("xpu_device_count returned ", count),
        "): is the kunlunxin driver loaded? are /dev/xpu* present, and visible to this process "
        "(containers: pass the devices; XPU_VISIBLE_DEVICES)?"));
  }
  count = std::min(count, kunlunxin::kXpuMaxDevices);

  // What each device is; xpu_device_get_attr reads the current device.
  std::vector<std::unique_ptr<XpuDevice>> devices;
  for (int i = 0; i < count; ++i) {
    if (int rc = api.xpu_set_device(i); rc != 0) return XpuStatus(rc, i, "xpu_set_device");
    uint64_t total = 0;
    uint64_t model = 0;
    if (int rc = api.xpu_device_get_attr(&total, kunlunxin::kXpuAttrMainMemory, i); rc != 0) {
      return XpuStatus(rc, i, "xpu_device_get_attr (main memory)");
    }
    if (int rc = api.xpu_device_get_attr(&model, kunlunxin::kXpuAttrModel, i); rc != 0) {
      return XpuStatus(rc, i, "xpu_device_get_attr (model)");
    }
    devices.push_back(std::make_unique<XpuDevice>(i, total, model));
  }
  // The loop moved this thread's current device without the cache knowing.
  t_current_device = CurrentDevice();

  MemorySource memory = ChooseMemorySource(**library, count);
  return std::unique_ptr<DeviceRuntime>(new KunlunxinRuntime(
      *std::move(library), params.memset_chunk_bytes, std::move(devices), std::move(memory)));
}

}  // namespace flagos

namespace flagos {

KunlunxinStreams* AsKunlunxinStreams(DeviceRuntime& runtime) {
  return dynamic_cast<KunlunxinStreams*>(&runtime);
}

}  // namespace flagos
