// The explicit PrivateUse1 kernels every backend needs (the rest goes
// through the boxed fallback in fallback.cpp): tensor creation, metadata-only
// views, resizing, set_, copies and scalar reads. Metadata ops run entirely
// in this process; none of them talks to the daemon unless bytes move.
// Also the commonest arithmetic, which runs as the fallback would but
// without boxing its arguments (see RunOnDaemonUnboxed).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <typeinfo>
#include <cstring>

#include "copy.h"
#include "device_allocator.h"
#include "fallback.h"
#include "runtime.h"
#include "storage.h"
#include "tensor_codec.h"

namespace torch_fl {


void ResizeStorageBytes(const c10::Storage& storage, size_t nbytes) {
  if (nbytes == storage.nbytes()) return;
  TORCH_CHECK(storage.resizable(), "flagos: trying to resize storage that is not resizable");
  int device = storage.device().index();
  c10::DataPtr fresh = DeviceAllocator().AllocateOn(device, nbytes);
  // The new block's generation: the old bytes must be of the same session.
  const uint64_t generation = CurrentGeneration();
  size_t keep = std::min(nbytes, storage.nbytes());
  const void* old = storage.data_ptr().get();
  if (keep > 0 && old != nullptr) {
    CheckGeneration(DeviceAllocator().GenerationOf(storage.data_ptr()),
                    "the memory of the flagos storage being resized");
    flagos::v1::Command command;
    command.set_device(device);
    auto* copy = command.mutable_copy_device_to_device();
    copy->set_src(reinterpret_cast<uint64_t>(old));
    copy->set_src_device(device);
    copy->set_dst(reinterpret_cast<uint64_t>(fresh.get()));
    copy->set_nbytes(keep);
    Enqueue(std::move(command), "resize storage", std::nullopt, generation);
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
}

namespace {

int DeviceIndexOf(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) return device->index();
  return CurrentDevice();
}

at::Tensor Empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                 std::optional<bool> pin_memory,
                 std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "flagos: pin_memory applies to CPU tensors only");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "flagos: only strided tensors are supported");
  c10::DeviceGuard guard(c10::Device(kFlagos, static_cast<c10::DeviceIndex>(DeviceIndexOf(device))));
  return at::detail::empty_generic(size, &DeviceAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor EmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "flagos: pin_memory applies to CPU tensors only");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "flagos: only strided tensors are supported");
  c10::DeviceGuard guard(c10::Device(kFlagos, static_cast<c10::DeviceIndex>(DeviceIndexOf(device))));
  return at::detail::empty_strided_generic(size, stride, &DeviceAllocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor AsStrided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                     std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor View(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor ReshapeAlias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& Resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == size && !memory_format.has_value()) return self;
  for (int64_t s : size) TORCH_CHECK(s >= 0, "flagos: resize_ to a negative size ", size);
  impl->set_sizes_contiguous(size);
  size_t needed = at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(),
                                                             self.storage_offset());
  if (needed > self.storage().nbytes()) ResizeStorageBytes(self.storage(), needed);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& SetStorage(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                       c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kFlagos || source.nbytes() == 0,
              "flagos: set_ expects a flagos storage, got one on ", source.device());
  TORCH_CHECK(storage_offset >= 0, "flagos: set_ with a negative storage offset");
  TORCH_CHECK(stride.empty() || stride.size() == size.size(),
              "flagos: set_ with ", size.size(), " sizes but ", stride.size(), " strides");
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  size_t needed = stride.empty()
      ? at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), storage_offset)
      : at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), storage_offset);
  if (needed > self.storage().nbytes()) ResizeStorageBytes(self.storage(), needed);
  return self;
}

at::Tensor& SetSourceStorage(at::Tensor& self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& SetSourceTensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& SetEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       DeviceAllocator().AllocateOn(self.device().index(), 0), &DeviceAllocator(),
                       /*resizable=*/true);
  return SetStorage(self, std::move(storage), 0, {0}, {});
}

at::Tensor CopyFromOp(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  return CopyFrom(self, dst, non_blocking);
}

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return CopyFrom(self, dst, false);
}

c10::Scalar LocalScalarDense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "flagos: a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, at::TensorOptions().dtype(self.scalar_type()));
  DownloadBytes(self.device().index(), ElementAddr(self), host.data_ptr(), host.nbytes());
  return host.item();
}

// ---- Common arithmetic without boxing.
//
// These run exactly as the boxed fallback would (fallback.cpp), minus the
// boxing: the dispatcher's boxed call copies every tensor argument into an
// IValue, and copying a tensor that only Python holds pins its PyObject,
// which takes the GIL (and releasing it again, once more). Here the
// arguments are borrowed.

// A call's arguments as IValues, the tensors among them borrowed from the
// kernel's own arguments (no reference counts move) and released unowned.
template <size_t N>
class BorrowedArgs {
 public:
  template <typename... T>
  explicit BorrowedArgs(const T&... values) : values_{Borrow(values)...} {
    static_assert(sizeof...(T) == N);
  }
  ~BorrowedArgs() {
    for (c10::IValue& v : values_) {
      if (v.isTensor()) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(v.toTensor());
    }
  }
  BorrowedArgs(const BorrowedArgs&) = delete;
  BorrowedArgs& operator=(const BorrowedArgs&) = delete;

  c10::ArrayRef<c10::IValue> get() const { return values_; }

