// A DeviceRuntime that forwards every slot to another: tests derive from it
// and override the slots whose faults or timing they inject.
#ifndef FLAGOS_TESTS_UNIT_DELEGATING_RUNTIME_H_
#define FLAGOS_TESTS_UNIT_DELEGATING_RUNTIME_H_

#include <memory>
#include <utility>

#include "flagos/runtime.h"

namespace flagos::daemon {

class DelegatingRuntime : public DeviceRuntime {
 public:
  explicit DelegatingRuntime(std::unique_ptr<DeviceRuntime> inner) : inner_(std::move(inner)) {}

  absl::string_view name() const override { return inner_->name(); }
  const CapabilityTable& capabilities() const override { return inner_->capabilities(); }
  int DeviceCount() const override { return inner_->DeviceCount(); }
  absl::StatusOr<DeviceProperties> GetDeviceProperties(int device) const override {
    return inner_->GetDeviceProperties(device);
  }
  absl::Status SynchronizeDevice(int device) override { return inner_->SynchronizeDevice(device); }
  absl::StatusOr<DevicePtr> Malloc(int device, uint64_t nbytes) override {
    return inner_->Malloc(device, nbytes);
  }
  absl::Status Free(int device, DevicePtr ptr) override { return inner_->Free(device, ptr); }
  absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const override {
    return inner_->GetMemoryInfo(device);
  }
  absl::StatusOr<DeviceTelemetry> GetTelemetry(int device) const override {
    return inner_->GetTelemetry(device);
  }
  absl::Status HostRegister(void* ptr, uint64_t nbytes) override {
    return inner_->HostRegister(ptr, nbytes);
  }
  absl::Status HostUnregister(void* ptr) override { return inner_->HostUnregister(ptr); }
  void* HostAddress(int device, DevicePtr ptr) const override {
    return inner_->HostAddress(device, ptr);
  }
  absl::Status CopyHostToDevice(int device, StreamHandle stream, DevicePtr dst, const void* src,
                                uint64_t nbytes) override {
    return inner_->CopyHostToDevice(device, stream, dst, src, nbytes);
  }
  absl::Status CopyDeviceToHost(int device, StreamHandle stream, void* dst, DevicePtr src,
                                uint64_t nbytes) override {
    return inner_->CopyDeviceToHost(device, stream, dst, src, nbytes);
  }
  absl::Status CopyDeviceToDevice(int device, StreamHandle stream, DevicePtr dst, int src_device,
                                  DevicePtr src, uint64_t nbytes) override {
    return inner_->CopyDeviceToDevice(device, stream, dst, src_device, src, nbytes);
  }
  absl::Status Memset(int device, StreamHandle stream, DevicePtr dst, uint8_t value,
                      uint64_t nbytes) override {
    return inner_->Memset(device, stream, dst, value, nbytes);
  }
  absl::StatusOr<StreamHandle> CreateStream(int device) override {
    return inner_->CreateStream(device);
  }
  absl::Status DestroyStream(int device, StreamHandle stream) override {
    return inner_->DestroyStream(device, stream);
  }
  absl::Status SynchronizeStream(int device, StreamHandle stream) override {
    return inner_->SynchronizeStream(device, stream);
  }
  absl::StatusOr<bool> QueryStream(int device, StreamHandle stream) override {
    return inner_->QueryStream(device, stream);
  }
  absl::Status DrainStream(int device, StreamHandle stream) override {
    return inner_->DrainStream(device, stream);
  }
  absl::Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) override {
    return inner_->StreamWaitEvent(device, stream, event);
  }
  absl::Status LaunchHostFunc(int device, StreamHandle stream, HostFunc fn) override {
    return inner_->LaunchHostFunc(device, stream, std::move(fn));
  }
  absl::StatusOr<EventHandle> CreateEvent(int device, bool enable_timing) override {
    return inner_->CreateEvent(device, enable_timing);
  }
  absl::Status DestroyEvent(int device, EventHandle event) override {
    return inner_->DestroyEvent(device, event);
  }
  absl::Status RecordEvent(int device, EventHandle event, StreamHandle stream) override {
    return inner_->RecordEvent(device, event, stream);
  }
  absl::StatusOr<bool> QueryEvent(int device, EventHandle event) override {
    return inner_->QueryEvent(device, event);
  }
  absl::Status SynchronizeEvent(int device, EventHandle event) override {
    return inner_->SynchronizeEvent(device, event);
  }
  absl::StatusOr<float> ElapsedTime(int device, EventHandle start, EventHandle end) override {
    return inner_->ElapsedTime(device, start, end);
  }

 protected:
  DeviceRuntime& inner() { return *inner_; }

 private:
  const std::unique_ptr<DeviceRuntime> inner_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_TESTS_UNIT_DELEGATING_RUNTIME_H_
