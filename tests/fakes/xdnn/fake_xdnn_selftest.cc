// Smoke test of the fake libxdnn_pytorch (tests/fakes/xdnn). Plain C++, no
// test framework, linked directly against the fake and the fake libxpurt:
//
//   fake_xdnn_selftest            the ops' results, refusals and range checks
//   fake_xdnn_selftest injected   FAKE_XDNN_LIE / _FAIL / _NOT_IMPLEMENT, as
//                                 ctest sets them (CMakeLists.txt)
//
// Results are read only after xpu_wait on the stream; ctest runs it with
// FAKE_XPU_DELAY_US=2000, so a result read earlier would be wrong (one check
// shows that). Exits non-zero on any failure.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "xdnn_pytorch/xdnn_pytorch.h"
#include "../selftest_checks.h"  // CHECK, CHECK_RC, REQUIRE (on g_failures, below)
#include "xpurt_symbols.h"

#define SELFTEST_DECLARE(name, params) extern "C" int name params;
FLAGOS_XPURT_SYMBOLS(SELFTEST_DECLARE, SELFTEST_DECLARE)
#undef SELFTEST_DECLARE

extern "C" uint64_t fake_xdnn_calls(const char* op);
extern "C" const char* fake_xdnn_version(void);

namespace {

using Clock = std::chrono::steady_clock;
using xdnn_pytorch::Scalar;
using xdnn_pytorch::ScalarType;
using xdnn_pytorch::Tensor;

constexpr int kD2H = flagos::kunlunxin::kXpuMemcpyDeviceToHost;
constexpr int kH2D = flagos::kunlunxin::kXpuMemcpyHostToDevice;

int g_failures = 0;
int64_t g_delay_us = 200;

const Scalar kOne = Scalar::create(int64_t{1});

// A device allocation holding `n` elements of T (freed at scope end).
template <typename T>
struct Dev {
  void* ptr = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { REQUIRE(xpu_malloc(&ptr, count * sizeof(T), 0) == 0); }
  explicit Dev(const std::vector<T>& host) : Dev(host.size()) { Upload(host); }
  ~Dev() { xpu_free(ptr); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n);
    REQUIRE(xpu_memcpy(ptr, host.data(), n * sizeof(T), kH2D) == 0);
  }
  // Reads back after the stream's work is done.
  std::vector<T> Read(void* stream) const {
    REQUIRE(xpu_wait(stream) == 0);
    std::vector<T> host(n);
    REQUIRE(xpu_memcpy(host.data(), ptr, n * sizeof(T), kD2H) == 0);
    return host;
  }
};

std::vector<int64_t> Contiguous(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) st[d - 1] = st[d] * sizes[d];
  return st;
}

Tensor T32(void* data, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
  if (strides.empty()) strides = Contiguous(sizes);
  return Tensor{std::move(sizes), std::move(strides), ScalarType::kfloat32, data};
}

Tensor Of(ScalarType t, void* data, std::vector<int64_t> sizes) {
  std::vector<int64_t> strides = Contiguous(sizes);
  return Tensor{std::move(sizes), std::move(strides), t, data};
}

std::vector<float> Iota(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

bool Near(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::abs(got - want) <= 1e-5 * std::abs(want) + 1e-6;
}

void CheckClose(const char* what, const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) {
    std::fprintf(stderr, "%s: %zu values, want %zu\n", what, got.size(), want.size());
    ++g_failures;
    return;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!Near(got[i], want[i])) {
      std::fprintf(stderr, "%s: [%zu] = %.9g, want %.9g\n", what, i, got[i], want[i]);
      ++g_failures;
      return;
    }
  }
}

// ---- the ops -------------------------------------------------------------

void TestElementwise(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  // add_tensor with broadcasting: [2,3] + 2 * [3], and + [2,1].
  const std::vector<float> a = Iota(6, -1.5f, 0.75f), b = {10, 20, 30}, c = {100, 200};
  Dev<float> da(a), db(b), dc(c), dout(6);
  Tensor out = T32(dout.ptr, {2, 3});
  CHECK_RC(xdnn_pytorch::add_tensor(ctx, T32(da.ptr, {2, 3}), T32(db.ptr, {3}), Scalar::create(2.0f), out),
           xdnn::SUCCESS);
  std::vector<double> want(6);
  for (int i = 0; i < 6; ++i) want[i] = a[i] + 2.0 * b[i % 3];
  CheckClose("add_tensor [2,3]+[3]", dout.Read(s), want);
  CHECK_RC(xdnn_pytorch::add_tensor(ctx, T32(da.ptr, {2, 3}), T32(dc.ptr, {2, 1}), kOne, out), xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) want[i] = a[i] + c[i / 3];
  CheckClose("add_tensor [2,3]+[2,1]", dout.Read(s), want);
  // A transposed view of a as self: [3,2] with strides {1,3}, plus a 0-dim.
  Dev<float> dscalar(std::vector<float>{0.5f});
  CHECK_RC(xdnn_pytorch::sub_tensor(ctx, T32(da.ptr, {3, 2}, {1, 3}), T32(dscalar.ptr, {1}, {1}),
                                    Scalar::create(int64_t{3}), out = T32(dout.ptr, {3, 2})),
           xdnn::SUCCESS);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) want[i * 2 + j] = a[j * 3 + i] - 3 * 0.5;
  }
  CheckClose("sub_tensor transposed - 0-dim", dout.Read(s), want);
  // A shape that does not broadcast.
  CHECK_RC(xdnn_pytorch::add_tensor(ctx, T32(da.ptr, {2, 3}), T32(dc.ptr, {2}), kOne, out = T32(dout.ptr, {2, 3})),
           xdnn::INVALID_PARAM);
  // An output with repeated elements, and rank/stride mismatches.
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {2, 3}), out = T32(dout.ptr, {2, 3}, {0, 1})), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {2, 3}, {3}), out = T32(dout.ptr, {2, 3})), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {2, 3}, {3, -1}), out = T32(dout.ptr, {2, 3})), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::neg(nullptr, T32(da.ptr, {2, 3}), out = T32(dout.ptr, {2, 3})), xdnn::INVALID_PARAM);

  // In place: x *= y, then the unary ops and scalar ops on it.
  const std::vector<float> x0 = {-2, -0.5f, 0, 0.25f, 3, 9};
  const std::vector<float> y = {1.5f, -2, 4, 8, 0.5f, 2};
  Dev<float> dx(x0), dy(y);
  Tensor x = T32(dx.ptr, {2, 3});
  CHECK_RC(xdnn_pytorch::mul_tensor(ctx, x, T32(dy.ptr, {2, 3}), x), xdnn::SUCCESS);
  std::vector<double> xw(6);
  for (int i = 0; i < 6; ++i) xw[i] = static_cast<float>(x0[i] * y[i]);
  CheckClose("mul_tensor in place", dx.Read(s), xw);
  CHECK_RC(xdnn_pytorch::mul_scalar(ctx, x, Scalar::create(0.5f), x), xdnn::SUCCESS);
  CHECK_RC(xdnn_pytorch::div_scalar(ctx, x, Scalar::create(int64_t{4}), x), xdnn::SUCCESS);
  CHECK_RC(xdnn_pytorch::add_scalar(ctx, x, Scalar::create(1.0f), Scalar::create(2.0f), x), xdnn::SUCCESS);
  for (double& v : xw) v = static_cast<float>(static_cast<float>(static_cast<float>(v * 0.5f) / 4.0f) + 2.0f);
  CheckClose("mul/div/add_scalar in place", dx.Read(s), xw);
  CHECK_RC(xdnn_pytorch::div_tensor(ctx, x, T32(dy.ptr, {2, 3}), x), xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) xw[i] = static_cast<float>(xw[i]) / y[i];
  CheckClose("div_tensor in place", dx.Read(s), xw);

  Dev<float> du(x0), dr(6);
  Tensor u = T32(du.ptr, {6}), r = T32(dr.ptr, {6});
  std::vector<double> rw(6);
  CHECK_RC(xdnn_pytorch::relu(ctx, u, r), xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) rw[i] = x0[i] < 0 ? 0 : x0[i];
  CheckClose("relu", dr.Read(s), rw);
  CHECK_RC(xdnn_pytorch::neg(ctx, u, r), xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) rw[i] = -x0[i];
  CheckClose("neg", dr.Read(s), rw);
  CHECK_RC(xdnn_pytorch::exp(ctx, u, r), xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) rw[i] = std::exp(static_cast<double>(x0[i]));
  CheckClose("exp", dr.Read(s), rw);
  CHECK_RC(xdnn_pytorch::sqrt(ctx, T32(dr.ptr, {6}), r), xdnn::SUCCESS);  // in place on exp's result
  for (int i = 0; i < 6; ++i) rw[i] = std::sqrt(rw[i]);
  CheckClose("sqrt in place", dr.Read(s), rw);
  CHECK_RC(xdnn_pytorch::threshold_backward(ctx, T32(dy.ptr, {6}), u, Scalar::create(0.0f), r), xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) rw[i] = x0[i] <= 0 ? 0 : y[i];
  CheckClose("threshold_backward", dr.Read(s), rw);

  // addcmul / addcdiv / lerp (both branches of aten's formula).
  CHECK_RC(xdnn_pytorch::addcmul(ctx, u, T32(dy.ptr, {6}), T32(dy.ptr, {6}), Scalar::create(0.5f), r),
           xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) rw[i] = x0[i] + 0.5 * y[i] * y[i];
  CheckClose("addcmul", dr.Read(s), rw);
  CHECK_RC(xdnn_pytorch::addcdiv(ctx, u, T32(du.ptr, {6}), T32(dy.ptr, {6}), Scalar::create(-2.0f), r),
           xdnn::SUCCESS);
  for (int i = 0; i < 6; ++i) rw[i] = x0[i] + -2.0 * x0[i] / y[i];
  CheckClose("addcdiv", dr.Read(s), rw);
  for (float w : {0.25f, 0.75f}) {
    CHECK_RC(xdnn_pytorch::lerp_scalar(ctx, u, T32(dy.ptr, {6}), Scalar::create(w), r), xdnn::SUCCESS);
    for (int i = 0; i < 6; ++i) rw[i] = x0[i] + w * (static_cast<double>(y[i]) - x0[i]);
    CheckClose("lerp_scalar", dr.Read(s), rw);
  }
}

