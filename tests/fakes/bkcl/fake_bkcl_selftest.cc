// Smoke test of the fake libbkcl (tests/fakes/bkcl). Plain C++, no test
// framework:
//
//   fake_bkcl_selftest <path to libxpurt.so.2> <path to libbkcl.so>
//
// dlopen()s both fakes (with FAKE_XPU_DEVICES=4 and BKCL_TIMEOUT=60, so a
// bug hangs a minute, not ten), drives communicators of 2 and 3 ranks from
// one thread per rank, each on its own device, and compares every result
// with one computed on the host. ctest also runs it with
// FAKE_XPU_DELAY_US=5000: a result read before xpu_wait would be wrong.
// Exits non-zero on any failure.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "fake_bkcl_selftest_util.h"

namespace {

using namespace selftest;  // NOLINT: the test's own helpers
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Elements per rank: not a multiple of 2 or 3, so the ranks' shares of an
// all_reduce differ in size.
constexpr size_t kCount = 7;
constexpr char kSentinel = 0x5A;
constexpr int kDtypes[] = {bkcl::kUint8, bkcl::kInt32, bkcl::kInt64, bkcl::kFloat16,
                           bkcl::kBfloat16, bkcl::kFloat, bkcl::kFloat64};
constexpr int kOps[] = {bkcl::kAdd, bkcl::kProduct, bkcl::kMax, bkcl::kMin};

// Rank r's recv still holds only the sentinel.
bool Untouched(const RankState& s, size_t bytes) {
  const std::vector<char> b = Get(s.recv, bytes);
  return std::all_of(b.begin(), b.end(), [](char c) { return c == kSentinel; });
}

// One call on every rank of `w`: rank r's send holds Inputs(dtype, r,
// send_elems), its recv the sentinel; issue(s, r) makes the call; after
// xpu_wait the recv must hold expect(r).
template <typename Issue, typename Expect>
void Case(World& w, const std::string& what, int dtype, size_t send_elems, size_t recv_elems, Issue issue,
          Expect expect) {
  OnRanks(w.n, [&](int r) {
    RankState& s = w.ranks[r];
    Put(s.send, Encode(dtype, Inputs(dtype, r, send_elems)));
    Put(s.recv, std::vector<char>(recv_elems * Size(dtype), kSentinel));
    CHECK_RC(issue(s, r), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    Compare(what + " dtype " + std::to_string(dtype), r, Decode(dtype, Get(s.recv, recv_elems * Size(dtype))),
            expect(r));
  });
}

void TestCollectives(int n) {
  World w(n);
  const size_t c = kCount;
  const int root = n - 1;
  const std::string tag = std::to_string(n) + " ranks: ";
  for (int dt : kDtypes) {
    for (int op : kOps) {
      const std::string ops = " op " + std::to_string(op);
      Case(
          w, tag + "all_reduce" + ops, dt, c, c,
          [&](RankState& s, int) { return api.bkcl_all_reduce(s.ctx, s.send, s.recv, c, dt, op, s.stream); },
          [&](int) {
            std::vector<double> v(c);
            for (size_t i = 0; i < c; ++i) v[i] = Folded(n, dt, op, i);
            return v;
          });
      Case(
          w, tag + "reduce_scatter" + ops, dt, n * c, c,
          [&](RankState& s, int) { return api.bkcl_reduce_scatter(s.ctx, s.send, s.recv, c, dt, op, s.stream); },
          [&](int r) {
            std::vector<double> v(c);
            for (size_t i = 0; i < c; ++i) v[i] = Folded(n, dt, op, r * c + i);
            return v;
          });
    }
    Case(
        w, tag + "broadcast", dt, c, c,
        [&](RankState& s, int) { return api.bkcl_broadcast(s.ctx, s.send, s.recv, c, dt, root, s.stream); },
        [&](int) { return Inputs(dt, root, c); });
    Case(
        w, tag + "all_gather", dt, c, n * c,
        [&](RankState& s, int) { return api.bkcl_all_gather(s.ctx, s.send, c, s.recv, dt, s.stream); },
        [&](int) {
          std::vector<double> v;
          for (int k = 0; k < n; ++k) {
            for (double x : Inputs(dt, k, c)) v.push_back(x);
          }
          return v;
        });
    Case(
        w, tag + "all_to_all", dt, n * c, n * c,
        [&](RankState& s, int) { return api.bkcl_all_to_all(s.ctx, s.send, c, s.recv, dt, s.stream); },
        [&](int r) {  // chunk k: chunk r of rank k's send
          std::vector<double> v;
          for (int k = 0; k < n; ++k) {
            for (size_t i = 0; i < c; ++i) v.push_back(In(dt, k, r * c + i));
          }
          return v;
        });
  }
}

// send == recv (and NCCL's in-place layouts for all_gather/reduce_scatter).
void TestInPlace() {
  World w(3);
  const int n = 3, dt = bkcl::kFloat;
  const size_t c = kCount, es = Size(dt);
  OnRanks(n, [&](int r) {
    RankState& s = w.ranks[r];
    Put(s.send, Encode(dt, Inputs(dt, r, c)));
    CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.send, c, dt, bkcl::kAdd, s.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    std::vector<double> want(c);
    for (size_t i = 0; i < c; ++i) want[i] = Folded(n, dt, bkcl::kAdd, i);
    Compare("in-place all_reduce", r, Decode(dt, Get(s.send, c * es)), want);

    // all_gather: rank r's input already in chunk r of the output.
    std::vector<double> buf(n * c, -99);
    for (size_t i = 0; i < c; ++i) buf[r * c + i] = In(dt, r, i);
    Put(s.send, Encode(dt, buf));
    CHECK_RC(api.bkcl_all_gather(s.ctx, At(s.send, r * c * es), c, s.send, dt, s.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    want.clear();
    for (int k = 0; k < n; ++k) {
      for (double x : Inputs(dt, k, c)) want.push_back(x);
    }
    Compare("in-place all_gather", r, Decode(dt, Get(s.send, n * c * es)), want);

    // reduce_scatter: the output is chunk r of the input.
    Put(s.send, Encode(dt, Inputs(dt, r, n * c)));
    CHECK_RC(api.bkcl_reduce_scatter(s.ctx, s.send, At(s.send, r * c * es), c, dt, bkcl::kMax, s.stream),
             bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    want.assign(c, 0);
    for (size_t i = 0; i < c; ++i) want[i] = Folded(n, dt, bkcl::kMax, r * c + i);
    Compare("in-place reduce_scatter", r, Decode(dt, Get(At(s.send, r * c * es), c * es)), want);

    Put(s.send, Encode(dt, Inputs(dt, r, n * c)));
    CHECK_RC(api.bkcl_all_to_all(s.ctx, s.send, c, s.send, dt, s.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    want.clear();
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < c; ++i) want.push_back(In(dt, k, r * c + i));
    }
    Compare("in-place all_to_all", r, Decode(dt, Get(s.send, n * c * es)), want);
  });
}

// The 16-bit floats round to nearest even, once, after the reduction.
void TestRounding() {
  World w(2);
  struct Row {
    int dtype;
    std::vector<double> in0, in1, want;
  };
  const Row rows[] = {
      {bkcl::kBfloat16, {1, 1 + std::ldexp(1, -7)}, {std::ldexp(1, -8), std::ldexp(1, -8)}, {1, 1 + std::ldexp(1, -6)}},
      {bkcl::kFloat16, {1, 1 + std::ldexp(1, -10)}, {std::ldexp(1, -11), std::ldexp(1, -11)}, {1, 1 + std::ldexp(1, -9)}},
  };
  for (const Row& row : rows) {
    OnRanks(2, [&](int r) {
      RankState& s = w.ranks[r];
      Put(s.send, Encode(row.dtype, r == 0 ? row.in0 : row.in1));
      CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 2, row.dtype, bkcl::kAdd, s.stream), bkcl::kSuccess);
      CHECK_RC(api.xpu_wait(s.stream), 0);
      Compare("rounding dtype " + std::to_string(row.dtype), r, Decode(row.dtype, Get(s.recv, 2 * Size(row.dtype))),
              row.want);
    });
  }
}

void TestSendRecv() {
  World w(3);
  const int n = 3, dt = bkcl::kInt64;
  const size_t c = kCount, es = Size(dt);
  OnRanks(n, [&](int r) {
    RankState& s = w.ranks[r];
    const int from = (r + n - 1) % n, to = (r + 1) % n;
    // A grouped ring, each rank receiving before it sends: fine in a group.
    Put(s.send, Encode(dt, Inputs(dt, r, c)));
    Put(s.recv, std::vector<char>(c * es, kSentinel));
    CHECK_RC(api.bkcl_group_start(), bkcl::kSuccess);
    CHECK_RC(api.bkcl_group_start(), bkcl::kSuccess);  // groups nest
    CHECK_RC(api.bkcl_recv(s.ctx, s.recv, c, from, dt, s.stream), bkcl::kSuccess);
    CHECK_RC(api.bkcl_group_end(), bkcl::kSuccess);
    CHECK_RC(api.bkcl_send(s.ctx, s.send, c, to, dt, s.stream), bkcl::kSuccess);
    CHECK_RC(api.bkcl_group_end(), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    Compare("grouped ring", r, Decode(dt, Get(s.recv, c * es)), Inputs(dt, from, c));

    // Ungrouped, matched in issue order: rank 0 sends 3 then 4 elements to
    // rank 2, which receives them back to back.
    Put(s.recv, std::vector<char>(c * es, kSentinel));
    if (r == 0) {
      CHECK_RC(api.bkcl_send(s.ctx, s.send, 3, 2, dt, s.stream), bkcl::kSuccess);
      CHECK_RC(api.bkcl_send(s.ctx, At(s.send, 3 * es), 4, 2, dt, s.stream), bkcl::kSuccess);
    } else if (r == 2) {
      CHECK_RC(api.bkcl_recv(s.ctx, s.recv, 3, 0, dt, s.stream), bkcl::kSuccess);
      CHECK_RC(api.bkcl_recv(s.ctx, At(s.recv, 3 * es), 4, 0, dt, s.stream), bkcl::kSuccess);
    }
    CHECK_RC(api.xpu_wait(s.stream), 0);
    if (r == 2) Compare("ungrouped send/recv", r, Decode(dt, Get(s.recv, c * es)), Inputs(dt, 0, c));
  });
}

// Refused calls return kInvalidArgument at once and take no round.
void TestBadArguments() {
  World w(2);
  RankState& s = w.ranks[0];
  const int f = bkcl::kFloat, add = bkcl::kAdd, bad = bkcl::kInvalidArgument;
  CHECK_RC(api.xpu_set_device(0), 0);
  CHECK_RC(api.bkcl_all_reduce(nullptr, s.send, s.recv, 4, f, add, s.stream), bad);
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, 99, add, s.stream), bad);
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, f, 99, s.stream), bad);
  CHECK_RC(api.bkcl_reduce_scatter(s.ctx, s.send, s.recv, 4, f, -1, s.stream), bad);
  CHECK_RC(api.bkcl_broadcast(s.ctx, s.send, s.recv, 4, f, 2, s.stream), bad);
  CHECK_RC(api.bkcl_broadcast(s.ctx, s.send, s.recv, 4, f, -1, s.stream), bad);
  CHECK_RC(api.bkcl_send(s.ctx, s.send, 4, 2, f, s.stream), bad);
  CHECK_RC(api.bkcl_recv(s.ctx, s.recv, 4, -1, f, s.stream), bad);
  // Ranges outside one live allocation, or on the host.
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, World::kBytes / 4 + 1, f, add, s.stream), bad);
  CHECK_RC(api.bkcl_all_gather(s.ctx, s.send, World::kBytes / 8 + 1, s.recv, f, s.stream), bad);
  CHECK_RC(api.bkcl_all_to_all(s.ctx, s.send, World::kBytes / 8 + 1, s.recv, f, s.stream), bad);
  float host[4] = {};
  CHECK_RC(api.bkcl_all_reduce(s.ctx, host, s.recv, 4, f, add, s.stream), bad);
  // Another device's stream (count 0: nothing to translate, the launch refuses it).
  CHECK_RC(api.bkcl_all_reduce(s.ctx, nullptr, nullptr, 0, f, add, w.ranks[1].stream), bad);
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, f, add, w.ranks[1].stream), bad);
  // The context's device is not current.
  CHECK_RC(api.xpu_set_device(1), 0);
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, f, add, nullptr), bad);
  CHECK_RC(api.xpu_set_device(0), 0);
  CHECK_RC(api.bkcl_destroy_context(nullptr), bad);
  CHECK_RC(api.bkcl_destroy_context(reinterpret_cast<bkcl::Context>(&host)), bad);
  CHECK_RC(api.bkcl_comm_abort(nullptr), bad);
  CHECK_RC(api.bkcl_group_end(), bad);
  CHECK_RC(api.bkcl_get_unique_id(nullptr), bad);
  // The rounds are still in step: count 0 completes, then a real one.
  OnRanks(2, [&](int r) {
    RankState& t = w.ranks[r];
    CHECK_RC(api.bkcl_all_reduce(t.ctx, nullptr, nullptr, 0, f, add, t.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(t.stream), 0);
  });
  Case(
      w, "all_reduce after refusals", f, kCount, kCount,
      [&](RankState& t, int) { return api.bkcl_all_reduce(t.ctx, t.send, t.recv, kCount, f, add, t.stream); },
      [&](int) {
        std::vector<double> v(kCount);
        for (size_t i = 0; i < kCount; ++i) v[i] = Folded(2, f, add, i);
        return v;
      });
}

