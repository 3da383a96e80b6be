// Every device address a command names, for code that rewrites them: the
// recorder of client messages (message_recorder.h) and the fuzz target that
// replays what it wrote (tests/fuzz). Pure proto; no state.
#ifndef FLAGOS_DAEMON_PROTOCOL_COMMAND_ADDRESSES_H_
#define FLAGOS_DAEMON_PROTOCOL_COMMAND_ADDRESSES_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// Calls `visit(device, addr)` once for each device address `command`
// names, with the device the session checks it against, in a fixed order;
// `visit` may change the address in place:
//   op: every TensorRef among its args (lists, at any depth) and outputs
//       (TensorRef.addr, on TensorRef.device);
//   place_result: dst; free, copy_to_device, copy_from_device, memset,
//   export_memory, release_import, query_export: addr (on command.device);
//   copy_device_to_device: src (on src_device), then dst (on command.device).
//   define_graph: each captured command's, in order.
// Undefined TensorRefs are visited too (their address is not used).
void ForEachDeviceAddress(v1::Command& command,
                          absl::FunctionRef<void(int device, uint64_t& addr)> visit);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_PROTOCOL_COMMAND_ADDRESSES_H_
