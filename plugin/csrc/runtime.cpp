#include "runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "autograd_device_queues.h"
#include "graph_capture.h"
#include "pinned_allocator.h"

namespace torch_fl {
namespace {

// How long the first connection may take before the user gets an error.
constexpr absl::Duration kConnectTimeout = absl::Milliseconds(1800);
// How long a new session after a lost one waits for the daemon by default
// (systemd restarts the shipped unit after RestartSec=2).
constexpr double kDefaultReconnectTimeoutS = 30;
constexpr absl::Duration kReconnectInterval = absl::Milliseconds(100);

// What is left of a session the daemon ended.
struct LostSession {
  uint64_t session_id = 0;
  std::string endpoint;
  std::unique_ptr<flagos::client::Connection> connection;  // closed; kept until exit
};

struct RuntimeState {
  std::mutex mu;
  EndpointResolver resolver;
  std::string endpoint;
  // The current generation's connection; null before it opens.
  std::unique_ptr<flagos::client::Connection> connection;
  bool closed = false;  // guarded by mu; closed_at_exit mirrors it lock-free
  std::atomic<bool> closed_at_exit{false};
  std::atomic<uint64_t> generation{1};
  std::atomic<uint64_t> first_event_id{1};
  std::map<uint64_t, LostSession> lost;  // by generation
  // op "name.overload" → id; ids are minted here, starting at 1, and kept
  // across sessions (each new session gets every registration again).
  std::unordered_map<std::string, uint32_t> op_ids;
  std::vector<std::pair<std::string, std::string>> op_names;  // [id - 1]: name, overload
};

RuntimeState& State() {
  static auto* state = new RuntimeState();  // never destroyed: used at exit
  return *state;
}

thread_local int current_device = 0;
// Indexed by device; missing entries are the default stream.
thread_local std::vector<uint64_t> current_streams;

// c10::DeviceIndex is 8 bits: at most 128 devices.
constexpr size_t kMaxDevices = 128;
std::array<std::atomic<uint32_t>, kMaxDevices> next_pool_stream{};
std::atomic<uint64_t> next_event_id{1};

void CheckDeviceIndex(int device) {
  int count = DeviceCount();
  TORCH_CHECK(device >= 0 && device < count, "flagos: invalid device index ", device,
              ": the daemon serves ", count, " device(s) (flagos:0 .. flagos:", count - 1, ")");
}

// The stream a command runs on: the one given, else the one the command
// names already, else the current one.
void SetStream(flagos::v1::Command& command, std::optional<uint64_t> stream) {
  if (stream.has_value()) {
    command.set_stream(*stream);
  } else if (command.stream() == 0) {
    command.set_stream(CurrentStream(command.device()));
  }
}

[[noreturn]] void ThrowAcceleratorError(const std::string& message) {
  throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              /*code=*/0, message);
}

std::string LostSessionName(uint64_t generation, const LostSession& lost) {
  return "session " + std::to_string(lost.session_id) + " (generation " +
         std::to_string(generation) + ") with flagosd at " + lost.endpoint;
}

constexpr const char* kWhatToDo =
    "recreate what you need on flagos, e.g. rebuild the model and optimizer and load them from "
    "a checkpoint, and continue: the next flagos operation opens a new session, waiting up to "
    "FLAGOS_RECONNECT_TIMEOUT seconds for the daemon (docs/usage.md, \"When flagosd restarts\")";

// REQUIRES: s.mu held, s.connection ended and not closed by us. Moves the
// connection to the lost sessions, moves the generation on, and returns
// the lost-session message (`cause`: what reported the loss). The caller
// throws it, once, and closes the returned connection outside the lock.
std::string RetireLocked(RuntimeState& s, const std::string& cause,
                         flagos::client::Connection** to_close) {
  const uint64_t generation = s.generation.load(std::memory_order_relaxed);
  LostSession& lost = s.lost[generation];
  lost.session_id = s.connection->session_id();
  lost.endpoint = s.connection->endpoint();
  lost.connection = std::move(s.connection);
  *to_close = lost.connection.get();
  s.generation.store(generation + 1, std::memory_order_release);
  // The endpoint is resolved again: a private daemon is started anew.
  s.endpoint.clear();
  return "flagos: " + LostSessionName(generation, lost) + " was lost (" + cause +
         "); every flagos tensor, event and stream's work of that session is gone: " + kWhatToDo;
}

// If the current session has ended, retires it and throws the lost-session
// error; `cause` describes how it was noticed (else the session's own end
// status). REQUIRES: s.mu not held.
void ThrowIfSessionLost(const std::string& cause) {
  RuntimeState& s = State();
  std::string message;
  flagos::client::Connection* to_close = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.closed || s.connection == nullptr || !s.connection->ended()) return;
    std::string why = cause.empty() ? std::string(s.connection->SessionEnd().message()) : cause;
    message = RetireLocked(s, why, &to_close);
  }
  to_close->Close();  // its threads are done or end at once; bounded
  ThrowAcceleratorError(message);
}