// Ranks that disagree: every call succeeds at issue, nothing is written,
// the mismatch is recorded, and the next round works.
void TestMismatch() {
  World w(2);
  const int f = bkcl::kFloat;
  OnRanks(2, [&](int r) {
    RankState& s = w.ranks[r];
    Put(s.recv, std::vector<char>(World::kBytes, kSentinel));
    CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, r == 0 ? 4 : 8, f, bkcl::kAdd, s.stream), bkcl::kSuccess);
    CHECK_RC(api.bkcl_broadcast(s.ctx, s.send, s.recv, 4, r == 0 ? f : bkcl::kInt32, 0, s.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    CHECK(Untouched(s, World::kBytes));
  });
  CHECK(LastErrorHas("disagree"));
  OnRanks(2, [&](int r) {  // a receive that does not match its send
    RankState& s = w.ranks[r];
    if (r == 0) CHECK_RC(api.bkcl_send(s.ctx, s.send, 3, 1, f, s.stream), bkcl::kSuccess);
    if (r == 1) CHECK_RC(api.bkcl_recv(s.ctx, s.recv, 4, 0, f, s.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    CHECK(Untouched(s, World::kBytes));
  });
  CHECK(LastErrorHas("does not match"));
  Case(
      w, "broadcast after mismatches", f, kCount, kCount,
      [&](RankState& s, int) { return api.bkcl_broadcast(s.ctx, s.send, s.recv, kCount, f, 0, s.stream); },
      [&](int) { return Inputs(f, 0, kCount); });
}

void TestInjectedFailure() {
  World w(2);
  const uint64_t before = api.calls("all_reduce");
  setenv("FAKE_BKCL_FAIL", "all_reduce, group_start", 1);
  Case(
      w, "broadcast beside an injected failure", bkcl::kInt32, kCount, kCount,
      [&](RankState& s, int) {
        CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, kCount, bkcl::kInt32, bkcl::kAdd, s.stream),
                 bkcl::kRuntimeError);
        CHECK_RC(api.bkcl_group_start(), bkcl::kRuntimeError);
        return api.bkcl_broadcast(s.ctx, s.send, s.recv, kCount, bkcl::kInt32, 1, s.stream);
      },
      [&](int) { return Inputs(bkcl::kInt32, 1, kCount); });
  CHECK(api.calls("all_reduce") == before + 2);
  CHECK(api.calls("bkcl_all_reduce") == before + 2);
  CHECK(api.calls("no_such_call") == 0);
  setenv("FAKE_BKCL_FAIL", "init_rank", 1);
  bkcl::UniqueId id;
  bkcl::Context ctx = nullptr;
  CHECK_RC(api.bkcl_get_unique_id(&id), bkcl::kSuccess);
  CHECK_RC(api.bkcl_init_rank(&ctx, 0, 1, &id), bkcl::kRuntimeError);
  unsetenv("FAKE_BKCL_FAIL");
}

