"""torch.autocast("flagos", ...) casts like CPU autocast does: matmul, linear
and convolutions run in the lower precision, and the results agree with
torch.autocast("cpu", ...) on identical inputs.

The reference for each op is CPU autocast with the same dtype; only ops
whose autocast policy is the same on the CPU and on CUDA are compared
(flagos may follow either list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from models import FL, assert_same, to_device

BF16 = torch.bfloat16
# bf16 has 8 bits of mantissa: one rounding step is 2**-8 relative.
RTOL = 1.6e-2
ATOL = 1e-2


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def autocast_same(fn: Callable[..., Any], *args: Any, dtype: torch.dtype = BF16,
                  expect: torch.dtype | None = None) -> Any:
    """fn under autocast on flagos == fn under CPU autocast.

    Same dtypes and shapes; values within bf16's rounding."""
    with torch.autocast("cpu", dtype=dtype):
        expected = fn(*args)
    with torch.autocast(FL, dtype=dtype):
        actual = fn(*to_device(list(args), FL))
    if expect is not None:
        assert expected.dtype == expect, "the CPU reference itself changed policy"
    assert_same(actual, expected, rtol=RTOL, atol=ATOL)
    return actual


# ------------------------------------------------------------------ the device module


def test_device_module_has_get_amp_supported_dtype() -> None:
    dtypes = torch.flagos.get_amp_supported_dtype()
    assert torch.bfloat16 in dtypes
    assert torch.float16 in dtypes


def test_autocast_is_available_for_flagos() -> None:
    assert torch.amp.is_autocast_available(FL)


def test_autocast_context_sets_flagos_state() -> None:
    assert not torch.is_autocast_enabled(FL)
    with torch.autocast(FL, dtype=BF16):
        assert torch.is_autocast_enabled(FL)
        assert torch.get_autocast_dtype(FL) == BF16
        assert not torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled(FL)


# ------------------------------------------------------------------ lower-precision ops


def test_matmul() -> None:
    autocast_same(torch.matmul, randn(6, 16), randn(16, 5, seed=1), expect=BF16)


def test_matmul_operator_batched() -> None:
    autocast_same(lambda a, b: a @ b, randn(3, 6, 16), randn(16, 5, seed=1), expect=BF16)


def test_mm() -> None:
    autocast_same(torch.mm, randn(6, 16), randn(16, 5, seed=1), expect=BF16)


def test_bmm() -> None:
    autocast_same(torch.bmm, randn(2, 6, 16), randn(2, 16, 5, seed=1), expect=BF16)


def test_addmm() -> None:
    autocast_same(torch.addmm, randn(6, 5, seed=2), randn(6, 16), randn(16, 5, seed=1),
                  expect=BF16)


def test_baddbmm() -> None:
    autocast_same(torch.baddbmm, randn(2, 6, 5, seed=2), randn(2, 6, 16),
                  randn(2, 16, 5, seed=1), expect=BF16)


def test_functional_linear() -> None:
    autocast_same(nn.functional.linear, randn(4, 16), randn(8, 16, seed=1), randn(8, seed=2),
                  expect=BF16)


def test_linear_module() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    fl_layer = nn.Linear(16, 8).to(FL)
    fl_layer.load_state_dict(layer.state_dict())
    x = randn(4, 16)
    with torch.autocast("cpu", dtype=BF16):
        expected = layer(x)
    with torch.autocast(FL, dtype=BF16):
        actual = fl_layer(x.to(FL))
    assert fl_layer.weight.dtype == torch.float32  # autocast casts copies, not parameters
    assert_same(actual, expected, rtol=RTOL, atol=ATOL)
    assert actual.dtype == BF16


def test_conv2d() -> None:
    autocast_same(
        lambda x, w, b: nn.functional.conv2d(x, w, b, padding=1),
        randn(2, 4, 8, 8), randn(6, 4, 3, 3, seed=1), randn(6, seed=2), expect=BF16,
    )


