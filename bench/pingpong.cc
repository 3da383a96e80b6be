// flagos-bench-pingpong: the cost of one synchronous round trip between two
// processes over a Unix socket, the floor under any request/reply protocol.
//
// A socketpair(AF_UNIX, SOCK_STREAM); fork; the child echoes every byte it
// reads; the parent sends 1 byte and waits for it to come back, N times per
// repetition. Prints one line per repetition and a last line
//   median_us=<microseconds per round trip>
// which bench/roundtrip.py reads.
//
//   flagos-bench-pingpong [--iterations=N] [--repeats=R] [--warmup=W]

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool ParseFlag(const char* arg, const char* name, long* value) {
  const std::string prefix = std::string("--") + name + "=";
  if (std::strncmp(arg, prefix.c_str(), prefix.size()) != 0) return false;
  char* end = nullptr;
  const long parsed = std::strtol(arg + prefix.size(), &end, 10);
  if (end == arg + prefix.size() || *end != '\0' || parsed <= 0) {
    std::fprintf(stderr, "flagos-bench-pingpong: bad value in %s\n", arg);
    std::exit(2);
  }
  *value = parsed;
  return true;
}

// Writes or reads exactly one byte, retrying on EINTR. False on EOF or error.
bool SendByte(int fd, char byte) {
  for (;;) {
    const ssize_t n = write(fd, &byte, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

bool ReceiveByte(int fd, char* byte) {
  for (;;) {
    const ssize_t n = read(fd, byte, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

[[noreturn]] void Echo(int fd) {
  char byte;
  while (ReceiveByte(fd, &byte)) {
    if (!SendByte(fd, byte)) break;
  }
  _exit(0);
}

bool RoundTrips(int fd, long count) {
  char byte = 'p';
  for (long i = 0; i < count; ++i) {
    if (!SendByte(fd, byte) || !ReceiveByte(fd, &byte)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 20000;
  long repeats = 5;
  long warmup = 2000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: flagos-bench-pingpong [--iterations=N] [--repeats=R] [--warmup=W]\n"
          "1-byte round trips between two processes over a Unix socketpair;\n"
          "prints microseconds per round trip for each repetition, then median_us=.\n");
      return 0;
    }
    if (!ParseFlag(argv[i], "iterations", &iterations) &&
        !ParseFlag(argv[i], "repeats", &repeats) && !ParseFlag(argv[i], "warmup", &warmup)) {
      std::fprintf(stderr, "flagos-bench-pingpong: unknown argument %s (see --help)\n", argv[i]);
      return 2;
    }
  }

  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::perror("flagos-bench-pingpong: socketpair");
    return 1;
  }
  const pid_t child = fork();
  if (child < 0) {
    std::perror("flagos-bench-pingpong: fork");
    return 1;
  }
  if (child == 0) {
    close(fds[0]);
    Echo(fds[1]);
  }
  close(fds[1]);

  bool ok = RoundTrips(fds[0], warmup);
  std::vector<double> per_trip_us;
  for (long r = 0; ok && r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    ok = RoundTrips(fds[0], iterations);
    const std::chrono::duration<double, std::micro> elapsed =
        std::chrono::steady_clock::now() - start;
    per_trip_us.push_back(elapsed.count() / static_cast<double>(iterations));
    if (ok) std::printf("repeat %ld: %.3f us per round trip\n", r + 1, per_trip_us.back());
  }
  close(fds[0]);  // the child sees EOF and exits
  int status = 0;
  waitpid(child, &status, 0);
  if (!ok) {
    std::fprintf(stderr, "flagos-bench-pingpong: the echo process went away\n");
    return 1;
  }
  std::sort(per_trip_us.begin(), per_trip_us.end());
  const size_t n = per_trip_us.size();
  const double median =
      n % 2 == 1 ? per_trip_us[n / 2] : (per_trip_us[n / 2 - 1] + per_trip_us[n / 2]) / 2;
  std::printf("median_us=%.3f\n", median);
  return 0;
}
