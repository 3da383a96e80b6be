// When a sync completes, over the raw protocol (a client written against
// proto/ alone, which may rely on every promise flagos.proto makes): a
// `sync` (device, all devices or stream_only) completes after every earlier
// command's reply has been sent and after every earlier free and release
// has taken effect (docs/protocol.md, "When a sync completes").
//
// On both backends: the cpu backend, and the kunlunxin backend over the
// fake libxpurt, whose work completes late and whose host functions (which
// post a download's reply and run a release) run on a thread of their own.
// Each ordering check is repeated kTries times per run; a miss is a race
// between the sync's reply and the earlier command's.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "execution/backend.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "transport/server.h"

namespace flagos::daemon {
namespace {

constexpr int kTries = 60;
constexpr uint64_t kDeviceMemory = 256ull << 20;

struct BackendParam {
  std::string name;  // test name suffix
  BackendOptions options;
};

BackendParam CpuParam() {
  BackendParam param{"cpu", {}};
  param.options.name = "cpu";
  param.options.cpu_devices = 2;
  param.options.device_memory = kDeviceMemory;
  return param;
}

// The fake reads FAKE_XPU_* once, when it is loaded; the caller's
// environment wins (as in tests/conformance/kunlunxin_registration.cc).
BackendParam KunlunxinFakeParam() {
  setenv("XPU_ROOT", FLAGOS_FAKE_XPU_ROOT, /*overwrite=*/0);
  setenv("FAKE_XPU_MEMORY", absl::StrCat(kDeviceMemory).c_str(), /*overwrite=*/0);
  setenv("FAKE_XPU_DELAY_US", "50", /*overwrite=*/0);
  BackendParam param{"kunlunxin_fake", {}};
  param.options.name = "kunlunxin";
  return param;
}

std::vector<BackendParam> Backends() { return {CpuParam(), KunlunxinFakeParam()}; }

void PrintTo(const BackendParam& param, std::ostream* os) { *os << param.name; }

std::string Pattern(size_t n, int seed) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(seed * 31 + i * 7 + (i >> 9));
  return bytes;
}

v1::Command OnStream(int device, uint64_t stream) {
  v1::Command command;
  command.set_device(device);
  command.set_stream(stream);
  return command;
}

v1::Command Allocate(uint64_t nbytes, int device = 0) {
  v1::Command command = OnStream(device, 0);
  command.mutable_allocate()->set_nbytes(nbytes);
  return command;
}

v1::Command Free(uint64_t addr, int device = 0) {
  v1::Command command = OnStream(device, 0);
  command.mutable_free()->set_addr(addr);
  return command;
}

v1::Command CopyTo(uint64_t addr, std::string data, uint64_t stream = 0) {
  v1::Command command = OnStream(0, stream);
  command.mutable_copy_to_device()->set_addr(addr);
  command.mutable_copy_to_device()->set_data(std::move(data));
  return command;
}

v1::Command CopyFrom(uint64_t addr, uint64_t nbytes, uint64_t stream = 0) {
  v1::Command command = OnStream(0, stream);
  command.mutable_copy_from_device()->set_addr(addr);
  command.mutable_copy_from_device()->set_nbytes(nbytes);
  return command;
}

// The three kinds of sync marker.
enum class SyncKind { kDevice, kAllDevices, kStreamOnly };

const char* SyncName(SyncKind kind) {
  switch (kind) {
    case SyncKind::kDevice: return "sync on device 0";
    case SyncKind::kAllDevices: return "sync on every device";
    case SyncKind::kStreamOnly: return "stream-only sync";
  }
  return "?";
}

v1::Command Sync(SyncKind kind, uint64_t stream = 0) {
  v1::Command command = OnStream(kind == SyncKind::kAllDevices ? -1 : 0, stream);
  command.mutable_sync()->set_stream_only(kind == SyncKind::kStreamOnly);
  return command;
}

v1::Command ExportMemory(uint64_t addr) {
  v1::Command command = OnStream(0, 0);
  command.mutable_export_memory()->set_addr(addr);
  return command;
}

v1::Command ImportMemory(const std::string& grant) {
  v1::Command command = OnStream(0, 0);
  command.mutable_import_memory()->set_grant(grant);
  return command;
}

v1::Command ReleaseImport(uint64_t addr, uint64_t stream = 0) {
  v1::Command command = OnStream(0, stream);
  command.mutable_release_import()->set_addr(addr);
  return command;
}

// A raw Session stream whose completions are read in the order they arrive.
class RawSession {
 public:
  explicit RawSession(v1::Flagos::Stub* stub) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stream_ = stub->Session(&context_);
    v1::ClientMessage message;
    message.mutable_open()->set_version(1);
    message.mutable_open()->set_pid(getpid());
    message.mutable_open()->set_client("sync_order_test");
    EXPECT_TRUE(stream_->Write(message));
    v1::ServerMessage reply;
    EXPECT_TRUE(stream_->Read(&reply));
    EXPECT_TRUE(reply.has_opened());
    id_ = reply.opened().session_id();
  }

