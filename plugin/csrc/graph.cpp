// FlagosGraph: torch's graph interface (at::GraphImplInterface) for
// flagos, behind torch.accelerator.Graph and torch.flagos.Graph. What a
// capture takes and refuses is graph_capture.h's; here: its life.
//
//   capture_begin  on the current device's current stream: the graph's pool
//                  (its own, or one shared with other graphs) serves the
//                  stream's allocations, the default generator's offset is
//                  noted, and the stream's work is held back from then on.
//   capture_end    the held work goes to the daemon (DefineGraph parts of
//                  at most kPartCommands commands), which checks it once;
//                  the generator is put back where the capture found it.
//   replay         one ReplayGraph command on the current stream of the
//                  graph's device, with the generator's (seed, offset),
//                  which it then advances by what the capture drew.
//   reset          the daemon forgets the graph; the pool is released.
//
// The graph is defined at capture_end whether or not keep_graph is set:
// the daemon holds nothing else to instantiate, so instantiate() only
// checks that there is a graph.
#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device_allocator.h"
#include "generator.h"
#include "graph_capture.h"
#include "runtime.h"

namespace torch_fl {
namespace {

constexpr size_t kPartCommands = 1024;

uint64_t NextGraphId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

CaptureMode ModeOf(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal: return CaptureMode::kThreadLocal;
    case at::GraphCaptureMode::Relaxed: return CaptureMode::kRelaxed;
    case at::GraphCaptureMode::Default:
    case at::GraphCaptureMode::Global: break;
  }
  return CaptureMode::kGlobal;  // CUDA's default too
}

// The allocator's key of pool `id`: graph-private pools are {graph, 0},
// graph_pool_handle()'s {0, n}.
uint64_t PoolKey(const c10::MempoolId_t& id) {
  return kGraphPoolBit | (id.first != 0 ? id.first : (uint64_t{1} << 62) | id.second);
}

class FlagosGraph final : public at::GraphImplInterface {
 public:
  // keep_graph changes nothing here (see the top of this file).
  explicit FlagosGraph(at::GraphImplArgs /*args*/) {}
  ~FlagosGraph() override {
    try {
      reset();
    } catch (...) {
    }
  }

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    TORCH_CHECK(state_ == State::kEmpty, "flagos: this graph ",
                state_ == State::kCapturing ? "is capturing already"
                                            : "holds a capture already; reset() it first");
    auto capture = std::make_shared<Capture>();
    capture->device = CurrentDevice();
    capture->stream = CurrentStream(capture->device);
    capture->thread = std::this_thread::get_id();
    capture->mode = ModeOf(mode);
    Session();  // opens the session: the generation below is its own
    generation_ = CurrentGeneration();
    id_ = NextGraphId();
    capture->graph = id_;
    device_ = capture->device;
    pool_ = (pool.first == 0 && pool.second == 0) ? c10::MempoolId_t{id_, 0} : pool;
    capture->pool_key = PoolKey(pool_);
    {
      at::Generator generator = DefaultGenerator(device_);  // shares the impl
      std::lock_guard<std::mutex> lock(generator.mutex());
      capture->rng_offset = generator.get_offset();
    }
    BeginCapture(capture);  // throws when the stream is capturing already
    HoldGraphPool(capture->pool_key);
    state_ = State::kCapturing;
  }

  void capture_end() override {
    TORCH_CHECK(state_ == State::kCapturing, "flagos: capture_end without capture_begin");
    std::shared_ptr<Capture> capture = EndCapture(id_);
    TORCH_INTERNAL_ASSERT(capture != nullptr);
    state_ = State::kEmpty;
    {
      // The capture drew offsets from the generator's state at its start;
      // eagerly nothing was drawn: replays advance it.
      at::Generator generator = DefaultGenerator(device_);  // shares the impl
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng_increment_ = generator.get_offset() - capture->rng_offset;
      generator.set_offset(capture->rng_offset);
    }
    try {
      CheckGeneration(generation_, "the work a graph captured");
      Define(*capture);
    } catch (...) {
      ReleaseGraphPool(capture->pool_key);
      throw;
    }
    pool_key_ = capture->pool_key;
    commands_ = capture->commands.size();
    if (debug_) described_ = std::move(capture->described);
    state_ = State::kCaptured;
  }

