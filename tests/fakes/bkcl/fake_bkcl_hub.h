// Internal to the fake libbkcl (tests/fakes/bkcl): the hub, where the ranks
// of one unique id meet when they may live in different processes (the
// ranks of a process group that spans daemons: each daemon is a process).
//
// bkcl_get_unique_id creates a hub in POSIX shared memory named after the
// id; bkcl_init_rank opens it from any process, registers the rank (its
// pid and device) and waits until every rank registered. A communicator
// whose ranks are all in one process then runs as before (fake_bkcl_
// internal.h: rounds in this process's memory); one whose ranks span
// processes runs each collective through the hub (RunSpanning): a rank
// publishes its call and its send buffer (a shared-memory file of its own
// per round slot), waits until every rank published, and computes its own
// output from the peers' files. Each rank writes only its own outputs.
//
// What it does not model across processes: point-to-point calls (bkcl_send
// and bkcl_recv refuse a spanning communicator), and an abort reaches only
// the aborting process's kernels (as a real communicator's abort is local:
// peers wait out their own timeout). A wait that gives up breaks the
// spanning communicator: later collectives give up at once, writing
// nothing. A process that dies leaves its peers to their timeouts.
#ifndef FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_HUB_H_
#define FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_HUB_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fake_bkcl_internal.h"

namespace fake_bkcl {

struct HubShared;  // the shared memory's layout (fake_bkcl_hub.cc)

// One process's mapping of a hub.
class Hub {
 public:
  // Creates the hub of a new id (named by `name`, e.g. "/fake-bkcl-..."); null
  // with errno set when it cannot.
  static std::shared_ptr<Hub> Create(const std::string& name);
  // Opens an existing hub; null when there is none (an id no
  // bkcl_get_unique_id made, or whose communicator already formed).
  static std::shared_ptr<Hub> Open(const std::string& name);
  ~Hub();

  // Registers rank `rank` of `nranks` on `device` of this process; "" or
  // why it is refused (nranks that differ from the earlier ranks', a rank
  // that joined twice, a second rank on this process's device).
  std::string Register(int rank, int nranks, int device);
  // Waits until every rank registered (true), or `limit` passed or the
  // library unloads (false: the rank is unregistered again, so the id can
  // be retried). The rank that completes the hub removes its name.
  bool WaitFormed(int rank, std::chrono::milliseconds limit, std::string* why);
  // After formation: whether some rank is in another process, and each
  // rank's device (-1 for another process's).
  bool Spans() const;
  std::vector<int> LocalDevices() const;

  // The kernel of a collective on a spanning communicator (RunOp's).
  void RunSpanning(const Op& op);

 private:
  Hub(std::string name, HubShared* shared);

  const std::string name_;
  HubShared* const shared_;
};

// The hub name of a unique id's bytes.
std::string HubName(const char* id_bytes, size_t size);

// Removes the shared-memory files this process created and no longer
// needs (at unload).
void RemoveHubFiles();

}  // namespace fake_bkcl

#endif  // FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_HUB_H_
