// The CPU backend's fused LSTM/GRU cells against ATen's unfused cells, and
// their backwards against autograd through the unfused cells.
#include "fused_rnn_kernels.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

namespace flagos {
namespace {

constexpr int64_t kBatch = 3, kInput = 5, kHidden = 4;

class FusedRnnKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterFusedRnnKernels();
    at::manual_seed(0);
  }
};

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(at::allclose(actual, expected, 1e-5, 1e-6))
      << "max abs diff " << (actual - expected).abs().max().item<float>();
}

TEST_F(FusedRnnKernelsTest, LstmCellMatchesTheUnfusedCellAndItsGradients) {
  at::Tensor x = at::randn({kBatch, kInput}), h = at::randn({kBatch, kHidden});
  at::Tensor c = at::randn({kBatch, kHidden}).requires_grad_();
  at::Tensor w_ih = at::randn({4 * kHidden, kInput}), w_hh = at::randn({4 * kHidden, kHidden});
  at::Tensor b_ih = at::randn({4 * kHidden}), b_hh = at::randn({4 * kHidden});
  at::Tensor igates = at::matmul(x, w_ih.t()).requires_grad_();
  at::Tensor hgates = at::matmul(h, w_hh.t()).requires_grad_();
  // Reference: the same gates through plain ATen math, differentiated by autograd.
  auto chunks = (igates + b_ih + hgates + b_hh).chunk(4, 1);
  at::Tensor cy_ref = chunks[1].sigmoid() * c + chunks[0].sigmoid() * chunks[2].tanh();
  at::Tensor hy_ref = chunks[3].sigmoid() * cy_ref.tanh();
  at::Tensor grad_hy = at::randn_like(hy_ref), grad_cy = at::randn_like(cy_ref);
  auto grads = torch::autograd::grad({hy_ref, cy_ref}, {igates, c}, {grad_hy, grad_cy});

  at::NoGradGuard no_grad;
  auto [hy, cy, workspace] =
      at::_thnn_fused_lstm_cell(igates.detach(), hgates.detach(), c.detach(), b_ih, b_hh);
  ExpectClose(hy, hy_ref.detach());
  ExpectClose(cy, cy_ref.detach());
  auto [grad_gates, grad_cx, grad_bias] = at::_thnn_fused_lstm_cell_backward_impl(
      grad_hy, grad_cy, c.detach(), cy, workspace, /*has_bias=*/true);
  ExpectClose(grad_gates, grads[0]);
  ExpectClose(grad_cx, grads[1]);
  ExpectClose(grad_bias, grads[0].sum(0));
}

TEST_F(FusedRnnKernelsTest, GruCellMatchesTheUnfusedCellAndItsGradients) {
  at::Tensor x = at::randn({kBatch, kInput});
  at::Tensor h = at::randn({kBatch, kHidden}).requires_grad_();
  at::Tensor w_ih = at::randn({3 * kHidden, kInput}), w_hh = at::randn({3 * kHidden, kHidden});
  at::Tensor b_ih = at::randn({3 * kHidden}), b_hh = at::randn({3 * kHidden});
  at::Tensor igates = at::matmul(x, w_ih.t()).requires_grad_();
  at::Tensor hgates = at::matmul(h.detach(), w_hh.t()).requires_grad_();
  at::Tensor hy_ref = at::gru_cell(x, h.detach(), w_ih, w_hh, b_ih, b_hh);
  auto ig = (igates + b_ih).chunk(3, 1);
  auto hg = (hgates + b_hh).chunk(3, 1);
  at::Tensor r = (ig[0] + hg[0]).sigmoid(), z = (ig[1] + hg[1]).sigmoid();
  at::Tensor n = (ig[2] + r * hg[2]).tanh();
  at::Tensor hy_math = n + z * (h - n);
  at::Tensor grad_hy = at::randn_like(hy_math);
  auto grads = torch::autograd::grad({hy_math}, {igates, hgates, h}, {grad_hy});

  at::NoGradGuard no_grad;
  auto [hy, workspace] =
      at::_thnn_fused_gru_cell(igates.detach(), hgates.detach(), h.detach(), b_ih, b_hh);
  ExpectClose(hy, hy_ref);
  auto [d_igates, d_hgates, d_hx, d_ibias, d_hbias] =
      at::_thnn_fused_gru_cell_backward(grad_hy, workspace, /*has_bias=*/true);
  ExpectClose(d_igates, grads[0]);
  ExpectClose(d_hgates, grads[1]);
  ExpectClose(d_hx, grads[2]);
  ExpectClose(d_ibias, grads[0].sum(0));
  ExpectClose(d_hbias, grads[1].sum(0));
}

}  // namespace
}  // namespace flagos
