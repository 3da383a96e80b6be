// The fake libbkcl's kernels (tests/fakes/bkcl): what a collective, a send
// or a receive does once it reaches the front of its rank's stream, on that
// stream's worker thread (the fake libxpurt's). See fake_bkcl_internal.h
// for the model and README.md for the behaviour.
//
// A collective kernel of round k: posts its buffers into the round, waits
// until every rank's kernel of round k posted (blocking its stream, as a
// device collective does), computes its rank's share of the result into
// temporaries, waits until every rank did (so in-place calls read nothing a
// peer already overwrote), writes its share into the ranks' outputs, and
// waits until every rank wrote (so no stream runs on while a peer still
// writes its output). Ranks that disagree, or a wait that ends by timeout,
// abort or unload, leave every output untouched.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "fake_bkcl_hub.h"
#include "fake_bkcl_internal.h"

namespace fake_bkcl {
namespace {

// ---- element types --------------------------------------------------------

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 <-> float, round to nearest even.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf, NaN (kept quiet)
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  const int exp = static_cast<int>(abs >> 23) - 127;
  uint32_t h, rem, half;
  if (exp >= -14) {  // normal
    const uint32_t mant = abs & 0x7FFFFFu;
    h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    rem = mant & 0x1FFFu;
    half = 0x1000u;
  } else {  // subnormal, in units of 2^-24; below 2^-25 it rounds to 0
    if (exp < -25) return static_cast<uint16_t>(sign);
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const int shift = -(exp + 1);  // 14..24
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  if (rem > half || (rem == half && (h & 1u) != 0)) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

// bfloat16: the top half of a float, round to nearest even.
float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// A dtype's storage and the type it is computed in.
template <typename T>
struct Plain {
  using Compute = T;
  static constexpr size_t kSize = sizeof(T);
  static T Load(const char* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  static void Store(char* p, T v) { std::memcpy(p, &v, sizeof(T)); }
};

template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
struct Through16 {
  using Compute = float;
  static constexpr size_t kSize = 2;
  static float Load(const char* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return kToFloat(v);
  }
  static void Store(char* p, float v) {
    const uint16_t b = kFromFloat(v);
    std::memcpy(p, &b, 2);
  }
};

using Half = Through16<HalfToFloat, FloatToHalf>;
using Bf16 = Through16<Bf16ToFloat, FloatToBf16>;

template <typename F>
void VisitDtype(int dtype, F&& f) {
  switch (dtype) {
    case bkcl::kUint8: f(Plain<uint8_t>{}); break;
    case bkcl::kInt32: f(Plain<int32_t>{}); break;
    case bkcl::kInt64: f(Plain<int64_t>{}); break;
    case bkcl::kFloat16: f(Half{}); break;
    case bkcl::kBfloat16: f(Bf16{}); break;
    case bkcl::kFloat: f(Plain<float>{}); break;
    case bkcl::kFloat64: f(Plain<double>{}); break;
    default: break;
  }
}

// Integers wrap (through the unsigned type: no undefined overflow); floating
// max/min propagate NaN.
template <typename C>
C Combine(int op, C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    switch (op) {
      case bkcl::kAdd: return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case bkcl::kProduct: return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case bkcl::kMax: return std::max(a, b);
      default: return std::min(a, b);
    }
  } else {
    switch (op) {
      case bkcl::kAdd: return a + b;
      case bkcl::kProduct: return a * b;
      default:
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
        return op == bkcl::kMax ? std::max(a, b) : std::min(a, b);
    }
  }
}

// out[i] = srcs[0][i] op srcs[1][i] op ..., in rank order, computed in the
// dtype's compute type (float for the 16-bit floats: rounded once).
void Reduce(const std::vector<const char*>& srcs, uint64_t n, int dtype, int op, char* out) {
  VisitDtype(dtype, [&](auto codec) {
    using Codec = decltype(codec);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t at = i * Codec::kSize;
      auto acc = Codec::Load(srcs[0] + at);
      for (size_t k = 1; k < srcs.size(); ++k) acc = Combine(op, acc, Codec::Load(srcs[k] + at));
      Codec::Store(out + at, acc);
    }
  });
}

// ---- a rank's share of a round ------------------------------------------

// Elements [begin, end) of `count` that rank r of n reduces or copies.
std::pair<uint64_t, uint64_t> Part(uint64_t count, int r, int n) {
  const uint64_t q = count / n, rem = count % n, ur = static_cast<uint64_t>(r);
  const uint64_t begin = q * ur + std::min(ur, rem);
  return {begin, begin + q + (ur < rem ? 1 : 0)};
}

// What a rank writes, staged: the temporaries are filled before the first
// write of any rank.
struct Share {
  struct Write {
    char* dst;
    size_t temp;  // index into temps
  };
  std::deque<std::vector<char>> temps;
  std::vector<Write> writes;

