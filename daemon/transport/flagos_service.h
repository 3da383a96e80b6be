// The gRPC service flagos.v1.Flagos: Negotiate, GetStats and the Session
// stream (see proto/flagos/v1/flagos.proto).
//
// Thread safety: gRPC calls the handlers from its own threads, concurrently.
#ifndef FLAGOS_DAEMON_TRANSPORT_FLAGOS_SERVICE_H_
#define FLAGOS_DAEMON_TRANSPORT_FLAGOS_SERVICE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "execution/backend.h"
#include "execution/device_activity.h"
#include "memory/memory_grants.h"
#include "memory/memory_quotas.h"
#include "observability/metrics.h"
#include "ops/op_limits.h"
#include "admission/pending_opens.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "admission/session_access.h"
#include "sessions/session_registry.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {

inline constexpr char kDaemonVersion[] = "0.1.0";
inline constexpr uint32_t kMinProtocolVersion = 1;
inline constexpr uint32_t kMaxProtocolVersion = 1;

class FlagosService final : public v1::Flagos::Service {
 public:
  // All must outlive the service; `metrics` may be null (metrics off).
  // `pools`: one per device, where sessions' stream queues run.
  // `start_time_unix`: when the daemon started (GetStats reports it).
  // At most `max_pending_opens` streams wait for their `open` at once, each
  // for at most `open_deadline` (PendingOpens). Every session's ops are
  // bounded by `op_limits`, which GetStats reports. Sessions share memory
  // through `grants` (null: they share none).
  FlagosService(const Backend* backend, SessionRegistry* registry,
                std::vector<WorkerPool*> pools, DeviceActivity* activity,
                Metrics* metrics, double start_time_unix, size_t max_pending_opens,
                absl::Duration open_deadline, const OpLimits& op_limits,
                MemoryGrants* grants = nullptr);

  // The staging socket offered to sessions opened over a unix socket (empty:
  // none). Call before the server starts.
  void set_staging_socket(std::string path) { staging_socket_ = std::move(path); }
  // The sync listener's port offered to sessions opened over TCP (0: none;
  // they keep synchronous commands on the session stream). Call before the
  // server starts.
  void set_sync_port(int port) { sync_port_ = port; }
  // Writes every session's client messages into `dir` as fuzzing inputs
  // (MessageRecorder; empty: none, the default). Call before the server
  // starts.
  void set_record_dir(std::string dir) { record_dir_ = std::move(dir); }
  // Whether a session's batches are scanned so that an op call sent again
  // byte for byte runs as prepared (sessions/repeated_op_calls.h; the
  // default); false: every message is parsed whole. Call before the server
  // starts.
  void set_reuse_op_calls(bool reuse) { reuse_op_calls_ = reuse; }
  // Who may open a session; before the first call.
  void set_session_access(SessionAccess access) { access_ = std::move(access); }
  // The device-memory quotas every session counts in (may stay null: none);
  // before the first call, and outliving the sessions.
  void set_memory_quotas(MemoryQuotas* quotas) { quotas_ = quotas; }

  // Streams waiting for their `open`.
  size_t pending_opens() const { return pending_opens_.waiting(); }

  grpc::Status Negotiate(grpc::ServerContext* context, const v1::NegotiateRequest* request,
                         v1::NegotiateResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;
  // The Session stream's messages arrive as bytes, which the service parses
  // itself (the constructor installs this handler in place of the generated
  // one): gRPC's own Read cannot tell a message that fails to parse from the
  // end of the stream. One that fails ends the session with INVALID_ARGUMENT.
  using SessionStream = grpc::ServerReaderWriter<v1::ServerMessage, grpc::ByteBuffer>;
  // Runs one session from `open` to the end of the stream; returns after
  // the session released everything it held.
  grpc::Status RunSession(grpc::ServerContext* context, SessionStream* stream);

 private:
  // Devices as Negotiate and GetStats report them; used_memory sums the
  // segments of all live sessions and the shared segments only importers
  // hold.
  void AddDevices(google::protobuf::RepeatedPtrField<v1::DeviceInfo>* devices) const;
  // The same, with each device's used memory summed over `sessions` (open
  // and closing): GetStats passes the sessions it lists, so that a reply
  // never counts the memory of a session it does not list.
  void AddDevices(google::protobuf::RepeatedPtrField<v1::DeviceInfo>* devices,
                  const std::vector<std::shared_ptr<daemon::Session>>& sessions) const;

  // Counts a call that ends with `status` (rpc errors) and returns it.
  grpc::Status Counted(grpc::Status status) const;

  const Backend& backend_;
  SessionRegistry& registry_;
  MemoryGrants* const grants_;
  const std::vector<WorkerPool*> pools_;
  DeviceActivity& activity_;
  Metrics* const metrics_;
  const double start_time_;  // seconds since the epoch
  const OpLimits op_limits_;
  std::string staging_socket_;
  int sync_port_ = 0;
  std::string record_dir_;
  bool reuse_op_calls_ = true;
  SessionAccess access_;
  MemoryQuotas* quotas_ = nullptr;
  PendingOpens pending_opens_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_FLAGOS_SERVICE_H_
