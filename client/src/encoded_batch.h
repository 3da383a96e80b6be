// The commands a session has not sent yet, kept as the wire bytes of the
// ClientMessage that will carry them (ClientMessage{batch: CommandBatch}).
//
// Each command is serialized once, when it is appended, from whatever
// memory it was built in, or appended as the bytes its caller wrote (the
// plugin writes most operator calls so: plugin/csrc/op_call_wire.h): the
// batch owns no protobuf objects, so sending one destroys none, and a
// command costs no heap allocation beyond this buffer's growth. The bytes are exactly what serializing the
// equivalent v1::ClientMessage would give, except that each command's seq
// field comes after its other fields (protobuf accepts fields in any
// order), so the daemon parses them as before.
//
// Thread safety: none; SessionConnection guards it with its mutex.
#ifndef FLAGOS_CLIENT_SRC_ENCODED_BATCH_H_
#define FLAGOS_CLIENT_SRC_ENCODED_BATCH_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

class EncodedBatch {
 public:
  EncodedBatch() = default;
  EncodedBatch(const EncodedBatch&) = delete;
  EncodedBatch& operator=(const EncodedBatch&) = delete;

  // Appends `command` as the batch's next element, its seq field set to
  // `seq` (a seq the command already carries is overridden: the last
  // occurrence of a field wins).
  void Append(const v1::Command& command, uint64_t seq);
  // The same for a command given as its serialized bytes (which must not
  // hold a seq: the daemon would read the later one, this one, all the same).
  void AppendSerialized(absl::string_view command, uint64_t seq);

  int commands() const { return commands_; }
  // Wire bytes held (the commands with their framing).
  size_t bytes() const { return size_; }

  // The batch as one serialized ClientMessage; leaves this batch empty.
  // The buffer's memory moves into the ByteBuffer (no copy).
  grpc::ByteBuffer Take();

 private:
  // Makes room for `n` more bytes and returns where they go.
  uint8_t* Extend(size_t n);
  // Counts a command of `body` bytes plus its seq, writes its tag and
  // length, and returns where its body goes (WriteSeq follows the body).
  uint8_t* Frame(size_t body, uint64_t seq);
  static void WriteSeq(uint64_t seq, uint8_t* p);

  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
  // The capacity the last batch grew to, for the next one's first buffer.
  size_t last_capacity_ = 4096;
  int commands_ = 0;
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_ENCODED_BATCH_H_
