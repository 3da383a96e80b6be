#include "shape_inference.h"

#include <Python.h>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "op_schema.h"
#include "runtime.h"
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

// The key's bytes: on the stack for a typical call, no allocation.
using KeyBuffer = c10::SmallVector<char, 256>;

// Appends to `key` (cleared first).
class KeyWriter {
 public:
  // `floats_by_kind`: float and complex values are keyed by kind only
  // (OpTraits::float_values_keep_metadata); ints (sizes, dims, dtypes) and
  // bools always by value.
  KeyWriter(const c10::OperatorHandle& op, bool floats_by_kind, KeyBuffer* key)
      : key_(*key), floats_by_kind_(floats_by_kind) {
    key_.clear();
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
      if (!floats_by_kind_) Pod(v.toDouble());
    } else if (v.isBool()) {
      Tag('b');
      Pod(v.toBool());
    } else if (v.isComplexDouble()) {
      Tag('c');
      if (!floats_by_kind_) Pod(v.toComplexDouble());
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

 private:
  void Tensor(const at::Tensor& t) {
    if (!t.defined()) {
      Tag('U');
      return;
    }
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const bool has_storage = impl->has_storage();
    // Which earlier argument, if any, shares this storage.
    const void* storage = has_storage ? impl->storage().unsafeGetStorageImpl() : nullptr;
    int32_t shared = -1;
    for (size_t i = 0; i < storages_.size(); ++i) {
      if (storages_[i] == storage) shared = static_cast<int32_t>(i);
    }
    storages_.push_back(storage);
    // One fixed-size header, then sizes and strides: one append each.
    struct Header {
      char tag;
      char flags;
      int16_t device_type;
      int32_t dtype;
      int32_t shared;
      int32_t dim;
      int64_t storage_offset;
      uint64_t storage_nbytes;
    } header;
    std::memset(&header, 0, sizeof(header));  // padding too: the key is compared bytewise
    header.tag = 'T';
    header.flags = static_cast<char>(impl->is_conj() | (impl->is_neg() << 1) |
                                     (impl->is_wrapped_number() << 2));
    header.device_type = static_cast<int16_t>(impl->device_type());
    header.dtype = static_cast<int32_t>(c10::typeMetaToScalarType(impl->dtype()));
    header.shared = shared;
    const c10::IntArrayRef sizes = impl->sizes();
    header.dim = static_cast<int32_t>(sizes.size());
    header.storage_offset = impl->storage_offset();
    header.storage_nbytes = has_storage ? impl->storage().nbytes() : 0;
    Bytes(&header, sizeof(header));
    Bytes(sizes.data(), sizes.size() * sizeof(int64_t));
    Bytes(impl->strides().data(), sizes.size() * sizeof(int64_t));
  }
  void Tag(char c) { key_.push_back(c); }
  template <typename T>
  void Pod(const T& value) {
    Bytes(&value, sizeof(T));
  }
  void Bytes(const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    key_.append(bytes, bytes + n);
  }

  KeyBuffer& key_;
  const bool floats_by_kind_;
  c10::SmallVector<const void*, 8> storages_;
};

// Finds std::string keys by string_view, without building a string.
struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view key) const { return std::hash<std::string_view>()(key); }
};

struct Cache {
  std::mutex mu;
  // nullptr: the call cannot be inferred on meta.
  std::unordered_map<std::string, std::shared_ptr<const InferredCall>, KeyHash, std::equal_to<>>
      entries;
};

Cache& GlobalCache() {
  static auto* cache = new Cache();  // never destroyed
  return *cache;
}