// A rank waiting for a peer that never comes is woken by an abort (here
// with BKCL_TIMEOUT at 60 s), writes nothing, and the communicator refuses
// later calls.
void TestAbortWakes() {
  World w(2);
  Clock::duration waited{};
  std::thread rank0([&] {
    RankState& s = w.ranks[0];
    CHECK_RC(api.xpu_set_device(0), 0);
    Put(s.recv, std::vector<char>(World::kBytes, kSentinel));
    const Clock::time_point t0 = Clock::now();
    CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, bkcl::kFloat, bkcl::kAdd, s.stream), bkcl::kSuccess);
    CHECK_RC(api.xpu_wait(s.stream), 0);
    waited = Clock::now() - t0;
    CHECK(Untouched(s, World::kBytes));
  });
  std::this_thread::sleep_for(milliseconds(300));
  CHECK_RC(api.bkcl_comm_abort(w.ranks[1].ctx), bkcl::kSuccess);
  rank0.join();
  CHECK(waited < std::chrono::seconds(30));
  CHECK(LastErrorHas("aborted"));
  CHECK_RC(api.xpu_set_device(0), 0);
  RankState& s = w.ranks[0];
  CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, bkcl::kFloat, bkcl::kAdd, s.stream), bkcl::kRuntimeError);
  CHECK_RC(api.bkcl_comm_abort(s.ctx), bkcl::kSuccess);  // again: still aborted
}

