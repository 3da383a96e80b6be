// flagosd's logger: one line per message on stderr,
//   2025-01-31T12:00:00.123456Z flagosd INFO: session 3 opened (pid 4711)
//
// A plain function, not a macro: ATen's c10/util/Logging.h defines LOG(...),
// absl/log and glog do too, and a translation unit must not mix them. Every
// daemon file logs through this header only.
//
// Thread safety: lines from concurrent callers never interleave.
#ifndef FLAGOS_DAEMON_LOGGING_H_
#define FLAGOS_DAEMON_LOGGING_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flagos::daemon {

enum class LogLevel { kInfo, kWarning, kError };

inline void Log(LogLevel level, absl::string_view message) {
  const char* name = level == LogLevel::kInfo      ? "INFO"
                     : level == LogLevel::kWarning ? "WARNING"
                                                   : "ERROR";
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()), " flagosd ",
      name, ": ", message, "\n");
  // One fwrite per line: stdio locks the stream for the call.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_LOGGING_H_
