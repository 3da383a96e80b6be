// The process-wide flagos runtime of torch_fl: one session with the daemon,
// opened lazily at first use, plus the per-session operator id registry and
// the calling thread's current device and current stream of each device.
//
// Streams and events are named by ids minted here, without a round trip
// (the daemon creates its queues and backend objects at first use): stream 0
// is each device's default stream, streams 1..kStreamPoolSize its pool
// (torch.flagos.Stream() hands them out round-robin, as CUDA's pool does);
// event ids count up from 1 for the whole process.
//
// Errors from the daemon become c10 exceptions here, at one boundary:
// RESOURCE_EXHAUSTED → c10::OutOfMemoryError (torch.OutOfMemoryError), every
// other code → c10::Error (RuntimeError) with the daemon's message.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "flagos/client/connection.h"
#include "op_call_wire.h"

namespace torch_fl {

// Resolves the daemon endpoint (FLAGOS_ENDPOINT, the system socket, or a
// private daemon). Installed by the Python package; called once, at the first
// use of a flagos device.
using EndpointResolver = std::function<std::string()>;
void SetEndpointResolver(EndpointResolver resolver);

// The session, opened on first call. Throws c10::Error when the daemon cannot
// be reached (naming the endpoint and how to start flagosd).
//
// Sessions are numbered by generation (1, 2, ...). When the daemon ends the
// session (it crashed, was restarted, or closed it), the first call that
// notices — Session() itself, or ThrowIfError on any error — throws
// c10::AcceleratorError (torch.AcceleratorError) naming the lost session,
// once; the generation moves on, and the next Session() opens a new session
// (re-resolving the endpoint, so a private daemon is started again, and
// waiting up to FLAGOS_RECONNECT_TIMEOUT seconds, default 30, for a daemon
// that systemd is restarting). Every tensor, event and pinned region of the
// lost session stays lost: CheckGeneration refuses its memory. The lost
// session's Connection is kept (closed) until exit, since pinned blocks and
// other threads may still hold it.
flagos::client::Connection& Session();
// True once a session is open and neither closed nor ended.
bool SessionOpen();
// Ends the session (at interpreter exit). Later device frees are dropped.
void CloseSession();
// True once CloseSession ran: the daemon has released everything the
// session held, so its work is over (events count as complete). Lock-free.
bool SessionClosedAtExit();

// The generation of the current session: the one the next command goes to
// (it moves on once a loss was reported, before the new session opens).
// Lock-free.
uint64_t CurrentGeneration();
// Throws c10::AcceleratorError naming the lost session when `generation`
// (of a tensor's memory, 0 for none) is not the current session's: its
// memory is gone, and its addresses may name another session's now. `what`
// names the object ("a tensor's memory", "an event").
//
// The generation moves on when a loss is reported, before any new session
// opens. A command that names device memory takes CurrentGeneration()
// before it encodes any address and passes it to Enqueue/Call
// (`encoded_in`), which refuse it if a loss was reported meanwhile (by
// another thread): so no address of a lost session reaches a new one.
void CheckGeneration(uint64_t generation, const char* what);
// For cleanup paths (deleters, caches): the connection of session
// `generation` if it is still the current one and alive, else nullptr.
// Never connects, reconnects or throws.
flagos::client::Connection* LiveSession(uint64_t generation);
// The connection of session `generation`, current or lost (kept until
// exit), or nullptr if it never opened. Never connects or throws.
flagos::client::Connection* ConnectionOf(uint64_t generation);
// The first event id minted for the current session: a lower id names an
// event of a lost session.
uint64_t FirstEventIdOfSession();

// Number of devices the daemon serves; 0 if it cannot be reached.
int DeviceCountNoThrow();
int DeviceCount();

// The calling thread's current device (default 0).
int CurrentDevice();
void SetCurrentDevice(int device);

// Streams per device besides the default stream (ids 1..kStreamPoolSize).
inline constexpr int kStreamPoolSize = 8;

// The calling thread's current stream on `device` (0, the default stream,
// until set).
uint64_t CurrentStream(int device);
// Makes `stream` the calling thread's current stream on `device` (the
// current device does not change); returns the previous one. Throws for an
// invalid device or a stream id that is not a flagos stream.
uint64_t ExchangeStream(int device, uint64_t stream);
// The next stream of `device`'s pool, round-robin.
uint64_t PoolStream(int device);
// A fresh event id (> 0).
uint64_t NewEventId();

// The session's id for operator `name.overload`, registering it with the
// daemon (asynchronously) on first use.
uint32_t OpId(const std::string& name, const std::string& overload);

// Throws the c10 exception for `status` if it is not OK; the lost-session
// c10::AcceleratorError instead when the session has ended (see Session()).
void ThrowIfError(const absl::Status& status);
template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

// FLAGOS_LAUNCH_BLOCKING=1: Enqueue waits for each command (debugging).
bool LaunchBlocking();

// Enqueue / call on the session, throwing on error. The command runs on
// `stream` when given, else on the stream it names already, else (stream 0)
// on the calling thread's current stream of its device: every command the
// plugin sends carries its stream.
// `encoded_in`: the CurrentGeneration() taken before the command's
// addresses were encoded (0: it names no device memory); see
// CheckGeneration.
// The command is serialized before Enqueue returns: it may live anywhere (an
// operator call the wire writer does not take is built on a protobuf arena
// on the caller's stack), and Enqueue sets its stream.
uint64_t Enqueue(flagos::v1::Command& command, absl::string_view describe,
                 std::optional<uint64_t> stream = std::nullopt, uint64_t encoded_in = 0);
inline uint64_t Enqueue(flagos::v1::Command&& command, absl::string_view describe,
                        std::optional<uint64_t> stream = std::nullopt, uint64_t encoded_in = 0) {
  return Enqueue(command, describe, stream, encoded_in);
}
// Enqueues the operator call `wire` holds, as Enqueue would the same
// Command (stream 0: the calling thread's current stream of `device`).
// Returns false, sending nothing, while a graph capture runs anywhere in the
// process: the caller then enqueues the Command, which a capture can hold.
bool EnqueueOpCallWire(int device, uint32_t op_id, OpCallWire& wire, absl::string_view describe,
                       uint64_t encoded_in);
flagos::v1::Completion Call(flagos::v1::Command command, std::string describe,
                            std::optional<uint64_t> stream = std::nullopt,
                            uint64_t encoded_in = 0);
void Synchronize(int device);

}  // namespace torch_fl
