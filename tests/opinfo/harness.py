"""Runs one OpInfo entry at one dtype on the CPU and on flagos and compares them.

In-process and unprotected: a crash or a hang here takes the process with
it. worker.py runs this in a child process; driver.py guards that child.

For each sample (the first `max_samples` of op.sample_inputs("cpu", ...),
generated once with a fixed seed) both sides get their own copy of every
tensor, with the same sizes, strides, storage offset, aliasing and conj/neg
bits (the CPU side a clone, the flagos side a copy of the same storage).
Forward: every output, moved to the CPU, must match the CPU's (the OpInfo's
output_process_fn_grad applied to both). Backward, for autograd dtypes: the
gradients of sum(w_i * out_i) over the differentiable outputs, with fixed
random weights w_i, w.r.t. every input that requires grad must match too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.testing._internal.common_device_type import toleranceOverride
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
    op_db,
)
from torch.testing._internal.opinfo.core import DecorateInfo, OpInfo, SampleInput

import torch_fl  # noqa: F401  registers the device "flagos"
from families import CPU_ARGS, is_random_sample
from results import (
    BACKWARD,
    BLOCKED,
    ERROR,
    FORWARD,
    PASS,
    SKIPPED_ON_CPU,
    SWEEP_DTYPES,
    WIDER_REFERENCE,
    WRONG,
    Outcome,
    entry_key,
    severity,
)

DEVICE = "flagos"
SAMPLE_SEED = 0
WEIGHT_SEED = 1000
MESSAGE_LIMIT = 400

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in SWEEP_DTYPES}
GRAD_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64})

Progress = Callable[[int, str], None]


# ------------------------------------------------------------------ entries


def all_entries() -> dict[str, OpInfo]:
    """Every OpInfo entry of op_db and of the foreach databases, by entry key, sorted."""
    ops = [
        *op_db,
        *foreach_unary_op_db,
        *foreach_binary_op_db,
        *foreach_pointwise_op_db,
        *foreach_reduce_op_db,
        *foreach_other_op_db,
    ]
    by_key = {entry_key(op.name, op.variant_test_name): op for op in ops}
    return dict(sorted(by_key.items()))


@dataclass(frozen=True)
class DtypePlan:
    dtype: str
    backward: bool  # whether gradients are compared at this dtype
    reference: str = ""  # CUDA's extra dtypes: the wider dtype of the CPU reference


def plan(op: OpInfo) -> list[DtypePlan]:
    """The sweep dtypes the entry supports on the CPU, then CUDA's extra ones, each in SWEEP_DTYPES order.

    CUDA's extra dtypes (supported_dtypes("cuda") minus supported_dtypes("cpu"))
    are what libraries' CUDA paths send to flagos; their CPU reference runs
    in a wider dtype (WIDER_REFERENCE) and is converted back.
    """
    supported = op.supported_dtypes("cpu")
    cuda_extra = op.supported_dtypes("cuda") - supported
    backward_ok = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
    cuda_backward_ok = op.supported_backward_dtypes("cuda") if op.supports_autograd else set()
    return [
        DtypePlan(name, dtype in GRAD_DTYPES and dtype in backward_ok)
        for name, dtype in DTYPES.items()
        if dtype in supported
    ] + [
        DtypePlan(name, dtype in GRAD_DTYPES and dtype in cuda_backward_ok, WIDER_REFERENCE[name])
        for name, dtype in DTYPES.items()
        if dtype in cuda_extra
    ]


# ------------------------------------------------------------------ copies


class Copier:
    """Copies a sample's tensors to a device, keeping layout and aliasing.

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

    def sample(self, s: SampleInput, entry: str = "") -> SampleInput:
        """A copy of the sample on the device; positional args in CPU_ARGS[entry] stay CPU tensors."""
        keep = CPU_ARGS.get(entry, frozenset())
        cpu = Copier("cpu") if keep else self
        return SampleInput(
            self.value(s.input),
            args=tuple((cpu if i in keep else self).value(a) for i, a in enumerate(s.args)),
            kwargs=self.value(s.kwargs),
            output_process_fn_grad=s.output_process_fn_grad,
            broadcasts_input=s.broadcasts_input,
            name=s.name,
        )


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


def grad_leaves(s: SampleInput) -> list[torch.Tensor]:
    seen: set[int] = set()
    leaves = []
    for t in flatten([s.input, list(s.args), s.kwargs]):
        if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            leaves.append(t)
    return leaves


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


def widened(s: SampleInput, dtype: torch.dtype, wide: torch.dtype) -> SampleInput:
    """The sample with its tensors of `dtype` as fresh leaves in `wide` (other tensors as they are)."""

    def widen(t: torch.Tensor) -> torch.Tensor:
        if t.dtype != dtype:
            return t
        return t.detach().to(wide).requires_grad_(t.requires_grad)

    return SampleInput(
        map_tensors(s.input, widen),
        args=map_tensors(s.args, widen),
        kwargs=map_tensors(s.kwargs, widen),
        output_process_fn_grad=s.output_process_fn_grad,
        broadcasts_input=s.broadcasts_input,
        name=s.name,
    )


def _counterpart(t: torch.dtype, complex_: bool) -> torch.dtype | None:
    pairs = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}
    if complex_:
        return pairs.get(t)
    return {c: r for r, c in pairs.items()}.get(t)