 private:
  static c10::IValue Borrow(const at::Tensor& t) {
    return c10::IValue(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
  }
  static c10::IValue Borrow(const c10::Scalar& s) { return c10::IValue(s); }  // owned

  std::array<c10::IValue, N> values_;
};

const c10::OperatorHandle& FindOp(const char* name, const char* overload) {
  // Kept for the process, like the dispatcher's own operator table.
  return *new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
}

// The ops, by name: each template instance keeps its handle.
struct AddOp {
  static constexpr const char* kInPlace = "aten::add_";
  static constexpr const char* kFunctional = "aten::add";
};
struct SubOp {
  static constexpr const char* kInPlace = "aten::sub_";
  static constexpr const char* kFunctional = "aten::sub";
};
struct MulOp {
  static constexpr const char* kInPlace = "aten::mul_";
  static constexpr const char* kFunctional = "aten::mul";
};
struct DivOp {
  static constexpr const char* kInPlace = "aten::div_";
  static constexpr const char* kFunctional = "aten::div";
};

template <size_t N, typename... T>
void RunUnboxed(const c10::OperatorHandle& op, c10::SmallVectorImpl<c10::IValue>* results,
                const T&... args) {
  BorrowedArgs<N> borrowed(args...);
  RunOnDaemonUnboxed(op, borrowed.get(), results);
}

// self.op_(other, alpha=alpha): `self` is written and returned.
template <typename Op>
at::Tensor& InPlaceWithAlpha(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  static const c10::OperatorHandle& op = FindOp(Op::kInPlace, "Tensor");
  c10::SmallVector<c10::IValue, 1> results;
  RunUnboxed<3>(op, &results, self, other, alpha);
  return self;
}

template <typename Op>
at::Tensor FunctionalWithAlpha(const at::Tensor& self, const at::Tensor& other,
                               const c10::Scalar& alpha) {
  static const c10::OperatorHandle& op = FindOp(Op::kFunctional, "Tensor");
  c10::SmallVector<c10::IValue, 1> results;
  RunUnboxed<3>(op, &results, self, other, alpha);
  return std::move(results.at(0)).toTensor();
}

template <typename Op>
at::Tensor& InPlace(at::Tensor& self, const at::Tensor& other) {
  static const c10::OperatorHandle& op = FindOp(Op::kInPlace, "Tensor");
  c10::SmallVector<c10::IValue, 1> results;
  RunUnboxed<2>(op, &results, self, other);
  return self;
}

template <typename Op>
at::Tensor Functional(const at::Tensor& self, const at::Tensor& other) {
  static const c10::OperatorHandle& op = FindOp(Op::kFunctional, "Tensor");
  c10::SmallVector<c10::IValue, 1> results;
  RunUnboxed<2>(op, &results, self, other);
  return std::move(results.at(0)).toTensor();
}

// Whether `self` may take `from`'s data in place (Tensor.data = ...,
// set_data, and so nn.Module._apply, which keeps a module's Parameter
// objects across .to() only when this says yes). ATen's own answer lists its
// built-in dense backends and not PrivateUse1, so without this kernel
// model.to("flagos") would replace every parameter: tied weights untied,
// optimizers built before .to() left holding the CPU tensors. CUDA answers
// yes between CPU and CUDA dense tensors; flagos does the same between CPU
// and flagos ones (both plain TensorImpls, so shallow_copy_from can move
// storage and device). Anything else keeps ATen's answer.
bool HasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  const auto dense_here = [](const at::Tensor& t) {
    const c10::DeviceType type = t.device().type();
    return t.layout() == c10::kStrided &&
           (type == c10::DeviceType::CPU || type == c10::DeviceType::PrivateUse1) &&
           !t.is_quantized() && !t.unsafeGetTensorImpl()->is_python_dispatch() &&
           typeid(*t.unsafeGetTensorImpl()) == typeid(c10::TensorImpl);
  };
  if (dense_here(self) && dense_here(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(HasCompatibleShallowCopyType));
  m.impl("add_.Tensor", TORCH_FN(InPlaceWithAlpha<AddOp>));
  m.impl("add.Tensor", TORCH_FN(FunctionalWithAlpha<AddOp>));
  m.impl("sub_.Tensor", TORCH_FN(InPlaceWithAlpha<SubOp>));
  m.impl("sub.Tensor", TORCH_FN(FunctionalWithAlpha<SubOp>));
  m.impl("mul_.Tensor", TORCH_FN(InPlace<MulOp>));
  m.impl("mul.Tensor", TORCH_FN(Functional<MulOp>));
  m.impl("div_.Tensor", TORCH_FN(InPlace<DivOp>));
  m.impl("div.Tensor", TORCH_FN(Functional<DivOp>));
  m.impl("empty.memory_format", TORCH_FN(Empty));
  m.impl("empty_strided", TORCH_FN(EmptyStrided));
  m.impl("as_strided", TORCH_FN(AsStrided));
  m.impl("view", TORCH_FN(View));
  m.impl("_reshape_alias", TORCH_FN(ReshapeAlias));
  m.impl("resize_", TORCH_FN(Resize));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(SetStorage));
  m.impl("set_.source_Storage", TORCH_FN(SetSourceStorage));
  m.impl("set_.source_Tensor", TORCH_FN(SetSourceTensor));
  m.impl("set_", TORCH_FN(SetEmpty));
  m.impl("_copy_from", TORCH_FN(CopyFromOp));
  m.impl("_copy_from_and_resize", TORCH_FN(CopyFromAndResize));
  m.impl("_local_scalar_dense", TORCH_FN(LocalScalarDense));
}

// copy_ resolves lazy conjugation and negation itself (the daemon's copy_
// applies the bits carried in TensorRefs), so the Conjugate and Negative
// fallbacks must not materialise its arguments first: they would copy
// through _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torch_fl
