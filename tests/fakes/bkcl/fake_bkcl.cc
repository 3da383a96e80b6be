// A test-only, deliberately hostile fake of Kunlun's collective library
// BKCL (libbkcl.so). See README.md next to this file for what it does and
// why. It is never shipped and never loaded outside tests.
//
// This file is the API: unique ids, bkcl_init_rank (blocks until every rank
// of the id joined), the collectives' checks and translation at issue (on
// the calling thread; then one kernel is queued on the rank's stream with
// the fake libxpurt's fake_xpu_launch and the call returns), groups, abort,
// destroy and the fake_bkcl_* introspection. The kernels, which meet their
// peers and compute, are in fake_bkcl_kernels.cc.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fake_bkcl.h"
#include "fake_bkcl_hub.h"
#include "fake_bkcl_internal.h"
#include "fake_env.h"
#include "fake_xpurt.h"
#include "xpurt_symbols.h"

// Declare every function of the shared prototype table first: a definition
// below whose parameters differ from the table's is a compile error
// (conflicting declaration of a C function). The fake libxpurt's functions
// are declared from their table the same way.
#define FAKE_BKCL_DECLARE(name, params) extern "C" __attribute__((visibility("default"))) int name params;
FLAGOS_BKCL_SYMBOLS(FAKE_BKCL_DECLARE, FAKE_BKCL_DECLARE)
FLAGOS_XPURT_SYMBOLS(FAKE_BKCL_DECLARE, FAKE_BKCL_DECLARE)
#undef FAKE_BKCL_DECLARE

