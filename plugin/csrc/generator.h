// FlagosGenerator: the random generator of a flagos device.
//
// Its state is (seed, offset). Every random operator enqueued on the device
// carries the generator's current (seed, offset) and advances the offset by
// one; the daemon draws that op's numbers from a generator seeded from the
// pair alone. Results therefore depend only on torch.manual_seed and the
// order of random ops — not on daemon threads or on other processes — and
// get_rng_state/set_rng_state round-trip exactly.
//
// Thread safety: as c10::GeneratorImpl — callers hold generator.mutex().
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>

namespace torch_fl {

class FlagosGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit FlagosGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t seed() override;
  // State: 16 bytes (seed, offset) as a CPU uint8 tensor.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // Returns (seed, offset) for one random op and advances the offset.
  // REQUIRES: mutex() held.
  std::pair<uint64_t, uint64_t> NextOpState();

 private:
  FlagosGeneratorImpl* clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of `device` (lazily created; never destroyed).
const at::Generator& DefaultGenerator(int device);
// Seeds every device's default generator (no daemon round trip).
void ManualSeedAll(uint64_t seed);

}  // namespace torch_fl
