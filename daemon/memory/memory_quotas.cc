#include "memory/memory_quotas.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "byte_size.h"

namespace flagos::daemon {
namespace {

std::string User(int64_t uid) {
  return uid < 0 ? std::string("the sessions without a user (TCP)") : absl::StrCat("uid ", uid);
}

// "64MiB (67108864 bytes)", or "1000 bytes".
std::string Bytes(uint64_t n) {
  const std::string exact = absl::StrCat(n, " bytes");
  const std::string short_form = FormatByteSize(n);
  return short_form == absl::StrCat(n) ? exact : absl::StrCat(short_form, " (", exact, ")");
}

// What the sessions of one (user, device) hold together.
uint64_t Total(const std::map<uint64_t, uint64_t>& sessions) {
  uint64_t total = 0;
  for (const auto& [id, bytes] : sessions) total += bytes;
  return total;
}

}  // namespace

absl::Status MemoryQuotas::Reserve(uint64_t session, int64_t uid, int device, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  // Entries exist only for sessions holding bytes (Release erases at 0).
  static const std::map<uint64_t, uint64_t> kNone;
  auto user = held_.find({uid, device});
  const std::map<uint64_t, uint64_t>& sessions = user == held_.end() ? kNone : user->second;
  auto it = sessions.find(session);
  const uint64_t mine = it == sessions.end() ? 0 : it->second;
  if (limits_.session_bytes != 0 && mine + nbytes > limits_.session_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocating ", Bytes(nbytes), " on flagos:", device, " would take session ", session,
        " (", User(uid), ") beyond its limit: it holds ", Bytes(mine),
        " there, and --session-memory-limit is ", Bytes(limits_.session_bytes),
        " per session and device; free tensors (and torch.flagos.empty_cache()) or ask the "
        "node's administrator for a larger limit"));
  }
  if (limits_.uid_bytes != 0) {
    const uint64_t user_total = Total(sessions);
    if (user_total + nbytes > limits_.uid_bytes) {
      std::vector<std::string> holders;
      for (const auto& [id, bytes] : sessions) {
        holders.push_back(absl::StrCat("session ", id, ": ", FormatByteSize(bytes)));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "allocating ", Bytes(nbytes), " on flagos:", device, " for session ", session,
          " would take ", User(uid), " beyond its limit: its sessions hold ", Bytes(user_total),
          " there (", holders.empty() ? "none" : absl::StrJoin(holders, ", "),
          "), and --uid-memory-limit is ", Bytes(limits_.uid_bytes),
          " per user and device; free tensors or end other processes of the user, or ask the "
          "node's administrator for a larger limit"));
    }
  }
  held_[{uid, device}][session] += nbytes;
  return absl::OkStatus();
}

void MemoryQuotas::Release(uint64_t session, int64_t uid, int device, uint64_t nbytes) {
  absl::MutexLock lock(&mu_);
  auto user = held_.find({uid, device});
  if (user == held_.end()) return;
  auto it = user->second.find(session);
  if (it == user->second.end()) return;
  it->second -= std::min(it->second, nbytes);
  if (it->second == 0) user->second.erase(it);
  if (user->second.empty()) held_.erase(user);
}

uint64_t MemoryQuotas::session_bytes(uint64_t session, int device) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, sessions] : held_) {
    if (key.second != device) continue;
    if (auto it = sessions.find(session); it != sessions.end()) return it->second;
  }
  return 0;
}

uint64_t MemoryQuotas::uid_bytes(int64_t uid, int device) const {
  absl::MutexLock lock(&mu_);
  auto user = held_.find({uid, device});
  return user == held_.end() ? 0 : Total(user->second);
}

}  // namespace flagos::daemon
