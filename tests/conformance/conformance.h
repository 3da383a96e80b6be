// The runtime conformance suite: backend-agnostic checks of the
// DeviceRuntime contract (backends/include/flagos/runtime.h), without any
// operator. Every backend contributes one registration (a function in its
// own <backend>_registration.cc, listed in RegisteredBackends()); the suite
// runs every test against each. This is the runtime bring-up gate: a new
// backend passes it before anything runs on it.
#ifndef FLAGOS_TESTS_CONFORMANCE_CONFORMANCE_H_
#define FLAGOS_TESTS_CONFORMANCE_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "flagos/runtime.h"

namespace flagos::conformance {

struct BackendRegistration {
  // Test name suffix: letters, digits and underscores.
  std::string name;
  // A fresh runtime with at least one device whose memory is at least 16 MiB
  // and at most a few GiB (the suite allocates all of it once).
  std::function<absl::StatusOr<std::unique_ptr<DeviceRuntime>>()> create;
};

// Test parameters print as the backend name.
inline void PrintTo(const BackendRegistration& backend, std::ostream* os) { *os << backend.name; }

// One per backend file.
BackendRegistration CpuBackend();
// The kunlunxin backend over the fake libxpurt (built when tests/fakes/xpurt
// is present: FLAGOS_CONFORMANCE_KUNLUNXIN_FAKE).
BackendRegistration KunlunxinFakeBackend();

// The backends this build tests.
inline std::vector<BackendRegistration> RegisteredBackends() {
  return {
      CpuBackend(),
#ifdef FLAGOS_CONFORMANCE_KUNLUNXIN_FAKE
      KunlunxinFakeBackend(),
#endif
  };
}

}  // namespace flagos::conformance

#endif  // FLAGOS_TESTS_CONFORMANCE_CONFORMANCE_H_
