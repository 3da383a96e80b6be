// flagosd's gRPC server: listens on the --listen endpoints and serves the
// Flagos service (and grpc.health.v1) until Shutdown.
//
// Thread safety: Shutdown may be called from any thread (a signal thread);
// the other methods from the owning thread.
#ifndef FLAGOS_DAEMON_TRANSPORT_SERVER_H_
#define FLAGOS_DAEMON_TRANSPORT_SERVER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "execution/backend.h"
#include "transport/listen_endpoint.h"
#include "memory/memory_grants.h"
#include "memory/memory_quotas.h"
#include "ops/op_limits.h"
#include "admission/pending_opens.h"
#include "admission/remote_access.h"
#include "admission/session_access.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace flagos::daemon {

class DeviceActivity;
class FlagosService;
class HealthCheck;
class Metrics;
class MetricsEndpoint;
class SessionRegistry;
class AttachListener;
class SocketAcceptor;
class WorkerPool;

// The largest gRPC message flagosd sends or accepts.
inline constexpr int kMaxMessageBytes = 256 << 20;

// The most --workers-per-device accepts.
inline constexpr int kMaxWorkersPerDevice = 1024;

// The default --metrics-listen.
inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:9400";

struct ServerOptions {
  std::vector<std::string> listen = {kDefaultListen};
  // The mode of the unix socket files (--socket-mode); 0: the endpoint's
  // default (0660 for the system socket, 0600 for any other path).
  mode_t socket_mode = 0;
  // The group the unix socket files are given (--socket-group). Unset: the
  // system socket's is kDefaultSocketGroup and other sockets keep the
  // daemon's group; set: every unix socket's (empty: none), mode 0660
  // unless socket_mode says otherwise.
  std::optional<std::string> socket_group;
  // Who may open a session (--allow-uid, --allow-gid).
  SessionAccess session_access;
  // --session-memory-limit, --uid-memory-limit (0: none).
  MemoryLimits memory_limits;
  // --max-sessions-per-uid (0: none).
  int max_sessions_per_uid = 0;
  // TLS, the token and --insecure-tcp, for TCP endpoints.
  RemoteAccessOptions remote_access;
  int max_sessions = 256;
  // Threads per device that run every session's stream queues
  // (--workers-per-device); 0: DefaultWorkersPerDevice().
  int workers_per_device = 0;
  // Streams waiting for their `open` at once, and how long each may wait
  // (PendingOpens).
  size_t max_pending_opens = kMaxPendingOpens;
  // Which sessions may import another's device memory (MemoryGrants).
  MemoryGrants::Policy memory_sharing = MemoryGrants::Policy::kSameUser;
  absl::Duration open_deadline = kOpenDeadline;
  // Where /metrics is served (host:port); empty: no metrics endpoint, and
  // the command path counts nothing for it.
  std::string metrics_listen;
  // When false (metrics_listen is the default, not asked for), an address
  // that cannot be listened on is logged and metrics are off; when true,
  // Start fails.
  bool metrics_listen_required = true;
  // Per-op bounds (op_limits.h): the tensor elements one call may name
  // (--max-op-elements) and the host memory its kernel may hold
  // (--max-op-host-memory). 0: the default from device 0's memory
  // (DefaultOpLimits).
  uint64_t max_op_elements = 0;
  uint64_t max_op_host_memory_bytes = 0;
  // Op calls sent again byte for byte run as prepared the time before
  // (--reuse-op-calls; sessions/repeated_op_calls.h).
  bool reuse_op_calls = true;
  // Tests only (scripts/fuzz's seed corpus): a directory every session's
  // client messages are written into (MessageRecorder); empty: none.
  std::string record_client_messages_dir;
};

class Server {
 public:
  // Listens on every endpoint of `options.listen`. Fails naming the
  // endpoint when one cannot be used. `backend` must outlive the server.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       const Backend* backend);
  // Shutdown(zero grace) and Wait().
  ~Server();

  // The staging socket's path; empty when there is none.
  std::string staging_socket() const;

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The endpoints listened on (a TCP port 0 replaced by the chosen port).
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // "http://host:port/metrics", or empty when metrics are off.
  std::string metrics_url() const;
  // Null when metrics are off.
  Metrics* metrics() const { return metrics_.get(); }
  // Workers in each device's pool.
  int workers_per_device() const;
  // The per-op bounds in force (defaults resolved).
  const OpLimits& op_limits() const { return op_limits_; }
  // Live sessions.
  size_t session_count() const;
  // Streams waiting for their `open`.
  size_t pending_opens() const;
  // The health check: a probe through each device's pool and the device,
  // and the listener (the watchdog runs it; main starts its device probes
  // at SIGTERM).
  HealthCheck& health_check() const { return *health_; }

  // Stops accepting, cancels every session (each frees what it holds) and
  // gives in-flight unary calls `grace` to finish. Idempotent.
  void Shutdown(absl::Duration grace);
  // Returns once the server has shut down and every handler has returned.
  void Wait();

 private:
  Server();

  // First: every session (and the service) holding it goes before it.
  std::unique_ptr<MemoryGrants> grants_;
  // Null when neither --session-memory-limit nor --uid-memory-limit is set.
  std::unique_ptr<MemoryQuotas> quotas_;
  std::unique_ptr<DeviceActivity> activity_;
  // One per device: the threads that run the sessions' stream queues.
  // Destroyed after every session (declared before them).
  std::vector<std::unique_ptr<WorkerPool>> pools_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<SessionRegistry> registry_;
  // Next to the first unix endpoint; none when flagosd listens on TCP only.
  std::unique_ptr<AttachListener> staging_;
  // Beside the first plaintext TCP endpoint; none otherwise.
  std::unique_ptr<AttachListener> sync_listener_;
  std::unique_ptr<FlagosService> service_;
  std::unique_ptr<grpc::Server> server_;
  // The unix --listen sockets, whose connections go to server_.
  std::vector<std::unique_ptr<SocketAcceptor>> session_sockets_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::unique_ptr<HealthCheck> health_;
  std::vector<ListenEndpoint> listen_;
  std::vector<std::string> endpoints_;
  OpLimits op_limits_;
  bool waited_ = false;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_SERVER_H_
