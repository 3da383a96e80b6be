// The device runtime contract every flagosd backend implements.
//
// It covers the seeds' 28-slot runtime contract (device 5, memory 9, stream 7,
// event 7) plus seven slots flagosd adds (device properties, memory info,
// host register, host address, host callback, stream drain, device
// telemetry), as a C++ interface with an
// explicit device argument on every call: the daemon serves many sessions
// from many threads, so no thread-local "current device" exists here (a
// backend whose vendor runtime has one sets it itself before every call).
//
// Each slot is, per backend, implemented, emulated (built from other vendor
// calls; the table says how) or a declared gap (the table says why): see
// CapabilityTable. A gap's method returns absl::UnimplementedError naming
// the slot and the backend. A slot that returns OK without doing the work is
// a defect; tests/conformance/ checks every backend against this contract.
//
// ---- When work is complete (the part real accelerators make matter)
//
// Device memory may not be addressable by the host (HostAddress returns
// nullptr): the daemon never dereferences a DevicePtr.
//
// Calls that take a stream ISSUE work and may return before it has run:
// copies, memset, RecordEvent, StreamWaitEvent, LaunchHostFunc and the
// OpExecutor's kernels. Work issued to one stream runs in issue order; work
// on different streams runs in any order unless ordered by events. Such a
// call's work is complete once, and only once, one of these says so:
//   - SynchronizeStream / SynchronizeDevice returned OK after the call;
//   - QueryStream returned true after the call;
//   - an event recorded on the stream after the call completed
//     (QueryEvent true, SynchronizeEvent returned);
//   - a LaunchHostFunc issued on the stream after the call ran its function.
// A host function is complete once it has returned: DrainStream is the one
// call that waits for that (SynchronizeStream waits for the device only).
// Host memory given to an issued call belongs to the device until then:
// the source of a host→device copy must stay valid and unchanged, the
// destination of a device→host copy must stay valid and is not to be read.
// A backend whose work is complete when the call returns (the CPU backend)
// satisfies this trivially; callers must not rely on it.
//
// Errors: a call that cannot issue its work returns the error at once.
// An error the device hits while running issued work is returned by the next
// synchronisation of that stream (or of the device).
//
// Free REQUIRES that no issued, incomplete work uses the memory (the daemon
// waits for completion first); DestroyStream waits for the stream itself.
//
// Thread safety: every method may be called concurrently from any thread,
// except that calls issuing work to the same stream are serialised by the
// caller. Backends know nothing of gRPC or of sessions.
#ifndef FLAGOS_BACKENDS_RUNTIME_H_
#define FLAGOS_BACKENDS_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos {

// A device address. Never dereferenced by the daemon except through
// DeviceRuntime::HostAddress (backends whose memory the host can address).
using DevicePtr = uint64_t;
// Opaque backend handles. Stream 0 is the device's default stream, which
// every backend has; other streams come from CreateStream.
using StreamHandle = uint64_t;
using EventHandle = uint64_t;

struct DeviceProperties {
  int index = 0;
  std::string name;
  uint64_t total_memory = 0;  // bytes
};

struct MemoryInfo {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// What a device's management library reports about it (on the P800,
// libxpuml). Each figure is absent when the library does not report it:
// never estimated.
struct DeviceTelemetry {
  std::optional<double> temperature_celsius;
  std::optional<double> power_watts;
  std::optional<double> utilization;  // 0..1: the fraction of time kernels ran
  std::optional<uint64_t> memory_total_bytes;
  std::optional<uint64_t> memory_used_bytes;
};

// The slots, by group: first the seeds' 28 (in the seeds' order), then the
// ones flagosd adds. Names are the ones reported by the daemon and listed
// in docs/reference/backends.md.
enum class Slot {
  // device (5)
  kGetDeviceCount, kGetDevice, kSetDevice, kDeviceGetStreamPriorityRange, kDeviceSynchronize,
  // memory (9)
  kMalloc, kFree, kMallocHost, kFreeHost, kMemcpy, kMemcpyAsync, kPointerGetAttributes,
  kMemset, kMemsetAsync,
  // stream (7)
  kStreamCreateWithPriority, kStreamCreate, kStreamGetPriority, kStreamDestroy, kStreamQuery,
  kStreamSynchronize, kStreamWaitEvent,
  // event (7)
  kEventCreateWithFlags, kEventCreate, kEventDestroy, kEventRecord, kEventSynchronize,
  kEventQuery, kEventElapsedTime,
  // flagosd's own
  kDeviceProperties, kMemoryInfo, kHostRegister, kHostAddress, kLaunchHostFunc,
  kStreamDrain, kDeviceTelemetry,
};
inline constexpr int kSeedSlotCount = 28;
inline constexpr int kSlotCount = static_cast<int>(Slot::kDeviceTelemetry) + 1;
absl::string_view SlotName(Slot slot);
// "device", "memory", "stream", "event" or "flagosd".
absl::string_view SlotGroup(Slot slot);

enum class SlotStatus {
  kGap,          // not available: the method returns UNIMPLEMENTED
  kImplemented,  // one vendor call (or the CPU's own code) does it
  kEmulated,     // built from other calls; the note says how
};
absl::string_view SlotStatusName(SlotStatus status);

// What a backend does for each slot, and how (or why not).
class CapabilityTable {
 public:
  void Implement(Slot slot, std::string how) { Set(slot, SlotStatus::kImplemented, std::move(how)); }
  void Emulate(Slot slot, std::string how) { Set(slot, SlotStatus::kEmulated, std::move(how)); }
  void DeclareGap(Slot slot, std::string why) { Set(slot, SlotStatus::kGap, std::move(why)); }