// FAKE_BKCL_INIT_TIMEOUT_MS: a rank alone in a round gives up after it; the
// late peer finds the round failed and writes nothing either.
void TestTimeout() {
  setenv("FAKE_BKCL_INIT_TIMEOUT_MS", "300", 1);
  {
    World w(2);
    for (int r : {0, 1}) {
      std::thread t([&, r] {
        RankState& s = w.ranks[r];
        CHECK_RC(api.xpu_set_device(r), 0);
        Put(s.recv, std::vector<char>(World::kBytes, kSentinel));
        const Clock::time_point t0 = Clock::now();
        CHECK_RC(api.bkcl_all_reduce(s.ctx, s.send, s.recv, 4, bkcl::kFloat, bkcl::kAdd, s.stream), bkcl::kSuccess);
        CHECK_RC(api.xpu_wait(s.stream), 0);
        if (r == 0) CHECK(Clock::now() - t0 >= milliseconds(250));
        CHECK(Untouched(s, World::kBytes));
      });
      t.join();
      if (r == 0) CHECK(LastErrorHas("rank 0's all_reduce (round 0, waiting for rank(s) 1) timed out"));
    }
    CHECK(!LastErrorHas("rank 1's"));
    Case(
        w, "all_reduce after a timeout", bkcl::kFloat, kCount, kCount,
        [&](RankState& s, int) {
          return api.bkcl_all_reduce(s.ctx, s.send, s.recv, kCount, bkcl::kFloat, bkcl::kMin, s.stream);
        },
        [&](int) {
          std::vector<double> v(kCount);
          for (size_t i = 0; i < kCount; ++i) v[i] = Folded(2, bkcl::kFloat, bkcl::kMin, i);
          return v;
        });
  }
  unsetenv("FAKE_BKCL_INIT_TIMEOUT_MS");
}

