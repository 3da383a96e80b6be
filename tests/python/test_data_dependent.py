"""Operators whose output shape or Python result depends on the data
(nonzero, unique, boolean masks, .item(), comparisons in `if`, sort/topk …)
give on flagos exactly what they give on the CPU for the same inputs."""

from __future__ import annotations

import torch

from models import FL, assert_same, same_on_flagos


def ints(*shape: int, low: int = -3, high: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


def floats(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def distinct(*shape: int, seed: int = 0) -> torch.Tensor:
    """Floats without ties, so that sort/topk indices are unambiguous."""
    n = 1
    for s in shape:
        n *= s
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return (perm.to(torch.float32) * 0.25 - 3.0).reshape(shape)


# ------------------------------------------------------------------ nonzero


def test_nonzero_2d() -> None:
    same_on_flagos(torch.nonzero, ints(5, 6).to(torch.float32))


def test_nonzero_of_bool() -> None:
    same_on_flagos(lambda x: (x > 0).nonzero(), floats(4, 3, 5))


def test_nonzero_as_tuple() -> None:
    same_on_flagos(lambda x: torch.nonzero(x, as_tuple=True), ints(5, 6))


def test_nonzero_all_zero_gives_empty() -> None:
    out = same_on_flagos(torch.nonzero, torch.zeros(3, 4))
    assert out.shape == (0, 2)


def test_nonzero_then_used_on_device() -> None:
    # The result's size is known only after the sync; later ops must use it.
    same_on_flagos(lambda x: (torch.nonzero(x).sum(0), torch.nonzero(x) * 2), ints(7, 3))


def test_nonzero_of_non_contiguous_input() -> None:
    same_on_flagos(lambda x: x.t()[1:].nonzero(), ints(5, 6))


def test_nonzero_on_second_device() -> None:
    x = ints(4, 5)
    got = x.to(torch.device(FL, 1)).nonzero()
    assert got.device == torch.device(FL, 1)
    assert torch.equal(got.cpu(), x.nonzero())


def test_argwhere() -> None:
    same_on_flagos(torch.argwhere, ints(4, 5))


def test_where_single_argument() -> None:
    same_on_flagos(lambda x: torch.where(x > 0.5), floats(6, 4))


# ------------------------------------------------------------------ unique


def test_unique_sorted() -> None:
    same_on_flagos(lambda x: torch.unique(x, sorted=True), ints(40))


def test_unique_return_inverse_and_counts() -> None:
    same_on_flagos(
        lambda x: torch.unique(x, sorted=True, return_inverse=True, return_counts=True), ints(6, 7)
    )


def test_unique_float() -> None:
    same_on_flagos(lambda x: torch.unique(x.round(), return_counts=True), floats(50) * 2)


def test_unique_dim() -> None:
    rows = torch.tensor([[1, 2], [3, 4], [1, 2], [0, 5], [3, 4]])
    same_on_flagos(
        lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True), rows
    )


def test_unique_consecutive() -> None:
    x = torch.tensor([1, 1, 2, 2, 2, 3, 1, 1, 4])
    same_on_flagos(
        lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True), x
    )


# ------------------------------------------------------------------ masks


def test_masked_select() -> None:
    same_on_flagos(lambda x: torch.masked_select(x, x > 0), floats(5, 6))


def test_masked_select_broadcast_mask() -> None:
    mask = torch.tensor([True, False, True, True, False, False])
    same_on_flagos(torch.masked_select, floats(5, 6), mask)


def test_bool_mask_read() -> None:
    same_on_flagos(lambda x: x[x > 0], floats(5, 6))


def test_bool_mask_read_rows() -> None:
    rows = torch.tensor([True, False, True, False, True])
    same_on_flagos(lambda x, m: x[m], floats(5, 6), rows)


def test_bool_mask_read_empty() -> None:
    out = same_on_flagos(lambda x: x[x > 100], floats(5, 6))
    assert out.numel() == 0


def test_bool_mask_read_backward() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_()
        (x[x > 0] ** 2).sum().backward()
        return x.grad

    same_on_flagos(fn, floats(5, 6))


def test_bool_mask_assign_scalar() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[x < 0] = 0.5
        return x

    same_on_flagos(fn, floats(5, 6))


def test_bool_mask_assign_tensor() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        mask = x > 0
        n = int(mask.sum())
        x[mask] = torch.arange(n, dtype=x.dtype, device=x.device) * 10
        return x

    same_on_flagos(fn, floats(5, 6))