  // Implemented or emulated.
  bool Has(Slot slot) const { return status(slot) != SlotStatus::kGap; }
  SlotStatus status(Slot slot) const { return entries_[static_cast<int>(slot)].status; }
  // How it is done, or why it is a gap; empty when the backend said nothing.
  const std::string& Note(Slot slot) const { return entries_[static_cast<int>(slot)].note; }
  // Empty when the slot is available.
  const std::string& GapReason(Slot slot) const;
  // True once the backend described the slot (Implement/Emulate/DeclareGap).
  bool Declared(Slot slot) const { return entries_[static_cast<int>(slot)].declared; }

  // "slot_name" for each available slot / "slot_name: reason" for each gap
  // (undeclared slots are gaps "not declared by the backend").
  std::vector<std::string> ImplementedNames() const;
  std::vector<std::string> GapDescriptions() const;

 private:
  struct Entry {
    bool declared = false;
    SlotStatus status = SlotStatus::kGap;
    std::string note;
  };
  void Set(Slot slot, SlotStatus status, std::string note) {
    entries_[static_cast<int>(slot)] = Entry{true, status, std::move(note)};
  }
  Entry entries_[kSlotCount];
};

// UNIMPLEMENTED "<backend> backend: <slot> is not supported (<reason>)".
absl::Status SlotGapError(absl::string_view backend, const CapabilityTable& table, Slot slot);

class DeviceRuntime {
 public:
  // A function run once issued work has completed (LaunchHostFunc). Its
  // argument is OK, or the first error the device reported for the
  // stream's work before it.
  using HostFunc = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~DeviceRuntime() = default;

  // "cpu", "cuda", "kunlunxin".
  virtual absl::string_view name() const = 0;
  virtual const CapabilityTable& capabilities() const = 0;

  // ---- device
  virtual int DeviceCount() const = 0;
  virtual absl::StatusOr<DeviceProperties> GetDeviceProperties(int device) const = 0;
  // Blocks until all work issued to `device` on any stream has completed.
  virtual absl::Status SynchronizeDevice(int device) = 0;

  // ---- memory (synchronous)
  // RESOURCE_EXHAUSTED when the device cannot hold `nbytes` more. The
  // memory's contents are unspecified (a device's allocator hands out what
  // another session freed) unless MallocReturnsZeroes(); flagosd clears
  // it before a session sees it.
  virtual absl::StatusOr<DevicePtr> Malloc(int device, uint64_t nbytes) = 0;
  // True when every Malloc returns memory of zeroes (never used before), so
  // flagosd need not clear it.
  virtual bool MallocReturnsZeroes() const { return false; }
  // REQUIRES: `ptr` was returned by Malloc(device, ...), is not freed since,
  // and no incomplete work uses it.
  virtual absl::Status Free(int device, DevicePtr ptr) = 0;
  virtual absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const = 0;
  // The device's own figures (temperature, power, utilisation, memory) as
  // its management library reports them; a gap (UNIMPLEMENTED) on backends
  // without one. Cheap enough to call at every metrics scrape.
  virtual absl::StatusOr<DeviceTelemetry> GetTelemetry(int device) const = 0;
  // Pins [ptr, ptr + nbytes) of host memory for DMA until HostUnregister
  // (the daemon registers staging regions and pinned host regions). Copies
  // work from unregistered memory too; registering only makes them faster.
  // Gap on backends that have nothing to pin.
  virtual absl::Status HostRegister(void* ptr, uint64_t nbytes) = 0;
  virtual absl::Status HostUnregister(void* ptr) = 0;
  // The host address of device memory, for backends whose memory the host
  // can address (the CPU backend); nullptr otherwise.
  virtual void* HostAddress(int device, DevicePtr ptr) const = 0;