void TestFillCopy(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  Dev<int64_t> di(4);
  Tensor ti = Of(ScalarType::kint64, di.ptr, {4});
  CHECK_RC(xdnn_pytorch::fill__scalar(ctx, ti, Scalar::create(int64_t{-7}), ti), xdnn::SUCCESS);
  CHECK(di.Read(s) == (std::vector<int64_t>{-7, -7, -7, -7}));
  Dev<float> df(4);
  Tensor tf = T32(df.ptr, {4});
  CHECK_RC(xdnn_pytorch::copy(ctx, ti, tf), xdnn::SUCCESS);
  CheckClose("copy int64->float32", df.Read(s), {-7, -7, -7, -7});
  CHECK_RC(xdnn_pytorch::fill__scalar(ctx, tf, Scalar::create(2.5f), tf), xdnn::SUCCESS);
  CHECK_RC(xdnn_pytorch::copy(ctx, tf, ti), xdnn::SUCCESS);
  CHECK(di.Read(s) == (std::vector<int64_t>{2, 2, 2, 2}));
  // A 0-dim source broadcast into a bool tensor; fill of a bool tensor.
  Dev<unsigned char> db(4);
  Tensor tb = Of(ScalarType::kbool, db.ptr, {4});
  CHECK_RC(xdnn_pytorch::copy(ctx, T32(df.ptr, {1}), tb), xdnn::SUCCESS);
  CHECK(db.Read(s) == (std::vector<unsigned char>{1, 1, 1, 1}));
  CHECK_RC(xdnn_pytorch::fill__scalar(ctx, tb, Scalar::create(int64_t{0}), tb), xdnn::SUCCESS);
  CHECK(db.Read(s) == (std::vector<unsigned char>{0, 0, 0, 0}));
  // fill's out must be self.
  CHECK_RC(xdnn_pytorch::fill__scalar(ctx, tf, kOne, ti), xdnn::INVALID_PARAM);
  // int16 is not a dtype copy takes.
  CHECK_RC(xdnn_pytorch::copy(ctx, Of(ScalarType::kint16, di.ptr, {4}), tf), xdnn::NOT_IMPLEMENT);
}

void TestMatmul(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int n = 2, k = 3, m = 4;
  const std::vector<float> a = Iota(n * k, -1.0f, 0.5f), b = Iota(k * m, 0.25f, -0.125f);
  Dev<float> da(a), db(b), dout(n * m);
  Tensor out = T32(dout.ptr, {n, m});
  CHECK_RC(xdnn_pytorch::mm(ctx, T32(da.ptr, {n, k}), T32(db.ptr, {k, m}), out), xdnn::SUCCESS);
  std::vector<double> want(n * m, 0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < m; ++j) {
      for (int q = 0; q < k; ++q) want[i * m + j] += static_cast<double>(a[i * k + q]) * b[q * m + j];
    }
  }
  CheckClose("mm", dout.Read(s), want);
  // b^T as a strided view: [m,k] with strides {1,m}; a^T likewise.
  Dev<float> dt(m * n);
  CHECK_RC(xdnn_pytorch::mm(ctx, T32(db.ptr, {m, k}, {1, m}), T32(da.ptr, {k, n}, {1, k}),
                            out = T32(dt.ptr, {m, n})),
           xdnn::SUCCESS);
  std::vector<double> wt(m * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) wt[i * n + j] = want[j * m + i];
  }
  CheckClose("mm transposed", dt.Read(s), wt);
  CHECK_RC(xdnn_pytorch::mm(ctx, T32(da.ptr, {n, k}), T32(db.ptr, {m, k}), out = T32(dout.ptr, {n, m})),
           xdnn::INVALID_PARAM);

  // addmm: bias [m] broadcast, beta 2, alpha -1; then beta 0 with NaN bias.
  const std::vector<float> bias = {1, -1, 0.5f, 4};
  Dev<float> dbias(bias);
  out = T32(dout.ptr, {n, m});
  CHECK_RC(xdnn_pytorch::addmm(ctx, T32(dbias.ptr, {m}), T32(da.ptr, {n, k}), T32(db.ptr, {k, m}),
                               Scalar::create(2.0f), Scalar::create(-1.0f), out),
           xdnn::SUCCESS);
  std::vector<double> wa(n * m);
  for (int i = 0; i < n * m; ++i) wa[i] = 2.0 * bias[i % m] - want[i];
  CheckClose("addmm", dout.Read(s), wa);
  dbias.Upload(std::vector<float>(m, std::numeric_limits<float>::quiet_NaN()));
  CHECK_RC(xdnn_pytorch::addmm(ctx, T32(dbias.ptr, {m}), T32(da.ptr, {n, k}), T32(db.ptr, {k, m}),
                               Scalar::create(int64_t{0}), kOne, out),
           xdnn::SUCCESS);
  CheckClose("addmm beta=0 ignores NaN self", dout.Read(s), want);

  // bmm: two batches.
  const std::vector<float> ba = Iota(2 * n * k, 0.5f, 0.25f), bb = Iota(2 * k * m, -2.0f, 0.2f);
  Dev<float> dba(ba), dbb(bb), dbo(2 * n * m);
  CHECK_RC(xdnn_pytorch::bmm(ctx, T32(dba.ptr, {2, n, k}), T32(dbb.ptr, {2, k, m}), out = T32(dbo.ptr, {2, n, m})),
           xdnn::SUCCESS);
  std::vector<double> wb(2 * n * m, 0);
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < m; ++j) {
        for (int q = 0; q < k; ++q) {
          wb[(p * n + i) * m + j] += static_cast<double>(ba[(p * n + i) * k + q]) * bb[(p * k + q) * m + j];
        }
      }
    }
  }
  CheckClose("bmm", dbo.Read(s), wb);
}

void TestReductions(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const std::vector<float> x = Iota(24, -3.0f, 0.37f);  // [2,3,4]
  Dev<float> dx(x), dout(24);
  Tensor in = T32(dx.ptr, {2, 3, 4});
  Tensor out = T32(dout.ptr, {2, 4});
  CHECK_RC(xdnn_pytorch::sum_dim_IntList(ctx, in, {-2}, false, out), xdnn::SUCCESS);
  std::vector<double> want(8, 0);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int l = 0; l < 4; ++l) want[i * 4 + l] += x[(i * 3 + j) * 4 + l];
    }
  }
  std::vector<float> got = dout.Read(s);
  got.resize(8);
  CheckClose("sum_dim [2,3,4] dim -2", got, want);
  out = T32(dout.ptr, {1, 3, 1});
  CHECK_RC(xdnn_pytorch::mean_dim(ctx, in, {0, 2}, true, out), xdnn::SUCCESS);
  std::vector<double> wm(3, 0);
  for (int i = 0; i < 24; ++i) wm[(i / 4) % 3] += x[i] / 8.0;
  got = dout.Read(s);
  got.resize(3);
  CheckClose("mean_dim keepdim", got, wm);
  out = T32(dout.ptr, {1});
  CHECK_RC(xdnn_pytorch::sum_dim_IntList(ctx, in, {}, false, out), xdnn::SUCCESS);
  double total = 0;
  for (float v : x) total += v;
  got = dout.Read(s);
  got.resize(1);
  CheckClose("sum all", got, {total});
  CHECK_RC(xdnn_pytorch::sum_dim_IntList(ctx, in, {1, -2}, false, out = T32(dout.ptr, {2, 4})), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::sum_dim_IntList(ctx, in, {3}, false, out), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::sum_dim_IntList(ctx, in, {1}, true, out = T32(dout.ptr, {2, 4})), xdnn::INVALID_PARAM);
}

