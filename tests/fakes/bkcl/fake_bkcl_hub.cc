// The fake libbkcl's hub: ranks of one id in any process (fake_bkcl_hub.h).
//
// Shared state lives in one POSIX shared-memory object per id, guarded by a
// process-shared robust mutex; waits poll it (a fake needs to be right, not
// fast, and a poll survives a peer that died holding nothing). A round of a
// spanning communicator uses slot ticket % 2: a rank enters round k once
// round k - 2 left the slot, so the send files of a slot are rewritten only
// after every peer read them.

#include "fake_bkcl_hub.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

namespace fake_bkcl {

namespace {

constexpr int kMaxRanks = 64;
constexpr char kHubMagic[8] = {'F', 'B', 'K', 'C', 'L', 'H', 'U', 'B'};

struct HubPost {
  int32_t kind = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t send_bytes = 0;  // of the rank's send file this round
};

enum : int32_t { kPending = 0, kReady = 1, kMismatch = 2 };

struct HubRound {
  uint64_t ticket = 0;  // the round this slot holds now
  int32_t posted = 0;
  int32_t opened = 0;  // ranks that mapped every peer's send file (they may go then)
  int32_t left = 0;
  int32_t state = kPending;
  int32_t arrived[kMaxRanks] = {};
  HubPost posts[kMaxRanks] = {};
};

}  // namespace

struct HubShared {
  char magic[8];
  pthread_mutex_t mu;
  int32_t nranks;  // 0 until the first rank registers
  int32_t joined;
  int32_t formed;
  int32_t broken;
  int32_t pids[kMaxRanks];
  int32_t devices[kMaxRanks];
  HubRound rounds[2];
};

namespace {

std::mutex g_files_mu;
std::vector<std::string>& Files() {  // created here, removed at unload
  static auto* files = new std::vector<std::string>;
  return *files;
}

void Remember(const std::string& name) {
  std::lock_guard<std::mutex> lk(g_files_mu);
  for (const std::string& f : Files()) {
    if (f == name) return;
  }
  Files().push_back(name);
}

// The hub's mutex, held for a scope; a holder that died leaves it
// consistent (every update below is complete before it unlocks).
class Locked {
 public:
  explicit Locked(HubShared* h) : h_(h) {
    if (pthread_mutex_lock(&h_->mu) == EOWNERDEAD) pthread_mutex_consistent(&h_->mu);
  }
  ~Locked() { pthread_mutex_unlock(&h_->mu); }

 private:
  HubShared* h_;
};

HubShared* Map(int fd) {
  void* p = mmap(nullptr, sizeof(HubShared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<HubShared*>(p);
}

std::string DataName(const std::string& hub, int rank, uint64_t slot) {
  return hub + "-r" + std::to_string(rank) + "-s" + std::to_string(slot);
}

// Writes `bytes` at `data` as rank file `name` (created, sized); false on error.
bool WriteFile(const std::string& name, const char* data, uint64_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return false;
  Remember(name);
  bool ok = ftruncate(fd, static_cast<off_t>(bytes)) == 0;
  if (ok && bytes > 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ok = p != MAP_FAILED;
    if (ok) {
      std::memcpy(p, data, bytes);
      munmap(p, bytes);
    }
  }
  close(fd);
  return ok;
}

// A peer's file, mapped read-only for the scope.
class PeerFile {
 public:
  PeerFile(const std::string& name, uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) return;
    struct stat st = {};
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) {
      void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) data_ = static_cast<const char*>(p);
    }
    close(fd);
  }
  ~PeerFile() {
    if (data_ != nullptr) munmap(const_cast<char*>(data_), bytes_);
  }
  PeerFile(const PeerFile&) = delete;
  PeerFile& operator=(const PeerFile&) = delete;
  const char* data() const { return data_; }
  bool ok() const { return bytes_ == 0 || data_ != nullptr; }

