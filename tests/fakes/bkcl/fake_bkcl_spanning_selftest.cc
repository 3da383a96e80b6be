// Self-test of the fake libbkcl's communicators whose ranks are in
// different processes (fake_bkcl_hub.h), as the ranks of a process group
// that spans daemons are. Plain C++, no test framework:
//
//   fake_bkcl_spanning_selftest <path to libxpurt.so.2> <path to libbkcl.so>
//
// The parent makes each id and runs its ranks (one thread each); every
// other rank is a child process, this program run again with --rank. Each
// rank checks its own results against host arithmetic (the helpers of
// fake_bkcl_selftest_util.h) and exits non-zero on a failed check; the
// parent fails when any rank did. ctest also runs it with
// FAKE_XPU_DELAY_US=5000.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "fake_bkcl_selftest_util.h"

extern char** environ;

namespace {

using namespace selftest;  // NOLINT: the test's own helpers

constexpr size_t kCount = 7;
constexpr char kSentinel = 0x5A;
constexpr uint64_t kBytes = 4096;

std::string Hex(const bkcl::UniqueId& id) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    s += kHex[static_cast<unsigned char>(c) >> 4];
    s += kHex[static_cast<unsigned char>(c) & 15];
  }
  return s;
}

bkcl::UniqueId Unhex(const std::string& s) {
  bkcl::UniqueId id{};
  for (size_t i = 0; i < sizeof(id.internal) && 2 * i + 1 < s.size(); ++i) {
    id.internal[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  }
  return id;
}

struct Rank {
  int rank, n, device;
  bkcl::Context ctx = nullptr;
  void* stream = nullptr;
  void* send = nullptr;
  void* recv = nullptr;

  // `fill` elements of the rank's inputs into send, the sentinel into recv;
  // the call; then recv's `got` elements once the stream reached it.
  template <typename Call>
  std::vector<double> Run(int dt, size_t fill, size_t got, Call call) {
    Put(send, Encode(dt, Inputs(dt, rank, fill)));
    Put(recv, std::vector<char>(kBytes, kSentinel));
    CHECK_RC(call(), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(stream), 0);
    return Decode(dt, Get(recv, got * Size(dt)));
  }

  bool Untouched() {
    const std::vector<char> b = Get(recv, kBytes);
    return std::all_of(b.begin(), b.end(), [](char c) { return c == kSentinel; });
  }
};

// What every rank of a healthy spanning communicator runs.
void Collectives(Rank& s) {
  const int n = s.n, r = s.rank;
  const size_t c = kCount;
  for (int dt : {bkcl::kFloat, bkcl::kInt32, bkcl::kBfloat16, bkcl::kFloat16, bkcl::kInt64}) {
    const std::string tag = std::to_string(n) + " ranks across processes, dtype " + std::to_string(dt) + ": ";
    for (int op : {bkcl::kAdd, bkcl::kProduct, bkcl::kMax, bkcl::kMin}) {
      std::vector<double> want(c);
      for (size_t i = 0; i < c; ++i) want[i] = Folded(n, dt, op, i);
      Compare(tag + "all_reduce op " + std::to_string(op), r,
             s.Run(dt, c, c, [&] { return api.bkcl_all_reduce(s.ctx, s.send, s.recv, c, dt, op, s.stream); }), want);
      for (size_t i = 0; i < c; ++i) want[i] = Folded(n, dt, op, r * c + i);
      Compare(tag + "reduce_scatter op " + std::to_string(op), r,
             s.Run(dt, n * c, c, [&] { return api.bkcl_reduce_scatter(s.ctx, s.send, s.recv, c, dt, op, s.stream); }),
             want);
    }
    Compare(tag + "broadcast", r,
           s.Run(dt, c, c, [&] { return api.bkcl_broadcast(s.ctx, s.send, s.recv, c, dt, n - 1, s.stream); }),
           Inputs(dt, n - 1, c));
    std::vector<double> gathered, exchanged;
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < c; ++i) {
        gathered.push_back(In(dt, k, i));
        exchanged.push_back(In(dt, k, r * c + i));
      }
    }
    Compare(tag + "all_gather", r,
           s.Run(dt, c, n * c, [&] { return api.bkcl_all_gather(s.ctx, s.send, c, s.recv, dt, s.stream); }), gathered);
    Compare(tag + "all_to_all", r,
           s.Run(dt, n * c, n * c, [&] { return api.bkcl_all_to_all(s.ctx, s.send, c, s.recv, dt, s.stream); }),
           exchanged);
  }
  // In place: send == recv.
  const int f = bkcl::kFloat;
  Put(s.send, Encode(f, Inputs(f, r, c)));
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.send, c, f, bkcl::kAdd, s.stream), bkcl::kSuccess);
  CHECK_RC(api.xpu_wait(s.stream), 0);
  std::vector<double> sum(c);
  for (size_t i = 0; i < c; ++i) sum[i] = Folded(n, f, bkcl::kAdd, i);
  Compare("in-place all_reduce", r, Decode(f, Get(s.send, c * Size(f))), sum);
  // Many rounds queued at once: the two slots are reused in turn.
  std::vector<void*> outs(24);
  Put(s.send, Encode(f, Inputs(f, r, c)));
  for (void*& o : outs) {
    CHECK_RC(api.xpu_malloc(&o, c * Size(f), 0), 0);
    CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, o, c, f, bkcl::kAdd, s.stream), bkcl::kSuccess);
  }
  CHECK_RC(api.xpu_wait(s.stream), 0);
  for (void* o : outs) {
    Compare("queued all_reduce", r, Decode(f, Get(o, c * Size(f))), sum);
    CHECK_RC(api.xpu_free(o), 0);
  }
  // Ranks that disagree: nothing written, recorded; the next round works.
  Put(s.recv, std::vector<char>(kBytes, kSentinel));
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, r == 0 ? 4 : 5, f, bkcl::kAdd, s.stream), bkcl::kSuccess);
  CHECK_RC(api.xpu_wait(s.stream), 0);
  CHECK(s.Untouched());
  CHECK(LastErrorHas("disagree"));
  Compare("all_reduce after a mismatch", r,
         s.Run(f, c, c, [&] { return api.bkcl_all_reduce(s.ctx, s.send, s.recv, c, f, bkcl::kAdd, s.stream); }), sum);
  // Point to point is not modelled between processes: refused at issue.
  CHECK_RC(api.bkcl_send(s.ctx, s.send, c, (r + 1) % n, f, s.stream), bkcl::kInvalidArgument);
  CHECK(LastErrorHas("spans processes"));
}

