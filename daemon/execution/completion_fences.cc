#include "execution/completion_fences.h"

#include <atomic>
#include <memory>
#include <utility>

namespace flagos::daemon {

void WhenStreamCompletes(DeviceRuntime& runtime, int device, StreamHandle stream,
                         DeviceRuntime::HostFunc done) {
  // Shared: a failed launch leaves the function here to run after a wait.
  auto shared = std::make_shared<DeviceRuntime::HostFunc>(std::move(done));
  if (runtime.LaunchHostFunc(device, stream, [shared](absl::Status status) {
        std::move(*shared)(std::move(status));
      }).ok()) {
    return;
  }
  std::move(*shared)(runtime.SynchronizeStream(device, stream));
}

void AfterQueuedWork(DeviceRuntime& runtime, const std::vector<SessionStream*>& streams,
                     std::function<void(absl::Status)> action) {
  struct Queue {
    StreamQueue* queue;
    int device;
    StreamHandle backend_stream;
  };
  struct Barrier {
    std::atomic<size_t> remaining;
    absl::Mutex mu;
    absl::Status first_error ABSL_GUARDED_BY(mu);
    std::function<void(absl::Status)> action;
  };
  auto barrier = std::make_shared<Barrier>();
  barrier->remaining.store(streams.size() + 1);
  barrier->action = std::move(action);
  const auto arrive = [barrier](absl::Status status) {
    if (!status.ok()) {
      absl::MutexLock lock(&barrier->mu);
      if (barrier->first_error.ok()) barrier->first_error = std::move(status);
    }
    if (barrier->remaining.fetch_sub(1) != 1) return;
    absl::Status first;
    {
      absl::MutexLock lock(&barrier->mu);
      first = barrier->first_error;
    }
    barrier->action(std::move(first));
  };
  for (const SessionStream* stream : streams) {
    const Queue q{stream->queue.get(), stream->device, stream->backend_stream};
    // An idle queue (only the caller pushes to them) has issued all its
    // work: wait for the device here; otherwise after the queue's last task.
    if (q.queue->pending() == 0) {
      arrive(runtime.DrainStream(q.device, q.backend_stream));
      continue;
    }
    q.queue->Push([arrive, q, &runtime] {
      arrive(runtime.DrainStream(q.device, q.backend_stream));
    });
  }
  arrive(absl::OkStatus());
}

void ReadyGate::MarkReady() {
  std::optional<StreamQueue::Resume> resume;
  {
    absl::MutexLock lock(&mu_);
    ready_ = true;
    resume.swap(resume_);
  }
  if (resume.has_value()) (*resume)();
}

void ReadyGate::Park(StreamQueue::Resume resume) {
  {
    absl::MutexLock lock(&mu_);
    if (!ready_) {
      resume_ = std::move(resume);
      return;
    }
  }
  resume();
}

}  // namespace flagos::daemon
