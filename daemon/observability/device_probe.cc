#include "observability/device_probe.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

std::string Elapsed(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

struct DeviceProbe::Core {
  Core(DeviceRuntime* runtime, int device) : runtime(runtime), device(device) {}

  // Creates the stream and the buffer unless they exist.
  absl::Status SetUp() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  DeviceRuntime* const runtime;
  const int device;
  absl::Mutex mu;
  // Set by ~DeviceProbe: no job issues work any more.
  bool closed ABSL_GUARDED_BY(mu) = false;
  // Made with the probe (or by the first attempt that could); they exist when
  // `has_stream` and `has_buffer`.
  bool has_stream ABSL_GUARDED_BY(mu) = false;
  bool has_buffer ABSL_GUARDED_BY(mu) = false;
  StreamHandle stream ABSL_GUARDED_BY(mu) = 0;
  DevicePtr buffer ABSL_GUARDED_BY(mu) = 0;  // kProbeBytes
  // Written by a job before it issues the copies, read by the host function
  // after the device ran them; attempts never overlap (a new one starts
  // once the last is done), so these need no lock.
  uint8_t pattern[kProbeBytes] = {};
  uint8_t readback[kProbeBytes] = {};
};

// ---- Attempt

bool DeviceProbe::Attempt::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

bool DeviceProbe::Attempt::WaitUntil(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
  return done_;
}

absl::Status DeviceProbe::Attempt::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status DeviceProbe::Attempt::Outstanding(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (issued_at_ == absl::InfiniteFuture()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the health probe of device flagos:", device_, " has waited ", Elapsed(now - queued_at_),
        " for one of the ", workers_, " workers that run the device's stream queues: all of "
        "them are busy or stuck, so the commands of its sessions wait too"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "device flagos:", device_, " has not completed the health probe's work (a ", kProbeBytes,
      "-byte copy to the device and back, on a stream of its own) issued ",
      Elapsed(now - issued_at_), " ago: the device or its ", backend_,
      " runtime has stopped completing work"));
}

void DeviceProbe::Attempt::MarkIssued() {
  absl::MutexLock lock(&mu_);
  issued_at_ = absl::Now();
}

bool DeviceProbe::Attempt::issued() const {
  absl::MutexLock lock(&mu_);
  return issued_at_ != absl::InfiniteFuture();
}

void DeviceProbe::Attempt::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  status_ = std::move(status);
  done_ = true;
}

// ---- DeviceProbe

absl::Status DeviceProbe::Core::SetUp() {
  if (!has_stream) {
    absl::StatusOr<StreamHandle> created = runtime->CreateStream(device);
    if (!created.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "the health probe of device flagos:", device,
          " cannot create its stream: ", created.status().message()));
    }
    stream = *created;
    has_stream = true;
  }
  if (!has_buffer) {
    absl::StatusOr<DevicePtr> allocated = runtime->Malloc(device, kProbeBytes);
    if (!allocated.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "the health probe of device flagos:", device, " cannot allocate its ", kProbeBytes,
          "-byte buffer: ", allocated.status().message()));
    }
    buffer = *allocated;
    has_buffer = true;
  }
  return absl::OkStatus();
}

DeviceProbe::DeviceProbe(DeviceRuntime* runtime, int device, WorkerPool* pool)
    : device_(device), pool_(pool), core_(std::make_shared<Core>(runtime, device)) {
  absl::MutexLock lock(&core_->mu);
  if (absl::Status s = core_->SetUp(); !s.ok()) {
    LogWarning(absl::StrCat(s.message(), "; each health check tries again and fails until then"));
  }
}

DeviceProbe::~DeviceProbe() {
  std::shared_ptr<Attempt> attempt;
  {
    absl::MutexLock lock(&mu_);
    attempt = current_;
  }
  absl::MutexLock lock(&core_->mu);
  core_->closed = true;  // a job that has not issued yet never will
  if (attempt != nullptr && attempt->issued() && !attempt->done()) {
    LogWarning(absl::StrCat(attempt->Outstanding(absl::Now()).message(), "; its stream and ",
                            kProbeBytes, "-byte buffer are left to the ", core_->runtime->name(),
                            " runtime"));
    return;
  }
  // No work of the probe's is outstanding: nothing of the device uses them.
  DeviceRuntime& runtime = *core_->runtime;
  if (core_->has_stream) {
    if (absl::Status s = runtime.DestroyStream(device_, core_->stream); !s.ok()) {
      LogWarning(absl::StrCat("the health probe of device flagos:", device_,
                              " could not destroy its stream: ", s.message()));
    }
  }
  if (core_->has_buffer) {
    if (absl::Status s = runtime.Free(device_, core_->buffer); !s.ok()) {
      LogWarning(absl::StrCat("the health probe of device flagos:", device_,
                              " could not free its buffer: ", s.message()));
    }
  }
}

