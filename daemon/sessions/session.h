// One client session: the state behind one Session stream.
//
// A session owns its segments (SegmentTable), the ops it registered
// (OpRunner) and one StreamQueue per (device, stream) it used; the queues
// have no threads of their own but run on their device's WorkerPool, shared
// by every session. Commands are handled as the flagos.proto comments say:
//   - register_op and allocate run at once in the reading thread;
//   - op, copies and memset go to their (device, stream) queue, FIFO;
//   - free runs once every earlier command on its device (all streams) has
//     executed; sync replies once every earlier command on its device (all
//     devices when device < 0) has executed, the replies they owe are
//     posted and every earlier free and release of the device took effect
//     (docs/protocol.md, "When a sync completes");
//   - copy_device_to_device from another device runs on the destination's
//     queue once every earlier command on the source device has executed;
//   - record_event goes to its stream's queue; wait_event captures the
//     event's latest record and its stream's queue parks (a gate, holding
//     no worker) until that record is issued;
//     query_event and query_stream answer at once, destroy_event forgets
//     the event at once (waiting commands keep its record);
//     synchronize_event and elapsed_time reply once their records are done;
//     sync with stream_only replies after every earlier command on its
//     (device, stream), their replies, and the device's earlier frees and
//     releases;
//   - export_memory replies once every earlier command on its device has
//     completed; import_memory and query_export answer at once;
//     release_import runs, like free, after every earlier command on its
//     device (MemoryGrants: segments shared between sessions).
// No task waits for another queue's work while it holds a worker: a cross-
// device copy and a wait_event park their queue, and what they wait for
// resumes it. Tasks do block on the device (stream and event
// synchronisation), whose progress does not need a worker.
// Every address is checked against this session's segments (its own and
// those it imported) when the command executes; commands that execute hold the session's memory lock
// shared, a free holds it exclusively, so memory is never unmapped under a
// running command. Errors become Completions carrying the command's seq.
//
// Close() ends the session: pending commands are dropped, queues joined,
// backend events and streams destroyed and every segment freed. Nothing
// outlives it. It waits for the commands running (a kernel cannot be
// interrupted) and for the device to complete what the session issued.
// When the client is gone (its stream cancelled, its process dead), the
// reading thread calls Detach() instead, which waits for nothing: the
// session stops writing to the stream and runs no command that has not
// started, and Close() then runs on another thread (SessionRegistry::Retire)
// while the session's slot is free already. Every segment stays held, and
// counted, until Close() frees it: a running command may touch any of them
// (no segment of a closing session is reused under a running kernel).
//
// Thread safety: HandleBatch and Detach are called by the session's reading
// thread only, Close by it or, after Detach returned, by one other thread;
// Info and the accessors may be called from any thread.
// Replies are posted (from the reading thread, the sync channel's thread,
// the queue workers and backend threads) to the session's ReplyWriter and
// written by its thread: `write` is called from that thread only (and must
// serialise with the caller's own writes on the stream).
//
// Where it lives: the class is defined over several files, one concept
// each: session.cc (dispatch, replies, lifecycle), session_memory.cc
// (allocate, free, the host regions' attach), session_sharing.cc
// (export/import between sessions), session_streams.cc (queueing commands,
// stream queries, the sync channel's requests), session_copies.cc (what a
// queued command does on its stream: ops, copies, memset),
// session_events.cc (record/wait/query events), session_graphs.cc (captured
// graphs) and session_repeated_ops.cc (op calls sent again byte for byte).
// The state with a concept of its own is a class of its own, which owns its
// lock: StreamTable
// (execution/stream_table.h), EventTable (execution/event_table.h), the
// completion fences (execution/completion_fences.h), HostRegions
// (memory/host_regions.h), PendingFrees (memory/pending_frees.h),
// RepeatedOpCalls (sessions/repeated_op_calls.h) and SyncChannel
// (transport/sync_channel.h).
//
// Lock order (each lock only after those before it; ABSL_ACQUIRED_BEFORE on
// the members says the same for the Session's own):
//   dispatch_mu_ → memory_mu_ → imports_mu_ → clear_mu_ → payload_mu_
//     → end_mu_
//   and then the leaves, which nothing is locked under: the StreamTable's,
//   EventTable's, HostRegions', PendingFrees', RepeatedOpCalls',
//   SyncChannel's and
//   ReadyGate's locks, and those of the daemon-wide tables a command
//   uses (SegmentTable, MemoryGrants, MemoryQuotas, the ReplyWriter's).
//   dispatch_mu_ is held while a command dispatches (the reading thread,
//   or the sync channel's thread), and a command that runs inline takes
//   memory_mu_ (shared) under it. Blocking waits: with dispatch_mu_ held,
//   the sync channel's thread awaits dispatch_mu_ itself (the stream
//   caught up), Enqueue awaits room on payload_mu_, and Allocate at
//   out-of-memory awaits PendingFrees; each is declared here because what
//   it waits for (a queue task finishing, a free executing) never takes
//   dispatch_mu_. query_stream polls its queue for at most 1 ms under
//   dispatch_mu_. Waits for the device (SynchronizeStream, an inline
//   command's wait for its stream) happen under dispatch_mu_ and memory_mu_
//   (shared): the device's progress, and the host functions it runs, take
//   neither. A sync, free or release whose queues are idle drains their
//   streams right there (DeviceRuntime::DrainStream, with dispatch_mu_
//   held): the device and the host functions issued before, which take no
//   lock of the session's but the leaves' (ReplyWriter, HostRegions). No
//   other wait for another thread happens under a session lock.
#ifndef FLAGOS_DAEMON_SESSIONS_SESSION_H_
#define FLAGOS_DAEMON_SESSIONS_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "admission/peer_credentials.h"
#include "execution/backend.h"
#include "execution/device_activity.h"
#include "execution/event_table.h"
#include "execution/stream_queue.h"
#include "execution/stream_table.h"
#include "execution/worker_pool.h"
#include "flagos/v1/flagos.pb.h"
#include "memory/host_regions.h"
#include "memory/memory_grants.h"
#include "memory/memory_quotas.h"
#include "memory/pending_frees.h"
#include "memory/pinned_region.h"
#include "memory/segment_table.h"
#include "memory/staging_region.h"
#include "observability/metrics.h"
#include "ops/op_runner.h"
#include "protocol/command_batch_scan.h"
#include "sessions/captured_graphs.h"
#include "sessions/repeated_op_calls.h"
#include "transport/reply_writer.h"
#include "transport/sync_channel.h"

