#include "shape_inference.h"

#include <Python.h>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "op_schema.h"
#include "tensor_codec.h"

namespace torch_fl {
namespace {

constexpr size_t kMaxCacheEntries = 1 << 14;


// Mirrors flagos (and non-scalar CPU) tensors as meta tensors; tensors that
// share a storage get meta tensors that share one.
class MetaMirror {
 public:
  c10::IValue Convert(const c10::IValue& v) {
    if (v.isTensor()) return c10::IValue(ToMeta(v.toTensor()));
    if (v.isDevice() && v.toDevice().type() == kFlagos) return c10::IValue(c10::Device(c10::kMeta));
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(ToMeta(t));
      return c10::IValue(out);
    }
    if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isNone()) {
          out.push_back(std::nullopt);
        } else {
          out.push_back(ToMeta(e.toTensor()));
        }
      }
      return c10::IValue(out);
    }
    return v;
  }

 private:
  at::Tensor ToMeta(const at::Tensor& t) {
    if (!t.defined()) return t;
    // CPU tensors (0-dim values such as masked_fill's) become meta too: the
    // daemon receives them by value, on its device. Wrapped Python numbers
    // stay: kernels (Python meta kernels too) treat them as scalars.
    if (!IsFlagos(t) && !t.device().is_cpu()) return t;
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                           c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                           c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true);
      it = storages_.emplace(key, std::move(storage)).first;
    }
    at::Tensor meta = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(it->second), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) meta.unsafeGetTensorImpl()->_set_conj(true);
    if (t.is_neg()) meta.unsafeGetTensorImpl()->_set_neg(true);
    return meta;
  }

  std::unordered_map<c10::StorageImpl*, c10::Storage> storages_;
};

TensorMeta Describe(const at::Tensor& t) {
  TensorMeta m;
  if (!t.defined()) return m;
  m.defined = true;
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  m.strides.assign(t.strides().begin(), t.strides().end());
  m.storage_offset = t.storage_offset();
  m.dtype = t.scalar_type();
  m.storage_nbytes = t.has_storage() ? t.storage().nbytes() : 0;
  return m;
}

std::vector<TensorMeta> DescribeAll(const c10::IValue& v) {
  std::vector<TensorMeta> out;
  if (v.isTensor()) {
    out.push_back(Describe(v.toTensor()));
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isTensor() ? Describe(e.toTensor()) : TensorMeta());
    }
  }
  return out;
}

// ---- the cache key: the op, then each argument's metadata or value.

class KeyWriter {
 public:
  explicit KeyWriter(const c10::OperatorHandle& op) {
    const void* id = &op.schema();
    Bytes(&id, sizeof(id));
  }

  // false when an argument cannot be keyed (then the call is not cached).
  bool Add(const c10::IValue& v) {
    if (v.isNone()) {
      Tag('n');
    } else if (v.isTensor()) {
      Tensor(v.toTensor());
    } else if (v.isInt()) {
      Tag('i');
      Pod(v.toInt());
    } else if (v.isDouble()) {
      Tag('d');
      Pod(v.toDouble());
    } else if (v.isBool()) {
      Tag('b');
      Pod(v.toBool());
    } else if (v.isComplexDouble()) {
      Tag('c');
      Pod(v.toComplexDouble());
    } else if (v.isString()) {
      Tag('s');
      const std::string& s = v.toStringRef();
      Pod(s.size());
      Bytes(s.data(), s.size());
    } else if (v.isDevice()) {
      Tag('D');
      Pod(static_cast<int>(v.toDevice().type()));
      Pod(static_cast<int>(v.toDevice().index()));
    } else if (v.isGenerator()) {
      Tag('g');
    } else if (v.isList()) {
      Tag('[');
      Pod(v.toListRef().size());
      for (const c10::IValue& e : v.toListRef()) {
        if (!Add(e)) return false;
      }
    } else {
      return false;
    }
    return true;
  }

  std::string Take() { return std::move(key_); }

 private:
  void Tensor(const at::Tensor& t) {
    Tag('t');
    if (!t.defined()) {
      Tag('u');
      return;
    }
    Pod(static_cast<int>(t.device().type()));
    Pod(static_cast<int>(t.scalar_type()));
    Pod(t.dim());
    Bytes(t.sizes().data(), t.dim() * sizeof(int64_t));
    Bytes(t.strides().data(), t.dim() * sizeof(int64_t));
    Pod(t.storage_offset());
    Pod(t.has_storage() ? t.storage().nbytes() : size_t{0});
    Pod(static_cast<char>(t.is_conj() | (t.is_neg() << 1) |
                          (t.unsafeGetTensorImpl()->is_wrapped_number() << 2)));
    // Which earlier argument, if any, shares this storage.
    const void* storage = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    int shared = -1;
    for (size_t i = 0; i < storages_.size(); ++i) {
      if (storages_[i] == storage) shared = static_cast<int>(i);
    }
    Pod(shared);
    storages_.push_back(storage);
  }
  void Tag(char c) { key_.push_back(c); }
  template <typename T>
  void Pod(const T& value) {
    Bytes(&value, sizeof(T));
  }
  void Bytes(const void* data, size_t n) { key_.append(static_cast<const char*>(data), n); }

  std::string key_;
  std::vector<const void*> storages_;
};

