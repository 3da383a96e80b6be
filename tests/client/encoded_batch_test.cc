// EncodedBatch (client/src/encoded_batch.h): the wire bytes it sends must
// parse, with the daemon's parser, into the ClientMessage the commands make,
// each command carrying the seq given at Append.
#include "encoded_batch.h"

#include <google/protobuf/arena.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace flagos::client {
namespace {

using google::protobuf::util::MessageDifferencer;

// Parses (and consumes) `bytes` as the daemon does.
v1::ClientMessage Parse(grpc::ByteBuffer* bytes) {
  v1::ClientMessage message;
  grpc::Status status = grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::ClientMessage>(
      bytes, &message);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return message;
}

// An operator call as the plugin encodes one: tensors with sizes and
// strides, a scalar, an output.
v1::Command OpCall(uint64_t addr) {
  v1::Command command;
  command.set_device(1);
  command.set_stream(7);
  v1::OpCall* call = command.mutable_op();
  call->set_op_id(42);
  for (int i = 0; i < 2; ++i) {
    v1::TensorRef* t = call->add_args()->mutable_tensor();
    t->set_addr(addr + 4096 * i);
    t->add_sizes(4);
    t->add_sizes(16);
    t->add_strides(16);
    t->add_strides(1);
  }
  call->add_args()->set_d(2.5);
  call->add_outputs()->set_addr(addr + 8192);
  return command;
}

v1::Command Memset() {
  v1::Command command;
  command.mutable_memset()->set_addr(64);
  command.mutable_memset()->set_nbytes(16);
  return command;
}

TEST(EncodedBatch, ParsesAsTheCommandsWithTheirSeqs) {
  std::vector<v1::Command> commands;
  commands.push_back(OpCall(1 << 20));
  v1::Command copy;
  copy.mutable_copy_to_device()->set_addr(4096);
  copy.mutable_copy_to_device()->set_data(std::string(300000, 'x'));  // a multi-byte length
  commands.push_back(copy);
  v1::Command stale = OpCall(3 << 20);
  stale.set_seq(999);  // overridden by the seq given at Append
  commands.push_back(stale);
  commands.push_back(v1::Command());  // an empty command is one too

  EncodedBatch batch;
  uint64_t seq = 100;
  for (const v1::Command& c : commands) batch.Append(c, seq++);
  EXPECT_EQ(batch.commands(), 4);

  v1::ClientMessage expected;
  seq = 100;
  for (const v1::Command& c : commands) {
    v1::Command* e = expected.mutable_batch()->add_commands();
    *e = c;
    e->set_seq(seq++);
  }
  // The stale seq stays on the wire before the new one (3 bytes: 999).
  const size_t header = 1 + 3;  // ClientMessage.batch's tag, a 3-byte length
  EXPECT_EQ(batch.bytes() + header, expected.ByteSizeLong() + 3);

  grpc::ByteBuffer bytes = batch.Take();
  EXPECT_EQ(bytes.Length(), expected.ByteSizeLong() + 3);
  v1::ClientMessage parsed = Parse(&bytes);
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, expected)) << parsed.DebugString();

  // Taken: the batch is empty and starts again.
  EXPECT_EQ(batch.commands(), 0);
  EXPECT_EQ(batch.bytes(), 0u);
  batch.Append(OpCall(5 << 20), 200);
  grpc::ByteBuffer again = batch.Take();
  v1::ClientMessage second = Parse(&again);
  ASSERT_EQ(second.batch().commands_size(), 1);
  EXPECT_EQ(second.batch().commands(0).seq(), 200u);
  EXPECT_EQ(second.batch().commands(0).op().args(0).tensor().addr(), 5u << 20);
}

TEST(EncodedBatch, AnEmptyBatchIsAnEmptyCommandBatch) {
  EncodedBatch batch;
  grpc::ByteBuffer bytes = batch.Take();
  v1::ClientMessage parsed = Parse(&bytes);
  EXPECT_TRUE(parsed.has_batch());
  EXPECT_EQ(parsed.batch().commands_size(), 0);
}

TEST(EncodedBatch, CommandsBuiltOnAnArenaEncodeAsOnTheHeap) {
  google::protobuf::Arena arena;
  v1::Command* on_arena = google::protobuf::Arena::CreateMessage<v1::Command>(&arena);
  *on_arena = OpCall(7 << 20);
  EncodedBatch from_arena, from_heap;
  from_arena.Append(*on_arena, 1);
  from_heap.Append(OpCall(7 << 20), 1);
  grpc::ByteBuffer a = from_arena.Take(), h = from_heap.Take();
  EXPECT_TRUE(MessageDifferencer::Equals(Parse(&a), Parse(&h)));
}

TEST(EncodedBatch, ASerializedCommandJoinsTheBatchAsTheSameCommandWould) {
  const v1::Command command = OpCall(9 << 20);
  EncodedBatch serialized, built;
  serialized.Append(Memset(), 1);
  serialized.AppendSerialized(command.SerializeAsString(), 2);
  serialized.AppendSerialized("", 3);  // an empty command
  built.Append(Memset(), 1);
  built.Append(command, 2);
  built.Append(v1::Command(), 3);
  EXPECT_EQ(serialized.bytes(), built.bytes());
  grpc::ByteBuffer s = serialized.Take(), b = built.Take();
  v1::ClientMessage parsed = Parse(&s);
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, Parse(&b))) << parsed.DebugString();
  ASSERT_EQ(parsed.batch().commands_size(), 3);
  EXPECT_EQ(parsed.batch().commands(1).seq(), 2u);
  EXPECT_EQ(parsed.batch().commands(2).seq(), 3u);
}

TEST(EncodedBatch, ManyCommandsGrowTheBufferAndKeepTheirOrder) {
  EncodedBatch batch;
  for (int i = 0; i < 1000; ++i) batch.Append(OpCall(static_cast<uint64_t>(i) << 12), i + 1);
  grpc::ByteBuffer bytes = batch.Take();
  const size_t length = bytes.Length();
  v1::ClientMessage parsed = Parse(&bytes);  // consumes `bytes`
  // Byte for byte the size of the message protobuf would write for them.
  EXPECT_EQ(length, parsed.ByteSizeLong());
  ASSERT_EQ(parsed.batch().commands_size(), 1000);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(parsed.batch().commands(i).seq(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ(parsed.batch().commands(i).op().args(0).tensor().addr(),
              static_cast<uint64_t>(i) << 12);
  }
}

}  // namespace
}  // namespace flagos::client