def test_bool_mask_assign_rows_broadcast() -> None:
    def fn(x: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[m] = v
        return x

    rows = torch.tensor([False, True, True, False, True])
    same_on_flagos(fn, floats(5, 6), rows, floats(6, seed=1))


def test_bool_mask_assign_cpu_scalar_tensor() -> None:
    # A 0-dim CPU tensor may be mixed with flagos tensors, as with CUDA.
    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[x > 0] = torch.tensor(9.0)
        return x

    same_on_flagos(fn, floats(5, 6))


def test_masked_fill_cpu_scalar_tensor_value() -> None:
    # torch._refs.masked_fill explicitly allows a CPU 0-dim value for PrivateUse1.
    same_on_flagos(lambda x: x.masked_fill(x > 0, torch.tensor(9.0)), floats(5, 6))


def test_index_fill_cpu_scalar_tensor_value() -> None:
    same_on_flagos(
        lambda x, i: x.index_fill(1, i, torch.tensor(-2.0)), floats(5, 6), torch.tensor([0, 4])
    )


def test_masked_fill_and_index_put_accumulate() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.masked_fill(x > 1, -1.0)
        idx = torch.tensor([0, 2, 0, 1], device=x.device)
        return y.index_put((idx,), torch.ones(4, 6, device=x.device), accumulate=True)

    same_on_flagos(fn, floats(5, 6))


# ------------------------------------------------------------------ values back to Python


def test_item_float() -> None:
    x = floats(4, 4)
    got = x.to(FL).sum().item()
    assert isinstance(got, float)
    assert got == x.sum().item()


def test_item_int_and_bool() -> None:
    x = ints(10)
    fx = x.to(FL)
    assert fx.max().item() == x.max().item()
    assert isinstance(fx.max().item(), int)
    assert (fx > 0).any().item() is bool((x > 0).any().item())
    assert isinstance((fx > 0).any().item(), bool)


def test_item_of_element() -> None:
    x = floats(3, 4)
    assert x.to(FL)[1, 2].item() == x[1, 2].item()


def test_tolist() -> None:
    for x in (floats(3, 4), ints(2, 3, 2), ints(5) > 0, torch.tensor(2.5)):
        assert x.to(FL).tolist() == x.tolist()


def test_int_float_bool_conversions() -> None:
    x = torch.tensor([3.75])
    fx = x.to(FL)
    assert int(fx) == 3 and float(fx) == 3.75 and bool(fx) is True
    assert bool(torch.zeros(1, device=FL)) is False


def test_equal() -> None:
    a = floats(4, 5)
    b = a.clone()
    b[2, 3] += 1
    assert torch.equal(a.to(FL), a.clone().to(FL)) is True
    assert torch.equal(a.to(FL), b.to(FL)) is False
    assert torch.equal(a.to(FL), a[:3].to(FL)) is False


def test_allclose_and_isclose() -> None:
    a = floats(4, 5)
    near = a + 1e-7
    far = a + 1e-2
    assert torch.allclose(a.to(FL), near.to(FL)) is True
    assert torch.allclose(a.to(FL), far.to(FL)) is False
    same_on_flagos(lambda x, y: torch.isclose(x, y, atol=1e-3), a, a + floats(4, 5, seed=2) * 1e-3)


def test_any_all_in_python_if() -> None:
    def branches(x: torch.Tensor) -> list[str]:
        taken = []
        if (x > 0).any():
            taken.append("any>0")
        if (x > 10).any():
            taken.append("any>10")
        if (x > -10).all():
            taken.append("all>-10")
        if (x > 0).all():
            taken.append("all>0")
        if x.sum() > 0:
            taken.append("sum>0")
        if not torch.isfinite(x).all():
            taken.append("nonfinite")
        return taken

    for seed in range(3):
        x = floats(8, seed=seed)
        assert branches(x.to(FL)) == branches(x)
    with_inf = torch.tensor([1.0, float("inf")])
    assert branches(with_inf.to(FL)) == branches(with_inf)
    assert "nonfinite" in branches(with_inf)


def test_while_loop_on_device_condition() -> None:
    def halve_until_small(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        n = 0
        while x.abs().max() > 0.1:
            x = x / 2
            n += 1
        return x, n

    same_on_flagos(halve_until_small, floats(10) * 5)


# ------------------------------------------------------------------ counting and repeating


def test_bincount() -> None:
    same_on_flagos(torch.bincount, ints(30, low=0, high=7))


def test_bincount_weights_minlength() -> None:
    same_on_flagos(
        lambda x, w: torch.bincount(x, weights=w, minlength=10),
        ints(30, low=0, high=7), floats(30).to(torch.float64),
    )


def test_repeat_interleave_tensor_repeats() -> None:
    same_on_flagos(
        lambda x, r: torch.repeat_interleave(x, r, dim=0), floats(4, 3), torch.tensor([2, 0, 3, 1])
    )


def test_repeat_interleave_repeats_only() -> None:
    same_on_flagos(torch.repeat_interleave, torch.tensor([1, 3, 0, 2]))


def test_repeat_interleave_int_repeats() -> None:
    same_on_flagos(lambda x: x.repeat_interleave(3, dim=1), floats(2, 3))


# ------------------------------------------------------------------ ordering


def test_topk_largest() -> None:
    same_on_flagos(lambda x: torch.topk(x, 3, dim=1), distinct(5, 8))


def test_topk_smallest_unsorted_values() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        values, _ = torch.topk(x, 4, dim=0, largest=False, sorted=True)
        return values

    same_on_flagos(fn, distinct(9, 3))


def test_sort() -> None:
    same_on_flagos(lambda x: torch.sort(x, dim=-1), distinct(4, 7))


def test_sort_descending_stable_with_ties() -> None:
    same_on_flagos(lambda x: torch.sort(x, dim=0, descending=True, stable=True), ints(20, 3))


def test_argsort() -> None:
    same_on_flagos(lambda x: torch.argsort(x, dim=1, descending=True), distinct(3, 6))


def test_kthvalue() -> None:
    same_on_flagos(lambda x: torch.kthvalue(x, 3, dim=1), distinct(4, 7))


def test_median_and_mode() -> None:
    same_on_flagos(lambda x: (torch.median(x), torch.median(x, dim=0)), distinct(5, 3))
    same_on_flagos(lambda x: torch.mode(x, dim=1).values, ints(4, 9))


def test_max_min_with_indices() -> None:
    same_on_flagos(lambda x: (torch.max(x, dim=1), torch.min(x, dim=0), x.argmax()), distinct(4, 6))


def test_searchsorted() -> None:
    boundaries = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    same_on_flagos(lambda b, v: torch.searchsorted(b, v), boundaries, floats(10))


def test_results_stay_on_flagos() -> None:
    x = floats(4, 4).to(FL)
    for t in (x.nonzero(), torch.unique(x), x[x > 0], torch.topk(x, 2).indices):
        assert t.device.type == FL
    assert_same(torch.sort(x).values, torch.sort(x.cpu()).values)
