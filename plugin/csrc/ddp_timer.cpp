// DDP's timer for flagos (c10d::TimerRegistry, PrivateUse1): the Reducer
// records its forward, backward-compute and communication marks with one,
// and DDP's logging (DDPLoggingData: avg_forward_compute_time and the rest,
// torch.nn.parallel.DistributedDataParallel._get_ddp_logging_data) reads
// the differences. As CUDA's timer does with CUDA events, each mark is a
// timing event recorded on the device's current stream, so a difference is
// the device time between the marks (flagosd stamps an event when the
// stream reaches it), not the host time at which the client queued them.
// A backend without event timing (kunlunxin: libxpurt has no elapsed-time
// call) gives host times between the marks instead, as DDP's CPU timer does.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <optional>

namespace torch_fl {
namespace {

class FlagosTimer final : public c10d::Timer {
 public:
  explicit FlagosTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host time too, which DDP also reads
    if (!device_timing_) return;
    const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
    EventOf(event).record(guard.getStream(device_));
  }

  // Nanoseconds of device time from `start` to `end`; nullopt when either
  // was not recorded this iteration (as CUDA's timer, it then has no figure).
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    if (device_timing_) {
      c10::Event& from = EventOf(start);
      c10::Event& to = EventOf(end);
      if (!from.was_marked_for_recording() || !to.was_marked_for_recording()) return std::nullopt;
      to.synchronize();
      try {
        const double milliseconds = from.elapsedTime(to);
        if (milliseconds < 0) return std::nullopt;
        return static_cast<int64_t>(milliseconds * 1e6);
      } catch (const c10::NotImplementedError&) {
        device_timing_ = false;  // the backend has no event timing: host times from now on
      }
    }
    const std::optional<int64_t> from = getTimestamp(start);
    const std::optional<int64_t> to = getTimestamp(end);
    if (!from || !to || *to < *from) return std::nullopt;
    return *to - *from;
  }

 private:
  c10::Event& EventOf(Event event) {
    switch (event) {
      case Event::kForwardStart: return forward_start_;
      case Event::kBackwardComputeStart: return backward_compute_start_;
      case Event::kBackwardComputeEnd: return backward_compute_end_;
      case Event::kBackwardCommStart: return backward_comm_start_;
      case Event::kBackwardCommEnd: return backward_comm_end_;
    }
    TORCH_INTERNAL_ASSERT(false, "flagos DDP timer: unknown event");
  }

  static c10::Event TimingEvent() {
    return c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  }

  const c10::Device device_;
  bool device_timing_ = true;
  c10::Event forward_start_ = TimingEvent();
  c10::Event backward_compute_start_ = TimingEvent();
  c10::Event backward_compute_end_ = TimingEvent();
  c10::Event backward_comm_start_ = TimingEvent();
  c10::Event backward_comm_end_ = TimingEvent();
};

}  // namespace
}  // namespace torch_fl

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torch_fl::FlagosTimer)
}  // namespace c10d