void TestInitRefusals() {
  setenv("FAKE_BKCL_INIT_TIMEOUT_MS", "300", 1);
  const int bad = bkcl::kInvalidArgument;
  bkcl::UniqueId id, zero{};
  bkcl::Context ctx = nullptr;
  CHECK_RC(api.xpu_set_device(0), 0);
  CHECK_RC(api.bkcl_get_unique_id(&id), bkcl::kSuccess);
  CHECK_RC(api.bkcl_init_rank(nullptr, 0, 1, &id), bad);
  CHECK_RC(api.bkcl_init_rank(&ctx, 1, 1, &id), bad);
  CHECK_RC(api.bkcl_init_rank(&ctx, 0, 0, &id), bad);
  CHECK_RC(api.bkcl_init_rank(&ctx, -1, 2, &id), bad);
  CHECK_RC(api.bkcl_init_rank(&ctx, 0, 1, nullptr), bad);
  CHECK_RC(api.bkcl_init_rank(&ctx, 0, 1, &zero), bad);
  // Two joiners that cannot form a communicator: whichever comes second is
  // refused at once, the first waits out the timeout.
  struct Join {
    int rank, nranks, device;
  };
  auto pair = [&](Join a, Join b, const char* why) {
    bkcl::UniqueId pid;
    CHECK_RC(api.bkcl_get_unique_id(&pid), bkcl::kSuccess);
    int rc[2] = {-1, -1};
    std::vector<std::thread> ts;
    for (int k = 0; k < 2; ++k) {
      ts.emplace_back([&, k] {
        const Join& j = k == 0 ? a : b;
        bkcl::Context c = nullptr;
        CHECK_RC(api.xpu_set_device(j.device), 0);
        rc[k] = api.bkcl_init_rank(&c, j.rank, j.nranks, &pid);
      });
    }
    for (std::thread& t : ts) t.join();
    if (!((rc[0] == bad && rc[1] == bkcl::kRuntimeError) || (rc[0] == bkcl::kRuntimeError && rc[1] == bad))) {
      std::fprintf(stderr, "%s: bkcl_init_rank returned %d and %d\n", why, rc[0], rc[1]);
      ++g_failures;
    }
  };
  pair({0, 2, 0}, {1, 3, 1}, "nranks disagree");
  pair({0, 2, 0}, {1, 2, 0}, "two ranks on one device");
  pair({0, 2, 0}, {0, 2, 1}, "one rank joins twice");
  CHECK(LastErrorHas("timed out"));
  CHECK(api.live_contexts() == 0);
  CHECK_RC(api.bkcl_init_rank(&ctx, 0, 1, &id), bkcl::kSuccess);  // one rank forms at once
  CHECK(api.live_contexts() == 1);
  CHECK_RC(api.bkcl_destroy_context(ctx), bkcl::kSuccess);
  CHECK_RC(api.bkcl_destroy_context(ctx), bad);  // a stale handle
  unsetenv("FAKE_BKCL_INIT_TIMEOUT_MS");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <path to libxpurt.so.2> <path to libbkcl.so>\n", argv[0]);
    return 2;
  }
  LoadForSelftest(argv[1], argv[2]);

  TestCollectives(2);
  TestCollectives(3);
  TestInPlace();
  TestRounding();
  TestSendRecv();
  TestBadArguments();
  TestMismatch();
  TestInjectedFailure();
  TestAbortWakes();
  TestTimeout();
  TestInitRefusals();
  CHECK(api.live_contexts() == 0);
  CHECK(api.calls("init_rank") > 0 && api.calls("all_to_all") > 0);

  if (g_failures != 0) {
    std::fprintf(stderr, "fake_bkcl_selftest: %d check(s) failed\n", g_failures.load());
    return 1;
  }
  std::printf("fake_bkcl_selftest: all checks passed\n");
  return 0;
}
