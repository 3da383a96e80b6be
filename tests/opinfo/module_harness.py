"""Runs one ModuleInfo entry at one dtype, in one mode, on the CPU and on flagos and compares them.

In-process and unprotected, like harness.py (worker.py runs it with
--suite modules; driver.py guards that child).

An entry is a module of PyTorch's `module_db`
(torch.testing._internal.common_modules); a unit is (dtype, mode) for
float32 and float64 (those the entry supports) and both modes, train and
eval. Every sample of `module_inputs_func(info, "cpu", dtype,
requires_grad=True, training=...)` (generated once with a fixed seed) runs
on both devices, each from its own copies of the constructor and forward
arguments (compare.Copier: same layout and aliasing):

- the module is built on the CPU with the same seed on both sides, cast to
  the dtype, moved to the device, put in the mode; a lazy module first runs
  the sample once without grad to make its parameters; then the flagos
  module gets the CPU module's parameters and buffers (load_state_dict), so
  both start from the same state;
- forward: the outputs and the buffers after the forward (running
  statistics) must match the CPU's;
- backward: the gradients of sum(w_i * out_i) (compare.weighted_sum) with
  respect to every input that requires grad and every parameter must match.

Random numbers: the global seed is set the same way before each side's
forward, but flagos draws other numbers than the CPU for the same seed
(docs/usage.md), so a sample whose module draws random numbers (dropout
with p > 0 in train mode, FractionalMaxPool without _random_samples, RReLU
in train mode) is compared by shapes and dtypes only.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.testing._internal.common_modules import ModuleInfo, ModuleInput, module_db

from compare import Copier, Plan, gradients, grad_leaves, to_cpu
from results import ERROR, EVAL, NEEDS_CUDA, TRAIN

SAMPLE_SEED = 0
SAMPLE_SOURCE = "module_inputs_func"  # what makes the samples, in SKIPPED_ON_CPU messages
MODULE_SEED = 1
FORWARD_SEED = 2

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
MODES: tuple[str, ...] = (TRAIN, EVAL)


# ------------------------------------------------------------------ entries


def all_entries() -> dict[str, ModuleInfo]:
    """Every entry of module_db by its name ("nn.Linear"), sorted."""
    return dict(sorted((info.name, info) for info in module_db))


def plan(info: ModuleInfo) -> list[Plan]:
    """float32 and float64 where the entry supports them, each in train and in eval mode."""
    return [Plan(name, True, mode) for name, dtype in DTYPES.items() if dtype in info.dtypes for mode in MODES]


def supported(info: ModuleInfo) -> list[str]:
    return sorted(str(d).removeprefix("torch.") for d in info.dtypes)


# What torch says when a module asks for a feature only CUDA has (cuDNN, a
# CUDA-only kernel, torch.cuda) on another device.
_NEEDS_CUDA = re.compile(r"\bCUDA\b|cuDNN|cudnn|Torch not compiled with CUDA|only supported on cuda", re.IGNORECASE)


def error_verdict(e: BaseException) -> str:
    """NEEDS_CUDA for what flagos raises because the module wants CUDA, else ERROR."""
    return NEEDS_CUDA if _NEEDS_CUDA.search(str(e)) else ERROR


def draws_random(module: torch.nn.Module) -> bool:
    """Whether a forward of the module (in its current mode) draws random numbers."""
    for m in module.modules():
        if isinstance(m, (torch.nn.FractionalMaxPool2d, torch.nn.FractionalMaxPool3d)):
            if m._random_samples is None:
                return True
        elif not m.training:
            continue
        elif isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        elif isinstance(m, (torch.nn.MultiheadAttention, torch.nn.RNNBase)) and m.dropout > 0:
            return True
        elif isinstance(m, torch.nn.RReLU):
            return True
    return False


# ------------------------------------------------------------------ one sample


@dataclass
class ModuleSide:
    """The module's forward on one device: its module, copied inputs and outputs."""

    module: torch.nn.Module
    inputs: Any
    out: Any
    compared: Any
    device: str

    def gradients(self) -> dict[str, Any] | None:
        inputs = grad_leaves(self.inputs)
        params = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        grads = gradients(self.out, inputs + [p for _, p in params], self.device)
        if grads is None:
            return None
        grads = to_cpu(grads)
        return {"inputs": grads[: len(inputs)], "parameters": dict(zip((n for n, _ in params), grads[len(inputs):]))}


@dataclass
class ModuleSample:
    """One ModuleInput, built and run afresh on each device; the CPU's run goes first."""

    info: ModuleInfo
    sample: ModuleInput
    dtype: torch.dtype
    training: bool
    random: bool = False
    initial_state: dict[str, torch.Tensor] = field(default_factory=dict)

    def build(self, device: str) -> torch.nn.Module:
        ctor = Copier(device).value((self.sample.constructor_input.args, self.sample.constructor_input.kwargs))
        torch.manual_seed(MODULE_SEED)
        module = self.info.module_cls(*ctor[0], **ctor[1]).to(self.dtype)
        return module.to(device).train(self.training)

    def forward_args(self, device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        forward = self.sample.forward_input
        return Copier(device).value((tuple(forward.args), dict(forward.kwargs)))

    def run(self, device: str) -> ModuleSide:
        module = self.build(device)
        if self.info.is_lazy:
            args, kwargs = self.forward_args(device)
            with torch.no_grad():
                module(*args, **kwargs)
        if device == "cpu":
            self.initial_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        else:
            module.load_state_dict(self.initial_state)
        args, kwargs = self.forward_args(device)
        torch.manual_seed(FORWARD_SEED)
        out = module(*args, **kwargs)
        buffers = {name: to_cpu(b) for name, b in module.named_buffers()}
        return ModuleSide(module, (args, kwargs), out, {"outputs": to_cpu(out), "buffers": buffers}, device)


# ------------------------------------------------------------------ one (entry, dtype, mode)


def samples(info: ModuleInfo, unit: Plan, max_samples: int) -> list[ModuleSample]:
    """The first `max_samples` samples of the entry in the unit (all when 0); raises what module_inputs_func raises."""
    dtype = DTYPES[unit.dtype]
    training = unit.mode == TRAIN
    torch.manual_seed(SAMPLE_SEED)
    inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
    chosen = []
    for sample in itertools.islice(inputs, max_samples if max_samples > 0 else None):
        s = ModuleSample(info, sample, dtype, training)
        try:
            s.random = draws_random(s.build("cpu"))
        except Exception:  # the CPU cannot build it: compare_samples records that
            pass
        chosen.append(s)
    return chosen