 private:
  uint64_t bytes_;
  const char* data_ = nullptr;
};

// Bytes of a rank's send buffer for its call (0 where the call reads none).
uint64_t SendBytes(const Post& p, int nranks) {
  const uint64_t es = DtypeSize(p.dtype);
  switch (p.kind) {
    case Kind::kAllReduce:
    case Kind::kAllGather: return p.count * es;
    case Kind::kBroadcast: return p.send == nullptr ? 0 : p.count * es;
    case Kind::kReduceScatter:
    case Kind::kAllToAll: return p.count * nranks * es;
    default: return 0;
  }
}

// The call a rank published, as the kernels describe and compare calls.
Post AsPost(const HubPost& p) {
  Post q;
  q.kind = static_cast<Kind>(p.kind);
  q.count = p.count;
  q.dtype = p.dtype;
  q.op = p.op;
  q.root = p.root;
  return q;
}

std::vector<Post> PostsOf(const HubRound& r, int n) {
  std::vector<Post> out;
  for (int k = 0; k < n; ++k) out.push_back(AsPost(r.posts[k]));
  return out;
}

void Nap() { std::this_thread::sleep_for(std::chrono::microseconds(200)); }

bool ShuttingDown() {
  State& st = St();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.shutdown;
}

bool Aborted(const Comm& c) {
  std::lock_guard<std::mutex> lk(St().mu);
  return c.aborted || St().shutdown;
}

}  // namespace

std::string HubName(const char* id_bytes, size_t size) {
  static const char kHex[] = "0123456789abcdef";
  std::string name = "/fake-bkcl-";
  // The id's header (magic, pid, serial, random): enough to be unique.
  for (size_t i = 8; i < size && i < 40; ++i) {
    const auto b = static_cast<unsigned char>(id_bytes[i]);
    name += kHex[b >> 4];
    name += kHex[b & 15];
  }
  return name;
}

void RemoveHubFiles() {
  std::lock_guard<std::mutex> lk(g_files_mu);
  for (const std::string& f : Files()) shm_unlink(f.c_str());
  Files().clear();
}

Hub::Hub(std::string name, HubShared* shared) : name_(std::move(name)), shared_(shared) {}

Hub::~Hub() { munmap(shared_, sizeof(HubShared)); }

std::shared_ptr<Hub> Hub::Create(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  Remember(name);
  HubShared* h = ftruncate(fd, sizeof(HubShared)) == 0 ? Map(fd) : nullptr;
  close(fd);
  if (h == nullptr) return nullptr;
  std::memset(static_cast<void*>(h), 0, sizeof(HubShared));
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  h->rounds[0].ticket = 0;
  h->rounds[1].ticket = 1;
  std::memcpy(h->magic, kHubMagic, sizeof(kHubMagic));  // last: a hub is ready once it has it
  return std::shared_ptr<Hub>(new Hub(name, h));
}

std::shared_ptr<Hub> Hub::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  struct stat st = {};
  HubShared* h = fstat(fd, &st) == 0 && st.st_size == static_cast<off_t>(sizeof(HubShared)) ? Map(fd) : nullptr;
  close(fd);
  if (h == nullptr) return nullptr;
  if (std::memcmp(h->magic, kHubMagic, sizeof(kHubMagic)) != 0) {
    munmap(h, sizeof(HubShared));
    return nullptr;
  }
  return std::shared_ptr<Hub>(new Hub(name, h));
}

std::string Hub::Register(int rank, int nranks, int device) {
  if (nranks > kMaxRanks) return "nranks " + std::to_string(nranks) + " (the fake forms at most 64)";
  const int32_t pid = static_cast<int32_t>(getpid());
  Locked lk(shared_);
  if (shared_->formed) return "joins a communicator that already formed";
  if (shared_->nranks == 0) {
    shared_->nranks = nranks;
    for (int k = 0; k < kMaxRanks; ++k) shared_->devices[k] = -1;
  }
  if (shared_->nranks != nranks) {
    return "says nranks " + std::to_string(nranks) + ", its earlier ranks said " +
           std::to_string(shared_->nranks);
  }
  if (shared_->pids[rank] != 0) return "joined twice";
  for (int k = 0; k < nranks; ++k) {
    if (shared_->pids[k] == pid && shared_->devices[k] == device) {
      return "is on device " + std::to_string(device) + ", as rank " + std::to_string(k) +
             " is: BKCL runs one rank per device";
    }
  }
  shared_->pids[rank] = pid;
  shared_->devices[rank] = device;
  if (++shared_->joined == nranks) {
    shared_->formed = 1;
    shm_unlink(name_.c_str());  // every rank has it mapped; no one else may join
  }
  return "";
}

