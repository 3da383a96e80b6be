// The daemon's ATen translation unit: everything that touches c10 types.
#include "ops/op_runner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Flags.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "execution/backend.h"
#include "byte_size.h"
#include "protocol/command_validation.h"
#include "flagos/op_executor.h"
#include "ops/host_mirror.h"
#include "logging.h"
#include "ops/op_argument_rules.h"
#include "ops/op_host_budget.h"
#include "ops/op_limits.h"
#include "ops/op_routes.h"
#include "ops/op_schema_match.h"

// c10's CPU allocator (c10/core/impl/alloc_cpu.cpp).
C10_DECLARE_bool(caffe2_cpu_allocator_do_zero_fill);

namespace flagos::daemon {
namespace {

using TypePtr = c10::TypePtr;
using c10::TypeKind;

std::string OpName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : absl::StrCat(name.name, ".", name.overload_name);
}

absl::string_view ValueKindName(const v1::Value& value) {
  switch (value.v_case()) {
    case v1::Value::kNone: return "none";
    case v1::Value::kI: return "i (int)";
    case v1::Value::kD: return "d (float)";
    case v1::Value::kB: return "b (bool)";
    case v1::Value::kC: return "c (complex)";
    case v1::Value::kS: return "s (string)";
    case v1::Value::kTensor: return "tensor";
    case v1::Value::kHostTensor: return "host_tensor";
    case v1::Value::kInts: return "ints";
    case v1::Value::kDoubles: return "doubles";
    case v1::Value::kBools: return "bools";
    case v1::Value::kList: return "list";
    case v1::Value::kDevice: return "device";
    case v1::Value::kGenerator: return "generator";
    case v1::Value::V_NOT_SET: return "an empty value";
  }
  return "unknown";
}

// A 64-bit mix (splitmix64's finaliser) so that nearby (seed, offset) pairs
// give unrelated generator seeds.
uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string SizesString(c10::IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

bool IsIntLike(TypeKind kind) {
  return kind == TypeKind::IntType || kind == TypeKind::SymIntType ||
         kind == TypeKind::ScalarTypeType || kind == TypeKind::LayoutType ||
         kind == TypeKind::MemoryFormatType || kind == TypeKind::QSchemeType;
}

// OK when `v` names a value of the enum an argument of type `kind` has
// (ATen indexes its tables with these unchecked: an out-of-range dtype
// would read past them); other int-like kinds take any value.
absl::Status CheckEnumValue(TypeKind kind, int64_t v) {
  int64_t count = -1;
  absl::string_view what;
  switch (kind) {
    case TypeKind::ScalarTypeType:
      count = static_cast<int64_t>(c10::ScalarType::Undefined);
      what = "ScalarType (dtype)";
      break;
    case TypeKind::LayoutType:
      count = static_cast<int64_t>(c10::Layout::NumOptions);
      what = "Layout";
      break;
    case TypeKind::MemoryFormatType:
      count = static_cast<int64_t>(c10::MemoryFormat::NumOptions);
      what = "MemoryFormat";
      break;
    case TypeKind::QSchemeType:
      count = static_cast<int64_t>(c10::COMPILE_TIME_NUM_QSCHEMES);
      what = "QScheme";
      break;
    default:
      return absl::OkStatus();
  }
  if (v >= 0 && v < count) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(v, " is not a ", what, " (valid: 0..", count - 1,
                                                 ")"));
}

// Why flagosd does not serve operator `schema` (PERMISSION_DENIED naming
// it), or OK. Refused whatever a client asks:
//   - views: an op that returns a tensor aliasing an argument it does not
//     write (aten::_reshape_alias, aten::as_strided, ...) builds a tensor
//     over memory the daemon never range-checked; torch_fl makes views in
//     the client and never forwards one;
//   - ops that reach the host beyond device memory: files (aten::from_file
//     reads and creates them as the daemon's user);
//   - ops whose kernels index their tensors by int arguments no rule of
//     op_argument_rules.h can bound (aten::_sobol_engine_*);
//   - ops taking raw storages, whose memory the daemon cannot check;
//   - ops outside ATen's namespace: distributed (c10d, symm_mem: networks,
//     other processes' memory), profiler, backend-specific and test ops,
//     which torch_fl never forwards (docs/reference/served-operators.md).
absl::Status CheckServable(const c10::FunctionSchema& schema, const std::string& full_name) {
  const auto refused = [&](absl::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat(
        "register_op ", full_name, ": flagosd does not run this operator: ", why,
        " (docs/reference/errors.md lists what is refused)"));
  };
  if (!absl::StartsWith(schema.name(), "aten::")) {
    return refused("it is not an ATen operator; flagosd runs only ATen's");
  }
  for (const c10::Argument& r : schema.returns()) {
    const c10::AliasInfo* alias = r.alias_info();
    if (alias != nullptr && !alias->isWrite()) {
      return refused("it returns a view of an argument; torch_fl computes views in the client");
    }
  }
  if (schema.name() == "aten::from_file") return refused("it reads and creates host files");
  if (absl::StartsWith(schema.name(), "aten::_sobol_engine_")) {
    // The state of torch.quasirandom.SobolEngine, which lives on the CPU
    // whatever the device: torch_fl never forwards these.
    return refused(
        "its kernel indexes its tensors by its int arguments (dimension, num_generated) "
        "without checking their sizes; torch.quasirandom.SobolEngine keeps them on the CPU");
  }
  for (const c10::Argument& a : schema.arguments()) {
    TypePtr type = a.real_type();
    if (type->kind() == TypeKind::OptionalType) type = type->containedType(0);
    if (type->kind() == TypeKind::StorageType) {
      return refused("it takes a raw storage, whose memory flagosd cannot check");
    }
  }
  return absl::OkStatus();
}

// The rules of op_argument_rules.h for `schema`'s op, bound to its arguments.
absl::StatusOr<BoundArgumentRules> BindArgumentRules(const c10::FunctionSchema& schema) {
  const OpArgumentRules* rules = FindOpArgumentRules(schema.name());
  if (rules == nullptr) return BoundArgumentRules();
  std::vector<SchemaArgument> arguments;
  for (const c10::Argument& a : schema.arguments()) {
    SchemaArgument argument{a.name(), std::nullopt, a.is_out()};
    if (a.default_value().has_value()) {
      const c10::IValue& d = *a.default_value();
      if (d.isInt()) argument.int_default = d.toInt();
      if (d.isBool()) argument.int_default = d.toBool() ? 1 : 0;
    }
    arguments.push_back(std::move(argument));
  }
  return BoundArgumentRules::Bind(rules->rules, arguments);
}

// The reason alone of a CheckServable refusal.
std::string ServableReason(const absl::Status& refused) {
  absl::string_view text = refused.message();
  constexpr absl::string_view kLead = "flagosd does not run this operator: ";
  if (size_t at = text.find(kLead); at != absl::string_view::npos) text.remove_prefix(at + kLead.size());
  if (size_t at = text.find(" (docs/"); at != absl::string_view::npos) text = text.substr(0, at);
  return std::string(text);
}