  std::vector<char>& Temp(uint64_t bytes) { return temps.emplace_back(bytes); }
  void WriteTo(char* dst) { writes.push_back({dst, temps.size() - 1}); }
};

// Rank r's share of a round whose posts all agree.
Share ComputeShare(const std::vector<Post>& p, int r) {
  const int n = static_cast<int>(p.size());
  const Post& me = p[r];
  const uint64_t es = DtypeSize(me.dtype), c = me.count;
  Share s;
  if (c == 0) return s;
  std::vector<const char*> srcs(n);
  switch (me.kind) {
    case Kind::kAllReduce: {  // rank r reduces the r-th part and writes it everywhere
      const auto [b, e] = Part(c, r, n);
      if (b == e) break;
      for (int k = 0; k < n; ++k) srcs[k] = p[k].send + b * es;
      Reduce(srcs, e - b, me.dtype, me.op, s.Temp((e - b) * es).data());
      for (int k = 0; k < n; ++k) s.WriteTo(p[k].recv + b * es);
      break;
    }
    case Kind::kBroadcast: {  // rank r copies the r-th part of the root's send
      const auto [b, e] = Part(c, r, n);
      if (b == e) break;
      const char* src = p[me.root].send + b * es;
      s.Temp((e - b) * es).assign(src, src + (e - b) * es);
      for (int k = 0; k < n; ++k) s.WriteTo(p[k].recv + b * es);
      break;
    }
    case Kind::kAllGather:  // rank r's send to chunk r of every recv
      s.Temp(c * es).assign(me.send, me.send + c * es);
      for (int k = 0; k < n; ++k) s.WriteTo(p[k].recv + r * c * es);
      break;
    case Kind::kReduceScatter:  // chunk r of every send, reduced, to rank r's recv
      for (int k = 0; k < n; ++k) srcs[k] = p[k].send + r * c * es;
      Reduce(srcs, c, me.dtype, me.op, s.Temp(c * es).data());
      s.WriteTo(me.recv);
      break;
    case Kind::kAllToAll:  // chunk r of rank k's send to chunk k of rank r's recv
      for (int k = 0; k < n; ++k) {
        const char* src = p[k].send + r * c * es;
        s.Temp(c * es).assign(src, src + c * es);
        s.WriteTo(me.recv + k * c * es);
      }
      break;
    case Kind::kSend:
    case Kind::kRecv:
      break;
  }
  return s;
}

std::string Where(const Op& op) {
  return "communicator " + std::to_string(op.comm->serial) + ": rank " + std::to_string(op.rank) + "'s ";
}

// Why a wait ended without its peers (call with State::mu held).
std::string GaveUp(const Op& op) {
  State& st = St();
  if (st.shutdown) return "gave up: the library is unloading";
  if (op.comm->aborted) return "gave up: the communicator was aborted";
  return "timed out after " + std::to_string(op.limit.count()) + " ms (BKCL_TIMEOUT)";
}

// ---- collectives ---------------------------------------------------------

// Counts this rank into `counter` and waits until every rank is counted.
// No timeout: only ranks past the first barrier wait here, and each of
// them gets here without waiting on anything else.
void Barrier(std::unique_lock<std::mutex>& lk, Round& round, int Round::*counter, int n) {
  State& st = St();
  if (++(round.*counter) == n) {
    st.cv.notify_all();
  } else {
    st.cv.wait(lk, [&] { return round.*counter >= n; });
  }
}

void Leave(Comm& c, uint64_t ticket, Round& round) {
  if (++round.left != c.nranks) return;
  auto it = c.rounds.find(ticket);
  if (it != c.rounds.end() && it->second.get() == &round) c.rounds.erase(it);
}

void RunCollective(const Op& op) {
  State& st = St();
  Comm& c = *op.comm;
  const int n = c.nranks;
  std::unique_lock<std::mutex> lk(st.mu);
  std::shared_ptr<Round>& slot = c.rounds[op.ticket];
  if (!slot) slot = std::make_shared<Round>(n);
  const std::shared_ptr<Round> round = slot;
  // Failed: a peer gave up on this round and its buffers may be gone.
  if (round->state == RoundState::kFailed || c.aborted || st.shutdown) return;
  round->posts[op.rank] = op.post;
  round->arrived[op.rank] = true;
  if (++round->posted == n) {
    if (Agree(round->posts)) {
      round->state = RoundState::kReady;
    } else {
      round->state = RoundState::kMismatch;
      std::string what = "communicator " + std::to_string(c.serial) + ", round " + std::to_string(op.ticket) +
                         ": the ranks' calls disagree (";
      for (int k = 0; k < n; ++k) {
        what += (k == 0 ? "rank " : "; rank ") + std::to_string(k) + ": " + Describe(round->posts[k]);
      }
      RecordError(what + "); outputs left untouched");
    }
    st.cv.notify_all();
  } else {
    st.cv.wait_until(lk, Clock::now() + op.limit, [&] {
      return round->state != RoundState::kPending || c.aborted || st.shutdown;
    });
    if (round->state == RoundState::kPending) {
      std::string missing;
      for (int k = 0; k < n; ++k) {
        if (!round->arrived[k]) missing += (missing.empty() ? "" : ",") + std::to_string(k);
      }
      round->state = RoundState::kFailed;
      RecordError(Where(op) + KindName(op.post.kind) + " (round " + std::to_string(op.ticket) +
                  ", waiting for rank(s) " + missing + ") " + GaveUp(op) + "; outputs left untouched");
      st.cv.notify_all();
      return;
    }
  }
  if (round->state == RoundState::kFailed) return;
  if (round->state == RoundState::kMismatch) {
    Leave(c, op.ticket, *round);
    return;
  }
  // Ready: from here on every rank finishes the round, abort or not (a rank
  // that stopped half way would leave a peer writing into its buffers).
  const std::vector<Post> posts = round->posts;
  lk.unlock();
  const Share share = ComputeShare(posts, op.rank);
  lk.lock();
  Barrier(lk, *round, &Round::computed, n);
  lk.unlock();
  for (const Share::Write& w : share.writes) {
    const std::vector<char>& t = share.temps[w.temp];
    std::memmove(w.dst, t.data(), t.size());
  }
  lk.lock();
  Barrier(lk, *round, &Round::written, n);
  Leave(c, op.ticket, *round);
}

// ---- point to point ---------------------------------------------------------

std::shared_ptr<Message> MessageFor(Comm& c, int from, int to, uint64_t seq) {
  std::shared_ptr<Message>& slot = c.messages[{from, to, seq}];
  if (!slot) slot = std::make_shared<Message>();
  return slot;
}

std::string P2pWhat(const Op& op) {
  return Where(op) + KindName(op.post.kind) + (op.post.kind == Kind::kSend ? " to rank " : " from rank ") +
         std::to_string(op.peer) + " (#" + std::to_string(op.ticket) + ") ";
}

void RunSend(const Op& op) {
  State& st = St();
  Comm& c = *op.comm;
  // Copied before the lock: the send buffer is this rank's and stable while
  // its kernel runs.
  std::vector<char> data;
  if (op.post.count > 0) data.assign(op.post.send, op.post.send + op.post.count * DtypeSize(op.post.dtype));
  std::unique_lock<std::mutex> lk(st.mu);
  const std::shared_ptr<Message> msg = MessageFor(c, op.rank, op.peer, op.ticket);
  if (msg->failed || c.aborted || st.shutdown) return;
  msg->posted = true;
  msg->count = op.post.count;
  msg->dtype = op.post.dtype;
  msg->data = std::move(data);
  st.cv.notify_all();
  if (op.eager) return;
  st.cv.wait_until(lk, Clock::now() + op.limit, [&] { return msg->taken || c.aborted || st.shutdown; });
  if (!msg->taken) {
    msg->failed = true;
    RecordError(P2pWhat(op) + GaveUp(op) + " waiting for the matching bkcl_recv");
  }
}

void RunRecv(const Op& op) {
  State& st = St();
  Comm& c = *op.comm;
  std::unique_lock<std::mutex> lk(st.mu);
  const std::tuple<int, int, uint64_t> key{op.peer, op.rank, op.ticket};
  const std::shared_ptr<Message> msg = MessageFor(c, op.peer, op.rank, op.ticket);
  if (msg->failed || c.aborted || st.shutdown) return;
  st.cv.wait_until(lk, Clock::now() + op.limit,
                   [&] { return msg->posted || msg->failed || c.aborted || st.shutdown; });
  if (!msg->posted || msg->failed) {
    if (!msg->failed) RecordError(P2pWhat(op) + GaveUp(op) + " waiting for the matching bkcl_send");
    msg->failed = true;
    return;
  }
  msg->taken = true;
  c.messages.erase(key);
  st.cv.notify_all();
  if (msg->count != op.post.count || msg->dtype != op.post.dtype) {
    RecordError(P2pWhat(op) + "does not match the send: " + std::to_string(msg->count) + " elements of dtype " +
                std::to_string(msg->dtype) + " sent, " + std::to_string(op.post.count) + " of dtype " +
                std::to_string(op.post.dtype) + " received; output left untouched");
    return;
  }
  const std::vector<char> data = std::move(msg->data);
  lk.unlock();
  if (!data.empty()) std::memcpy(op.post.recv, data.data(), data.size());
}

}  // namespace

std::string Describe(const Post& p) {
  std::string s = std::string(KindName(p.kind)) + " count " + std::to_string(p.count) + " dtype " +
                  std::to_string(p.dtype);
  if (Reduces(p.kind)) s += " op " + std::to_string(p.op);
  if (p.kind == Kind::kBroadcast) s += " root " + std::to_string(p.root);
  return s;
}

bool Agree(const std::vector<Post>& p) {
  for (const Post& q : p) {
    if (q.kind != p[0].kind || q.count != p[0].count || q.dtype != p[0].dtype) return false;
    if (Reduces(q.kind) && q.op != p[0].op) return false;
    if (q.kind == Kind::kBroadcast && q.root != p[0].root) return false;
  }
  return true;
}

void ReduceInto(const std::vector<const char*>& srcs, uint64_t n, int dtype, int op, char* out) {
  Reduce(srcs, n, dtype, op, out);
}

void RunOp(void* arg) {
  const std::unique_ptr<Op> op(static_cast<Op*>(arg));
  if (op->comm->hub != nullptr) {  // ranks in other processes (collectives only)
    op->comm->hub->RunSpanning(*op);
    return;
  }
  switch (op->post.kind) {
    case Kind::kSend: RunSend(*op); break;
    case Kind::kRecv: RunRecv(*op); break;
    default: RunCollective(*op); break;
  }
}

}  // namespace fake_bkcl
