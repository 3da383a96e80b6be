// A backend's vendor collective library (BKCL on the Kunlun P800; NCCL
// would be the CUDA backend's): what flagosd's communicators use to run a
// collective over the ranks' device memory, on their streams, when the
// memory is not the host's (docs/distributed.md). Backends without one
// (the cpu backend: its device memory is host memory) leave the collectives
// to the daemon's own threads.
//
// Each rank of a communicator is one session of the daemon with one device.
// The daemon creates the id once per communicator (NewUniqueId), and every
// rank joins with it from its own thread (InitRank blocks until all have
// joined, so the daemon calls every rank's InitRank at once). A rank's
// collectives are then issued on its stream and complete later, in stream
// order with the ops before and after them; every rank of the communicator
// must issue the same collectives in the same order (the daemon's
// rendezvous checks that before anything is issued).
//
// Thread safety: a DeviceCollectives from any thread; one CollectiveRank
// from one thread at a time.
#ifndef FLAGOS_BACKENDS_DEVICE_COLLECTIVES_H_
#define FLAGOS_BACKENDS_DEVICE_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "flagos/runtime.h"

namespace flagos {

// The element types a collective library may move.
enum class CollectiveElement { kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64 };

// Reductions a collective library computes (avg and the bitwise ones are
// the daemon's: the library has no such op).
enum class CollectiveReduction { kSum, kProduct, kMin, kMax };

// One rank's context in a communicator: the vendor's handle, bound to the
// device it joined on. Destroying it destroys the vendor context (what the
// vendor library does with work still queued is the library's; the daemon
// destroys a rank only after its last collective was issued).
class CollectiveRank {
 public:
  virtual ~CollectiveRank() = default;

  // Counts are elements. Each call issues on `stream` of the rank's device
  // and returns; the result is there once the stream reached it.
  virtual absl::Status AllReduce(StreamHandle stream, DevicePtr send, DevicePtr recv,
                                 uint64_t count, CollectiveElement type,
                                 CollectiveReduction op) = 0;
  virtual absl::Status Broadcast(StreamHandle stream, DevicePtr send, DevicePtr recv,
                                 uint64_t count, CollectiveElement type, int root) = 0;
  // recv holds nranks blocks of send_count elements, in rank order.
  virtual absl::Status AllGather(StreamHandle stream, DevicePtr send, uint64_t send_count,
                                 DevicePtr recv, CollectiveElement type) = 0;
  // send holds nranks blocks of recv_count elements; block r reduced over
  // the ranks lands in rank r's recv.
  virtual absl::Status ReduceScatter(StreamHandle stream, DevicePtr send, DevicePtr recv,
                                     uint64_t recv_count, CollectiveElement type,
                                     CollectiveReduction op) = 0;
  // send and recv hold nranks blocks of `count` elements: block s of rank
  // r's send lands in block r of rank s's recv. UNIMPLEMENTED when the
  // library has no all-to-all (DeviceCollectives::has_all_to_all).
  virtual absl::Status AllToAll(StreamHandle stream, DevicePtr send, uint64_t count,
                                DevicePtr recv, CollectiveElement type) = 0;
  // Wakes the rank's work that waits for peers which will not come (a peer
  // failed to issue its part); the communicator is unusable afterwards.
  virtual void Abort() = 0;
};

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // "BKCL (libbkcl.so at /usr/local/xpu/so/libbkcl.so)".
  virtual const std::string& description() const = 0;
  virtual bool has_all_to_all() const = 0;
  // A new communicator id (opaque bytes the ranks share).
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;
  // Rank `rank` of `nranks` joins communicator `unique_id` on `device`;
  // blocks until every rank has joined (or the library's timeout passed).
  virtual absl::StatusOr<std::unique_ptr<CollectiveRank>> InitRank(int device,
                                                                   const std::string& unique_id,
                                                                   int rank, int nranks) = 0;
};

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_DEVICE_COLLECTIVES_H_
