#include "execution/launch_window.h"

#include <utility>

#include "execution/completion_fences.h"

namespace flagos::daemon {

void LaunchWindow::EndWindow(uint64_t ops) {
  // The window is full: its fence, then this task opens the next one.
  auto ended = std::make_shared<ReadyGate>();
  std::shared_ptr<ReadyGate> before = std::exchange(previous_, ended);
  ops_in_window_ = ops;
  queue_->PushGate([runtime = runtime_, device = device_, stream = stream_,
                    ended = std::move(ended),
                    before = std::move(before)](StreamQueue::Resume resume) {
    // Errors are the commands' (a sync reports them): the fence only
    // tells that the window's work is no longer on the device.
    WhenStreamCompletes(*runtime, device, stream,
                        [ended](absl::Status /*the commands'*/) { ended->MarkReady(); });
    if (before == nullptr) return resume();
    before->Park(std::move(resume));
  });
}

}  // namespace flagos::daemon