void TestLogSoftmax(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int rows = 3, cols = 5;
  const std::vector<float> x = {1, 2, 3, 4, 5, -1, 0, 1, 100, 101, 0.5f, 0.25f, -3, 2, 7};
  Dev<float> dx(x), dy(rows * cols), dg(rows * cols), dgi(rows * cols);
  Tensor y = T32(dy.ptr, {rows, cols});
  CHECK_RC(xdnn_pytorch::log_softmax(ctx, T32(dx.ptr, {rows, cols}), -1, false, y), xdnn::SUCCESS);
  std::vector<double> want(rows * cols);
  for (int i = 0; i < rows; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < cols; ++j) mx = std::max(mx, static_cast<double>(x[i * cols + j]));
    for (int j = 0; j < cols; ++j) sum += std::exp(x[i * cols + j] - mx);
    for (int j = 0; j < cols; ++j) want[i * cols + j] = x[i * cols + j] - mx - std::log(sum);
  }
  const std::vector<float> yv = dy.Read(s);
  CheckClose("log_softmax dim -1", yv, want);
  // Along dim -2 of a transposed view: the same numbers.
  Dev<float> dyt(rows * cols);
  Tensor yt = T32(dyt.ptr, {cols, rows});
  CHECK_RC(xdnn_pytorch::log_softmax(ctx, T32(dx.ptr, {cols, rows}, {1, cols}), -2, false, yt), xdnn::SUCCESS);
  std::vector<double> wt(rows * cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) wt[j * rows + i] = want[i * cols + j];
  }
  CheckClose("log_softmax transposed", dyt.Read(s), wt);
  CHECK_RC(xdnn_pytorch::log_softmax(ctx, T32(dx.ptr, {rows, cols}), 2, false, y), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::log_softmax(ctx, T32(dx.ptr, {rows, cols}), 1, true, y), xdnn::NOT_IMPLEMENT);

  const std::vector<float> g = Iota(rows * cols, 1.0f, -0.3f);
  dg.Upload(g);
  Tensor gi = T32(dgi.ptr, {rows, cols});
  CHECK_RC(xdnn_pytorch::log_softmax_backward_data(ctx, T32(dg.ptr, {rows, cols}), y, 1, ScalarType::kfloat32, gi),
           xdnn::SUCCESS);
  std::vector<double> wg(rows * cols);
  for (int i = 0; i < rows; ++i) {
    double sum = 0;
    for (int j = 0; j < cols; ++j) sum += g[i * cols + j];
    for (int j = 0; j < cols; ++j) wg[i * cols + j] = g[i * cols + j] - std::exp(static_cast<double>(yv[i * cols + j])) * sum;
  }
  CheckClose("log_softmax_backward_data", dgi.Read(s), wg);
}

void TestNllLoss(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int64_t n = 4, c = 3, ignore = -100;
  const std::vector<float> x = Iota(n * c, -2.0f, 0.45f);
  const std::vector<int64_t> t = {2, ignore, 0, 1};
  const std::vector<float> w = {0.5f, 2.0f, 1.5f};
  Dev<float> dx(x), dw(w), dout(n), dtw(1), dgo(n), dgi(n * c);
  Dev<int64_t> dt(t);
  Tensor self = T32(dx.ptr, {n, c}), target = Of(ScalarType::kint64, dt.ptr, {n});
  Tensor weight = T32(dw.ptr, {c}), tw = T32(dtw.ptr, {1});
  double loss = 0, wsum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    loss -= static_cast<double>(x[i * c + t[i]]) * w[t[i]];
    wsum += w[t[i]];
  }
  // mean, with weight.
  Tensor out = T32(dout.ptr, {1});
  CHECK_RC(xdnn_pytorch::nll_loss(ctx, self, target, weight, 1, ignore, out, tw), xdnn::SUCCESS);
  CheckClose("nll_loss mean: output", {dout.Read(s)[0]}, {loss / wsum});
  CheckClose("nll_loss mean: total_weight", dtw.Read(s), {wsum});
  // sum, without weight.
  CHECK_RC(xdnn_pytorch::nll_loss(ctx, self, target, std::nullopt, 2, ignore, out, tw), xdnn::SUCCESS);
  double plain = 0;
  for (int64_t i = 0; i < n; ++i) plain -= t[i] == ignore ? 0 : x[i * c + t[i]];
  CheckClose("nll_loss sum: output", {dout.Read(s)[0]}, {plain});
  CheckClose("nll_loss sum: total_weight", dtw.Read(s), {3});
  // none: one loss per sample.
  out = T32(dout.ptr, {n});
  CHECK_RC(xdnn_pytorch::nll_loss(ctx, self, target, weight, 0, ignore, out, tw), xdnn::SUCCESS);
  std::vector<double> per(n);
  for (int64_t i = 0; i < n; ++i) per[i] = t[i] == ignore ? 0 : -static_cast<double>(x[i * c + t[i]]) * w[t[i]];
  CheckClose("nll_loss none", dout.Read(s), per);
  CHECK_RC(xdnn_pytorch::nll_loss(ctx, self, target, weight, 3, ignore, out, tw), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::nll_loss(ctx, self, Of(ScalarType::kint32, dt.ptr, {n}), weight, 0, ignore, out, tw),
           xdnn::NOT_IMPLEMENT);

  // Backward of the mean: grad_output 0-dim 2.0.
  dgo.Upload({2.0f, 0, 0, 0});
  // Recompute total_weight (the none call above wrote 0).
  CHECK_RC(xdnn_pytorch::nll_loss(ctx, self, target, weight, 1, ignore, out = T32(dout.ptr, {1}), tw), xdnn::SUCCESS);
  Tensor gi = T32(dgi.ptr, {n, c});
  CHECK_RC(xdnn_pytorch::nll_loss_backward(ctx, T32(dgo.ptr, {1}), self, target, weight, 1, ignore, tw, gi),
           xdnn::SUCCESS);
  std::vector<double> wg(n * c, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] != ignore) wg[i * c + t[i]] = -static_cast<double>(w[t[i]]) * 2.0 / wsum;
  }
  CheckClose("nll_loss_backward mean", dgi.Read(s), wg);
  // Backward of none: grad_output [n].
  const std::vector<float> go = {1, 2, 3, 4};
  dgo.Upload(go);
  CHECK_RC(xdnn_pytorch::nll_loss_backward(ctx, T32(dgo.ptr, {n}), self, target, std::nullopt, 0, ignore, tw, gi),
           xdnn::SUCCESS);
  std::fill(wg.begin(), wg.end(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] != ignore) wg[i * c + t[i]] = -go[i];
  }
  CheckClose("nll_loss_backward none", dgi.Read(s), wg);
}

// ---- convolution, normalisation, pooling, embedding, activations ---------
//
// Each result is compared with a plain host reference written here (double
// loops over the same float inputs). The semantics were cross-checked
// against PyTorch's ATen CPU kernels when these ops were added.

std::vector<float> Wavy(size_t n, double phase, double scale = 2.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * std::sin(1.7 * static_cast<double>(i) + phase));
  return v;
}

Tensor I64(void* data, std::vector<int64_t> sizes) { return Of(ScalarType::kint64, data, std::move(sizes)); }

// A masked-out output: no data, never translated.
Tensor Absent(std::vector<int64_t> sizes) { return T32(nullptr, std::move(sizes)); }

