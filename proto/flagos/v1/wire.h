// Facts of the flagos v1 wire contract that both ends need in code, so that
// the daemon and the client library (which never include each other) state
// them once:
//   - which commands owe a reply even when they succeed (flagos.proto,
//     Completion);
//   - the length-prefixed frames of the staging socket and the sync channel
//     (a 4-byte little-endian length, then the serialized message), and the
//     raw payloads that may follow a sync-channel frame.
#ifndef FLAGOS_PROTO_FLAGOS_V1_WIRE_H_
#define FLAGOS_PROTO_FLAGOS_V1_WIRE_H_

#include <cstdint>
#include <string>

#include "flagos/v1/flagos.pb.h"
#include "google/protobuf/message_lite.h"

namespace flagos::v1 {

// allocate, copy_from_device (not into a pinned region), sync, query_event,
// synchronize_event, elapsed_time, query_stream, export_memory,
// import_memory, query_export, define_graph, and op with want_values.
bool OwesReply(const Command& command);

// `message` as one frame: the bytes to send.
std::string EncodeFrame(const google::protobuf::MessageLite& message);

// Writes `message` as one frame on the stream socket `fd`; false when the
// peer is gone.
bool WriteFrame(int fd, const google::protobuf::MessageLite& message);

enum class FrameResult { kOk, kClosed, kTooLarge };
// Reads one frame's body from the stream socket `fd` into `body`: kClosed
// when the peer closed the socket (or it was shut down) first, kTooLarge
// when the frame claims more than `max_bytes`.
FrameResult ReadFrame(int fd, uint32_t max_bytes, std::string* body);

// Reads exactly `n` bytes (a raw payload after a frame: SyncRequest and
// Completion's payload_bytes) from the stream socket `fd`; false when the
// peer closed it first.
bool ReadBytes(int fd, char* out, size_t n);

// Writes `frame` and then `payload` on the stream socket `fd` (blocking);
// false when the peer is gone.
bool WriteFrameAndPayload(int fd, const std::string& frame, const char* payload, size_t n);

}  // namespace flagos::v1

#endif  // FLAGOS_PROTO_FLAGOS_V1_WIRE_H_