// A peer that never comes: the wait gives up writing nothing, and the
// communicator is broken (the next collective gives up at once).
void PeerNeverComes(Rank& s) {
  const int f = bkcl::kFloat;
  if (s.rank != 0) return;  // the other rank leaves without calling
  setenv("FAKE_BKCL_INIT_TIMEOUT_MS", "500", 1);
  Put(s.recv, std::vector<char>(kBytes, kSentinel));
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, kCount, f, bkcl::kAdd, s.stream), bkcl::kSuccess);
  CHECK_RC(api.xpu_wait(s.stream), 0);
  CHECK(s.Untouched());
  CHECK(LastErrorHas("timed out after 500 ms (BKCL_TIMEOUT) waiting for rank(s) 1"));
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, kCount, f, bkcl::kAdd, s.stream), bkcl::kSuccess);
  CHECK_RC(api.xpu_wait(s.stream), 0);
  CHECK(s.Untouched());
  CHECK(LastErrorHas("the communicator is broken"));
  unsetenv("FAKE_BKCL_INIT_TIMEOUT_MS");
}

void RunRank(int rank, int n, int device, const bkcl::UniqueId& id, const std::string& scenario) {
  Rank s{rank, n, device};
  CHECK_RC(api.xpu_set_device(device), 0);
  CHECK_RC(api.xpu_stream_create(&s.stream), 0);
  CHECK_RC(api.xpu_malloc(&s.send, kBytes, 0), 0);
  CHECK_RC(api.xpu_malloc(&s.recv, kBytes, 0), 0);
  bkcl::UniqueId mine = id;
  CHECK_RC(api.bkcl_init_rank(&s.ctx, rank, n, &mine), bkcl::kSuccess);
  if (s.ctx != nullptr) {
    if (scenario == "collectives") Collectives(s);
    if (scenario == "peer-never-comes") PeerNeverComes(s);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    CHECK_RC(api.bkcl_destroy_context(s.ctx), bkcl::kSuccess);
  }
  CHECK_RC(api.xpu_free(s.send), 0);
  CHECK_RC(api.xpu_free(s.recv), 0);
  CHECK_RC(api.xpu_stream_destroy(s.stream), 0);
}

