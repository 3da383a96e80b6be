"""The mixed-operand sweep: OpInfo samples whose operands differ in dtype or device, on the CPU and on flagos.

The operator sweep (harness.py) runs each sample as OpInfo makes it: every
tensor at the unit's dtype, every tensor on one device. Programs do not: a
float32 activation meets a float64 buffer, an int32 index, a 0-dim CPU tensor
(`x * torch.tensor(2.0)`, a loss scale, a step count). flagos infers output
shapes on meta tensors, and a meta function may refuse what the CPU kernel
(which flagosd runs) accepts, or accept what it refuses. This suite finds such
cases: for each sample of each float32 unit it makes variants, runs each on
the CPU and on flagos, and compares them as the operator sweep does. Where
the CPU raises, the variant is SKIPPED_ON_CPU (what a kernel refuses, flagos
may refuse too); where the CPU runs, flagos must run and agree.

The units' modes are the variants:
  - "mixed-dtype": one tensor operand at a time (not the sample's input) in
    another dtype: floating operands as float64, integer ones as int32 (int64
    when they are int32), bool ones as uint8;
  - "input-dtype": the sample's input as float64, the other operands as made;
  - "cpu-scalar": one 0-dim tensor operand at a time left on the CPU (CUDA
    accepts 0-dim CPU tensors beside its own; so must flagos), and 0-dim
    operands made from the sample's non-tensor scalars where the schema
    takes a Tensor there anyway (none: OpInfo passes Python numbers).
Forward only; random entries compare shapes and dtypes.

    scripts/mixed-sweep ops    -> docs/reference/mixed-operands.md
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

from compare import Copier, ForwardOnly, Plan, to_cpu
from families import CPU_ARGS, is_random_sample
from harness import SAMPLE_SEED, error_verdict, supported  # noqa: F401  (the suite's interface)
from results import CPU_SCALAR, INPUT_DTYPE, MIXED_DTYPE, entry_key

SAMPLE_SOURCE = "sample_inputs"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32}
MODES = (MIXED_DTYPE, INPUT_DTYPE, CPU_SCALAR)
VARIANTS_PER_SAMPLE = 4  # at most this many variants of one sample (one per operand)


def all_entries() -> dict[str, OpInfo]:
    """op_db's entries (the foreach databases take lists of one dtype and device by design)."""
    return dict(sorted((entry_key(op.name, op.variant_test_name), op) for op in op_db))


def plan(op: OpInfo) -> list[Plan]:
    if torch.float32 not in op.supported_dtypes("cpu"):
        return []
    return [Plan("float32", False, mode=mode) for mode in MODES]


# ------------------------------------------------------------------ operands


@dataclass(frozen=True)
class Slot:
    """Where a tensor operand sits in a sample: the input, args[i] (j: inside a list) or kwargs[k]."""

    where: str  # "input" | "args" | "kwargs"
    key: Any
    inner: int | None = None


def tensor_slots(s: SampleInput) -> Iterator[tuple[Slot, torch.Tensor]]:
    """The sample's strided tensor operands other than its input, top level or one list deep."""
    places = [("args", i, a) for i, a in enumerate(s.args)] + [("kwargs", k, v) for k, v in s.kwargs.items()]
    for where, key, v in places:
        if isinstance(v, torch.Tensor):
            yield Slot(where, key), v
        elif isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            for j, x in enumerate(v):
                if isinstance(x, torch.Tensor):
                    yield Slot(where, key, j), x


def replaced(s: SampleInput, slot: Slot, value: Any) -> SampleInput:
    """The sample with the operand at `slot` replaced (the rest shared, not copied)."""
    args, kwargs, inp = list(s.args), dict(s.kwargs), s.input
    if slot.where == "input":
        inp = value
    else:
        holder: Any = args if slot.where == "args" else kwargs
        if slot.inner is None:
            holder[slot.key] = value
        else:
            inner = list(holder[slot.key])
            inner[slot.inner] = value
            holder[slot.key] = type(holder[slot.key])(inner)
    return SampleInput(inp, args=tuple(args), kwargs=kwargs, output_process_fn_grad=s.output_process_fn_grad,
                       broadcasts_input=s.broadcasts_input, name=s.name)


def other_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype a program's other operand would plausibly have."""
    if t.is_complex():
        return torch.complex128 if t.dtype != torch.complex128 else None
    if t.is_floating_point():
        return torch.float64 if t.dtype != torch.float64 else torch.float32
    if t.dtype == torch.bool:
        return torch.uint8
    if t.dtype == torch.int64:
        return torch.int32
    if t.dtype == torch.int32:
        return torch.int64
    return None


# ------------------------------------------------------------------ one variant


@dataclass
class MixedSample:
    """One variant of an OpInfo sample; `cpu_slots` stay CPU tensors on the flagos side."""

    op: OpInfo
    sample: SampleInput
    entry: str
    random: bool
    cpu_slots: frozenset[Slot] = frozenset()

    def run(self, device: str) -> ForwardOnly:
        s = self.sample
        copier, cpu = Copier(device), Copier("cpu")
        keep = CPU_ARGS.get(self.entry, frozenset())

        def copy(slot: Slot, v: Any) -> Any:
            on_cpu = slot in self.cpu_slots or (slot.where == "args" and slot.key in keep)
            return (cpu if on_cpu or device == "cpu" else copier).value(v)

        def copy_list(where: str, key: Any, v: Any) -> Any:
            if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
                return type(v)(copy(Slot(where, key, j), x) for j, x in enumerate(v))
            return copy(Slot(where, key), v)

        inputs = SampleInput(
            copy(Slot("input", None), s.input),
            args=tuple(copy_list("args", i, a) for i, a in enumerate(s.args)),
            kwargs={k: copy_list("kwargs", k, v) for k, v in s.kwargs.items()},
            output_process_fn_grad=s.output_process_fn_grad,
        )
        out = self.op(inputs.input, *inputs.args, **inputs.kwargs)
        process = s.output_process_fn_grad
        return ForwardOnly(to_cpu(process(out)) if device == "cpu" else process(to_cpu(out)))


def variants(mode: str, s: SampleInput) -> Iterator[tuple[SampleInput, frozenset[Slot]]]:
    if mode == INPUT_DTYPE:
        if isinstance(s.input, torch.Tensor) and s.input.dtype == torch.float32:
            yield replaced(s, Slot("input", None), s.input.detach().to(torch.float64)), frozenset()
        return
    for slot, t in tensor_slots(s):
        if mode == MIXED_DTYPE:
            dtype = other_dtype(t)
            if dtype is not None:
                yield replaced(s, slot, t.detach().to(dtype)), frozenset()
        elif mode == CPU_SCALAR and t.dim() == 0:
            yield s, frozenset({slot})


def samples(op: OpInfo, unit: Plan, max_samples: int) -> list[MixedSample]:
    """Variants of the first `max_samples` float32 samples (all when 0), at most VARIANTS_PER_SAMPLE each."""
    entry = entry_key(op.name, op.variant_test_name)
    torch.manual_seed(SAMPLE_SEED)
    generator = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    chosen = itertools.islice(generator, max_samples if max_samples > 0 else None)
    out: list[MixedSample] = []
    for s in chosen:
        random = is_random_sample(entry, s.args, s.kwargs)
        for variant, cpu_slots in itertools.islice(variants(unit.mode, s), VARIANTS_PER_SAMPLE):
            out.append(MixedSample(op, variant, entry, random, cpu_slots))
    return out

