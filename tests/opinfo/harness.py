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
"""

from __future__ import annotations

import itertools
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

from compare import Copier, Plan, gradients, grad_leaves, to_cpu
from families import CPU_ARGS, is_random_sample
from results import ERROR, SWEEP_DTYPES, entry_key

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
    """The sweep dtypes the entry supports on the CPU, in SWEEP_DTYPES order."""
    supported = op.supported_dtypes("cpu")
    backward_ok = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
    return [
        Plan(name, dtype in GRAD_DTYPES and dtype in backward_ok)
        for name, dtype in DTYPES.items()
        if dtype in supported
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


# ------------------------------------------------------------------ one (entry, dtype)


@dataclass
class OpSide:
    """The op's forward on one device: its copied inputs and outputs."""

    inputs: SampleInput
    out: Any
    compared: Any
    device: str

    def gradients(self) -> list[Any] | None:
        grads = gradients(self.inputs.output_process_fn_grad(self.out), grad_leaves(
            [self.inputs.input, list(self.inputs.args), self.inputs.kwargs]), self.device)
        return None if grads is None else to_cpu(grads)


@dataclass
class OpSample:
    op: OpInfo
    sample: SampleInput
    entry: str
    random: bool

    def run(self, device: str) -> OpSide:
        s = copy_sample(self.sample, device, self.entry)
        out = self.op(s.input, *s.args, **s.kwargs)
        process = self.sample.output_process_fn_grad
        compared = to_cpu(process(out)) if device == "cpu" else process(to_cpu(out))
        return OpSide(s, out, compared, device)


def samples(op: OpInfo, unit: Plan, max_samples: int) -> list[OpSample]:
    """The first `max_samples` samples of the entry at the unit's dtype (all when 0); raises what sample_inputs raises."""
    entry = entry_key(op.name, op.variant_test_name)
    torch.manual_seed(SAMPLE_SEED)
    generator = op.sample_inputs("cpu", DTYPES[unit.dtype], requires_grad=unit.backward)
    chosen = itertools.islice(generator, max_samples if max_samples > 0 else None)
    return [OpSample(op, s, entry, is_random_sample(entry, s.args, s.kwargs)) for s in chosen]



def error_verdict(e: BaseException) -> str:
    """What flagos raising is: always an ERROR for operators."""
    return ERROR