// Ranks [0, local) run here, on devices 0..local-1; the others in child
// processes, each on device 0 (another process: the device may repeat).
void Scenario(const char* self, const char* xpurt, const char* bkcl_path, int n, int local,
              const std::string& scenario) {
  bkcl::UniqueId id;
  REQUIRE(api.bkcl_get_unique_id(&id) == bkcl::kSuccess);
  const std::string hex = Hex(id);
  std::vector<pid_t> children;
  for (int r = local; r < n; ++r) {
    const std::string rank = std::to_string(r), size = std::to_string(n);
    const char* argv[] = {self, xpurt, bkcl_path, "--rank", rank.c_str(), size.c_str(), hex.c_str(),
                          scenario.c_str(), nullptr};
    pid_t pid = -1;
    CHECK_RC(posix_spawn(&pid, self, nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    children.push_back(pid);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < local; ++r) threads.emplace_back([&, r] { RunRank(r, n, r, id, scenario); });
  for (std::thread& t : threads) t.join();
  for (pid_t pid : children) {
    int status = 0;
    CHECK_RC(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "%s: the rank in process %d failed (status %d)\n", scenario.c_str(), pid, status);
      ++g_failures;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool child = argc == 8 && std::string(argv[3]) == "--rank";
  if (argc != 3 && !child) {
    std::fprintf(stderr, "usage: %s <path to libxpurt.so.2> <path to libbkcl.so>\n", argv[0]);
    return 2;
  }
  LoadForSelftest(argv[1], argv[2]);
  if (child) {
    RunRank(std::atoi(argv[4]), std::atoi(argv[5]), 0, Unhex(argv[6]), argv[7]);
  } else {
    Scenario(argv[0], argv[1], argv[2], 2, 1, "collectives");  // one rank per process
    Scenario(argv[0], argv[1], argv[2], 3, 2, "collectives");  // two here, one elsewhere
    Scenario(argv[0], argv[1], argv[2], 2, 1, "peer-never-comes");
    // An id nobody made is refused in any process.
    bkcl::UniqueId forged{};
    std::memcpy(forged.internal, "FAKEBKCL", 8);
    bkcl::Context ctx = nullptr;
    CHECK_RC(api.xpu_set_device(0), 0);
    CHECK_RC(api.bkcl_init_rank(&ctx, 0, 1, &forged), bkcl::kInvalidArgument);
    CHECK(LastErrorHas("no bkcl_get_unique_id made"));
    CHECK(api.live_contexts() == 0);
  }
  if (g_failures != 0) {
    std::fprintf(stderr, "fake_bkcl_spanning_selftest%s: %d check(s) failed\n", child ? " (child)" : "",
                 g_failures.load());
    return 1;
  }
  if (!child) std::printf("fake_bkcl_spanning_selftest: all checks passed\n");
  return 0;
}