  // ---- memory (issued on `stream`; complete as the header comment says)
  // REQUIRES: ranges were validated by the caller against live allocations.
  virtual absl::Status CopyHostToDevice(int device, StreamHandle stream, DevicePtr dst,
                                        const void* src, uint64_t nbytes) = 0;
  virtual absl::Status CopyDeviceToHost(int device, StreamHandle stream, void* dst,
                                        DevicePtr src, uint64_t nbytes) = 0;
  // `src` is on `src_device`; the copy is ordered on `stream` of `device`
  // only. The caller orders it after the work that writes `src`.
  virtual absl::Status CopyDeviceToDevice(int device, StreamHandle stream, DevicePtr dst,
                                          int src_device, DevicePtr src, uint64_t nbytes) = 0;
  virtual absl::Status Memset(int device, StreamHandle stream, DevicePtr dst, uint8_t value,
                              uint64_t nbytes) = 0;

  // ---- stream
  virtual absl::StatusOr<StreamHandle> CreateStream(int device) = 0;
  // Waits for the stream's work and runs its pending host functions, then
  // destroys it. The default stream (0) cannot be destroyed.
  virtual absl::Status DestroyStream(int device, StreamHandle stream) = 0;
  // Blocks until all work issued to `stream` has completed on the device;
  // returns the first error that work hit. Host functions issued before may
  // still be running (they run on the backend's threads): a caller that
  // holds what such a function needs must not wait for it here.
  virtual absl::Status SynchronizeStream(int device, StreamHandle stream) = 0;
  // true when all work issued to `stream` has completed. Does not block.
  // Once a synchronisation, a completed event recorded last on the stream or
  // a host function issued last has shown the work complete, it answers
  // true until more work is issued (an emulation must not add latency of
  // its own to that answer).
  virtual absl::StatusOr<bool> QueryStream(int device, StreamHandle stream) = 0;
  // Work issued to `stream` after this call waits for `event`'s latest
  // record (issued on any stream of the same device) to complete. The host
  // does not block.
  virtual absl::Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) = 0;
  // Issues `fn` on `stream`: it runs, on a thread of the backend's or in the
  // calling thread, once all work issued to `stream` before it has
  // completed (whether that work succeeded or not), exactly once. `fn` must
  // not block on the device, must not wait for anything a thread holding up
  // the stream may hold, and must not issue work to `stream`; it may call
  // any other method. Host functions of one stream run in issue order. On
  // an error return `fn` was not run and never will be (what it holds is
  // destroyed with it).
  virtual absl::Status LaunchHostFunc(int device, StreamHandle stream, HostFunc fn) = 0;
  // SynchronizeStream, and then blocks until every host function issued to
  // `stream` before the call has returned (not those issued after it), so
  // that what they did (a reply posted, a buffer released) is visible to
  // the caller. Returns SynchronizeStream's status. FAILED_PRECONDITION
  // when called from one of `stream`'s own host functions (it would wait
  // for itself).
  // REQUIRES: the caller holds nothing those host functions may wait for.
  virtual absl::Status DrainStream(int device, StreamHandle stream) = 0;

  // ---- event
  virtual absl::StatusOr<EventHandle> CreateEvent(int device, bool enable_timing) = 0;
  virtual absl::Status DestroyEvent(int device, EventHandle event) = 0;
  // Issues the record on `stream`: the event completes when the work issued
  // to `stream` before it has.
  virtual absl::Status RecordEvent(int device, EventHandle event, StreamHandle stream) = 0;
  // true when the latest record has completed (or the event was never
  // recorded, as in CUDA). Does not block.
  virtual absl::StatusOr<bool> QueryEvent(int device, EventHandle event) = 0;
  // Blocks until the latest record has completed.
  virtual absl::Status SynchronizeEvent(int device, EventHandle event) = 0;
  // Milliseconds between two completed records of timing events.
  virtual absl::StatusOr<float> ElapsedTime(int device, EventHandle start, EventHandle end) = 0;
};

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_RUNTIME_H_
