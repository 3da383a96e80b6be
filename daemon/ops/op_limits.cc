#include "ops/op_limits.h"

#include <algorithm>
#include <limits>

namespace flagos::daemon {
namespace {

constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > kSaturated - b ? kSaturated : a + b; }

uint64_t Numel(const google::protobuf::RepeatedField<int64_t>& sizes) {
  uint64_t numel = 1;
  for (int64_t size : sizes) {
    if (size <= 0) return 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(size), &numel)) numel = kSaturated;
  }
  return numel;
}

// Adds one tensor's elements at (output, index, element).
void Count(const google::protobuf::RepeatedField<int64_t>& sizes, bool output, int index,
           int element, OpCallElements* count) {
  const uint64_t numel = Numel(sizes);
  count->total = SaturatingAdd(count->total, numel);
  if (numel > count->largest) {
    count->largest = numel;
    count->output = output;
    count->index = index;
    count->element = element;
    count->largest_sizes = &sizes;
  }
}

void CountValue(const v1::Value& value, int index, int element, OpCallElements* count) {
  switch (value.v_case()) {
    case v1::Value::kTensor:
      if (!value.tensor().undefined()) Count(value.tensor().sizes(), false, index, element, count);
      return;
    case v1::Value::kHostTensor:
      Count(value.host_tensor().sizes(), false, index, element, count);
      return;
    case v1::Value::kList: {
      const auto& values = value.list().values();
      for (int i = 0; i < values.size(); ++i) {
        // Errors name the top-level element of a nested list.
        CountValue(values[i], index, element < 0 ? i : element, count);
      }
      return;
    }
    default:
      return;
  }
}

}  // namespace

OpLimits DefaultOpLimits(uint64_t device_memory_bytes) {
  OpLimits limits;
  uint64_t elements = kSaturated;
  if (device_memory_bytes <= kSaturated / kDefaultMaxOpElementsPerDeviceByte) {
    elements = device_memory_bytes * kDefaultMaxOpElementsPerDeviceByte;
  }
  limits.max_elements = std::max(kMinDefaultMaxOpElements, elements);
  limits.max_host_memory_bytes = std::max(kMinDefaultMaxOpHostMemoryBytes, device_memory_bytes);
  return limits;
}

OpCallElements CountOpCallElements(const v1::OpCall& call) {
  OpCallElements count;
  for (int i = 0; i < call.args_size(); ++i) CountValue(call.args(i), i, -1, &count);
  for (int i = 0; i < call.outputs_size(); ++i) {
    if (!call.outputs(i).undefined()) Count(call.outputs(i).sizes(), true, i, -1, &count);
  }
  return count;
}

}  // namespace flagos::daemon
