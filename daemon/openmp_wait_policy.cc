#include "openmp_wait_policy.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace flagos::daemon {
namespace {

constexpr char kPolicy[] = "OMP_WAIT_POLICY";
constexpr char kSpinCount[] = "GOMP_SPINCOUNT";

// A debugger or tracer (gdb, strace) is attached: /proc/self/status's
// TracerPid is not 0.
bool Traced() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "TracerPid:")) {
      int pid = 0;
      return absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &pid) && pid != 0;
    }
  }
  return false;
}

}  // namespace

std::string ExecWithPassiveOpenMpWaiting(char** argv) {
  if (std::getenv(kPolicy) != nullptr || std::getenv(kSpinCount) != nullptr || Traced()) {
    return "";
  }
  if (setenv(kPolicy, "PASSIVE", /*overwrite=*/1) != 0) {
    return absl::StrCat("could not set ", kPolicy, ": ", std::strerror(errno));
  }
  execv("/proc/self/exe", argv);
  // Still here: the exec failed. This image's libgomp read the environment
  // already; keep the variable out of what the log says.
  const int error = errno;
  unsetenv(kPolicy);
  return absl::StrCat("could not execute /proc/self/exe again with ", kPolicy,
                      "=PASSIVE (", std::strerror(error), "); ATen's OpenMP threads spin after "
                      "each parallel region, taking cores from the clients: set ", kPolicy,
                      "=PASSIVE in flagosd's environment");
}

std::string OpenMpWaitPolicyDescription() {
  if (const char* policy = std::getenv(kPolicy)) return absl::StrCat(kPolicy, "=", policy);
  if (const char* spin = std::getenv(kSpinCount)) return absl::StrCat(kSpinCount, "=", spin);
  return "libgomp's default (threads spin after each parallel region)";
}

}  // namespace flagos::daemon
