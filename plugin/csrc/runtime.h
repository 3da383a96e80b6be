// The process-wide flagos runtime of torch_fl: one session with the daemon,
// opened lazily at first use, plus the per-session operator id registry and
// the calling thread's current device.
//
// Errors from the daemon become c10 exceptions here, at one boundary:
// RESOURCE_EXHAUSTED → c10::OutOfMemoryError (torch.OutOfMemoryError), every
// other code → c10::Error (RuntimeError) with the daemon's message.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "flagos/client/connection.h"

namespace torch_fl {

// Resolves the daemon endpoint (FLAGOS_ENDPOINT, the system socket, or a
// private daemon). Installed by the Python package; called once, at the first
// use of a flagos device.
using EndpointResolver = std::function<std::string()>;
void SetEndpointResolver(EndpointResolver resolver);

// The session, opened on first call. Throws c10::Error when the daemon cannot
// be reached (naming the endpoint and how to start flagosd).
flagos::client::Connection& Session();
// True once a session is open and not closed.
bool SessionOpen();
// Ends the session (at interpreter exit). Later device frees are dropped.
void CloseSession();

// Number of devices the daemon serves; 0 if it cannot be reached.
int DeviceCountNoThrow();
int DeviceCount();

// The calling thread's current device (default 0).
int CurrentDevice();
void SetCurrentDevice(int device);

// The session's id for operator `name.overload`, registering it with the
// daemon (asynchronously) on first use.
uint32_t OpId(const std::string& name, const std::string& overload);

// Throws the c10 exception for `status` if it is not OK.
void ThrowIfError(const absl::Status& status);
template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

// FLAGOS_LAUNCH_BLOCKING=1: Enqueue waits for each command (debugging).
bool LaunchBlocking();

// Enqueue / call on the session, throwing on error.
uint64_t Enqueue(flagos::v1::Command command, std::string describe);
flagos::v1::Completion Call(flagos::v1::Command command, std::string describe);
void Synchronize(int device);

}  // namespace torch_fl
