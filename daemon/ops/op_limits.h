// Per-op bounds: how many tensor elements one operator call may name, and
// how much host memory its kernel may allocate while it runs
// (--max-op-elements, --max-op-host-memory; docs/reference/errors.md).
//
// A client chooses every tensor's sizes and strides: a view with stride 0
// over a few bytes of a segment can have 2^40 elements, so the memory a
// session holds does not bound the work an op does on it, nor the
// temporaries its kernel makes. These bounds do. Exceeding either fails
// the call with RESOURCE_EXHAUSTED; the session goes on.
//
// No ATen, no state: everything here is a function of its arguments.
#ifndef FLAGOS_DAEMON_OPS_OP_LIMITS_H_
#define FLAGOS_DAEMON_OPS_OP_LIMITS_H_

#include <cstdint>

#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// The defaults, from a device's memory (DefaultOpLimits):
//   elements: max(2^32, 4 x the device's memory in bytes). A dense tensor
//     has at most one element per byte of device memory, and an op names a
//     few of them (inputs, outputs, aliases of one tensor); a stride-0 view
//     naming more is the only way past it.
//   host memory: max(1 GiB, the device's memory). A kernel's temporaries
//     and results are of the size of its operands and results, which live
//     in device memory; the 1 GiB floor keeps small test devices usable.
inline constexpr uint64_t kMinDefaultMaxOpElements = 1ull << 32;
inline constexpr uint64_t kDefaultMaxOpElementsPerDeviceByte = 4;
inline constexpr uint64_t kMinDefaultMaxOpHostMemoryBytes = 1ull << 30;

struct OpLimits {
  // Most tensor elements one call names, summed over every tensor it names
  // (OpCallElements).
  uint64_t max_elements = kMinDefaultMaxOpElements;
  // Most bytes of host memory an op's kernel may hold at once, through the
  // CPU allocator on the thread that runs it (op_host_budget.h).
  uint64_t max_host_memory_bytes = kMinDefaultMaxOpHostMemoryBytes;
};

// The defaults for devices of `device_memory_bytes` each (see above).
OpLimits DefaultOpLimits(uint64_t device_memory_bytes);

// The tensor elements an OpCall names: every tensor and host tensor among
// its arguments (list elements included, nested lists too) and its
// outputs, summed (saturating at 2^64 - 1), and the largest of them. A
// size below 0 counts as 0 (such a descriptor is refused later, naming
// its field); an undefined ref counts nothing.
struct OpCallElements {
  uint64_t total = 0;
  // The tensor with the most elements, and where it is: argument `index`
  // (`element` of its list, or -1), or output `index` when `output`.
  uint64_t largest = 0;
  bool output = false;
  int index = -1;
  int element = -1;
  const google::protobuf::RepeatedField<int64_t>* largest_sizes = nullptr;
};
OpCallElements CountOpCallElements(const v1::OpCall& call);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_LIMITS_H_
