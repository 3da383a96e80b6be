// Internal to the fake libbkcl (tests/fakes/bkcl): what its two sources
// share. fake_bkcl.cc is the API (ids, bkcl_init_rank, argument checks and
// translation at issue, groups, abort, destroy, introspection);
// fake_bkcl_kernels.cc holds the kernels the collectives queue on the
// rank's stream (the rounds, the point-to-point messages, the arithmetic).
// fake_bkcl_hub.{h,cc} is where ranks of other processes meet.
// Not installed, not part of any contract; hidden (CXX_VISIBILITY_PRESET
// hidden, libbkcl.map).
//
// The model: the ranks of one id form a Comm. Each collective a rank issues
// is that rank's k-th (its "round" k); the kernel it queues meets the other
// ranks' k-th kernels in Comm::rounds[k]. Sends and receives meet in
// Comm::messages by (sender, receiver, n-th send between them). All of it
// is guarded by State::mu, and every wait is on State::cv: a fake needs to
// be right, not fast, and one lock makes an abort or the library's unload
// wake every waiter at once.
#ifndef FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_INTERNAL_H_
#define FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_INTERNAL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "bkcl_symbols.h"

namespace fake_bkcl {

namespace bkcl = flagos::kunlunxin::bkcl;
using Clock = std::chrono::steady_clock;

// The library's functions, from the shared table, for counting and
// FAKE_BKCL_FAIL.
enum Fn : int {
#define FAKE_BKCL_FN_ENUM(name, params) kFn_##name,
  FLAGOS_BKCL_SYMBOLS(FAKE_BKCL_FN_ENUM, FAKE_BKCL_FN_ENUM)
#undef FAKE_BKCL_FN_ENUM
      kFnCount
};

inline constexpr const char* kFnNames[kFnCount] = {
#define FAKE_BKCL_FN_NAME(name, params) #name,
    FLAGOS_BKCL_SYMBOLS(FAKE_BKCL_FN_NAME, FAKE_BKCL_FN_NAME)
#undef FAKE_BKCL_FN_NAME
};

enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kSend, kRecv };

inline const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllGather: return "all_gather";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kSend: return "send";
    case Kind::kRecv: return "recv";
  }
  return "?";
}

inline bool Reduces(Kind k) { return k == Kind::kAllReduce || k == Kind::kReduceScatter; }

// Bytes per element; 0 for a value outside bkcl::DataType.
inline size_t DtypeSize(int dtype) {
  switch (dtype) {
    case bkcl::kUint8: return 1;
    case bkcl::kFloat16:
    case bkcl::kBfloat16: return 2;
    case bkcl::kInt32:
    case bkcl::kFloat: return 4;
    case bkcl::kInt64:
    case bkcl::kFloat64: return 8;
    default: return 0;
  }
}

inline bool ValidOp(int op) {
  return op == bkcl::kAdd || op == bkcl::kProduct || op == bkcl::kMax || op == bkcl::kMin;
}

// One rank's call as its kernel brings it to a round: what the ranks must
// agree on, and its buffers as host addresses (translated at issue;
// nullptr where the call has no elements there, and for a broadcast's send
// on a rank other than the root, which BKCL does not read).
struct Post {
  Kind kind = Kind::kAllReduce;
  uint64_t count = 0;  // the call's count argument (per rank where it says so)
  int dtype = 0;
  int op = 0;    // reductions only
  int root = 0;  // broadcast only
  char* send = nullptr;
  char* recv = nullptr;
};

enum class RoundState {
  kPending,   // not every rank's kernel has arrived
  kReady,     // all arrived and agree: every rank computes its share
  kMismatch,  // all arrived and disagree: nobody writes
  kFailed,    // a rank gave up waiting (timeout, abort, unload): nobody writes,
              // and a late rank must not either (the others' buffers may be gone)
};

struct Round {
  explicit Round(int nranks) : posts(nranks), arrived(nranks, false) {}
  std::vector<Post> posts;
  std::vector<bool> arrived;
  int posted = 0;
  int computed = 0;  // ranks that read every input they need (barrier before writing)
  int written = 0;   // ranks that wrote their share (barrier before the kernels return)
  int left = 0;      // ranks done with the round; the last erases it
  RoundState state = RoundState::kPending;
};