double ReconnectTimeoutSeconds() {
  const char* value = std::getenv("FLAGOS_RECONNECT_TIMEOUT");
  if (value == nullptr || *value == '\0') return kDefaultReconnectTimeoutS;
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  TORCH_CHECK(end != value && *end == '\0' && seconds >= 0,
              "flagos: FLAGOS_RECONNECT_TIMEOUT=", value,
              " is not a number of seconds (>= 0); unset it for the default ",
              kDefaultReconnectTimeoutS);
  return seconds;
}

// REQUIRES: s.mu held. Enqueues the registration of op `id` on `connection`.
void EnqueueRegistration(flagos::client::Connection& connection, uint32_t id,
                         const std::string& name, const std::string& overload) {
  flagos::v1::Command command;
  command.set_device(0);
  auto* reg = command.mutable_register_op();
  reg->set_op_id(id);
  reg->set_name(name);
  reg->set_overload(overload);
  // The daemon refuses the op unless its torch has this schema (arguments
  // travel in schema order; another torch minor may have changed them).
  if (auto handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName(name, overload))) {
    reg->set_schema(c10::toString(handle->schema()));
  }
  connection.Enqueue(command, "register " + (overload.empty() ? name : name + "." + overload));
}

}  // namespace

void SetEndpointResolver(EndpointResolver resolver) {
  std::lock_guard<std::mutex> lock(State().mu);
  State().resolver = std::move(resolver);
}

namespace {

// The current session's connection, opening it if there is none; sets
// `*reopened` when it opened one after a lost session. REQUIRES: s.mu not
// held.
flagos::client::Connection& OpenSession(bool* reopened) {
  RuntimeState& s = State();
  // The resolver runs Python (it may start a private daemon), whose garbage
  // collector may free tensors, whose deleters take s.mu: call it unlocked.
  std::string endpoint;
  EndpointResolver resolver;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.connection) return *s.connection;  // another thread opened it meanwhile
    TORCH_CHECK(!s.closed, "flagos: the session with flagosd was closed at interpreter exit");
    TORCH_CHECK(s.resolver, "flagos: import torch_fl before using the flagos device");
    endpoint = s.endpoint;
    resolver = s.resolver;
  }
  if (endpoint.empty()) endpoint = resolver();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.connection) return *s.connection;
  TORCH_CHECK(!s.closed, "flagos: the session with flagosd was closed at interpreter exit");
  const bool reconnecting = !s.lost.empty();
  s.endpoint = endpoint;
  flagos::client::ConnectionOptions options;
  options.torch_version = TORCH_VERSION;  // the torch this plugin is built against
  auto connection = flagos::client::Connection::Open(s.endpoint, kConnectTimeout, "torch_fl",
                                                     options);
  if (reconnecting) {
    // The daemon may be restarting (systemd waits RestartSec first): try
    // again while it is unreachable, until FLAGOS_RECONNECT_TIMEOUT.
    const absl::Time deadline = absl::Now() + absl::Seconds(ReconnectTimeoutSeconds());
    while (!connection.ok() && connection.status().code() == absl::StatusCode::kUnavailable &&
           absl::Now() < deadline) {
      absl::SleepFor(kReconnectInterval);
      connection = flagos::client::Connection::Open(s.endpoint, kConnectTimeout, "torch_fl",
                                                    options);
    }
  }
  if (!connection.ok()) {
    s.endpoint.clear();  // resolve again next time (a private daemon may be restarted)
    TORCH_CHECK(false, std::string(connection.status().message()),
                reconnecting ? " (after a lost session; waited FLAGOS_RECONNECT_TIMEOUT)" : "");
  }
  s.connection = *std::move(connection);
  *reopened = reconnecting;
  // Events minted so far belong to the lost sessions.
  if (reconnecting) {
    s.first_event_id.store(next_event_id.load(std::memory_order_relaxed),
                           std::memory_order_release);
  }
  // Ids stay what they were (the plugin keeps them with each op): the new
  // session learns them all, before any command that uses one.
  for (size_t i = 0; i < s.op_names.size(); ++i) {
    EnqueueRegistration(*s.connection, static_cast<uint32_t>(i + 1), s.op_names[i].first,
                        s.op_names[i].second);
  }
  return *s.connection;
}

}  // namespace