void TestConvolution(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  // [2,4,5,6] * [6,2,3,2], groups 2, stride {2,1}, padding {1} (both
  // dims), dilation {1,2}: output [2,6,3,6].
  const int64_t N = 2, C = 4, H = 5, W = 6, O = 6, G = 2, KH = 3, KW = 2, SH = 2, SW = 1, P = 1, DH = 1, DW = 2;
  const int64_t HO = (H + 2 * P - DH * (KH - 1) - 1) / SH + 1, WO = (W + 2 * P - DW * (KW - 1) - 1) / SW + 1;
  const int64_t CG = C / G, OG = O / G;
  const std::vector<float> x = Wavy(N * C * H * W, 0.1), w = Wavy(O * CG * KH * KW, 0.7, 1.0);
  const std::vector<float> b = {1, -2, 0.5f, 3, 0, -1};
  Dev<float> dx(x), dw(w), db(b), dout(N * O * HO * WO);
  Tensor out = T32(dout.ptr, {N, O, HO, WO});
  // Calls f(out index, input index, weight index) for every product term.
  auto terms = [&](auto&& f) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t oh = 0; oh < HO; ++oh)
          for (int64_t ow = 0; ow < WO; ++ow)
            for (int64_t q = 0; q < CG; ++q)
              for (int64_t a = 0; a < KH; ++a)
                for (int64_t c = 0; c < KW; ++c) {
                  const int64_t ih = oh * SH - P + a * DH, iw = ow * SW - P + c * DW;
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  f(((n * O + o) * HO + oh) * WO + ow, ((n * C + (o / OG) * CG + q) * H + ih) * W + iw,
                    ((o * CG + q) * KH + a) * KW + c);
                }
  };
  CHECK_RC(xdnn_pytorch::convolution(ctx, T32(dx.ptr, {N, C, H, W}), T32(dw.ptr, {O, CG, KH, KW}), T32(db.ptr, {O}),
                                     {SH, SW}, {P}, {DH, DW}, false, {0, 0}, G, out),
           xdnn::SUCCESS);
  std::vector<double> want(N * O * HO * WO, 0);
  terms([&](int64_t oi, int64_t xi, int64_t wi) { want[oi] += static_cast<double>(x[xi]) * w[wi]; });
  for (size_t i = 0; i < want.size(); ++i) want[i] += b[(i / (HO * WO)) % O];
  CheckClose("convolution groups=2", dout.Read(s), want);
  // Refusals: transposed, an output of the wrong size, groups not dividing C.
  CHECK_RC(xdnn_pytorch::convolution(ctx, T32(dx.ptr, {N, C, H, W}), T32(dw.ptr, {O, CG, KH, KW}), std::nullopt,
                                     {SH, SW}, {P}, {DH, DW}, true, {0, 0}, G, out),
           xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::convolution(ctx, T32(dx.ptr, {N, C, H, W}), T32(dw.ptr, {O, CG, KH, KW}), std::nullopt,
                                     {SH, SW}, {P}, {DH, DW}, false, {0, 0}, G,
                                     out = T32(dout.ptr, {N, O, HO, WO - 1})),
           xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::convolution(ctx, T32(dx.ptr, {N, C, H, W}), T32(dw.ptr, {O, CG, KH, KW}), std::nullopt,
                                     {SH, SW}, {P}, {DH, DW}, false, {0, 0}, 3, out = T32(dout.ptr, {N, O, HO, WO})),
           xdnn::INVALID_PARAM);

  // Backward: every output, then grad_bias alone (the others absent).
  const std::vector<float> go = Wavy(N * O * HO * WO, 1.3);
  Dev<float> dgo(go), dgi(N * C * H * W), dgw(O * CG * KH * KW), dgb(O);
  Tensor gi = T32(dgi.ptr, {N, C, H, W}), gw = T32(dgw.ptr, {O, CG, KH, KW}), gb = T32(dgb.ptr, {O});
  CHECK_RC(xdnn_pytorch::convolution_backward(ctx, T32(dgo.ptr, {N, O, HO, WO}), T32(dx.ptr, {N, C, H, W}),
                                              T32(dw.ptr, {O, CG, KH, KW}), {SH, SW}, {P}, {DH, DW}, false, {0}, G,
                                              {true, true, true}, gi, gw, gb),
           xdnn::SUCCESS);
  std::vector<double> wgi(N * C * H * W, 0), wgw(O * CG * KH * KW, 0), wgb(O, 0);
  terms([&](int64_t oi, int64_t xi, int64_t wi) {
    wgi[xi] += static_cast<double>(go[oi]) * w[wi];
    wgw[wi] += static_cast<double>(go[oi]) * x[xi];
  });
  for (size_t i = 0; i < go.size(); ++i) wgb[(i / (HO * WO)) % O] += go[i];
  CheckClose("convolution_backward grad_input", dgi.Read(s), wgi);
  CheckClose("convolution_backward grad_weight", dgw.Read(s), wgw);
  CheckClose("convolution_backward grad_bias", dgb.Read(s), wgb);
  dgb.Upload(std::vector<float>(O, 0));
  Tensor no_gi = Absent({N, C, H, W}), no_gw = Absent({O, CG, KH, KW});
  CHECK_RC(xdnn_pytorch::convolution_backward(ctx, T32(dgo.ptr, {N, O, HO, WO}), T32(dx.ptr, {N, C, H, W}),
                                              T32(dw.ptr, {O, CG, KH, KW}), {SH, SW}, {P}, {DH, DW}, false, {0}, G,
                                              {false, false, true}, no_gi, no_gw, gb),
           xdnn::SUCCESS);
  CheckClose("convolution_backward grad_bias alone", dgb.Read(s), wgb);
  // A requested output without memory; an output_mask of two entries.
  CHECK_RC(xdnn_pytorch::convolution_backward(ctx, T32(dgo.ptr, {N, O, HO, WO}), T32(dx.ptr, {N, C, H, W}),
                                              T32(dw.ptr, {O, CG, KH, KW}), {SH, SW}, {P}, {DH, DW}, false, {0}, G,
                                              {true, false, true}, no_gi, no_gw, gb),
           xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::convolution_backward(ctx, T32(dgo.ptr, {N, O, HO, WO}), T32(dx.ptr, {N, C, H, W}),
                                              T32(dw.ptr, {O, CG, KH, KW}), {SH, SW}, {P}, {DH, DW}, false, {0}, G,
                                              {true, true}, gi, gw, gb),
           xdnn::INVALID_PARAM);
}

void TestBatchNorm(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int64_t N = 3, C = 2, HW = 4, CNT = N * HW;
  const double momentum = 0.1, eps = 1e-5;
  const std::vector<float> x = Wavy(N * C * HW, 0.3, 3.0), w = {1.5f, -0.5f}, b = {0.25f, 2}, rm0 = {0.5f, -1},
                           rv0 = {2, 0.5f};
  Dev<float> dx(x), dw(w), db(b), drm(rm0), drv(rv0), dout(N * C * HW), dsm(C), dsi(C);
  const Tensor in = T32(dx.ptr, {N, C, 2, 2});
  Tensor out = T32(dout.ptr, {N, C, 2, 2}), sm = T32(dsm.ptr, {C}), si = T32(dsi.ptr, {C});
  auto at = [&](int64_t n, int64_t c, int64_t i) { return static_cast<size_t>((n * C + c) * HW + i); };
  // Training: batch statistics, running stats updated in place.
  CHECK_RC(xdnn_pytorch::native_batch_norm(ctx, in, T32(dw.ptr, {C}), T32(db.ptr, {C}), T32(drm.ptr, {C}),
                                           T32(drv.ptr, {C}), true, momentum, eps, out, sm, si),
           xdnn::SUCCESS);
  std::vector<double> mean(C, 0), var(C, 0), invstd(C), y(x.size()), rm(C), rv(C);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) mean[c] += x[at(n, c, i)] / static_cast<double>(CNT);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) var[c] += std::pow(x[at(n, c, i)] - mean[c], 2);
    invstd[c] = 1 / std::sqrt(var[c] / CNT + eps);
    rm[c] = (1 - momentum) * rm0[c] + momentum * mean[c];
    rv[c] = (1 - momentum) * rv0[c] + momentum * var[c] / (CNT - 1);  // unbiased
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) y[at(n, c, i)] = (x[at(n, c, i)] - mean[c]) * invstd[c] * w[c] + b[c];
  }
  CheckClose("native_batch_norm train: out", dout.Read(s), y);
  const std::vector<float> smv = dsm.Read(s), siv = dsi.Read(s);
  CheckClose("native_batch_norm train: save_mean", smv, mean);
  CheckClose("native_batch_norm train: save_invstd", siv, invstd);
  CheckClose("native_batch_norm train: running_mean", drm.Read(s), rm);
  CheckClose("native_batch_norm train: running_var", drv.Read(s), rv);

  // Backward (train), from the saved statistics.
  const std::vector<float> go = Wavy(x.size(), 2.1);
  Dev<float> dgo(go), dgi(x.size()), dgw(C), dgb(C);
  Tensor gi = T32(dgi.ptr, {N, C, 2, 2}), gw = T32(dgw.ptr, {C}), gb = T32(dgb.ptr, {C});
  CHECK_RC(xdnn_pytorch::native_batch_norm_backward(ctx, T32(dgo.ptr, {N, C, 2, 2}), in, T32(dw.ptr, {C}),
                                                    T32(drm.ptr, {C}), T32(drv.ptr, {C}), sm, si, true, eps,
                                                    {true, true, true}, gi, gw, gb),
           xdnn::SUCCESS);
  std::vector<double> wgi(x.size()), wgw(C), wgb(C);
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, dot = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        sum += go[at(n, c, i)];
        dot += go[at(n, c, i)] * (x[at(n, c, i)] - static_cast<double>(smv[c]));
      }
    wgw[c] = dot * siv[c];
    wgb[c] = sum;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const double xhat = (x[at(n, c, i)] - static_cast<double>(smv[c])) * siv[c];
        wgi[at(n, c, i)] = w[c] * siv[c] * (go[at(n, c, i)] - sum / CNT - xhat * dot * siv[c] / CNT);
      }
  }
  CheckClose("native_batch_norm_backward train: grad_input", dgi.Read(s), wgi);
  CheckClose("native_batch_norm_backward train: grad_weight", dgw.Read(s), wgw);
  CheckClose("native_batch_norm_backward train: grad_bias", dgb.Read(s), wgb);

  // Eval: the running statistics; save tensors are aten's empty ones (no
  // data), and stay untranslated (even of another dtype: never touched).
  const std::vector<float> rmv = drm.Read(s), rvv = drv.Read(s);
  Tensor no_sm = Absent({0}), no_si = Of(ScalarType::kfloat64, nullptr, {0});
  CHECK_RC(xdnn_pytorch::native_batch_norm(ctx, in, std::nullopt, T32(db.ptr, {C}), T32(drm.ptr, {C}),
                                           T32(drv.ptr, {C}), false, momentum, eps, out, no_sm, no_si),
           xdnn::SUCCESS);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) y[at(n, c, i)] = (x[at(n, c, i)] - rmv[c]) / std::sqrt(rvv[c] + eps) + b[c];
  CheckClose("native_batch_norm eval: out", dout.Read(s), y);
  CheckClose("native_batch_norm eval: running stats untouched", drm.Read(s), {rmv[0], rmv[1]});
  // Eval backward, grad_input only: grad * w / sqrt(running_var + eps).
  Tensor no_gw = Absent({C}), no_gb = Absent({C});
  CHECK_RC(xdnn_pytorch::native_batch_norm_backward(ctx, T32(dgo.ptr, {N, C, 2, 2}), in, T32(dw.ptr, {C}),
                                                    T32(drm.ptr, {C}), T32(drv.ptr, {C}), no_sm, no_si, false, eps,
                                                    {true, false, false}, gi, no_gw, no_gb),
           xdnn::SUCCESS);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) wgi[at(n, c, i)] = go[at(n, c, i)] * w[c] / std::sqrt(rvv[c] + eps);
  CheckClose("native_batch_norm_backward eval: grad_input", dgi.Read(s), wgi);
  // Eval without running statistics; train with empty save tensors.
  CHECK_RC(xdnn_pytorch::native_batch_norm(ctx, in, std::nullopt, std::nullopt, std::nullopt, std::nullopt, false,
                                           momentum, eps, out, no_sm, no_si),
           xdnn::INVALID_PARAM);
  Tensor empty_si = Absent({0});
  CHECK_RC(xdnn_pytorch::native_batch_norm(ctx, in, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true,
                                           momentum, eps, out, no_sm, empty_si),
           xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::native_batch_norm(ctx, in, T32(dw.ptr, {C + 1}), std::nullopt, std::nullopt, std::nullopt,
                                           true, momentum, eps, out, sm, si),
           xdnn::INVALID_PARAM);
}

