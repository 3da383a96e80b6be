// The collectives of a backend whose device memory the host cannot address,
// run by its vendor collective library (flagos/device_collectives.h: BKCL on
// kunlunxin) over the ranks' device memory, on their streams: the native
// route of the flagos_c10d operators (collective_ops.h).
//
// CreateLibraryCollectiveExecutor wraps the backend's native OpExecutor (or
// none): it runs all_reduce_, broadcast_, all_gather_into_tensor_,
// reduce_scatter_tensor_ and all_to_all_single_ itself and hands every other
// operator to the wrapped one. The ranks meet in the daemon's communicators
// (communicators.h) as on the host route; once all arrived, each rank's
// thread joins the library's communicator (the first time: every rank at
// once, with an id made by the daemon) and issues its part on its stream.
//
// A call the library cannot take is declined before any rank arrives, and
// takes the host route (cpu_fallback: device→host, the daemon's threads,
// host→device): a dtype it has no type for, avg and the bitwise reductions,
// non-contiguous tensors, uneven all_to_all splits (or a library without
// all-to-all), a group with more ranks than the node has devices, a group
// that spans daemons (groups_between_daemons.h: gloo, on host memory). The
// decision depends only on what every rank's call shares, so all ranks take
// the same route; a rank that takes the other one fails the collective on
// every rank, naming both (the signatures differ).
//
// send_/recv_ and destroy_communicator stay on the host route (the library's
// point-to-point calls need the group's communicator, which a pair of ranks
// does not form here).
#ifndef FLAGOS_DAEMON_COLLECTIVES_LIBRARY_COLLECTIVES_H_
#define FLAGOS_DAEMON_COLLECTIVES_LIBRARY_COLLECTIVES_H_

#include <memory>

#include "flagos/device_collectives.h"

namespace flagos {
class OpExecutor;
}  // namespace flagos

namespace flagos::daemon {

// The namespace whose operators the result may run ("flagos_c10d").
const char* LibraryCollectivesNamespace();

// `collectives` must outlive the result; `inner` may be null (no native op
// kernels: every other operator is declined). `devices`: the backend's
// device count.
std::unique_ptr<OpExecutor> CreateLibraryCollectiveExecutor(DeviceCollectives& collectives,
                                                            int devices,
                                                            std::unique_ptr<OpExecutor> inner);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_LIBRARY_COLLECTIVES_H_
