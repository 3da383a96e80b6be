// flagosd: the flagos device daemon. Parses flags, creates the backend,
// serves until SIGTERM or SIGINT, then shuts down and frees everything.
#include <pthread.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "execution/backend.h"
#include "flagos/cli/command_line.h"
#include "admission/store_networks.h"
#include "byte_size.h"
#include "transport/flagos_service.h"
#include "absl/synchronization/mutex.h"
#include "transport/listen_endpoint.h"
#include "logging.h"
#include "ops/op_servability.h"
#include "transport/server.h"
#include "observability/health_check.h"
#include "observability/stalled_shutdown_guard.h"
#include "observability/watchdog.h"
#include "openmp_wait_policy.h"

ABSL_FLAG(std::vector<std::string>, listen,
          std::vector<std::string>({flagos::daemon::kDefaultListen}),
          "Endpoints to serve on; repeat the flag or separate them with commas. "
          "unix:///path/to/socket listens on a unix socket (the parent directory is created, "
          "a stale socket file is replaced; mode 0660 and group `flagos` for the default "
          "system socket, 0600 for any other path; --socket-mode). host:port listens on TCP, "
          "which needs --tls-cert, --tls-key and --token-file, or on loopback (localhost, "
          "127.0.0.1, [::1]) --insecure-tcp.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain TCP endpoints serve TLS with (with --tls-key and --token-file).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: with it, TCP clients must present a certificate that chains to "
          "one of them (mutual TLS).");
ABSL_FLAG(std::string, token_file, "",
          "A file holding the bearer token every call over TCP must carry (clients: "
          "FLAGOS_TOKEN or FLAGOS_TOKEN_FILE); compared in constant time, never logged. "
          "Generate one with `openssl rand -hex 32`.");
ABSL_FLAG(bool, insecure_tcp, false,
          "Allow plaintext TCP on loopback --listen addresses (no TLS, no token, no user known: "
          "anyone on this node may connect); for tests, or the end of an SSH tunnel.");
ABSL_FLAG(std::string, socket_mode, "",
          "File mode of the unix sockets (octal, e.g. 0660): who may connect at all. Empty "
          "(the default): 0660 for the default system socket, 0600 for any other path.");
ABSL_FLAG(std::string, socket_group, flagos::daemon::kDefaultSocketGroup,
          "Group the unix sockets are given, so that its members may connect. By default "
          "only the system socket (unix:///run/flagosd/flagosd.sock) is given to group `flagos`; "
          "given on the command line it applies to every unix --listen socket, which is then "
          "0660 unless --socket-mode says otherwise. A group that does not exist fails the "
          "start (create it with `addgroup --system flagos`; the Debian package's postinst "
          "does). Empty (--socket-group=): no group is set.");
ABSL_FLAG(std::vector<std::string>, allow_uid, {},
          "Users who may open a session (names or uids, comma-separated); with --allow-gid, "
          "a peer matching either may. The user is the kernel's (the unix socket's peer "
          "credentials), never the client's word; root and flagosd's own user always may. "
          "Others get PERMISSION_DENIED naming the rule; so does every TCP session, which "
          "carries no user. Empty (the default): whoever can open the socket.");
ABSL_FLAG(std::vector<std::string>, allow_gid, {},
          "Groups whose members may open a session (names or gids, comma-separated; the "
          "peer's primary and supplementary groups count). See --allow-uid.");
ABSL_FLAG(std::vector<std::string>, store_networks, {"auto"},
          "Where flagosd may connect for a process group that spans daemons (torchrun across "
          "nodes, a private daemon per rank): the job's c10d Store, whose address a client "
          "names, and the other daemons of the group, at the addresses published there, "
          "must lie in these networks (comma-separated): auto (the default: loopback "
          "and the networks of this host's interfaces), any, none (refuse such groups), or "
          "CIDRs and addresses (10.20.0.0/16, fd00::/8). Keeps a client from making flagosd "
          "connect elsewhere on its behalf. See docs/distributed.md.");
ABSL_FLAG(flagos::daemon::ByteSize, session_memory_limit, flagos::daemon::ByteSize{0},
          "Most device memory one session may hold on each device (bytes, or a number with a "
          "suffix, as --device-memory); an allocation beyond it fails, and the client's "
          "torch.OutOfMemoryError names the limit. 0 (the default): no limit.");