void TestLayerNorm(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int64_t B = 2, T = 3, D = 5, M = B * T;
  const double eps = 1e-5;
  const std::vector<float> x = Wavy(M * D, 0.9, 2.5), w = {1, -1, 0.5f, 2, 1.5f}, b = {0, 1, -1, 0.5f, 0.25f};
  Dev<float> dx(x), dw(w), db(b), dout(M * D), dm(M), dr(M);
  const Tensor in = T32(dx.ptr, {B, T, D});
  Tensor out = T32(dout.ptr, {B, T, D}), mean = T32(dm.ptr, {B, T, 1}), rstd = T32(dr.ptr, {B, T, 1});
  CHECK_RC(xdnn_pytorch::native_layer_norm(ctx, in, {D}, T32(dw.ptr, {D}), T32(db.ptr, {D}), eps, out, mean, rstd),
           xdnn::SUCCESS);
  std::vector<double> wm(M, 0), wr(M), y(M * D);
  for (int64_t r = 0; r < M; ++r) {
    double var = 0;
    for (int64_t j = 0; j < D; ++j) wm[r] += x[r * D + j] / static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) var += std::pow(x[r * D + j] - wm[r], 2) / D;
    wr[r] = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < D; ++j) y[r * D + j] = (x[r * D + j] - wm[r]) * wr[r] * w[j] + b[j];
  }
  CheckClose("native_layer_norm: out", dout.Read(s), y);
  const std::vector<float> mv = dm.Read(s), rv = dr.Read(s);
  CheckClose("native_layer_norm: mean", mv, wm);
  CheckClose("native_layer_norm: rstd", rv, wr);
  // mean must be [B,T,1]; normalized_shape must match the trailing dims.
  CHECK_RC(xdnn_pytorch::native_layer_norm(ctx, in, {D}, std::nullopt, std::nullopt, eps, out,
                                           mean = T32(dm.ptr, {B, T}), rstd),
           xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::native_layer_norm(ctx, in, {T, D + 1}, std::nullopt, std::nullopt, eps, out,
                                           mean = T32(dm.ptr, {B, 1, 1}), rstd = T32(dr.ptr, {B, 1, 1})),
           xdnn::INVALID_PARAM);

  const std::vector<float> go = Wavy(M * D, 0.4);
  Dev<float> dgo(go), dgi(M * D), dgw(D), dgb(D);
  Tensor gi = T32(dgi.ptr, {B, T, D}), gw = T32(dgw.ptr, {D}), gb = T32(dgb.ptr, {D});
  CHECK_RC(xdnn_pytorch::native_layer_norm_backward(ctx, T32(dgo.ptr, {B, T, D}), in, {D}, T32(dm.ptr, {B, T, 1}),
                                                    T32(dr.ptr, {B, T, 1}), T32(dw.ptr, {D}), T32(db.ptr, {D}),
                                                    {true, true, true}, gi, gw, gb),
           xdnn::SUCCESS);
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
  std::vector<double> wgi(M * D), wgw(D, 0), wgb(D, 0);
  for (int64_t r = 0; r < M; ++r) {
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double xhat = (x[r * D + j] - static_cast<double>(mv[r])) * rv[r], g = go[r * D + j] * w[j];
      mg += g / D;
      mgx += g * xhat / D;
      wgw[j] += go[r * D + j] * xhat;
      wgb[j] += go[r * D + j];
    }
    for (int64_t j = 0; j < D; ++j) {
      const double xhat = (x[r * D + j] - static_cast<double>(mv[r])) * rv[r];
      wgi[r * D + j] = rv[r] * (go[r * D + j] * w[j] - mg - xhat * mgx);
    }
  }
  CheckClose("native_layer_norm_backward: grad_input", dgi.Read(s), wgi);
  CheckClose("native_layer_norm_backward: grad_weight", dgw.Read(s), wgw);
  CheckClose("native_layer_norm_backward: grad_bias", dgb.Read(s), wgb);
}

void TestSoftmax(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int rows = 2, cols = 4;
  const std::vector<float> x = {1, 2, 3, 4, -1, 50, 49, 0};
  Dev<float> dx(x), dy(rows * cols), dg(Wavy(rows * cols, 0.2)), dgi(rows * cols);
  Tensor y = T32(dy.ptr, {rows, cols});
  CHECK_RC(xdnn_pytorch::softmax(ctx, T32(dx.ptr, {rows, cols}), 1, false, y), xdnn::SUCCESS);
  std::vector<double> want(rows * cols);
  for (int i = 0; i < rows; ++i) {
    double sum = 0;
    for (int j = 0; j < cols; ++j) sum += std::exp(static_cast<double>(x[i * cols + j]) - 50);
    for (int j = 0; j < cols; ++j) want[i * cols + j] = std::exp(static_cast<double>(x[i * cols + j]) - 50) / sum;
  }
  const std::vector<float> yv = dy.Read(s);
  CheckClose("softmax", yv, want);
  CHECK_RC(xdnn_pytorch::softmax(ctx, T32(dx.ptr, {rows, cols}), 1, true, y), xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::softmax(ctx, T32(dx.ptr, {rows, cols}), -3, false, y), xdnn::INVALID_PARAM);
  const std::vector<float> g = dg.Read(s);
  Tensor gi = T32(dgi.ptr, {rows, cols});
  CHECK_RC(xdnn_pytorch::softmax_backward_data(ctx, T32(dg.ptr, {rows, cols}), y, -1, ScalarType::kfloat32, gi),
           xdnn::SUCCESS);
  std::vector<double> wg(rows * cols);
  for (int i = 0; i < rows; ++i) {
    double dot = 0;
    for (int j = 0; j < cols; ++j) dot += static_cast<double>(g[i * cols + j]) * yv[i * cols + j];
    for (int j = 0; j < cols; ++j) wg[i * cols + j] = yv[i * cols + j] * (g[i * cols + j] - dot);
  }
  CheckClose("softmax_backward_data", dgi.Read(s), wg);
  CHECK_RC(xdnn_pytorch::softmax_backward_data(ctx, T32(dg.ptr, {rows, cols}), y, -1, ScalarType::kfloat16, gi),
           xdnn::NOT_IMPLEMENT);
}

