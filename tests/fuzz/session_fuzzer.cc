// libFuzzer target over what a client controls on its session stream: one
// input is one serialised flagos.v1.ClientMessage, as flagosd reads it.
// It goes through the daemon's own code, in process, on the cpu backend
// (2 devices of 64 MiB): protobuf parsing, then a fresh Session (the
// command validation of session.cc and command_validation.cc, the segment
// checks, streams, events, copies, and the OpRunner's register_op schema
// check and op-argument decoding of op_runner.cc / op_schema_match.cc /
// op_limits.cc), then Close(). Nothing is mocked.
//
// Inputs are written the way MessageRecorder (daemon/protocol/message_recorder.h)
// records real sessions, so the seed corpus replays: the batch's leading
// `allocate` commands run first, and every address of the form
// CanonicalSegmentAddress(j, offset) in the rest names byte `offset` of the
// segment the j-th of them returned. Other addresses are used as they are
// (and refused by the segment checks).
//
// What counts as a finding: any sanitizer report (ASan, UBSan, LSan at
// exit), a crash, an abort, or an allocate that never replies (a hang).
// Error completions are the expected answer to malformed input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "execution/backend.h"
#include "protocol/command_addresses.h"
#include "protocol/command_batch_scan.h"
#include "flagos/v1/flagos.pb.h"
#include "memory/memory_grants.h"
#include "protocol/message_recorder.h"
#include "ops/op_limits.h"
#include "sessions/session.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {
namespace {

// Segments one input may allocate before its commands (more are left in
// the batch, where they run as ordinary commands).
constexpr int kMaxLeadingAllocates = 16;
// How long an allocate's reply may take before the input counts as a hang.
constexpr absl::Duration kAllocateReplyDeadline = absl::Seconds(20);

// The daemon's process-wide parts, built once: the backend, a worker pool
// per device and the table of shared segments.
struct Daemon {
  std::unique_ptr<Backend> backend;
  std::vector<std::unique_ptr<WorkerPool>> pools;
  std::vector<WorkerPool*> pool_pointers;
  MemoryGrants grants{MemoryGrants::Policy::kAnyUser};
  // Small, so that one input's work stays small (exec/s): an op naming
  // more elements, or whose kernel holds more host memory, is refused.
  OpLimits limits{.max_elements = 1u << 18, .max_host_memory_bytes = 64u << 20};
};

Daemon& TheDaemon() {
  static Daemon* daemon = [] {
    BackendOptions options;
    options.name = "cpu";
    options.cpu_devices = 2;
    options.device_memory = 64ull << 20;
    absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create(options);
    if (!backend.ok()) {
      std::fprintf(stderr, "session_fuzzer: the cpu backend did not start: %s\n",
                   std::string(backend.status().message()).c_str());
      std::abort();
    }
    auto* d = new Daemon;
    d->backend = *std::move(backend);
    for (int device = 0; device < options.cpu_devices; ++device) {
      d->pools.push_back(std::make_unique<WorkerPool>("fuzz workers", 2));
      d->pool_pointers.push_back(d->pools.back().get());
    }
    return d;
  }();
  return *daemon;
}

// What the session replied: the address each allocate returned (0: failed).
class Replies {
 public:
  bool Write(const v1::ServerMessage& reply) {
    absl::MutexLock lock(&mu_);
    for (const v1::Completion& completion : reply.completions()) {
      if (completion.seq() >= first_allocate_ && completion.seq() < end_allocate_) {
        const uint64_t addr = completion.code() == 0 ? completion.addr() : 0;
        addresses_[completion.seq() - first_allocate_] = addr;
        ++allocations_replied_;
      }
    }
    return true;
  }
  // Expects replies to the allocates of seq [first, first + count).
  void ExpectAllocates(uint64_t first, int count) {
    absl::MutexLock lock(&mu_);
    first_allocate_ = first;
    end_allocate_ = first + count;
    addresses_.assign(count, 0);
  }
  // The addresses, once every expected allocate replied; aborts when one
  // does not within kAllocateReplyDeadline (a hang is a finding).
  std::vector<uint64_t> AwaitAllocates() {
    absl::MutexLock lock(&mu_);
    const auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return allocations_replied_ >= addresses_.size();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), kAllocateReplyDeadline)) {
      std::fprintf(stderr, "session_fuzzer: %zu of %zu allocates got no reply\n",
                   addresses_.size() - allocations_replied_, addresses_.size());
      std::abort();
    }
    return addresses_;
  }

 private:
  absl::Mutex mu_;
  uint64_t first_allocate_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t end_allocate_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> addresses_ ABSL_GUARDED_BY(mu_);
  size_t allocations_replied_ ABSL_GUARDED_BY(mu_) = 0;
};

