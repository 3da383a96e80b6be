#include "observability/health_check.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "transport/flagos_service.h"

namespace flagos::daemon {

HealthCheck::HealthCheck(const Backend& backend, std::string endpoint, Connect connect,
                         absl::Duration wedge_after)
    : backend_(backend),
      endpoint_(std::move(endpoint)),
      connect_(std::move(connect)),
      wedge_at_(wedge_after == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                        : absl::Now() + wedge_after),
      pool_("health probes", backend.runtime().DeviceCount()) {
  const int devices = backend_.runtime().DeviceCount();
  for (int d = 0; d < devices; ++d) {
    queues_.push_back(
        std::make_unique<StreamQueue>(absl::StrCat("health probe flagos:", d), &pool_));
    probes_.push_back(nullptr);
  }
}

HealthCheck::~HealthCheck() {
  Release();
  for (auto& queue : queues_) queue->Stop();
}

absl::Status HealthCheck::Check(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  DeviceRuntime& runtime = backend_.runtime();
  for (size_t d = 0; d < queues_.size(); ++d) {
    std::shared_ptr<Probe>& probe = probes_[d];
    if (probe == nullptr || probe->done.HasBeenNotified()) {
      probe = std::make_shared<Probe>();
      probe->started = absl::Now();
      queues_[d]->Push([this, probe, d, &runtime] {
        if (absl::Now() >= wedge_at_) {
          absl::MutexLock lock(&release_mu_);
          release_mu_.Await(absl::Condition(&released_));
        }
        absl::StatusOr<MemoryInfo> info = runtime.GetMemoryInfo(static_cast<int>(d));
        probe->status = info.status();
        probe->done.Notify();
      });
    }
    if (!probe->done.WaitForNotificationWithDeadline(deadline)) {
      return absl::UnavailableError(absl::StrCat(
          "the health probe of device flagos:", d, " has not run for ",
          absl::FormatDuration(absl::Trunc(absl::Now() - probe->started, absl::Milliseconds(1))),
          ": its queue or the ", backend_.name(), " runtime is not responding"));
    }
    if (!probe->status.ok()) {
      return absl::UnavailableError(absl::StrCat("the ", backend_.name(),
                                                 " runtime failed the health probe of device "
                                                 "flagos:", d, ": ", probe->status.message()));
    }
  }
  return CheckListener(deadline - absl::Now());
}

absl::Status HealthCheck::CheckListener(absl::Duration timeout) {
  std::unique_ptr<v1::Flagos::Stub> stub = v1::Flagos::NewStub(connect_());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + std::max(timeout, absl::Milliseconds(1))));
  v1::NegotiateRequest request;
  request.set_min_version(kMinProtocolVersion);
  request.set_max_version(kMaxProtocolVersion);
  request.set_client("flagosd health check");
  v1::NegotiateResponse response;
  grpc::Status status = stub->Negotiate(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("the listener ", endpoint_,
                                               " did not answer Negotiate: ",
                                               status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace flagos::daemon
