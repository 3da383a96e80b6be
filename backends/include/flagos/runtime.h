// The device runtime contract every flagosd backend implements.
//
// It mirrors the seeds' 28-slot runtime contract (device 5, memory 9, stream 7,
// event 7) as a C++ interface with an explicit device argument on every call:
// the daemon serves many sessions from many threads, so no thread-local
// "current device" exists here.
//
// A backend either implements a slot or declares it a capability gap in
// capabilities(); a gap returns absl::UnimplementedError naming the slot and
// the backend. A slot that returns OK without doing the work is a defect.
//
// Thread safety: every method may be called concurrently from any thread,
// except that calls naming the same stream are serialised by the caller.
// Backends know nothing of gRPC or of sessions.
#ifndef FLAGOS_BACKENDS_RUNTIME_H_
#define FLAGOS_BACKENDS_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos {

// A device address. Never dereferenced by the daemon except through
// DeviceRuntime::HostAddress (backends whose memory the host can address).
using DevicePtr = uint64_t;
// Opaque backend handles; 0 is the device's default (null) stream.
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

// The runtime slots of the contract, by group. Names are the ones reported by
// the daemon and listed in docs/reference/backends.md.
enum class Slot {
  // device
  kDeviceCount, kDeviceProperties, kSetDevice, kCurrentDevice, kDeviceSynchronize,
  // memory
  kMalloc, kFree, kMemoryInfo, kCopyHostToDevice, kCopyDeviceToHost,
  kCopyDeviceToDevice, kMemset, kHostRegister, kHostAddress,
  // stream
  kStreamCreate, kStreamDestroy, kStreamSynchronize, kStreamQuery,
  kStreamWaitEvent, kStreamPriority, kStreamCallback,
  // event
  kEventCreate, kEventDestroy, kEventRecord, kEventQuery, kEventSynchronize,
  kEventElapsedTime, kEventIpc,
};
inline constexpr int kSlotCount = static_cast<int>(Slot::kEventIpc) + 1;
absl::string_view SlotName(Slot slot);

// Which slots a backend implements; for each gap, why.
class CapabilityTable {
 public:
  void Implement(Slot slot) { gaps_[static_cast<int>(slot)].clear(); implemented_[static_cast<int>(slot)] = true; }
  void DeclareGap(Slot slot, std::string why) {
    implemented_[static_cast<int>(slot)] = false;
    gaps_[static_cast<int>(slot)] = std::move(why);
  }
  bool Has(Slot slot) const { return implemented_[static_cast<int>(slot)]; }
  // Empty when implemented.
  const std::string& GapReason(Slot slot) const { return gaps_[static_cast<int>(slot)]; }
  // "slot_name" for each implemented slot / "slot_name: reason" for each gap.
  std::vector<std::string> ImplementedNames() const;
  std::vector<std::string> GapDescriptions() const;

 private:
  bool implemented_[kSlotCount] = {};
  std::string gaps_[kSlotCount];
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  // "cpu", "cuda", "kunlunxin".
  virtual absl::string_view name() const = 0;
  virtual const CapabilityTable& capabilities() const = 0;

  // ---- device
  virtual int DeviceCount() const = 0;
  virtual absl::StatusOr<DeviceProperties> GetDeviceProperties(int device) const = 0;
  // Waits until all work issued to `device` on any stream has completed.
  virtual absl::Status SynchronizeDevice(int device) = 0;

  // ---- memory
  // RESOURCE_EXHAUSTED when the device cannot hold `nbytes` more.
  virtual absl::StatusOr<DevicePtr> Malloc(int device, uint64_t nbytes) = 0;
  // REQUIRES: `ptr` was returned by Malloc(device, ...) and not freed since.
  virtual absl::Status Free(int device, DevicePtr ptr) = 0;
  virtual absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const = 0;
  // Copies are ordered on `stream`; REQUIRES: ranges were validated by the
  // caller against live allocations.
  virtual absl::Status CopyHostToDevice(int device, StreamHandle stream, DevicePtr dst,
                                        const void* src, uint64_t nbytes) = 0;
  virtual absl::Status CopyDeviceToHost(int device, StreamHandle stream, void* dst,
                                        DevicePtr src, uint64_t nbytes) = 0;
  virtual absl::Status CopyDeviceToDevice(int device, StreamHandle stream, DevicePtr dst,
                                          int src_device, DevicePtr src, uint64_t nbytes) = 0;
  virtual absl::Status Memset(int device, StreamHandle stream, DevicePtr dst, uint8_t value,
                              uint64_t nbytes) = 0;
  // The host address of device memory, for backends whose memory the host
  // can address (the CPU backend); nullptr otherwise.
  virtual void* HostAddress(int device, DevicePtr ptr) const = 0;

  // ---- stream
  virtual absl::StatusOr<StreamHandle> CreateStream(int device) = 0;
  virtual absl::Status DestroyStream(int device, StreamHandle stream) = 0;
  virtual absl::Status SynchronizeStream(int device, StreamHandle stream) = 0;
  // true when all work issued to `stream` has completed.
  virtual absl::StatusOr<bool> QueryStream(int device, StreamHandle stream) = 0;
  virtual absl::Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) = 0;

  // ---- event
  virtual absl::StatusOr<EventHandle> CreateEvent(int device, bool enable_timing) = 0;
  virtual absl::Status DestroyEvent(int device, EventHandle event) = 0;
  virtual absl::Status RecordEvent(int device, EventHandle event, StreamHandle stream) = 0;
  virtual absl::StatusOr<bool> QueryEvent(int device, EventHandle event) = 0;
  virtual absl::Status SynchronizeEvent(int device, EventHandle event) = 0;
  // Milliseconds between two recorded timing events.
  virtual absl::StatusOr<float> ElapsedTime(int device, EventHandle start, EventHandle end) = 0;
};

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_RUNTIME_H_