bool Hub::WaitFormed(int rank, std::chrono::milliseconds limit, std::string* why) {
  const auto deadline = Clock::now() + limit;
  while (true) {
    const bool unloading = ShuttingDown();  // State::mu before the hub's, never inside it
    {
      Locked lk(shared_);
      if (shared_->formed) return true;
      if (unloading || Clock::now() >= deadline) {
        *why = unloading ? "gave up: the library is unloading"
                         : "timed out after " + std::to_string(limit.count()) + " ms (BKCL_TIMEOUT): " +
                               std::to_string(shared_->joined) + " of " + std::to_string(shared_->nranks) +
                               " ranks joined";
        shared_->pids[rank] = 0;
        shared_->devices[rank] = -1;
        if (--shared_->joined == 0) shared_->nranks = 0;
        return false;
      }
    }
    Nap();
  }
}

bool Hub::Spans() const {
  Locked lk(shared_);
  const int32_t pid = static_cast<int32_t>(getpid());
  for (int k = 0; k < shared_->nranks; ++k) {
    if (shared_->pids[k] != pid) return true;
  }
  return false;
}

std::vector<int> Hub::LocalDevices() const {
  Locked lk(shared_);
  const int32_t pid = static_cast<int32_t>(getpid());
  std::vector<int> out(shared_->nranks, -1);
  for (int k = 0; k < shared_->nranks; ++k) {
    if (shared_->pids[k] == pid) out[k] = shared_->devices[k];
  }
  return out;
}

