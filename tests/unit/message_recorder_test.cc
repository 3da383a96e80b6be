// MessageRecorder: what it writes replays on its own (daemon/protocol/message_recorder.h).
#include "protocol/message_recorder.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace flagos::daemon {
namespace {

v1::ClientMessage Parse(const std::string& text) {
  v1::ClientMessage message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

class MessageRecorderTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(testing::TempDir()) /
           testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // File `n` of session 7, parsed.
  v1::ClientMessage File(int n) const {
    std::ifstream in(dir_ / ("s7-m" + std::to_string(n) + ".pb"), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    v1::ClientMessage message;
    EXPECT_TRUE(message.ParseFromString(bytes.str())) << "file " << n;
    return message;
  }

  void ExpectFile(int n, const std::string& expected_text) const {
    const v1::ClientMessage expected = Parse(expected_text);
    const v1::ClientMessage actual = File(n);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(expected, actual))
        << "file " << n << " is\n"
        << actual.DebugString() << "expected\n"
        << expected.DebugString();
  }

  std::filesystem::path dir_;
};

constexpr uint64_t kSeg0 = 0x7f0000010000;  // device 0, 4096 bytes
constexpr uint64_t kSeg1 = 0x7f0000050000;  // device 1, 1024 bytes

// A session that registered op 5 and allocated kSeg0 and kSeg1.
void OpenAndAllocate(MessageRecorder& recorder) {
  recorder.RecordIncoming(Parse("open { version: 1 client: 'test' }"));
  recorder.RecordIncoming(Parse(R"pb(
    batch {
      commands { seq: 1 register_op { op_id: 5 name: "aten::add" overload: "Tensor" } }
      commands { seq: 2 device: 0 allocate { nbytes: 4096 } }
      commands { seq: 3 device: 1 allocate { nbytes: 1024 } }
    })pb"));
  v1::ServerMessage reply;
  v1::Completion* a = reply.add_completions();
  a->set_seq(2);
  a->set_addr(kSeg0);
  v1::Completion* b = reply.add_completions();
  b->set_seq(3);
  b->set_addr(kSeg1);
  recorder.ObserveReply(reply);
}

TEST_F(MessageRecorderTest, OpenIsWrittenAsReceived) {
  MessageRecorder recorder(dir_.string(), 7);
  OpenAndAllocate(recorder);
  ExpectFile(1, "open { version: 1 client: 'test' }");
}

TEST_F(MessageRecorderTest, BatchIsPrecededByTheAllocatesAndRegistrationsItNeeds) {
  MessageRecorder recorder(dir_.string(), 7);
  OpenAndAllocate(recorder);
  // Names kSeg1 first, then kSeg0; one address outside both.
  recorder.RecordIncoming(Parse(R"pb(
    batch {
      commands {
        seq: 10
        op {
          op_id: 5
          args { tensor { addr: 0x7f0000050010 device: 1 sizes: 4 strides: 1 dtype: 6 } }
          args {
            list {
              values { tensor { addr: 0x7f0000010000 device: 0 } }
              values { tensor { addr: 0x99 device: 0 } }
            }
          }
          outputs { addr: 0x7f0000010100 device: 0 }
        }
      }
      commands {
        seq: 11
        device: 0
        copy_device_to_device { src: 0x7f0000050004 src_device: 1 dst: 0x7f0000010000 nbytes: 4 }
      }
    })pb"));
  ExpectFile(3, R"pb(
    batch {
      commands { seq: 1 device: 1 allocate { nbytes: 1024 } }
      commands { seq: 2 device: 0 allocate { nbytes: 4096 } }
      commands { seq: 3 register_op { op_id: 5 name: "aten::add" overload: "Tensor" } }
      commands {
        seq: 4
        op {
          op_id: 5
          args { tensor { addr: 0x10000000010 device: 1 sizes: 4 strides: 1 dtype: 6 } }
          args {
            list {
              values { tensor { addr: 0x20000000000 device: 0 } }
              values { tensor { addr: 0x99 device: 0 } }
            }
          }
          outputs { addr: 0x20000000100 device: 0 }
        }
      }
      commands {
        seq: 5
        device: 0
        copy_device_to_device { src: 0x10000000004 src_device: 1 dst: 0x20000000000 nbytes: 4 }
      }
    })pb");
}

TEST_F(MessageRecorderTest, FreedSegmentIsNoLongerRewritten) {
  MessageRecorder recorder(dir_.string(), 7);
  OpenAndAllocate(recorder);
  recorder.RecordIncoming(Parse(R"pb(
    batch { commands { seq: 10 device: 0 free { addr: 0x7f0000010000 } } })pb"));
  recorder.RecordIncoming(Parse(R"pb(
    batch { commands { seq: 11 device: 0 memset { addr: 0x7f0000010000 nbytes: 8 } } })pb"));
  ExpectFile(3, R"pb(
    batch {
      commands { seq: 1 device: 0 allocate { nbytes: 4096 } }
      commands { seq: 2 device: 0 free { addr: 0x10000000000 } }
    })pb");
  ExpectFile(4, R"pb(
    batch { commands { seq: 1 device: 0 memset { addr: 0x7f0000010000 nbytes: 8 } } })pb");
}

TEST_F(MessageRecorderTest, FailedAllocateNamesNoSegment) {
  MessageRecorder recorder(dir_.string(), 7);
  recorder.RecordIncoming(Parse(R"pb(
    batch { commands { seq: 1 device: 0 allocate { nbytes: 4096 } } })pb"));
  v1::ServerMessage reply;
  v1::Completion* failed = reply.add_completions();
  failed->set_seq(1);
  failed->set_code(8);  // RESOURCE_EXHAUSTED
  failed->set_addr(kSeg0);
  recorder.ObserveReply(reply);
  recorder.RecordIncoming(Parse(R"pb(
    batch { commands { seq: 2 device: 0 memset { addr: 0x7f0000010000 nbytes: 8 } } })pb"));
  ExpectFile(2, R"pb(
    batch { commands { seq: 1 device: 0 memset { addr: 0x7f0000010000 nbytes: 8 } } })pb");
}

TEST_F(MessageRecorderTest, CanonicalAddressHoldsSegmentAndOffset) {
  EXPECT_EQ(CanonicalSegmentAddress(0, 0x10), 0x10000000010u);
  EXPECT_EQ(CanonicalSegmentAddress(2, 0), 0x30000000000u);
  EXPECT_EQ(CanonicalSegmentAddress(0, 0x10) & kCanonicalOffsetMask, 0x10u);
}

}  // namespace
}  // namespace flagos::daemon