void TestEmbedding(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const int64_t V = 5, D = 3;
  const std::vector<float> w = Iota(V * D, 0, 1);
  // Index 7 is out of range: only the kernel sees it, and skips its row.
  const std::vector<int64_t> idx = {4, 0, 7, 4};
  Dev<float> dw(w), dout(std::vector<float>(4 * D, -9));
  Dev<int64_t> di(idx);
  Tensor out = T32(dout.ptr, {2, 2, D});
  CHECK_RC(xdnn_pytorch::embedding(ctx, T32(dw.ptr, {V, D}), I64(di.ptr, {2, 2}), -1, false, false, out),
           xdnn::SUCCESS);
  CheckClose("embedding (index 7 skipped)", dout.Read(s), {12, 13, 14, 0, 1, 2, -9, -9, -9, 12, 13, 14});
  // int32 indices, a 0-dim index (sent as {1}) giving [D].
  Dev<int32_t> di32(std::vector<int32_t>{2});
  CHECK_RC(xdnn_pytorch::embedding(ctx, T32(dw.ptr, {V, D}), Of(ScalarType::kint32, di32.ptr, {1}), -1, false, false,
                                   out = T32(dout.ptr, {D})),
           xdnn::SUCCESS);
  const std::vector<float> row = dout.Read(s);
  CheckClose("embedding int32 0-dim index", {row[0], row[1], row[2]}, {6, 7, 8});
  CHECK_RC(xdnn_pytorch::embedding(ctx, T32(dw.ptr, {V, D}), Of(ScalarType::kint16, di.ptr, {2}), -1, false, false,
                                   out = T32(dout.ptr, {2, D})),
           xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::embedding(ctx, T32(dw.ptr, {V * D}), I64(di.ptr, {2}), -1, false, false, out),
           xdnn::INVALID_PARAM);

  // Backward: grad_weight zeroed, rows accumulated; padding_idx 0 and the
  // out-of-range 7 contribute nothing.
  const std::vector<int64_t> bidx = {4, 0, 7, 4, 1, 0};
  Dev<int64_t> dbi(bidx);
  const std::vector<float> go = Wavy(6 * D, 0.5);
  Dev<float> dgo(go), dgw(std::vector<float>(V * D, -9));
  Tensor gw = T32(dgw.ptr, {V, D});
  CHECK_RC(xdnn_pytorch::embedding_dense_backward(ctx, T32(dgo.ptr, {2, 3, D}), I64(dbi.ptr, {2, 3}), V, 0, false, gw),
           xdnn::SUCCESS);
  std::vector<double> want(V * D, 0);
  for (size_t i = 0; i < bidx.size(); ++i) {
    if (bidx[i] == 0 || bidx[i] >= V) continue;
    for (int64_t j = 0; j < D; ++j) want[bidx[i] * D + j] += go[i * D + j];
  }
  CheckClose("embedding_dense_backward", dgw.Read(s), want);
  CHECK_RC(xdnn_pytorch::embedding_dense_backward(ctx, T32(dgo.ptr, {2, 3, D}), I64(dbi.ptr, {2, 3}), V, 0, true, gw),
           xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::embedding_dense_backward(ctx, T32(dgo.ptr, {2, 3, D}), I64(dbi.ptr, {3, 2}), V, 0, false, gw),
           xdnn::INVALID_PARAM);
}

void TestGelu(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  const std::vector<float> x = {-3, -1, -0.25f, 0, 0.5f, 1, 2, 4};
  const std::vector<float> g = {1, -2, 0.5f, 3, 1, 1, -1, 2};
  Dev<float> dx(x), dg(g), dout(8);
  Tensor out = T32(dout.ptr, {2, 4});
  const double pi = std::acos(-1.0), k = std::sqrt(2 / pi);
  std::vector<double> want(8);
  CHECK_RC(xdnn_pytorch::gelu(ctx, T32(dx.ptr, {2, 4}), "none", out), xdnn::SUCCESS);
  for (int i = 0; i < 8; ++i) want[i] = 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0)));
  CheckClose("gelu none", dout.Read(s), want);
  CHECK_RC(xdnn_pytorch::gelu(ctx, T32(dx.ptr, {2, 4}), "tanh", out), xdnn::SUCCESS);
  for (int i = 0; i < 8; ++i) want[i] = 0.5 * x[i] * (1 + std::tanh(k * (x[i] + 0.044715 * std::pow(x[i], 3))));
  CheckClose("gelu tanh", dout.Read(s), want);
  CHECK_RC(xdnn_pytorch::gelu_backward(ctx, T32(dg.ptr, {2, 4}), T32(dx.ptr, {2, 4}), "none", out), xdnn::SUCCESS);
  for (int i = 0; i < 8; ++i) {
    const double cdf = 0.5 * (1 + std::erf(x[i] / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * x[i] * x[i]) / std::sqrt(2 * pi);
    want[i] = g[i] * (cdf + x[i] * pdf);
  }
  CheckClose("gelu_backward none", dout.Read(s), want);
  CHECK_RC(xdnn_pytorch::gelu_backward(ctx, T32(dg.ptr, {2, 4}), T32(dx.ptr, {2, 4}), "tanh", out), xdnn::SUCCESS);
  for (int i = 0; i < 8; ++i) {
    const double u = k * (x[i] + 0.044715 * std::pow(x[i], 3)), t = std::tanh(u);
    want[i] = g[i] * (0.5 * (1 + t) + 0.5 * x[i] * (1 - t * t) * k * (1 + 3 * 0.044715 * x[i] * x[i]));
  }
  CheckClose("gelu_backward tanh", dout.Read(s), want);
  CHECK_RC(xdnn_pytorch::gelu(ctx, T32(dx.ptr, {2, 4}), "exact", out), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::gelu_backward(ctx, T32(dg.ptr, {2, 4}), T32(dx.ptr, {2, 4}), "", out), xdnn::INVALID_PARAM);
}

void TestPooling(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  // max_pool2d 3x3, stride 2, padding 1 over [1,2,5,5]: output [1,2,3,3].
  const int64_t C = 2, H = 5, W = 5, K = 3, S = 2, P = 1, HO = 3, WO = 3;
  std::vector<float> x = Wavy(C * H * W, 0.6);
  x[7] = x[8];  // a tie: the first position wins
  Dev<float> dx(x), dout(C * HO * WO);
  Dev<int64_t> didx(C * HO * WO);
  Tensor out = T32(dout.ptr, {1, C, HO, WO}), idx = I64(didx.ptr, {1, C, HO, WO});
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices(ctx, T32(dx.ptr, {1, C, H, W}), {K}, {S}, {P}, {1}, false, out, idx),
           xdnn::SUCCESS);
  std::vector<double> want(C * HO * WO);
  std::vector<int64_t> widx(C * HO * WO);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t oh = 0; oh < HO; ++oh)
      for (int64_t ow = 0; ow < WO; ++ow) {
        double best = -INFINITY;
        int64_t at = -1;
        for (int64_t ih = oh * S - P; ih < oh * S - P + K; ++ih)
          for (int64_t iw = ow * S - P; iw < ow * S - P + K; ++iw) {
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            if (x[(c * H + ih) * W + iw] > best) best = x[(c * H + ih) * W + iw], at = ih * W + iw;
          }
        want[(c * HO + oh) * WO + ow] = best;
        widx[(c * HO + oh) * WO + ow] = at;
      }
  CheckClose("max_pool2d_with_indices: out", dout.Read(s), want);
  CHECK(didx.Read(s) == widx);
  // Backward: grad scattered (added) at the indices.
  const std::vector<float> go = Wavy(C * HO * WO, 0.8);
  Dev<float> dgo(go), dgi(C * H * W);
  Tensor gi = T32(dgi.ptr, {1, C, H, W});
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices_backward(ctx, T32(dgo.ptr, {1, C, HO, WO}), T32(dx.ptr, {1, C, H, W}),
                                                          {K}, {S}, {P}, {1}, false, idx, gi),
           xdnn::SUCCESS);
  std::vector<double> wgi(C * H * W, 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t o = 0; o < HO * WO; ++o) wgi[c * H * W + widx[c * HO * WO + o]] += go[c * HO * WO + o];
  CheckClose("max_pool2d_with_indices_backward", dgi.Read(s), wgi);
  // ceil_mode on [C,H,W] (no batch), 2x2 stride 2 over 5x5: 3x3; without: 2x2.
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices(ctx, T32(dx.ptr, {C, H, W}), {2, 2}, {}, {0, 0}, {1, 1}, true,
                                                 out = T32(dout.ptr, {C, 3, 3}), idx = I64(didx.ptr, {C, 3, 3})),
           xdnn::SUCCESS);
  const std::vector<int64_t> ci = didx.Read(s);
  CHECK(ci[8] == 24);  // the last window holds only x[4][4]
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices(ctx, T32(dx.ptr, {C, H, W}), {2, 2}, {}, {0, 0}, {1, 1}, false,
                                                 out = T32(dout.ptr, {C, 3, 3}), idx = I64(didx.ptr, {C, 3, 3})),
           xdnn::INVALID_PARAM);
  // padding over half the kernel; float indices.
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices(ctx, T32(dx.ptr, {C, H, W}), {2}, {1}, {2}, {1}, false,
                                                 out = T32(dout.ptr, {C, 8, 8}), idx = I64(didx.ptr, {C, 8, 8})),
           xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices(ctx, T32(dx.ptr, {C, H, W}), {2}, {}, {0}, {1}, false,
                                                 out = T32(dout.ptr, {C, 2, 2}), idx = T32(didx.ptr, {C, 2, 2})),
           xdnn::NOT_IMPLEMENT);

  // adaptive_avg_pool2d [1,2,5,7] -> [2,3]: windows [floor(i*In/Out), ceil((i+1)*In/Out)).
  const int64_t AH = 5, AW = 7, OH = 2, OW = 3;
  const std::vector<float> a = Wavy(C * AH * AW, 1.1);
  Dev<float> da(a), dao(C * OH * OW), dag(Wavy(C * OH * OW, 0.2)), dagi(C * AH * AW);
  Tensor ao = T32(dao.ptr, {1, C, OH, OW});
  CHECK_RC(xdnn_pytorch::adaptive_avg_pool2d(ctx, T32(da.ptr, {1, C, AH, AW}), {OH, OW}, ao), xdnn::SUCCESS);
  const std::vector<float> ag = dag.Read(s);
  std::vector<double> wa(C * OH * OW, 0), wag(C * AH * AW, 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t h0 = oh * AH / OH, h1 = ((oh + 1) * AH + OH - 1) / OH;
        const int64_t w0 = ow * AW / OW, w1 = ((ow + 1) * AW + OW - 1) / OW;
        const double n = static_cast<double>((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) {
            wa[(c * OH + oh) * OW + ow] += a[(c * AH + ih) * AW + iw] / n;
            wag[(c * AH + ih) * AW + iw] += ag[(c * OH + oh) * OW + ow] / n;
          }
      }
  CheckClose("adaptive_avg_pool2d", dao.Read(s), wa);
  Tensor agi = T32(dagi.ptr, {1, C, AH, AW});
  CHECK_RC(xdnn_pytorch::adaptive_avg_pool2d_backward(ctx, T32(dag.ptr, {1, C, OH, OW}), T32(da.ptr, {1, C, AH, AW}),
                                                      agi),
           xdnn::SUCCESS);
  CheckClose("adaptive_avg_pool2d_backward", dagi.Read(s), wag);
  CHECK_RC(xdnn_pytorch::adaptive_avg_pool2d(ctx, T32(da.ptr, {1, C, AH, AW}), {OH}, ao), xdnn::INVALID_PARAM);
}

