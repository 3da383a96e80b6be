"""flagos accepts the dtypes CUDA's kernels accept where ATen's CPU kernels do not.

Each operator of the daemon's widening table (backends/cpu/cpu_dtype_widening.cc,
docs/reference/dtype-widening.md) at each of its missing dtypes, compared
with a CPU reference computed in a wider dtype and converted back, or with
CUDA's definition where the wider CPU kernel would differ (histc's integer
bins). The CPU itself refuses every one of these calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_fl  # noqa: F401  (registers "flagos")

DEVICE = "flagos"
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
REDUCED = [torch.float16, torch.bfloat16]


def cuda_histc(x: torch.Tensor, bins: int, min: float, max: float) -> torch.Tensor:
    """CUDA's histc of an integer tensor, by its definition (SummaryOps.cu), in int64 arithmetic."""
    v = x.reshape(-1).to(torch.int64)
    lo, hi = int(min), int(max)  # Scalar::to<int64_t>: truncation
    if lo == hi and v.numel() > 0:
        lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    inside = v[(v >= lo) & (v <= hi)]
    index = torch.div((inside - lo) * bins, hi - lo, rounding_mode="trunc").clamp(max=bins - 1)
    return torch.bincount(index, minlength=bins).to(x.dtype)


# ------------------------------------------------------------------ histc on integers


BOUNDS = {
    "experts": (4, 0, 4),
    "range": (7, -3, 11),
    "data-extremes": (5, 0, 0),
    "float-bounds": (3, 2.7, 9.9),
    "equal-bounds": (6, 5, 5),
    "one-bin": (1, -100, 100),
}


@pytest.mark.parametrize(
    "dtype, bins, min, max",
    [pytest.param(dtype, *bounds, id=f"{name}-{dtype}")
     for dtype in INT_DTYPES for name, bounds in BOUNDS.items()
     # uint8 holds no negative bound: the call is refused before any kernel
     # ("value cannot be converted to type uint8_t without overflow").
     if dtype != torch.uint8 or bounds[1] >= 0],
)
def test_histc_on_integers_gives_cudas_counts_in_the_input_dtype(dtype, bins, min, max) -> None:
    low = 0 if dtype == torch.uint8 else -5
    x = torch.randint(low, 12, (5, 9), dtype=dtype, generator=torch.Generator().manual_seed(bins))
    with pytest.raises(NotImplementedError, match="not implemented for"):
        torch.histc(x, bins=bins, min=min, max=max)  # the CPU has no integer kernel
    got = torch.histc(x.to(DEVICE), bins=bins, min=min, max=max)
    expected = cuda_histc(x, bins, min, max)
    assert got.dtype == dtype
    assert got.cpu().tolist() == expected.tolist()
    # The same counts as the CPU's float64 kernel over the truncated bounds.
    wide = torch.histc(x.double(), bins=bins, min=float(int(min)), max=float(int(max)))
    if int(min) == int(max) == 0 or int(min) != int(max):
        assert got.cpu().tolist() == wide.to(dtype).tolist()


def test_histc_out_on_integers_writes_the_callers_tensor() -> None:
    x = torch.tensor([0, 1, 1, 3, 3, 3, 9], dtype=torch.int32)
    out = torch.full((4,), -1, dtype=torch.int32, device=DEVICE)
    result = torch.histc(x.to(DEVICE), bins=4, min=0, max=4, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert out.cpu().tolist() == [1, 2, 0, 3]


def test_histc_on_integers_with_max_below_min_raises_cudas_error() -> None:
    x = torch.tensor([1, 2, 3], dtype=torch.int64, device=DEVICE)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x, bins=4, min=5, max=1)


def test_histc_on_bool_is_refused_as_on_cuda() -> None:
    # Neither CUDA nor the CPU has a bool kernel: no widening, the kernel's own error.
    x = torch.tensor([True, False], device=DEVICE)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.histc(x, bins=2)
        torch.flagos.synchronize()


# ------------------------------------------------------------------ bool


