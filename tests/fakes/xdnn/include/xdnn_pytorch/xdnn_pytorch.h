// TEST-ONLY stand-in for the vendor header include/xdnn_pytorch/xdnn_pytorch.h
// (it ships inside the Kunlun torch package, torch_xmlir). It declares the
// call shapes public code (DeepLink DIOPI's kunlunxin implementation) shows
// for the real library, and only the calls flagos binds: aten-shaped, with
// the context first and the output(s) last, returning an xdnn::Error code.
// Nothing here is confirmed against the real header; where the real one
// differs, the binding (backends/kunlunxin/xdnn/) fails to compile against
// it, which is the point: see docs/vendors/kunlunxin/op-api-map.md.
//
// The fake library (tests/fakes/xdnn/fake_xdnn_pytorch.cc) implements these
// over the fake libxpurt's device memory, on the context's stream.
#ifndef XDNN_PYTORCH_XDNN_PYTORCH_H_
#define XDNN_PYTORCH_XDNN_PYTORCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xdnn {

// Return codes (public code compares against these names; their numeric
// values are not public, so the binding never depends on them).
enum Error {
  SUCCESS = 0,
  INVALID_PARAM = 1,
  RUNTIME_ERROR = 2,
  NO_ENOUGH_WORKSPACE = 3,
  NOT_IMPLEMENT = 4,
};

// Binds calls to a libxpurt stream: `ctx->xpu_stream = stream` (an
// XPUStream, void*); nullptr is the current device's NULL stream. Work is
// issued on that stream and completes after the call returns.
struct Context {
  void* xpu_stream = nullptr;
};

Context* create_context();
void destroy_context(Context* ctx);

}  // namespace xdnn

namespace xdnn_pytorch {

enum class ScalarType {
  kbool,
  kuint8,
  kint8,
  kint16,
  kint32,
  kint64,
  kfloat32,
  kfloat16,
  kbfloat16,
  kfloat64,
};

// A view of device memory: `data` is the device address of the first
// element, sizes and strides in elements (a 0-dim tensor travels as sizes
// {1}, strides {1}).
struct Tensor {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  ScalarType dtype;
  void* data;
};

// Made with create(int64_t) or create(float) exactly: create(1) and
// create(1.0) are ambiguous overloads.
class Scalar {
 public:
  static Scalar create(int64_t value);
  static Scalar create(float value);
  bool is_integral() const { return integral_; }
  int64_t to_int64() const { return integral_ ? i_ : static_cast<int64_t>(f_); }
  float to_float() const { return integral_ ? static_cast<float>(i_) : f_; }

 private:
  bool integral_ = false;
  int64_t i_ = 0;
  float f_ = 0;
};

using OptionalTensor = std::optional<Tensor>;

// ---- elementwise (inputs broadcast to `out`'s sizes, aten's rules)
int add_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, const Scalar& alpha,
               Tensor& out);
int add_scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& other, const Scalar& alpha,
               Tensor& out);
int sub_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, const Scalar& alpha,
               Tensor& out);
int mul_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, Tensor& out);
int mul_scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& other, Tensor& out);
int div_tensor(xdnn::Context* ctx, const Tensor& self, const Tensor& other, Tensor& out);
int div_scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& other, Tensor& out);
int neg(xdnn::Context* ctx, const Tensor& self, Tensor& out);
int relu(xdnn::Context* ctx, const Tensor& self, Tensor& out);
int sqrt(xdnn::Context* ctx, const Tensor& self, Tensor& out);
int exp(xdnn::Context* ctx, const Tensor& self, Tensor& out);
int threshold_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                       const Scalar& threshold, Tensor& grad_input);
// out = self + value * tensor1 * tensor2
int addcmul(xdnn::Context* ctx, const Tensor& self, const Tensor& tensor1, const Tensor& tensor2,
            const Scalar& value, Tensor& out);
// out = self + value * tensor1 / tensor2
int addcdiv(xdnn::Context* ctx, const Tensor& self, const Tensor& tensor1, const Tensor& tensor2,
            const Scalar& value, Tensor& out);
// out = self + weight * (end - self)
int lerp_scalar(xdnn::Context* ctx, const Tensor& self, const Tensor& end, const Scalar& weight,
                Tensor& out);
// Every element of `out` (== self) becomes `value`.
int fill__scalar(xdnn::Context* ctx, const Tensor& self, const Scalar& value, Tensor& out);
// out = src converted to out's dtype (src broadcast to out's sizes, as
// aten's copy_; any strides).
int copy(xdnn::Context* ctx, const Tensor& src, Tensor& out);

// ---- matrix products
int mm(xdnn::Context* ctx, const Tensor& self, const Tensor& mat2, Tensor& out);
int bmm(xdnn::Context* ctx, const Tensor& self, const Tensor& mat2, Tensor& out);
// out = beta * self + alpha * (mat1 @ mat2), self broadcast to out
int addmm(xdnn::Context* ctx, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
          const Scalar& beta, const Scalar& alpha, Tensor& out);

// ---- reductions
int sum_dim_IntList(xdnn::Context* ctx, const Tensor& self, const std::vector<int64_t>& dim,
                    bool keepdim, Tensor& out);
