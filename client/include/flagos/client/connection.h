// libflagos_client: one process's connection to a flagosd.
//
// A Connection negotiates the protocol version, opens the session stream and
// carries commands to the daemon. Commands are appended to a batch and sent
// when the batch is flushed: at every synchronous call, when the batch holds
// kMaxBatchCommands commands or kMaxBatchBytes bytes of copy data, and on
// Flush(). Commands that owe no reply never
// wait for the daemon. A command that fails asynchronously is reported by the
// daemon as a Completion with an error; the connection records the first such
// error and returns it from the next synchronous call (and from
// TakeAsyncError), naming the failed command as `describe` said when it was
// enqueued.
//
// Same-node sessions (a unix-socket endpoint) move tensor bytes through a
// shared staging region (Upload / Download); FLAGOS_STAGING=0 turns it off,
// and TCP sessions send bytes inline in bounded chunks.
//
// Thread safety: all methods may be called from any thread. Completions are
// read by one background thread per connection; a second one sends batches
// left idle for kIdleFlush.
//
// This library knows nothing of torch.
#ifndef FLAGOS_CLIENT_CONNECTION_H_
#define FLAGOS_CLIENT_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

inline constexpr uint32_t kProtocolMinVersion = 1;
inline constexpr uint32_t kProtocolMaxVersion = 1;
inline constexpr int kMaxBatchCommands = 64;
// A batch is also sent once its copy_to_device data reaches this many bytes,
// which keeps every message well under the protocol's 256 MiB limit.
inline constexpr uint64_t kMaxBatchBytes = 32ull << 20;
// ... or once it names this many staged bytes, so the daemon starts on a
// large copy while the client stages the rest.
inline constexpr uint64_t kMaxBatchStagedBytes = 1ull << 20;
// A batch that has waited this long unsent is sent by a background thread,
// so that work a client enqueues and then does not synchronise still runs.
inline constexpr absl::Duration kIdleFlush = absl::Microseconds(500);
// The shared staging region of a same-node session: its data area and slot.
inline constexpr uint64_t kStagingBytes = 64ull << 20;
inline constexpr uint64_t kStagingSlotBytes = 4096;
// Copies are split into commands of at most this many bytes.
inline constexpr uint64_t kMaxCopyChunk = 8ull << 20;
// ... and copies from or into pinned memory (no bytes in the message) into
// commands of at most this many: large, because the daemon's one memcpy of a
// whole range is faster than several of its parts (glibc copies very large
// ranges with a faster loop: 256 MiB at once ran at 10.4 GB/s here, in 64 MiB
// parts at 4.9 GB/s).
inline constexpr uint64_t kMaxPinnedCopyChunk = 1ull << 30;

// A block of pinned host memory (AllocatePinned). `region` > 0: a region
// shared with the daemon, which copies straight from and into it; 0:
// ordinary memory (TCP sessions, or staging off), copied like any host
// memory.
struct PinnedBlock {
  uint64_t region = 0;
  char* data = nullptr;
  uint64_t nbytes = 0;
};

struct ConnectionOptions {
  // How long a batch may wait unsent before the background thread sends
  // it; absl::InfiniteDuration() turns the thread off (tests of batching).
  absl::Duration idle_flush = kIdleFlush;
  // Attach a shared staging region when the daemon offers one. The default
  // is false when FLAGOS_STAGING=0.
  bool staging = StagingWantedByEnvironment();
  // The client's torch version, shown to operators (flagos-smi).
  std::string torch_version;

  static bool StagingWantedByEnvironment();
};

class Connection {
 public:
  virtual ~Connection() = default;

