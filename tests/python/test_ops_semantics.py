"""Operators on flagos tensors mean what they mean on the CPU.

Every test computes the same thing on CPU tensors (the reference) and on
flagos copies of them and compares: exactly where the result is
deterministic, with torch's default float tolerance for reductions and
matmul (their summation order may depend on the daemon's thread count).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")

FL = torch.device("flagos", 0)
FL1 = torch.device("flagos", 1)


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=gen, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=gen, dtype=dtype)


def to_fl(value: Any, device: torch.device = FL) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_fl(v, device) for v in value)
    return value


def clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    return value


def to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        assert value.device.type == "flagos", f"result on {value.device}, expected flagos"
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def exact(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def check(fn: Callable[..., Any], *inputs: Any, tolerant: bool = False) -> None:
    """fn(*flagos copies) equals fn(*inputs) computed on the CPU.

    Each side gets its own copy of the inputs: fn may modify them in place.
    """
    flagos_inputs = to_fl(inputs)
    expected = fn(*clone(inputs))
    actual = to_cpu(fn(*flagos_inputs))
    if tolerant:
        torch.testing.assert_close(actual, expected, equal_nan=True)
    else:
        exact(actual, expected)


# ------------------------------------------------------------ non-contiguous


def test_elementwise_ops_on_transposed_inputs() -> None:
    a, b = rand(6, 8, seed=1).t(), rand(8, 6, seed=2)
    assert not a.is_contiguous()
    check(lambda a, b: a * b + a - b, a, b)


def test_elementwise_ops_on_strided_slices() -> None:
    a = rand(10, 12, seed=1)[::2, 1::3]
    b = rand(10, 12, seed=2)[1::2, ::3]
    check(lambda a, b: torch.maximum(a, b) - a / 2, a, b)


def test_unary_op_on_a_non_contiguous_input() -> None:
    a = rand(7, 9, seed=3).t()
    check(lambda a: torch.exp(a).sin(), a, tolerant=True)


def test_contiguous_of_a_permuted_tensor_has_the_permuted_values() -> None:
    a = rand(2, 3, 4, seed=4)
    check(lambda a: a.permute(2, 0, 1).contiguous(), a)


def test_matmul_on_transposed_operands() -> None:
    a, b = rand(16, 8, seed=5), rand(16, 12, seed=6)
    check(lambda a, b: a.t() @ b, a, b, tolerant=True)


# ------------------------------------------------------------------- views

VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "transpose": lambda x: x.transpose(0, 1),
    "slice": lambda x: x[1:3, ::2],
    "expand": lambda x: x[:, :1].expand(4, 6),
    "select": lambda x: x.select(1, 2),
    "view": lambda x: x.view(2, 12),
    "reshape_of_transpose": lambda x: x.t().reshape(24),
    "narrow": lambda x: x.narrow(1, 2, 3),
    "permute": lambda x: x.view(2, 2, 6).permute(2, 0, 1),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "diagonal": lambda x: x.diagonal(),
    "flatten": lambda x: x.flatten(),
    "unfold": lambda x: x.unfold(1, 2, 2),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_has_the_cpu_values(name: str) -> None:
    check(VIEWS[name], rand(4, 6, seed=7))


@pytest.mark.parametrize("name", ["transpose", "slice", "select", "view", "narrow", "permute",
                                  "unsqueeze", "diagonal", "flatten"])
def test_view_shares_storage_with_its_base(name: str) -> None:
    base = torch.zeros(4, 6, device=FL)
    view = VIEWS[name](base)
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", ["transpose", "slice", "select", "view", "narrow", "permute",
                                  "unsqueeze", "diagonal"])
def test_write_through_a_view_is_seen_in_the_base(name: str) -> None:
    def write(x: torch.Tensor) -> torch.Tensor:
        view = VIEWS[name](x)
        view.mul_(-2).add_(1)
        return x

    check(write, rand(4, 6, seed=8))


def test_fill_and_zero_through_indexed_views() -> None:
    def write(x: torch.Tensor) -> torch.Tensor:
        x[:, 1].fill_(5.0)
        x[2].zero_()
        return x

    check(write, rand(4, 6, seed=9))


def test_view_of_a_view_with_a_storage_offset() -> None:
    def chain(x: torch.Tensor) -> torch.Tensor:
        return x[1:, 2:][1:, ::2].t()

    check(chain, rand(6, 8, seed=10))


# --------------------------------------------------------------- in place


IN_PLACE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add_": lambda a, b: a.add_(b, alpha=2),
    "mul_": lambda a, b: a.mul_(b),
    "sub_scalar": lambda a, b: a.sub_(1.5),
    "clamp_": lambda a, b: a.clamp_(-0.5, 0.5),
    "zero_": lambda a, b: a.zero_(),
    "fill_": lambda a, b: a.fill_(3.25),
    "copy_": lambda a, b: a.copy_(b),
    "masked_fill_": lambda a, b: a.masked_fill_(b > 0, -1.0),
}


@pytest.mark.parametrize("name", list(IN_PLACE))
def test_in_place_op_returns_self_and_changes_it(name: str) -> None:
    op = IN_PLACE[name]

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ptr = a.data_ptr()
        out = op(a, b)
        assert out is a and a.data_ptr() == ptr
        return a

    check(run, rand(5, 7, seed=11), rand(5, 7, seed=12))


def test_in_place_op_on_a_non_contiguous_tensor() -> None:
    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.t().add_(b)
        return a

    check(run, rand(4, 5, seed=13), rand(5, 4, seed=14))


def test_copy_from_device_0_to_device_1() -> None:
    src_cpu = rand(300, seed=15)
    src = src_cpu.to(FL)
    dst = torch.zeros(300, device=FL1)
    dst.copy_(src)
    assert dst.device == FL1
    exact(dst.cpu(), src_cpu)


def test_to_moves_a_tensor_between_flagos_devices() -> None:
    src_cpu = rand(3, 4, seed=16)
    moved = src_cpu.to(FL).to(FL1)
    assert moved.device == FL1
    exact(moved.cpu(), src_cpu)


def test_copy_from_cpu_into_a_flagos_slice() -> None:
    dst = torch.zeros(4, 6, device=FL)
    dst[1:3, 2:5].copy_(torch.arange(6.0).view(2, 3))
    expected = torch.zeros(4, 6)
    expected[1:3, 2:5] = torch.arange(6.0).view(2, 3)
    exact(dst.cpu(), expected)


def test_copy_from_a_flagos_slice_into_cpu() -> None:
    src_cpu = rand(4, 6, seed=17)
    dst = torch.zeros(3, 3)
    dst.copy_(src_cpu.to(FL)[1:, ::2].t()[:3])
    exact(dst, src_cpu[1:, ::2].t()[:3])


def test_copy_with_dtype_conversion() -> None:
    src_cpu = rand(10, seed=18) * 100
    dst = torch.zeros(10, dtype=torch.int32, device=FL)
    dst.copy_(src_cpu.to(FL))
    exact(dst.cpu(), src_cpu.to(torch.int32))


# ---------------------------------------------------------------------- out=


def test_add_out_writes_into_the_given_tensor() -> None:
    a, b = rand(3, 4, seed=19), rand(3, 4, seed=20)
    out = torch.empty(3, 4, device=FL)
    ptr = out.data_ptr()
    result = torch.add(a.to(FL), b.to(FL), out=out)
    assert result is out and out.data_ptr() == ptr
    exact(out.cpu(), a + b)


def test_add_out_resizes_an_empty_out() -> None:
    a, b = rand(3, 4, seed=21), rand(3, 4, seed=22)
    out = torch.empty(0, device=FL)
    torch.add(a.to(FL), b.to(FL), out=out)
    assert out.shape == (3, 4)
    exact(out.cpu(), a + b)


def test_add_out_resizes_a_wrong_size_out() -> None:
    a, b = rand(3, 4, seed=23), rand(3, 4, seed=24)
    out = torch.zeros(5, device=FL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "An output ... was resized"
        torch.add(a.to(FL), b.to(FL), out=out)
    assert out.shape == (3, 4)
    exact(out.cpu(), a + b)


def test_out_variant_of_a_reduction() -> None:
    a = rand(6, 5, seed=25)
    out = torch.empty(5, device=FL)
    torch.sum(a.to(FL), dim=0, out=out)
    torch.testing.assert_close(out.cpu(), a.sum(0))


# ------------------------------------------------------------------ dtypes

DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_arithmetic(dtype: torch.dtype) -> None:
    a, b = rand(4, 5, dtype=dtype, seed=26), rand(4, 5, dtype=dtype, seed=27)
    if dtype == torch.bool:
        check(lambda a, b: (a & b, a | b, a ^ b, ~a), a, b)
    else:
        check(lambda a, b: (a + b, a - b, a * b, -a, a * 3, a.abs()), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_division_and_remainder(dtype: torch.dtype) -> None:
    a, b = rand(4, 5, dtype=dtype, seed=28), rand(4, 5, dtype=dtype, seed=29)
    b = torch.where(b == 0, torch.ones_like(b), b)
    check(lambda a, b: (a / b, torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b)),
          a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_comparisons(dtype: torch.dtype) -> None:
    a, b = rand(4, 5, dtype=dtype, seed=30), rand(4, 5, dtype=dtype, seed=31)
    b[0] = a[0]  # some equal elements
    check(lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b), a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reductions(dtype: torch.dtype) -> None:
    a = rand(7, 9, dtype=dtype, seed=32)

    def reduce(a: torch.Tensor) -> tuple:
        results = [a.sum(), a.sum(dim=1), a.max(), a.max(dim=0).values, a.amin(1)]
        if dtype != torch.bool:  # argmax has no bool kernel
            results += [a.argmax(), a.argmax(dim=1)]
        if dtype.is_floating_point:
            results += [a.mean(), a.mean(dim=0)]
        return tuple(results)

    check(reduce, a, tolerant=dtype.is_floating_point)


def test_max_with_dim_returns_values_and_indices() -> None:
    a = rand(6, 8, seed=33)
    check(lambda a: tuple(a.max(dim=1)), a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_matmul(dtype: torch.dtype) -> None:
    a, b = rand(9, 13, dtype=dtype, seed=34), rand(13, 5, dtype=dtype, seed=35)
    check(lambda a, b: (a @ b, torch.mm(a, b), a[0] @ b), a, b, tolerant=dtype.is_floating_point)


def test_batched_matmul() -> None:
    a, b = rand(3, 4, 6, seed=36), rand(3, 6, 2, seed=37)
    check(torch.bmm, a, b, tolerant=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_where(dtype: torch.dtype) -> None:
    cond = rand(4, 5, dtype=torch.bool, seed=38)
    a, b = rand(4, 5, dtype=dtype, seed=39), rand(4, 5, dtype=dtype, seed=40)
    check(torch.where, cond, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cat_and_stack(dtype: torch.dtype) -> None:
    a, b = rand(2, 3, dtype=dtype, seed=41), rand(4, 3, dtype=dtype, seed=42)
    check(lambda a, b: (torch.cat([a, b]), torch.cat([a, b[:2]], dim=1),
                        torch.stack([a, b[1:3]])), a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_indexing_with_a_flagos_index_tensor(dtype: torch.dtype) -> None:
    a = rand(8, 3, dtype=dtype, seed=43)
    index = torch.tensor([5, 0, 7, 0, 2])
    check(lambda a, i: (a[i], a[:, 1][i], a.index_select(0, i)), a, index)


def test_indexing_with_a_boolean_mask() -> None:
    a = rand(6, 4, seed=44)
    check(lambda a: a[a > 0], a)


def test_index_put_with_a_flagos_index_tensor() -> None:
    def put(a: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        a[i] = v
        return a

    check(put, torch.zeros(6, 3), torch.tensor([4, 1]), rand(2, 3, seed=45))


def test_nonzero() -> None:
    check(torch.nonzero, rand(5, 5, dtype=torch.bool, seed=46))


@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.parametrize("dst", DTYPES, ids=str)
def test_type_conversion(src: torch.dtype, dst: torch.dtype) -> None:
    a = rand(4, 6, dtype=src, seed=47)
    if src.is_floating_point:
        a = a * 10
    check(lambda a: a.to(dst), a)


def test_item_and_tolist_read_values_back() -> None:
    a = rand(3, 2, seed=48)
    fl = a.to(FL)
    assert fl.sum().item() == pytest.approx(a.sum().item(), rel=1e-6)
    assert fl[1, 0].item() == a[1, 0].item()
    assert fl.tolist() == a.tolist()


# ------------------------------------------------------------ CPU scalars


def test_cpu_scalar_tensor_mixes_with_flagos_tensors() -> None:
    a = rand(3, 4, seed=49)
    scalar = torch.tensor(2.5)
    result = a.to(FL) * scalar + torch.tensor(1)
    assert result.device == FL
    exact(result.cpu(), a * scalar + torch.tensor(1))


def test_cpu_scalar_tensor_as_where_operand() -> None:
    a = rand(3, 4, seed=50)
    result = torch.where(a.to(FL) > 0, a.to(FL), torch.tensor(0.0))
    exact(result.cpu(), torch.where(a > 0, a, torch.tensor(0.0)))


def test_python_scalars_mix_with_flagos_tensors() -> None:
    check(lambda a: (a + 1, 2 * a, a ** 2, a.clamp(min=0.0), 1 - a), rand(5, seed=51))


def test_non_scalar_cpu_tensor_with_a_flagos_tensor_is_a_device_error() -> None:
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=FL) + torch.ones(3)


@pytest.mark.parametrize(
    "write",
    [
        lambda cpu, fl: cpu.mul_(fl),  # a 0-dim CPU tensor written in place (torch's BCE-with-logits does this)
        lambda cpu, fl: cpu.add_(fl),
        lambda cpu, fl: torch.mul(fl, fl, out=cpu),
    ],
    ids=["mul_", "add_", "mul-out"],
)
def test_a_cpu_tensor_a_flagos_op_would_write_is_a_device_error(write) -> None:
    # Found by scripts/mixed-sweep: the daemon cannot write a CPU tensor, and the
    # result was silently lost (0-dim CPU tensor unchanged). CUDA refuses it too.
    cpu = torch.tensor(3.0)
    with pytest.raises(RuntimeError, match="same device.*writes a CPU tensor"):
        write(cpu, torch.tensor(2.0, device=FL))
    assert cpu.item() == 3.0


# ------------------------------------------------------------------ losses

LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mse_loss": lambda x, t: torch.nn.functional.mse_loss(x, t),
    "l1_loss": lambda x, t: torch.nn.functional.l1_loss(x, t),
    "smooth_l1_loss": lambda x, t: torch.nn.functional.smooth_l1_loss(x, t),
    "mse_loss_sum": lambda x, t: torch.nn.functional.mse_loss(x, t, reduction="sum"),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_and_its_gradient(name: str) -> None:
    def loss_and_grad(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.detach().requires_grad_()
        loss = LOSSES[name](x, t)
        loss.backward()
        return loss.detach(), x.grad

    check(loss_and_grad, rand(8, 3, seed=52), rand(8, 3, seed=53), tolerant=True)