// CheckEnumValue for a decoded argument whose declared (real) type is an
// enum, an optional one or a list of them (decoding sees them as ints).
absl::Status CheckEnumArgument(const TypePtr& real_type, const c10::IValue& value) {
  TypePtr type = real_type;
  if (type->kind() == TypeKind::OptionalType) {
    if (value.isNone()) return absl::OkStatus();
    type = type->containedType(0);
  }
  if (type->kind() == TypeKind::ListType) {
    if (!value.isIntList()) return absl::OkStatus();
    const TypeKind element = type->containedType(0)->kind();
    for (int64_t v : value.toIntVector()) {
      if (absl::Status s = CheckEnumValue(element, v); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return value.isInt() ? CheckEnumValue(type->kind(), value.toInt()) : absl::OkStatus();
}

// How a return's type is handed back to the client.
enum class ReturnShape { kTensor, kTensorList, kOther };

ReturnShape ClassifyReturn(const TypePtr& type) {
  TypePtr t = type;
  if (t->kind() == TypeKind::OptionalType) t = t->expectRef<c10::OptionalType>().getElementType();
  if (t->kind() == TypeKind::TensorType) return ReturnShape::kTensor;
  if (t->kind() == TypeKind::ListType) {
    TypePtr element = t->expectRef<c10::ListType>().getElementType();
    if (element->kind() == TypeKind::OptionalType) {
      element = element->expectRef<c10::OptionalType>().getElementType();
    }
    if (element->kind() == TypeKind::TensorType) return ReturnShape::kTensorList;
  }
  return ReturnShape::kOther;
}

// Where a value sits in a call ("argument 'self' (#0)", "... element 2",
// "output 0", "out argument 'out'"), for error messages: the text is built
// only when one is reported.
class Where {
 public:
  static Where Argument(const std::string& name, size_t index) {
    return Where(Kind::kArgument, &name, static_cast<int>(index));
  }
  static Where Output(int index) { return Where(Kind::kOutput, nullptr, index); }
  static Where OutArgument(const std::string& name) {
    return Where(Kind::kOutArgument, &name, 0);
  }
  static Where Text(absl::string_view text) {
    Where where(Kind::kText, nullptr, 0);
    where.text_ = text;
    return where;
  }
  // Element `index` of the list this names; `*this` must outlive the result.
  Where Element(int index) const {
    Where where(Kind::kElement, nullptr, index);
    where.parent_ = this;
    return where;
  }

  std::string str() const {
    switch (kind_) {
      case Kind::kArgument: return absl::StrCat("argument '", *name_, "' (#", index_, ")");
      case Kind::kOutput: return absl::StrCat("output ", index_);
      case Kind::kOutArgument: return absl::StrCat("out argument '", *name_, "'");
      case Kind::kText: return std::string(text_);
      case Kind::kElement: return absl::StrCat(parent_->str(), " element ", index_);
    }
    return std::string();
  }

 private:
  enum class Kind { kArgument, kOutput, kOutArgument, kText, kElement };
  Where(Kind kind, const std::string* name, int index) : kind_(kind), name_(name), index_(index) {}

  Kind kind_;
  const std::string* name_ = nullptr;
  int index_ = 0;
  const Where* parent_ = nullptr;
  absl::string_view text_;
};

// Runs `fn`, turning exceptions (c10 ones included) into a status.
template <typename Fn>
absl::Status Guarded(const std::string& op_name, const Where& where, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(op_name, ": ", where.str(), ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op_name, ": ", where.str(), ": ", e.what()));
  }
}

// Tensors over device memory made by WrapDeviceMemory for earlier calls on
// this thread, handed out again for the same (backend, device, address,
// sizes, strides, dtype): a tiny op then costs no tensor construction. A
// tensor is reused only when nothing else holds it or its storage (the
// previous call's stack is gone) and it still is exactly as made (a kernel
// may restride an argument in place, or set_ it to other memory). The
// caller checks the range first, as for a fresh tensor: a kept tensor over
// memory since freed is never handed out for an address the session does
// not hold now. WrapDeviceMemory makes a plain view of the memory (it owns
// nothing), so a kept one is the tensor it would make again.
class WrappedTensorCache {
 public:
  static constexpr size_t kSlots = 64;  // direct-mapped, per thread
  static constexpr size_t kMaxRank = 6;

  struct Entry {
    const void* backend = nullptr;
    int device = -1;
    uint64_t addr = 0;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    size_t rank = 0;
    int64_t sizes[kMaxRank] = {};
    int64_t strides[kMaxRank] = {};
    // What the tensor was made as, to notice in-place metadata changes.
    const c10::StorageImpl* storage = nullptr;
    size_t storage_nbytes = 0;
    c10::DispatchKeySet key_set;
    at::Tensor tensor;
  };

  // A lookup's result: the tensor to reuse (hit), or where to keep a new one.
  struct Slot {
    bool hit = false;
    const at::Tensor* tensor = nullptr;
    Entry* entry = nullptr;  // nullptr: not cacheable (rank too high)
    void Keep(const at::Tensor& made) {
      if (entry == nullptr || !made.has_storage()) return;
      entry->tensor = made;
      entry->storage = made.storage().unsafeGetStorageImpl();
      entry->storage_nbytes = made.storage().nbytes();
      entry->key_set = made.key_set();
    }
  };

  static Slot Find(const void* backend, int device, uint64_t addr, c10::IntArrayRef sizes,
                   c10::IntArrayRef strides, c10::ScalarType dtype) {
    Slot slot;
    if (sizes.size() > kMaxRank || strides.size() != sizes.size()) return slot;
    thread_local std::array<Entry, kSlots> entries;
    uint64_t h = addr ^ (static_cast<uint64_t>(dtype) << 56) ^ (sizes.size() << 48);
    for (int64_t size : sizes) h = h * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(size);
    Entry& entry = entries[(h ^ (h >> 29)) % kSlots];
    slot.entry = &entry;
    if (entry.tensor.defined() && entry.backend == backend && entry.device == device &&
        entry.addr == addr && entry.dtype == dtype && entry.rank == sizes.size() &&
        std::equal(sizes.begin(), sizes.end(), entry.sizes) &&
        std::equal(strides.begin(), strides.end(), entry.strides) && Unchanged(entry)) {
      slot.hit = true;
      slot.tensor = &entry.tensor;
      return slot;
    }
    entry.tensor = at::Tensor();  // releases the previous occupant now
    entry.backend = backend;
    entry.device = device;
    entry.addr = addr;
    entry.dtype = dtype;
    entry.rank = sizes.size();
    std::copy(sizes.begin(), sizes.end(), entry.sizes);
    std::copy(strides.begin(), strides.end(), entry.strides);
    return slot;
  }

 private:
  static bool Unchanged(const Entry& entry) {
    const at::Tensor& t = entry.tensor;
    if (t.use_count() != 1 || !t.has_storage()) return false;
    const c10::Storage& storage = t.storage();
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    return storage.unsafeGetStorageImpl() == entry.storage && storage.use_count() == 1 &&
           storage.nbytes() == entry.storage_nbytes &&
           reinterpret_cast<uint64_t>(storage.data_ptr().get()) == entry.addr &&
           impl->storage_offset() == 0 && t.key_set() == entry.key_set &&
           t.scalar_type() == entry.dtype && !t.requires_grad() &&
           t.sizes().equals(c10::IntArrayRef(entry.sizes, entry.rank)) &&
           t.strides().equals(c10::IntArrayRef(entry.strides, entry.rank));
  }
};

// Decodes one call's arguments and handles its returns.
// Tensor results a session's calls asked the daemon to keep
// (OpCall.hold_results) until a place_result moves them into device memory.
class HeldResults {
 public:
  // A contiguous host tensor.
  absl::StatusOr<uint64_t> Hold(at::Tensor tensor) {
    absl::MutexLock lock(&mu_);
    if (held_.size() >= OpRunner::kMaxHeldResults) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the session holds ", held_.size(), " results not yet placed, the most flagosd keeps (",
          OpRunner::kMaxHeldResults, "); send place_result for them"));
    }
    const uint64_t id = next_id_++;
    held_.emplace(id, std::move(tensor));
    return id;
  }
  std::optional<at::Tensor> Find(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<at::Tensor> Take(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return std::nullopt;
    at::Tensor tensor = std::move(it->second);
    held_.erase(it);
    return tensor;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, at::Tensor> held_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

class CallContext {
 public:
  // `mirror`: the call's host copies on the cpu_fallback route; nullptr on
  // the native route.
  // `max_host_memory_bytes`: what each kernel call may hold (OpHostBudget).
  CallContext(const Backend& backend, int device, StreamHandle stream, const std::string& op_name,
              OpRunner::RangeCheck check, HostMirror* mirror, uint64_t max_host_memory_bytes)
      : backend_(backend),
        device_(device),
        stream_(stream),
        op_name_(op_name),
        check_(check),
        mirror_(mirror),
        max_host_memory_bytes_(max_host_memory_bytes) {}

  // Tensor returns are kept in `held` (reported as Value.held) instead of
  // being sent by value.
  void set_held_results(HeldResults* held) { held_ = held; }

  // Tensors decoded while this is set are arguments the kernel writes
  // (Tensor(a!)): on the cpu_fallback route their bytes go back to the
  // device after the call.
  void set_writing(bool writing) { writing_ = writing; }

  // The device the kernels of this call run on: the backend's for the
  // native route, the host's for cpu_fallback.
  c10::Device KernelDevice(int device) const {
    if (mirror_ != nullptr) return c10::Device(c10::kCPU);
    return backend_.native_executor()->AtenDevice(device);
  }

  // Runs `op` on the route's kernels, charging the host memory they
  // allocate on this thread to a budget of --max-op-host-memory.
  absl::Status CallKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpHostBudget budget(max_host_memory_bytes_);
    absl::Status status =
        mirror_ != nullptr ? backend_.host_executor().Call(device_, stream_, op, stack)
                           : backend_.native_executor()->Call(device_, stream_, op, stack);
    // However the kernel reported the refusal (kernels may catch and
    // rethrow it as another error), it is the budget's.
    if (!status.ok() && budget.refused()) return HostMemoryExhausted(budget);
    return status;
  }

  // cpu_fallback: adds the device memory `value` names (tensors, lists of
  // them) to the mirror, after checking its range. `read`: false for an
  // out= argument the kernel only writes.
  absl::Status MirrorValue(const v1::Value& value, bool out_argument, const Where& where) {
    if (value.has_tensor()) return MirrorRef(value.tensor(), out_argument, where);
    if (value.has_list()) {
      for (int i = 0; i < value.list().values_size(); ++i) {
        if (absl::Status s = MirrorValue(value.list().values(i), out_argument, where.Element(i));
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  }
  absl::Status MirrorRef(const v1::TensorRef& ref, bool write_only, const Where& where) {
    if (ref.undefined()) return absl::OkStatus();
    absl::StatusOr<TensorExtent> extent = CheckedExtent(ref, where);
    if (!extent.ok()) return extent.status();
    if (extent->numel == 0) return absl::OkStatus();
    // A dense tensor the kernel only writes need not be read first.
    const bool dense = extent->nbytes == static_cast<uint64_t>(extent->numel) * extent->itemsize;
    mirror_->Add(extent->begin, extent->nbytes, !(write_only && dense));
    return absl::OkStatus();
  }

  absl::StatusOr<c10::IValue> Decode(const v1::Value& value, const TypePtr& type,
                                     const Where& where) {
    const TypeKind kind = type->kind();
    if (kind == TypeKind::OptionalType) {
      if (value.has_none()) return c10::IValue();
      if (value.has_tensor() && value.tensor().undefined()) return c10::IValue();
      return Decode(value, type->expectRef<c10::OptionalType>().getElementType(), where);
    }
    const auto mismatch = [&]() {
      return absl::InvalidArgumentError(absl::StrCat(op_name_, ": ", where.str(), " has type ",
                                                     type->str(), " but the command sends ",
                                                     ValueKindName(value)));
    };
    if (IsIntLike(kind)) {
      if (!value.has_i()) return mismatch();
      return c10::IValue(value.i());
    }
    switch (kind) {
      case TypeKind::TensorType: {
        if (value.has_tensor()) {
          absl::StatusOr<at::Tensor> tensor = WrapTensor(value.tensor(), where);
          if (!tensor.ok()) return tensor.status();
          return c10::IValue(*std::move(tensor));
        }
        if (value.has_host_tensor()) {
          absl::StatusOr<at::Tensor> tensor = HostTensor(value.host_tensor(), where);
          if (!tensor.ok()) return tensor.status();
          return c10::IValue(*std::move(tensor));
        }
        return mismatch();
      }
      case TypeKind::FloatType:
      case TypeKind::SymFloatType:
        if (value.has_d()) return c10::IValue(value.d());
        if (value.has_i()) return c10::IValue(static_cast<double>(value.i()));
        return mismatch();
      case TypeKind::BoolType:
      case TypeKind::SymBoolType:
        if (!value.has_b()) return mismatch();
        return c10::IValue(value.b());
      case TypeKind::ComplexType:
        if (value.has_c()) return c10::IValue(c10::complex<double>(value.c().re(), value.c().im()));
        if (value.has_d()) return c10::IValue(c10::complex<double>(value.d(), 0));
        if (value.has_i()) return c10::IValue(c10::complex<double>(value.i(), 0));
        return mismatch();
      case TypeKind::NumberType:  // Scalar
        if (value.has_i()) return c10::IValue(value.i());
        if (value.has_d()) return c10::IValue(value.d());
        if (value.has_b()) return c10::IValue(value.b());
        if (value.has_c()) return c10::IValue(c10::complex<double>(value.c().re(), value.c().im()));
        return mismatch();
      case TypeKind::StringType:
        if (!value.has_s()) return mismatch();
        return c10::IValue(value.s());
      case TypeKind::DeviceObjType: {
        if (!value.has_device()) return mismatch();
        return DecodeDevice(value.device(), where);
      }
      case TypeKind::GeneratorType: {
        if (!value.has_generator()) return mismatch();
        if (KernelDevice(device_).type() != c10::kCPU) {
          return absl::UnimplementedError(absl::StrCat(
              op_name_, ": ", where.str(), ": random generators are not implemented for the ",
              backend_.name(), " backend"));
        }
        const v1::GeneratorValue& g = value.generator();
        return c10::IValue(
            at::make_generator<at::CPUGeneratorImpl>(Mix64(g.seed() ^ Mix64(g.offset()))));
      }
      case TypeKind::ListType:
        return DecodeList(value, type->expectRef<c10::ListType>().getElementType(), where);
      default:
        return absl::UnimplementedError(absl::StrCat(op_name_, ": ", where.str(), " has type ",
                                                     type->str(),
                                                     ", which flagosd cannot decode yet"));
    }
  }

  // A ref's extent, after checking its descriptor, its device and its range.
  absl::StatusOr<TensorExtent> CheckedExtent(const v1::TensorRef& ref, const Where& where) {
    absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(ref);
    if (!extent.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": ", where.str(), ": ", extent.status().message()));
    }
    const int device_count = backend_.runtime().DeviceCount();
    if (ref.device() < 0 || ref.device() >= device_count) {
      return CheckDevice(ref.device(), device_count, absl::StrCat(op_name_, ": ", where.str()));
    }
    if (mirror_ != nullptr && ref.device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_name_, ": ", where.str(), " is on ", DeviceName(ref.device()), " but the op runs on ",
          DeviceName(device_), "; the ", backend_.name(),
          " backend's cpu_fallback route takes operands of one device (copy it there first)"));
    }
    // An empty tensor reads and writes nothing (and its address may be 0);
    // its storage cannot grow, so no kernel can write through it.
    if (extent->numel > 0) {
      if (absl::Status s = check_(ref.device(), extent->begin, extent->nbytes); !s.ok()) return s;
    }
    return extent;
  }

  // A tensor over device memory (native route) or over its host copy
  // (cpu_fallback), after checking its descriptor and range.
  absl::StatusOr<at::Tensor> WrapTensor(const v1::TensorRef& ref, const Where& where) {
    if (ref.undefined()) return at::Tensor();
    absl::StatusOr<TensorExtent> extent = CheckedExtent(ref, where);
    if (!extent.ok()) return extent.status();
    // The ref's repeated fields are contiguous int64s: no copies.
    const c10::IntArrayRef sizes(ref.sizes().data(), ref.sizes_size());
    const c10::IntArrayRef strides(ref.strides().data(), ref.strides_size());
    const auto dtype = static_cast<c10::ScalarType>(ref.dtype());
    at::Tensor tensor;
    absl::Status status = Guarded(op_name_, where, [&]() {
      if (mirror_ != nullptr) {
        // The host copy; an empty tensor has no bytes to copy.
        const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(c10::kCPU);
        if (extent->numel == 0) {
          tensor = at::empty_strided(sizes, strides, options);
        } else {
          tensor = at::from_blob(mirror_->Address(extent->begin), sizes, strides, options);
          if (writing_) mirror_->MarkWritten(extent->begin, extent->nbytes);
        }
      } else {
        // An empty tensor is wrapped over no memory (address 0), never the
        // address the client sent: its range is not checked (it spans no
        // bytes), so a kernel that touches data_ptr() of an empty tensor
        // anyway must not reach memory the session does not own.
        const uint64_t addr = extent->numel == 0 ? 0 : extent->begin;
        WrappedTensorCache::Slot slot =
            WrappedTensorCache::Find(&backend_, ref.device(), addr, sizes, strides, dtype);
        if (slot.hit) {
          tensor = *slot.tensor;
        } else {
          tensor = backend_.native_executor()->WrapDeviceMemory(ref.device(), addr, sizes,
                                                                strides, dtype);
          slot.Keep(tensor);
        }
      }
      // The client's lazy conj/neg bits, as views the kernels understand.
      if (ref.conj()) tensor = tensor._conj();
      if (ref.neg()) tensor = tensor._neg_view();
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return tensor;
  }

  // Handles the returns left on `stack` by the call.
  absl::Status TakeReturns(const c10::FunctionSchema& schema, const v1::OpCall& call,
                           torch::jit::Stack* stack, v1::Completion* completion) {
    const std::vector<c10::Argument>& returns = schema.returns();
    if (stack->size() != returns.size()) {
      return absl::InternalError(absl::StrCat(op_name_, ": the kernel left ", stack->size(),
                                              " values, the schema declares ", returns.size(),
                                              " returns"));
    }
    int next_output = 0;
    const bool to_outputs = call.outputs_size() > 0;
    for (size_t i = 0; i < returns.size(); ++i) {
      const c10::Argument& ret = returns[i];
      const c10::IValue& value = (*stack)[i];
      // With want_values every return gets one Value, in schema order; a
      // return the client already holds (written in place, or copied into
      // `outputs`) is none.
      v1::Value* carried = call.want_values() ? completion->add_values() : nullptr;
      if (ret.alias_info() != nullptr && ret.alias_info()->isWrite()) {
        if (carried != nullptr) carried->set_none(true);
        continue;
      }
      const ReturnShape shape = ClassifyReturn(ret.type());
      if (shape == ReturnShape::kOther || !to_outputs) {
        if (carried == nullptr) continue;
        if (absl::Status s = Encode(value, carried); !s.ok()) return s;
        continue;
      }
      if (carried != nullptr) carried->set_none(true);
      if (shape == ReturnShape::kTensor) {
        absl::Status s = CopyOut(value.isNone() ? at::Tensor() : value.toTensor(), call,
                                 &next_output);
        if (!s.ok()) return s;
        continue;
      }
      for (const c10::IValue& element : value.toListRef()) {
        absl::Status s = CopyOut(element.isNone() ? at::Tensor() : element.toTensor(), call,
                                 &next_output);
        if (!s.ok()) return s;
      }
    }
    if (to_outputs && next_output != call.outputs_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": the command has ", call.outputs_size(),
                       " outputs but the op returned ", next_output, " tensors to copy"));
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<c10::IValue> DecodeDevice(const v1::DeviceValue& device, const Where& where) {
    if (device.type() == "cpu") return c10::IValue(c10::Device(c10::kCPU));
    const int index = device.index() < 0 ? device_ : device.index();
    const int device_count = backend_.runtime().DeviceCount();
    if (index < 0 || index >= device_count) {
      return CheckDevice(index, device_count, absl::StrCat(op_name_, ": ", where.str()));
    }
    return c10::IValue(KernelDevice(index));
  }

  absl::StatusOr<c10::IValue> DecodeList(const v1::Value& value, const TypePtr& element,
                                         const Where& where) {
    const TypeKind kind = element->kind();
    const auto mismatch = [&]() {
      return absl::InvalidArgumentError(absl::StrCat(op_name_, ": ", where.str(), " has type ",
                                                     element->str(), "[] but the command sends ",
                                                     ValueKindName(value)));
    };
    const auto element_where = [&](int i) { return where.Element(i); };
    if (IsIntLike(kind)) {
      std::vector<int64_t> ints;
      if (value.has_ints()) {
        ints.assign(value.ints().values().begin(), value.ints().values().end());
      } else if (value.has_list()) {
        for (const v1::Value& v : value.list().values()) {
          if (!v.has_i()) return mismatch();
          ints.push_back(v.i());
        }
      } else {
        return mismatch();
      }
      return c10::IValue(std::move(ints));
    }
    if (kind == TypeKind::FloatType) {
      if (!value.has_doubles()) return mismatch();
      return c10::IValue(
          std::vector<double>(value.doubles().values().begin(), value.doubles().values().end()));
    }
    if (kind == TypeKind::BoolType) {
      if (!value.has_bools()) return mismatch();
      c10::List<bool> bools;
      for (bool b : value.bools().values()) bools.push_back(b);
      return c10::IValue(std::move(bools));
    }
    if (!value.has_list()) return mismatch();
    const auto& values = value.list().values();
    if (kind == TypeKind::TensorType) {
      c10::List<at::Tensor> tensors;
      for (int i = 0; i < values.size(); ++i) {
        absl::StatusOr<c10::IValue> t = Decode(values[i], element, element_where(i));
        if (!t.ok()) return t.status();
        tensors.push_back(std::move(*t).toTensor());
      }
      return c10::IValue(std::move(tensors));
    }
    if (kind == TypeKind::OptionalType &&
        element->expectRef<c10::OptionalType>().getElementType()->kind() ==
            TypeKind::TensorType) {
      c10::List<std::optional<at::Tensor>> tensors;
      for (int i = 0; i < values.size(); ++i) {
        absl::StatusOr<c10::IValue> t = Decode(values[i], element, element_where(i));
        if (!t.ok()) return t.status();
        if (t->isNone()) {
          tensors.push_back(std::nullopt);
        } else {
          tensors.push_back(std::move(*t).toTensor());
        }
      }
      return c10::IValue(std::move(tensors));
    }
    c10::impl::GenericList list(element);
    for (int i = 0; i < values.size(); ++i) {
      absl::StatusOr<c10::IValue> v = Decode(values[i], element, element_where(i));
      if (!v.ok()) return v.status();
      list.push_back(*std::move(v));
    }
    return c10::IValue(std::move(list));
  }

  // A tensor holding a copy of `host`'s bytes. Dimensionless host tensors
  // stay on the CPU (PyTorch accepts CPU scalars next to device tensors).
  absl::StatusOr<at::Tensor> HostTensor(const v1::HostTensor& host, const Where& where) {
    absl::StatusOr<int64_t> numel = CheckHostTensor(host);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_name_, ": ", where.str(), ": ", numel.status().message()));
    }
    at::Tensor tensor;
    absl::Status status = Guarded(op_name_, where, [&]() {
      std::vector<int64_t> sizes(host.sizes().begin(), host.sizes().end());
      const auto dtype = static_cast<c10::ScalarType>(host.dtype());
      tensor = at::empty(sizes, at::TensorOptions().dtype(dtype));
      if (!host.data().empty()) {
        std::memcpy(tensor.data_ptr(), host.data().data(), host.data().size());
      }
      if (host.wrapped_number() && tensor.dim() == 0) {
        tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
      }
      // It stays a host tensor: the kernels of both routes run on the CPU
      // today (a native route on device kernels would upload it through
      // the runtime, never with an ATen device copy).
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return tensor;
  }

  // Copies one tensor return into the next output ref.
  absl::Status CopyOut(const at::Tensor& result, const v1::OpCall& call, int* next_output) {
    if (*next_output >= call.outputs_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_name_, ": the op returned more tensors than the command's ", call.outputs_size(),
          " outputs"));
    }
    const int index = (*next_output)++;
    const v1::TensorRef& ref = call.outputs(index);
    if (ref.undefined() || !result.defined()) return absl::OkStatus();
    const Where where = Where::Output(index);
    writing_ = true;
    absl::StatusOr<at::Tensor> destination = WrapTensor(ref, where);
    if (!destination.ok()) return destination.status();
    return CopyInto(*destination, result, where);
  }

 public:
  // Copies a result into device memory; the sizes must agree.
  absl::Status CopyInto(const at::Tensor& destination, const at::Tensor& result,
                        const Where& where) {
    if (destination.sizes() != result.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_name_, ": ", where.str(), " has sizes ", SizesString(destination.sizes()),
          " but the op produced sizes ", SizesString(result.sizes()),
          "; the client's shape inference disagrees with the kernel"));
    }
    static const c10::OperatorHandle copy =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    torch::jit::Stack stack{c10::IValue(destination), c10::IValue(result), c10::IValue(false)};
    absl::Status status = CallKernel(copy, &stack);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(op_name_, ": copying ", where.str(), ": ",
                                                      status.message()));
    }
    return absl::OkStatus();
  }

  // A tensor returned by value (contiguous bytes) in `out`.
  absl::Status EncodeByValue(const at::Tensor& tensor, v1::Value* out) {
    return EncodeHostTensor(tensor, out);
  }

 private:
  absl::Status Encode(const c10::IValue& value, v1::Value* out) {
    if (value.isNone()) {
      out->set_none(true);
    } else if (value.isInt()) {
      out->set_i(value.toInt());
    } else if (value.isSymInt()) {
      std::optional<int64_t> i = value.toSymInt().maybe_as_int();
      if (!i.has_value()) return Unencodable(value);
      out->set_i(*i);
    } else if (value.isDouble()) {
      out->set_d(value.toDouble());
    } else if (value.isBool()) {
      out->set_b(value.toBool());
    } else if (value.isComplexDouble()) {
      const c10::complex<double> c = value.toComplexDouble();
      out->mutable_c()->set_re(c.real());
      out->mutable_c()->set_im(c.imag());
    } else if (value.isString()) {
      out->set_s(value.toStringRef());
    } else if (value.isIntList()) {
      for (int64_t i : value.toIntVector()) out->mutable_ints()->add_values(i);
    } else if (value.isDoubleList()) {
      for (double d : value.toDoubleVector()) out->mutable_doubles()->add_values(d);
    } else if (value.isBoolList()) {
      for (bool b : value.toBoolList()) out->mutable_bools()->add_values(b);
    } else if (value.isDevice()) {
      const c10::Device device = value.toDevice();
      out->mutable_device()->set_type(c10::DeviceTypeName(device.type(), /*lower_case=*/true));
      out->mutable_device()->set_index(device.index());
    } else if (value.isTensor()) {
      if (held_ != nullptr && value.toTensor().defined()) return Hold(value.toTensor(), out);
      return EncodeHostTensor(value.toTensor(), out);
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        if (absl::Status s = Encode(element, out->mutable_list()->add_values()); !s.ok()) return s;
      }
      if (value.toListRef().empty()) out->mutable_list();
    } else if (value.isTuple()) {
      for (const c10::IValue& element : value.toTupleRef().elements()) {
        if (absl::Status s = Encode(element, out->mutable_list()->add_values()); !s.ok()) return s;
      }
    } else {
      return Unencodable(value);
    }
    return absl::OkStatus();
  }

  absl::Status EncodeHostTensor(const at::Tensor& tensor, v1::Value* out) {
    if (!tensor.defined()) {
      out->set_none(true);
      return absl::OkStatus();
    }
    if (!tensor.device().is_cpu()) {
      return absl::InternalError(absl::StrCat(
          op_name_, ": the kernel returned a ", tensor.device().str(),
          " tensor to send back by value; flagosd sends only host tensors"));
    }
    return Guarded(op_name_, Where::Text("returning a tensor by value"), [&]() {
      const at::Tensor host = tensor.contiguous();
      v1::HostTensor* h = out->mutable_host_tensor();
      for (int64_t size : host.sizes()) h->add_sizes(size);
      h->set_dtype(static_cast<int>(host.scalar_type()));
      h->set_data(static_cast<const char*>(host.const_data_ptr()), host.nbytes());
      return absl::OkStatus();
    });
  }

  absl::Status Hold(const at::Tensor& tensor, v1::Value* out) {
    if (!tensor.device().is_cpu()) {
      return absl::InternalError(absl::StrCat(op_name_, ": the kernel returned a ",
                                              tensor.device().str(), " tensor to hold"));
    }
    at::Tensor contiguous;
    absl::Status status = Guarded(op_name_, Where::Text("holding a result"), [&]() {
      contiguous = tensor.resolve_conj().resolve_neg().contiguous();
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    v1::HeldTensor* h = out->mutable_held();
    for (int64_t size : contiguous.sizes()) h->add_sizes(size);
    h->set_dtype(static_cast<int>(contiguous.scalar_type()));
    absl::StatusOr<uint64_t> id = held_->Hold(std::move(contiguous));
    if (!id.ok()) return id.status();
    h->set_id(*id);
    return absl::OkStatus();
  }

  absl::Status Unencodable(const c10::IValue& value) {
    return absl::UnimplementedError(absl::StrCat(op_name_, ": a return of kind ", value.tagKind(),
                                                 " cannot be sent back by flagosd yet"));
  }

  absl::Status HostMemoryExhausted(const OpHostBudget& budget) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        op_name_, ": its kernel asked for ", budget.refused_bytes(), " bytes of host memory while "
        "holding ", budget.charged_when_refused(), "; an op's kernel may hold at most ",
        budget.limit_bytes(), " bytes (--max-op-host-memory=", FormatByteSize(budget.limit_bytes()),
        "); split the work into smaller calls, or start flagosd with a larger "
        "--max-op-host-memory"));
  }

  const Backend& backend_;
  const int device_;
  const StreamHandle stream_;
  const std::string& op_name_;
  OpRunner::RangeCheck check_;
  HostMirror* const mirror_;
  const uint64_t max_host_memory_bytes_;
  HeldResults* held_ = nullptr;
  bool writing_ = false;
};

