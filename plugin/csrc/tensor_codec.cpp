#include "tensor_codec.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "copy.h"
#include "device_allocator.h"
#include "runtime.h"

namespace torch_fl {
namespace {

void EncodeHostTensor(const at::Tensor& t, flagos::v1::HostTensor* out) {
  at::Tensor c = t.contiguous();
  for (int64_t s : c.sizes()) out->add_sizes(s);
  out->set_dtype(static_cast<int32_t>(c.scalar_type()));
  out->set_data(static_cast<const char*>(c.const_data_ptr()), c.nbytes());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) out->set_wrapped_number(true);
}

void EncodeTensor(const at::Tensor& t, flagos::v1::Value* out) {
  if (!t.defined()) {
    out->mutable_tensor()->set_undefined(true);
    return;
  }
  switch (t.device().type()) {
    case c10::DeviceType::PrivateUse1:
      EncodeTensorRef(t, out->mutable_tensor());
      return;
    case c10::DeviceType::CPU:
      EncodeHostTensor(t, out->mutable_host_tensor());
      return;
    default:
      TORCH_CHECK(false, "flagos: cannot pass a tensor on ", t.device(),
                  " to an operator running on flagos; move it with .to(\"flagos\") first");
  }
}

}  // namespace

uint64_t StorageAddr(const at::Tensor& t) {
  if (!t.has_storage()) return 0;
  const c10::DataPtr& data = t.storage().data_ptr();
  // Every device address a command names passes here: memory of a lost
  // session never reaches the daemon (a new session may own that address).
  if (data.device().type() == c10::DeviceType::PrivateUse1) {
    CheckGeneration(DeviceAllocator().GenerationOf(data), "this flagos tensor's memory");
  }
  return reinterpret_cast<uint64_t>(data.get());
}

uint64_t ElementAddr(const at::Tensor& t) {
  return StorageAddr(t) + static_cast<uint64_t>(t.storage_offset()) * t.element_size();
}

WireTensorRef TensorRefFieldsOf(const at::Tensor& t) {
  WireTensorRef f;
  if (!t.defined()) {
    f.undefined = true;
    return f;
  }
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
              "flagos: internal: expected a flagos tensor, got one on ", t.device());
  f.addr = StorageAddr(t);
  f.storage_offset = t.storage_offset();
  f.sizes = absl::MakeConstSpan(t.sizes().data(), t.sizes().size());
  f.strides = absl::MakeConstSpan(t.strides().data(), t.strides().size());
  f.dtype = static_cast<int32_t>(t.scalar_type());
  f.device = t.device().index();
  f.conj = t.is_conj();
  f.neg = t.is_neg();
  return f;
}

void EncodeTensorRef(const at::Tensor& t, flagos::v1::TensorRef* ref) {
  const WireTensorRef f = TensorRefFieldsOf(t);
  if (f.undefined) {
    ref->set_undefined(true);
    return;
  }
  ref->set_addr(f.addr);
  ref->set_storage_offset(f.storage_offset);
  ref->mutable_sizes()->Add(f.sizes.begin(), f.sizes.end());
  ref->mutable_strides()->Add(f.strides.begin(), f.strides.end());
  ref->set_dtype(f.dtype);
  ref->set_device(f.device);
  if (f.conj) ref->set_conj(true);
  if (f.neg) ref->set_neg(true);
}

bool AddWireArg(const c10::IValue& v, OpCallWire* wire) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    // A host tensor travels by value (EncodeValue): not on the wire path.
    if (t.defined() && t.device().type() != c10::DeviceType::PrivateUse1) return false;
    wire->AddTensor(TensorRefFieldsOf(t));
  } else if (v.isNone()) {
    wire->AddNone();
  } else if (v.isBool()) {
    wire->AddBool(v.toBool());
  } else if (v.isInt()) {
    wire->AddInt(v.toInt());
  } else if (v.isDouble()) {
    wire->AddDouble(v.toDouble());
  } else if (v.isIntList()) {
    const c10::List<int64_t> list = v.toIntList();
    c10::SmallVector<int64_t, 8> values(list.begin(), list.end());
    wire->AddInts(values);
  } else {
    return false;
  }
  return true;
}