void Hub::RunSpanning(const Op& op) {
  HubShared* h = shared_;
  const int n = op.comm->nranks;
  const uint64_t slot = op.ticket % 2;
  const auto deadline = Clock::now() + op.limit;
  const std::string what = "communicator " + std::to_string(op.comm->serial) + " (spanning processes): rank " +
                           std::to_string(op.rank) + "'s " + KindName(op.post.kind) + " (round " +
                           std::to_string(op.ticket) + ") ";
  // Gives up on a wait: the communicator is broken (peers' later rounds
  // give up at once); nothing is written.
  auto give_up = [&](const std::string& waiting_for) {
    std::string why;
    {
      std::lock_guard<std::mutex> lk(St().mu);
      why = St().shutdown      ? "gave up: the library is unloading"
            : op.comm->aborted ? "gave up: the communicator was aborted"
                               : "timed out after " + std::to_string(op.limit.count()) + " ms (BKCL_TIMEOUT)";
    }
    {
      Locked lk(h);
      h->broken = 1;
    }
    RecordError(what + why + " waiting for " + waiting_for + "; outputs left untouched");
  };
  // 1. The slot is this round's once round ticket - 2 left it.
  while (true) {
    {
      Locked lk(h);
      if (h->broken) {
        RecordError(what + "gave up: the communicator is broken (an earlier wait gave up)");
        return;
      }
      if (h->rounds[slot].ticket == op.ticket) break;
    }
    if (Aborted(*op.comm) || Clock::now() >= deadline) return give_up("round " + std::to_string(op.ticket - 2) + " to end");
    Nap();
  }
  // 2. Publish the send buffer and the call.
  const uint64_t send_bytes = SendBytes(op.post, n);
  if (!WriteFile(DataName(name_, op.rank, slot), op.post.send, send_bytes)) {
    return give_up("its send buffer to be published (shared memory: " + std::string(std::strerror(errno)) + ")");
  }
  {
    Locked lk(h);
    HubRound& r = h->rounds[slot];
    HubPost& mine = r.posts[op.rank];
    mine.kind = static_cast<int32_t>(op.post.kind);
    mine.dtype = op.post.dtype;
    mine.op = op.post.op;
    mine.root = op.post.root;
    mine.count = op.post.count;
    mine.send_bytes = send_bytes;
    r.arrived[op.rank] = 1;
    if (++r.posted == n) r.state = Agree(PostsOf(r, n)) ? kReady : kMismatch;
  }
  // 3. Every rank's call is there.
  HubRound copy;
  while (true) {
    {
      Locked lk(h);
      if (h->rounds[slot].state != kPending) {
        copy = h->rounds[slot];
        break;
      }
      if (h->broken) {
        RecordError(what + "gave up: the communicator is broken (an earlier wait gave up)");
        return;
      }
    }
    if (Aborted(*op.comm) || Clock::now() >= deadline) {
      std::string missing;
      {
        Locked lk(h);
        for (int k = 0; k < n; ++k) {
          if (!h->rounds[slot].arrived[k]) missing += (missing.empty() ? "" : ",") + std::to_string(k);
        }
      }
      return give_up("rank(s) " + missing);
    }
    Nap();
  }
  if (copy.state == kMismatch) {  // recorded in every rank's process
    std::string m = "communicator " + std::to_string(op.comm->serial) + ", round " + std::to_string(op.ticket) +
                    " (spanning processes): the ranks' calls disagree (";
    for (int k = 0; k < n; ++k) m += (k == 0 ? "rank " : "; rank ") + std::to_string(k) + ": " + Describe(AsPost(copy.posts[k]));
    RecordError(m + "); outputs left untouched");
  }
  // 4. Compute this rank's own outputs from the peers' files.
  if (copy.state == kReady && op.post.count > 0) {
    const uint64_t es = DtypeSize(op.post.dtype), c = op.post.count;
    std::vector<std::unique_ptr<PeerFile>> files;
    bool readable = true;
    for (int k = 0; k < n; ++k) {
      files.push_back(std::make_unique<PeerFile>(DataName(name_, k, slot), copy.posts[k].send_bytes));
      readable = readable && files.back()->ok();
    }
    // Every rank maps the files before any returns: a peer whose kernel
    // returned may destroy its context, or exit, and remove its file names.
    {
      Locked lk(h);
      ++h->rounds[slot].opened;
    }
    while (true) {
      {
        Locked lk(h);
        if (h->rounds[slot].opened == n) break;
      }
      if (Aborted(*op.comm) || Clock::now() >= deadline) return give_up("its peers to read the round's buffers");
      Nap();
    }
    if (!readable) {
      RecordError(what + "could not read a peer's published send buffer; outputs left untouched");
    } else {
      std::vector<const char*> srcs(n);
      char* out = op.post.recv;
      switch (op.post.kind) {
        case Kind::kAllReduce:
          for (int k = 0; k < n; ++k) srcs[k] = files[k]->data();
          ReduceInto(srcs, c, op.post.dtype, op.post.op, out);
          break;
        case Kind::kBroadcast:
          std::memcpy(out, files[op.post.root]->data(), c * es);
          break;
        case Kind::kAllGather:
          for (int k = 0; k < n; ++k) std::memcpy(out + k * c * es, files[k]->data(), c * es);
          break;
        case Kind::kReduceScatter:
          for (int k = 0; k < n; ++k) srcs[k] = files[k]->data() + op.rank * c * es;
          ReduceInto(srcs, c, op.post.dtype, op.post.op, out);
          break;
        case Kind::kAllToAll:
          for (int k = 0; k < n; ++k) std::memcpy(out + k * c * es, files[k]->data() + op.rank * c * es, c * es);
          break;
        default:
          break;
      }
    }
  }
  // 5. Leave; the last frees the slot for round ticket + 2.
  Locked lk(h);
  HubRound& r = h->rounds[slot];
  if (++r.left == n) {
    const uint64_t next = r.ticket + 2;
    r = HubRound{};
    r.ticket = next;
  }
}

}  // namespace fake_bkcl