// An out= argument and the resizable tensor the kernel writes instead.
struct OutArgument {
  const std::string* name;  // the schema's
  at::Tensor destination;   // over the session's segment
  at::Tensor scratch;
};

// A registered operator and what every call of it needs, worked out once.
// The out= overload of a functional op: the same arguments (names and
// types), then one Tensor(a!) out argument per return, every return a plain
// Tensor. (Overload names do not follow one pattern: add.Tensor's is
// add.out, sum.dim_IntList's sum.IntList_out.)
std::optional<c10::OperatorHandle> FindOutVariant(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::Argument>& arguments = schema.arguments();
  const std::vector<c10::Argument>& returns = schema.returns();
  if (returns.empty()) return std::nullopt;
  for (const c10::Argument& argument : arguments) {
    if (argument.alias_info() != nullptr) return std::nullopt;  // not functional
  }
  for (const c10::Argument& ret : returns) {
    if (ret.type()->kind() != TypeKind::TensorType || ret.alias_info() != nullptr) {
      return std::nullopt;
    }
  }
  // Every overload name of every operator, once.
  static const auto* const overloads = [] {
    auto* map = new absl::flat_hash_map<std::string, std::vector<std::string>>();
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      (*map)[name.name].push_back(name.overload_name);
    }
    return map;
  }();
  auto it = overloads->find(op.operator_name().name);
  if (it == overloads->end()) return std::nullopt;
  for (const std::string& overload : it->second) {
    std::optional<c10::OperatorHandle> candidate =
        c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.operator_name().name, overload));
    if (!candidate.has_value() || candidate->operator_name() == op.operator_name()) continue;
    const std::vector<c10::Argument>& out_arguments = candidate->schema().arguments();
    if (out_arguments.size() != arguments.size() + returns.size() ||
        candidate->schema().returns().size() != returns.size()) {
      continue;
    }
    bool matches = true;
    for (size_t i = 0; i < arguments.size() && matches; ++i) {
      matches = out_arguments[i].name() == arguments[i].name() &&
                *out_arguments[i].type() == *arguments[i].type();
    }
    for (size_t i = arguments.size(); i < out_arguments.size() && matches; ++i) {
      matches = out_arguments[i].is_out() &&
                out_arguments[i].type()->kind() == TypeKind::TensorType;
    }
    if (matches) return candidate;
  }
  return std::nullopt;
}

