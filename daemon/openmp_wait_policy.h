// How flagosd's OpenMP threads wait between parallel regions.
//
// The cpu backend's kernels (and every backend's cpu_fallback) run ATen,
// whose intra-op pool is libgomp's. By default a libgomp thread spins for a
// while after each parallel region, waiting for the next one. In a process
// of its own that costs nothing but power; in flagosd, which shares the
// node's cores with the clients that feed it, a small kernel's team spins
// on a core a client (or another stream worker) needs: a 4x64 MLP's Adam
// step took flagosd 4-9x the CPU time and its client 1.0-1.8x the wall
// time of the same daemon with passive waiting, and a 1024-wide MLP, whose
// kernels keep both threads busy, is as fast either way
// (docs/performance.md, "2026-12-07: OpenMP threads wait passively").
//
// libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main; so
// flagosd sets it and executes itself again, first thing, unless the
// environment already chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT set, to any
// value) or a debugger or tracer is attached (the new image would escape
// it). Tools that do not follow exec (valgrind without --trace-children)
// need the variable set by whoever starts them.
#ifndef FLAGOS_DAEMON_OPENMP_WAIT_POLICY_H_
#define FLAGOS_DAEMON_OPENMP_WAIT_POLICY_H_

#include <string>

namespace flagos::daemon {

// Returns only when it did not execute flagosd again: with "" when the
// environment chose or the process is traced, else with why the exec
// failed (a warning for the log; flagosd serves on, its threads spinning).
// Call it first in main, before any thread or descriptor exists.
std::string ExecWithPassiveOpenMpWaiting(char** argv);

// "OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=...", or "libgomp's default
// (threads spin after each parallel region)": for the startup log.
std::string OpenMpWaitPolicyDescription();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPENMP_WAIT_POLICY_H_