std::shared_ptr<const DeviceProbe::Attempt> DeviceProbe::Start() {
  // A job the pool drops unrun (it is being destroyed) cancels its attempt.
  struct CancelUnlessRun {
    std::shared_ptr<Attempt> attempt;
    bool ran = false;
    CancelUnlessRun(CancelUnlessRun&&) = default;
    explicit CancelUnlessRun(std::shared_ptr<Attempt> a) : attempt(std::move(a)) {}
    ~CancelUnlessRun() {
      if (attempt != nullptr && !ran) {
        attempt->Finish(absl::CancelledError(absl::StrCat(
            "the health probe of device flagos:", attempt->device(),
            " was dropped: the device's worker pool is stopping")));
      }
    }
  };
  absl::MutexLock lock(&mu_);
  if (current_ != nullptr && !current_->done()) return current_;
  current_ = std::shared_ptr<Attempt>(
      new Attempt(device_, std::string(core_->runtime->name()), pool_->workers(), ++attempts_));
  pool_->Schedule([core = core_, job = CancelUnlessRun(current_)]() mutable {
    job.ran = true;
    Run(core, job.attempt);
  });
  return current_;
}

absl::Status DeviceProbe::Await(absl::Time deadline) const {
  std::shared_ptr<Attempt> attempt;
  {
    absl::MutexLock lock(&mu_);
    attempt = current_;
  }
  if (attempt == nullptr) return absl::OkStatus();
  if (!attempt->WaitUntil(deadline)) return attempt->Outstanding(absl::Now());
  return attempt->status();
}

void DeviceProbe::Run(const std::shared_ptr<Core>& core, const std::shared_ptr<Attempt>& attempt) {
  const int device = core->device;
  absl::MutexLock lock(&core->mu);
  if (core->closed) {
    attempt->Finish(absl::CancelledError(absl::StrCat(
        "the health probe of device flagos:", device, " stopped before its job ran")));
    return;
  }
  attempt->MarkIssued();
  if (absl::Status set_up = core->SetUp(); !set_up.ok()) {
    attempt->Finish(std::move(set_up));
    return;
  }
  // A pattern of its own per attempt, and a read-back buffer holding
  // something else: a copy that does not happen, or that returns an earlier
  // attempt's bytes, shows.
  for (uint64_t i = 0; i < kProbeBytes; ++i) {
    core->pattern[i] = static_cast<uint8_t>(attempt->sequence_ * 131 + i * 7 + 1);
    core->readback[i] = static_cast<uint8_t>(~core->pattern[i]);
  }
  DeviceRuntime& runtime = *core->runtime;
  bool issued_any = false;
  absl::Status status =
      runtime.CopyHostToDevice(device, core->stream, core->buffer, core->pattern, kProbeBytes);
  if (status.ok()) {
    issued_any = true;
    status =
        runtime.CopyDeviceToHost(device, core->stream, core->readback, core->buffer, kProbeBytes);
  }
  if (status.ok()) {
    // The host function runs once the device completed both copies; it
    // never blocks (runtime.h).
    status = runtime.LaunchHostFunc(
        device, core->stream, [core, attempt](absl::Status device_status) {
          const int device = core->device;
          if (!device_status.ok()) {
            attempt->Finish(absl::UnavailableError(absl::StrCat(
                "device flagos:", device, " failed the health probe's copy to the device and "
                "back: ", device_status.message())));
            return;
          }
          for (uint64_t i = 0; i < kProbeBytes; ++i) {
            if (core->readback[i] != core->pattern[i]) {
              attempt->Finish(absl::DataLossError(absl::StrFormat(
                  "device flagos:%d returned other bytes than the health probe copied to it "
                  "(byte %d: 0x%02x instead of 0x%02x): the device or its %s runtime loses "
                  "data or reports work complete that it did not do",
                  device, i, core->readback[i], core->pattern[i], core->runtime->name())));
              return;
            }
          }
          attempt->Finish(absl::OkStatus());
        });
  }
  if (status.ok()) return;
  // The copies issued may still use the buffers: the attempt ends once
  // they have (if they never do, it stays outstanding: the device is stuck).
  if (issued_any) (void)runtime.SynchronizeStream(device, core->stream);
  attempt->Finish(absl::UnavailableError(absl::StrCat(
      "the ", runtime.name(), " runtime failed to issue the health probe's work on device flagos:",
      device, ": ", status.message())));
}

}  // namespace flagos::daemon
