// The PrivateUse1 DeviceGuardImplInterface: current device, streams, events
// and synchronisation for torch's device-generic code (DeviceGuard,
// torch.Stream / torch.Event and so torch.flagos.Stream / Event,
// torch.accelerator).
//
// Streams: ids minted by runtime.cpp (0 the default stream, 1..kStreamPoolSize
// the pool), each thread has a current stream per device, and every command
// carries its stream (runtime.cpp Enqueue/Call). The daemon runs each
// (device, stream) in order and different streams concurrently.
//
// Events: an event id is minted at the first record and kept in c10's
// `void*` event slot; record, wait (block) and destroy are asynchronous
// commands, query, synchronize and elapsed time wait for the daemon's
// answer (flagos.proto RecordEvent ... DestroyEvent).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "device_allocator.h"
#include "runtime.h"

namespace torch_fl {
namespace {

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

c10::Device MakeDevice(int index) { return c10::Device(kFlagos, static_cast<c10::DeviceIndex>(index)); }

c10::Stream MakeStream(c10::DeviceIndex device, uint64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kFlagos, device),
                     static_cast<c10::StreamId>(id));
}

uint64_t StreamId(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kFlagos, "flagos: expected a flagos stream, got a stream of ",
              stream.device());
  TORCH_CHECK(stream.id() >= 0 && stream.id() <= kStreamPoolSize, "flagos: ", stream.id(),
              " is not a flagos stream id (0 is the default stream, 1..", kStreamPoolSize,
              " the pool)");
  return static_cast<uint64_t>(stream.id());
}

// The device's index; the current device for a device without one.
c10::DeviceIndex IndexOf(c10::Device device) {
  return device.has_index() ? device.index() : static_cast<c10::DeviceIndex>(CurrentDevice());
}

uint64_t EventId(void* event) { return reinterpret_cast<uint64_t>(event); }

// Whether `event` was minted for a session that is over: lost since (ids
// only grow; each session's first is FirstEventIdOfSession), or closed at
// interpreter exit (tensors and caches that outlive the session, such as a
// pinned block whose copy recorded an event, still query and destroy
// their events then).
bool LostEvent(void* event) {
  return EventId(event) < FirstEventIdOfSession() || SessionClosedAtExit();
}

// Commands about an event only: the daemon does not use their device.
flagos::v1::Command EventCommand() {
  flagos::v1::Command command;
  command.set_device(CurrentDevice());
  return command;
}

struct FlagosGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kFlagos; }

  // ---------------------------------------------------------------- device

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

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(DeviceCountNoThrow());
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    Synchronize(device_index);
  }

  // --------------------------------------------------------------- streams

  c10::Stream getStream(c10::Device device) const override {
    const c10::DeviceIndex index = IndexOf(device);
    return MakeStream(index, CurrentStream(index));
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return MakeStream(IndexOf(device), 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device,
                                      bool /*isHighPriority*/) const override {
    const c10::DeviceIndex index = IndexOf(device);
    return MakeStream(index, PoolStream(index));
  }

  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    // Streams have no priorities (a capability gap of the backends); like
    // CUDA's torch.cuda.Stream(), a new stream comes from the pool.
    const c10::DeviceIndex index = IndexOf(device);
    return MakeStream(index, PoolStream(index));
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const uint64_t previous = ExchangeStream(stream.device_index(), StreamId(stream));
    return MakeStream(stream.device_index(), previous);
  }

  bool queryStream(const c10::Stream& stream) const override {
    flagos::v1::Command command;
    command.set_device(stream.device_index());
    command.mutable_query_stream();
    return Call(std::move(command), "query stream", StreamId(stream)).ready();
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    flagos::v1::Command command;
    command.set_device(stream.device_index());
    command.mutable_sync()->set_stream_only(true);
    Call(std::move(command), "synchronize stream", StreamId(stream));
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    DeviceAllocator().recordStream(data_ptr, stream);
  }

  // ---------------------------------------------------------------- events

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(flag == c10::EventFlag::PYTORCH_DEFAULT || flag == c10::EventFlag::BACKEND_DEFAULT,
                "flagos: unknown event flag");
    const uint64_t stream_id = StreamId(stream);
    Session();  // a new session, if the last was lost, before ids are compared
    // An event of a lost session is recorded anew under a fresh id.
    void* id = *event;
    if (id == nullptr || LostEvent(id)) id = reinterpret_cast<void*>(NewEventId());
    flagos::v1::Command command;
    command.set_device(stream.device_index());
    auto* record = command.mutable_record_event();
    record->set_event(EventId(id));
    record->set_enable_timing(flag == c10::EventFlag::BACKEND_DEFAULT);
    Enqueue(std::move(command), "record event", stream_id);
    // Only once sent (a capture may refuse it): the event then exists.
    *event = id;
  }

  // An event of a lost session marks work that is gone: there is nothing
  // to wait for, as for an event never recorded.
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr || LostEvent(event)) return;
    flagos::v1::Command command;
    command.set_device(stream.device_index());
    command.mutable_wait_event()->set_event(EventId(event));
    Enqueue(std::move(command), "wait for event", StreamId(stream));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr || LostEvent(event)) return true;
    flagos::v1::Command command = EventCommand();
    command.mutable_query_event()->set_event(EventId(event));
    return Call(std::move(command), "query event").ready();
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr || LostEvent(event)) return;
    flagos::v1::Command command = EventCommand();
    command.mutable_synchronize_event()->set_event(EventId(event));
    Call(std::move(command), "synchronize event");
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "flagos: both events must be recorded before calculating elapsed time");
    TORCH_CHECK(!LostEvent(start) && !LostEvent(end),
                "flagos: elapsed_time of an event recorded in a lost session (flagosd ended it): "
                "record both events again");
    flagos::v1::Command command = EventCommand();
    auto* elapsed = command.mutable_elapsed_time();
    elapsed->set_start(EventId(start));
    elapsed->set_end(EventId(end));
    return Call(std::move(command), "event elapsed time").elapsed_ms();
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    // Events die with Python objects, possibly after the session closed at
    // exit (the daemon released everything then).
    if (event == nullptr || LostEvent(event)) return;
    flagos::client::Connection* live = LiveSession(CurrentGeneration());
    if (live == nullptr) return;
    try {
      flagos::v1::Command command = EventCommand();
      command.mutable_destroy_event()->set_event(EventId(event));
      live->Enqueue(std::move(command), "destroy event");
    } catch (...) {
    }
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl);

}  // namespace
}  // namespace torch_fl