struct RegisteredOp {
  RegisteredOp(const c10::OperatorHandle& handle, std::string name, OpRoute route,
               BoundArgumentRules rules)
      : handle(handle),
        name(std::move(name)),
        route(route),
        rules(std::move(rules)),
        out_variant(FindOutVariant(handle)) {
    for (const c10::Argument& argument : handle.schema().arguments()) {
      has_out_arguments |= argument.is_out();
    }
  }

  c10::OperatorHandle handle;
  // "aten::add.Tensor": errors name the op so.
  std::string name;
  OpRoute route;
  // What its kernel assumes of its arguments' sizes (op_argument_rules.h).
  BoundArgumentRules rules;
  bool has_out_arguments = false;
  // The out= overload that writes the results straight into the client's
  // output tensors; unset once it failed where the functional op did not
  // (kernels such as mse_loss.out resize their out tensor as scratch space,
  // which memory over a segment cannot do).
  std::optional<c10::OperatorHandle> out_variant;
  mutable std::atomic<bool> out_variant_works{true};
};

// The boxed stack of a call: one vector per thread, reused (no allocation
// per call), emptied when the call is over. A nested call on the thread (none
// is expected) gets a stack of its own.
class StackLease {
 public:
  StackLease() : stack_(Acquire()) { stack_.clear(); }
  ~StackLease() {
    stack_.clear();
    if (&stack_ == &Shared()) InUse() = false;
  }
  StackLease(const StackLease&) = delete;
  StackLease& operator=(const StackLease&) = delete;
  torch::jit::Stack& get() { return stack_; }