  void instantiate() override {
    TORCH_CHECK(state_ == State::kCaptured,
                "flagos: instantiate() needs a captured graph (capture_begin ... capture_end)");
  }

  void replay() override {
    TORCH_CHECK(state_ == State::kCaptured,
                "flagos: replay() needs a captured graph (capture_begin ... capture_end)");
    CheckGeneration(generation_, "a captured graph");
    flagos::v1::Command command;
    command.set_device(device_);
    auto* replay = command.mutable_replay_graph();
    replay->set_graph(id_);
    if (rng_increment_ != 0) {
      at::Generator generator = DefaultGenerator(device_);  // shares the impl
      std::lock_guard<std::mutex> lock(generator.mutex());
      replay->mutable_rng()->set_seed(generator.current_seed());
      replay->mutable_rng()->set_offset(generator.get_offset());
      generator.set_offset(generator.get_offset() + rng_increment_);
    }
    Enqueue(std::move(command), "replay a graph", CurrentStream(device_));
  }

  void reset() override {
    if (state_ == State::kCapturing) {
      if (std::shared_ptr<Capture> capture = EndCapture(id_)) {
        ReleaseGraphPool(capture->pool_key);
      }
    } else if (state_ == State::kCaptured) {
      if (flagos::client::Connection* live = LiveSession(generation_)) {
        flagos::v1::Command command;
        command.set_device(device_);
        command.mutable_destroy_graph()->set_graph(id_);
        try {
          live->Enqueue(std::move(command), "reset a graph");
        } catch (...) {
        }
      }
      ReleaseGraphPool(pool_key_);
    }
    state_ = State::kEmpty;
    described_.clear();
  }

  c10::MempoolId_t pool() const override { return pool_; }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "flagos: debug_dump needs enable_debug_mode() before the capture");
    TORCH_CHECK(state_ == State::kCaptured, "flagos: debug_dump needs a captured graph");
    std::ofstream out(path);
    TORCH_CHECK(out.good(), "flagos: debug_dump cannot write ", path);
    out << "flagos graph " << id_ << " on flagos:" << device_ << ", " << commands_
        << " commands, pool (" << pool_.first << ", " << pool_.second << "), "
        << rng_increment_ << " random draws per replay\n";
    for (size_t i = 0; i < described_.size(); ++i) out << i << '\t' << described_[i] << '\n';
  }

 private:
  enum class State { kEmpty, kCapturing, kCaptured };

  // Hands the captured work to the daemon, which checks it (and answers).
  void Define(Capture& capture) {
    const size_t n = capture.commands.size();
    size_t next = 0;
    do {
      flagos::v1::Command command;
      command.set_device(device_);
      auto* part = command.mutable_define_graph();
      part->set_graph(id_);
      const size_t end = std::min(n, next + kPartCommands);
      part->mutable_commands()->Reserve(static_cast<int>(end - next));
      for (; next < end; ++next) *part->add_commands() = std::move(capture.commands[next]);
      part->set_last(next == n);
      Call(std::move(command), "define a captured graph", capture.stream, generation_);
    } while (next < n);
  }

  bool debug_ = false;
  State state_ = State::kEmpty;
  uint64_t id_ = 0;
  int device_ = 0;
  uint64_t generation_ = 0;
  c10::MempoolId_t pool_{0, 0};
  uint64_t pool_key_ = 0;
  uint64_t rng_increment_ = 0;
  size_t commands_ = 0;
  std::vector<std::string> described_;
};

}  // namespace

void RegisterGraphImpl() {
  // Under the device's name once renamed ("FLAGOS"), the key torch looks up.
  const std::string key = c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false);
  static std::once_flag once;
  std::call_once(once, [&] {
    at::GraphImplRegistry()->Register(
        key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
          return std::make_unique<FlagosGraph>(args);
        });
  });
}

c10::MempoolId_t NewGraphPoolHandle() { return {0, NextGraphId()}; }

}  // namespace torch_fl
