// Graph capture on flagos (torch.accelerator.Graph; graph.cpp is the
// GraphImplInterface): while a capture runs on a (device, stream), the work
// enqueued there from any thread is held back in the capture, not sent; at
// the capture's end the graph goes to the daemon as one definition, and a
// replay is one command (flagos.proto DefineGraph, ReplayGraph).
//
// What a capture holds: operators, memsets and device-to-device copies on
// its stream. What it refuses, as CUDA's capture does: work on the
// capturing stream that needs the host (a copy from or to host memory, an
// operator whose results the host reads: .item(), nonzero), waiting for the
// capturing stream, and events recorded or waited for on it (not supported
// yet: a capture on flagos covers one stream). Synchronising calls on other
// streams or the device follow the capture's mode: "global" (the default)
// refuses them from any thread, "thread_local" from the capturing thread,
// "relaxed" from none.
//
// Memory allocated on the capturing stream during the capture comes from
// the graph's pool (device_allocator.h), which keeps its segments while any
// graph uses it, so the graph's addresses stay valid across replays.
// Random operators drawing from the device's default generator are
// captured relative to the generator's state at capture_begin; each replay
// draws from the generator's state then and advances it by what the
// capture drew, so it draws what the same ops run eagerly would.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "flagos/v1/flagos.pb.h"

namespace torch_fl {

enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

// One capture in progress (graph.cpp begins and ends it).
struct Capture {
  uint64_t graph = 0;  // the graph's id in the session
  int device = 0;
  uint64_t stream = 0;
  std::thread::id thread;  // the capturing thread
  CaptureMode mode = CaptureMode::kGlobal;
  uint64_t pool_key = 0;  // the graph's pool (device_allocator.h)
  uint64_t rng_offset = 0;  // the default generator's offset at the start
  // What it took, in order, with each command's description.
  std::vector<flagos::v1::Command> commands;
  std::vector<std::string> described;
};

// Starts `capture` on its (device, stream); throws when one runs there.
void BeginCapture(std::shared_ptr<Capture> capture);
// Ends the capture of graph `graph` and returns it (nullptr if none runs).
std::shared_ptr<Capture> EndCapture(uint64_t graph);
// The capture running on the calling thread's current stream of `device`,
// if any (for torch.flagos.is_current_stream_capturing).
bool CurrentStreamCapturing(int device);

// True when a capture is running somewhere in the process. Lock-free: the
// enqueue path's only cost when none is.
bool AnyCapture();

// Takes `command` (its stream set) into the capture running on its
// (device, stream) and returns true; false when none is (send it). Throws,
// naming `describe`, for a command a capture cannot hold.
bool TakeIntoCapture(flagos::v1::Command& command, absl::string_view describe);

// Throws when `what`, which waits for `device`'s stream `stream` (every
// stream of the device when nullopt) or needs the host, may not run while
// the captures in progress run (see the modes above).
void RefuseWhileCapturing(int device, std::optional<uint64_t> stream, std::string_view what);

// The allocator's pool key for an allocation on (device, stream) now: the
// capture's graph pool (nonzero) when one is capturing there, else 0.
uint64_t CapturePoolKey(int device, uint64_t stream);

// For a random op on `device` about to draw from `generator_offset` of the
// device's default generator (`is_default`): when the calling thread's
// current stream of `device` is capturing, the offset relative to the
// capture's start (the op is then replay_relative); nullopt otherwise.
// Throws when a capture runs there and the generator is not the default.
std::optional<uint64_t> CaptureRelativeOffset(int device, bool is_default,
                                              uint64_t generator_offset);

}  // namespace torch_fl
