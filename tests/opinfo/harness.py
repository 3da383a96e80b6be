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
random weights w_i, w.r.t. every input that requires grad must match too
(compare.compare_samples).

CUDA's extra dtypes (plan: supported_dtypes("cuda") minus
supported_dtypes("cpu")): the CPU side runs the sample's tensors of the
unit's dtype in a wider dtype (results.WIDER_REFERENCE) and its outputs and
gradients are converted back (narrowed) before the comparison.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
    op_db,
)
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

from compare import Copier, Plan, gradients, grad_leaves, map_tensors, to_cpu
from families import CPU_ARGS, is_random_sample
from results import ERROR, SWEEP_DTYPES, WIDER_REFERENCE, entry_key

SAMPLE_SEED = 0
SAMPLE_SOURCE = "sample_inputs"  # what makes the samples, in SKIPPED_ON_CPU messages

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in SWEEP_DTYPES}
GRAD_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64})


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


def plan(op: OpInfo) -> list[Plan]:
    """The sweep dtypes the entry supports on the CPU, then CUDA's extra ones, each in SWEEP_DTYPES order.

    CUDA's extra dtypes (supported_dtypes("cuda") minus supported_dtypes("cpu"))
    are what libraries' CUDA paths send to flagos; their CPU reference runs
    in a wider dtype (WIDER_REFERENCE, the plan's `reference`) and is converted back.
    """
    supported = op.supported_dtypes("cpu")
    cuda_extra = op.supported_dtypes("cuda") - supported
    backward_ok = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
    cuda_backward_ok = op.supported_backward_dtypes("cuda") if op.supports_autograd else set()
    return [
        Plan(name, dtype in GRAD_DTYPES and dtype in backward_ok)
        for name, dtype in DTYPES.items()
        if dtype in supported
    ] + [
        Plan(name, dtype in GRAD_DTYPES and dtype in cuda_backward_ok, reference=WIDER_REFERENCE[name])
        for name, dtype in DTYPES.items()
        if dtype in cuda_extra
    ]


def supported(op: OpInfo) -> list[str]:
    """Every dtype the entry supports on the CPU, by name."""
    return sorted(str(d).removeprefix("torch.") for d in op.supported_dtypes("cpu"))


def copy_sample(s: SampleInput, device: str, entry: str = "") -> SampleInput:
    """A copy of the sample on the device; positional args in CPU_ARGS[entry] stay CPU tensors."""
    copier = Copier(device)
    keep = CPU_ARGS.get(entry, frozenset())
    cpu = Copier("cpu") if keep else copier
    return SampleInput(
        copier.value(s.input),
        args=tuple((cpu if i in keep else copier).value(a) for i, a in enumerate(s.args)),
        kwargs=copier.value(s.kwargs),
        output_process_fn_grad=s.output_process_fn_grad,
        broadcasts_input=s.broadcasts_input,
        name=s.name,
    )


# ------------------------------------------------------------------ CUDA's extra dtypes


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


def unchanged(v: Any) -> Any:
    """The CPU reference at the unit's own dtype: nothing to convert back."""
    return v


# ------------------------------------------------------------------ one (entry, dtype)


@dataclass
class OpSide:
    """The op's forward on one device: its copied inputs and outputs."""

    inputs: SampleInput
    out: Any
    compared: Any
    device: str
    narrow: Callable[[Any], Any] = unchanged  # a CPU reference in a wider dtype: back to the unit's dtype

    def gradients(self) -> list[Any] | None:
        grads = gradients(self.inputs.output_process_fn_grad(self.out), grad_leaves(
            [self.inputs.input, list(self.inputs.args), self.inputs.kwargs]), self.device)
        return None if grads is None else self.narrow(to_cpu(grads))


@dataclass
class OpSample:
    op: OpInfo
    sample: SampleInput
    entry: str
    random: bool
    dtype: torch.dtype
    wide: torch.dtype | None = None  # CUDA's extra dtypes: the CPU reference's dtype

    def run(self, device: str) -> OpSide:
        s = copy_sample(self.sample, device, self.entry)
        narrow: Callable[[Any], Any] = unchanged
        if device == "cpu" and self.wide is not None:
            s = widened(s, self.dtype, self.wide)
            narrow = functools.partial(narrowed, wide=self.wide, dtype=self.dtype)
        out = narrow(self.op(s.input, *s.args, **s.kwargs))
        process = self.sample.output_process_fn_grad
        compared = to_cpu(process(out)) if device == "cpu" else process(to_cpu(out))
        return OpSide(s, out, compared, device, narrow)


def samples(op: OpInfo, unit: Plan, max_samples: int) -> list[OpSample]:
    """The first `max_samples` samples of the entry at the unit's dtype (all when 0); raises what sample_inputs raises.

    With the unit's `reference` (CUDA's extra dtypes), the CPU side of each
    sample runs in that wider dtype and is converted back.
    """
    entry = entry_key(op.name, op.variant_test_name)
    dtype = DTYPES[unit.dtype]
    wide = getattr(torch, unit.reference) if unit.reference else None
    torch.manual_seed(SAMPLE_SEED)
    generator = op.sample_inputs("cpu", dtype, requires_grad=unit.backward)
    chosen = itertools.islice(generator, max_samples if max_samples > 0 else None)
    return [OpSample(op, s, entry, is_random_sample(entry, s.args, s.kwargs), dtype, wide) for s in chosen]



def error_verdict(e: BaseException) -> str:
    """What flagos raising is: always an ERROR for operators."""
    return ERROR