// Whatever a meta kernel raises, the kernel itself decides, synchronously:
// flagosd runs the kernel, and a program must see what that kernel does, not
// what the meta function (which follows CUDA, or is a Python reference)
// says. They differ: a meta function written in Python that cannot infer a
// call raises NotImplementedError (boolean-mask indexing, whose output size
// depends on the data) or AttributeError where it does not handle an argument
// the schema allows (torch 2.13's _thnn_fused_lstm_cell meta reads the device
// of a bias that is None); and some refuse what the kernel takes
// (torch.where's reference refuses a uint8 condition, which the CPU kernel
// accepts). docs/reference/mixed-operands.md is the sweep that finds these.
// Only Python's non-exceptions (KeyboardInterrupt, SystemExit) propagate.
bool MetaCannotInfer(PyObject* type) {
  return type != nullptr && PyErr_GivenExceptionMatches(type, PyExc_Exception) != 0;
}

bool PythonMetaCannotInfer(python_error& e) {
  e.persist();
  pybind11::gil_scoped_acquire gil;
  return MetaCannotInfer(e.type);
}

std::atomic<uint64_t> meta_runs{0};

std::shared_ptr<const InferredCall> RunOnMeta(const c10::OperatorHandle& op,
                                              const OpTraits& traits,
                                              c10::ArrayRef<c10::IValue> args) {
  meta_runs.fetch_add(1, std::memory_order_relaxed);
  MetaMirror mirror;
  std::vector<c10::IValue> meta_args;
  meta_args.reserve(args.size());
  for (const c10::IValue& a : args) meta_args.push_back(mirror.Convert(a));
  torch::jit::Stack stack = meta_args;
  try {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const c10::Error&) {
    return nullptr;  // no meta kernel, or one that refuses: ask the daemon's kernel
  } catch (pybind11::error_already_set& e) {
    pybind11::gil_scoped_acquire gil;
    if (!MetaCannotInfer(e.type().ptr())) throw;
    return nullptr;
  } catch (python_error& e) {
    if (!PythonMetaCannotInfer(e)) throw;
    return nullptr;
  }
  auto inferred = std::make_shared<InferredCall>();
  for (const c10::IValue& r : stack) inferred->returns.push_back(DescribeAll(r));
  inferred->written.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (traits.written[i]) inferred->written[i] = DescribeAll(meta_args[i]);
  }
  return inferred;
}

}  // namespace

// Calls whose kernel returns other sizes or dtypes than the meta kernel
// (which follows CUDA) says take the synchronous path, which learns the
// outputs from the kernel itself. Which calls those are is a fact about the
// daemon's backend, sent at the handshake (NegotiateResponse.kernel_facts:
// for each overload, the facts of the kernels its route runs; for ATen's
// CPU kernels: batch norm's saved statistics in reduced precision and in
// eval mode, _embedding_bag's auxiliary outputs, layer and group norm's
// statistics in reduced precision, the dtypes some kernels return with
// operands of mixed dtypes: backends/cpu/cpu_kernel_facts.cc).
bool FirstArgumentInReducedPrecision(c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isTensor()) return false;
  c10::ScalarType dtype = args[0].toTensor().scalar_type();
  return dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16;
}

bool TensorDtypesDiffer(c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::ScalarType> first;
  for (const c10::IValue& a : args) {
    if (!a.isTensor() || !a.toTensor().defined()) continue;
    const c10::ScalarType dtype = a.toTensor().scalar_type();
    if (first.has_value() && *first != dtype) return true;
    first = dtype;
  }
  return false;
}

// The daemon's kernel facts, read once from the session's handshake.
const std::vector<flagos::v1::KernelFact>& KernelFacts() {
  static const auto* const facts = [] {
    const auto& received = Session().info().kernel_facts();
    return new std::vector<flagos::v1::KernelFact>(received.begin(), received.end());
  }();
  return *facts;
}

