#include "flagos/runtime.h"

#include "absl/strings/str_cat.h"

namespace flagos {

absl::string_view SlotName(Slot slot) {
  switch (slot) {
    case Slot::kGetDeviceCount: return "get_device_count";
    case Slot::kGetDevice: return "get_device";
    case Slot::kSetDevice: return "set_device";
    case Slot::kDeviceGetStreamPriorityRange: return "device_get_stream_priority_range";
    case Slot::kDeviceSynchronize: return "device_synchronize";
    case Slot::kMalloc: return "malloc";
    case Slot::kFree: return "free";
    case Slot::kMallocHost: return "malloc_host";
    case Slot::kFreeHost: return "free_host";
    case Slot::kMemcpy: return "memcpy";
    case Slot::kMemcpyAsync: return "memcpy_async";
    case Slot::kPointerGetAttributes: return "pointer_get_attributes";
    case Slot::kMemset: return "memset";
    case Slot::kMemsetAsync: return "memset_async";
    case Slot::kStreamCreateWithPriority: return "stream_create_with_priority";
    case Slot::kStreamCreate: return "stream_create";
    case Slot::kStreamGetPriority: return "stream_get_priority";
    case Slot::kStreamDestroy: return "stream_destroy";
    case Slot::kStreamQuery: return "stream_query";
    case Slot::kStreamSynchronize: return "stream_synchronize";
    case Slot::kStreamWaitEvent: return "stream_wait_event";
    case Slot::kEventCreateWithFlags: return "event_create_with_flags";
    case Slot::kEventCreate: return "event_create";
    case Slot::kEventDestroy: return "event_destroy";
    case Slot::kEventRecord: return "event_record";
    case Slot::kEventSynchronize: return "event_synchronize";
    case Slot::kEventQuery: return "event_query";
    case Slot::kEventElapsedTime: return "event_elapsed_time";
    case Slot::kDeviceProperties: return "device_properties";
    case Slot::kMemoryInfo: return "memory_info";
    case Slot::kHostRegister: return "host_register";
    case Slot::kHostAddress: return "host_address";
    case Slot::kLaunchHostFunc: return "launch_host_func";
    case Slot::kStreamDrain: return "stream_drain";
    case Slot::kDeviceTelemetry: return "device_telemetry";
  }
  return "unknown_slot";
}

absl::string_view SlotGroup(Slot slot) {
  const int i = static_cast<int>(slot);
  if (i < 5) return "device";
  if (i < 14) return "memory";
  if (i < 21) return "stream";
  if (i < kSeedSlotCount) return "event";
  return "flagosd";
}

absl::string_view SlotStatusName(SlotStatus status) {
  switch (status) {
    case SlotStatus::kGap: return "gap";
    case SlotStatus::kImplemented: return "implemented";
    case SlotStatus::kEmulated: return "emulated";
  }
  return "unknown";
}

const std::string& CapabilityTable::GapReason(Slot slot) const {
  static const std::string* const kNone = new std::string();
  static const std::string* const kUndeclared = new std::string("not declared by the backend");
  const Entry& entry = entries_[static_cast<int>(slot)];
  if (entry.status != SlotStatus::kGap) return *kNone;
  return entry.declared ? entry.note : *kUndeclared;
}

std::vector<std::string> CapabilityTable::ImplementedNames() const {
  std::vector<std::string> names;
  for (int i = 0; i < kSlotCount; ++i) {
    if (Has(static_cast<Slot>(i))) names.emplace_back(SlotName(static_cast<Slot>(i)));
  }
  return names;
}

std::vector<std::string> CapabilityTable::GapDescriptions() const {
  // A slot a backend neither implemented nor declared is a gap too: the
  // daemon must not report it as available.
  std::vector<std::string> gaps;
  for (int i = 0; i < kSlotCount; ++i) {
    const Slot slot = static_cast<Slot>(i);
    if (Has(slot)) continue;
    gaps.push_back(absl::StrCat(SlotName(slot), ": ", GapReason(slot)));
  }
  return gaps;
}

absl::Status SlotGapError(absl::string_view backend, const CapabilityTable& table, Slot slot) {
  return absl::UnimplementedError(absl::StrCat(backend, " backend: ", SlotName(slot),
                                               " is not supported (", table.GapReason(slot), ")"));
}

}  // namespace flagos
