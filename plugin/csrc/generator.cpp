#include "generator.h"

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstring>
#include <mutex>

namespace torch_fl {
namespace {

// More devices than any daemon serves: seeding all of them needs no daemon.
constexpr int kMaxDevices = 64;
constexpr size_t kStateBytes = 2 * sizeof(uint64_t);

struct DefaultGenerators {
  std::once_flag once[kMaxDevices];
  std::array<at::Generator, kMaxDevices> generators;
};

DefaultGenerators& Defaults() {
  static auto* defaults = new DefaultGenerators();  // never destroyed
  return *defaults;
}

at::Generator& DefaultSlot(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "flagos: invalid device index ", device);
  DefaultGenerators& d = Defaults();
  std::call_once(d.once[device], [&] {
    d.generators[device] = at::make_generator<FlagosGeneratorImpl>(static_cast<c10::DeviceIndex>(device));
  });
  return d.generators[device];
}

}  // namespace

FlagosGeneratorImpl::FlagosGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void FlagosGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t FlagosGeneratorImpl::seed() {
  uint64_t random = c10::detail::getNonDeterministicRandom();
  set_current_seed(random);
  return random;
}

void FlagosGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  static_cast<size_t>(new_state.numel()) == kStateBytes &&
                  new_state.device().is_cpu(),
              "flagos: RNG state must be a CPU ByteTensor of ", kStateBytes,
              " bytes, as returned by torch.flagos.get_rng_state()");
  uint64_t words[2];
  std::memcpy(words, new_state.data(), kStateBytes);
  seed_ = words[0];
  offset_ = words[1];
}

c10::intrusive_ptr<c10::TensorImpl> FlagosGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
  uint64_t words[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

std::pair<uint64_t, uint64_t> FlagosGeneratorImpl::NextOpState() { return {seed_, offset_++}; }

FlagosGeneratorImpl* FlagosGeneratorImpl::clone_impl() const {
  auto* copy = new FlagosGeneratorImpl(device().index(), seed_);
  copy->offset_ = offset_;
  return copy;
}

const at::Generator& DefaultGenerator(int device) { return DefaultSlot(device); }

void ManualSeedAll(uint64_t seed) {
  for (int device = 0; device < kMaxDevices; ++device) {
    at::Generator& g = DefaultSlot(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  }
}


}  // namespace torch_fl
