#include "flagos/runtime.h"

namespace flagos {

absl::string_view SlotName(Slot slot) {
  switch (slot) {
    case Slot::kDeviceCount: return "device_count";
    case Slot::kDeviceProperties: return "device_properties";
    case Slot::kSetDevice: return "set_device";
    case Slot::kCurrentDevice: return "current_device";
    case Slot::kDeviceSynchronize: return "device_synchronize";
    case Slot::kMalloc: return "malloc";
    case Slot::kFree: return "free";
    case Slot::kMemoryInfo: return "memory_info";
    case Slot::kCopyHostToDevice: return "copy_host_to_device";
    case Slot::kCopyDeviceToHost: return "copy_device_to_host";
    case Slot::kCopyDeviceToDevice: return "copy_device_to_device";
    case Slot::kMemset: return "memset";
    case Slot::kHostRegister: return "host_register";
    case Slot::kHostAddress: return "host_address";
    case Slot::kStreamCreate: return "stream_create";
    case Slot::kStreamDestroy: return "stream_destroy";
    case Slot::kStreamSynchronize: return "stream_synchronize";
    case Slot::kStreamQuery: return "stream_query";
    case Slot::kStreamWaitEvent: return "stream_wait_event";
    case Slot::kStreamPriority: return "stream_priority";
    case Slot::kStreamCallback: return "stream_callback";
    case Slot::kEventCreate: return "event_create";
    case Slot::kEventDestroy: return "event_destroy";
    case Slot::kEventRecord: return "event_record";
    case Slot::kEventQuery: return "event_query";
    case Slot::kEventSynchronize: return "event_synchronize";
    case Slot::kEventElapsedTime: return "event_elapsed_time";
    case Slot::kEventIpc: return "event_ipc";
  }
  return "unknown_slot";
}

std::vector<std::string> CapabilityTable::ImplementedNames() const {
  std::vector<std::string> names;
  for (int i = 0; i < kSlotCount; ++i) {
    if (implemented_[i]) names.emplace_back(SlotName(static_cast<Slot>(i)));
  }
  return names;
}

std::vector<std::string> CapabilityTable::GapDescriptions() const {
  // A slot a backend neither implemented nor declared is a gap too: the
  // daemon must not report it as available.
  std::vector<std::string> gaps;
  for (int i = 0; i < kSlotCount; ++i) {
    if (implemented_[i]) continue;
    std::string description(SlotName(static_cast<Slot>(i)));
    description += ": ";
    description += gaps_[i].empty() ? "not declared by the backend" : gaps_[i];
    gaps.push_back(std::move(description));
  }
  return gaps;
}

}  // namespace flagos
