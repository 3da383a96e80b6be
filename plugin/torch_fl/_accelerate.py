"""Accelerate's multi-process launch on flagos.

Accelerate 1.x picks its distributed type from the accelerator
(``DistributedType(f"MULTI_{device.upper()}")``) and knows no device it does
not list: under ``torchrun`` or ``accelerate launch`` with several processes
on flagos it found no backend, set ``DistributedType.NO`` and let every
process train alone on the whole dataset — a silent wrong run (the
Hugging Face Trainer too, which uses Accelerate's state).

This module, run once ``accelerate.state`` is imported (torch_fl's import
hook), makes such a launch a real one: the processes form a process group
with the flagos c10d backend (``cpu:gloo,flagos:flagos``), each takes
``flagos:LOCAL_RANK % device_count`` as its device, and Accelerate drives
them through its ``MULTI_CPU`` type, the one member whose code paths assume
no particular device API (plain ``DistributedDataParallel`` without
``device_ids``, barriers without ``device_ids``, the generator broadcast of
CPU tensors). ``AcceleratorState().distributed_type`` therefore reads
``MULTI_CPU`` while the model, the data and the collectives are on flagos.

It applies when the launch has several processes (``LOCAL_RANK`` set), the
device Accelerate would use is flagos (``ACCELERATE_TORCH_DEVICE=flagos``,
or unset while flagos is torch's accelerator), and Accelerate is not told
to use the CPU. Anything else is left to Accelerate.
"""
from __future__ import annotations

import os
from types import ModuleType

import torch

BACKEND = "cpu:gloo,flagos:flagos"


def _wants_flagos(cpu: bool, sagemaker_dp: bool) -> bool:
    if cpu or sagemaker_dp or int(os.environ.get("LOCAL_RANK", -1)) == -1:
        return False
    named = os.environ.get("ACCELERATE_TORCH_DEVICE")
    if named is not None:
        return torch.device(named).type == "flagos"
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "flagos"


def register(state: ModuleType) -> None:
    """Patches ``accelerate.state.PartialState`` (module docstring)."""
    from accelerate.utils import DistributedType

    partial = state.PartialState
    if getattr(partial, "_flagos_registered", False):
        return
    prepare_backend = partial._prepare_backend
    set_device = partial.set_device

    def _prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend=None):
        if not _wants_flagos(cpu, sagemaker_dp):
            return prepare_backend(self, cpu, sagemaker_dp, backend)
        if backend not in (None, "flagos", BACKEND):
            raise ValueError(
                f"flagos: Accelerate was asked for the distributed backend {backend!r}; flagos "
                f"tensors take the flagos c10d backend ({BACKEND!r}, the default): leave the "
                "backend unset (docs/usage.md, \"The Hugging Face Trainer and Accelerate\")")
        return BACKEND, DistributedType.MULTI_CPU

    def _set_device(self):
        if self.backend != BACKEND:  # not a launch _prepare_backend took for flagos
            return set_device(self)
        if self.device is None or (self.device.type == "flagos" and self.device.index is None):
            index = self.local_process_index % torch.flagos.device_count()
            self.device = torch.device("flagos", index)
        if self.device.type == "flagos":
            torch.flagos.set_device(self.device)

    partial._prepare_backend = _prepare_backend
    partial.set_device = _set_device
    partial._flagos_registered = True
