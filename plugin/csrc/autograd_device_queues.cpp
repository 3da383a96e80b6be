#include "autograd_device_queues.h"

#include <torch/csrc/autograd/engine.h>

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

}  // namespace

void EnsureAutogradDeviceQueues(int devices) {
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

}  // namespace torch_fl
