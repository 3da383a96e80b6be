// TensorRefs as the unit tests write them: sizes, with contiguous strides
// unless the test gives its own.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon::test_refs {

// Row-major strides, in elements, of a tensor of `sizes`.
inline std::vector<int64_t> ContiguousStrides(std::initializer_list<int64_t> sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= sizes.begin()[i];
  }
  return strides;
}

// A ref at `addr` over `sizes` with `strides` (contiguous when empty).
inline v1::TensorRef MakeRef(uint64_t addr, std::initializer_list<int64_t> sizes, int dtype,
                             int device = 0, std::vector<int64_t> strides = {}) {
  if (strides.empty()) strides = ContiguousStrides(sizes);
  v1::TensorRef ref;
  ref.set_addr(addr);
  ref.set_dtype(dtype);
  ref.set_device(device);
  for (int64_t s : sizes) ref.add_sizes(s);
  for (int64_t s : strides) ref.add_strides(s);
  return ref;
}

}  // namespace flagos::daemon::test_refs