void RunBatch(Daemon& daemon, v1::CommandBatch& batch) {
  Replies replies;
  v1::SessionOpen open;
  open.set_version(1);
  open.set_client("session_fuzzer");
  Session session(
      1, open, *daemon.backend,
      [&replies](const v1::ServerMessage& reply) { return replies.Write(reply); },
      [](const absl::Status&) {}, daemon.pool_pointers, /*activity=*/nullptr,
      /*metrics=*/nullptr, daemon.limits, &daemon.grants);

  // The leading allocates, on their own, so that their addresses are known.
  int leading = 0;
  while (leading < batch.commands_size() && leading < kMaxLeadingAllocates &&
         batch.commands(leading).has_allocate()) {
    ++leading;
  }
  std::vector<uint64_t> segments;
  if (leading > 0) {
    v1::CommandBatch allocates;
    for (int i = 0; i < leading; ++i) *allocates.add_commands() = batch.commands(i);
    // Replies name the seq of their command; count those of this batch.
    replies.ExpectAllocates(allocates.commands(0).seq(), leading);
    bool consecutive = true;
    for (int i = 1; i < leading; ++i) {
      consecutive &= allocates.commands(i).seq() == allocates.commands(0).seq() + i;
    }
    if (session.HandleBatch(&allocates).ok() && consecutive) segments = replies.AwaitAllocates();
  }

  v1::CommandBatch rest;
  for (int i = leading; i < batch.commands_size(); ++i) {
    v1::Command& command = *rest.add_commands();
    command = std::move(*batch.mutable_commands(i));
    ForEachDeviceAddress(command, [&segments](int /*device*/, uint64_t& addr) {
      const uint64_t j = (addr >> kCanonicalSegmentShift) - 1;
      if (j < segments.size() && segments[j] != 0) {
        addr = segments[j] + (addr & kCanonicalOffsetMask);
      }
    });
  }
  // The rest as a session stream delivers it: its framing scanned, each op
  // call looked up among those the session prepared (protocol/
  // command_batch_scan.h, sessions/repeated_op_calls.h). Three times, the
  // later two numbered after the first, so that a call is seen, prepared,
  // then run prepared. A batch that is not a plain one is parsed whole.
  uint64_t last_seq = 0;
  for (const v1::Command& command : rest.commands()) last_seq = std::max(last_seq, command.seq());
  for (int pass = 0; pass < 3; ++pass) {
    if (pass > 0) {
      if (last_seq > std::numeric_limits<uint64_t>::max() / 2) break;
      for (v1::Command& command : *rest.mutable_commands()) command.set_seq(++last_seq);
    }
    struct Kept {
      std::string bytes;
      google::protobuf::Arena arena;
    };
    auto kept = std::make_shared<Kept>();
    v1::ClientMessage message;
    *message.mutable_batch() = rest;
    kept->bytes = message.SerializeAsString();
    std::vector<ScannedCommand> scanned;
    absl::Status s = ScanCommandBatch(kept->bytes, &scanned)
                         ? session.HandleScannedBatch(scanned, &kept->arena, kept)
                         : session.HandleBatch(message.mutable_batch());
    if (!s.ok()) break;  // an error ends the session; that is all
  }
  session.Close();
}

}  // namespace
}  // namespace flagos::daemon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flagos::daemon;
  Daemon& daemon = TheDaemon();
  flagos::v1::ClientMessage message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (message.has_open()) {
    // What Session keeps of the client's free text (capped, printable).
    Session session(1, message.open(), *daemon.backend,
                    [](const flagos::v1::ServerMessage&) { return true; },
                    [](const absl::Status&) {}, daemon.pool_pointers);
    (void)session.Info();
    session.Close();
    return 0;
  }
  if (message.has_batch()) RunBatch(daemon, *message.mutable_batch());
  return 0;
}
