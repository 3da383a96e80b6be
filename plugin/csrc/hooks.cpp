// PrivateUse1HooksInterface for flagos: availability, device count and
// pointer ownership (device memory and pinned host memory) for ATen's
// device-generic code.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/util/Exception.h>

#include "device_allocator.h"
#include "generator.h"
#include "pinned_allocator.h"
#include "runtime.h"
#include "storage.h"

namespace torch_fl {

namespace {

struct FlagosHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return DeviceCountNoThrow() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return device_index >= 0 && device_index < DeviceCountNoThrow();
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(DeviceCountNoThrow());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override { SetCurrentDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(CurrentDevice());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    int old = CurrentDevice();
    SetCurrentDevice(device);
    return static_cast<c10::DeviceIndex>(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int device = DeviceAllocator().DeviceOf(data);
    TORCH_CHECK(device >= 0, "flagos: pointer ", data, " is not a live flagos allocation");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return DefaultGenerator(device_index < 0 ? CurrentDevice() : device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return at::make_generator<FlagosGeneratorImpl>(
        device_index < 0 ? static_cast<c10::DeviceIndex>(CurrentDevice()) : device_index);
  }
  bool isPinnedPtr(const void* data) const override { return FindPinned(data).has_value(); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &PinnedAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    ResizeStorageBytes(storage, newsize);
  }
};

}  // namespace

void RegisterHooks() {
  static FlagosHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torch_fl
