// The Store flagosd's gloo meets its peers through: the job's Store, with
// each peer's published address checked against --store-networks before
// gloo may read it (and so connect to it).
//
// --store-networks decides which Stores flagosd connects to; the daemons of
// a group then connect to each other at the addresses their gloo published
// in that Store (admission/gloo_peer_address.h). The Store is the client's,
// so without this check a client could make flagosd connect wherever it
// named. gloo reads a peer's record under the key `<device>/<rank>` (below
// the group's prefix); this Store checks every record under such a key for
// a rank other than the caller's own, and refuses the read — gloo's rendezvous
// then fails before it connects anywhere — when the record cannot be read
// or its address is outside the rule. refusal() keeps what was refused, for
// the group's error. The other calls pass through.
// (ATen TU: includes torch's c10d Store.)
#ifndef FLAGOS_DAEMON_COLLECTIVES_PEER_CHECKED_STORE_H_
#define FLAGOS_DAEMON_COLLECTIVES_PEER_CHECKED_STORE_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "admission/store_networks.h"

namespace flagos::daemon {

class PeerCheckedStore : public c10d::Store {
 public:
  // `own_rank`'s view, in a group of `nranks`, of `inner` under `networks`.
  PeerCheckedStore(c10::intrusive_ptr<c10d::Store> inner, int own_rank, int nranks,
                   StoreNetworks networks);

  // The first refusal ("rank 1 is at 203.0.113.7:4567 …"), "" if none.
  std::string refusal() const;

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& current_value,
                                  const std::vector<uint8_t>& new_value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;
  // multiGet reads through get(); append and multiSet are not offered
  // (gloo then uses get and set).
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  bool hasExtendedApi() const override { return false; }

 // Shared by clones: the first refusal.
  struct Refusals {
    mutable absl::Mutex mu;
    std::string first ABSL_GUARDED_BY(mu);
  };
  // A clone's (make_intrusive needs it public).
  PeerCheckedStore(c10::intrusive_ptr<c10d::Store> inner, int own_rank, int nranks,
                   StoreNetworks networks, std::shared_ptr<Refusals> refusals);

 private:
  void Check(const std::string& key, const std::vector<uint8_t>& value);

  const c10::intrusive_ptr<c10d::Store> inner_;
  const int own_rank_;
  const int nranks_;
  const StoreNetworks networks_;
  const std::shared_ptr<Refusals> refusals_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_PEER_CHECKED_STORE_H_
