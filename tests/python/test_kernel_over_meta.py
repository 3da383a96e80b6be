"""Where a meta function and the kernel disagree, flagos does what the kernel does.

flagos infers output shapes on meta tensors; flagosd runs the CPU kernel. A
meta function (which follows CUDA, or is one of torch's Python references)
may refuse a call the kernel runs: then torch_fl asks the daemon's kernel,
synchronously, and the program sees what CPU torch does: the same values,
or the kernel's own error. The cases were found by the mixed-operand sweep
(scripts/mixed-sweep, docs/reference/mixed-operands.md).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")

FL = torch.device("flagos", 0)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_where_with_a_uint8_condition_runs_as_on_the_cpu() -> None:
    # torch._refs.where (the meta) refuses a uint8 condition; the CPU kernel takes it.
    cond = torch.randint(0, 2, (5, 7), generator=gen(1), dtype=torch.uint8)
    x = torch.randn(5, 7, generator=gen(2))
    y = torch.randn(5, 7, generator=gen(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torch.where(cond, x, y)
        actual = torch.where(cond.to(FL), x.to(FL), y.to(FL))
    assert actual.device == FL
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)
    # The result is an ordinary flagos tensor: later ops on it are asynchronous again.
    torch.testing.assert_close((actual * 2).sum().item(), (expected * 2).sum().item())


def test_where_with_a_uint8_condition_differentiates() -> None:
    cond = torch.tensor([1, 0, 1, 1], dtype=torch.uint8)
    x = torch.randn(4, generator=gen(4), requires_grad=True)
    y = torch.randn(4, generator=gen(5), requires_grad=True)
    xf = x.detach().to(FL).requires_grad_()
    yf = y.detach().to(FL).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.where(cond, x, y).pow(2).sum().backward()
        torch.where(cond.to(FL), xf, yf).pow(2).sum().backward()
    torch.testing.assert_close(xf.grad.cpu(), x.grad)
    torch.testing.assert_close(yf.grad.cpu(), y.grad)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.mm(torch.ones(2, 3, device=d), torch.ones(4, 2, device=d)),
        lambda d: torch.cat([torch.ones(2, 3, device=d), torch.ones(2, 4, device=d)]),
        lambda d: torch.ones(2, 3, device=d).view(7),
        lambda d: torch.nn.functional.fractional_max_pool2d(
            torch.rand(1, 1, 8, 8, device=d), 2, output_size=4,
            _random_samples=torch.rand(1, 1, 2, dtype=torch.float64, device=d)),
    ],
    ids=["mm-shapes", "cat-sizes", "view-size", "fractional-max-pool-sample-dtype"],
)
def test_what_both_refuse_raises_the_kernels_error(call) -> None:
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(Exception) as on_flagos:
        call(FL).cpu()
    assert type(on_flagos.value) is type(on_cpu.value)
    # The CPU's message, whether meta or the daemon's kernel raised it.
    first_line = str(on_cpu.value).splitlines()[0].rstrip(".")
    assert first_line in str(on_flagos.value)


@pytest.mark.parametrize(
    "call",
    [
        # A 0-dim float64 `self`: the CPU kernel returns float64, the meta function float32.
        lambda d: torch.addr(torch.tensor(0.5, dtype=torch.float64, device=d),
                             torch.arange(3.0, device=d), torch.arange(4.0, device=d)),
        # A float64 target: the CPU kernel returns the input's float32, the meta function float64.
        lambda d: torch.nn.functional.huber_loss(torch.linspace(-2, 2, 6, device=d),
                                                 torch.linspace(1, 0, 6, dtype=torch.float64, device=d)),
        lambda d: torch.normal(torch.zeros(5, device=d), torch.zeros(5, dtype=torch.float64, device=d)),
        # nn.BCELoss built with a float64 weight, fed float32: the CPU kernel returns float32.
        lambda d: torch.nn.BCELoss(weight=torch.linspace(0.5, 1.5, 4, dtype=torch.float64)).to(d)(
            torch.linspace(0.1, 0.9, 4, device=d), torch.linspace(0.9, 0.2, 4, device=d)),
    ],
    ids=["addr-0dim-self", "huber-loss-target", "normal-std", "bce-loss-weight"],
)
def test_outputs_take_the_kernels_dtype_with_mixed_operands(call) -> None:
    # The backend's kernel facts (NegotiateResponse.kernel_facts, mixed_dtype_operands)
    # send these calls through the kernel, so the result's dtype is the CPU's, not meta's.
    expected = call("cpu")
    actual = call(FL)
    assert actual.device == FL
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected)