namespace flagos::daemon {

// Bytes of copy_to_device data a session may have queued and not yet
// executed; beyond it the session stops reading until its queues catch up.
inline constexpr uint64_t kMaxQueuedPayloadBytes = 512ull << 20;
// What the daemon keeps of the client's free text at `open` (longer text is
// cut, with "..." at the end): its name, its torch version, its command line.
inline constexpr size_t kMaxClientNameBytes = 256;
inline constexpr size_t kMaxTorchVersionBytes = 64;
inline constexpr size_t kMaxCommandLineBytes = 4096;
class Session {
 public:
  struct CloseSummary {
    uint64_t segments = 0;  // segments freed
    uint64_t bytes = 0;     // bytes they held
  };

  // `backend` must outlive the session, and so must `pools` (one per
  // device of the backend, indexed by device: where the session's queues
  // run), `activity`, `metrics` and `grants` (each may be null: no busy
  // time / no metrics counted / no memory shared with other sessions). Its
  // ops are bounded by `op_limits` (op_limits.h).
  // Replies go out through a ReplyWriter of the session's own: `write`
  // writes one message on the session stream (blocking, on the writer's
  // thread), `end` ends the session when the client leaves more than
  // kMaxUnreadReplyBytes of replies unread (reply_writer.h).
  // `peer`: who connected, from the kernel (nullopt over TCP: the pid is
  // then the one the client gave at `open`, the user unknown). `quotas`
  // (may be null: none) bounds the device memory it and its user hold, and
  // must outlive it.
  Session(uint64_t id, const v1::SessionOpen& open, const Backend& backend,
          ReplyWriter::WriteFn write, ReplyWriter::EndFn end,
          std::vector<WorkerPool*> pools, DeviceActivity* activity = nullptr,
          Metrics* metrics = nullptr, const OpLimits& op_limits = OpLimits(),
          MemoryGrants* grants = nullptr, std::optional<PeerCredentials> peer = std::nullopt,
          MemoryQuotas* quotas = nullptr);
  // Close().
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Handles the commands of one batch. A command's failure is replied as an
  // error Completion; a non-OK status means the batch itself broke the
  // protocol (too many commands) and the session must end with that status.
  //
  // Queued commands stay where they were parsed: `keep` owns the storage of
  // `batch` (the protobuf arena the session stream parsed it into) and is
  // held until the last of them has executed, so no command is copied or
  // destroyed one by one. Without `keep`, the batch's commands are moved
  // into storage of the session's own first.
  absl::Status HandleBatch(v1::CommandBatch* batch, std::shared_ptr<const void> keep = nullptr);
  // The same for a batch whose framing was scanned by hand
  // (protocol/command_batch_scan.h): an op call the session prepared before,
  // byte for byte, runs prepared (repeated_op_calls.h); every other command
  // is parsed with protobuf onto `arena` first. `keep` owns the scanned
  // bytes and `arena` and is held until the last queued command of the
  // batch has executed. A command that does not parse ends the session
  // (non-OK), before any command of the batch is dispatched.
  absl::Status HandleScannedBatch(const std::vector<ScannedCommand>& commands,
                                  google::protobuf::Arena* arena, std::shared_ptr<const void> keep);

