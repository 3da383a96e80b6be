"""What both sweeps compare with: device copies, CPU-vs-flagos checks, gradients, verdict tallies.

Suite-neutral (no OpInfo, no ModuleInfo): harness.py (operators) and
module_harness.py (modules) build on it. In-process and unprotected, like
them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.testing._internal.common_device_type import toleranceOverride
from torch.testing._internal.opinfo.core import DecorateInfo

import torch_fl  # noqa: F401  registers the device "flagos"
from results import BACKWARD, BLOCKED, ERROR, FORWARD, PASS, SKIPPED_ON_CPU, WRONG, Outcome, severity

DEVICE = "flagos"
WEIGHT_SEED = 1000
MESSAGE_LIMIT = 400


@dataclass(frozen=True)
class Plan:
    """One unit of a sweep entry: a dtype (and a mode, for modules), and whether gradients are compared.

    `reference` (operators, CUDA's extra dtypes): the wider dtype the CPU
    reference runs in; "" when it runs at the unit's dtype.
    """

    dtype: str
    backward: bool
    mode: str = ""
    reference: str = ""


# ------------------------------------------------------------------ copies


class Copier:
    """Copies tensors to a device, keeping layout and aliasing.

    Tensors that share a storage on the CPU share one copied storage on the
    target; each copy is a fresh leaf with the original's requires_grad.
    Devices ("cpu") named in the arguments are replaced by the target device.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self._storages: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            copy = self._copy(t.detach())
        return copy.detach().requires_grad_(t.requires_grad)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout != torch.strided or t.is_quantized or t.device.type != "cpu":
            return t.to(self.device, copy=True)
        storage = t.untyped_storage()
        itemsize = t.element_size()
        if storage.nbytes() % itemsize:
            return t.to(self.device, copy=True)
        key = (storage.data_ptr(), storage.nbytes(), t.dtype)
        base = self._storages.get(key)
        if base is None:
            raw = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // itemsize,), (1,))
            base = raw.clone() if self.device == "cpu" else raw.to(self.device)
            self._storages[key] = base
        view = base.as_strided(t.size(), t.stride(), t.storage_offset())
        if t.is_conj():
            view = view.conj()
        if t.is_neg():
            view = view._neg_view()
        return view

    def value(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device(self.device)
        if isinstance(v, str) and v == "cpu":
            return self.device
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return tuple(self.value(x) for x in v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        return v


def map_tensors(v: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`v` with fn applied to every tensor in it (lists, tuples, dicts; namedtuples become tuples)."""
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, list):
        return [map_tensors(x, fn) for x in v]
    if isinstance(v, tuple):
        return tuple(map_tensors(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: map_tensors(x, fn) for k, x in v.items()}
    return v


def to_cpu(v: Any) -> Any:
    """The output structure with every tensor on the CPU (namedtuples become tuples)."""
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return [to_cpu(x) for x in v] if isinstance(v, list) else tuple(to_cpu(x) for x in v)
    if isinstance(v, dict):
        return {k: to_cpu(x) for k, x in v.items()}
    return v


def flatten(v: Any) -> Iterator[Any]:
    """The leaves of a nested list/tuple/dict structure, in order."""
    if isinstance(v, (list, tuple)):
        for x in v:
            yield from flatten(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from flatten(x)
    else:
        yield v


def grad_leaves(v: Any) -> list[torch.Tensor]:
    """The distinct tensors in a nested structure that require grad, in order."""
    seen: set[int] = set()
    leaves = []
    for t in flatten(v):
        if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            leaves.append(t)
    return leaves


# ------------------------------------------------------------------ comparison


def tolerances(decorators: Iterable[Any], dtype: torch.dtype, device_type: str = "cpu") -> tuple[float, float] | None:
    """(atol, rtol): the largest of an entry's toleranceOverrides for device_type at dtype, if any."""
    best: tuple[float, float] | None = None
    for info in decorators or ():
        if not isinstance(info, DecorateInfo):
            continue
        if info.device_type not in (None, device_type) or (info.dtypes is not None and dtype not in info.dtypes):
            continue
        for decorator in info.decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                t = decorator.d[dtype]
                best = (t.atol, t.rtol) if best is None else (max(best[0], t.atol), max(best[1], t.rtol))
    if best is None:
        return None
    from torch.testing._comparison import default_tolerances

    rtol, atol = default_tolerances(dtype)
    return max(best[0], atol), max(best[1], rtol)


def one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(lines)[:MESSAGE_LIMIT]


def describe(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:MESSAGE_LIMIT]


def signature(v: Any) -> list[Any]:
    """What random outputs are compared by: tensor shapes and dtypes, other leaves' types."""
    return [
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
        for x in flatten(v)
    ]


def mismatch(actual: Any, expected: Any, *, random: bool, tol: tuple[float, float] | None) -> str | None:
    """None when actual (flagos, on the CPU) matches expected (CPU); else a one-line message."""
    if random:
        a, e = signature(actual), signature(expected)
        return None if a == e else one_line(f"shapes/dtypes differ: flagos {a} vs cpu {e}")[:MESSAGE_LIMIT]
    kwargs: dict[str, Any] = {"equal_nan": True, "check_device": False, "check_dtype": True}
    if tol is not None:
        kwargs["atol"], kwargs["rtol"] = tol
    try:
        torch.testing.assert_close(actual, expected, **kwargs)
    except AssertionError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        # The first line ("Tensor-likes are not close!") says little when details follow.
        if len(lines) > 1 and lines[0].endswith("not close!"):
            lines = lines[1:]
        return "; ".join(lines)[:MESSAGE_LIMIT]
    return None


# ------------------------------------------------------------------ backward


def weighted_sum(outputs: Any, device: str) -> torch.Tensor | None:
    """sum_i (w_i * out_i).sum() over the differentiable outputs, with fixed weights; None if none."""
    total: torch.Tensor | None = None
    for i, o in enumerate(flatten(outputs)):
        if not (isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point() or o.is_complex())):
            continue
        g = torch.Generator().manual_seed(WEIGHT_SEED + i)
        shape = o.shape + ((2,) if o.is_complex() else ())
        w = torch.randn(shape, generator=g, dtype=torch.float64)
        w = torch.view_as_complex(w).to(o.dtype) if o.is_complex() else w.to(o.dtype)
        s = (o * w.to(device)).sum()
        if s.is_complex():
            s = s.real + s.imag
        total = s if total is None else total + s
    return total


def gradients(outputs: Any, leaves: Sequence[torch.Tensor], device: str) -> list[Any] | None:
    """The gradients of weighted_sum(outputs) w.r.t. leaves (None for unused); None when nothing is differentiable."""
    total = weighted_sum(outputs, device)
    if total is None or not leaves:
        return None
    return list(torch.autograd.grad(total, list(leaves), allow_unused=True))


# ------------------------------------------------------------------ verdicts


class Tally:
    """The worst verdict of one direction over the samples, with the first message at that verdict."""

    def __init__(self) -> None:
        self.outcome: Outcome | None = None
        self.first_cpu_error = ""

    def add(self, verdict: str, message: str) -> None:
        if self.outcome is None or severity(verdict) < severity(self.outcome.verdict):
            self.outcome = Outcome(verdict, message)

    def cpu_error(self, message: str) -> None:
        self.first_cpu_error = self.first_cpu_error or message

    def result(self) -> Outcome:
        if self.outcome is None:
            return Outcome(SKIPPED_ON_CPU, self.first_cpu_error or "no samples")
        return self.outcome


def synchronize() -> None:
    torch.flagos.synchronize()


# ------------------------------------------------------------------ samples on both devices


@dataclass
class ForwardOnly:
    """A Side whose gradients are not compared (the mixed-operand sweeps): its forward's results only."""

    compared: Any

    def gradients(self) -> None:
        return None


class Side(Protocol):
    """One sample's forward on one device, kept for its backward."""

    compared: Any  # the forward's results to compare, on the CPU

    def gradients(self) -> Any | None:
        """The backward's results to compare (on the CPU); None when nothing is differentiable."""


class Sample(Protocol):
    """One sample of an entry, runnable on either device from fresh copies of its tensors."""

    random: bool  # compare shapes and dtypes only

    def run(self, device: str) -> Side:
        """The forward on `device`; raises what the entry raises."""


Progress = Callable[[int, str], None]


def compare_samples(
    make_samples: Callable[[], Sequence[Sample]],
    source: str,
    backward: bool,
    tol: tuple[float, float] | None,
    progress: Progress | None = None,
    on_forward: Callable[[Outcome], None] | None = None,
    error_verdict: Callable[[BaseException], str] = lambda e: ERROR,
) -> tuple[Outcome, Outcome | None]:
    """(forward, backward) outcomes over the samples, flagos against the CPU; backward None when not compared.

    What flagos raises is an ERROR, or what error_verdict says it is.

    make_samples (named `source` in messages) makes them on the CPU; when it
    raises, both directions are SKIPPED_ON_CPU. All forwards run first
    (on_forward gets their outcome as soon as it is known, so that a crash in
    a backward does not lose it), then the backwards.
    """
    try:
        samples = make_samples()
    except Exception as e:  # the CPU-side sample generator itself
        skipped = Outcome(SKIPPED_ON_CPU, f"{source} raised {describe(e)}")
        if on_forward:
            on_forward(skipped)
        return skipped, (skipped if backward else None)
    fwd, bwd = Tally(), Tally()
    ran: list[tuple[int, Sample, Side, Side | None]] = []
    for index, sample in enumerate(samples):
        prefix = f"sample {index}: "
        if progress:
            progress(index, FORWARD)
        try:
            cpu = sample.run("cpu")
        except Exception as e:
            fwd.cpu_error(prefix + describe(e))
            bwd.cpu_error(prefix + describe(e))
            continue
        fl: Side | None = None
        try:
            fl = sample.run(DEVICE)
            synchronize()
        except Exception as e:
            fwd.add(error_verdict(e), prefix + describe(e))
            fl = None
        else:
            diff = mismatch(fl.compared, cpu.compared, random=sample.random, tol=tol)
            fwd.add(WRONG, prefix + diff) if diff else fwd.add(PASS, "")
        ran.append((index, sample, cpu, fl))
    forward = fwd.result()
    if on_forward:
        on_forward(forward)
    if not backward:
        return forward, None

    for index, sample, cpu, fl in ran:
        prefix = f"sample {index}: "
        if progress:
            progress(index, BACKWARD)
        try:
            cpu_grads = cpu.gradients()
        except Exception as e:
            bwd.cpu_error(prefix + describe(e))
            continue
        if cpu_grads is None:
            bwd.cpu_error(prefix + "nothing to differentiate (no differentiable output or input)")
            continue
        if fl is None:
            bwd.add(BLOCKED, prefix + "forward failed on flagos")
            continue
        try:
            fl_grads = fl.gradients()
            synchronize()
        except Exception as e:
            bwd.add(error_verdict(e), prefix + describe(e))
            continue
        if fl_grads is None:
            bwd.add(WRONG, prefix + "flagos outputs are not differentiable")
            continue
        diff = mismatch(fl_grads, cpu_grads, random=sample.random, tol=tol)
        bwd.add(WRONG, prefix + diff) if diff else bwd.add(PASS, "")
    return forward, bwd.result()
