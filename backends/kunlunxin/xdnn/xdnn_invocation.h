// One operator call as the binding sees it: the call's descriptors
// (xdnn_module_abi.h) turned into xdnn_pytorch's types, the output tensors
// its form implies, and the xdnn::Context bound to its stream. The
// bindings (xdnn_bindings.cc) read their arguments through it.
//
// Thread safety: one call's object, used by the calling thread.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XDNN_XDNN_INVOCATION_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XDNN_XDNN_INVOCATION_H_

#include <xdnn_pytorch/xdnn_pytorch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xdnn_module_abi.h"

namespace flagos::kunlunxin::xdnn_binding {

// Thrown by an accessor when an argument is not what the binding takes
// (a dtype xdnn_pytorch has no name for, a list where a tensor belongs):
// the call is declined before anything was issued.
struct Decline {
  std::string why;
};

// xdnn_pytorch's type for a flagos dtype; nullopt when it has none.
std::optional<xdnn_pytorch::ScalarType> XdnnScalarType(int32_t dtype);

class Invocation {
 public:
  Invocation(xdnn::Context* ctx, const flagos_xdnn_call& call, std::vector<xdnn_pytorch::Tensor> outs)
      : ctx_(ctx), call_(call), outs_(std::move(outs)) {}

  xdnn::Context* ctx() const { return ctx_; }
  int nargs() const { return call_.nargs; }
  bool IsNone(int i) const;
  bool IsTensor(int i) const;
  xdnn_pytorch::Tensor Tensor(int i) const;
  xdnn_pytorch::OptionalTensor OptionalTensor(int i) const;
  std::vector<xdnn_pytorch::Tensor> Tensors(int i) const;
  xdnn_pytorch::Scalar Scalar(int i) const;
  // Element k of a Scalar[] (or float[]) argument.
  xdnn_pytorch::Scalar ScalarAt(int i, int64_t k) const;
  int64_t ScalarCount(int i) const;
  int64_t Int(int i) const;
  bool Bool(int i) const;
  double Double(int i) const;
  // An int[] argument; None is the empty list (every dimension).
  std::vector<int64_t> Ints(int i) const;
  std::string String(int i) const;
  std::vector<bool> Bools(int i) const;
  // The dtype of tensor argument `i`, as a flagos dtype.
  int32_t DtypeOf(int i) const;

  // The k-th output (from the call's form: a functional op's results, the
  // in-place op's self, the out= arguments).
  xdnn_pytorch::Tensor& Out(int k) { return outs_.at(k); }
  int nouts() const { return static_cast<int>(outs_.size()); }

  // Names the xdnn_pytorch function about to be called, for errors.
  void Calling(const char* vendor_call) { vendor_call_ = vendor_call; }
  const char* vendor_call() const { return vendor_call_; }

 private:
  const flagos_xdnn_arg& Arg(int i) const;
  // xdnn_pytorch::Scalar::create(float); Decline for a float64 op whose
  // value a float cannot hold.
  xdnn_pytorch::Scalar FloatScalar(double value) const;
  bool HasFloat64Tensor() const;

  xdnn::Context* const ctx_;
  const flagos_xdnn_call& call_;
  std::vector<xdnn_pytorch::Tensor> outs_;
  const char* vendor_call_ = "";
};

// xdnn_pytorch's view of a descriptor (a 0-dim tensor as sizes {1},
// strides {1}); Decline for a dtype it has no name for.
xdnn_pytorch::Tensor ToXdnn(const flagos_xdnn_tensor& tensor);

}  // namespace flagos::kunlunxin::xdnn_binding

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XDNN_XDNN_INVOCATION_H_
