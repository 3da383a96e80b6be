// The fakes' environment parsing (FAKE_XPU_*, FAKE_XPUML_*), shared by the
// fake libxpurt and the fake libxpuml: a malformed value aborts the load
// with a line naming the variable, so a test cannot run on a fake
// configured other than it meant.
#ifndef FLAGOS_TESTS_FAKES_XPURT_FAKE_ENV_H_
#define FLAGOS_TESTS_FAKES_XPURT_FAKE_ENV_H_

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace fake_env {

// `library` is "fake libxpurt" or "fake libxpuml".
[[noreturn]] inline void ConfigError(const char* library, const char* var,
                                     const std::string& what) {
  std::fprintf(stderr, "%s: bad %s: %s\n", library, var, what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return std::string(s.substr(b, e - b));
}

inline long long ParseInt(const char* library, const char* var, const std::string& text,
                          long long lo, long long hi) {
  if (text.empty()) ConfigError(library, var, "empty number");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') {
    ConfigError(library, var, "'" + text + "' is not an integer");
  }
  if (v < lo || v > hi) {
    ConfigError(library, var,
                "'" + text + "' is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

}  // namespace fake_env

#endif  // FLAGOS_TESTS_FAKES_XPURT_FAKE_ENV_H_