struct Cache {
  std::mutex mu;
  // nullopt: the call cannot be inferred on meta.
  std::unordered_map<std::string, std::optional<InferredCall>> entries;
};

Cache& GlobalCache() {
  static auto* cache = new Cache();  // never destroyed
  return *cache;
}

bool IsPythonNotImplemented(python_error& e) {
  e.persist();
  pybind11::gil_scoped_acquire gil;
  return e.type != nullptr && PyErr_GivenExceptionMatches(e.type, PyExc_NotImplementedError) != 0;
}

std::optional<InferredCall> RunOnMeta(const c10::OperatorHandle& op,
                                      const std::vector<c10::IValue>& args) {
  const c10::FunctionSchema& schema = op.schema();
  MetaMirror mirror;
  std::vector<c10::IValue> meta_args;
  meta_args.reserve(args.size());
  for (const c10::IValue& a : args) meta_args.push_back(mirror.Convert(a));
  torch::jit::Stack stack = meta_args;
  try {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const c10::NotImplementedError&) {
    return std::nullopt;  // no meta kernel: ask the daemon
  } catch (pybind11::error_already_set& e) {
    // A meta kernel written in Python that cannot infer this call (e.g.
    // boolean-mask indexing, whose output size depends on the data).
    pybind11::gil_scoped_acquire gil;
    if (!e.matches(PyExc_NotImplementedError)) throw;
    return std::nullopt;
  } catch (python_error& e) {
    if (!IsPythonNotImplemented(e)) throw;
    return std::nullopt;
  }
  InferredCall inferred;
  for (const c10::IValue& r : stack) inferred.returns.push_back(DescribeAll(r));
  inferred.written.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (IsWritten(schema.arguments()[i])) inferred.written[i] = DescribeAll(meta_args[i]);
  }
  return inferred;
}

}  // namespace

// Calls whose CPU kernel returns other sizes or dtypes than the meta kernel
// (which follows CUDA) says: batch norm keeps its saved statistics in the
// input's reduced-precision dtype on the CPU (float32 on CUDA) and returns
// none (empty tensors) in eval mode, and _embedding_bag sizes its auxiliary
// outputs differently; layer and group norm keep their statistics in the
// input's dtype too. They take the synchronous path, which learns the
// outputs from the kernel itself.
bool FirstArgumentInReducedPrecision(const std::vector<c10::IValue>& args) {
  if (args.empty() || !args[0].isTensor()) return false;
  c10::ScalarType dtype = args[0].toTensor().scalar_type();
  return dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16;
}

bool MetaDisagreesWithTheKernel(const c10::OperatorHandle& op,
                                const std::vector<c10::IValue>& args) {
  const std::string& name = op.schema().name();
  if (name == "aten::_embedding_bag" || name == "aten::_embedding_bag_forward_only") return true;
  if (name == "aten::native_layer_norm" || name == "aten::native_group_norm") {
    // The saved statistics: the input's dtype on the CPU, float32 on CUDA.
    return FirstArgumentInReducedPrecision(args);
  }
  if (name == "aten::native_batch_norm" || name == "aten::_native_batch_norm_legit" ||
      name == "aten::_native_batch_norm_legit_no_training" ||
      name == "aten::_batch_norm_with_update" || name == "aten::_batch_norm_no_update") {
    if (FirstArgumentInReducedPrecision(args)) return true;
    const auto& arguments = op.schema().arguments();
    for (size_t i = 0; i < arguments.size() && i < args.size(); ++i) {
      if (arguments[i].name() == "training" && args[i].isBool()) return !args[i].toBool();
    }
    return name == "aten::_native_batch_norm_legit_no_training" ||
           name == "aten::_batch_norm_no_update";
  }
  return false;
}

// Whether an op's output shape depends on the data of this call. Advanced
// indexing is tagged data-dependent because of boolean masks; with integer
// indices its shape follows from the shapes alone.
bool DataDependent(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  if (!op.hasTag(at::Tag::dynamic_output_shape)) return false;
  if (op.schema().name() != "aten::index") return true;
  bool mask = false;
  for (const c10::IValue& a : args) {
    if (!a.isList()) continue;
    for (const c10::IValue& e : a.toListRef()) {
      if (!e.isTensor()) continue;
      c10::ScalarType dtype = e.toTensor().scalar_type();
      mask |= dtype == c10::ScalarType::Bool || dtype == c10::ScalarType::Byte;
    }
  }
  return mask;
}

std::optional<InferredCall> InferOnMeta(const c10::OperatorHandle& op,
                                        const std::vector<c10::IValue>& args) {
  if (!ReturnsOnlyTensors(op.schema()) || DataDependent(op, args) ||
      MetaDisagreesWithTheKernel(op, args)) {
    return std::nullopt;
  }
  KeyWriter writer(op);
  bool cacheable = true;
  for (const c10::IValue& a : args) cacheable = cacheable && writer.Add(a);
  std::string key = cacheable ? writer.Take() : std::string();
  Cache& cache = GlobalCache();
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.entries.find(key);
    if (it != cache.entries.end()) return it->second;
  }
  std::optional<InferredCall> inferred = RunOnMeta(op, args);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.entries.size() >= kMaxCacheEntries) cache.entries.clear();
    cache.entries.emplace(std::move(key), inferred);
  }
  return inferred;
}

}  // namespace torch_fl