int mean_dim(xdnn::Context* ctx, const Tensor& self, const std::vector<int64_t>& dim,
             bool keepdim, Tensor& out);

// ---- softmax and losses
int log_softmax(xdnn::Context* ctx, const Tensor& self, int64_t dim, bool half_to_float,
                Tensor& out);
int log_softmax_backward_data(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& output,
                              int64_t dim, ScalarType input_dtype, Tensor& grad_input);
int nll_loss(xdnn::Context* ctx, const Tensor& self, const Tensor& target,
             const OptionalTensor& weight, int64_t reduction, int64_t ignore_index, Tensor& output,
             Tensor& total_weight);
int nll_loss_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                      const Tensor& target, const OptionalTensor& weight, int64_t reduction,
                      int64_t ignore_index, const Tensor& total_weight, Tensor& grad_input);

// ---- convolution, normalisation, pooling, embedding, activations (for a
// CNN with batch norm and a small transformer). A tensor argument the
// caller does not want written (output_mask false) may have data nullptr.
int convolution(xdnn::Context* ctx, const Tensor& input, const Tensor& weight,
                const OptionalTensor& bias, const std::vector<int64_t>& stride,
                const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                bool transposed, const std::vector<int64_t>& output_padding, int64_t groups,
                Tensor& out);
int convolution_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& input,
                         const Tensor& weight, const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                         bool transposed, const std::vector<int64_t>& output_padding,
                         int64_t groups, const std::vector<bool>& output_mask, Tensor& grad_input,
                         Tensor& grad_weight, Tensor& grad_bias);
// training: batch statistics into save_mean/save_invstd, running stats
// (when given) updated in place with `momentum`; else the running stats.
int native_batch_norm(xdnn::Context* ctx, const Tensor& input, const OptionalTensor& weight,
                      const OptionalTensor& bias, const OptionalTensor& running_mean,
                      const OptionalTensor& running_var, bool training, double momentum,
                      double eps, Tensor& out, Tensor& save_mean, Tensor& save_invstd);
int native_batch_norm_backward(xdnn::Context* ctx, const Tensor& grad_out, const Tensor& input,
                               const OptionalTensor& weight, const OptionalTensor& running_mean,
                               const OptionalTensor& running_var, const OptionalTensor& save_mean,
                               const OptionalTensor& save_invstd, bool train, double eps,
                               const std::vector<bool>& output_mask, Tensor& grad_input,
                               Tensor& grad_weight, Tensor& grad_bias);
int native_layer_norm(xdnn::Context* ctx, const Tensor& input,
                      const std::vector<int64_t>& normalized_shape, const OptionalTensor& weight,
                      const OptionalTensor& bias, double eps, Tensor& out, Tensor& mean,
                      Tensor& rstd);
int native_layer_norm_backward(xdnn::Context* ctx, const Tensor& grad_out, const Tensor& input,
                               const std::vector<int64_t>& normalized_shape, const Tensor& mean,
                               const Tensor& rstd, const OptionalTensor& weight,
                               const OptionalTensor& bias, const std::vector<bool>& output_mask,
                               Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias);
int softmax(xdnn::Context* ctx, const Tensor& self, int64_t dim, bool half_to_float, Tensor& out);
int softmax_backward_data(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& output,
                          int64_t dim, ScalarType input_dtype, Tensor& grad_input);
int embedding(xdnn::Context* ctx, const Tensor& weight, const Tensor& indices, int64_t padding_idx,
              bool scale_grad_by_freq, bool sparse, Tensor& out);
int embedding_dense_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& indices,
                             int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq,
                             Tensor& grad_weight);
// approximate: "none" or "tanh".
int gelu(xdnn::Context* ctx, const Tensor& self, const std::string& approximate, Tensor& out);
int gelu_backward(xdnn::Context* ctx, const Tensor& grad_output, const Tensor& self,
                  const std::string& approximate, Tensor& grad_input);
int max_pool2d_with_indices(xdnn::Context* ctx, const Tensor& self,
                            const std::vector<int64_t>& kernel_size,
                            const std::vector<int64_t>& stride,
                            const std::vector<int64_t>& padding,
                            const std::vector<int64_t>& dilation, bool ceil_mode, Tensor& out,
                            Tensor& indices);
int max_pool2d_with_indices_backward(xdnn::Context* ctx, const Tensor& grad_output,
                                     const Tensor& self, const std::vector<int64_t>& kernel_size,
                                     const std::vector<int64_t>& stride,
                                     const std::vector<int64_t>& padding,
                                     const std::vector<int64_t>& dilation, bool ceil_mode,
                                     const Tensor& indices, Tensor& grad_input);
int adaptive_avg_pool2d(xdnn::Context* ctx, const Tensor& self,
                        const std::vector<int64_t>& output_size, Tensor& out);
int adaptive_avg_pool2d_backward(xdnn::Context* ctx, const Tensor& grad_output,
                                 const Tensor& self, Tensor& grad_input);
int cat(xdnn::Context* ctx, const std::vector<Tensor>& tensors, int64_t dim, Tensor& out);
int where(xdnn::Context* ctx, const Tensor& condition, const Tensor& self, const Tensor& other,
          Tensor& out);

}  // namespace xdnn_pytorch

#endif  // XDNN_PYTORCH_XDNN_PYTORCH_H_