namespace fake_bkcl {

State::State() {
  handles = static_cast<char*>(mmap(nullptr, kHandleRegionBytes, PROT_NONE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (handles == MAP_FAILED) {
    std::fprintf(stderr, "fake libbkcl: cannot reserve the handle region: %s\n", std::strerror(errno));
    std::abort();
  }
}

State& St() {
  static State* const state = new State;
  return *state;
}

void RecordError(const std::string& what) {
  State& st = St();
  std::lock_guard<std::mutex> lk(st.err_mu);
  st.last_error = what;
  std::fprintf(stderr, "fake libbkcl: %s\n", what.c_str());
}

}  // namespace fake_bkcl

namespace {

using namespace fake_bkcl;  // NOLINT: this file is the namespace's API

constexpr int kOk = bkcl::kSuccess;
constexpr int kBadArg = bkcl::kInvalidArgument;
constexpr int kRuntime = bkcl::kRuntimeError;
constexpr int kSystem = bkcl::kSystemError;

// The fake's own unique ids: a magic, the making process's pid, a serial
// and random bytes; the rest zero. Each names a hub (fake_bkcl_hub.h) that
// bkcl_get_unique_id creates; bkcl_init_rank, in any process, refuses an id
// without one.
constexpr char kIdMagic[8] = {'F', 'A', 'K', 'E', 'B', 'K', 'C', 'L'};
struct IdHeader {
  char magic[8];
  uint32_t pid;
  uint64_t serial;
  unsigned char random[16];
};
static_assert(sizeof(IdHeader) <= bkcl::kUniqueIdBytes);

constexpr long long kMaxTimeoutSeconds = 100'000'000;  // ~3 years: a deadline that cannot overflow
constexpr std::chrono::seconds kDefaultTimeout{600};

// ---- environment (read at each call) --------------------------------------

[[noreturn]] void ConfigError(const char* var, const std::string& what) {
  fake_env::ConfigError("fake libbkcl", var, what);
}

// The function named `name` ("all_reduce" or "bkcl_all_reduce"); -1 if none.
int FnByName(std::string_view name) {
  for (int i = 0; i < kFnCount; ++i) {
    const std::string_view full = kFnNames[i];
    if (name == full || name == full.substr(5)) return i;
  }
  return -1;
}

// FAKE_BKCL_FAIL=name[,name...]: those calls return kRuntimeError and do
// nothing. An unknown name aborts, as the other fakes' malformed variables do.
bool FailInjected(Fn fn) {
  const char* v = std::getenv("FAKE_BKCL_FAIL");
  if (v == nullptr) return false;
  bool hit = false;
  std::string_view rest = v;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = fake_env::Trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const int f = FnByName(item);
    if (f < 0) ConfigError("FAKE_BKCL_FAIL", "unknown function '" + item + "'");
    hit = hit || f == fn;
  }
  return hit;
}

// How long a wait for peers may last: FAKE_BKCL_INIT_TIMEOUT_MS (a test
// hook, milliseconds), else BKCL_TIMEOUT (seconds, the real library's
// variable), else 600 s.
std::chrono::milliseconds WaitLimit() {
  if (const char* v = std::getenv("FAKE_BKCL_INIT_TIMEOUT_MS")) {
    return std::chrono::milliseconds(fake_env::ParseInt("fake libbkcl", "FAKE_BKCL_INIT_TIMEOUT_MS",
                                                        fake_env::Trim(v), 0, kMaxTimeoutSeconds * 1000));
  }
  if (const char* v = std::getenv("BKCL_TIMEOUT")) {
    return std::chrono::seconds(
        fake_env::ParseInt("fake libbkcl", "BKCL_TIMEOUT", fake_env::Trim(v), 0, kMaxTimeoutSeconds));
  }
  return kDefaultTimeout;
}

// Every call starts here: counts it; true when FAKE_BKCL_FAIL names it.
bool Enter(Fn fn) {
  St().calls[fn].fetch_add(1, std::memory_order_relaxed);
  return FailInjected(fn);
}

std::shared_ptr<Rank> FindRank(bkcl::Context ctx) {
  State& st = St();
  std::lock_guard<std::mutex> lk(st.mu);
  auto it = st.contexts.find(reinterpret_cast<uintptr_t>(ctx));
  return it == st.contexts.end() ? nullptr : it->second;
}

// The communicator's size, for the calls whose buffers hold a chunk per
// rank; 1 for an unknown ctx (which Issue then refuses).
uint64_t RanksOf(bkcl::Context ctx) {
  const std::shared_ptr<Rank> rk = FindRank(ctx);
  return rk == nullptr ? 1 : static_cast<uint64_t>(rk->comm->nranks);
}

// Marks the communicator aborted and wakes its waiting kernels (they return
// without writing). Call with State::mu held.
void AbortLocked(Comm& c, const std::string& why) {
  if (c.aborted) return;
  c.aborted = true;
  RecordError("communicator " + std::to_string(c.serial) + " aborted: " + why);
  St().cv.notify_all();
}

// ---- issuing ---------------------------------------------------------------

// A call queued inside a group: launched at the outermost bkcl_group_end.
struct Deferred {
  int device;
  void* stream;
  std::unique_ptr<Op> op;
};

thread_local int t_group_depth = 0;
thread_local std::vector<Deferred> t_deferred;

// a * b, false on overflow.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// The host address of `elems` elements at device address `ptr` for a
// kernel on `stream`; nullptr for none. False when the range is not inside
// one live allocation of the stream's device (a device kernel would fault).
bool Translate(void* stream, const void* ptr, uint64_t elems, uint64_t es, char** out) {
  *out = nullptr;
  if (elems == 0) return true;
  uint64_t bytes = 0;
  if (!Mul(elems, es, &bytes)) return false;
  *out = static_cast<char*>(fake_xpu_kernel_address(stream, ptr, bytes));
  return *out != nullptr;
}

// One collective or point-to-point call, as its bkcl_* function describes it.
struct Call {
  Kind kind = Kind::kAllReduce;
  uint64_t count = 0;
  int dtype = 0;
  int op = 0;
  int root = 0;
  int peer = 0;
  const void* send = nullptr;
  uint64_t send_chunks = 0;  // elements of send: count * send_chunks
  void* recv = nullptr;
  uint64_t recv_chunks = 0;
};

// The issue path every collective, send and receive takes, on the calling
// thread: checks, translation, a ticket (the rank's round, or its n-th
// message with the peer), then one kernel on `stream` (or, inside a group,
// kept for bkcl_group_end). Returns without waiting for the kernel.
int Issue(Fn fn, bkcl::Context ctx, Call call, void* stream) {
  if (Enter(fn)) return kRuntime;
  const std::shared_ptr<Rank> rk = FindRank(ctx);
  if (rk == nullptr) return kBadArg;
  const int n = rk->comm->nranks;
  {
    std::lock_guard<std::mutex> lk(St().mu);
    if (rk->comm->aborted) return kRuntime;
  }
  int dev = -1;
  if (xpu_current_device(&dev) != 0) return kSystem;
  if (dev != rk->device) return kBadArg;  // the context's device must be current
  const uint64_t es = DtypeSize(call.dtype);
  if (es == 0) return kBadArg;
  if (Reduces(call.kind) && !ValidOp(call.op)) return kBadArg;
  if (call.kind == Kind::kBroadcast && (call.root < 0 || call.root >= n)) return kBadArg;
  const bool p2p = call.kind == Kind::kSend || call.kind == Kind::kRecv;
  if (p2p && (call.peer < 0 || call.peer >= n)) return kBadArg;
  if (p2p && rk->comm->hub != nullptr) {
    RecordError(std::string("bkcl_") + KindName(call.kind) + ": communicator " + std::to_string(rk->comm->serial) +
                " spans processes, and the fake models no point-to-point calls between processes");
    return kBadArg;
  }
  if (call.kind == Kind::kBroadcast && call.root != rk->rank) call.send_chunks = 0;  // not read

  auto op = std::make_unique<Op>();
  op->comm = rk->comm;
  op->rank = rk->rank;
  op->peer = call.peer;
  op->post.kind = call.kind;
  op->post.count = call.count;
  op->post.dtype = call.dtype;
  op->post.op = call.op;
  op->post.root = call.root;
  uint64_t send_elems = 0, recv_elems = 0;
  if (!Mul(call.count, call.send_chunks, &send_elems) || !Mul(call.count, call.recv_chunks, &recv_elems) ||
      !Translate(stream, call.send, send_elems, es, &op->post.send) ||
      !Translate(stream, call.recv, recv_elems, es, &op->post.recv)) {
    return kBadArg;
  }
  op->limit = WaitLimit();

  std::lock_guard<std::mutex> ilk(rk->issue_mu);
  uint64_t& counter = call.kind == Kind::kSend   ? rk->next_send[call.peer]
                      : call.kind == Kind::kRecv ? rk->next_recv[call.peer]
                                                 : rk->next_round;
  op->ticket = counter++;
  if (t_group_depth > 0) {
    op->eager = true;
    t_deferred.push_back({dev, stream, std::move(op)});
    return kOk;
  }
  if (fake_xpu_launch(stream, &RunOp, op.get()) != 0) {
    --counter;  // never queued: the peers must not wait for it
    return kBadArg;  // the stream is not one of the context's device
  }
  op.release();  // RunOp owns it now
  return kOk;
}

}  // namespace

// ---- the API ------------------------------------------------------------------

extern "C" int bkcl_get_unique_id(bkcl::UniqueId* id) {
  if (Enter(kFn_bkcl_get_unique_id)) return kRuntime;
  if (id == nullptr) return kBadArg;
  IdHeader h;
  std::memcpy(h.magic, kIdMagic, sizeof(kIdMagic));
  h.pid = static_cast<uint32_t>(getpid());
  h.serial = St().next_id.fetch_add(1);
  try {
    std::random_device rd;
    for (unsigned char& b : h.random) b = static_cast<unsigned char>(rd());
  } catch (...) {  // no entropy source: the serial keeps ids unique in the process
    std::memset(h.random, 0, sizeof(h.random));
  }
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &h, sizeof(h));
  if (Hub::Create(HubName(id->internal, sizeof(id->internal))) == nullptr) {
    RecordError(std::string("bkcl_get_unique_id: cannot create the id's hub in shared memory: ") +
                std::strerror(errno));
    return kSystem;
  }
  return kOk;
}

