#include "worker_pool.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"

namespace flagos::daemon {

WorkerPool::WorkerPool(std::string name, int workers) : name_(std::move(name)) {
  const int n = std::max(workers, 1);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  std::deque<Job> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(ready_);
  }
  dropped.clear();  // outside the lock: a job's captures may schedule nothing more
  for (std::thread& thread : threads_) thread.join();
}

void WorkerPool::Schedule(Job job) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      ready_.push_back(std::move(job));
      return;
    }
  }
  // Dropped: destroyed outside the lock.
}

void WorkerPool::Run() {
  const auto has_job_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !ready_.empty();
  };
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_job_or_stopping));
      if (stopping_) return;
      job = std::move(ready_.front());
      ready_.pop_front();
    }
    try {
      std::move(job)();
    } catch (const std::exception& e) {
      LogError(absl::StrCat(name_, ": a job threw ", e.what(), "; the worker continues"));
    } catch (...) {
      LogError(absl::StrCat(name_, ": a job threw a non-standard exception; the worker continues"));
    }
  }
}

int DefaultWorkersPerDevice() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(2 * cores, 4, 64);
}

}  // namespace flagos::daemon