  ~RawSession() {
    stream_->WritesDone();
    v1::ServerMessage reply;
    while (stream_->Read(&reply)) {
    }
    (void)stream_->Finish();
  }

  uint64_t id() const { return id_; }

  // Sends the commands as one batch, numbering them; returns their seqs.
  std::vector<uint64_t> Send(std::vector<v1::Command> commands) {
    v1::ClientMessage message;
    std::vector<uint64_t> seqs;
    for (v1::Command& command : commands) {
      command.set_seq(++seq_);
      seqs.push_back(seq_);
      *message.mutable_batch()->add_commands() = std::move(command);
    }
    EXPECT_TRUE(stream_->Write(message));
    return seqs;
  }

  // The next completion to arrive (a message may carry several).
  v1::Completion Next() {
    while (unread_.empty()) {
      v1::ServerMessage reply;
      if (!stream_->Read(&reply)) {
        ADD_FAILURE() << "session " << id_ << " ended while a completion was awaited";
        v1::Completion none;
        none.set_code(-1);
        return none;
      }
      for (v1::Completion& completion : *reply.mutable_completions()) {
        unread_.push_back(std::move(completion));
      }
    }
    v1::Completion completion = std::move(unread_.front());
    unread_.pop_front();
    return completion;
  }

  // Completions in arrival order up to and including `seq`'s.
  std::vector<v1::Completion> ReadThrough(uint64_t seq) {
    std::vector<v1::Completion> read;
    while (true) {
      read.push_back(Next());
      if (read.back().seq() == seq || read.back().code() == -1) return read;
    }
  }

  v1::Completion Call(v1::Command command) {
    const uint64_t seq = Send({std::move(command)})[0];
    std::vector<v1::Completion> read = ReadThrough(seq);
    for (size_t i = 0; i + 1 < read.size(); ++i) {
      ADD_FAILURE() << "unexpected completion of command " << read[i].seq() << ": "
                    << read[i].message();
    }
    return read.back();
  }

  uint64_t AllocateOk(uint64_t nbytes) {
    v1::Completion completion = Call(Allocate(nbytes));
    EXPECT_EQ(completion.code(), 0) << completion.message();
    return completion.addr();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  uint64_t id_ = 0;
  uint64_t seq_ = 0;
  std::deque<v1::Completion> unread_;
};

class SyncOrderTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/flagosd_sync_order_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    const std::string endpoint = absl::StrCat("unix://", dir_, "/flagosd.sock");
    absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create(GetParam().options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    ServerOptions options;
    options.listen = {endpoint};
    options.max_sessions = 4;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options, backend_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    channel_ = grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Flagos::NewStub(channel_);
  }

