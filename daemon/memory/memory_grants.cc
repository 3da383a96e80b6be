#include "memory/memory_grants.h"

#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {
namespace {

constexpr size_t kGrantBytes = 16;

std::string NewGrant() {
  std::string grant(kGrantBytes, '\0');
  size_t filled = 0;
  while (filled < grant.size()) {
    const ssize_t n = getrandom(grant.data() + filled, grant.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return grant;
}

// The first bytes of a grant, for messages (never the whole secret).
std::string GrantPrefix(absl::string_view grant) {
  return absl::StrCat(absl::BytesToHexString(grant.substr(0, 4)), "...");
}

std::string UserName(int64_t uid) {
  return uid < 0 ? std::string("an unknown user") : absl::StrCat("uid ", uid);
}

}  // namespace

absl::StatusOr<MemoryGrants::Policy> MemoryGrants::ParsePolicy(absl::string_view text) {
  if (text == "same-user") return Policy::kSameUser;
  if (text == "any-user") return Policy::kAnyUser;
  if (text == "off") return Policy::kOff;
  return absl::InvalidArgumentError(absl::StrCat(
      "--memory-sharing=", text, " is not a sharing policy: use same-user, any-user or off"));
}

absl::string_view MemoryGrants::PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kSameUser: return "same-user";
    case Policy::kAnyUser: return "any-user";
    case Policy::kOff: return "off";
  }
  return "unknown";
}

absl::StatusOr<std::string> MemoryGrants::Export(uint64_t session, int64_t uid,
                                                 const Segment& segment, bool owner) {
  if (policy_ == Policy::kOff) {
    return absl::PermissionDeniedError(
        "flagosd shares no device memory between processes (--memory-sharing=off); copy the "
        "tensor to the CPU to send it, or ask the operator to allow sharing");
  }
  if (policy_ == Policy::kSameUser && uid < 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", session, " cannot share device memory: flagosd knows a user only from "
        "the peer credentials of a unix-socket connection, and this session came over TCP; "
        "connect over flagosd's unix socket"));
  }
  absl::MutexLock lock(&mu_);
  const Key key{segment.device, segment.addr};
  auto it = shared_.find(key);
  if (it == shared_.end()) {
    if (!owner) {
      return absl::InternalError("an imported segment is not in the shared-memory table");
    }
    Shared shared;
    shared.segment = segment;
    shared.grant = NewGrant();
    shared.owner_session = session;
    shared.owner_uid = uid;
    by_grant_.emplace(shared.grant, key);
    it = shared_.emplace(key, std::move(shared)).first;
  }
  ++it->second.pending;
  return it->second.grant;
}

absl::StatusOr<Segment> MemoryGrants::Import(uint64_t session, int64_t uid,
                                             absl::string_view grant, int device) {
  if (policy_ == Policy::kOff) {
    return absl::PermissionDeniedError(
        "flagosd shares no device memory between processes (--memory-sharing=off)");
  }
  absl::MutexLock lock(&mu_);
  auto key = by_grant_.find(std::string(grant));
  if (key == by_grant_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no device memory is shared under grant ", GrantPrefix(grant),
        ": the sending process freed it or ended before this one received it (keep a shared "
        "tensor alive in the sender until the receiver holds it, as with CUDA), or the grant "
        "is from another flagosd"));
  }
  Shared& shared = shared_.at(key->second);
  if (shared.segment.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grant ", GrantPrefix(grant), " is for memory on ", DeviceName(shared.segment.device),
        ", not on ", DeviceName(device)));
  }
  if (policy_ == Policy::kSameUser && (uid < 0 || uid != shared.owner_uid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", session, " (", UserName(uid), ") may not use device memory of session ",
        shared.owner_session, " (", UserName(shared.owner_uid),
        "): flagosd shares memory only between processes of one user; the operator may allow "
        "more with --memory-sharing=any-user"));
  }
  if (shared.pending > 0) --shared.pending;
  ++shared.holds[session];
  return shared.segment;
}

bool MemoryGrants::ForgetIfUnheld(absl::flat_hash_map<Key, Shared>::iterator it) {
  if (it->second.owner_holds || !it->second.holds.empty()) return false;
  by_grant_.erase(it->second.grant);
  shared_.erase(it);
  return true;
}

absl::StatusOr<bool> MemoryGrants::Release(uint64_t session, int device, DevicePtr addr) {
  absl::MutexLock lock(&mu_);
  auto it = shared_.find(Key{device, addr});
  if (it != shared_.end()) {
    auto hold = it->second.holds.find(session);
    if (hold != it->second.holds.end()) {
      if (--hold->second == 0) it->second.holds.erase(hold);
      return ForgetIfUnheld(it);
    }
  }
  return absl::NotFoundError(absl::StrFormat(
      "session %d holds no imported segment at 0x%x on %s (released twice, or not an address "
      "import_memory returned)",
      session, addr, DeviceName(device)));
}

bool MemoryGrants::DropOwner(int device, DevicePtr addr) {
  absl::MutexLock lock(&mu_);
  auto it = shared_.find(Key{device, addr});
  if (it == shared_.end()) return true;
  it->second.owner_holds = false;
  return ForgetIfUnheld(it);
}

std::vector<Segment> MemoryGrants::DropSession(uint64_t session) {
  std::vector<Segment> unheld;
  absl::MutexLock lock(&mu_);
  std::vector<Key> held;
  for (const auto& [key, shared] : shared_) {
    if (shared.holds.contains(session)) held.push_back(key);
  }
  for (const Key& key : held) {
    auto it = shared_.find(key);
    it->second.holds.erase(session);
    const Segment segment = it->second.segment;
    if (ForgetIfUnheld(it)) unheld.push_back(segment);
  }
  return unheld;
}

bool MemoryGrants::InUse(int device, DevicePtr addr) const {
  absl::MutexLock lock(&mu_);
  auto it = shared_.find(Key{device, addr});
  return it != shared_.end() && (it->second.pending > 0 || !it->second.holds.empty());
}

uint64_t MemoryGrants::orphaned_bytes(int device) const {
  absl::MutexLock lock(&mu_);
  uint64_t bytes = 0;
  for (const auto& [key, shared] : shared_) {
    if (key.first == device && !shared.owner_holds) bytes += shared.segment.nbytes;
  }
  return bytes;
}

uint64_t MemoryGrants::shared_segments() const {
  absl::MutexLock lock(&mu_);
  return shared_.size();
}

}  // namespace flagos::daemon