void EncodeValue(const c10::IValue& v, flagos::v1::Value* out) {
  if (v.isNone()) {
    out->set_none(true);
  } else if (v.isTensor()) {
    EncodeTensor(v.toTensor(), out);
  } else if (v.isBool()) {
    out->set_b(v.toBool());
  } else if (v.isInt()) {
    out->set_i(v.toInt());
  } else if (v.isSymInt()) {
    out->set_i(v.toSymInt().guard_int(__FILE__, __LINE__));
  } else if (v.isDouble()) {
    out->set_d(v.toDouble());
  } else if (v.isSymFloat()) {
    out->set_d(v.toSymFloat().guard_float(__FILE__, __LINE__));
  } else if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    out->mutable_c()->set_re(c.real());
    out->mutable_c()->set_im(c.imag());
  } else if (v.isString()) {
    out->set_s(v.toStringRef());
  } else if (v.isDevice()) {
    c10::Device d = v.toDevice();
    out->mutable_device()->set_type(c10::DeviceTypeName(d.type(), /*lower_case=*/true));
    out->mutable_device()->set_index(d.index());
  } else if (v.isIntList()) {
    auto* ints = out->mutable_ints();  // set even when empty
    for (int64_t i : v.toIntVector()) ints->add_values(i);
  } else if (v.isDoubleList()) {
    auto* doubles = out->mutable_doubles();
    for (double d : v.toDoubleVector()) doubles->add_values(d);
  } else if (v.isBoolList()) {
    auto* bools = out->mutable_bools();
    for (bool b : v.toBoolList()) bools->add_values(b);
  } else if (v.isList()) {
    auto* list = out->mutable_list();
    for (const c10::IValue& e : v.toListRef()) EncodeValue(e, list->add_values());
  } else if (v.isGenerator()) {
    // Generators of flagos devices arrive with the RNG work; until then the
    // daemon draws from its own generator (docs/usage.md).
    out->set_none(true);
  } else {
    TORCH_CHECK(false, "flagos: cannot send an argument of type ", v.tagKind(),
                " to the daemon");
  }
}

c10::IValue DecodeResult(const flagos::v1::Value& v, int device, uint64_t generation) {
  using V = flagos::v1::Value;
  switch (v.v_case()) {
    case V::kNone:
    case V::V_NOT_SET:
      return c10::IValue();
    case V::kI:
      return c10::IValue(v.i());
    case V::kD:
      return c10::IValue(v.d());
    case V::kB:
      return c10::IValue(v.b());
    case V::kC:
      return c10::IValue(c10::complex<double>(v.c().re(), v.c().im()));
    case V::kS:
      return c10::IValue(v.s());
    case V::kInts:
      return c10::IValue(std::vector<int64_t>(v.ints().values().begin(), v.ints().values().end()));
    case V::kDoubles:
      return c10::IValue(std::vector<double>(v.doubles().values().begin(), v.doubles().values().end()));
    case V::kBools: {
      c10::List<bool> list;
      for (bool b : v.bools().values()) list.push_back(b);
      return c10::IValue(list);
    }
    case V::kHostTensor: {
      const auto& h = v.host_tensor();
      auto dtype = static_cast<c10::ScalarType>(h.dtype());
      std::vector<int64_t> sizes(h.sizes().begin(), h.sizes().end());
      at::Tensor cpu = at::empty(sizes, at::TensorOptions().dtype(dtype));
      TORCH_CHECK(static_cast<size_t>(cpu.nbytes()) == h.data().size(),
                  "flagos: the daemon returned a malformed tensor (", h.data().size(),
                  " bytes for ", cpu.nbytes(), ")");
      if (cpu.nbytes() > 0) std::memcpy(cpu.data_ptr(), h.data().data(), cpu.nbytes());
      return c10::IValue(cpu.to(at::Device(c10::DeviceType::PrivateUse1,
                                           static_cast<c10::DeviceIndex>(device))));
    }
    case V::kHeld: {
      // A result the daemon kept: device memory for it, and the daemon
      // moves it there (its bytes never come to this process).
      const auto& h = v.held();
      std::vector<int64_t> sizes(h.sizes().begin(), h.sizes().end());
      at::Tensor tensor = at::empty(
          sizes, at::TensorOptions()
                     .dtype(static_cast<c10::ScalarType>(h.dtype()))
                     .device(at::Device(c10::DeviceType::PrivateUse1,
                                        static_cast<c10::DeviceIndex>(device))));
      flagos::v1::Command command;
      command.set_device(device);
      command.mutable_place_result()->set_id(h.id());
      EncodeTensorRef(tensor, command.mutable_place_result()->mutable_dst());
      Enqueue(std::move(command), "place_result", std::nullopt, generation);
      return c10::IValue(tensor);
    }
    case V::kList: {
      bool all_tensors = v.list().values_size() > 0;
      for (const auto& e : v.list().values()) {
        all_tensors &= e.v_case() == V::kHostTensor || e.v_case() == V::kHeld;
      }
      if (all_tensors) {
        c10::List<at::Tensor> list;
        for (const auto& e : v.list().values()) list.push_back(DecodeResult(e, device, generation).toTensor());
        return c10::IValue(list);
      }
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& e : v.list().values()) list.push_back(DecodeResult(e, device, generation));
      return c10::IValue(list);
    }
    default:
      TORCH_CHECK(false, "flagos: the daemon returned a value of unexpected kind ",
                  static_cast<int>(v.v_case()));
  }
}

}  // namespace torch_fl