 private:
  static torch::jit::Stack& Shared() {
    thread_local torch::jit::Stack stack;
    return stack;
  }
  static bool& InUse() {
    thread_local bool in_use = false;
    return in_use;
  }
  torch::jit::Stack& Acquire() {
    if (InUse()) return own_;
    InUse() = true;
    return Shared();
  }

  torch::jit::Stack own_;
  torch::jit::Stack& stack_;
};

class OpRunnerImpl final : public OpRunner {
 public:
  OpRunnerImpl(const Backend& backend, const OpLimits& limits)
      : backend_(backend), limits_(limits) {
    for (auto& slot : dense_) slot.store(nullptr, std::memory_order_relaxed);
  }

  absl::Status Register(uint32_t op_id, const std::string& name, const std::string& overload,
                        const std::string& schema,
                        const std::string& client_torch_version) override {
    if (name.size() + overload.size() > kMaxOpNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register_op: an operator name of ", name.size() + overload.size(),
          " bytes (starting '", absl::CEscape(name.substr(0, 32)), "'); the limit is ",
          kMaxOpNameBytes));
    }
    const std::string full_name = overload.empty() ? name : absl::StrCat(name, ".", overload);
    if (op_id == 0 || op_id > kMaxOpId) {
      return absl::InvalidArgumentError(absl::StrCat("register_op ", full_name, ": op id ", op_id,
                                                     " is out of range (1 .. 2^31-1)"));
    }
    std::optional<c10::OperatorHandle> handle;
    try {
      handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName(name, overload));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("register_op ", full_name, ": ", e.what()));
    }
    if (!handle.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "operator ", full_name, " is not registered in flagosd's torch ", TorchVersion(),
          " (the client's is ", client_torch_version.empty() ? "unknown" : client_torch_version,
          ")"));
    }
    if (absl::Status s = CheckClientSchema(handle->schema(), schema, client_torch_version,
                                           full_name);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckServable(handle->schema(), full_name); !s.ok()) return s;
    absl::StatusOr<BoundArgumentRules> rules = BindArgumentRules(handle->schema());
    if (!rules.ok()) return rules.status();
    std::string registered_name = OpName(handle->operator_name());
    const OpRoute route = backend_.routes().RouteOf(registered_name);
    auto registered = std::make_unique<RegisteredOp>(*handle, std::move(registered_name), route,
                                                     *std::move(rules));
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = ops_.try_emplace(op_id, std::move(registered));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register_op ", full_name, ": op id ", op_id,
          " is already registered in this session (as ", it->second->name, "); mint a new id"));
    }
    if (op_id < kDenseOps) dense_[op_id].store(it->second.get(), std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status PlaceResult(int device, StreamHandle stream, const v1::PlaceResult& place,
                           RangeCheck check) override {
    // Found now, forgotten once the destination checked out (a bad
    // place_result leaves it held).
    std::optional<at::Tensor> held = held_.Find(place.id());
    if (!held.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "place_result: no held result ", place.id(),
          " in this session (placed already, or never held: hold_results on the op)"));
    }
    const v1::TensorRef& dst = place.dst();
    absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(dst);
    if (!extent.ok()) return extent.status();
    const bool same_shape =
        c10::IntArrayRef(dst.sizes().data(), dst.sizes_size()) == held->sizes() &&
        dst.dtype() == static_cast<int>(held->scalar_type());
    const uint64_t nbytes = held->nbytes();
    if (!same_shape || extent->nbytes != nbytes ||
        !c10::IntArrayRef(dst.strides().data(), dst.strides_size())
             .equals(c10::contiguous_strides(held->sizes()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "place_result ", place.id(), ": the destination must be contiguous with sizes ",
          SizesString(held->sizes()), " and dtype ", c10::toString(held->scalar_type())));
    }
    if (dst.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat("place_result ", place.id(),
                                                     ": the destination is on ",
                                                     DeviceName(dst.device()), ", the command on ",
                                                     DeviceName(device)));
    }
    if (nbytes > 0) {
      if (absl::Status s = check(device, extent->begin, nbytes); !s.ok()) return s;
    }
    held_.Take(place.id());
    if (nbytes == 0) return absl::OkStatus();
    DeviceRuntime& runtime = backend_.runtime();
    if (absl::Status s = runtime.CopyHostToDevice(device, stream, extent->begin,
                                                  held->const_data_ptr(), nbytes);
        !s.ok()) {
      return s;
    }
    // The bytes stay alive until the device has read them.
    auto keep = std::make_shared<at::Tensor>(*std::move(held));
    if (!runtime.LaunchHostFunc(device, stream, [keep](absl::Status) mutable { keep.reset(); })
             .ok()) {
      return runtime.SynchronizeStream(device, stream);
    }
    return absl::OkStatus();
  }

  absl::Status Run(int device, StreamHandle stream, const v1::OpCall& call, RangeCheck check,
                   v1::Completion* completion) override {
    try {
      return RunUnguarded(device, stream, call, check, completion);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("op id ", call.op_id(), ": ",
                                                     e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("op id ", call.op_id(), ": ", e.what()));
    }
  }

  OpRoute RouteOf(uint32_t op_id) override {
    const RegisteredOp* op = Find(op_id);
    return op == nullptr ? OpRoute::kNative : op->route;
  }

 private:
  // Ids below this (clients mint them from 1) are found without a lock.
  static constexpr uint32_t kDenseOps = 4096;

  const RegisteredOp* Find(uint32_t op_id) {
    if (op_id < kDenseOps) {
      if (const RegisteredOp* op = dense_[op_id].load(std::memory_order_acquire)) return op;
    }
    absl::ReaderMutexLock lock(&mu_);
    auto it = ops_.find(op_id);
    return it == ops_.end() ? nullptr : it->second.get();
  }

  absl::Status RunUnguarded(int device, StreamHandle stream, const v1::OpCall& call,
                            RangeCheck check, v1::Completion* completion) {
    const RegisteredOp* registered = Find(call.op_id());
    if (registered == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("op id ", call.op_id(),
                                                     " is not registered in this session; send "
                                                     "register_op before using it"));
    }
    const c10::OperatorHandle& op = registered->handle;
    const std::string& op_name = registered->name;
    const c10::FunctionSchema& schema = op.schema();
    const std::vector<c10::Argument>& arguments = schema.arguments();
    if (static_cast<size_t>(call.args_size()) > arguments.size()) {
      return absl::InvalidArgumentError(absl::StrCat(op_name, " takes ", arguments.size(),
                                                     " arguments but the command sends ",
                                                     call.args_size()));
    }
    // Before anything is decoded or copied: the call's work is bounded.
    if (const OpCallElements elements = CountOpCallElements(call);
        elements.total > limits_.max_elements) {
      return TooManyElements(op_name, arguments, elements);
    }
    // Before any kernel: arguments whose kernel trusts their sizes have them.
    if (!registered->rules.empty()) {
      if (absl::Status s = registered->rules.Check(call, op_name); !s.ok()) return s;
    }
    // cpu_fallback: the device memory the call names is copied to the host
    // first (and written back at the end).
    std::optional<HostMirror> mirror;
    if (registered->route == OpRoute::kCpuFallback) {
      mirror.emplace(backend_.runtime(), device, stream);
    }
    CallContext context(backend_, device, stream, op_name, check,
                        mirror.has_value() ? &*mirror : nullptr, limits_.max_host_memory_bytes);
    if (call.want_values() && call.hold_results()) context.set_held_results(&held_);
    if (mirror.has_value()) {
      for (int i = 0; i < call.args_size() && i < static_cast<int>(arguments.size()); ++i) {
        if (absl::Status s = context.MirrorValue(call.args(i), arguments[i].is_out(),
                                                 Where::Argument(arguments[i].name(), i));
            !s.ok()) {
          return s;
        }
      }
      for (int i = 0; i < call.outputs_size(); ++i) {
        if (absl::Status s = context.MirrorRef(call.outputs(i), /*write_only=*/true,
                                               Where::Output(i));
            !s.ok()) {
          return s;
        }
      }
      if (absl::Status s = mirror->Fetch(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(op_name, ": reading its operands for the "
                                                   "cpu_fallback route: ", s.message()));
      }
    }
    StackLease lease;
    torch::jit::Stack& stack = lease.get();
    stack.reserve(arguments.size() + call.outputs_size());
    // Results written once: a functional op whose client sent an output for
    // every return runs as its out= overload, straight into those outputs.
    const bool into_outputs =
        registered->out_variant.has_value() &&
        registered->out_variant_works.load(std::memory_order_relaxed) && !call.want_values() &&
        call.outputs_size() == static_cast<int>(schema.returns().size()) &&
        std::none_of(call.outputs().begin(), call.outputs().end(), [](const v1::TensorRef& ref) {
          return ref.undefined() || ref.conj() || ref.neg();
        });
    if (into_outputs) {
      absl::Status s = DecodeArguments(context, op_name, arguments, call, &stack);
      // What each output is made as: an out= kernel may change its out
      // tensor in place (max_unpool2d.out restrides it to the input's memory
      // format), which would leave the bytes in another layout.
      std::vector<std::pair<at::Tensor, const void*>> made;
      for (int i = 0; s.ok() && i < call.outputs_size(); ++i) {
        context.set_writing(true);
        absl::StatusOr<at::Tensor> out = context.WrapTensor(call.outputs(i), Where::Output(i));
        if (out.ok()) {
          made.emplace_back(*out, out->data_ptr());
          stack.push_back(c10::IValue(*std::move(out)));
        } else {
          s = out.status();
        }
      }
      context.set_writing(false);
      if (s.ok()) {
        if (mirror.has_value()) mirror->Snapshot();
        s = CallOp(context, *registered->out_variant, call, &stack);
        if (s.ok() && OutputsIntact(call, made)) return WriteBack(op_name, mirror);
      }
      // The functional op below says what is wrong, or does what the out=
      // kernel could not (then the out= overload is not tried again).
      stack.clear();
    }
    if (absl::Status s = DecodeArguments(context, op_name, arguments, call, &stack); !s.ok()) {
      return s;
    }
    // out= arguments: kernels may resize them internally (mse_loss.out uses
    // its out tensor as scratch space), which memory over a segment cannot
    // do. The kernel gets a resizable tensor of the same shape; its result
    // is copied into the segment afterwards.
    std::vector<OutArgument> outs;
    if (registered->has_out_arguments) {
      for (size_t i = 0; i < arguments.size(); ++i) {
        if (!arguments[i].is_out() || !stack[i].isTensor()) continue;
        const at::Tensor destination = stack[i].toTensor();
        if (!destination.defined()) continue;
        at::Tensor scratch = at::empty_strided(destination.sizes(), destination.strides(),
                                               destination.options());
        stack[i] = c10::IValue(scratch);
        outs.push_back(OutArgument{&arguments[i].name(), destination, std::move(scratch)});
      }
    }
    context.set_writing(false);
    // On an error before WriteBack the mirror's buffers are released at
    // once: the only device work on them, Fetch's copies, has completed.
    if (mirror.has_value()) mirror->Snapshot();
    if (absl::Status s = CallOp(context, op, call, &stack); !s.ok()) return s;
    // On the synchronous path (want_values, no outputs) an out= argument the
    // kernel resized (a data-dependent size) cannot land in the client's
    // segment: it travels back by value and the client resizes and uploads.
    const bool synchronous = call.want_values() && call.outputs_size() == 0;
    std::vector<const OutArgument*> resized;
    for (const OutArgument& out : outs) {
      if (synchronous && out.scratch.sizes() != out.destination.sizes()) {
        resized.push_back(&out);
        continue;
      }
      if (absl::Status s = context.CopyInto(out.destination, out.scratch,
                                            Where::OutArgument(*out.name));
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = context.TakeReturns(schema, call, &stack, completion); !s.ok()) return s;
    if (synchronous) {
      // After one Value per return: one per written tensor argument, in
      // argument order — its new contents if it was resized, else none.
      for (size_t i = 0; i < arguments.size(); ++i) {
        const c10::AliasInfo* alias = arguments[i].alias_info();
        if (alias == nullptr || !alias->isWrite() ||
            arguments[i].real_type()->kind() != c10::TypeKind::TensorType) {
          continue;
        }
        v1::Value* value = completion->add_values();
        value->set_none(true);
        for (const OutArgument* out : resized) {
          if (*out->name != arguments[i].name()) continue;
          if (absl::Status s = context.EncodeByValue(out->scratch, value); !s.ok()) return s;
        }
      }
    }
    if (into_outputs) registered->out_variant_works.store(false, std::memory_order_relaxed);
    return WriteBack(op_name, mirror);
  }

  // RESOURCE_EXHAUSTED for a call naming more elements than
  // --max-op-elements, naming its largest tensor.
  absl::Status TooManyElements(const std::string& op_name,
                               const std::vector<c10::Argument>& arguments,
                               const OpCallElements& elements) const {
    std::string where;
    if (elements.output) {
      where = Where::Output(elements.index).str();
    } else if (static_cast<size_t>(elements.index) < arguments.size()) {
      where = Where::Argument(arguments[elements.index].name(), elements.index).str();
    } else {
      where = absl::StrCat("argument #", elements.index);
    }
    if (elements.element >= 0) absl::StrAppend(&where, " element ", elements.element);
    const std::string total = elements.total == std::numeric_limits<uint64_t>::max()
                                  ? std::string("more than 2^64")
                                  : absl::StrCat(elements.total);
    return absl::ResourceExhaustedError(absl::StrCat(
        op_name, ": the call names ", total, " tensor elements, more than the ",
        limits_.max_elements, " an op may process (--max-op-elements); the largest is ", where,
        " with ", elements.largest, " elements (sizes [",
        absl::StrJoin(*elements.largest_sizes, ", "), "]); split the work into smaller calls, or "
        "start flagosd with a larger --max-op-elements"));
  }

  // Whether every output still is the tensor the client described (sizes,
  // strides, memory, no lazy conj/neg bit: linalg_lu_solve.out may set the
  // conj bit of its out tensor instead of conjugating) after an out= kernel
  // wrote it.
  static bool OutputsIntact(const v1::OpCall& call,
                            const std::vector<std::pair<at::Tensor, const void*>>& made) {
    for (int i = 0; i < call.outputs_size(); ++i) {
      const v1::TensorRef& ref = call.outputs(i);
      const at::Tensor& t = made[i].first;
      if (t.sizes() != c10::IntArrayRef(ref.sizes().data(), ref.sizes_size()) ||
          t.strides() != c10::IntArrayRef(ref.strides().data(), ref.strides_size()) ||
          t.data_ptr() != made[i].second || t.is_conj() || t.is_neg()) {
        return false;
      }
    }
    return true;
  }

  // Decodes the call's arguments onto `stack` by the schema (missing
  // trailing ones take their defaults).
  absl::Status DecodeArguments(CallContext& context, const std::string& op_name,
                               const std::vector<c10::Argument>& arguments,
                               const v1::OpCall& call, torch::jit::Stack* stack) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::Argument& argument = arguments[i];
      const Where where = Where::Argument(argument.name(), i);
      if (i >= static_cast<size_t>(call.args_size())) {
        if (!argument.default_value().has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              op_name, ": ", where.str(), " is missing and has no default; the command sends ",
              call.args_size(), " of ", arguments.size(), " arguments"));
        }
        stack->push_back(*argument.default_value());
        continue;
      }
      context.set_writing(argument.alias_info() != nullptr && argument.alias_info()->isWrite());
      absl::StatusOr<c10::IValue> value = context.Decode(call.args(i), argument.type(), where);
      if (!value.ok()) return value.status();
      if (absl::Status s = CheckEnumArgument(argument.real_type(), *value); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(op_name, ": ", where.str(), ": ",
                                                       s.message()));
      }
      stack->push_back(*std::move(value));
    }
    context.set_writing(false);
    return absl::OkStatus();
  }

  // cpu_fallback: copies what the kernel wrote back to the device.
  static absl::Status WriteBack(const std::string& op_name, std::optional<HostMirror>& mirror) {
    if (!mirror.has_value()) return absl::OkStatus();
    absl::Status s = mirror->WriteBack();
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(op_name, ": writing its results back for the "
                                               "cpu_fallback route: ", s.message()));
  }

  // Runs the op. A random op without a Generator argument draws from the
  // default generator of its kernels' device, which ATen keeps one of per
  // process: the call holds it alone (one lock for the whole daemon, so two
  // sessions' draws can never interleave), seeded from the command's
  // implicit (seed, offset), so its numbers depend on that pair only, like
  // those of an op that takes a generator.
  absl::Status CallOp(CallContext& context, const c10::OperatorHandle& op,
                      const v1::OpCall& call, torch::jit::Stack* stack) {
    if (!call.has_implicit_generator()) return context.CallKernel(op, stack);
    const v1::GeneratorValue& g = call.implicit_generator();
    static absl::Mutex* const default_generator_mu = new absl::Mutex();
    absl::MutexLock lock(default_generator_mu);
    at::Generator generator = at::globalContext().defaultGenerator(context.KernelDevice(0));
    {
      std::lock_guard<std::mutex> generator_lock(generator.mutex());
      generator.set_current_seed(Mix64(g.seed() ^ Mix64(g.offset())));
    }
    return context.CallKernel(op, stack);
  }

  const Backend& backend_;
  const OpLimits limits_;
  HeldResults held_;
  absl::Mutex mu_;
  // Entries are never removed: pointers to them stay valid.
  absl::flat_hash_map<uint32_t, std::unique_ptr<RegisteredOp>> ops_ ABSL_GUARDED_BY(mu_);
  // ops_[id] for ids below kDenseOps, readable without mu_.
  std::array<std::atomic<const RegisteredOp*>, kDenseOps> dense_;
};

}  // namespace

