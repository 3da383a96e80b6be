// The helpers of the fake's nn ops (fake_xdnn_nn_ops.cc,
// fake_xdnn_norm_ops.cc): optional tensors, argument checks, output masks,
// gathering and scattering whole tensors. Test-only; see README.md.
#ifndef FLAGOS_TESTS_FAKES_XDNN_FAKE_XDNN_NN_HELPERS_H_
#define FLAGOS_TESTS_FAKES_XDNN_FAKE_XDNN_NN_HELPERS_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "fake_xdnn_internal.h"

namespace fake_xdnn {

using Pair = std::array<int64_t, 2>;
using OptTensor = std::optional<Tensor>;
using OptBound = std::optional<Bound>;

// aten's expand_param_if_needed: one value for both spatial dims, or two.
inline bool ToPair(const std::vector<int64_t>& v, Pair* out) {
  if (v.size() == 1) {
    *out = {v[0], v[0]};
    return true;
  }
  if (v.size() == 2) {
    *out = {v[0], v[1]};
    return true;
  }
  return false;
}

inline OptTensor NormOpt(const OptionalTensor& t) {
  if (!t) return std::nullopt;
  return Norm(*t);
}

// Every listed tensor (nullptr: absent) well formed.
inline bool AllWellFormed(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t != nullptr && !WellFormed(*t)) return false;
  }
  return true;
}

inline const Tensor* Ptr(const OptTensor& t) { return t ? &*t : nullptr; }

// SameFloatDtype over the present tensors (nullptr: absent); the first is
// present.
inline bool SameFloat(std::initializer_list<const Tensor*> ts) {
  const ScalarType first = (*ts.begin())->dtype;
  if (!IsFloat(first)) return false;
  for (const Tensor* t : ts) {
    if (t != nullptr && t->dtype != first) return false;
  }
  return true;
}

inline bool IsIndex(ScalarType t) { return t == ScalarType::kint64 || t == ScalarType::kint32; }

inline bool HasElements(const OptTensor& t) { return t && Numel(t->sizes) > 0; }

// The requested outputs of a backward (output_mask[i]), normalised.
inline bool Masked(const std::vector<bool>& mask, size_t i) { return i < mask.size() && mask[i]; }

inline OptTensor MaskedOut(const std::vector<bool>& mask, size_t i, const Tensor& t) {
  if (!Masked(mask, i)) return std::nullopt;
  return Norm(t);
}

template <typename T>
std::vector<T> GatherAll(const Bound& b) {
  return Gather<T>(b, b.sizes);
}

template <typename T>
std::vector<T> GatherOpt(const OptBound& b) {
  return b ? GatherAll<T>(*b) : std::vector<T>{};
}

inline std::vector<int64_t> GatherIndex(const Bound& b) {
  if (b.dtype == ScalarType::kint32) {
    const std::vector<int32_t> v = GatherAll<int32_t>(b);
    return std::vector<int64_t>(v.begin(), v.end());
  }
  return GatherAll<int64_t>(b);
}

template <typename T, typename V>
void ScatterOpt(const OptBound& b, const V& values, bool lie) {
  if (b && b->numel > 0) Scatter<T>(*b, values, lie);
}

// Writes values[j] to out's j-th element (row-major) where keep(j); the
// other elements are left as they are.
template <typename T, typename V, typename Keep>
void ScatterIf(const Bound& out, const V& values, bool lie, Keep keep) {
  const int64_t is = ItemSize(out.dtype);
  int64_t j = 0;
  ForEachIndex<1>(out.sizes, {out.strides}, [&](const std::array<int64_t, 1>& off) {
    const int64_t k = j++;
    if (!keep(k)) return;
    const T v = static_cast<T>(values[static_cast<size_t>(k)]);
    Store<T>(out.base + off[0] * is, lie ? Lie(v) : v);
  });
}

inline size_t Z(int64_t i) { return static_cast<size_t>(i); }

}  // namespace fake_xdnn

#endif  // FLAGOS_TESTS_FAKES_XDNN_FAKE_XDNN_NN_HELPERS_H_
