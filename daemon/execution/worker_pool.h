// A fixed set of worker threads that run scheduled jobs in the order they
// were scheduled. flagosd runs one pool per device (Server, sized by
// --workers-per-device); every StreamQueue of that device, of every
// session, is a passive FIFO that schedules one job on its device's pool
// when it gets work, so the daemon's thread count does not grow with
// sessions x streams (docs/operations.md, "Threads").
//
// The pool knows nothing of queues or ordering: a job is a closure. Ordering
// and "one task of a queue at a time" are StreamQueue's.
//
// Which worker runs a job: the worker the caller prefers if it is idle (a
// queue asks for the worker that ran its previous turn), else the worker that
// went idle last, else the first worker to finish its job. Each idle worker
// sleeps on its own condition variable and is woken alone, with the job
// handed to it. A stream whose commands arrive one at a time thus keeps
// running on one thread, whose caches, ATen thread-local state and OpenMP
// team are warm, as when every stream had a thread of its own.
//
// A job must not wait for another job of the same pool to run (the workers
// could all be waiting): a queue whose next task needs another queue's work
// parks instead (StreamQueue::PushGate) and is scheduled again when that
// work is done, or, where it cannot park (a collective's rank waiting for
// its peers inside an operator, collectives/communicators.h), waits inside
// a Blocking scope: while it waits, the pool runs the other jobs on a spare
// thread when no worker is free, so that waiting jobs never hold all the
// workers. Jobs may block on the device or the runtime (each holds its
// worker meanwhile: one session can occupy as many workers as it has busy
// streams on the device; no per-session share is enforced yet), never on a
// client's socket: replies are posted to the session's ReplyWriter, which
// writes them from its own thread (reply_writer.h).
//
// Thread safety: Schedule may be called from any thread, including a job.
#ifndef FLAGOS_DAEMON_EXECUTION_WORKER_POOL_H_
#define FLAGOS_DAEMON_EXECUTION_WORKER_POOL_H_

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class WorkerPool {
 public:
  using Job = absl::AnyInvocable<void() &&>;

  // Starts `workers` threads (at least 1). `name` appears in log lines
  // ("flagos:0 workers").
  WorkerPool(std::string name, int workers);
  // Drops the jobs not yet started, waits for the running ones and joins
  // the workers.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `job` on a worker after the jobs scheduled before it have started;
  // on worker `preferred` (an index from CurrentWorker) if that one is idle
  // now. A job that throws is logged; the worker goes on. Dropped (destroyed
  // unrun) once the pool is being destroyed.
  void Schedule(Job job, int preferred = kAnyWorker);

  // The index of the calling thread among this pool's workers, or kAnyWorker
  // when it is not one of them.
  int CurrentWorker() const;

  static constexpr int kAnyWorker = -1;

  // A job that waits for other jobs of its own pool declares it with a
  // Blocking on its stack. While any is alive the pool keeps `workers`
  // threads free for the other jobs, starting spare threads as jobs need
  // them (at most kMaxBlocked at a time); a spare retires when it goes idle
  // with more threads free than `workers`. On a thread that is no worker of
  // a pool it does nothing.
  class Blocking {
   public:
    Blocking();
    ~Blocking();
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;
    // False when kMaxBlocked jobs of this pool already wait: the caller
    // should fail rather than wait (it would hold a worker the others need).
    bool ok() const { return ok_; }

   private:
    WorkerPool* pool_;
    bool ok_ = true;
  };
  static constexpr int kMaxBlocked = 256;

  // The workers the pool keeps free for jobs (the constructor's `workers`).
  int workers() const { return target_; }
  // Threads alive now: workers() plus the spares standing in for blocked jobs.
  int threads() const;
  // Jobs inside a Blocking scope now.
  int blocked() const;
  // Workers asleep, waiting for a job.
  int idle_workers() const;
  // Whether a scheduled job waits for a worker (none is idle).
  bool has_waiting_jobs() const;
  const std::string& name() const { return name_; }

 private:
  struct Worker {
    absl::CondVar wake;
    // Handed over by Schedule while the worker sleeps (guarded by mu_).
    Job job;
    std::thread thread;
    bool retired = false;  // its thread left Run (guarded by mu_)
  };

  void Run(int index, Worker* self);
  // Starts a thread (in a retired worker's slot if there is one) that runs
  // `job` first. Only while fewer than workers() threads are free.
  void SpawnLocked(Job job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ShortOfWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_ - blocked_ < target_;
  }

  const std::string name_;
  // A leaf: jobs run, and queues schedule, without it.
  mutable absl::Mutex mu_;
  // Jobs no worker was idle for, oldest first.
  std::deque<Job> ready_ ABSL_GUARDED_BY(mu_);
  // Indices of the workers asleep, the one that went idle last at the back.
  std::vector<int> idle_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const int target_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;     // threads not retired
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;  // jobs inside a Blocking
  // Grows when a spare starts in no retired slot; read without mu_ only
  // once stopping_ is set (nothing grows it then).
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
};

// The default workers per device: 2 x the host's cores, at least 4 and at
// most 64 (a large host with many devices stays within a few hundred
// threads). Workers mostly issue work and wait for the device, so more
// than the cores pay.
int DefaultWorkersPerDevice();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_WORKER_POOL_H_