std::string ListServedOps() {
  std::vector<std::string> lines;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    std::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema(name);
    if (!handle.has_value()) continue;  // a name without a schema registered yet
    const std::string full_name = OpName(name);
    const absl::Status servable = CheckServable(handle->schema(), full_name);
    absl::StatusOr<BoundArgumentRules> rules = BindArgumentRules(handle->schema());
    if (servable.ok() && (!rules.ok() || !rules->empty())) {
      // Served, with the argument rules checked before its kernel runs.
      lines.push_back(absl::StrCat(full_name, "\tserved\t",
                                   rules.ok() ? rules->Describe()
                                              : std::string(rules.status().message())));
    } else if (servable.ok()) {
      lines.push_back(absl::StrCat(full_name, "\tserved"));
    } else {
      lines.push_back(absl::StrCat(full_name, "\trefused\t", ServableReason(servable)));
    }
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrCat(absl::StrJoin(lines, "\n"), "\n");
}

std::unique_ptr<OpRunner> OpRunner::Create(const Backend& backend, const OpLimits& limits) {
  // Every host buffer ATen hands a kernel (results, out= scratch, the
  // cpu_fallback route's copies) starts as zeroes: the daemon's heap holds
  // other sessions' bytes, and a kernel may leave part of its output unwritten
  // (aten::empty writes none of it). The budgeting allocator below wraps
  // ATen's, which does the clearing.
  FLAGS_caffe2_cpu_allocator_do_zero_fill = true;
  static const bool installed = [] {
    const bool ok = InstallOpHostBudgetAllocator();
    if (!ok) {
      LogWarning("another CPU allocator of higher priority is installed in c10: the host memory "
                 "of op kernels is not bounded (--max-op-host-memory has no effect)");
    }
    return ok;
  }();
  (void)installed;
  return std::make_unique<OpRunnerImpl>(backend, limits);
}

}  // namespace flagos::daemon
