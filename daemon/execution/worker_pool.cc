#include "execution/worker_pool.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

// The pool and index of the worker running on this thread, if any.
thread_local const WorkerPool* current_pool = nullptr;
thread_local int current_index = WorkerPool::kAnyWorker;

}  // namespace

WorkerPool::WorkerPool(std::string name, int workers) : name_(std::move(name)) {
  const int n = std::max(workers, 1);
  workers_.reserve(n);
  for (int i = 0; i < n; ++i) workers_.push_back(std::make_unique<Worker>());
  for (int i = 0; i < n; ++i) workers_[i]->thread = std::thread([this, i] { Run(i); });
}

WorkerPool::~WorkerPool() {
  std::deque<Job> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(ready_);
    for (const auto& worker : workers_) worker->wake.Signal();
  }
  dropped.clear();  // outside the lock: a job's captures may schedule nothing more
  for (const auto& worker : workers_) worker->thread.join();
}

int WorkerPool::CurrentWorker() const { return current_pool == this ? current_index : kAnyWorker; }

int WorkerPool::idle_workers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(idle_.size());
}

bool WorkerPool::has_waiting_jobs() const {
  absl::MutexLock lock(&mu_);
  return !ready_.empty();
}

void WorkerPool::Schedule(Job job, int preferred) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      if (idle_.empty()) {
        ready_.push_back(std::move(job));
        return;
      }
      auto chosen = idle_.end() - 1;  // the warmest idle worker
      if (preferred != kAnyWorker) {
        auto it = std::find(idle_.begin(), idle_.end(), preferred);
        if (it != idle_.end()) chosen = it;
      }
      Worker& worker = *workers_[*chosen];
      idle_.erase(chosen);
      worker.job = std::move(job);
      worker.wake.Signal();
      return;
    }
  }
  // Dropped: destroyed outside the lock.
}

void WorkerPool::Run(int index) {
  current_pool = this;
  current_index = index;
  Worker& self = *workers_[index];
  while (true) {
    Job job;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_ && ready_.empty()) {
        idle_.push_back(index);
        while (!stopping_ && self.job == nullptr) self.wake.Wait(&mu_);
      }
      if (stopping_) {
        job = std::move(self.job);  // handed over as the pool stopped: dropped unrun
        stop = true;
      } else if (self.job != nullptr) {
        job = std::move(self.job);
        self.job = nullptr;
      } else {
        job = std::move(ready_.front());
        ready_.pop_front();
      }
    }
    if (stop) return;  // `job`, if any, is destroyed outside the lock
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
