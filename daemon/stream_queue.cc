#include "stream_queue.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"

namespace flagos::daemon {

StreamQueue::StreamQueue(std::string name, BusyClock* busy)
    : name_(std::move(name)), busy_(busy), worker_([this] { Run(); }) {}

StreamQueue::~StreamQueue() { Stop(); }

void StreamQueue::Push(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  tasks_.push_back(std::move(task));
}

void StreamQueue::PushAll(std::vector<Task>* tasks) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      for (Task& task : *tasks) tasks_.push_back(std::move(task));
    }
  }
  // Tasks dropped after Stop() are destroyed outside the lock.
  tasks->clear();
}

void StreamQueue::Stop() {
  std::deque<Task> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(tasks_);
  }
  // Destroy dropped tasks outside the lock: their captures may be large.
  dropped.clear();
  if (worker_.joinable()) worker_.join();
}

uint64_t StreamQueue::pending() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size() + (running_task_ ? 1 : 0);
}

void StreamQueue::Run() {
  const auto has_work_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !tasks_.empty();
  };
  // Whether this worker has told busy_ it is running (a burst of tasks).
  bool bursting = false;
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      if (bursting && tasks_.empty()) {
        bursting = false;
        if (busy_ != nullptr) busy_->End();
      }
      mu_.Await(absl::Condition(&has_work_or_stopping));
      if (stopping_) {
        if (bursting && busy_ != nullptr) busy_->End();
        return;
      }
      if (!bursting) {
        bursting = true;
        if (busy_ != nullptr) busy_->Begin();
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_task_ = true;
    }
    try {
      std::move(task)();
    } catch (const std::exception& e) {
      LogError(absl::StrCat(name_, ": a task threw ", e.what(), "; the queue continues"));
    } catch (...) {
      LogError(absl::StrCat(name_, ": a task threw a non-standard exception; the queue continues"));
    }
    task = nullptr;
    absl::MutexLock lock(&mu_);
    running_task_ = false;
  }
}

}  // namespace flagos::daemon