ABSL_FLAG(flagos::daemon::ByteSize, uid_memory_limit, flagos::daemon::ByteSize{0},
          "Most device memory the sessions of one user (the kernel's uid) may hold together on "
          "each device, as --session-memory-limit; the error names the user's sessions and "
          "what each holds. 0 (the default): no limit.");
ABSL_FLAG(int, max_sessions_per_uid, 0,
          "Most sessions one user (the kernel's uid) may have open at once; more are refused "
          "with RESOURCE_EXHAUSTED. 0 (the default): only --max-sessions.");
ABSL_FLAG(std::string, backend, "auto",
          "Device backend: auto, cpu or kunlunxin. kunlunxin drives Kunlun P800 devices "
          "through the vendor runtime libxpurt, loaded at start from $FLAGOS_KUNLUNXIN_XPURT, "
          "$XPU_ROOT/so or the loader path (docs/vendors/kunlunxin/installation.md); its "
          "operators run on the daemon's cpu_fallback route. cpu emulates --cpu-devices "
          "devices in host memory and runs operators with ATen's CPU kernels. auto picks "
          "kunlunxin when libxpurt loads and reports devices, else cpu; on a node with P800 "
          "device nodes (/dev/xpu*) whose runtime does not load, auto fails naming the library "
          "and the variable to set (it never emulates there: say --backend=cpu for that).");
ABSL_FLAG(std::string, ops_conf, "",
          "The operator routes to use instead of those built in (backends/<name>/ops.conf): a "
          "node's route file, as scripts/kunlunxin-calibrate writes it. Default for kunlunxin: "
          "/etc/flagos/kunlunxin-ops.conf when it exists, else the built-in file.");
ABSL_FLAG(std::string, xdnn_module, "",
          "kunlunxin: the xdnn binding module (libflagos_kunlunxin_xdnn.so) to load. Default: "
          "$FLAGOS_KUNLUNXIN_XDNN_MODULE, else <flagosd's directory>/../lib/flagosd/. Without "
          "one every kunlunxin operator takes cpu_fallback.");
ABSL_FLAG(std::string, op_route, "",
          "Route every operator this way instead of by the backend's ops.conf: native or "
          "cpu_fallback. For testing: --backend=cpu --op-route=cpu_fallback runs the "
          "daemon's copy-to-host route that a non-host-addressable device takes.");
ABSL_FLAG(std::vector<std::string>, decompose_ops, {},
          "Composite operators (comma-separated, as aten::op.overload; no overload for the "
          "default one) not to run as one call: they are left out of the composite operators "
          "flagosd reports at the handshake, so clients decompose them into the operators they "
          "are made of, each on its own route. For a backend whose native kernels for those "
          "beat the composite's cpu_fallback, and for testing. Default: none.");
ABSL_FLAG(int, cpu_devices, 2, "Number of emulated devices of the cpu backend (1..64).");
ABSL_FLAG(flagos::daemon::ByteSize, device_memory, flagos::daemon::ByteSize{8ull << 30},
          "Memory of each cpu-backend device: bytes, or a number with suffix K, KiB, M, MiB, G, "
          "GiB, T or TiB (powers of 1024), e.g. 8GiB or 512M. Allocations beyond it fail with "
          "an out-of-memory error. Host memory is only used as tensors are written.");
ABSL_FLAG(bool, list_served_ops, false,
          "Print every operator of flagosd's torch with whether register_op serves it (and why "
          "not), then exit.");
ABSL_FLAG(bool, describe_backend, false,
          "Print the backend's runtime slot table (each slot of the contract: implemented, "
          "emulated and how, or a gap and why) and its operator routes as Markdown, then exit "
          "without listening (docs/reference/backends.md is made of this output).");
ABSL_FLAG(std::string, metrics_listen, flagos::daemon::kDefaultMetricsListen,
          "Where to serve Prometheus metrics over HTTP (GET /metrics): host:port, e.g. "
          "127.0.0.1:9400, 0.0.0.0:9400 for a scraper on another host, or port 0 for a free "
          "port (the ready line names it). Empty (--metrics-listen=) disables metrics: no "
          "listener and nothing counted on the command path. docs/operations.md lists them.");