extern "C" int bkcl_init_rank(bkcl::Context* ctx, int rank, int nranks, bkcl::UniqueId* id) {
  if (Enter(kFn_bkcl_init_rank)) return kRuntime;
  if (ctx == nullptr || id == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return kBadArg;
  IdHeader h;
  std::memcpy(&h, id->internal, sizeof(h));
  const std::string name = HubName(id->internal, sizeof(id->internal));
  const std::shared_ptr<Hub> hub =
      std::memcmp(h.magic, kIdMagic, sizeof(kIdMagic)) == 0 ? Hub::Open(name) : nullptr;
  const std::string who = "bkcl_init_rank: id " + name.substr(11, 12) + ": rank " + std::to_string(rank) + " ";
  if (hub == nullptr) {
    RecordError(who + "has an id that no bkcl_get_unique_id made, or whose communicator already formed");
    return kBadArg;
  }
  int dev = -1;
  if (xpu_current_device(&dev) != 0) return kSystem;
  const std::chrono::milliseconds limit = WaitLimit();
  const std::string key(id->internal, sizeof(id->internal));

  State& st = St();
  {
    std::lock_guard<std::mutex> lk(st.mu);
    if (st.shutdown) return kRuntime;
  }
  // The ranks meet in the hub, from whichever processes they are in.
  if (const std::string refused = hub->Register(rank, nranks, dev); !refused.empty()) {
    RecordError(who + refused);
    return kBadArg;
  }
  if (std::string why; !hub->WaitFormed(rank, limit, &why)) {
    RecordError(who + why);
    return kRuntime;
  }
  // Formed: this process's Comm for the id, shared by its ranks. A
  // communicator within this process runs its rounds here; one that spans
  // processes, through the hub.
  const bool spans = hub->Spans();
  std::vector<int> devices = hub->LocalDevices();
  std::unique_lock<std::mutex> lk(st.mu);
  std::shared_ptr<Comm>& slot = st.forming[key];
  if (!slot) {
    slot = std::make_shared<Comm>();
    slot->serial = st.next_comm++;
    slot->nranks = nranks;
    slot->local_ranks = static_cast<int>(std::count_if(devices.begin(), devices.end(), [](int d) { return d >= 0; }));
    slot->devices = std::move(devices);
    if (spans) slot->hub = hub;
  }
  const std::shared_ptr<Comm> c = slot;
  if (++c->joined == c->local_ranks) st.forming.erase(key);
  auto r = std::make_shared<Rank>();
  r->comm = c;
  r->rank = rank;
  r->device = dev;
  r->next_send.assign(nranks, 0);
  r->next_recv.assign(nranks, 0);
  r->handle = reinterpret_cast<uintptr_t>(st.handles) + (st.next_handle++ % kHandleSlots) * kHandleStride;
  st.contexts[r->handle] = r;
  *ctx = reinterpret_cast<bkcl::Context>(r->handle);
  return kOk;
}

extern "C" int bkcl_destroy_context(bkcl::Context ctx) {
  if (Enter(kFn_bkcl_destroy_context)) return kRuntime;
  State& st = St();
  std::lock_guard<std::mutex> lk(st.mu);
  // Kernels still queued hold the Comm; the Rank goes.
  return st.contexts.erase(reinterpret_cast<uintptr_t>(ctx)) == 1 ? kOk : kBadArg;
}

extern "C" int bkcl_comm_abort(bkcl::Context ctx) {
  if (Enter(kFn_bkcl_comm_abort)) return kRuntime;
  const std::shared_ptr<Rank> rk = FindRank(ctx);
  if (rk == nullptr) return kBadArg;
  std::lock_guard<std::mutex> lk(St().mu);
  AbortLocked(*rk->comm, "bkcl_comm_abort on rank " + std::to_string(rk->rank));
  return kOk;
}

extern "C" int bkcl_all_reduce(bkcl::Context ctx, const void* send, void* recv, size_t count, int dtype, int op,
                               void* stream) {
  return Issue(kFn_bkcl_all_reduce, ctx,
               {.kind = Kind::kAllReduce, .count = count, .dtype = dtype, .op = op, .send = send,
                .send_chunks = 1, .recv = recv, .recv_chunks = 1},
               stream);
}

extern "C" int bkcl_broadcast(bkcl::Context ctx, const void* send, void* recv, size_t count, int dtype, int root,
                              void* stream) {
  return Issue(kFn_bkcl_broadcast, ctx,
               {.kind = Kind::kBroadcast, .count = count, .dtype = dtype, .root = root, .send = send,
                .send_chunks = 1, .recv = recv, .recv_chunks = 1},
               stream);
}

extern "C" int bkcl_all_gather(bkcl::Context ctx, const void* send, size_t send_count, void* recv, int dtype,
                               void* stream) {
  return Issue(kFn_bkcl_all_gather, ctx,
               {.kind = Kind::kAllGather, .count = send_count, .dtype = dtype, .send = send, .send_chunks = 1,
                .recv = recv, .recv_chunks = RanksOf(ctx)},
               stream);
}

extern "C" int bkcl_reduce_scatter(bkcl::Context ctx, const void* send, void* recv, size_t recv_count, int dtype,
                                   int op, void* stream) {
  return Issue(kFn_bkcl_reduce_scatter, ctx,
               {.kind = Kind::kReduceScatter, .count = recv_count, .dtype = dtype, .op = op, .send = send,
                .send_chunks = RanksOf(ctx), .recv = recv, .recv_chunks = 1},
               stream);
}

extern "C" int bkcl_all_to_all(bkcl::Context ctx, const void* send, size_t count, void* recv, int dtype,
                               void* stream) {
  const uint64_t n = RanksOf(ctx);
  return Issue(kFn_bkcl_all_to_all, ctx,
               {.kind = Kind::kAllToAll, .count = count, .dtype = dtype, .send = send, .send_chunks = n,
                .recv = recv, .recv_chunks = n},
               stream);
}

extern "C" int bkcl_send(bkcl::Context ctx, const void* buf, size_t count, int peer, int dtype, void* stream) {
  return Issue(kFn_bkcl_send, ctx,
               {.kind = Kind::kSend, .count = count, .dtype = dtype, .peer = peer, .send = buf, .send_chunks = 1},
               stream);
}

extern "C" int bkcl_recv(bkcl::Context ctx, void* buf, size_t count, int peer, int dtype, void* stream) {
  return Issue(kFn_bkcl_recv, ctx,
               {.kind = Kind::kRecv, .count = count, .dtype = dtype, .peer = peer, .recv = buf, .recv_chunks = 1},
               stream);
}

// Groups nest per thread. The calls made inside are checked, translated and
// given their tickets at once (errors come back from the call itself), and
// queued on their streams at the outermost bkcl_group_end: every send
// first (eager: they never wait for their receive), then the rest in call
// order, so any grouped mix of sends and receives completes.
extern "C" int bkcl_group_start() {
  if (Enter(kFn_bkcl_group_start)) return kRuntime;
  ++t_group_depth;
  return kOk;
}

extern "C" int bkcl_group_end() {
  if (Enter(kFn_bkcl_group_end)) return kRuntime;
  if (t_group_depth == 0) return kBadArg;
  if (--t_group_depth > 0) return kOk;
  std::vector<Deferred> work = std::move(t_deferred);
  t_deferred.clear();
  std::stable_partition(work.begin(), work.end(), [](const Deferred& d) { return d.op->post.kind == Kind::kSend; });
  // fake_xpu_launch queues on the current device's streams only: switch to
  // each call's device (the thread may drive several), then back.
  int home = -1;
  if (xpu_current_device(&home) != 0) home = -1;
  int now = home;
  int rc = kOk;
  for (Deferred& d : work) {
    if (d.device != now && xpu_set_device(d.device) == 0) now = d.device;
    if (fake_xpu_launch(d.stream, &RunOp, d.op.get()) == 0) {
      d.op.release();  // RunOp owns it now
      continue;
    }
    // Its ticket is taken: without the kernel its peers would wait out the
    // timeout, so the communicator is broken now.
    std::lock_guard<std::mutex> lk(St().mu);
    AbortLocked(*d.op->comm, "bkcl_group_end could not queue rank " + std::to_string(d.op->rank) + "'s " +
                                 KindName(d.op->post.kind) + " on its stream");
    rc = kRuntime;
  }
  if (home >= 0 && now != home) (void)xpu_set_device(home);
  return rc;
}

// ---- introspection -----------------------------------------------------------

extern "C" uint64_t fake_bkcl_calls(const char* name) {
  if (name == nullptr) return 0;
  const int fn = FnByName(name);
  return fn < 0 ? 0 : St().calls[fn].load(std::memory_order_relaxed);
}

extern "C" int fake_bkcl_live_contexts(void) {
  State& st = St();
  std::lock_guard<std::mutex> lk(st.mu);
  return static_cast<int>(st.contexts.size());
}

extern "C" const char* fake_bkcl_last_error(void) {
  thread_local std::string copy;
  State& st = St();
  std::lock_guard<std::mutex> lk(st.err_mu);
  copy = st.last_error;
  return copy.c_str();
}

// At exit (this library's destructor runs before the fake libxpurt's, which
// joins the stream workers): every waiting kernel and bkcl_init_rank gives
// up, so a rank whose peers never came does not hold the process for
// BKCL_TIMEOUT.
__attribute__((destructor)) static void FakeBkclUnload() {
  State& st = St();
  {
    std::lock_guard<std::mutex> lk(st.mu);
    st.shutdown = true;
  }
  st.cv.notify_all();
  RemoveHubFiles();
}

// Every function of the table must be defined here: taking their addresses
// makes a missing one an undefined symbol, which the link (-z defs) refuses.
namespace {
__attribute__((used)) void* const kEveryApiFunction[] = {
#define FAKE_BKCL_ADDRESS(name, params) reinterpret_cast<void*>(&name),
    FLAGOS_BKCL_SYMBOLS(FAKE_BKCL_ADDRESS, FAKE_BKCL_ADDRESS)
#undef FAKE_BKCL_ADDRESS
};
}  // namespace