void TestCatWhere(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  // cat along dim -1 of [2,2] (a transposed view), a legacy empty [0], and [2,3].
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8, 9, 10};
  Dev<float> da(a), db(b), dout(10);
  Tensor out = T32(dout.ptr, {2, 5});
  CHECK_RC(xdnn_pytorch::cat(ctx, {T32(da.ptr, {2, 2}, {1, 2}), T32(nullptr, {0}), T32(db.ptr, {2, 3})}, -1, out),
           xdnn::SUCCESS);
  CheckClose("cat dim -1", dout.Read(s), {1, 3, 5, 6, 7, 2, 4, 8, 9, 10});
  CHECK_RC(xdnn_pytorch::cat(ctx, {T32(da.ptr, {2, 2}), T32(db.ptr, {2, 3})}, 0, out = T32(dout.ptr, {4, 2})),
           xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::cat(ctx, {}, 0, out), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::cat(ctx, {T32(da.ptr, {4}), Of(ScalarType::kfloat64, db.ptr, {2})}, 0,
                             out = T32(dout.ptr, {6})),
           xdnn::NOT_IMPLEMENT);
  // int64 along dim 0.
  Dev<int64_t> di(std::vector<int64_t>{1, 2, 3}), dio(5);
  Tensor io = I64(dio.ptr, {5, 1});
  CHECK_RC(xdnn_pytorch::cat(ctx, {I64(di.ptr, {3, 1}), I64(di.ptr, {2, 1})}, 0, io), xdnn::SUCCESS);
  CHECK(dio.Read(s) == (std::vector<int64_t>{1, 2, 3, 1, 2}));

  // where: condition [2,1], self [3], other 0-dim, out [2,3].
  Dev<unsigned char> dc(std::vector<unsigned char>{1, 0});
  Dev<float> dself(std::vector<float>{1, 2, 3}), dother(std::vector<float>{-1}), dwo(6);
  Tensor wo = T32(dwo.ptr, {2, 3});
  CHECK_RC(xdnn_pytorch::where(ctx, Of(ScalarType::kbool, dc.ptr, {2, 1}), T32(dself.ptr, {3}), T32(dother.ptr, {1}),
                               wo),
           xdnn::SUCCESS);
  CheckClose("where", dwo.Read(s), {1, 2, 3, -1, -1, -1});
  // A float condition; a condition [2] that does not broadcast to [2,3].
  CHECK_RC(xdnn_pytorch::where(ctx, T32(dself.ptr, {3}), T32(dself.ptr, {3}), T32(dother.ptr, {1}), wo),
           xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::where(ctx, Of(ScalarType::kbool, dc.ptr, {2}), T32(dself.ptr, {3}), T32(dother.ptr, {1}), wo),
           xdnn::INVALID_PARAM);
}

// float64 goes through the same kernels.
void TestNnFloat64(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  Dev<double> dx(std::vector<double>{1, 2, 3, 4}), dy(4);
  Tensor y = Of(ScalarType::kfloat64, dy.ptr, {2, 2});
  CHECK_RC(xdnn_pytorch::softmax(ctx, Of(ScalarType::kfloat64, dx.ptr, {2, 2}), 0, false, y), xdnn::SUCCESS);
  const std::vector<double> v = dy.Read(s);
  const double e = 1 / (1 + std::exp(2.0));
  CHECK(std::abs(v[0] - e) < 1e-12 && std::abs(v[2] - (1 - e)) < 1e-12);
  // No type promotion: a float64 input with a float32 output.
  CHECK_RC(xdnn_pytorch::gelu(ctx, Of(ScalarType::kfloat64, dx.ptr, {4}), "none", y = T32(dy.ptr, {4})),
           xdnn::NOT_IMPLEMENT);
}

// ---- hostile properties --------------------------------------------------

void TestRefusals(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  Dev<float> da(std::vector<float>{1, 2, 3, 4}), dout(4);
  // float16: the dtype is refused whole.
  Tensor h = Of(ScalarType::kfloat16, da.ptr, {4});
  CHECK_RC(xdnn_pytorch::add_tensor(ctx, h, h, kOne, h), xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::relu(ctx, h, h), xdnn::NOT_IMPLEMENT);
  // Mixed float dtypes: no type promotion.
  Tensor out = T32(dout.ptr, {4});
  CHECK_RC(xdnn_pytorch::add_tensor(ctx, T32(da.ptr, {4}), Of(ScalarType::kfloat64, da.ptr, {2}), kOne, out),
           xdnn::NOT_IMPLEMENT);
  // Ranges not inside one allocation: one element too many, a host
  // pointer, and a null pointer.
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {5}), out = T32(dout.ptr, {5})), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {2}, {4}), out = T32(dout.ptr, {2})), xdnn::INVALID_PARAM);
  float host[4] = {};
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(host, {4}), out = T32(dout.ptr, {4})), xdnn::INVALID_PARAM);
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {4}), out = T32(nullptr, {4})), xdnn::INVALID_PARAM);
  // A freed allocation.
  void* gone = nullptr;
  REQUIRE(xpu_malloc(&gone, 16, 0) == 0);
  REQUIRE(xpu_free(gone) == 0);
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {4}), out = T32(gone, {4})), xdnn::INVALID_PARAM);
  // Zero elements: nothing to translate, nothing done.
  CHECK_RC(xdnn_pytorch::neg(ctx, T32(nullptr, {0, 3}), out = T32(nullptr, {0, 3})), xdnn::SUCCESS);
  CHECK_RC(xdnn_pytorch::mm(ctx, T32(nullptr, {0, 3}), T32(da.ptr, {3, 1}), out = T32(nullptr, {0, 1})),
           xdnn::SUCCESS);
  // k == 0: out is zeros (out has elements, the inputs none).
  CHECK_RC(xdnn_pytorch::mm(ctx, T32(nullptr, {2, 0}), T32(nullptr, {0, 2}), out = T32(dout.ptr, {2, 2})),
           xdnn::SUCCESS);
  CheckClose("mm k=0", dout.Read(s), {0, 0, 0, 0});
  // Nothing above wrote `da`.
  CheckClose("refused calls wrote nothing", da.Read(s), {1, 2, 3, 4});
}

// The result is not there before the stream's work ran: a read through the
// NULL stream (which does not wait for the created one) sees the old bytes.
void TestLate(xdnn::Context* ctx) {
  if (ctx->xpu_stream == nullptr || g_delay_us < 1000) return;
  Dev<float> da(std::vector<float>{1, 2}), dout(std::vector<float>{-9, -9});
  Tensor out = T32(dout.ptr, {2});
  for (int attempt = 0; attempt < 5; ++attempt) {
    dout.Upload({-9, -9});
    const Clock::time_point t0 = Clock::now();
    CHECK_RC(xdnn_pytorch::neg(ctx, T32(da.ptr, {2}), out), xdnn::SUCCESS);
    std::vector<float> early(2);
    REQUIRE(xpu_memcpy(early.data(), dout.ptr, sizeof(float) * 2, kD2H) == 0);
    const bool judged = Clock::now() - t0 < std::chrono::microseconds(g_delay_us);
    CheckClose("neg after wait", dout.Read(ctx->xpu_stream), {-1, -2});
    if (!judged) continue;
    CHECK(early[0] == -9 && early[1] == -9);
    return;
  }
  std::printf("late-completion check inconclusive (machine too slow)\n");
}

// A malformed FAKE_XDNN_* aborts the load.
void TestBadEnv() {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setenv("FAKE_XDNN_FAIL", "exp:NOPE", 1);
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2);
    execl("/proc/self/exe", "fake_xdnn_selftest", "version", static_cast<char*>(nullptr));
    _exit(99);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