const flagos::v1::KernelFact* KernelFactOf(const OpTraits& traits) {
  int index = traits.kernel_fact.load(std::memory_order_relaxed);
  if (index == OpTraits::kFactUnknown) {
    const std::vector<flagos::v1::KernelFact>& facts = KernelFacts();
    index = OpTraits::kNoFact;
    for (size_t i = 0; i < facts.size(); ++i) {
      if (facts[i].op() != traits.name) continue;
      // No overloads named: every overload (so says a daemon from before
      // the field, too).
      const auto& overloads = facts[i].overloads();
      if (overloads.empty() ||
          std::find(overloads.begin(), overloads.end(), traits.overload) != overloads.end()) {
        index = static_cast<int>(i);
      }
    }
    traits.kernel_fact.store(index, std::memory_order_relaxed);
  }
  return index < 0 ? nullptr : &KernelFacts()[index];
}

bool MetaDisagreesWithTheKernel(const OpTraits& traits, c10::ArrayRef<c10::IValue> args) {
  const flagos::v1::KernelFact* fact = KernelFactOf(traits);
  if (fact == nullptr) return false;
  if (fact->always()) return true;
  if (fact->reduced_precision_input() && FirstArgumentInReducedPrecision(args)) return true;
  if (fact->mixed_dtype_operands() && TensorDtypesDiffer(args)) return true;
  if (fact->eval_mode()) {
    const int training = traits.training_argument;
    if (training >= 0 && static_cast<size_t>(training) < args.size() &&
        args[training].isBool()) {
      return !args[training].toBool();
    }
  }
  return false;
}

// Whether an op's output shape depends on the data of this call. Advanced
// indexing is tagged data-dependent because of boolean masks; with integer
// indices its shape follows from the shapes alone.
bool DataDependent(const OpTraits& traits, c10::ArrayRef<c10::IValue> args) {
  if (!traits.dynamic_output_shape) return false;
  if (!traits.is_index) return true;
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

std::shared_ptr<const InferredCall> InferOnMeta(const c10::OperatorHandle& op,
                                                const OpTraits& traits,
                                                c10::ArrayRef<c10::IValue> args) {
  if (!traits.returns_only_tensors || DataDependent(traits, args) ||
      MetaDisagreesWithTheKernel(traits, args)) {
    return nullptr;
  }
  // A per-thread direct-mapped table in front of the shared cache answers
  // repeated calls without a lock or a copy of the key. Entries are immutable and a key always infers the same, so a
  // per-thread entry may outlive the shared cache's.
  struct LocalEntry {
    std::string key;
    std::shared_ptr<const InferredCall> inferred;
    bool used = false;
  };
  constexpr size_t kLocalEntries = 64;
  thread_local std::array<LocalEntry, kLocalEntries> local;
  KeyBuffer key_buffer;
  bool cacheable = true;
  {
    KeyWriter writer(op, traits.float_values_keep_metadata, &key_buffer);
    for (const c10::IValue& a : args) cacheable = cacheable && writer.Add(a);
  }
  if (!cacheable) return RunOnMeta(op, traits, args);
  const std::string_view key_view(key_buffer.data(), key_buffer.size());
  const size_t hash = KeyHash()(key_view);
  LocalEntry& entry = local[(hash ^ (hash >> 17)) % kLocalEntries];
  if (entry.used && entry.key == key_view) return entry.inferred;
  Cache& cache = GlobalCache();
  std::shared_ptr<const InferredCall> inferred;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.entries.find(key_view);
    if (it != cache.entries.end()) {
      inferred = it->second;
      found = true;
    }
  }
  std::string key(key_view);
  if (!found) {
    inferred = RunOnMeta(op, traits, args);
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.entries.size() >= kMaxCacheEntries) cache.entries.clear();
    cache.entries.emplace(key, inferred);
  }
  // Looked up again: a re-entrant call may have filled the slot meanwhile.
  LocalEntry& slot = local[(hash ^ (hash >> 17)) % kLocalEntries];
  slot.key = std::move(key);
  slot.inferred = inferred;
  slot.used = true;
  return inferred;
}

uint64_t MetaInferenceCount() { return meta_runs.load(std::memory_order_relaxed); }

}  // namespace torch_fl
