// MemoryGrants: the daemon-wide record of device memory shared between
// sessions (flagos.proto, ExportMemory ... QueryExport).
//
// flagosd owns all device memory, so sharing a tensor between client
// processes needs no device IPC: a session exports one of its segments and
// gets a grant (a random secret); another session imports the grant and may
// then use the segment's addresses as its own. This is what CUDA IPC
// offers, done by the one process that can offer it on devices whose own
// IPC does not work across processes (the P800's, from public sources).
//
// A shared segment lives until its owner dropped it (a free, or the end of
// its session) and every importer dropped every hold; the call that drops
// the last one is told to free the memory. Its grant is valid as long as
// the memory lives; then imports of it are NOT_FOUND. An export not yet
// imported (a tensor still in a queue) does not keep the memory alive: it
// keeps the segment in use (InUse), so the owner's allocator does not reuse
// it.
//
// Who may import: the sessions of the owner's user (uids from the peer
// credentials of their unix-socket connections; a TCP session has none and may
// neither export nor import), any session, or nobody (Policy).
//
// Thread safety: all methods may be called from any thread.
#ifndef FLAGOS_DAEMON_MEMORY_MEMORY_GRANTS_H_
#define FLAGOS_DAEMON_MEMORY_MEMORY_GRANTS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "memory/segment_table.h"

namespace flagos::daemon {

class MemoryGrants {
 public:
  enum class Policy {
    kSameUser,  // --memory-sharing=same-user (the default)
    kAnyUser,   // --memory-sharing=any-user
    kOff,       // --memory-sharing=off
  };
  // "same-user", "any-user" or "off"; INVALID_ARGUMENT naming the choices.
  static absl::StatusOr<Policy> ParsePolicy(absl::string_view text);
  static absl::string_view PolicyName(Policy policy);

  explicit MemoryGrants(Policy policy) : policy_(policy) {}

  MemoryGrants(const MemoryGrants&) = delete;
  MemoryGrants& operator=(const MemoryGrants&) = delete;

  Policy policy() const { return policy_; }

  // Session `session` (user `uid`, -1 when unknown) grants access to
  // `segment`, which it owns (`owner`) or holds through an import. Returns
  // the segment's grant (the same one for every export of it) and counts
  // one pending import. PERMISSION_DENIED when sharing is off, or the uid
  // is unknown under kSameUser.
  absl::StatusOr<std::string> Export(uint64_t session, int64_t uid, const Segment& segment,
                                     bool owner);
  // Session `session` (user `uid`) takes one hold on the segment of `grant`
  // on `device`, claiming one pending import if any. NOT_FOUND for a grant
  // unknown or whose memory is gone; INVALID_ARGUMENT for another device;
  // PERMISSION_DENIED by the policy (naming both users and the flag).
  absl::StatusOr<Segment> Import(uint64_t session, int64_t uid, absl::string_view grant,
                                 int device);
  // Drops one hold of `session` on the shared segment at (`device`, `addr`).
  // Returns true when nobody holds it any more: the caller frees it.
  // NOT_FOUND when the session holds no import of it.
  absl::StatusOr<bool> Release(uint64_t session, int device, DevicePtr addr);
  // The owner dropped the segment at (`device`, `addr`). Returns true when
  // nobody holds it (the caller frees it), or when it was never shared.
  bool DropOwner(int device, DevicePtr addr);
  // Drops every hold of `session` (its end); returns the segments nobody
  // holds any more, for the caller to free.
  std::vector<Segment> DropSession(uint64_t session);
  // True when the segment at (`device`, `addr`) has an unclaimed export or
  // an import held (by any session, its owner's included).
  bool InUse(int device, DevicePtr addr) const;

  // Bytes on `device` of shared segments whose owner dropped them and
  // importers still hold (counted in no session's segments).
  uint64_t orphaned_bytes(int device) const;
  // Segments shared now (any device).
  uint64_t shared_segments() const;

 private:
  struct Shared {
    Segment segment;
    std::string grant;
    uint64_t owner_session = 0;
    int64_t owner_uid = -1;
    bool owner_holds = true;
    uint64_t pending = 0;  // exports not yet claimed by an import
    absl::flat_hash_map<uint64_t, uint64_t> holds;  // session → imports
  };
  using Key = std::pair<int, DevicePtr>;

  // REQUIRES: mu_ held. Forgets `it` if nobody holds it; returns whether it
  // did.
  bool ForgetIfUnheld(absl::flat_hash_map<Key, Shared>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Policy policy_;
  // A leaf, taken under a session's memory_mu_ or imports_mu_ (session.h's
  // lock order); nothing is called out of it.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, Shared> shared_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Key> by_grant_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_MEMORY_GRANTS_H_
