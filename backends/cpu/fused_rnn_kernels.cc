#include "fused_rnn_kernels.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

namespace flagos {
namespace {

at::Tensor Plus(const at::Tensor& a, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? a + *bias : a;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FusedLstmCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = Plus(Plus(input_gates, input_bias) + hidden_gates, hidden_bias);
  std::vector<at::Tensor> chunks = gates.chunk(4, 1);
  at::Tensor i = chunks[0].sigmoid();
  at::Tensor f = chunks[1].sigmoid();
  at::Tensor g = chunks[2].tanh();
  at::Tensor o = chunks[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FusedLstmCellBackward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  std::vector<at::Tensor> w = workspace.chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  at::Tensor tanh_cy = cy.tanh();
  at::Tensor d_hy = grad_hy.has_value() && grad_hy->defined() ? *grad_hy : at::zeros_like(cy);
  at::Tensor d_cy = d_hy * o * (1 - tanh_cy * tanh_cy);
  if (grad_cy.has_value() && grad_cy->defined()) d_cy = d_cy + *grad_cy;
  at::Tensor d_i = d_cy * g * i * (1 - i);
  at::Tensor d_f = d_cy * cx * f * (1 - f);
  at::Tensor d_g = d_cy * i * (1 - g * g);
  at::Tensor d_o = d_hy * tanh_cy * o * (1 - o);
  at::Tensor grad_gates = at::cat({d_i, d_f, d_g, d_o}, 1);
  at::Tensor grad_cx = d_cy * f;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> FusedGruCell(const at::Tensor& input_gates,
                                                const at::Tensor& hidden_gates,
                                                const at::Tensor& hx,
                                                const std::optional<at::Tensor>& input_bias,
                                                const std::optional<at::Tensor>& hidden_bias) {
  std::vector<at::Tensor> ig = Plus(input_gates, input_bias).chunk(3, 1);
  std::vector<at::Tensor> hg = Plus(hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor r = (ig[0] + hg[0]).sigmoid();
  at::Tensor z = (ig[1] + hg[1]).sigmoid();
  at::Tensor n = (ig[2] + r * hg[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hg[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> FusedGruCellBackward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  std::vector<at::Tensor> w = workspace.chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  at::Tensor grad_hx = grad_hy * z;
  at::Tensor d_n = grad_hy * (1 - z) * (1 - n * n);  // w.r.t. the tanh's argument
  at::Tensor d_z = grad_hy * (hx - n) * z * (1 - z);
  at::Tensor d_r = d_n * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({d_r, d_z, d_n}, 1);
  at::Tensor grad_hidden_gates = at::cat({d_r, d_z, d_n * r}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

void RegisterFusedRnnKernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the life of the process: the registrations live as long as it.
    static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::CPU, __FILE__, __LINE__);
    library->impl("_thnn_fused_lstm_cell", TORCH_FN(FusedLstmCell));
    library->impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(FusedLstmCellBackward));
    library->impl("_thnn_fused_gru_cell", TORCH_FN(FusedGruCell));
    library->impl("_thnn_fused_gru_cell_backward", TORCH_FN(FusedGruCellBackward));
  });
}

}  // namespace flagos
