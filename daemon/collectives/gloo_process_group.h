// torch's ProcessGroupGloo, made inside flagosd: the engine that carries the
// collectives of a process group whose ranks are sessions of different
// daemons (rank_between_daemons.h), over TCP between the daemons.
//
// libtorch_cpu, which flagosd links for the cpu backend's kernels, has gloo
// and ProcessGroupGloo compiled in and exports them; the torch wheel does not
// ship gloo's headers, which ProcessGroupGloo.hpp includes. This file's .cc
// is the only translation unit that includes it, compiled against Debian's
// libgloo-dev headers and never linked with its library: it constructs a
// ProcessGroupGloo and a gloo TCP device through libtorch's exported
// functions and uses no gloo type by value, so the headers' version does not
// matter (a build test checks that the object defines no gloo symbol). Every
// other file sees the group as a c10d::Backend.
// (ATen TU)
#ifndef FLAGOS_DAEMON_COLLECTIVES_GLOO_PROCESS_GROUP_H_
#define FLAGOS_DAEMON_COLLECTIVES_GLOO_PROCESS_GROUP_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace flagos::daemon {

// Rank `rank` of `size` of a gloo group that meets in `store`; returns once
// every rank joined (each connects to every other), or throws (c10::Error,
// naming what failed) after `timeout`. Its TCP device is the daemon's one
// (made by the first call): on the interface GLOO_SOCKET_IFNAME names in
// flagosd's environment, else on the address the host name resolves to.
c10::intrusive_ptr<c10d::Backend> NewGlooProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      std::chrono::milliseconds timeout);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_GLOO_PROCESS_GROUP_H_