def test_conv1d() -> None:
    autocast_same(nn.functional.conv1d, randn(2, 4, 10), randn(3, 4, 3, seed=1), expect=BF16)


def test_scaled_dot_product_attention() -> None:
    autocast_same(nn.functional.scaled_dot_product_attention,
                  randn(2, 2, 8, 8), randn(2, 2, 8, 8, seed=1), randn(2, 2, 8, 8, seed=2),
                  expect=BF16)


def test_float16() -> None:
    autocast_same(torch.mm, randn(6, 16), randn(16, 5, seed=1), dtype=torch.float16,
                  expect=torch.float16)


# ------------------------------------------------------------------ other policies


def test_elementwise_ops_keep_float32() -> None:
    autocast_same(lambda a, b: (a + b) * 2, randn(4, 4), randn(4, 4, seed=1),
                  expect=torch.float32)


def test_ops_on_lower_precision_results_stay_lower_precision() -> None:
    autocast_same(lambda a, b: torch.relu(a @ b) + 1, randn(4, 8), randn(8, 4, seed=1),
                  expect=BF16)


def test_float32_policy_op_mse_loss() -> None:
    autocast_same(nn.functional.mse_loss, randn(4, 8).to(BF16), randn(4, 8, seed=1).to(BF16),
                  expect=torch.float32)


def test_disabled_inside_enabled() -> None:
    a, b = randn(6, 16).to(FL), randn(16, 5, seed=1).to(FL)
    with torch.autocast(FL, dtype=BF16):
        with torch.autocast(FL, enabled=False):
            out = a @ b
    assert out.dtype == torch.float32
    assert_same(out, randn(6, 16) @ randn(16, 5, seed=1), rtol=1e-5, atol=1e-5)


def test_flagos_autocast_leaves_cpu_ops_alone() -> None:
    a, b = randn(6, 16), randn(16, 5, seed=1)
    with torch.autocast(FL, dtype=BF16):
        out = a @ b
    assert out.dtype == torch.float32


def test_cpu_autocast_leaves_flagos_ops_alone() -> None:
    a, b = randn(6, 16).to(FL), randn(16, 5, seed=1).to(FL)
    with torch.autocast("cpu", dtype=BF16):
        out = a @ b
    assert out.dtype == torch.float32 and out.device.type == FL


# ------------------------------------------------------------------ training under autocast


def test_backward_under_autocast_matches_cpu() -> None:
    torch.manual_seed(3)
    cpu_model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    fl_model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(FL)
    fl_model.load_state_dict(cpu_model.state_dict())
    x, y = randn(8, 16), torch.arange(8) % 4

    def step(model: nn.Module, device: str) -> torch.Tensor:
        with torch.autocast(device, dtype=BF16):
            logits = model(x.to(device))
            assert logits.dtype == BF16
        loss = nn.functional.cross_entropy(logits.float(), y.to(device))
        loss.backward()
        return loss.detach()

    expected = step(cpu_model, "cpu")
    actual = step(fl_model, FL)
    assert_same(actual, expected, rtol=RTOL, atol=ATOL)
    for (name, p), q in zip(fl_model.named_parameters(), cpu_model.parameters()):
        assert p.grad.dtype == torch.float32, name
        assert_same(p.grad, q.grad, rtol=RTOL, atol=ATOL, path=name)


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_weight_cast_cache(cache_enabled: bool) -> None:
    # The autocast cache reuses the bf16 copy of a leaf parameter within a context.
    w = randn(8, 16).to(FL).requires_grad_()
    x = randn(4, 16).to(FL)
    with torch.autocast(FL, dtype=BF16, cache_enabled=cache_enabled):
        first = nn.functional.linear(x, w)
        second = nn.functional.linear(x, w)
    assert first.dtype == second.dtype == BF16
    assert torch.equal(first.detach().cpu(), second.detach().cpu())
