#include "collectives/peer_checked_store.h"

#include <c10/util/Exception.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "admission/gloo_peer_address.h"

namespace flagos::daemon {

PeerCheckedStore::PeerCheckedStore(c10::intrusive_ptr<c10d::Store> inner, int own_rank,
                                   int nranks, StoreNetworks networks)
    : PeerCheckedStore(std::move(inner), own_rank, nranks, std::move(networks),
                       std::make_shared<Refusals>()) {}

PeerCheckedStore::PeerCheckedStore(c10::intrusive_ptr<c10d::Store> inner, int own_rank,
                                   int nranks, StoreNetworks networks,
                                   std::shared_ptr<Refusals> refusals)
    : c10d::Store(inner->getTimeout()),
      inner_(std::move(inner)),
      own_rank_(own_rank),
      nranks_(nranks),
      networks_(std::move(networks)),
      refusals_(std::move(refusals)) {}

std::string PeerCheckedStore::refusal() const {
  absl::MutexLock lock(&refusals_->mu);
  return refusals_->first;
}

void PeerCheckedStore::Check(const std::string& key, const std::vector<uint8_t>& value) {
  const size_t slash = key.rfind('/');
  int rank = -1;
  if (!absl::SimpleAtoi(slash == std::string::npos ? key : key.substr(slash + 1), &rank) ||
      rank == own_rank_) {
    return;  // not a peer's record: its own, or not gloo's
  }
  const std::string who = absl::StrCat("rank ", rank);
  absl::StatusOr<sockaddr_storage> address = GlooPeerAddress(value, nranks_);
  const absl::Status status =
      address.ok() ? networks_.CheckPeer(reinterpret_cast<const sockaddr*>(&*address), who)
                   : absl::InvalidArgumentError(absl::StrCat(
                         who, "'s daemon cannot be checked against --store-networks: ",
                         address.status().message()));
  if (status.ok()) return;
  {
    absl::MutexLock lock(&refusals_->mu);
    if (refusals_->first.empty()) refusals_->first = std::string(status.message());
  }
  TORCH_CHECK(false, "flagosd does not connect to its peer: ", status.message());
}

c10::intrusive_ptr<c10d::Store> PeerCheckedStore::clone() {
  return c10::make_intrusive<PeerCheckedStore>(inner_->clone(), own_rank_, nranks_, networks_,
                                              refusals_);
}

void PeerCheckedStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  inner_->set(key, value);
}

std::vector<uint8_t> PeerCheckedStore::compareSet(const std::string& key,
                                                  const std::vector<uint8_t>& current_value,
                                                  const std::vector<uint8_t>& new_value) {
  std::vector<uint8_t> out = inner_->compareSet(key, current_value, new_value);
  Check(key, out);
  return out;
}

std::vector<uint8_t> PeerCheckedStore::get(const std::string& key) {
  std::vector<uint8_t> out = inner_->get(key);
  Check(key, out);
  return out;
}

std::vector<std::vector<uint8_t>> PeerCheckedStore::multiGet(
    const std::vector<std::string>& keys) {
  std::vector<std::vector<uint8_t>> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(get(key));
  return out;
}

int64_t PeerCheckedStore::add(const std::string& key, int64_t value) {
  return inner_->add(key, value);
}

bool PeerCheckedStore::deleteKey(const std::string& key) { return inner_->deleteKey(key); }

bool PeerCheckedStore::check(const std::vector<std::string>& keys) { return inner_->check(keys); }

int64_t PeerCheckedStore::getNumKeys() { return inner_->getNumKeys(); }

void PeerCheckedStore::wait(const std::vector<std::string>& keys) { inner_->wait(keys); }

void PeerCheckedStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  inner_->wait(keys, timeout);
}

void PeerCheckedStore::setTimeout(const std::chrono::milliseconds& timeout) {
  c10d::Store::setTimeout(timeout);
  inner_->setTimeout(timeout);
}

}  // namespace flagos::daemon
