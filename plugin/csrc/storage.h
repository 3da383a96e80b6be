// Storage of flagos tensors.
#pragma once

#include <c10/core/Storage.h>

#include <cstddef>

namespace torch_fl {

// Grows or shrinks `storage` to `nbytes`, keeping its leading contents (the
// copy runs in the daemon, ordered before any later use). Implemented in
// minimal_ops.cpp.
void ResizeStorageBytes(const c10::Storage& storage, size_t nbytes);

}  // namespace torch_fl
