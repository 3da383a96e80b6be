"""The mixed-operand module sweep: module_db's float32 samples with operands of another dtype or device.

The module sweep (module_harness.py) builds each module and its inputs at one
dtype, all on one device. Programs mix them: a float32 module fed float64
inputs, a module built with tensors of another dtype (FractionalMaxPool's
`_random_samples`), a module whose 0-dim buffers stayed on the CPU. flagos
infers shapes on meta tensors while flagosd runs the CPU kernel, so a meta
function that refuses what the kernel takes (or the reverse) shows here as a
difference from the CPU. Modes (train mode, forward only):
  - "input-dtype": the module at float32, its floating forward inputs float64;
  - "constructor-dtype": the module's floating constructor tensors float64;
  - "cpu-buffers": the module on flagos with its 0-dim buffers on the CPU
    (CUDA takes 0-dim CPU tensors beside its own).
Where the CPU raises, the row is SKIPPED_ON_CPU; a mode with no such operand
in any sample is SKIPPED_ON_CPU with "no samples".

    scripts/mixed-sweep modules   -> docs/reference/mixed-module-operands.md
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch.testing._internal.common_modules import ModuleInfo

from compare import Copier, ForwardOnly, Plan, map_tensors
from module_harness import (  # noqa: F401  (the suite's interface)
    MODULE_SEED,
    SAMPLE_SEED,
    SAMPLE_SOURCE,
    ModuleSample,
    all_entries,
    draws_random,
    error_verdict,
    supported,
)
from results import CONSTRUCTOR_DTYPE, CPU_BUFFERS, INPUT_DTYPE

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32}
MODES = (INPUT_DTYPE, CONSTRUCTOR_DTYPE, CPU_BUFFERS)


def plan(info: ModuleInfo) -> list[Plan]:
    if torch.float32 not in info.dtypes:
        return []
    return [Plan("float32", False, mode) for mode in MODES]


def has_floating_tensor(v: Any) -> bool:
    found = []
    map_tensors(v, lambda t: found.append(t.is_floating_point()) or t)
    return any(found)


def widen(v: Any) -> Any:
    return map_tensors(v, lambda t: t.detach().to(torch.float64).requires_grad_(t.requires_grad)
                          if t.dtype == torch.float32 else t)


@dataclass
class MixedModuleSample(ModuleSample):
    mode: str = ""

    def build(self, device: str) -> torch.nn.Module:
        ctor = (self.sample.constructor_input.args, self.sample.constructor_input.kwargs)
        if self.mode == CONSTRUCTOR_DTYPE:
            ctor = widen(ctor)
        ctor = Copier(device).value(ctor)
        torch.manual_seed(MODULE_SEED)
        module = self.info.module_cls(*ctor[0], **ctor[1])
        if self.mode != CONSTRUCTOR_DTYPE:
            module = module.to(self.dtype)
        module = module.to(device).train(self.training)
        if self.mode == CPU_BUFFERS and device != "cpu":
            for sub in module.modules():
                for name, b in list(sub.named_buffers(recurse=False)):
                    if b is not None and b.dim() == 0:
                        setattr(sub, name, b.cpu())
        return module

    def forward_args(self, device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        forward = self.sample.forward_input
        values: Any = (tuple(forward.args), dict(forward.kwargs))
        if self.mode == INPUT_DTYPE:
            values = widen(values)
        return Copier(device).value(values)

    def run(self, device: str) -> ForwardOnly:  # type: ignore[override]
        # ModuleSample.run with this class's build and forward_args; outputs only.
        return ForwardOnly({"outputs": super().run(device).compared["outputs"]})


def applies(mode: str, info: ModuleInfo, sample: Any) -> bool:
    """Whether the sample has an operand the mode changes."""
    if mode == INPUT_DTYPE:
        return has_floating_tensor((sample.forward_input.args, sample.forward_input.kwargs))
    if mode == CONSTRUCTOR_DTYPE:
        return has_floating_tensor((sample.constructor_input.args, sample.constructor_input.kwargs))
    try:
        torch.manual_seed(MODULE_SEED)
        module = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    except Exception:
        return True  # compare_samples records the CPU's refusal
    return any(b is not None and b.dim() == 0 for b in module.buffers())


def samples(info: ModuleInfo, unit: Plan, max_samples: int) -> list[MixedModuleSample]:
    """The entry's float32 train-mode samples the unit's mode applies to, the first `max_samples` (all when 0)."""
    torch.manual_seed(SAMPLE_SEED)
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=False, training=True)
    chosen = (s for s in inputs if applies(unit.mode, info, s))
    out = []
    for sample in itertools.islice(chosen, max_samples if max_samples > 0 else None):
        s = MixedModuleSample(info, sample, torch.float32, True, mode=unit.mode)
        try:
            s.random = draws_random(s.build("cpu"))
        except Exception:  # the CPU cannot build it: compare_samples records that
            pass
        out.append(s)
    return out
