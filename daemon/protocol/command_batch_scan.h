// Reads the framing of a session message that carries a CommandBatch by
// hand, without protobuf's parser: where each command's bytes are and, for
// the commonest command (an op call and nothing else, as the client writes
// every asynchronous op: plugin/csrc/op_call_wire.h), its seq, device,
// stream and the bytes of its OpCall. The session then looks the OpCall
// bytes up among the calls it prepared (sessions/repeated_op_calls.h), and
// parses with protobuf only the commands it did not find.
//
// It accepts only what protobuf reads the same way; anything else is left
// to protobuf, which decides whether it is valid:
//   - the message is not exactly one field 2 (batch) whose contents are
//     only field 1 (commands) entries, each length-delimited and inside the
//     message (ScanCommandBatch returns false: parse the whole message);
//   - a command has any field but seq (1), device (2), stream (3), each a
//     varint, and op (11) once, length-delimited (`op_only` false: parse
//     that command).
// A field that repeats takes its last value, as protobuf does (seq, device,
// stream); an op field that repeats would be merged by protobuf, so such a
// command is not op_only. device is an int32: the varint's low 32 bits.
//
// No ATen, no gRPC, no state.
#ifndef FLAGOS_DAEMON_PROTOCOL_COMMAND_BATCH_SCAN_H_
#define FLAGOS_DAEMON_PROTOCOL_COMMAND_BATCH_SCAN_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace flagos::daemon {

struct ScannedCommand {
  // The command's bytes (a flagos.v1.Command), inside the message.
  absl::string_view bytes;
  // Set when the command is an op call and nothing else; then the fields
  // below are its values and `op` the bytes of its OpCall.
  bool op_only = false;
  uint64_t seq = 0;
  int32_t device = 0;
  uint64_t stream = 0;
  absl::string_view op;
};

// Scans `message` (a serialized flagos.v1.ClientMessage) into `commands`
// (cleared first; its capacity is reused). False when the message is not a
// plain batch as above: the caller parses it with protobuf instead.
bool ScanCommandBatch(absl::string_view message, std::vector<ScannedCommand>* commands);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_PROTOCOL_COMMAND_BATCH_SCAN_H_
