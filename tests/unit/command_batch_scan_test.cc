// ScanCommandBatch (protocol/command_batch_scan.h): the hand-read framing of
// a session message agrees with protobuf's parse wherever it accepts the
// bytes, and leaves to protobuf whatever it does not read the same way.
#include "protocol/command_batch_scan.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {
namespace {

void AppendVarint(std::string* bytes, uint64_t v) {
  for (; v >= 0x80; v >>= 7) bytes->push_back(static_cast<char>(v | 0x80));
  bytes->push_back(static_cast<char>(v));
}

// A length-delimited field `tag` holding `contents`.
std::string Field(char tag, const std::string& contents) {
  std::string bytes(1, tag);
  AppendVarint(&bytes, contents.size());
  return bytes + contents;
}

// A ClientMessage whose batch holds `commands` (each a Command's bytes).
std::string Batch(const std::vector<std::string>& commands) {
  std::string batch;
  for (const std::string& command : commands) batch += Field('\x0a', command);
  return Field('\x12', batch);
}

v1::Command OpCommand(uint64_t seq, int device, uint64_t stream, uint32_t op_id) {
  v1::Command command;
  command.set_seq(seq);
  command.set_device(device);
  command.set_stream(stream);
  v1::OpCall* op = command.mutable_op();
  op->set_op_id(op_id);
  v1::TensorRef* ref = op->add_args()->mutable_tensor();
  ref->set_addr(0x7f0012345000);
  ref->add_sizes(4);
  ref->add_strides(1);
  ref->set_dtype(6);
  ref->set_device(device);
  op->add_args()->set_d(0.5);
  return command;
}

// Every command the scan found parses (with protobuf) to what protobuf
// finds in the whole message, and an op_only one's fields are its values.
void ExpectAgreesWithProtobuf(const std::string& message,
                              const std::vector<ScannedCommand>& scanned) {
  v1::ClientMessage parsed;
  ASSERT_TRUE(parsed.ParseFromString(message));
  ASSERT_EQ(parsed.batch().commands_size(), static_cast<int>(scanned.size()));
  for (size_t i = 0; i < scanned.size(); ++i) {
    const v1::Command& expected = parsed.batch().commands(static_cast<int>(i));
    v1::Command alone;
    ASSERT_TRUE(alone.ParseFromArray(scanned[i].bytes.data(),
                                     static_cast<int>(scanned[i].bytes.size())));
    EXPECT_EQ(alone.SerializeAsString(), expected.SerializeAsString()) << "command " << i;
    if (!scanned[i].op_only) continue;
    EXPECT_TRUE(expected.has_op());
    EXPECT_EQ(scanned[i].seq, expected.seq());
    EXPECT_EQ(scanned[i].device, expected.device());
    EXPECT_EQ(scanned[i].stream, expected.stream());
    v1::OpCall op;
    ASSERT_TRUE(op.ParseFromArray(scanned[i].op.data(), static_cast<int>(scanned[i].op.size())));
    EXPECT_EQ(op.SerializeAsString(), expected.op().SerializeAsString());
  }
}

TEST(CommandBatchScanTest, FindsEveryCommandAndReadsTheOpCalls) {
  v1::ClientMessage message;
  *message.mutable_batch()->add_commands() = OpCommand(7, 1, 3, 42);
  v1::Command* allocate = message.mutable_batch()->add_commands();
  allocate->set_seq(8);
  allocate->mutable_allocate()->set_nbytes(4096);
  *message.mutable_batch()->add_commands() = OpCommand(9, -1, 0, 1);  // a negative device
  v1::Command* want = message.mutable_batch()->add_commands();
  *want = OpCommand(10, 0, 0, 5);
  const std::string bytes = message.SerializeAsString();
  std::vector<ScannedCommand> scanned;
  ASSERT_TRUE(ScanCommandBatch(bytes, &scanned));
  ASSERT_EQ(scanned.size(), 4u);
  EXPECT_TRUE(scanned[0].op_only);
  EXPECT_EQ(scanned[0].seq, 7u);
  EXPECT_EQ(scanned[0].device, 1);
  EXPECT_EQ(scanned[0].stream, 3u);
  EXPECT_EQ(scanned[0].op, message.batch().commands(0).op().SerializeAsString());
  EXPECT_FALSE(scanned[1].op_only);
  EXPECT_TRUE(scanned[2].op_only);
  EXPECT_EQ(scanned[2].device, -1);
  ExpectAgreesWithProtobuf(bytes, scanned);
}

TEST(CommandBatchScanTest, ARepeatedFieldTakesItsLastValueAsProtobufDoes) {
  std::string command = OpCommand(0, 0, 0, 3).SerializeAsString();
  for (const uint64_t seq : {100u, 5u}) {
    command.push_back('\x08');
    AppendVarint(&command, seq);
  }
  command.push_back('\x10');  // device -2, as a ten-byte varint
  AppendVarint(&command, static_cast<uint64_t>(int64_t{-2}));
  const std::string message = Batch({command});
  std::vector<ScannedCommand> scanned;
  ASSERT_TRUE(ScanCommandBatch(message, &scanned));
  ASSERT_EQ(scanned.size(), 1u);
  EXPECT_TRUE(scanned[0].op_only);
  EXPECT_EQ(scanned[0].seq, 5u);
  EXPECT_EQ(scanned[0].device, -2);
  ExpectAgreesWithProtobuf(message, scanned);
}

TEST(CommandBatchScanTest, CommandsItDoesNotReadAreLeftToProtobuf) {
  const std::string op = OpCommand(1, 0, 0, 3).op().SerializeAsString();
  // op twice (protobuf merges the two), an unknown field, a field of
  // another kind beside the op, op of the wrong wire type.
  const std::string twice = "\x08\x01" + Field('\x5a', op) + Field('\x5a', op);
  const std::string unknown = "\x08\x01" + Field('\x5a', op) + "\xa0\x06\x01";
  const std::string with_free = "\x08\x01" + Field('\x5a', op) + Field('\x6a', "\x08\x10");
  const std::string varint_op = std::string("\x08\x01\x58\x01", 4);
  for (const std::string& command : {twice, unknown, with_free, varint_op}) {
    std::vector<ScannedCommand> scanned;
    const std::string message = Batch({command});
    ASSERT_TRUE(ScanCommandBatch(message, &scanned));
    ASSERT_EQ(scanned.size(), 1u);
    EXPECT_FALSE(scanned[0].op_only);
    EXPECT_EQ(scanned[0].bytes, command);
  }
}

TEST(CommandBatchScanTest, MessagesThatAreNotAPlainBatchAreParsedWhole) {
  const std::string command = OpCommand(1, 0, 0, 3).SerializeAsString();
  v1::ClientMessage open;
  open.mutable_open()->set_version(1);
  const std::string batch = Batch({command});
  std::vector<std::string> messages = {
      "",                                                 // nothing
      open.SerializeAsString(),                           // open
      batch + batch,                                      // two batch fields (merged)
      open.SerializeAsString() + batch,                   // open and batch
      Field('\x12', "\x10\x01" + Field('\x0a', command)),  // a field of the batch's not read
      batch.substr(0, batch.size() - 1),                  // truncated
      Field('\x12', Field('\x0a', command).substr(0, 5)),  // a command past its batch
      std::string("\x12\xff\xff\xff\xff\x0f", 6),         // a length past the message
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<ScannedCommand> scanned(3);
    EXPECT_FALSE(ScanCommandBatch(messages[i], &scanned)) << "message " << i;
    EXPECT_TRUE(scanned.empty());
  }
  std::vector<ScannedCommand> scanned;
  ASSERT_TRUE(ScanCommandBatch(Field('\x12', ""), &scanned));  // an empty batch
  EXPECT_TRUE(scanned.empty());
}

// Random damage to a real batch: the scan never reads outside the message,
// and whatever it accepts, protobuf reads the same way.
TEST(CommandBatchScanTest, DamagedBytesAreReadAsProtobufReadsThemOrLeftToIt) {
  v1::ClientMessage message;
  for (int i = 0; i < 6; ++i) *message.mutable_batch()->add_commands() = OpCommand(i + 1, i % 2, i, 3);
  const std::string good = message.SerializeAsString();
  std::mt19937 random(12345);
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(random() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = random() % bytes.size();
      switch (random() % 3) {
        case 0: bytes[at] = static_cast<char>(random()); break;
        case 1: bytes.erase(at, 1 + random() % 4); break;
        default: bytes.insert(at, 1, static_cast<char>(random())); break;
      }
      if (bytes.empty()) bytes = good;
    }
    std::vector<ScannedCommand> scanned;
    if (!ScanCommandBatch(bytes, &scanned)) continue;
    v1::ClientMessage parsed;
    if (!parsed.ParseFromString(bytes)) continue;  // a command protobuf refuses: refused later
    ++accepted;
    ExpectAgreesWithProtobuf(bytes, scanned);
    if (HasFatalFailure() || HasNonfatalFailure()) {
      ADD_FAILURE() << "round " << round;
      return;
    }
  }
  EXPECT_GT(accepted, 1000);  // damage to the operands' bytes keeps the framing
}

}  // namespace
}  // namespace flagos::daemon
