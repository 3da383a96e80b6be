#include "autograd_device_queues.h"

#include <torch/csrc/autograd/engine.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace torch_fl {
namespace {

using torch::autograd::Engine;
using torch::autograd::ReadyQueue;

// The engine's own members, reached as a derived class may name them (the
// engine is never constructed through this type).
struct EngineMembers : Engine {
  static bool Started(Engine& engine) {
    return (engine.*(&EngineMembers::thread_pool_shared_)) != nullptr;
  }
  static std::vector<std::shared_ptr<ReadyQueue>>& Queues(Engine& engine) {
    return engine.*(&EngineMembers::device_ready_queues_);
  }
};

// Devices a call made from inside a device count left to the next session
// call (0: none).
std::atomic<int> pending_devices{0};

void Grow(int devices) {
  static std::mutex mu;  // one grower at a time
  std::lock_guard<std::mutex> lock(mu);
  Engine& engine = Engine::get_default_engine();
  // Not started: its first backward counts flagos's devices itself.
  if (!EngineMembers::Started(engine)) return;
  std::vector<std::shared_ptr<ReadyQueue>>& queues = EngineMembers::Queues(engine);
  const size_t had = queues.size();
  if (static_cast<size_t>(devices) <= had) return;
  // As start_device_threads: the queues first (workers read the vector
  // without a lock once they run), then one detached worker per new queue.
  // A worker counts itself among the engine's device threads as it starts
  // (thread_init's `should_increment`), which the engine's shutdown waits
  // for; tasks pushed before it runs wait in its queue.
  for (size_t i = had; i < static_cast<size_t>(devices); ++i) {
    queues.push_back(std::make_shared<ReadyQueue>());
  }
  for (size_t i = had; i < static_cast<size_t>(devices); ++i) {
    std::thread worker(&Engine::thread_init, &engine, static_cast<int>(i), queues[i], true);
    worker.detach();
  }
}

}  // namespace

void EnsureAutogradDeviceQueues(int devices, bool in_device_count) {
  if (in_device_count) {
    // Maybe inside start_device_threads, which counts every device type
    // (torch_fl's session opens there when a process's first backward is a
    // CPU one): the engine has set its thread pool but not yet its queues,
    // and sizes them from the count it is getting. Queues grown now would
    // be replaced, and their workers would make the engine's wait for its
    // device threads (their count must equal the devices) wait forever.
    // The next session call outside a device count decides.
    pending_devices.store(devices, std::memory_order_relaxed);
    return;
  }
  Grow(devices);
}

void EnsurePendingAutogradDeviceQueues() {
  if (pending_devices.load(std::memory_order_relaxed) == 0) return;  // every session call passes here
  const int devices = pending_devices.exchange(0, std::memory_order_relaxed);
  if (devices > 0) Grow(devices);
}

}  // namespace torch_fl