int RunAll(xdnn::Context* ctx) {
  TestElementwise(ctx);
  TestFillCopy(ctx);
  TestMatmul(ctx);
  TestReductions(ctx);
  TestLogSoftmax(ctx);
  TestNllLoss(ctx);
  TestConvolution(ctx);
  TestBatchNorm(ctx);
  TestLayerNorm(ctx);
  TestSoftmax(ctx);
  TestEmbedding(ctx);
  TestGelu(ctx);
  TestPooling(ctx);
  TestCatWhere(ctx);
  TestNnFloat64(ctx);
  TestRefusals(ctx);
  TestLate(ctx);
  return g_failures;
}

// ctest sets FAKE_XDNN_LIE=mm,copy,softmax,max_pool2d_with_indices,
// FAKE_XDNN_FAIL=exp:RUNTIME_ERROR,neg:NO_ENOUGH_WORKSPACE,convolution:INVALID_PARAM
// and FAKE_XDNN_NOT_IMPLEMENT=mul_tensor:float32,relu:*,where:bool,gelu:float64.
void TestInjected(xdnn::Context* ctx) {
  void* s = ctx->xpu_stream;
  Dev<float> da(std::vector<float>{1, 2, 3, 4}), dout(4);
  Tensor a = T32(da.ptr, {2, 2}), out = T32(dout.ptr, {2, 2});
  CHECK_RC(xdnn_pytorch::mm(ctx, a, a, out), xdnn::SUCCESS);
  const std::vector<float> lied = dout.Read(s);
  CHECK(lied != (std::vector<float>{7, 10, 15, 22}));
  for (size_t i = 0; i < 4; ++i) CHECK(std::abs(lied[i] - std::vector<float>{7, 10, 15, 22}[i]) >= 1);
  CHECK_RC(xdnn_pytorch::add_tensor(ctx, a, a, kOne, out), xdnn::SUCCESS);
  CheckClose("add_tensor untouched by injections", dout.Read(s), {2, 4, 6, 8});
  Dev<int64_t> di(std::vector<int64_t>{5, 6, 7, 8});
  CHECK_RC(xdnn_pytorch::copy(ctx, Of(ScalarType::kint64, di.ptr, {4}), out = T32(dout.ptr, {4})), xdnn::SUCCESS);
  CHECK(dout.Read(s) != (std::vector<float>{5, 6, 7, 8}));
  Tensor ti = Of(ScalarType::kint64, di.ptr, {4});
  CHECK_RC(xdnn_pytorch::copy(ctx, T32(da.ptr, {4}), ti), xdnn::SUCCESS);
  CHECK(di.Read(s) != (std::vector<int64_t>{1, 2, 3, 4}));

  dout.Upload({0, 0, 0, 0});
  CHECK_RC(xdnn_pytorch::exp(ctx, a, out = T32(dout.ptr, {2, 2})), xdnn::RUNTIME_ERROR);
  CHECK_RC(xdnn_pytorch::neg(ctx, a, out), xdnn::NO_ENOUGH_WORKSPACE);
  CHECK_RC(xdnn_pytorch::mul_tensor(ctx, a, a, out), xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::relu(ctx, a, out), xdnn::NOT_IMPLEMENT);
  // Injected failures win over validation (even a null context).
  CHECK_RC(xdnn_pytorch::exp(nullptr, a, out), xdnn::RUNTIME_ERROR);
  CheckClose("refused calls wrote nothing", dout.Read(s), {0, 0, 0, 0});
  // mul_tensor:float32 only: float64 goes on to validation.
  Dev<double> dd(std::vector<double>{1, 2});
  Tensor d64 = Of(ScalarType::kfloat64, dd.ptr, {2});
  CHECK_RC(xdnn_pytorch::mul_tensor(ctx, d64, d64, d64), xdnn::SUCCESS);
  const std::vector<double> sq = dd.Read(s);
  CHECK(sq == (std::vector<double>{1, 4}));
  CHECK(fake_xdnn_calls("exp") == 2);
  CHECK(fake_xdnn_calls("mul_tensor") == 2);
  CHECK(fake_xdnn_calls("mm") == 1);

  // The newer ops take the same injections: softmax and
  // max_pool2d_with_indices lie (indices too), convolution fails, where
  // refuses a bool condition (its first tensor argument), gelu float64.
  Dev<float> dx(std::vector<float>{0, 0, 0, 0}), dy(4);
  CHECK_RC(xdnn_pytorch::softmax(ctx, T32(dx.ptr, {4}), 0, false, out = T32(dy.ptr, {4})), xdnn::SUCCESS);
  for (float v : dy.Read(s)) CHECK(std::abs(v - 0.25f) >= 1);
  dx.Upload({1, 4, 3, 2});
  Dev<int64_t> didx(1);
  Tensor pidx = Of(ScalarType::kint64, didx.ptr, {1, 1, 1});
  CHECK_RC(xdnn_pytorch::max_pool2d_with_indices(ctx, T32(dx.ptr, {1, 2, 2}), {2}, {}, {0}, {1}, false,
                                                 out = T32(dy.ptr, {1, 1, 1}), pidx),
           xdnn::SUCCESS);
  CHECK(dy.Read(s)[0] != 4);
  CHECK(didx.Read(s)[0] == 2);  // the right index is 1
  CHECK_RC(xdnn_pytorch::convolution(nullptr, T32(dx.ptr, {1, 1, 2, 2}), T32(dx.ptr, {1, 1, 2, 2}), std::nullopt,
                                     {1}, {0}, {1}, false, {0}, 1, out = T32(dy.ptr, {1, 1, 1, 1})),
           xdnn::INVALID_PARAM);
  Dev<unsigned char> dc(std::vector<unsigned char>{1, 0, 1, 0});
  CHECK_RC(xdnn_pytorch::where(ctx, Of(ScalarType::kbool, dc.ptr, {4}), T32(dx.ptr, {4}), T32(dx.ptr, {4}),
                               out = T32(dy.ptr, {4})),
           xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::where(ctx, Of(ScalarType::kuint8, dc.ptr, {4}), T32(dx.ptr, {4}), T32(dx.ptr, {4}), out),
           xdnn::SUCCESS);
  CheckClose("where with a uint8 condition untouched by injections", dy.Read(s), {1, 4, 3, 2});
  CHECK_RC(xdnn_pytorch::gelu(ctx, d64, "none", d64), xdnn::NOT_IMPLEMENT);
  CHECK_RC(xdnn_pytorch::gelu(ctx, T32(dx.ptr, {4}), "none", out = T32(dy.ptr, {4})), xdnn::SUCCESS);
  CHECK(fake_xdnn_calls("convolution") == 1);
  CHECK(fake_xdnn_calls("where") == 2);
  CHECK(fake_xdnn_calls("gelu") == 2);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "version") {
    std::printf("%s\n", fake_xdnn_version());
    return 0;
  }
  if (const char* d = std::getenv("FAKE_XPU_DELAY_US")) g_delay_us = std::atoll(d);
  CHECK(std::string(fake_xdnn_version()) == "fake xdnn_pytorch 0.1");

  xdnn::Context* ctx = xdnn::create_context();
  REQUIRE(ctx != nullptr);
  if (mode == "injected") {
    TestInjected(ctx);
  } else {
    // On the NULL stream, then on a created one.
    RunAll(ctx);
    void* stream = nullptr;
    REQUIRE(xpu_stream_create(&stream) == 0);
    ctx->xpu_stream = stream;
    RunAll(ctx);
    REQUIRE(xpu_stream_destroy(stream) == 0);
    ctx->xpu_stream = nullptr;
    // Work for a stream of another device is refused.
    int count = 0;
    REQUIRE(xpu_device_count(&count) == 0);
    if (count > 1) {
      REQUIRE(xpu_set_device(1) == 0);
      void* other = nullptr;
      REQUIRE(xpu_stream_create(&other) == 0);
      REQUIRE(xpu_set_device(0) == 0);
      Dev<float> da(std::vector<float>{1});
      Tensor a = T32(da.ptr, {1});
      ctx->xpu_stream = other;
      CHECK_RC(xdnn_pytorch::neg(ctx, a, a), xdnn::INVALID_PARAM);
      ctx->xpu_stream = nullptr;
      REQUIRE(xpu_set_device(1) == 0);
      REQUIRE(xpu_stream_destroy(other) == 0);
      REQUIRE(xpu_set_device(0) == 0);
    }
    CHECK(fake_xdnn_calls("add_tensor") >= 4);
    CHECK(fake_xdnn_calls("create_context") == 1);
    CHECK(fake_xdnn_calls("no_such_op") == 0);
    TestBadEnv();
  }
  xdnn::destroy_context(ctx);
  if (g_failures != 0) {
    std::fprintf(stderr, "fake_xdnn_selftest%s: %d failure(s)\n", mode.empty() ? "" : (" " + mode).c_str(),
                 g_failures);
    return 1;
  }
  std::printf("fake_xdnn_selftest%s: ok\n", mode.empty() ? "" : (" " + mode).c_str());
  return 0;
}
