#include "protocol/command_batch_scan.h"

namespace flagos::daemon {
namespace {

// Wire tags of the fields read here (field number << 3 | wire type), each
// one byte: anything else is left to protobuf.
constexpr unsigned char kBatchTag = 2 << 3 | 2;     // ClientMessage.batch
constexpr unsigned char kCommandTag = 1 << 3 | 2;   // CommandBatch.commands
constexpr unsigned char kSeqTag = 1 << 3 | 0;       // Command.seq
constexpr unsigned char kDeviceTag = 2 << 3 | 0;    // Command.device
constexpr unsigned char kStreamTag = 3 << 3 | 0;    // Command.stream
constexpr unsigned char kOpTag = 11 << 3 | 2;       // Command.op

// A varint at *p (before end): at most 10 bytes, the tenth 0 or 1, as
// protobuf reads a 64-bit one. False when it is not one.
inline bool ReadVarint(const unsigned char*& p, const unsigned char* end, uint64_t* value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p == end) return false;
    const unsigned char byte = *p++;
    if (shift == 63 && byte > 1) return false;
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (byte < 0x80) {
      *value = v;
      return true;
    }
  }
  return false;
}

// A length-delimited field's contents after its tag.
inline bool ReadBytes(const unsigned char*& p, const unsigned char* end, absl::string_view* bytes) {
  uint64_t size = 0;
  if (!ReadVarint(p, end, &size) || size > static_cast<uint64_t>(end - p)) return false;
  *bytes = absl::string_view(reinterpret_cast<const char*>(p), size);
  p += size;
  return true;
}

inline const unsigned char* Begin(absl::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

void ScanCommand(ScannedCommand* command) {
  const unsigned char* p = Begin(command->bytes);
  const unsigned char* const end = p + command->bytes.size();
  bool has_op = false;
  while (p != end) {
    const unsigned char tag = *p++;
    uint64_t v = 0;
    switch (tag) {
      case kSeqTag:
        if (!ReadVarint(p, end, &v)) return;
        command->seq = v;
        break;
      case kDeviceTag:
        if (!ReadVarint(p, end, &v)) return;
        command->device = static_cast<int32_t>(static_cast<uint32_t>(v));
        break;
      case kStreamTag:
        if (!ReadVarint(p, end, &v)) return;
        command->stream = v;
        break;
      case kOpTag:
        if (has_op || !ReadBytes(p, end, &command->op)) return;
        has_op = true;
        break;
      default:
        return;
    }
  }
  command->op_only = has_op;
}

}  // namespace

bool ScanCommandBatch(absl::string_view message, std::vector<ScannedCommand>* commands) {
  commands->clear();
  const unsigned char* p = Begin(message);
  const unsigned char* const end = p + message.size();
  absl::string_view batch;
  if (p == end || *p++ != kBatchTag || !ReadBytes(p, end, &batch) || p != end) return false;
  p = Begin(batch);
  const unsigned char* const batch_end = p + batch.size();
  while (p != batch_end) {
    ScannedCommand command;
    if (*p++ != kCommandTag || !ReadBytes(p, batch_end, &command.bytes)) {
      commands->clear();
      return false;
    }
    ScanCommand(&command);
    commands->push_back(command);
  }
  return true;
}

}  // namespace flagos::daemon