  // Connects to `endpoint` ("unix:///path" or "host:port"), negotiates the
  // version and opens the session. Fails within `timeout` with UNAVAILABLE
  // and a message naming the endpoint and how to start flagosd when the
  // daemon cannot be reached; FAILED_PRECONDITION when no common protocol
  // version exists.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const std::string& endpoint, absl::Duration timeout, const std::string& client_name,
      const ConnectionOptions& options = ConnectionOptions());

  virtual const std::string& endpoint() const = 0;
  virtual const v1::NegotiateResponse& info() const = 0;
  virtual uint64_t session_id() const = 0;

  // Appends `command` (seq is assigned here) to the batch and returns its
  // seq. `describe` names the command for asynchronous error messages (e.g.
  // "aten::add.Tensor"). Never waits for the daemon's answer (it may wait
  // for gRPC to accept a full batch). Returns 0 and drops the command when
  // the connection is closed or the session has ended; the next synchronous
  // call reports why.
  virtual uint64_t Enqueue(const v1::Command& command, absl::string_view describe) = 0;
  // The same for a command given as its serialized bytes (a v1::Command
  // without seq), as the plugin writes an operator call (OpCallWire).
  virtual uint64_t EnqueueSerialized(absl::string_view command, absl::string_view describe) = 0;

  // Enqueues `command`, flushes, and waits for its Completion. Returns the
  // earliest recorded asynchronous error first if there is one (and clears
  // it); the command's own error status otherwise; UNAVAILABLE if the session
  // ended (daemon gone).
  //
  // A command that owes no reply (see the proto and v1::OwesReply: allocate,
  // copy_from_device, sync, op with want_values, the event and stream
  // queries and the sharing commands but release_import do) is followed by a sync
  // marker for all devices, whose Completion is returned; the command's own
  // failure then comes back as the asynchronous error.
  virtual absl::StatusOr<v1::Completion> Call(v1::Command command, std::string describe) = 0;

  // Enqueues `command` (which must owe a reply, see Call), flushes, and
  // returns a ticket for Await. Lets several replies be awaited at once.
  virtual absl::StatusOr<uint64_t> Submit(v1::Command command, std::string describe) = 0;
  // Waits for the Completion of a Submit ticket, with Call's error rules.
  // Every ticket must be awaited exactly once.
  virtual absl::StatusOr<v1::Completion> Await(uint64_t ticket) = 0;

  // Copies `nbytes` host bytes at `src` to device address `addr` on
  // (device, stream). Returns once the bytes are staged (or enqueued
  // inline): it never waits for the copy to run, only for room in the
  // staging region. The copy's failure is an asynchronous error.
  virtual absl::Status Upload(int device, uint64_t stream, uint64_t addr, const void* src,
                              uint64_t nbytes, const std::string& describe) = 0;
  // Copies `nbytes` from device address `addr` to `dst` once every earlier
  // command on (device, stream) has run: a synchronisation point. Large
  // copies are pipelined in chunks.
  virtual absl::Status Download(int device, uint64_t stream, void* dst, uint64_t addr,
                                uint64_t nbytes, const std::string& describe) = 0;
  // True when Upload/Download use a shared staging region.
  virtual bool staging() const = 0;

  // Pinned host memory (flagos.proto, PinnedRegion). Allocates `nbytes` (>
  // 0) of host memory the daemon maps too, as a region of its own: same-node
  // sessions with a staging region; everywhere else ordinary memory (region
  // 0), with the same copy semantics. RESOURCE_EXHAUSTED when the memory or
  // the daemon's bound on a session's pinned memory is exhausted.
  virtual absl::StatusOr<PinnedBlock> AllocatePinned(uint64_t nbytes) = 0;
  // Frees a block of AllocatePinned: the daemon forgets its region once
  // every command enqueued before has completed. The caller must not use
  // `block.data` afterwards.
  virtual void FreePinned(const PinnedBlock& block) = 0;
  // Copies `nbytes` at byte `offset` of pinned region `region` (> 0) to
  // device address `addr` on (device, stream). Never waits: the daemon
  // reads the region when the copy runs on the stream, so the caller must
  // leave the bytes unchanged until the stream has passed the copy. The
  // copy's failure is an asynchronous error.
  virtual absl::Status UploadPinned(int device, uint64_t stream, uint64_t addr, uint64_t region,
                                    uint64_t offset, uint64_t nbytes,
                                    const std::string& describe) = 0;
  // Copies `nbytes` from device address `addr` into pinned region `region`
  // (> 0) at `offset`, ordered on (device, stream). Never waits: the bytes
  // are there once the stream has passed the copy (an event, a stream or
  // device synchronisation); its failure is an asynchronous error.
  virtual absl::Status DownloadPinned(int device, uint64_t stream, uint64_t region,
                                      uint64_t offset, uint64_t addr, uint64_t nbytes,
                                      const std::string& describe) = 0;

  // Sends the pending batch. UNAVAILABLE when the session has ended.
  virtual absl::Status Flush() = 0;

  // Waits until every command enqueued so far on `device` (all devices if
  // device < 0) has executed; returns the first asynchronous error.
  virtual absl::Status Synchronize(int device) = 0;

  // The first asynchronous error not yet returned, then OK.
  virtual absl::Status TakeAsyncError() = 0;

  // Daemon statistics (devices, memory, sessions), by a unary RPC with a 5 s
  // deadline.
  virtual absl::StatusOr<v1::GetStatsResponse> GetStats() = 0;

  // Flushes, ends the session and waits (bounded, about 2 s) for the daemon
  // to close it; calls waiting in other threads return then. Later calls
  // return FAILED_PRECONDITION; Enqueue drops the command. Idempotent.
  virtual void Close() = 0;
  // True once Close has been called (not merely when the daemon is gone).
  virtual bool closed() const = 0;
  // True once the session is over for good: the daemon ended it (it
  // stopped, crashed, or closed the session) or Close was called. Every
  // later call fails then, and the session's device memory is gone.
  // Lock-free, for hot paths.
  virtual bool ended() const = 0;
  // Why the session is over: OK while it lives, else the status later calls
  // return (UNAVAILABLE naming the daemon and what gRPC said when the
  // daemon ended it).
  virtual absl::Status SessionEnd() const = 0;
};

// Daemon statistics from `endpoint` without opening a session.
absl::StatusOr<v1::GetStatsResponse> QueryStats(const std::string& endpoint,
                                                absl::Duration timeout);

// The daemon's answer to grpc.health.v1.Health/Check (the whole server):
// OK when SERVING; UNAVAILABLE naming the endpoint and the status (or why
// no answer came) otherwise.
absl::Status QueryHealth(const std::string& endpoint, absl::Duration timeout);

// Turns a gRPC-style status code into a short name ("RESOURCE_EXHAUSTED").
std::string CodeName(int code);

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_CONNECTION_H_
