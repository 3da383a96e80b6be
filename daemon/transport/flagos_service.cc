#include "transport/flagos_service.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "grpc/grpc.h"
#include "grpcpp/support/method_handler.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "logging.h"
#include "admission/peer_credentials.h"
#include "protocol/command_batch_scan.h"
#include "protocol/message_recorder.h"

namespace flagos::daemon {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::string VersionRange(uint32_t min, uint32_t max) {
  return absl::StrCat("[", min, ", ", max, "]");
}

// Session's index among flagos.v1.Flagos's rpcs (their order in
// proto/flagos/v1/flagos.proto: Negotiate, GetStats, Session).
constexpr int kSessionMethod = 2;

// Parses `bytes` (one message of the session stream) into `message`:
// INVALID_ARGUMENT when they are not a ClientMessage.
absl::Status ParseClientMessage(grpc::ByteBuffer& bytes, v1::ClientMessage* message) {
  message->Clear();
  grpc::ProtoBufferReader reader(&bytes);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a session message of ", bytes.Length(),
        " bytes is not a flagos.v1.ClientMessage (malformed wire data, or values nested deeper "
        "than protobuf's limit of 100 levels); the session is ended: send messages serialized "
        "from proto/flagos/v1/flagos.proto"));
  }
  return absl::OkStatus();
}

// Reads the next message of `stream` into `message`: false at the end of the
// stream (or when it was cancelled), INVALID_ARGUMENT when its bytes are not
// a ClientMessage.
absl::StatusOr<bool> ReadClientMessage(FlagosService::SessionStream* stream,
                                       v1::ClientMessage* message) {
  grpc::ByteBuffer bytes;
  if (!stream->Read(&bytes)) return false;
  if (absl::Status s = ParseClientMessage(bytes, message); !s.ok()) return s;
  return true;
}

// One message of the session stream: its bytes as received and, once
// parsed, the message in an arena of its own. Queued commands stay where
// they are, in the bytes (an op call run prepared, sessions/
// repeated_op_calls.h) or the arena, until the last queued command of the
// batch has executed (Session::HandleBatch's `keep`); then everything is
// freed at once rather than command by command.
class SessionMessage {
 public:
  SessionMessage() : arena_(Options()) {}
  grpc::ByteBuffer& bytes() { return bytes_; }
  google::protobuf::Arena* arena() { return &arena_; }
  v1::ClientMessage* message() {
    if (message_ == nullptr) message_ = Arena::CreateMessage<v1::ClientMessage>(&arena_);
    return message_;
  }
  // The bytes in one piece: the one slice gRPC received them in, or a copy
  // of several (up to kMaxFlattenedBytes). False past that: parse them.
  bool Flatten(absl::string_view* flat) {
    if (!bytes_.Dump(&slices_).ok()) return false;
    if (slices_.size() == 1) {
      *flat = absl::string_view(reinterpret_cast<const char*>(slices_[0].begin()),
                                slices_[0].size());
      return true;
    }
    size_t size = 0;
    for (const grpc::Slice& slice : slices_) size += slice.size();
    if (size > kMaxFlattenedBytes) return false;
    copy_.reserve(size);
    for (const grpc::Slice& slice : slices_) {
      copy_.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    *flat = copy_;
    return true;
  }

 private:
  using Arena = google::protobuf::Arena;
  // Batches of small commands; a larger message (an upload's bytes) is
  // parsed from its slices as it is.
  static constexpr size_t kMaxFlattenedBytes = 1 << 20;
  static google::protobuf::ArenaOptions Options() {
    google::protobuf::ArenaOptions options;
    // A full batch of tiny ops decodes to some 20-30 KiB.
    options.start_block_size = 16 << 10;
    options.max_block_size = 256 << 10;
    return options;
  }
  grpc::ByteBuffer bytes_;
  std::vector<grpc::Slice> slices_;
  std::string copy_;
  Arena arena_;
  v1::ClientMessage* message_ = nullptr;
};

}  // namespace

FlagosService::FlagosService(const Backend* backend, SessionRegistry* registry,
                             std::vector<WorkerPool*> pools, DeviceActivity* activity, Metrics* metrics, double start_time_unix,
                             size_t max_pending_opens, absl::Duration open_deadline,
                             const OpLimits& op_limits, MemoryGrants* grants)
    : backend_(*backend),
      registry_(*registry),
      grants_(grants),
      pools_(std::move(pools)),
      activity_(*activity),
      metrics_(metrics),
      start_time_(start_time_unix),
      op_limits_(op_limits),
      pending_opens_(max_pending_opens, open_deadline) {
  MarkMethodStreamed(
      kSessionMethod,
      new grpc::internal::BidiStreamingHandler<FlagosService, grpc::ByteBuffer, v1::ServerMessage>(
          [](FlagosService* service, grpc::ServerContext* context, SessionStream* stream) {
            return service->RunSession(context, stream);
          },
          this));
}