// How deep this thread is in DeviceCount: torch's autograd engine counts
// devices as it starts, and a session that opens then must not grow the
// engine's queues under it (autograd_device_queues.h).
static thread_local int device_count_depth = 0;

flagos::client::Connection& Session() {
  RuntimeState& s = State();
  flagos::client::Connection* open = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.connection && !s.connection->ended()) open = s.connection.get();
  }
  if (open != nullptr) {
    if (device_count_depth == 0) EnsurePendingAutogradDeviceQueues();
    return *open;
  }
  ThrowIfSessionLost("");
  bool reopened = false;
  flagos::client::Connection& connection = OpenSession(&reopened);
  // An autograd engine that started before torch_fl was imported has no
  // queues for flagos devices yet (outside s.mu: its new workers count
  // devices as they start).
  EnsureAutogradDeviceQueues(connection.info().devices_size(), device_count_depth > 0);
  // Cached pinned blocks of a lost session would serve later pin_memory()
  // calls as ordinary memory: give them back now (outside s.mu; freeing
  // takes it).
  if (reopened) PinnedAllocator().empty_cache();
  return connection;
}

bool SessionOpen() {
  std::lock_guard<std::mutex> lock(State().mu);
  return State().connection != nullptr && !State().connection->ended();
}

void CloseSession() {
  std::unique_ptr<flagos::client::Connection> connection;
  {
    std::lock_guard<std::mutex> lock(State().mu);
    State().closed = true;
    State().closed_at_exit.store(true, std::memory_order_release);
    connection = std::move(State().connection);
  }
  if (connection) connection->Close();  // bounded: see Connection::Close
}

bool SessionClosedAtExit() { return State().closed_at_exit.load(std::memory_order_acquire); }

uint64_t CurrentGeneration() { return State().generation.load(std::memory_order_acquire); }

void CheckGeneration(uint64_t generation, const char* what) {
  RuntimeState& s = State();
  if (generation == 0 || generation == s.generation.load(std::memory_order_acquire)) return;
  std::string name = "session generation " + std::to_string(generation);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.lost.find(generation);
    if (it != s.lost.end()) name = LostSessionName(generation, it->second);
  }
  ThrowAcceleratorError(std::string("flagos: ") + what + " belongs to " + name +
                        ", which was lost; its contents are gone (never read or written "
                        "in the new session): " + kWhatToDo);
}

flagos::client::Connection* LiveSession(uint64_t generation) {
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (generation != s.generation.load(std::memory_order_relaxed) || s.connection == nullptr ||
      s.connection->ended()) {
    return nullptr;
  }
  return s.connection.get();
}

flagos::client::Connection* ConnectionOf(uint64_t generation) {
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (generation == s.generation.load(std::memory_order_relaxed)) return s.connection.get();
  auto it = s.lost.find(generation);
  return it == s.lost.end() ? nullptr : it->second.connection.get();
}

uint64_t FirstEventIdOfSession() {
  return State().first_event_id.load(std::memory_order_acquire);
}

int DeviceCountNoThrow() {
  {
    // Never the call that notices a lost session: its error would be
    // swallowed here (torch asks for the count all the time), and the
    // program would carry on unaware. The lost session's count until the
    // loss is reported by a call that raises.
    RuntimeState& s = State();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.connection != nullptr && s.connection->ended()) {
      return s.connection->info().devices_size();
    }
  }
  try {
    return DeviceCount();
  } catch (...) {
    return 0;
  }
}

int DeviceCount() {
  ++device_count_depth;
  struct Leave {
    ~Leave() { --device_count_depth; }
  } leave;
  return Session().info().devices_size();
}

int CurrentDevice() { return current_device; }

void SetCurrentDevice(int device) {
  if (device == current_device) return;
  CheckDeviceIndex(device);
  current_device = device;
}

uint64_t CurrentStream(int device) {
  if (device < 0 || static_cast<size_t>(device) >= current_streams.size()) return 0;
  return current_streams[device];
}

