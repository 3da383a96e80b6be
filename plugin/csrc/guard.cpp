// The PrivateUse1 DeviceGuardImplInterface: current device, streams and
// device synchronisation for torch's device-generic code (DeviceGuard,
// torch.accelerator).
//
// Each device has one stream (the default stream, id 0) in this version: all
// commands of a device execute in order in the daemon. Events are a
// capability gap of torch_fl for now and raise NotImplementedError.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "runtime.h"

namespace torch_fl {
namespace {

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

c10::Device MakeDevice(int index) { return c10::Device(kFlagos, static_cast<c10::DeviceIndex>(index)); }

struct FlagosGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kFlagos; }

  c10::Device exchangeDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kFlagos);
    int old = CurrentDevice();
    if (device.index() != old) SetCurrentDevice(device.index());
    return MakeDevice(old);
  }

  c10::Device getDevice() const override { return MakeDevice(CurrentDevice()); }

  void setDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kFlagos);
    SetCurrentDevice(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    try {
      SetCurrentDevice(device.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(stream.id() == 0,
                                "flagos: only the default stream exists in this version");
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(DeviceCountNoThrow());
  }

  bool queryStream(const c10::Stream& stream) const override {
    Synchronize(stream.device_index());
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    Synchronize(stream.device_index());
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    Synchronize(device_index);
  }

  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/,
                             const c10::Stream& /*stream*/) const override {
    // One FIFO per device: nothing to record (see device_allocator.h).
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl);

}  // namespace
}  // namespace torch_fl