ABSL_FLAG(std::string, record_client_messages, "",
          "Testing only: write every message clients send into this existing directory, one "
          "file each, rewritten to replay on their own (the fuzzer's seed corpus, scripts/fuzz; "
          "docs/operations.md). Empty (the default): nothing is recorded.");
ABSL_FLAG(bool, reuse_op_calls, true,
          "Run an operator call that a session sends again byte for byte (the same op, tensors "
          "at the same addresses, scalars), its memory unchanged since, as the call prepared "
          "the time before: no parse, decoding or checks again (docs/performance.md). "
          "--reuse-op-calls=false parses and checks every call, to compare.");
ABSL_FLAG(uint64_t, max_op_elements, 0,
          "Most tensor elements one operator call may name, summed over every tensor it names "
          "(arguments, list elements, outputs); a call naming more is refused with "
          "RESOURCE_EXHAUSTED before it runs. It bounds the work a view with stride 0 over a "
          "few bytes can ask for. 0 (the default): max(2^32, 4 x the device memory in bytes), "
          "which a program of dense tensors cannot reach (docs/reference/errors.md).");
ABSL_FLAG(flagos::daemon::ByteSize, max_op_host_memory, flagos::daemon::ByteSize{0},
          "Most host memory an operator's kernel may hold while it runs (its results and "
          "temporaries, allocated through ATen's CPU allocator: the cpu backend and the "
          "cpu_fallback route); an allocation beyond it fails the call with "
          "RESOURCE_EXHAUSTED. Bytes, or a number with suffix K, KiB, M, MiB, G, GiB, T or TiB, "
          "as --device-memory. 0 (the default): max(1GiB, the device memory).");
ABSL_FLAG(int, max_sessions, 256,
          "Most client sessions served at once; further sessions are refused with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, memory_sharing, "same-user",
          "Which client processes may use device memory another one shares with them "
          "(torch.multiprocessing): same-user (processes of the sharing process's user, known "
          "from the unix socket's peer credentials), any-user, or off.");
ABSL_FLAG(int, workers_per_device, 0,
          "Threads per device that run the commands of every session's streams (1..1024); 0 "
          "picks 2 x the host's cores, at least 4 and at most 64. A stream is an ordering, not "
          "a thread: however many sessions and streams there are, flagosd's threads stay bounded "
          "(docs/operations.md, \"Threads\"). At most this many streams of one device run at "
          "once.");

