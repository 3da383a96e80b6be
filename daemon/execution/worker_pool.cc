#include "execution/worker_pool.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

// The pool and index of the worker running on this thread, if any.
thread_local WorkerPool* current_pool = nullptr;
thread_local int current_index = WorkerPool::kAnyWorker;

}  // namespace

WorkerPool::WorkerPool(std::string name, int workers)
    : name_(std::move(name)), target_(std::max(workers, 1)) {
  absl::MutexLock lock(&mu_);
  workers_.reserve(target_);
  for (int i = 0; i < target_; ++i) workers_.push_back(std::make_unique<Worker>());
  live_ = target_;
  for (int i = 0; i < target_; ++i) {
    Worker* w = workers_[i].get();
    w->thread = std::thread([this, i, w] { Run(i, w); });
  }
}

WorkerPool::~WorkerPool() {
  std::deque<Job> dropped;
  std::vector<Worker*> all;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(ready_);
    for (const auto& worker : workers_) {
      worker->wake.Signal();
      all.push_back(worker.get());
    }
  }
  dropped.clear();  // outside the lock: a job's captures may schedule nothing more
  for (Worker* worker : all) worker->thread.join();
}

int WorkerPool::CurrentWorker() const { return current_pool == this ? current_index : kAnyWorker; }

int WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

int WorkerPool::blocked() const {
  absl::MutexLock lock(&mu_);
  return blocked_;
}

void WorkerPool::SpawnLocked(Job job) {
  int index = -1;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->retired) {
      index = static_cast<int>(i);
      break;
    }
  }
  if (index < 0) {
    index = static_cast<int>(workers_.size());
    workers_.push_back(std::make_unique<Worker>());
  } else {
    // Its thread marked itself retired and returns without taking mu_.
    workers_[index]->thread.join();
    workers_[index]->retired = false;
  }
  Worker* w = workers_[index].get();
  w->job = std::move(job);
  ++live_;
  w->thread = std::thread([this, index, w] { Run(index, w); });
}

WorkerPool::Blocking::Blocking() : pool_(current_pool) {
  if (pool_ == nullptr) return;
  absl::MutexLock lock(&pool_->mu_);
  if (pool_->blocked_ >= kMaxBlocked) {
    ok_ = false;
    pool_ = nullptr;
    return;
  }
  ++pool_->blocked_;
  // A job already waits for a worker: it gets a spare now.
  if (!pool_->stopping_ && !pool_->ready_.empty() && pool_->idle_.empty() &&
      pool_->ShortOfWorkersLocked()) {
    Job job = std::move(pool_->ready_.front());
    pool_->ready_.pop_front();
    pool_->SpawnLocked(std::move(job));
  }
}

WorkerPool::Blocking::~Blocking() {
  if (pool_ == nullptr) return;
  absl::MutexLock lock(&pool_->mu_);
  --pool_->blocked_;
}

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
        if (ShortOfWorkersLocked()) {
          SpawnLocked(std::move(job));  // the others wait inside Blocking scopes
        } else {
          ready_.push_back(std::move(job));
        }
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

void WorkerPool::Run(int index, Worker* worker) {
  current_pool = this;
  current_index = index;
  Worker& self = *worker;
  while (true) {
    Job job;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_ && ready_.empty() && self.job == nullptr && live_ - blocked_ > target_) {
        // A spare no blocked job needs any more.
        --live_;
        self.retired = true;
        return;
      }
      if (!stopping_ && ready_.empty() && self.job == nullptr) {
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