def test_abs_of_bool_is_the_identity() -> None:
    x = torch.tensor([True, False, True])
    with pytest.raises(NotImplementedError):
        torch.abs(x)
    got = torch.abs(x.to(DEVICE))
    assert got.dtype == torch.bool
    assert got.cpu().tolist() == torch.abs(x.to(torch.uint8)).bool().tolist()
    y = x.to(DEVICE)
    y.abs_()
    assert y.dtype == torch.bool and y.cpu().tolist() == [True, False, True]
    out = torch.zeros(3, dtype=torch.bool, device=DEVICE)
    torch.abs(x.to(DEVICE), out=out)
    assert out.cpu().tolist() == [True, False, True]


def test_softsign_of_bool_runs_as_on_cuda() -> None:
    x = torch.tensor([True, False, True])
    got = F.softsign(x.to(DEVICE))
    expected = F.softsign(x.to(torch.uint8)).to(got.dtype)  # x / (1 + |x|), |x| in a wider type
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), expected)


def test_trace_of_bool_counts_the_diagonals_trues_as_int64() -> None:
    x = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    with pytest.raises(NotImplementedError):
        torch.trace(x)
    got = torch.trace(x.to(DEVICE))
    assert got.dtype == torch.int64
    assert got.item() == torch.trace(x.to(torch.uint8)).item() == 2


# ------------------------------------------------------------------ float16 / bfloat16


def compare_reduced(fn, inputs: list[torch.Tensor], dtype: torch.dtype, grad: bool = True) -> None:
    """fn on flagos at dtype vs fn on the CPU in float32, rounded to dtype; gradients too."""
    def narrow(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    with pytest.raises(NotImplementedError):
        fn(*[narrow(t) for t in inputs])
    # The reference starts from the same rounded values, in float32.
    ref_in = [narrow(t).float().requires_grad_(grad) if t.is_floating_point() else t for t in inputs]
    ref = fn(*ref_in)
    fl_in = [narrow(t).to(DEVICE).requires_grad_(grad and t.is_floating_point()) for t in inputs]
    assert all(t.is_leaf for t in ref_in + fl_in)
    got = fn(*fl_in)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), ref.to(dtype))
    if not grad:
        return
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    (ref.to(dtype).float() * w.to(dtype).float()).sum().backward()
    (got * w.to(dtype).to(DEVICE)).sum().backward()
    for r, f in zip(ref_in, fl_in):
        if r.is_floating_point():
            assert f.grad.dtype == dtype
            torch.testing.assert_close(f.grad.cpu(), r.grad.to(dtype), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_avg_pool3d_in_reduced_precision(dtype) -> None:
    x = torch.randn(2, 3, 6, 6, 6, generator=torch.Generator().manual_seed(0))
    compare_reduced(lambda t: F.avg_pool3d(t, kernel_size=3, stride=2, padding=1), [x], dtype)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_antialiased_bilinear_upsampling_in_reduced_precision(dtype) -> None:
    x = torch.randn(2, 3, 9, 7, generator=torch.Generator().manual_seed(0))
    compare_reduced(lambda t: F.interpolate(t, size=(4, 5), mode="bilinear", antialias=True), [x], dtype)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_multi_margin_loss_in_reduced_precision(dtype) -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 4, 2, 1, 3, 0])
    compare_reduced(lambda t, y: F.multi_margin_loss(t, y), [x, target], dtype)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_multilabel_margin_loss_in_reduced_precision(dtype) -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([[3, 0, -1, 1, 2], [1, -1, 0, 0, 0], [4, 2, 1, -1, 0], [0, 1, 2, 3, 4]])
    compare_reduced(lambda t, y: F.multilabel_margin_loss(t, y), [x, target], dtype)


def test_rrelu_in_training_in_float16_scales_negatives_within_its_bounds() -> None:
    lower, upper = 0.1, 0.3
    x = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    with pytest.raises(NotImplementedError):
        F.rrelu(x, lower, upper, training=True)
    got = F.rrelu(x.to(DEVICE), lower, upper, training=True).cpu()
    assert got.dtype == torch.float16
    positive = x >= 0
    assert torch.equal(got[positive], x[positive])
    slope = got[~positive].float() / x[~positive].float()
    assert bool(((slope >= lower - 1e-3) & (slope <= upper + 1e-3)).all()), slope