namespace flagos::daemon {
namespace {

// How long after SIGTERM a device's health probe may stay outstanding
// before flagosd stops waiting for the device and exits
// (StalledShutdownGuard); within the unit's TimeoutStopSec=15, so the log
// says why rather than systemd's SIGKILL.
constexpr absl::Duration kStalledShutdownGrace = absl::Seconds(5);

constexpr char kUsage[] =
    "the flagos device daemon.\n\n"
    "flagosd owns this node's devices and runs PyTorch operators for clients that\n"
    "`import torch_fl` (FLAGOS_ENDPOINT names the endpoint; unix:///run/flagosd/flagosd.sock\n"
    "by default). Each client process holds one session; when it ends, cleanly or not,\n"
    "everything it allocated is freed.\n\n"
    "Usage: flagosd [--listen=unix:///run/flagosd/flagosd.sock] [--backend=auto]\n"
    "               [--cpu-devices=2] [--device-memory=8GiB] [--max-sessions=256]\n"
    "               [--metrics-listen=127.0.0.1:9400] [--workers-per-device=0]\n"
    "               [--max-op-elements=0] [--max-op-host-memory=0]\n\n"
    "flagosd prints one line on stdout when it is ready:\n"
    "  flagosd 0.1.0 listening on unix:///run/flagosd/flagosd.sock (backend cpu, 2 devices x "
    "8GiB)\n"
    "and logs to stderr. Prometheus scrapes http://127.0.0.1:9400/metrics. Under systemd it\n"
    "sends READY=1, STATUS= lines and, with WatchdogSec, WATCHDOG=1 after health checks.\n"
    "SIGTERM or SIGINT stops it: sessions are cancelled, memory is freed,\n"
    "and it exits with status 0; with status 1, 5 s after the signal, when a device\n"
    "no longer completes work and so the shutdown cannot finish.";

// --listen accumulates when repeated (absl keeps the last): repeated
// occurrences in `args` (flag names already normalized, NormalizeFlagNames)
// are merged into one comma-separated value.
std::vector<std::string> MergeListenFlags(std::vector<std::string> args) {
  std::vector<std::string> merged;
  std::vector<std::string> listen;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (i > 0 && arg == "--") {  // everything after it is positional
      for (; i < args.size(); ++i) merged.push_back(std::move(args[i]));
      break;
    }
    if (i > 0 && (absl::StartsWith(arg, "--listen") || absl::StartsWith(arg, "-listen"))) {
      const absl::string_view rest = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-listen");
      if (absl::StartsWith(rest, "=")) {
        listen.emplace_back(rest.substr(1));
        continue;
      }
      if (rest.empty() && i + 1 < args.size()) {
        listen.push_back(std::move(args[++i]));
        continue;
      }
    }
    merged.push_back(std::move(arg));
  }
  if (!listen.empty()) {
    merged.insert(merged.begin() + 1, absl::StrCat("--listen=", absl::StrJoin(listen, ",")));
  }
  return merged;
}

// The backend's slot table and routes, as Markdown.
std::string DescribeBackend(const Backend& backend) {
  const CapabilityTable& table = backend.runtime().capabilities();
  std::string out = absl::StrCat("## ", backend.name(), "\n\n",
                                 "| group | slot | status | how, or why not |\n"
                                 "|---|---|---|---|\n");
  for (int i = 0; i < kSlotCount; ++i) {
    const Slot slot = static_cast<Slot>(i);
    std::string note = table.Declared(slot) ? table.Note(slot) : "not declared by the backend";
    absl::StrReplaceAll({{"|", "\\|"}, {"\n", " "}}, &note);
    absl::StrAppend(&out, "| ", SlotGroup(slot), " | `", SlotName(slot), "` | ",
                    SlotStatusName(table.status(slot)), " | ", note, " |\n");
  }
  const OpRoutes& routes = backend.routes();
  absl::StrAppend(&out, "\nOperator routes (backends/", backend.name(), "/ops.conf): ",
                  routes.native_count(), " of ", routes.size(), " listed operators native, ",
                  routes.size() - routes.native_count(), " cpu_fallback; operators not listed: ",
                  OpRouteName(routes.default_route()), ".\n");
  return out;
}

int Fail(absl::string_view message) {
  std::fprintf(stderr, "flagosd: %.*s\n", static_cast<int>(message.size()), message.data());
  return 1;
}

int Run(int argc, char** argv) {
  // First: it may execute flagosd again (openmp_wait_policy.h).
  const std::string openmp_exec_failure = ExecWithPassiveOpenMpWaiting(argv);
  // Debian's abseil checks every lock against a global lock graph; that is
  // about a sixth of a queue worker's instructions per command. Lock order
  // is documented per class and checked by the thread-safety annotations.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(kUsage);
  // --help lists the daemon's own flags (those of this file).
  const cli::ToolDescription tool{"flagosd", kUsage, "daemon/main.cc", TorchVersion()};
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [tool] { return cli::VersionLine(tool) + "\n"; };
  absl::SetFlagsUsageConfig(usage_config);

  // SIGTERM and SIGINT are taken by a dedicated thread (sigwait); block them
  // before any other thread exists so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::string> merged = MergeListenFlags(cli::NormalizeFlagNames(argc, argv));
  if (std::optional<int> answered = cli::AnswerHelpOrVersion(merged, tool)) return *answered;
  std::vector<char*> merged_argv;
  for (std::string& arg : merged) merged_argv.push_back(arg.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(merged_argv.size()), merged_argv.data());
  if (positional.size() > 1) {
    return Fail(absl::StrCat("unexpected argument '", positional[1],
                             "'; flagosd takes flags only (see --help)"));
  }

  BackendOptions backend_options;
  backend_options.name = absl::GetFlag(FLAGS_backend);
  backend_options.force_route = absl::GetFlag(FLAGS_op_route);
  backend_options.ops_conf = absl::GetFlag(FLAGS_ops_conf);
  backend_options.xdnn_module = absl::GetFlag(FLAGS_xdnn_module);
  backend_options.decompose_ops = absl::GetFlag(FLAGS_decompose_ops);
  backend_options.cpu_devices = absl::GetFlag(FLAGS_cpu_devices);
  backend_options.device_memory = absl::GetFlag(FLAGS_device_memory).bytes;
  // Test-only (tests/python/test_backend_auto.py): where --backend=auto
  // looks for P800 device nodes instead of /dev/xpu*.
  if (const char* glob = std::getenv("FLAGOS_XPU_DEVICE_GLOB"); glob != nullptr && *glob != '\0') {
    backend_options.xpu_device_glob = glob;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create(backend_options);
  if (!backend.ok()) return Fail(backend.status().message());
  if (absl::GetFlag(FLAGS_list_served_ops)) {  // with the backend's own operators registered
    const std::string table = ListServedOps();
    std::fwrite(table.data(), 1, table.size(), stdout);
    return 0;
  }
  if (absl::GetFlag(FLAGS_describe_backend)) {
    const std::string description = DescribeBackend(**backend);
    std::fwrite(description.data(), 1, description.size(), stdout);
    return 0;
  }

  ServerOptions server_options;
  server_options.listen = absl::GetFlag(FLAGS_listen);
  server_options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  if (const std::string mode = absl::GetFlag(FLAGS_socket_mode); !mode.empty()) {
    char* end = nullptr;
    const unsigned long value = std::strtoul(mode.c_str(), &end, 8);
    if (end == mode.c_str() || *end != '\0' || value == 0 || value > 0777) {
      return Fail(absl::StrCat("--socket-mode=", mode,
                               ": expected an octal file mode from 0001 to 0777, e.g. 0660"));
    }
    server_options.socket_mode = static_cast<mode_t>(value);
  }
  if (std::any_of(merged.begin(), merged.end(), [](const std::string& arg) {
        return absl::StartsWith(arg, "--socket_group") || absl::StartsWith(arg, "-socket_group");
      })) {
    server_options.socket_group = absl::GetFlag(FLAGS_socket_group);
  }
  absl::StatusOr<std::vector<int64_t>> allowed_uids =
      ParseAllowedUsers(absl::GetFlag(FLAGS_allow_uid));
  if (!allowed_uids.ok()) return Fail(allowed_uids.status().message());
  absl::StatusOr<std::vector<int64_t>> allowed_gids =
      ParseAllowedGroups(absl::GetFlag(FLAGS_allow_gid));
  if (!allowed_gids.ok()) return Fail(allowed_gids.status().message());
  server_options.session_access.uids = *std::move(allowed_uids);
  server_options.session_access.gids = *std::move(allowed_gids);
  server_options.memory_limits.session_bytes = absl::GetFlag(FLAGS_session_memory_limit).bytes;
  server_options.memory_limits.uid_bytes = absl::GetFlag(FLAGS_uid_memory_limit).bytes;
  server_options.max_sessions_per_uid = absl::GetFlag(FLAGS_max_sessions_per_uid);
  server_options.remote_access.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  server_options.remote_access.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  server_options.remote_access.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  server_options.remote_access.token_file = absl::GetFlag(FLAGS_token_file);
  server_options.remote_access.insecure_tcp = absl::GetFlag(FLAGS_insecure_tcp);
  absl::StatusOr<flagos::daemon::StoreNetworks> store_networks =
      flagos::daemon::StoreNetworks::Parse(absl::GetFlag(FLAGS_store_networks));
  if (!store_networks.ok()) return Fail(store_networks.status().message());
  flagos::daemon::StoreNetworks::SetCurrent(*std::move(store_networks));
  absl::StatusOr<MemoryGrants::Policy> sharing =
      MemoryGrants::ParsePolicy(absl::GetFlag(FLAGS_memory_sharing));
  if (!sharing.ok()) return Fail(sharing.status().message());
  server_options.memory_sharing = *sharing;
  server_options.workers_per_device = absl::GetFlag(FLAGS_workers_per_device);
  server_options.max_op_elements = absl::GetFlag(FLAGS_max_op_elements);
  server_options.max_op_host_memory_bytes = absl::GetFlag(FLAGS_max_op_host_memory).bytes;
  server_options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  // An address asked for must be served; the default one may be taken (by
  // the node's system flagosd, when this is a private one): then a warning.
  server_options.metrics_listen_required =
      std::any_of(merged.begin(), merged.end(), [](const std::string& arg) {
        return absl::StartsWith(arg, "--metrics_listen") || absl::StartsWith(arg, "-metrics_listen");
      });
  server_options.record_client_messages_dir = absl::GetFlag(FLAGS_record_client_messages);
  server_options.reuse_op_calls = absl::GetFlag(FLAGS_reuse_op_calls);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(server_options, backend->get());
  if (!server.ok()) return Fail(server.status().message());

  const DeviceRuntime& runtime = (*backend)->runtime();
  uint64_t device_memory = 0;
  if (absl::StatusOr<DeviceProperties> properties = runtime.GetDeviceProperties(0);
      properties.ok()) {
    device_memory = properties->total_memory;
  }
  std::string ready = absl::StrCat(
      "flagosd ", kDaemonVersion, " listening on ", absl::StrJoin((*server)->endpoints(), ", "),
      " (backend ", (*backend)->name(), ", ", runtime.DeviceCount(), " devices x ",
      FormatByteSize(device_memory), ")");
  if (const std::string url = (*server)->metrics_url(); !url.empty()) {
    absl::StrAppend(&ready, "; metrics on ", url);
  }
  std::printf("%s\n", ready.c_str());
  std::fflush(stdout);
  LogInfo(absl::StrCat(ready, "; torch ", TorchVersion()));
  if (!openmp_exec_failure.empty()) LogWarning(openmp_exec_failure);
  LogInfo(absl::StrCat("ATen's OpenMP threads between parallel regions: ",
                       OpenMpWaitPolicyDescription()));
  const OpLimits& op_limits = (*server)->op_limits();
  LogInfo(absl::StrCat("per-op limits: ", op_limits.max_elements,
                       " tensor elements per call (--max-op-elements), ",
                       FormatByteSize(op_limits.max_host_memory_bytes),
                       " of host memory per kernel (--max-op-host-memory)"));
  // Who may use the devices, and how much.
  const auto limit = [](uint64_t bytes) {
    return bytes == 0 ? std::string("none") : FormatByteSize(bytes);
  };
  LogInfo(absl::StrCat(
      "sessions: ", server_options.session_access.restricted()
                        ? server_options.session_access.Describe()
                        : std::string("whoever can open the socket"),
      "; device memory per session and device ", limit(server_options.memory_limits.session_bytes),
      " (--session-memory-limit), per user and device ",
      limit(server_options.memory_limits.uid_bytes), " (--uid-memory-limit); sessions per user ",
      server_options.max_sessions_per_uid == 0 ? std::string("no limit")
                                               : absl::StrCat(server_options.max_sessions_per_uid),
      " (--max-sessions-per-uid)"));
  // systemd Type=notify: ready once the devices are up and the sockets
  // listen (a no-op when not started by systemd).
  sd_notify(0, absl::StrCat("READY=1\nSTATUS=", ready).c_str());
  // WATCHDOG=1 after passing health checks, and STATUS= updates.
  auto watchdog = std::make_unique<Watchdog>(
      server->get(), absl::StrCat(runtime.DeviceCount(), " devices (", (*backend)->name(), ")"));

  // Set by the signal thread: bounds a shutdown that a stuck device keeps
  // from finishing.
  std::unique_ptr<StalledShutdownGuard> stalled_shutdown_guard;
  std::thread signal_thread([&stop_signals, &server, &watchdog, &stalled_shutdown_guard] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    LogInfo(absl::StrCat("received ", strsignal(signal_number),
                         ": cancelling sessions and shutting down"));
    sd_notify(0, "STOPPING=1\nSTATUS=stopping: cancelling sessions");
    watchdog->Stop();
    stalled_shutdown_guard = std::make_unique<StalledShutdownGuard>(
        (*server)->health_check().StartDeviceProbes(), kStalledShutdownGrace);
    (*server)->Shutdown(absl::Seconds(1));
  });
  (*server)->Wait();
  signal_thread.join();
  watchdog.reset();
  server->reset();
  backend->reset();
  stalled_shutdown_guard.reset();
  LogInfo("flagosd stopped");
  return 0;
}

}  // namespace
}  // namespace flagos::daemon

int main(int argc, char** argv) { return flagos::daemon::Run(argc, argv); }