uint64_t ExchangeStream(int device, uint64_t stream) {
  TORCH_CHECK(stream <= static_cast<uint64_t>(kStreamPoolSize), "flagos: ", stream,
              " is not a flagos stream id (0 is the default stream, 1..", kStreamPoolSize,
              " the pool); get streams from torch.flagos.Stream()");
  const uint64_t previous = CurrentStream(device);
  if (stream == previous) return previous;
  CheckDeviceIndex(device);
  if (current_streams.size() <= static_cast<size_t>(device)) current_streams.resize(device + 1, 0);
  current_streams[device] = stream;
  return previous;
}

uint64_t PoolStream(int device) {
  CheckDeviceIndex(device);
  return next_pool_stream[device].fetch_add(1, std::memory_order_relaxed) % kStreamPoolSize + 1;
}

uint64_t NewEventId() { return next_event_id.fetch_add(1, std::memory_order_relaxed); }

uint32_t OpId(const std::string& name, const std::string& overload) {
  flagos::client::Connection& connection = Session();
  std::string key = overload.empty() ? name : name + "." + overload;
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.op_ids.find(key);
  if (it != s.op_ids.end()) return it->second;
  s.op_names.emplace_back(name, overload);
  const auto id = static_cast<uint32_t>(s.op_names.size());
  s.op_ids.emplace(std::move(key), id);
  // Enqueued under the lock so that registration precedes any use of the id
  // (on a connection that ended meanwhile it is dropped, and the next
  // session registers it with the rest).
  EnqueueRegistration(connection, id, name, overload);
  return id;
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  std::string message(status.message());
  // Whatever failed, a session that is over is reported as lost, once.
  ThrowIfSessionLost(message);
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  }
  if (status.code() == absl::StatusCode::kUnimplemented) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  }
  TORCH_CHECK(false, message);
}

bool LaunchBlocking() {
  static const bool blocking = [] {
    const char* value = std::getenv("FLAGOS_LAUNCH_BLOCKING");
    return value != nullptr && std::string(value) == "1";
  }();
  return blocking;
}

namespace {

// Enqueue's and EnqueueOpCallWire's common part: `send` appends the command
// to the session, which its addresses (encoded in generation `encoded_in`)
// must still belong to.
uint64_t SendToSession(int device, uint64_t encoded_in,
                       absl::FunctionRef<uint64_t(flagos::client::Connection&)> send) {
  flagos::client::Connection& session = Session();
  // After Session(): a loss reported meanwhile has moved the generation on.
  if (encoded_in != 0) CheckGeneration(encoded_in, "memory this operation names");
  const uint64_t seq = send(session);
  // Debugging: every command completes before its call returns, so an
  // asynchronous failure is raised by the call that caused it.
  if (LaunchBlocking()) Synchronize(device);
  return seq;
}

}  // namespace

uint64_t Enqueue(flagos::v1::Command& command, absl::string_view describe,
                 std::optional<uint64_t> stream, uint64_t encoded_in) {
  SetStream(command, stream);
  // Work on a capturing stream is held back for the graph (graph_capture.h).
  if (TakeIntoCapture(command, describe)) return 0;
  return SendToSession(command.device(), encoded_in, [&](flagos::client::Connection& session) {
    return session.Enqueue(command, describe);
  });
}

bool EnqueueOpCallWire(int device, uint32_t op_id, OpCallWire& wire, absl::string_view describe,
                       uint64_t encoded_in) {
  if (AnyCapture()) return false;
  const uint64_t stream = CurrentStream(device);
  SendToSession(device, encoded_in, [&](flagos::client::Connection& session) {
    return session.EnqueueSerialized(wire.Serialize(device, stream, op_id), describe);
  });
  return true;
}

flagos::v1::Completion Call(flagos::v1::Command command, std::string describe,
                            std::optional<uint64_t> stream, uint64_t encoded_in) {
  SetStream(command, stream);
  if (!command.has_define_graph()) {
    RefuseWhileCapturing(command.device(), command.stream(), describe);
  }
  flagos::client::Connection& session = Session();
  if (encoded_in != 0) CheckGeneration(encoded_in, "memory this operation names");
  return ValueOrThrow(session.Call(std::move(command), std::move(describe)));
}

void Synchronize(int device) {
  RefuseWhileCapturing(device < 0 ? CurrentDevice() : device, std::nullopt,
                       "synchronizing the device");
  ThrowIfError(Session().Synchronize(device));
}

}  // namespace torch_fl
