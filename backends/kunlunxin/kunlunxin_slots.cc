#include "kunlunxin_slots.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flagos::kunlunxin {
namespace {

constexpr char kElapsedTimeGap[] =
    "libxpurt has no event elapsed-time call: not supported by the kunlunxin backend; time on "
    "the host around torch.flagos.synchronize() instead";
constexpr char kNoPriorities[] =
    "libxpurt has no stream priorities (xpu_stream_create takes none; the P800's export list has "
    "no priority call)";

// device_telemetry: libxpuml's figures, each one only when this libxpuml
// exports its call.
void DescribeTelemetry(const KunlunxinSlotFacts& facts, CapabilityTable* t) {
  if (!facts.xpuml_memory) {
    t->DeclareGap(Slot::kDeviceTelemetry,
                  absl::StrCat("the device's temperature, power and utilisation come only from "
                               "libxpuml, the device management library, which is not used: ",
                               facts.memory_note,
                               "; flagosd's own metrics still count the memory it allocated"));
    return;
  }
  struct Figure {
    bool exported;
    const char* what;
    const char* call;
    const char* unit;
  };
  const Figure figures[] = {
      {facts.xpuml_temperature, "temperature", "xpumlDeviceGetTemperature",
       "sensor 0: the XPU die, degrees C"},
      {facts.xpuml_power, "power", "xpumlDeviceGetPowerUsage", "milliwatts"},
      {facts.xpuml_utilization, "utilisation", "xpumlDeviceGetUtilizationRates",
       "percent of the last sample period"},
      {true, "memory total/used", "xpumlDeviceGetMemoryInfo", "global memory, every process"},
  };
  std::vector<std::string> provided;
  std::vector<std::string> absent;
  for (const Figure& f : figures) {
    if (f.exported) {
      provided.push_back(absl::StrCat(f.what, " (", f.call, ", ", f.unit, ")"));
    } else {
      absent.push_back(absl::StrCat(f.what, " (this libxpuml does not export ", f.call, ")"));
    }
  }
  std::string note = absl::StrCat("libxpuml: ", absl::StrJoin(provided, ", "));
  if (!absent.empty()) absl::StrAppend(&note, "; absent: ", absl::StrJoin(absent, ", "));
  absl::StrAppend(&note,
                  "; a figure whose call fails (e.g. 3, not supported) is absent, never estimated");
  t->Implement(Slot::kDeviceTelemetry, std::move(note));
}

}  // namespace