  void TearDown() override {
    stub_.reset();
    channel_.reset();
    server_.reset();
    backend_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Session `id` as GetStats lists it now.
  v1::SessionInfo Info(uint64_t id) {
    grpc::ClientContext context;
    v1::GetStatsResponse response;
    grpc::Status status = stub_->GetStats(&context, v1::GetStatsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    for (const v1::SessionInfo& info : response.sessions()) {
      if (info.id() == id) return info;
    }
    ADD_FAILURE() << "GetStats does not list session " << id;
    return v1::SessionInfo();
  }

  // kTries times: copy_to_device, copy_from_device, free, then a sync of
  // `kind`, in one batch. Returns how many syncs completed before the
  // download's reply; every download must carry the bytes uploaded.
  int SyncsBeforeTheirDownload(SyncKind kind, uint64_t stream) {
    RawSession session(stub_.get());
    int early = 0;
    for (int i = 0; i < kTries; ++i) {
      const std::string bytes = Pattern(64 << 10, i);
      const uint64_t addr = session.AllocateOk(bytes.size());
      const std::vector<uint64_t> seqs =
          session.Send({CopyTo(addr, bytes, stream), CopyFrom(addr, bytes.size(), stream),
                        Free(addr), Sync(kind, stream)});
      bool download_seen = false;
      for (const v1::Completion& completion : session.ReadThrough(seqs[3])) {
        EXPECT_EQ(completion.code(), 0) << "command " << completion.seq() << ": "
                                        << completion.message();
        if (completion.seq() == seqs[1]) {
          download_seen = true;
          EXPECT_TRUE(completion.data() == bytes) << "try " << i << ": wrong bytes downloaded";
        }
      }
      if (!download_seen) {
        ++early;
        // The download's reply is still owed: read it before the next try.
        v1::Completion late = session.Next();
        EXPECT_EQ(late.seq(), seqs[1]);
        EXPECT_TRUE(late.data() == bytes) << "try " << i << ": wrong bytes downloaded";
      }
    }
    return early;
  }

  // Allocates kFrees segments, keeps device 0's streams 1 and 2 busy, frees
  // them all and sends a sync of `kind` (on `stream`) in the same batch;
  // returns the segments GetStats lists right after the sync's reply (the
  // busy streams' buffer is still held: 1 when every free took effect).
  uint64_t SegmentsHeldAfterFreesAndSync(SyncKind kind, uint64_t stream) {
    constexpr int kFrees = 4096;
    constexpr uint64_t kBusyBytes = 8 << 20;
    RawSession session(stub_.get());
    std::vector<v1::Command> allocations;
    for (int i = 0; i < kFrees; ++i) allocations.push_back(Allocate(4096));
    const std::vector<uint64_t> allocated = session.Send(std::move(allocations));
    std::vector<uint64_t> addrs;
    for (const v1::Completion& completion : session.ReadThrough(allocated.back())) {
      EXPECT_EQ(completion.code(), 0) << completion.message();
      addrs.push_back(completion.addr());
    }
    EXPECT_EQ(addrs.size(), static_cast<size_t>(kFrees));
    const uint64_t busy = session.AllocateOk(2 * kBusyBytes);
    std::vector<v1::Command> batch;
    for (uint64_t s : {1, 2}) {
      const uint64_t at = busy + (s - 1) * kBusyBytes;
      batch.push_back(CopyTo(at, Pattern(kBusyBytes, static_cast<int>(s)), s));
      batch.push_back(CopyFrom(at, kBusyBytes, s));
    }
    for (uint64_t addr : addrs) batch.push_back(Free(addr));
    batch.push_back(Sync(kind, stream));
    const std::vector<uint64_t> seqs = session.Send(std::move(batch));
    const uint64_t sync_seq = seqs.back();
    for (const v1::Completion& completion : session.ReadThrough(sync_seq)) {
      EXPECT_EQ(completion.code(), 0) << "command " << completion.seq() << ": "
                                      << completion.message();
    }
    // Downloads a stream-only sync of another stream does not wait for may
    // still reply: the session reads them when it ends.
    return Info(session.id()).segments();
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Flagos::Stub> stub_;
};

TEST_P(SyncOrderTest, DeviceSyncCompletesAfterTheDownloadBeforeIt) {
  EXPECT_EQ(SyncsBeforeTheirDownload(SyncKind::kDevice, 0), 0)
      << "of " << kTries << " tries, " << SyncName(SyncKind::kDevice);
}

TEST_P(SyncOrderTest, AllDeviceSyncCompletesAfterTheDownloadBeforeIt) {
  EXPECT_EQ(SyncsBeforeTheirDownload(SyncKind::kAllDevices, 0), 0)
      << "of " << kTries << " tries, " << SyncName(SyncKind::kAllDevices);
}

TEST_P(SyncOrderTest, StreamSyncCompletesAfterTheDownloadBeforeIt) {
  EXPECT_EQ(SyncsBeforeTheirDownload(SyncKind::kStreamOnly, 0), 0)
      << "of " << kTries << " tries, " << SyncName(SyncKind::kStreamOnly) << " of stream 0";
  EXPECT_EQ(SyncsBeforeTheirDownload(SyncKind::kStreamOnly, 3), 0)
      << "of " << kTries << " tries, " << SyncName(SyncKind::kStreamOnly) << " of stream 3";
}

// The same with a segment another session shared: copy_to_device,
// copy_from_device, release_import, sync. After the sync the hold is gone.
TEST_P(SyncOrderTest, SyncCompletesAfterTheDownloadAndTheReleaseImportBeforeIt) {
  RawSession owner(stub_.get());
  RawSession receiver(stub_.get());
  const uint64_t segment = owner.AllocateOk(64 << 10);
  for (SyncKind kind : {SyncKind::kDevice, SyncKind::kStreamOnly}) {
    const uint64_t stream = kind == SyncKind::kStreamOnly ? 2 : 0;
    int early = 0;
    int still_held = 0;
    for (int i = 0; i < kTries; ++i) {
      v1::Completion exported = owner.Call(ExportMemory(segment));
      ASSERT_EQ(exported.code(), 0) << exported.message();
      v1::Completion imported = receiver.Call(ImportMemory(exported.grant()));
      ASSERT_EQ(imported.code(), 0) << imported.message();
      const uint64_t addr = imported.addr();
      const std::string bytes = Pattern(64 << 10, i);
      const std::vector<uint64_t> seqs =
          receiver.Send({CopyTo(addr, bytes, stream), CopyFrom(addr, bytes.size(), stream),
                         ReleaseImport(addr, stream), Sync(kind, stream)});
      bool download_seen = false;
      for (const v1::Completion& completion : receiver.ReadThrough(seqs[3])) {
        EXPECT_EQ(completion.code(), 0) << "command " << completion.seq() << ": "
                                        << completion.message();
        if (completion.seq() == seqs[1]) {
          download_seen = true;
          EXPECT_TRUE(completion.data() == bytes) << "try " << i << ": wrong bytes downloaded";
        }
      }
      if (Info(receiver.id()).imported_segments() != 0) ++still_held;
      if (!download_seen) {
        ++early;
        EXPECT_EQ(receiver.Next().seq(), seqs[1]);
      }
    }
    EXPECT_EQ(early, 0) << "of " << kTries << " tries, " << SyncName(kind)
                        << " completed before the download before it";
    EXPECT_EQ(still_held, 0) << "of " << kTries << " tries, " << SyncName(kind)
                             << " completed before the release_import before it took effect";
  }
  EXPECT_EQ(Info(owner.id()).segments(), 1u);
}

TEST_P(SyncOrderTest, FreesThenADeviceSyncLeaveNoSegmentHeld) {
  EXPECT_EQ(SegmentsHeldAfterFreesAndSync(SyncKind::kDevice, 0), 1u);
  EXPECT_EQ(SegmentsHeldAfterFreesAndSync(SyncKind::kAllDevices, 0), 1u);
}

TEST_P(SyncOrderTest, FreesThenAStreamSyncLeaveNoSegmentHeld) {
  // On a stream the frees' busy streams do not use, and on one of them.
  EXPECT_EQ(SegmentsHeldAfterFreesAndSync(SyncKind::kStreamOnly, 0), 1u);
  EXPECT_EQ(SegmentsHeldAfterFreesAndSync(SyncKind::kStreamOnly, 1), 1u);
}

INSTANTIATE_TEST_SUITE_P(Backends, SyncOrderTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<BackendParam>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace flagos::daemon