// One bkcl_send, buffered: the send kernel copies its data here, the
// matching receive kernel takes it.
struct Message {
  bool posted = false;  // the send kernel ran
  bool taken = false;   // the receive kernel took it
  bool failed = false;  // the receive gave up: a later send posts nothing
  uint64_t count = 0;
  int dtype = 0;
  std::vector<char> data;
};

class Hub;  // fake_bkcl_hub.h

// A communicator: the ranks of one unique id, as this process sees it.
struct Comm {
  uint64_t serial = 0;  // for messages: "communicator 3"
  int nranks = 0;
  std::vector<int> devices;  // per rank; -1 for a rank of another process
  int local_ranks = 0;       // ranks of this process
  int joined = 0;            // of them, those that have their context
  // Set when some rank is in another process: every collective then runs
  // through the hub (Hub::RunSpanning) instead of `rounds`.
  std::shared_ptr<Hub> hub;
  bool aborted = false;  // bkcl_comm_abort
  std::map<uint64_t, std::shared_ptr<Round>> rounds;
  // (sender, receiver, n-th send between them) -> message.
  std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<Message>> messages;
};

// What a bkcl::Context stands for.
struct Rank {
  std::shared_ptr<Comm> comm;
  int rank = 0;
  int device = 0;
  uintptr_t handle = 0;
  // Guards the counters below (the issuing threads' tickets).
  std::mutex issue_mu;
  uint64_t next_round = 0;
  std::vector<uint64_t> next_send;  // per peer
  std::vector<uint64_t> next_recv;  // per peer
};

// One queued kernel: the argument of RunOp. It holds the Comm, so a
// context destroyed with kernels still queued leaves them safe.
struct Op {
  std::shared_ptr<Comm> comm;
  int rank = 0;
  int peer = 0;         // send/recv
  uint64_t ticket = 0;  // the round, or the n-th send/recv between rank and peer
  Post post;
  // A send that returns once its data is buffered. A send issued outside a
  // group is not eager: its kernel waits for the matching receive to take
  // the data (a rendezvous, as a large message needs), so two ranks that
  // each send before receiving, ungrouped, hang as they could on hardware.
  bool eager = false;
  std::chrono::milliseconds limit{0};  // BKCL_TIMEOUT at issue
};

// Context handles: kHandleSlots addresses kHandleStride apart.
inline constexpr uint64_t kHandleRegionBytes = 64ull << 20;
inline constexpr uint64_t kHandleStride = 8;
inline constexpr uint64_t kHandleSlots = kHandleRegionBytes / kHandleStride;

struct State {
  State();

  std::mutex mu;
  std::condition_variable cv;
  bool shutdown = false;  // the library unloads (process exit): every wait gives up
  std::unordered_map<uintptr_t, std::shared_ptr<Rank>> contexts;
  // By id, from formation until each of this process's ranks has its context.
  std::map<std::string, std::shared_ptr<Comm>> forming;
  uint64_t next_comm = 1;
  // Context handles are addresses in a PROT_NONE region, never reused: a
  // host dereference faults, a stale handle is refused.
  char* handles = nullptr;
  uint64_t next_handle = 0;

  std::atomic<uint64_t> calls[kFnCount] = {};
  std::atomic<uint64_t> next_id{1};

  std::mutex err_mu;  // taken inside mu, never the other way round
  std::string last_error;
};

// The one State, created on first use and never deleted (kernels on the
// fake libxpurt's stream workers may run during exit).
State& St();

// Records `what` as fake_bkcl_last_error() and prints it to stderr (the
// real library logs its errors too).
void RecordError(const std::string& what);

// The kernel every call queues: runs the Op (a new'd Op*, deleted here).
void RunOp(void* arg);

// "all_reduce count 4 dtype 5 op 0": a call as a mismatch names it.
std::string Describe(const Post& p);
// Whether the ranks' calls agree (kind, count, dtype; op for reductions,
// root for broadcast).
bool Agree(const std::vector<Post>& p);

// out[i] = srcs[0][i] op srcs[1][i] op ..., in rank order, computed in the
// dtype's compute type (float for the 16-bit floats: rounded once).
void ReduceInto(const std::vector<const char*>& srcs, uint64_t n, int dtype, int op, char* out);

}  // namespace fake_bkcl

#endif  // FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_INTERNAL_H_
