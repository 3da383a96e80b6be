// (ATen TU; the only one that includes gloo's headers: gloo_process_group.h)
#include "collectives/gloo_process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace flagos::daemon {
namespace {

std::shared_ptr<::gloo::transport::Device> DaemonDevice() {
  static std::once_flag once;
  static std::shared_ptr<::gloo::transport::Device> device;
  std::call_once(once, [] {
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    device = ifname != nullptr && *ifname != '\0'
                 ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname, /*lazyInit=*/false)
                 : c10d::ProcessGroupGloo::createDefaultDevice(/*lazyInit=*/false);
  });
  return device;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> NewGlooProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(DaemonDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace flagos::daemon