  // Ends the session; idempotent.
  CloseSummary Close();
  // The client is gone: drops the replies not yet written and writes
  // nothing more on the stream (`write` and `end` are never called once it
  // returned), and no command that has not started executing will; waits
  // for no command. Close() does the rest.
  void Detach();
  // Commands executing now (SessionInfo.running_commands).
  uint32_t running_commands() const { return running_.load(std::memory_order_relaxed); }

  uint64_t id() const { return id_; }
  int64_t pid() const { return pid_; }
  const std::string& client() const { return client_; }
  const std::string& torch_version() const { return torch_version_; }
  // Bytes of the attached staging region (0: none).
  uint64_t staging_bytes() const;
  // Bytes in this session's segments on `device`.
  uint64_t device_bytes(int device) const { return segments_.device_bytes(device); }
  v1::SessionInfo Info() const;

  // The secret that proves an attaching process owns this session: sent
  // only on the session's own stream (SessionOpened.staging_token).
  const std::string& staging_token() const { return staging_token_; }
  // Maps the client's staging region (AttachListener, any thread): checks
  // the token, then the layout (StagingRegion::Map). Closes `fd`. `uid` is
  // the attaching process's uid from the socket's peer credentials (-1 when
  // unknown): PERMISSION_DENIED when it is not the session's own.
  // ALREADY_EXISTS when a region is attached already.
  absl::Status AttachStaging(const v1::StagingAttach& attach, int fd, int64_t uid);
  // Maps a pinned host region of the client (AttachListener, any thread;
  // `attach.pinned` is set): checks the token, the id (> 0, not attached
  // yet), the session's bounds (kMaxPinnedRegionsPerSession,
  // kMaxPinnedBytesPerSession), then the file (PinnedRegion::Map). Closes
  // `fd`.
  absl::Status AttachPinned(const v1::StagingAttach& attach, int fd);
  // Bytes of the pinned host regions attached now.
  uint64_t pinned_bytes() const;
  // Checks a TCP client's sync-channel attach (AttachListener, any thread):
  // PERMISSION_DENIED for the wrong token, ALREADY_EXISTS when the session
  // has a sync channel already. The caller then calls StartSyncChannel.
  absl::Status AttachSyncChannel(const v1::SyncAttach& attach);
  // Serves the sync channel on `fd` (the attach connection; see SyncRequest
  // in flagos.proto) from a thread of its own until the session closes.
  // Takes `fd`. Called once, by the AttachListener after the attach (a
  // second channel is closed at once).
  // With `raw_payloads` (SyncAttach.raw_payloads) replies' bytes go raw
  // after their frames.
  void StartSyncChannel(int fd, bool raw_payloads = false);
  // Bytes of messages received from / sent to the client on the session
  // stream (called by the service).
  void CountStreamBytes(uint64_t received, uint64_t sent) {
    stream_bytes_received_.fetch_add(received, std::memory_order_relaxed);
    stream_bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
  }

