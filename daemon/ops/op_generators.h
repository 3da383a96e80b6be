// Random numbers that depend only on the (seed, offset) a command carries
// (DESIGN.md §6), whichever daemon thread runs the op:
//   - a Generator argument becomes a fresh CPU generator seeded from a
//     64-bit mix of (seed, offset) (SeededCpuGenerator);
//   - an op without one draws from ATen's default generator of its kernels'
//     device, of which the process has one: ImplicitGeneratorLock makes the
//     call seed and draw alone (one lock for the whole daemon, so two
//     sessions' draws never interleave), seeded from the command's
//     implicit (seed, offset).
// The numbers differ from what torch's own CPU generator draws for that
// seed.
//
// This header does not include ATen's generator or context headers;
// op_generators.cc does (callers that use SeededCpuGenerator's result
// include ATen/core/Generator.h).
//
// Lock order: the daemon-wide default-generator lock is taken by a worker
// running an op, which holds Session::memory_mu_ for reading; while it is
// held the kernel runs and takes ATen's own generator mutex (a std::mutex,
// which thread annotations cannot name), and ATen's intra-op threads may
// be waited for. No other lock of the daemon is taken, and nothing waits
// for the device, while it is held.
#ifndef FLAGOS_DAEMON_OPS_OP_GENERATORS_H_
#define FLAGOS_DAEMON_OPS_OP_GENERATORS_H_

#include <c10/core/Device.h>

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "flagos/v1/flagos.pb.h"

namespace at {
struct Generator;
}  // namespace at

namespace flagos::daemon {

// The generator seed of (seed, offset): splitmix64's finaliser, so that
// nearby pairs give unrelated seeds.
constexpr uint64_t MixGeneratorSeed(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
constexpr uint64_t GeneratorSeed(uint64_t seed, uint64_t offset) {
  return MixGeneratorSeed(seed ^ MixGeneratorSeed(offset));
}

// A fresh CPU generator seeded from `g`'s (seed, offset).
at::Generator SeededCpuGenerator(const v1::GeneratorValue& g);

// While alive: the calling thread alone draws from ATen's default
// generators, and the default generator of `kernel_device` is seeded from
// `g`'s (seed, offset). Blocks until no other call holds one.
class ABSL_SCOPED_LOCKABLE ImplicitGeneratorLock {
 public:
  ImplicitGeneratorLock(c10::Device kernel_device, const v1::GeneratorValue& g)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_);
  ~ImplicitGeneratorLock() ABSL_UNLOCK_FUNCTION();
  ImplicitGeneratorLock(const ImplicitGeneratorLock&) = delete;
  ImplicitGeneratorLock& operator=(const ImplicitGeneratorLock&) = delete;

 private:
  // Behind every draw from ATen's default generators, daemon-wide. A leaf
  // among the daemon's locks (see "Lock order" above).
  static absl::Mutex mu_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_GENERATORS_H_