grpc::Status FlagosService::Counted(grpc::Status status) const {
  if (!status.ok() && metrics_ != nullptr) metrics_->CountRpcError(status.error_code());
  return status;
}

void FlagosService::AddDevices(google::protobuf::RepeatedPtrField<v1::DeviceInfo>* devices) const {
  // Closing sessions still hold their segments.
  std::vector<std::shared_ptr<daemon::Session>> sessions = registry_.Snapshot();
  for (auto& session : registry_.Closing()) sessions.push_back(std::move(session));
  AddDevices(devices, sessions);
}

void FlagosService::AddDevices(
    google::protobuf::RepeatedPtrField<v1::DeviceInfo>* devices,
    const std::vector<std::shared_ptr<daemon::Session>>& sessions) const {
  const DeviceRuntime& runtime = backend_.runtime();
  const std::vector<std::string> capabilities = runtime.capabilities().ImplementedNames();
  const std::vector<std::string> gaps = runtime.capabilities().GapDescriptions();
  for (int d = 0; d < runtime.DeviceCount(); ++d) {
    v1::DeviceInfo* info = devices->Add();
    info->set_index(d);
    if (absl::StatusOr<DeviceProperties> properties = runtime.GetDeviceProperties(d);
        properties.ok()) {
      info->set_name(properties->name);
      info->set_total_memory(properties->total_memory);
    }
    uint64_t used = 0;
    for (const auto& session : sessions) used += session->device_bytes(d);
    if (grants_ != nullptr) used += grants_->orphaned_bytes(d);
    info->set_used_memory(used);
    info->set_busy_seconds(activity_.busy_seconds(d));
    info->set_utilization(activity_.utilization(d));
    for (const std::string& name : capabilities) info->add_capabilities(name);
    for (const std::string& gap : gaps) info->add_gaps(gap);
  }
}

grpc::Status FlagosService::Negotiate(grpc::ServerContext* /*context*/,
                                      const v1::NegotiateRequest* request,
                                      v1::NegotiateResponse* response) {
  if (request->min_version() > request->max_version()) {
    return Counted(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the client's protocol range ",
                                     VersionRange(request->min_version(), request->max_version()),
                                     " is empty (min > max)")));
  }
  const uint32_t low = std::max(request->min_version(), kMinProtocolVersion);
  const uint32_t high = std::min(request->max_version(), kMaxProtocolVersion);
  if (low > high) {
    return Counted(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("no common protocol version: the client speaks ",
                     VersionRange(request->min_version(), request->max_version()),
                     ", flagosd ", kDaemonVersion, " speaks ",
                     VersionRange(kMinProtocolVersion, kMaxProtocolVersion),
                     "; use a client and a flagosd from compatible releases")));
  }
  response->set_version(high);
  response->set_daemon_version(kDaemonVersion);
  response->set_backend(backend_.name());
  response->set_torch_version(TorchVersion());
  for (const KernelFact& fact : backend_.kernel_facts()) {
    v1::KernelFact* out = response->add_kernel_facts();
    out->set_op(fact.op);
    out->set_always(fact.always);
    out->set_reduced_precision_input(fact.reduced_precision_input);
    out->set_eval_mode(fact.eval_mode);
    out->set_mixed_dtype_operands(fact.mixed_dtype_operands);
    for (const std::string& overload : fact.overloads) out->add_overloads(overload);
  }
  v1::CompositeOps* composite_ops = response->mutable_composite_ops();
  for (const std::string& op : backend_.composite_ops()) composite_ops->add_ops(op);
  AddDevices(response->mutable_devices());
  return grpc::Status::OK;
}

