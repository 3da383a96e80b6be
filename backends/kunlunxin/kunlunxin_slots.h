// The kunlunxin backend's capability table: for each of the contract's
// slots, whether libxpurt implements it, the backend emulates it (and how)
// or it is a gap (and why). README.md has the same table with more words.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_KUNLUNXIN_SLOTS_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_KUNLUNXIN_SLOTS_H_

#include <cstdint>
#include <string>

#include "flagos/runtime.h"

namespace flagos::kunlunxin {

// What the table depends on, found when the runtime starts.
struct KunlunxinSlotFacts {
  // libxpurt exports xpu_host_register and xpu_host_unregister.
  bool host_register = false;
  // Memory figures and telemetry come from libxpuml; else memory_note says
  // why not.
  bool xpuml_memory = false;
  std::string memory_note;
  uint64_t memset_chunk_bytes = 16ull << 20;
  // Which optional telemetry calls that libxpuml exports (with xpuml_memory).
  bool xpuml_temperature = false;  // xpumlDeviceGetTemperature
  bool xpuml_power = false;        // xpumlDeviceGetPowerUsage
  bool xpuml_utilization = false;  // xpumlDeviceGetUtilizationRates
};

// Declares every slot of `table`.
void DescribeKunlunxinSlots(const KunlunxinSlotFacts& facts, CapabilityTable* table);

}  // namespace flagos::kunlunxin

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_KUNLUNXIN_SLOTS_H_
