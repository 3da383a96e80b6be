#include "graph_capture.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "runtime.h"

namespace torch_fl {
namespace {

struct Captures {
  std::mutex mu;
  std::vector<std::shared_ptr<Capture>> running;  // a few at most
  std::atomic<int> count{0};
};

Captures& Running() {
  static auto* captures = new Captures();  // never destroyed
  return *captures;
}

// REQUIRES: Running().mu held.
Capture* FindLocked(int device, uint64_t stream) {
  for (const auto& c : Running().running) {
    if (c->device == device && c->stream == stream) return c.get();
  }
  return nullptr;
}

const char* ModeName(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kGlobal: return "global";
    case CaptureMode::kThreadLocal: return "thread_local";
    case CaptureMode::kRelaxed: return "relaxed";
  }
  return "?";
}

}  // namespace

bool AnyCapture() { return Running().count.load(std::memory_order_acquire) != 0; }

void BeginCapture(std::shared_ptr<Capture> capture) {
  Captures& r = Running();
  std::lock_guard<std::mutex> lock(r.mu);
  TORCH_CHECK(FindLocked(capture->device, capture->stream) == nullptr,
              "flagos: flagos:", capture->device, " stream ", capture->stream,
              " is capturing a graph already; end that capture (capture_end) before "
              "beginning another on the same stream");
  r.running.push_back(std::move(capture));
  r.count.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<Capture> EndCapture(uint64_t graph) {
  Captures& r = Running();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = std::find_if(r.running.begin(), r.running.end(),
                         [&](const auto& c) { return c->graph == graph; });
  if (it == r.running.end()) return nullptr;
  std::shared_ptr<Capture> capture = std::move(*it);
  r.running.erase(it);
  r.count.fetch_sub(1, std::memory_order_release);
  return capture;
}

bool CurrentStreamCapturing(int device) {
  if (!AnyCapture()) return false;
  const uint64_t stream = CurrentStream(device);
  std::lock_guard<std::mutex> lock(Running().mu);
  return FindLocked(device, stream) != nullptr;
}

bool TakeIntoCapture(flagos::v1::Command& command, absl::string_view describe) {
  if (!AnyCapture()) return false;
  std::lock_guard<std::mutex> lock(Running().mu);
  Capture* capture = FindLocked(command.device(), command.stream());
  if (capture == nullptr) return false;
  bool holds = false;
  switch (command.kind_case()) {
    case flagos::v1::Command::kOp:
      holds = !command.op().want_values();
      break;
    case flagos::v1::Command::kMemset:
      holds = true;
      break;
    case flagos::v1::Command::kCopyDeviceToDevice:
      holds = command.copy_device_to_device().src_device() == command.device();
      break;
    default:
      break;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      holds, "flagos: ", describe, " on flagos:", command.device(), " stream ", command.stream(),
      " cannot be captured into a graph: a flagos graph holds operators, memsets and copies "
      "within the device on one stream (events, copies from another device or the host, and "
      "work the host waits for are not captured); move it before capture_begin or after "
      "capture_end");
  capture->commands.push_back(command);
  capture->described.emplace_back(describe.data(), describe.size());
  return true;
}

void RefuseWhileCapturing(int device, std::optional<uint64_t> stream, std::string_view what) {
  if (!AnyCapture()) return;
  std::lock_guard<std::mutex> lock(Running().mu);
  for (const auto& c : Running().running) {
    const bool same_stream = c->device == device && (!stream.has_value() || *stream == c->stream);
    bool refused = false;
    if (same_stream && stream.has_value()) {
      refused = true;  // waiting for the capturing stream itself
    } else {
      switch (c->mode) {
        case CaptureMode::kGlobal: refused = true; break;
        case CaptureMode::kThreadLocal: refused = c->thread == std::this_thread::get_id(); break;
        case CaptureMode::kRelaxed: refused = false; break;
      }
    }
    TORCH_CHECK(!refused, "flagos: ", what, " is not permitted while flagos:", c->device,
                " stream ", c->stream, " is capturing a graph (capture_error_mode \"",
                ModeName(c->mode), "\"): it waits for the device or the host, which captured "
                "work does not do (as CUDA's 'operation not permitted when stream is "
                "capturing'); do it before capture_begin or after capture_end",
                same_stream ? "" : ", or capture with capture_error_mode=\"relaxed\"");
  }
}

uint64_t CapturePoolKey(int device, uint64_t stream) {
  if (!AnyCapture()) return 0;
  std::lock_guard<std::mutex> lock(Running().mu);
  Capture* capture = FindLocked(device, stream);
  return capture == nullptr ? 0 : capture->pool_key;
}

std::optional<uint64_t> CaptureRelativeOffset(int device, bool is_default,
                                              uint64_t generator_offset) {
  if (!AnyCapture()) return std::nullopt;
  const uint64_t stream = CurrentStream(device);
  std::lock_guard<std::mutex> lock(Running().mu);
  Capture* capture = FindLocked(device, stream);
  if (capture == nullptr) return std::nullopt;
  TORCH_CHECK_NOT_IMPLEMENTED(
      is_default, "flagos: a random operator captured into a graph on flagos:", device,
      " draws from a generator of its own; a flagos graph draws fresh numbers on each replay "
      "only from the device's default generator: capture it without the generator argument "
      "(seed it with torch.manual_seed)");
  return generator_offset - capture->rng_offset;
}

}  // namespace torch_fl
