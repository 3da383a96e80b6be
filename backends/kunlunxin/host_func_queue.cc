#include "host_func_queue.h"

#include <utility>

namespace flagos::kunlunxin {

HostFuncQueue::~HostFuncQueue() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  // The thread runs what is left before it sees stop_.
  if (thread.joinable()) thread.join();
}

void HostFuncQueue::Push(Wait wait, Func fn) {
  absl::MutexLock lock(&mu_);
  entries_.push_back(Entry{std::move(wait), std::move(fn)});
  ++pushed_;
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { Serve(); });
    thread_id_ = thread_.get_id();
  }
}

void HostFuncQueue::Drain() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = pushed_;
  const auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finished_ >= target;
  };
  mu_.Await(absl::Condition(&done));
}

bool HostFuncQueue::HasWorkOrStops() const { return !entries_.empty() || stop_; }

bool HostFuncQueue::OnQueueThread() const {
  absl::MutexLock lock(&mu_);
  return thread_.joinable() && thread_id_ == std::this_thread::get_id();
}

void HostFuncQueue::Serve() {
  for (;;) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &HostFuncQueue::HasWorkOrStops));
      if (entries_.empty()) return;  // stopping, and nothing is left
      entry = std::move(entries_.front());
      entries_.pop_front();
    }
    absl::Status status = std::move(entry.wait)();
    std::move(entry.fn)(std::move(status));
    // Whatever the function captured is released before Drain returns.
    entry = Entry();
    absl::MutexLock lock(&mu_);
    ++finished_;
  }
}

}  // namespace flagos::kunlunxin
