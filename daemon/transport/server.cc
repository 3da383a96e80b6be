#include "transport/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "execution/device_activity.h"
#include "transport/flagos_service.h"
#include "observability/health_check.h"
#include "logging.h"
#include "observability/metrics.h"
#include "observability/metrics_endpoint.h"
#include "sessions/session_registry.h"
#include "transport/attach_listener.h"
#include "transport/socket_acceptor.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {

Server::Server() = default;

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      const Backend* backend) {
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("--listen names no endpoint; give at least one");
  }
  if (options.max_sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-sessions must be at least 1, got ", options.max_sessions));
  }
  if (options.workers_per_device < 0 || options.workers_per_device > kMaxWorkersPerDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers-per-device must be 0 (the default, ", DefaultWorkersPerDevice(),
        " on this host) or 1..", kMaxWorkersPerDevice, ", got ", options.workers_per_device));
  }
  std::unique_ptr<Server> server(new Server());
  for (const std::string& spec : options.listen) {
    absl::StatusOr<ListenEndpoint> endpoint = ParseListenEndpoint(spec);
    if (!endpoint.ok()) return endpoint.status();
    // The system socket belongs to `flagos` unless --socket-group says
    // otherwise; a group asked for applies to every unix socket, which is
    // then shared with it (0660) unless --socket-mode says otherwise.
    const std::string group =
        options.socket_group.value_or(endpoint->system_socket ? kDefaultSocketGroup : "");
    if (!group.empty() && !endpoint->unix_path.empty()) endpoint->mode = 0660;
    if (options.socket_mode != 0 && !endpoint->unix_path.empty()) {
      endpoint->mode = options.socket_mode;
    }
    // Before anything listens: a missing group fails the start.
    if (absl::Status s = ResolveSocketGroup(*endpoint, group); !s.ok()) return s;
    if (absl::Status s = CheckTcpEndpoint(*endpoint, options.remote_access); !s.ok()) return s;
    // Fails early when another process listens there.
    if (absl::Status s = PrepareUnixSocket(*endpoint); !s.ok()) return s;
    server->listen_.push_back(*std::move(endpoint));
  }

  const double start_time = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const int devices = backend->runtime().DeviceCount();
  server->activity_ = std::make_unique<DeviceActivity>(devices);
  const int workers = options.workers_per_device > 0 ? options.workers_per_device
                                                     : DefaultWorkersPerDevice();
  std::vector<WorkerPool*> pools;
  for (int d = 0; d < devices; ++d) {
    server->pools_.push_back(
        std::make_unique<WorkerPool>(absl::StrCat("flagos:", d, " workers"), workers));
    pools.push_back(server->pools_.back().get());
  }
  const std::vector<WorkerPool*> probed_pools = pools;
  if (!options.metrics_listen.empty()) server->metrics_ = std::make_unique<Metrics>(devices);
  if (options.max_sessions_per_uid < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-sessions-per-uid must be 0 (no limit) or more, got ", options.max_sessions_per_uid));
  }
  server->registry_ =
      std::make_unique<SessionRegistry>(options.max_sessions, options.max_sessions_per_uid);
  // Without limits nothing is counted: allocations take no quota lock.
  if (options.memory_limits.session_bytes != 0 || options.memory_limits.uid_bytes != 0) {
    server->quotas_ = std::make_unique<MemoryQuotas>(options.memory_limits);
  }
  server->grants_ = std::make_unique<MemoryGrants>(options.memory_sharing);
  if (server->metrics_ != nullptr) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
        MetricsEndpoint::Start(options.metrics_listen, *backend, *server->registry_,
                               *server->activity_, *server->metrics_, start_time);
    if (metrics.ok()) {
      server->metrics_endpoint_ = *std::move(metrics);
    } else if (options.metrics_listen_required) {
      return metrics.status();
    } else {
      LogWarning(absl::StrCat(metrics.status().message(), "; serving without metrics"));
      server->metrics_.reset();
    }
  }
  uint64_t device_memory = 0;
  if (absl::StatusOr<DeviceProperties> properties = backend->runtime().GetDeviceProperties(0);
      properties.ok()) {
    device_memory = properties->total_memory;
  }
  server->op_limits_ = DefaultOpLimits(device_memory);
  if (options.max_op_elements != 0) server->op_limits_.max_elements = options.max_op_elements;
  if (options.max_op_host_memory_bytes != 0) {
    server->op_limits_.max_host_memory_bytes = options.max_op_host_memory_bytes;
  }
  server->service_ = std::make_unique<FlagosService>(backend, server->registry_.get(),
                                                     std::move(pools), server->activity_.get(),
                                                     server->metrics_.get(), start_time,
                                                     options.max_pending_opens,
                                                     options.open_deadline, server->op_limits_,
                                                     server->grants_.get());
  server->service_->set_record_dir(options.record_client_messages_dir);
  server->service_->set_reuse_op_calls(options.reuse_op_calls);
  server->service_->set_session_access(options.session_access);
  server->service_->set_memory_quotas(server->quotas_.get());
  for (const ListenEndpoint& endpoint : server->listen_) {
    if (endpoint.unix_path.empty()) continue;
    absl::StatusOr<std::unique_ptr<AttachListener>> staging = AttachListener::StartStaging(
        absl::StrCat(endpoint.unix_path, ".staging"), endpoint, server->registry_.get());
    if (!staging.ok()) return staging.status();
    server->staging_ = *std::move(staging);
    server->service_->set_staging_socket(server->staging_->path());
    break;
  }
  // Plaintext TCP (--insecure-tcp, loopback only) gets a sync listener on
  // the same address; TLS sessions keep synchronous commands on their
  // encrypted stream. A recording daemon (--record-client-messages) offers
  // none: the recorder sees the session stream only, and its TCP files
  // replay whole only when every command travelled there.
  for (const ListenEndpoint& endpoint : server->listen_) {
    if (!endpoint.unix_path.empty() || !endpoint.loopback || options.remote_access.tls() ||
        !options.remote_access.insecure_tcp || !options.record_client_messages_dir.empty()) {
      continue;
    }
    const std::string host = endpoint.uri.substr(0, endpoint.uri.rfind(':'));
    absl::StatusOr<std::unique_ptr<AttachListener>> sync =
        AttachListener::StartSync(host, server->registry_.get());
    if (!sync.ok()) return sync.status();
    server->sync_listener_ = *std::move(sync);
    server->service_->set_sync_port(server->sync_listener_->port());
    LogInfo(absl::StrCat("sync channels of TCP sessions on ", host, ":",
                         server->sync_listener_->port()));
    break;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(server->service_.get());
  // TCP endpoints are gRPC's; unix sockets the daemon accepts on itself
  // (below), to read each connection's peer credentials.
  std::vector<int> ports(server->listen_.size(), 0);
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  for (size_t i = 0; i < server->listen_.size(); ++i) {
    if (!server->listen_[i].unix_path.empty()) continue;
    if (tcp_credentials == nullptr) {
      absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> made =
          TcpServerCredentials(options.remote_access);
      if (!made.ok()) return made.status();
      tcp_credentials = *std::move(made);
    }
    builder.AddListeningPort(server->listen_[i].uri, tcp_credentials, &ports[i]);
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "flagosd cannot listen on ", absl::StrJoin(options.listen, ", "),
        " (gRPC's reason is logged above); check the addresses and that no other process uses "
        "them"));
  }
  for (size_t i = 0; i < server->listen_.size(); ++i) {
    const ListenEndpoint& endpoint = server->listen_[i];
    if (endpoint.unix_path.empty()) {
      const std::string& uri = endpoint.uri;
      server->endpoints_.push_back(absl::StrCat(uri.substr(0, uri.rfind(':')), ":", ports[i]));
      continue;
    }
    grpc::Server* grpc_server = server->server_.get();
    absl::StatusOr<std::unique_ptr<SocketAcceptor>> acceptor = SocketAcceptor::StartUnix(
        endpoint, "session socket",
        [grpc_server](int fd) { grpc::AddInsecureChannelFromFd(grpc_server, fd); });
    if (!acceptor.ok()) return acceptor.status();
    server->session_sockets_.push_back(*std::move(acceptor));
    server->endpoints_.push_back(
        absl::StartsWith(endpoint.unix_path, "/") ? absl::StrCat("unix://", endpoint.unix_path)
                                                  : endpoint.uri);
  }
  // The listener probe goes through a unix socket or plaintext TCP
  // endpoint; a daemon that serves only TLS is probed in-process.
  std::string probed = "in-process";
  grpc::ChannelArguments probe_args;
  probe_args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  HealthCheck::Connect connect = [grpc_server = server->server_.get(), probe_args] {
    return grpc_server->InProcessChannel(probe_args);
  };
  for (size_t i = 0; i < server->listen_.size(); ++i) {
    if (server->listen_[i].unix_path.empty() && options.remote_access.tls()) continue;
    probed = server->endpoints_[i];
    connect = [probed, probe_args] {
      return grpc::CreateCustomChannel(probed, grpc::InsecureChannelCredentials(), probe_args);
    };
    break;
  }
  // Each device's probe runs on the pool its sessions' queues run on.
  server->health_ = std::make_unique<HealthCheck>(&backend->runtime(), probed_pools, probed,
                                                  std::move(connect));
  return server;
}

std::string Server::metrics_url() const {
  return metrics_endpoint_ == nullptr ? std::string() : metrics_endpoint_->url();
}

int Server::workers_per_device() const {
  return pools_.empty() ? 0 : pools_.front()->workers();
}

size_t Server::session_count() const { return registry_->Snapshot().size(); }

size_t Server::pending_opens() const { return service_->pending_opens(); }

std::string Server::staging_socket() const {
  return staging_ == nullptr ? std::string() : staging_->path();
}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

void Server::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  for (const auto& socket : session_sockets_) socket->Stop();
  registry_->CancelAll();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void Server::Wait() {
  if (server_ == nullptr || waited_) return;
  server_->Wait();
  // Sessions whose client left free their memory once their running
  // commands returned.
  registry_->WaitClosed();
  waited_ = true;
  metrics_endpoint_.reset();
  if (staging_ != nullptr) staging_->Stop();
  if (sync_listener_ != nullptr) sync_listener_->Stop();
  for (const ListenEndpoint& endpoint : listen_) {
    if (!endpoint.unix_path.empty()) unlink(endpoint.unix_path.c_str());
  }
}

}  // namespace flagos::daemon
