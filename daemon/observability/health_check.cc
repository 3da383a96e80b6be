#include "observability/health_check.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "transport/flagos_service.h"

namespace flagos::daemon {

std::vector<std::unique_ptr<DeviceProbe>> HealthCheck::MakeProbes(
    DeviceRuntime* runtime, const std::vector<WorkerPool*>& pools) {
  std::vector<std::unique_ptr<DeviceProbe>> probes;
  for (int d = 0; d < static_cast<int>(pools.size()); ++d) {
    probes.push_back(std::make_unique<DeviceProbe>(runtime, d, pools[d]));
  }
  return probes;
}

HealthCheck::HealthCheck(DeviceRuntime* runtime, const std::vector<WorkerPool*>& pools,
                         std::string endpoint, Connect connect)
    : endpoint_(std::move(endpoint)),
      connect_(std::move(connect)),
      probes_(MakeProbes(runtime, pools)) {}

absl::Status HealthCheck::Check(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Every device's attempt runs at once; one stuck device costs the check
  // its timeout once, not once per device.
  for (const auto& probe : probes_) probe->Start();
  absl::Status first;
  std::vector<std::string> failures;
  for (const auto& probe : probes_) {
    absl::Status status = probe->Await(deadline);
    if (status.ok()) continue;
    failures.emplace_back(status.message());
    if (first.ok()) first = std::move(status);
  }
  if (!first.ok()) return absl::Status(first.code(), absl::StrJoin(failures, "; "));
  return CheckListener(deadline - absl::Now());
}

std::vector<std::shared_ptr<const DeviceProbe::Attempt>> HealthCheck::StartDeviceProbes() {
  std::vector<std::shared_ptr<const DeviceProbe::Attempt>> outstanding;
  for (const auto& probe : probes_) {
    std::shared_ptr<const DeviceProbe::Attempt> attempt = probe->Start();
    if (!attempt->done()) outstanding.push_back(std::move(attempt));
  }
  return outstanding;
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
