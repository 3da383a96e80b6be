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
// all-to-all), a group of one daemon with more ranks than it has devices.
// The decision depends only on what every rank's call shares, so all ranks
// take the same route; a rank that takes the other one fails the
// collective on every rank, naming both (the signatures differ).
//
// A group that spans daemons (groups_between_daemons.h) takes the library
// too, between the daemons' devices, with the same id and the same checks
// (RankBetweenDaemons::RunThroughLibrary: its ranks compare their calls
// through gloo first, rank 0's daemon publishes the id in the Store); its
// part returns once complete on the device, or fails past the group's
// timeout. Its other calls take gloo on the host route. A daemon without
// the library (another node's) takes gloo for every call: the ranks' calls
// then differ, and the collective fails on every rank naming both routes.
//
// send_/recv_ and destroy_communicator stay on the host route (the library's
// point-to-point calls need the group's communicator, which a pair of ranks
// does not form here).
#ifndef FLAGOS_DAEMON_COLLECTIVES_LIBRARY_COLLECTIVES_H_
#define FLAGOS_DAEMON_COLLECTIVES_LIBRARY_COLLECTIVES_H_

#include <memory>

#include "flagos/device_collectives.h"
#include "flagos/runtime.h"

namespace flagos {
class OpExecutor;
}  // namespace flagos

namespace flagos::daemon {

// The namespace whose operators the result may run ("flagos_c10d").
const char* LibraryCollectivesNamespace();

// `collectives` and `runtime` (the backend's) must outlive the result;
// `inner` may be null (no native op kernels: every other operator is
// declined).
std::unique_ptr<OpExecutor> CreateLibraryCollectiveExecutor(DeviceCollectives& collectives,
                                                            DeviceRuntime& runtime,
                                                            std::unique_ptr<OpExecutor> inner);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_LIBRARY_COLLECTIVES_H_
