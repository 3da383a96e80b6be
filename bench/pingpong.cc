// flagos-bench-pingpong: the cost of one synchronous round trip between two
// processes over a Unix socket (or TCP on loopback), the floor under any
// request/reply protocol; and, with --stream-bytes, the raw one-way
// throughput of the same connection, the ceiling of any bulk copy over it.
//
// A socketpair(AF_UNIX, SOCK_STREAM), or with --tcp a TCP connection on
// 127.0.0.1 (TCP_NODELAY on both ends); fork; the child echoes every byte
// it reads; the parent sends 1 byte and waits for it to come back, N times
// per repetition. Prints one line per repetition and a last line
//   median_us=<microseconds per round trip>
// which bench/roundtrip.py reads. With --stream-bytes=B the parent sends B
// bytes per repetition (1 MiB writes), the child reads them all and answers
// 1 byte; the last line is
//   median_gbps=<GB/s>
//
//   flagos-bench-pingpong [--tcp] [--iterations=N] [--repeats=R] [--warmup=W]
//                         [--stream-bytes=B]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

// The child of a --stream-bytes run: reads `bytes` per repetition, answers
// one byte each time.
[[noreturn]] void Sink(int fd, long bytes) {
  std::vector<char> buffer(1 << 20);
  while (true) {
    long left = bytes;
    while (left > 0) {
      const ssize_t n = read(fd, buffer.data(), std::min<long>(left, buffer.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) _exit(0);
      left -= n;
    }
    if (!SendByte(fd, 'k')) _exit(0);
  }
}

bool Stream(int fd, long bytes) {
  static std::vector<char> buffer(1 << 20, 'x');
  long left = bytes;
  while (left > 0) {
    const ssize_t n = write(fd, buffer.data(), std::min<long>(left, buffer.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    left -= n;
  }
  char byte;
  return ReceiveByte(fd, &byte);
}

// A connected pair of TCP sockets on 127.0.0.1, TCP_NODELAY on both.
bool TcpPair(int fds[2]) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return false;
  }
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (fds[0] < 0 || connect(fds[0], reinterpret_cast<sockaddr*>(&address), length) != 0) {
    return false;
  }
  fds[1] = accept(listener, nullptr, nullptr);
  close(listener);
  if (fds[1] < 0) return false;
  const int one = 1;
  for (int i = 0; i < 2; ++i) setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return true;
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
  long stream_bytes = 0;
  bool tcp = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: flagos-bench-pingpong [--tcp] [--iterations=N] [--repeats=R] [--warmup=W]\n"
          "                             [--stream-bytes=B]\n"
          "1-byte round trips between two processes over a Unix socketpair (--tcp: TCP on\n"
          "127.0.0.1); prints microseconds per round trip for each repetition, then\n"
          "median_us=. --stream-bytes: B bytes one way per repetition, then median_gbps=.\n");
      return 0;
    }
    if (std::strcmp(argv[i], "--tcp") == 0) {
      tcp = true;
      continue;
    }
    if (!ParseFlag(argv[i], "stream-bytes", &stream_bytes) &&
        !ParseFlag(argv[i], "iterations", &iterations) &&
        !ParseFlag(argv[i], "repeats", &repeats) && !ParseFlag(argv[i], "warmup", &warmup)) {
      std::fprintf(stderr, "flagos-bench-pingpong: unknown argument %s (see --help)\n", argv[i]);
      return 2;
    }
  }

  int fds[2];
  if (tcp ? !TcpPair(fds) : socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::perror(tcp ? "flagos-bench-pingpong: TCP on 127.0.0.1" : "flagos-bench-pingpong: socketpair");
    return 1;
  }
  const pid_t child = fork();
  if (child < 0) {
    std::perror("flagos-bench-pingpong: fork");
    return 1;
  }
  if (child == 0) {
    close(fds[0]);
    if (stream_bytes > 0) Sink(fds[1], stream_bytes);
    Echo(fds[1]);
  }
  close(fds[1]);

  if (stream_bytes > 0) {
    bool ok = Stream(fds[0], stream_bytes);  // warm-up
    std::vector<double> gbps;
    for (long r = 0; ok && r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      ok = Stream(fds[0], stream_bytes);
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      gbps.push_back(static_cast<double>(stream_bytes) / elapsed.count() / 1e9);
      if (ok) std::printf("repeat %ld: %.3f GB/s\n", r + 1, gbps.back());
    }
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    if (!ok) {
      std::fprintf(stderr, "flagos-bench-pingpong: the sink process went away\n");
      return 1;
    }
    std::sort(gbps.begin(), gbps.end());
    const size_t n = gbps.size();
    std::printf("median_gbps=%.3f\n", n % 2 == 1 ? gbps[n / 2] : (gbps[n / 2 - 1] + gbps[n / 2]) / 2);
    return 0;
  }

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