def narrowed(v: Any, wide: torch.dtype, dtype: torch.dtype) -> Any:
    """Reference outputs computed in `wide` converted back (differentiably) to `dtype`: tensors of `wide`
    become `dtype`, of its complex (real) counterpart `dtype`'s complex (real) counterpart; others stay."""
    back = {wide: dtype}
    for complex_ in (True, False):
        w, d = _counterpart(wide, complex_), _counterpart(dtype, complex_)
        if w is not None and d is not None:
            back.setdefault(w, d)
    return map_tensors(v, lambda t: t.to(back[t.dtype]) if t.dtype in back else t)


# ------------------------------------------------------------------ comparison


def tolerances(op: OpInfo, dtype: torch.dtype, device_type: str = "cpu") -> tuple[float, float] | None:
    """(atol, rtol): the largest of the entry's toleranceOverrides for device_type at dtype, if any."""
    best: tuple[float, float] | None = None
    for info in op.decorators or ():
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


# ------------------------------------------------------------------ one (entry, dtype)


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


@dataclass
class Ran:
    """One sample after the forward: both sides' inputs and outputs (flagos ones None if it failed)."""

    sample: SampleInput
    cpu_in: SampleInput
    cpu_out: Any
    fl_in: SampleInput | None
    fl_out: Any
    random: bool  # compare shapes and dtypes only


def run_pair(
    op: OpInfo,
    dtype_name: str,
    backward: bool,
    max_samples: int,
    progress: Progress | None = None,
    on_forward: Callable[[Outcome], None] | None = None,
    reference: str = "",
) -> tuple[Outcome, Outcome | None]:
    """(forward, backward) outcomes of `op` at `dtype_name`; backward None when not compared.

    The first `max_samples` samples run (all when it is 0). All samples'
    forwards run first (on_forward gets their outcome as soon as it is known,
    so that a crash in a backward does not lose it), then the backwards.
    `reference` (CUDA's extra dtypes): the CPU side runs the sample's tensors
    of `dtype_name` in that wider dtype, and its outputs and gradients are
    converted back (narrowed) before the comparison, with the entry's CUDA
    tolerances.
    """
    dtype = DTYPES[dtype_name]
    wide = getattr(torch, reference) if reference else None
    entry = entry_key(op.name, op.variant_test_name)
    tol = tolerances(op, dtype, "cuda" if reference else "cpu")

    def narrow(v: Any) -> Any:
        return v if wide is None else narrowed(v, wide, dtype)

    fwd, bwd = Tally(), Tally()

    torch.manual_seed(SAMPLE_SEED)
    try:
        generator = op.sample_inputs("cpu", dtype, requires_grad=backward)
        samples = list(itertools.islice(generator, max_samples if max_samples > 0 else None))
    except Exception as e:  # the CPU-side sample generator itself
        message = f"sample_inputs raised {describe(e)}"
        skipped = Outcome(SKIPPED_ON_CPU, message)
        if on_forward:
            on_forward(skipped)
        return skipped, (skipped if backward else None)

    ran: list[tuple[int, Ran]] = []
    for index, sample in enumerate(samples):
        prefix = f"sample {index}: "
        if progress:
            progress(index, FORWARD)
        random = is_random_sample(entry, sample.args, sample.kwargs)
        cpu_in = Copier("cpu").sample(sample, entry)
        if wide is not None:
            cpu_in = widened(cpu_in, dtype, wide)
        try:
            cpu_out = narrow(op(cpu_in.input, *cpu_in.args, **cpu_in.kwargs))
            cpu_cmp = to_cpu(sample.output_process_fn_grad(cpu_out))
        except Exception as e:
            fwd.cpu_error(prefix + describe(e))
            bwd.cpu_error(prefix + describe(e))
            continue
        fl_in: SampleInput | None = None
        try:
            fl_in = Copier(DEVICE).sample(sample, entry)
            fl_out = op(fl_in.input, *fl_in.args, **fl_in.kwargs)
            fl_cmp = sample.output_process_fn_grad(to_cpu(fl_out))
            synchronize()
        except Exception as e:
            fwd.add(ERROR, prefix + describe(e))
            fl_out = None
        else:
            diff = mismatch(fl_cmp, cpu_cmp, random=random, tol=tol)
            fwd.add(WRONG, prefix + diff) if diff else fwd.add(PASS, "")
        ran.append((index, Ran(sample, cpu_in, cpu_out, fl_in, fl_out, random)))
    forward = fwd.result()
    if on_forward:
        on_forward(forward)
    if not backward:
        return forward, None

    for index, r in ran:
        prefix = f"sample {index}: "
        if progress:
            progress(index, BACKWARD)
        try:
            cpu_grads = gradients(r.sample.output_process_fn_grad(r.cpu_out), grad_leaves(r.cpu_in), "cpu")
        except Exception as e:
            bwd.cpu_error(prefix + describe(e))
            continue
        if cpu_grads is None:
            bwd.cpu_error(prefix + "nothing to differentiate (no differentiable output or input)")
            continue
        if r.fl_out is None or r.fl_in is None:
            bwd.add(BLOCKED, prefix + "forward failed on flagos")
            continue
        try:
            fl_grads = to_cpu(gradients(r.sample.output_process_fn_grad(r.fl_out), grad_leaves(r.fl_in), DEVICE))
            synchronize()
        except Exception as e:
            bwd.add(ERROR, prefix + describe(e))
            continue
        if fl_grads is None:
            bwd.add(WRONG, prefix + "flagos outputs are not differentiable")
            continue
        diff = mismatch(fl_grads, narrow(to_cpu(cpu_grads)), random=r.random, tol=tol)
        bwd.add(WRONG, prefix + diff) if diff else bwd.add(PASS, "")
    return forward, bwd.result()