grpc::Status FlagosService::GetStats(grpc::ServerContext* /*context*/,
                                     const v1::GetStatsRequest* /*request*/,
                                     v1::GetStatsResponse* response) {
  response->set_backend(backend_.name());
  // One look at the sessions for the lists and the devices' used memory.
  std::vector<std::shared_ptr<daemon::Session>> sessions = registry_.Snapshot();
  for (const auto& session : sessions) *response->add_sessions() = session->Info();
  const size_t open = sessions.size();
  for (auto& session : registry_.Closing()) {
    // One that began closing between the two looks is listed as open.
    if (std::find(sessions.begin(), sessions.begin() + open, session) != sessions.begin() + open) {
      continue;
    }
    *response->add_closing_sessions() = session->Info();
    sessions.push_back(std::move(session));
  }
  AddDevices(response->mutable_devices(), sessions);
  response->set_sessions_total(registry_.sessions_total());
  response->set_daemon_version(kDaemonVersion);
  response->set_torch_version(TorchVersion());
  response->set_start_time_unix(start_time_);
  response->set_max_op_elements(op_limits_.max_elements);
  response->set_max_op_host_memory_bytes(op_limits_.max_host_memory_bytes);
  return grpc::Status::OK;
}

grpc::Status FlagosService::RunSession(grpc::ServerContext* context, SessionStream* stream) {
  v1::ClientMessage message;
  // Who connected, from the kernel: the unix sockets' connections are the
  // daemon's own accepts (SocketAcceptor); a TCP peer has no credentials.
  std::optional<PeerCredentials> peer;
  if (std::optional<int> fd = AcceptedDescriptor(context->peer()); fd.has_value()) {
    if (absl::StatusOr<PeerCredentials> read = ReadPeerCredentials(*fd); read.ok()) {
      peer = *std::move(read);
    }
  }
  {
    // Until `open` arrives the stream holds a thread outside --max-sessions,
    // and counts as one of its user's sessions.
    const int64_t uid = peer ? peer->uid : -1;
    absl::StatusOr<size_t> sessions_left = registry_.SessionsLeftFor(uid);
    if (!sessions_left.ok()) {
      if (metrics_ != nullptr) metrics_->CountSessionRefused();
      return Counted(ToGrpc(sessions_left.status()));
    }
    absl::StatusOr<PendingOpens::Ticket> waiting = pending_opens_.Enter(
        [context] { context->TryCancel(); }, PendingOpens::Opener{context->peer(), uid},
        *sessions_left);
    if (!waiting.ok()) return Counted(ToGrpc(waiting.status()));
    absl::StatusOr<bool> read = ReadClientMessage(stream, &message);
    if (!read.ok()) return Counted(ToGrpc(read.status()));
    if (!*read) {
      return Counted(grpc::Status(
          grpc::StatusCode::CANCELLED,
          waiting->expired() ? "no `open` within the deadline; the stream was cancelled"
                             : "the session stream ended before `open`"));
    }
  }
  if (!message.has_open()) {
    return Counted(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "the first message of a session must be `open`; call Negotiate, "
                                "then send SessionOpen with the negotiated version"));
  }
  const v1::SessionOpen open = message.open();
  if (open.version() < kMinProtocolVersion || open.version() > kMaxProtocolVersion) {
    return Counted(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("the session was opened with protocol version ", open.version(),
                     "; flagosd speaks ", VersionRange(kMinProtocolVersion, kMaxProtocolVersion),
                     "; open it with the version Negotiate returned")));
  }
  if (absl::Status allowed = access_.Check(peer); !allowed.ok()) {
    LogWarning(absl::StrCat("session refused (", peer ? peer->ToString() : context->peer(),
                            "): ", allowed.message()));
    if (metrics_ != nullptr) metrics_->CountSessionRefused();
    return Counted(ToGrpc(allowed));
  }
  absl::StatusOr<uint64_t> id =
      registry_.Admit([context] { context->TryCancel(); }, peer ? peer->uid : -1);
  if (!id.ok()) {
    if (metrics_ != nullptr) metrics_->CountSessionRefused();
    return Counted(ToGrpc(id.status()));
  }
  if (metrics_ != nullptr) metrics_->CountSessionOpened();
  std::unique_ptr<MessageRecorder> recorder;
  if (!record_dir_.empty()) {
    recorder = std::make_unique<MessageRecorder>(record_dir_, *id);
    recorder->RecordIncoming(message);
  }

  // Messages come from this thread (`opened`) and from the session's reply
  // writer.
  absl::Mutex write_mu;
  // Set once the session exists; counts what the stream carries.
  daemon::Session* counted = nullptr;
  auto write = [&write_mu, &counted, &recorder, stream](const v1::ServerMessage& reply) {
    absl::MutexLock lock(&write_mu);
    if (counted != nullptr) counted->CountStreamBytes(0, reply.ByteSizeLong());
    if (recorder != nullptr) recorder->ObserveReply(reply);
    return stream->Write(reply);
  };
  // Ends the session from any thread without blocking: the client sees
  // `status` (the trailers are not held back by the replies it did not
  // read), this thread's Read returns and the session closes as usual.
  auto end_session = [context](const absl::Status& status) {
    const std::string message(status.message());
    grpc_call_cancel_with_status(context->c_call(),
                                 static_cast<grpc_status_code>(status.code()), message.c_str(),
                                 nullptr);
  };
  auto session = std::make_shared<daemon::Session>(
      *id, open, backend_, write, end_session, pools_, &activity_, metrics_, op_limits_,
      grants_, peer, quotas_);
  registry_.Attach(*id, session);
  LogInfo(absl::StrCat(
      "session ", *id, " opened (",
      peer ? peer->ToString()
           : absl::StrCat("pid ", open.pid(), " as the client says, peer ", context->peer()),
      ", client '", session->client(), "', torch ",
      session->torch_version().empty() ? "unknown" : session->torch_version(), ")"));
  {
    absl::MutexLock lock(&write_mu);
    counted = session.get();
  }
  v1::ServerMessage opened;
  opened.mutable_opened()->set_session_id(*id);
  // Same-node (unix socket) clients may move tensor bytes through shared
  // memory; TCP clients send them inline.
  if (!staging_socket_.empty() && peer.has_value()) {
    opened.mutable_opened()->set_staging_socket(staging_socket_);
    opened.mutable_opened()->set_staging_token(session->staging_token());
  } else if (sync_port_ != 0 && !peer.has_value()) {
    // A TCP client's synchronous commands take a socket of their own.
    opened.mutable_opened()->set_sync_port(static_cast<uint32_t>(sync_port_));
    opened.mutable_opened()->set_staging_token(session->staging_token());
  }
  write(opened);

  grpc::Status end = grpc::Status::OK;
  // The commands of a message whose framing was scanned (reused).
  std::vector<ScannedCommand> scanned;
  while (true) {
    auto received = std::make_shared<SessionMessage>();
    // The client ended the stream (or it was cancelled).
    if (!stream->Read(&received->bytes())) break;
    session->CountStreamBytes(received->bytes().Length(), 0);
    // A batch of commands: scanned, so that an op call the session ran
    // before is not parsed again (not while recording: the recorder keeps
    // parsed messages).
    absl::string_view flat;
    if (reuse_op_calls_ && recorder == nullptr && received->Flatten(&flat) &&
        ScanCommandBatch(flat, &scanned)) {
      if (absl::Status s = session->HandleScannedBatch(scanned, received->arena(), received);
          !s.ok()) {
        end = ToGrpc(s);
        break;
      }
      continue;
    }
    v1::ClientMessage& incoming = *received->message();
    if (absl::Status s = ParseClientMessage(received->bytes(), &incoming); !s.ok()) {
      end = ToGrpc(s);
      break;
    }
    if (recorder != nullptr) recorder->RecordIncoming(incoming);
    if (incoming.has_batch()) {
      if (absl::Status s = session->HandleBatch(incoming.mutable_batch(), received); !s.ok()) {
        end = ToGrpc(s);
        break;
      }
      continue;
    }
    end = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       incoming.has_open() ? "`open` was sent twice in one session"
                                          : "a session message carries neither open nor batch");
    break;
  }
  const bool cancelled = context->IsCancelled();
  const std::string how =
      cancelled ? "cancelled"
      : end.ok() ? "ended by the client"
                 : absl::StrCat("ended with ",
                                absl::StatusCodeToString(
                                    static_cast<absl::StatusCode>(end.error_code())));
  const auto close = [session, id = *id, pid = session->pid(), how] {
    const uint64_t commands = session->Info().commands();
    const daemon::Session::CloseSummary summary = session->Close();
    LogInfo(absl::StrCat("session ", id, " closed (pid ", pid, ", ", how, "): ", commands,
                         " commands, freed ", summary.segments, " segments (", summary.bytes,
                         " bytes)"));
  };
  if (cancelled) {
    // The client is gone: its slot is free now, and this thread returns
    // without waiting for a command of the session that still runs (the
    // session, closing, frees its memory when that command returns).
    session->Detach();
    registry_.Retire(*id, close);
    return Counted(end);
  }
  // Ended by the client, or for its error: its last replies and its
  // status go out once what runs returned.
  close();
  registry_.Remove(*id);
  return Counted(end);
}

}  // namespace flagos::daemon