void DescribeKunlunxinSlots(const KunlunxinSlotFacts& facts, CapabilityTable* t) {
  constexpr char kCurrentDevice[] =
      "xpu_set_device before every call on the calling thread (the vendor's current device is "
      "per thread); the contract passes devices explicitly";
  t->Implement(Slot::kGetDeviceCount,
               "xpu_device_count (at most 64, the vendor's MAX_DEVICE_NUM)");
  t->Implement(Slot::kGetDevice, kCurrentDevice);
  t->Implement(Slot::kSetDevice, kCurrentDevice);
  t->DeclareGap(Slot::kDeviceGetStreamPriorityRange, kNoPriorities);
  t->Emulate(Slot::kDeviceSynchronize,
             "libxpurt has no device synchronize: xpu_wait on the device's NULL stream and on "
             "every stream this runtime created on it");
  t->Implement(Slot::kMalloc, "xpu_malloc (kind 0: main memory/HBM)");
  t->Implement(Slot::kFree, "xpu_free");
  constexpr char kPinned[] =
      "flagosd pins memory it already has (host_register) instead of allocating pinned memory";
  t->DeclareGap(Slot::kMallocHost, kPinned);
  t->DeclareGap(Slot::kFreeHost, kPinned);
  t->Emulate(Slot::kMemcpy,
             "the contract's copies are issued on a stream: a synchronous copy is "
             "xpu_memcpy_async then xpu_wait (SynchronizeStream)");
  t->Implement(Slot::kMemcpyAsync,
               "xpu_memcpy_async (host to device kind 1, device to host 0, device to device 2); "
               "across devices emulated: xpu_wait on the stream, then the synchronous "
               "xpu_memcpy_peer");
  t->DeclareGap(Slot::kPointerGetAttributes,
                "xpu_pointer_get_attrs is exported but its prototype is not public; flagosd's "
                "segment table knows every device pointer it handed out");
  const std::string kMemset = absl::StrCat(
      "libxpurt has no memset: stream-ordered host to device copies (xpu_memcpy_async, chunks "
      "of at most ",
      facts.memset_chunk_bytes % (1 << 20) == 0
          ? absl::StrCat(facts.memset_chunk_bytes >> 20, " MiB")
          : absl::StrCat(facts.memset_chunk_bytes, " bytes"),
      ") from one host buffer filled with the value, released by a host function once the "
      "stream has reached the copies");
  t->Emulate(Slot::kMemset, absl::StrCat(kMemset, "; synchronous: then xpu_wait"));
  t->Emulate(Slot::kMemsetAsync, kMemset);
  t->DeclareGap(Slot::kStreamCreateWithPriority, kNoPriorities);
  t->Implement(Slot::kStreamCreate,
               "xpu_stream_create (at most 256 streams per process, the vendor's limit)");
  t->DeclareGap(Slot::kStreamGetPriority, kNoPriorities);
  t->Implement(Slot::kStreamDestroy,
               "xpu_wait, then the stream's pending host functions run, then xpu_stream_destroy");
  t->Emulate(Slot::kStreamQuery,
             "libxpurt has no stream query: an event recorded on the stream, then "
             "xpu_event_query (0 complete, 716 busy); a stream seen idle with nothing issued "
             "since answers without a call");
  t->Implement(Slot::kStreamSynchronize, "xpu_wait(stream)");
  t->Implement(Slot::kStreamWaitEvent,
               "xpu_stream_wait_event (an event never recorded is nothing to wait for)");
  t->Implement(Slot::kEventCreateWithFlags,
               "xpu_event_create (libxpurt events take no flags): timing flag accepted; elapsed "
               "time is a gap");
  t->Implement(Slot::kEventCreate, "xpu_event_create");
  t->Implement(Slot::kEventDestroy, "xpu_event_destroy");
  t->Implement(Slot::kEventRecord, "xpu_event_record");
  t->Implement(Slot::kEventSynchronize, "xpu_event_wait (an event never recorded is complete)");
  t->Implement(Slot::kEventQuery,
               "xpu_event_query (0 complete, 716 pending; an event never recorded is complete)");
  t->DeclareGap(Slot::kEventElapsedTime, kElapsedTimeGap);
  t->Implement(Slot::kDeviceProperties,
               "xpu_device_get_attr model (4) and main memory (5), after xpu_set_device (the "
               "call reads the current device)");
  if (facts.xpuml_memory) {
    t->Emulate(Slot::kMemoryInfo,
               "libxpuml's global memory figures (xpumlDeviceGetMemoryInfo): the whole device, "
               "every process");
  } else {
    t->Emulate(Slot::kMemoryInfo,
               absl::StrCat("total from xpu_device_get_attr (5), free = total minus the bytes "
                            "this runtime allocated: counts only flagosd's own allocations (",
                            facts.memory_note, ")"));
  }
  if (facts.host_register) {
    t->Implement(Slot::kHostRegister, "xpu_host_register (flags 0) / xpu_host_unregister");
  } else {
    t->DeclareGap(Slot::kHostRegister,
                  "this libxpurt does not export xpu_host_register/xpu_host_unregister; copies "
                  "work from unpinned memory");
  }
  t->DeclareGap(Slot::kHostAddress, "kunlunxin device memory is not addressable by the host");
  t->Emulate(Slot::kLaunchHostFunc,
             "libxpurt has no host callback: an event recorded on the stream; a thread per "
             "stream waits for it (xpu_event_wait) and runs the functions in issue order");
  t->Emulate(Slot::kStreamDrain,
             "xpu_wait on the stream, then waits until the stream's host-function thread has "
             "returned from every function issued before the call");
  DescribeTelemetry(facts, t);
}

}  // namespace flagos::kunlunxin
