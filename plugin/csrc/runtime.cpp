#include "runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/time/time.h"

namespace torch_fl {
namespace {

// How long the first connection may take before the user gets an error.
constexpr absl::Duration kConnectTimeout = absl::Milliseconds(1800);

struct RuntimeState {
  std::mutex mu;
  EndpointResolver resolver;
  std::string endpoint;
  std::unique_ptr<flagos::client::Connection> connection;
  bool closed = false;
  // op "name.overload" → id; ids are minted here, starting at 1.
  std::unordered_map<std::string, uint32_t> op_ids;
  uint32_t next_op_id = 1;
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

}  // namespace

void SetEndpointResolver(EndpointResolver resolver) {
  std::lock_guard<std::mutex> lock(State().mu);
  State().resolver = std::move(resolver);
}

flagos::client::Connection& Session() {
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.connection) return *s.connection;
  TORCH_CHECK(!s.closed, "flagos: the session with flagosd was closed at interpreter exit");
  if (s.endpoint.empty()) {
    TORCH_CHECK(s.resolver, "flagos: import torch_fl before using the flagos device");
    s.endpoint = s.resolver();
  }
  flagos::client::ConnectionOptions options;
  options.torch_version = TORCH_VERSION;  // the torch this plugin is built against
  auto connection =
      flagos::client::Connection::Open(s.endpoint, kConnectTimeout, "torch_fl", options);
  if (!connection.ok()) {
    s.endpoint.clear();  // resolve again next time (a private daemon may be restarted)
    TORCH_CHECK(false, std::string(connection.status().message()));
  }
  s.connection = *std::move(connection);
  s.op_ids.clear();
  s.next_op_id = 1;
  return *s.connection;
}

bool SessionOpen() {
  std::lock_guard<std::mutex> lock(State().mu);
  return State().connection != nullptr && !State().connection->closed();
}

void CloseSession() {
  std::unique_ptr<flagos::client::Connection> connection;
  {
    std::lock_guard<std::mutex> lock(State().mu);
    State().closed = true;
    connection = std::move(State().connection);
  }
  if (connection) connection->Close();  // bounded: see Connection::Close
}

int DeviceCountNoThrow() {
  try {
    return DeviceCount();
  } catch (...) {
    return 0;
  }
}

int DeviceCount() { return Session().info().devices_size(); }

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
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.op_ids.find(key);
    if (it != s.op_ids.end()) return it->second;
    id = s.next_op_id++;
    s.op_ids.emplace(key, id);
    // Enqueue under the lock so that registration precedes any use of the id.
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
    connection.Enqueue(std::move(command), "register " + key);
  }
  return id;
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  std::string message(status.message());
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

uint64_t Enqueue(flagos::v1::Command command, std::string describe,
                 std::optional<uint64_t> stream) {
  const int device = command.device();
  SetStream(command, stream);
  uint64_t seq = Session().Enqueue(std::move(command), std::move(describe));
  // Debugging: every command completes before its call returns, so an
  // asynchronous failure is raised by the call that caused it.
  if (LaunchBlocking()) Synchronize(device);
  return seq;
}

flagos::v1::Completion Call(flagos::v1::Command command, std::string describe,
                            std::optional<uint64_t> stream) {
  SetStream(command, stream);
  return ValueOrThrow(Session().Call(std::move(command), std::move(describe)));
}

void Synchronize(int device) { ThrowIfError(Session().Synchronize(device)); }

}  // namespace torch_fl