 private:
  // ---- dispatch and replies (session.cc).
  // `ordered`: the command came on the session stream and must follow the
  // previous one's seq (sync-channel commands are ordered by after_seq).
  // `keep` owns `command`'s storage (HandleBatch); a command that is queued
  // holds it until it has executed.
  // `op_bytes`: the bytes of the command's OpCall as sent (inside `keep`),
  // when it may be kept among the repeated op calls once it ran prepared.
  void Dispatch(v1::Command& command, const std::shared_ptr<const void>& keep,
                bool ordered = true, absl::string_view op_bytes = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  // The seq check of a command that came on the session stream: false (the
  // error replied) when `seq` does not follow the previous command's.
  bool TakeSeq(uint64_t seq, absl::string_view kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  // Every reply goes through here: to the sync channel when it answers a
  // command waiting there, else to the session stream; never blocks
  // (replies_). `payload`, when not empty, is the reply's data (raw after
  // the frame on a TCP client's sync channel, no copy through the message).
  void Reply(v1::Completion completion, OwnedBytes payload = OwnedBytes());
  void ReplyError(uint64_t seq, absl::string_view kind, const absl::Status& status);
  // The error completion for command `seq` (logged and counted).
  v1::Completion ErrorCompletion(uint64_t seq, absl::string_view kind, const absl::Status& status);
  // The counters of `device`; null when metrics are off.
  DeviceMetrics* MetricsFor(int device) const;
  // A completion of `seq` with nothing in it but success.
  static v1::Completion Done(uint64_t seq);
  // Waits for the session's work on `device`'s default stream (shared with
  // other sessions) and for its host functions.
  absl::Status DrainDefaultStream(int device);

  // ---- device memory (session_memory.cc).
  void Allocate(uint64_t seq, int device, uint64_t nbytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  // Zeroes a new segment before the client learns its address (unless the
  // runtime's Malloc returns zeroes): a device's allocator hands out memory
  // other sessions freed. On a stream of the session's own per device, so
  // that it waits for nothing else.
  absl::Status ClearNewSegment(int device, DevicePtr ptr, uint64_t nbytes);
  void ScheduleFree(uint64_t seq, int device, DevicePtr addr);
  // Runs `release` (a free of device memory) once the device has completed
  // every earlier command on it; allocate waits for it before it reports
  // out-of-memory (pending_frees_).
  void ScheduleRelease(int device, std::function<void()> release);
  void ExecuteFree(uint64_t seq, int device, DevicePtr addr);
  // Gives `segment`'s memory back to the backend (logging a failure).
  bool FreeMemory(const Segment& segment);
  // OK when [addr, addr + nbytes) lies inside one segment of `device`.
  absl::Status CheckRange(const v1::Command& command, int device, uint64_t addr,
                          uint64_t nbytes) const;
  // How many segments, its own and its imports, the session gave up so
  // far: a range CheckRange accepted stays accepted while it is unchanged
  // (it changes only under memory_mu_ held for writing).
  uint64_t MemoryRemovals() const {
    return segments_.removals() + imported_.removals();
  }
  // Forgets pinned region `region` once every earlier command has completed.
  void ScheduleReleasePinned(uint64_t seq, uint64_t region);
  // Frees every segment the session holds, its own and its imports (Close).
  void FreeAllMemory(CloseSummary* summary);

  // ---- sharing segments with other sessions (session_sharing.cc,
  // MemoryGrants).
  void ExportMemory(const v1::Command& command);
  void ImportMemory(const v1::Command& command);
  void ScheduleReleaseImport(uint64_t seq, int device, DevicePtr addr);
  void ExecuteReleaseImport(uint64_t seq, int device, DevicePtr addr);
  void QueryExport(const v1::Command& command);
  // The segment, owned or imported, holding `addr` on `device`; `owned` says
  // which. NOT_FOUND naming the command otherwise.
  absl::StatusOr<Segment> HeldSegment(const v1::Command& command, int device, DevicePtr addr,
                                      bool* owned) const;
  // FAILED_PRECONDITION naming the command when the daemon shares nothing.
  absl::Status CheckSharing(const v1::Command& command) const;

  // ---- stream queues (session_streams.cc).
  // `ordered` as Dispatch's: a command that came on the session stream.
  // `keep` as Dispatch's.
  // `op_bytes` as Dispatch's.
  void Enqueue(v1::Command& command, const std::shared_ptr<const void>& keep, bool ordered,
               absl::string_view op_bytes = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  // Runs `action` once every command already queued on `device` (every
  // device when device < 0) has executed and the device has completed its
  // work, and the host functions issued before returned (completion_fences.h).
  void AfterQueuedWork(int device, std::function<void(absl::Status)> action);
  void QueryStream(const v1::Command& command);
  // sync of a device (every device when < 0) and sync with stream_only:
  // after the commands they cover, the replies those owe, and the frees and
  // releases sent before them (ReplySyncAfterFrees).
  void SyncDevice(const v1::Command& command);
  void SyncStream(const v1::Command& command);
  // Replies to sync `seq` with `status` once every free and release on
  // `device` (every device when < 0) numbered up to `frees_before` ran.
  void ReplySyncAfterFrees(uint64_t seq, int device, uint64_t frees_before, absl::Status status);
  // One request of the sync channel (its thread): dispatched, under the
  // same lock as the reading thread, once the stream has been dispatched up
  // to its after_seq. False once the session is closing.
  bool HandleSyncRequest(v1::SyncRequest& request);

  // ---- what a queued command does (session_copies.cc).
  // Runs `body` as queued work runs: not at all once the client is gone
  // (nullopt: dropped, as Close drops what is still queued); else counted in
  // running_, with memory_mu_ held shared, an exception made INTERNAL.
  std::optional<absl::Status> RunQueued(absl::FunctionRef<absl::Status()> body);
  // Runs on a queue worker. Issues the command's work to `backend_stream`;
  // what the work holds (upload bytes, staging chunks) is released, and a
  // download is replied, only once the device has completed it. May move
  // parts of `command` out.
  // `op_bytes` as Dispatch's: an op it prepared is kept in repeated_ops_.
  void Execute(v1::Command& command, StreamHandle backend_stream, absl::string_view op_bytes = {});
  // `prepare`: OpRunner::Run's, for an op (a graph's first replay).
  absl::Status ExecuteLocked(v1::Command& command, StreamHandle backend_stream,
                             v1::Completion* completion, bool* reply,
                             std::shared_ptr<const PreparedOpCall>* prepare = nullptr)
      ABSL_SHARED_LOCKS_REQUIRED(memory_mu_);
  // Replies `completion` (with `data` as its bytes when not null) once the
  // work issued so far to `backend_stream` has completed.
  absl::Status ReplyWhenComplete(int device, StreamHandle backend_stream,
                                 v1::Completion completion, std::shared_ptr<OwnedBytes> data);
  // Counts a copy command's bytes (when metrics are on).
  void CountCopy(int device, CopyDirection direction, uint64_t nbytes);

  // ---- op calls sent again (session_repeated_ops.cc, repeated_op_calls.h).
  // Reading thread: queues `command` (op_only, its seq taken), whose OpCall
  // the session prepared before (`entry`), on its stream.
  void DispatchRepeated(const ScannedCommand& command,
                        std::shared_ptr<const RepeatedOpCalls::Entry> entry,
                        const std::shared_ptr<const void>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  // Worker: runs it prepared while the session's memory is as when its
  // ranges were checked and its tensors are as made; else as sent
  // (parsed from `op_bytes`, checked), keeping what that prepared.
  void ExecuteRepeated(uint64_t seq, int device, uint64_t stream, absl::string_view op_bytes,
                       const RepeatedOpCalls::Entry& entry, StreamHandle backend_stream);

  // ---- captured graphs (session_graphs.cc, captured_graphs.h).
  // Reading thread. define_graph: checks the part's commands (their
  // addresses against the session's memory) and answers.
  void DefineGraph(v1::Command& command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  // Queues one task on the command's stream that runs the graph.
  void ReplayGraph(const v1::Command& command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  void DestroyGraph(const v1::Command& command);
  // Worker: runs graph `id`'s commands in order on `backend_stream`, random
  // ops drawing from `rng`; the first failure stops it and is replied as
  // command `seq`'s.
  // The ops the first replay prepared run prepared by later ones (unless
  // memory was freed since the graph's ranges were last checked: then one
  // replay runs every command as sent, checking each range, first).
  void RunReplay(const CapturedGraph& graph, uint64_t id, uint64_t seq,
                 const v1::GeneratorValue& rng, StreamHandle backend_stream);

  // ---- events (session_events.cc; flagos.proto RecordEvent ...).
  class RecordTask;
  // Reading thread.
  void RecordEvent(const v1::Command& command);
  void WaitEvent(const v1::Command& command);
  void QueryEvent(const v1::Command& command);
  void SynchronizeEvent(const v1::Command& command);
  void ElapsedTime(const v1::Command& command);
  void DestroyEvent(const v1::Command& command);
  // Worker: creates and records the backend event of `record` on
  // `backend_stream`, then marks it issued and runs its on_issued actions.
  void IssueRecord(uint64_t seq, EventRecord& record, StreamHandle backend_stream);

  // Constant after construction.
  const uint64_t id_;
  const int64_t pid_;
  // The peer's user and group, from the kernel when peer_known_; -1
  // (unknown: a TCP session) otherwise. The user is whom its memory counts
  // for in quotas_ and whom it may share memory with (grants_).
  const bool peer_known_;
  const int64_t uid_;
  const int64_t gid_;
  MemoryQuotas* const quotas_;
  const std::string client_;
  const std::string torch_version_;
  const std::string command_line_;
  const Backend& backend_;
  Metrics* const metrics_;
  MemoryGrants* const grants_;

  // Serialises Dispatch between the reading thread and the sync channel.
  // First in the session's lock order (see the top of this file).
  absl::Mutex dispatch_mu_ ABSL_ACQUIRED_BEFORE(memory_mu_, imports_mu_, clear_mu_, payload_mu_,
                                                end_mu_);
  bool has_seq_ ABSL_GUARDED_BY(dispatch_mu_) = false;
  uint64_t last_seq_ ABSL_GUARDED_BY(dispatch_mu_) = 0;
  bool sync_closing_ ABSL_GUARDED_BY(dispatch_mu_) = false;
  // Held shared while a command uses device memory, exclusively to free it.
  mutable absl::Mutex memory_mu_ ABSL_ACQUIRED_AFTER(dispatch_mu_)
      ABSL_ACQUIRED_BEFORE(imports_mu_, clear_mu_, payload_mu_, end_mu_);
  // The stream's EndFn is called under end_mu_ and never once Detach set
  // stream_gone_: the stream goes away with the reading thread. Last: a
  // reply posted under any other session lock may end the stream.
  absl::Mutex end_mu_ ABSL_ACQUIRED_AFTER(payload_mu_);
  bool stream_gone_ ABSL_GUARDED_BY(end_mu_) = false;
  // Writes every reply (stream and sync channel); no worker blocks on the
  // client's sockets. Finished by Close before the sync fd is closed.
  ReplyWriter replies_;
  const std::unique_ptr<OpRunner> ops_;

  // Reading thread only (then the closing thread, after Detach).
  bool closed_ = false;
  // Detach was called: commands not yet executing are skipped.
  std::atomic<bool> detached_{false};
  // Commands in Execute now.
  std::atomic<uint32_t> running_{0};

  // The sync channel (its socket, thread, and the command it waits for).
  SyncChannel sync_;

  std::atomic<uint64_t> commands_{0};
  std::atomic<uint64_t> stream_bytes_received_{0};
  std::atomic<uint64_t> stream_bytes_sent_{0};
  std::atomic<uint64_t> staged_bytes_{0};
  const std::string staging_token_;
  // The staging and pinned host regions.
  HostRegions regions_;
  SegmentTable segments_;  // internally synchronised
  // Segments of other sessions held through import_memory (each once, with
  // the session's count of holds on it).
  SegmentTable imported_;  // internally synchronised
  absl::Mutex imports_mu_ ABSL_ACQUIRED_AFTER(memory_mu_) ABSL_ACQUIRED_BEFORE(clear_mu_);
  absl::flat_hash_map<std::pair<int, DevicePtr>, uint64_t> import_holds_
      ABSL_GUARDED_BY(imports_mu_);

  // ClearNewSegment's streams, by device (destroyed at Close).
  absl::Mutex clear_mu_ ABSL_ACQUIRED_AFTER(imports_mu_) ABSL_ACQUIRED_BEFORE(payload_mu_);
  absl::flat_hash_map<int, StreamHandle> clear_streams_ ABSL_GUARDED_BY(clear_mu_);

  // The session's stream queues, by (device, stream).
  StreamTable streams_;
  // Upload bytes queued and not yet executed (kMaxQueuedPayloadBytes).
  absl::Mutex payload_mu_ ABSL_ACQUIRED_AFTER(clear_mu_) ABSL_ACQUIRED_BEFORE(end_mu_);
  uint64_t queued_payload_bytes_ ABSL_GUARDED_BY(payload_mu_) = 0;

  // Event ids and their records' issued state.
  EventTable events_;
  // The client's captured graphs.
  CapturedGraphs graphs_;
  // Op calls prepared by their first run, by their bytes (internally
  // synchronised).
  RepeatedOpCalls repeated_ops_;
  // HandleScannedBatch's per-command work (reading thread only).
  struct ScannedWork {
    std::shared_ptr<const RepeatedOpCalls::Entry> repeated;  // else `parsed`
    v1::Command* parsed = nullptr;
    bool prepare = false;  // its OpCall is kept once it ran prepared
  };
  std::vector<ScannedWork> scanned_work_;
  // Frees and releases scheduled and not yet executed (allocate waits for
  // them before it reports out-of-memory, a sync for the ones before it).
  PendingFrees pending_frees_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSIONS_SESSION_H_
