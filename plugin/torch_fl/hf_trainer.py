"""The Hugging Face Trainer's checkpoints with flagos's generator state.

``transformers.Trainer`` saves in ``rng_state.pth`` the Python, NumPy and
CPU generators and those of the devices it lists (CUDA, NPU, HPU, MLU, MUSA,
XLA); for flagos it saves none, and on resuming it reseeds flagos from
``args.seed``: dropout and every other random op on flagos then draw other
numbers than the uninterrupted run did. (Accelerate's own
``Accelerator.save_state`` / ``load_state`` do carry it, as
``torch_flagos_manual_seed``.)

``Trainer(..., callbacks=[FlagosRngStateCallback()])`` keeps each flagos
device's generator state in the checkpoint's ``trainer_state.json`` (the
Trainer's stateful callbacks) and sets it back when training resumes from
that checkpoint. Imports transformers: import this module only where it is
installed.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState


class FlagosRngStateCallback(TrainerCallback, ExportableState):
    """Saves flagos's generator states with each checkpoint and restores
    them on resuming (module docstring)."""

    def state(self) -> dict[str, Any]:
        """Called by the Trainer as it writes a checkpoint: every flagos
        device's generator state, as lists of bytes (the file is JSON)."""
        states = [s.tolist() for s in torch.flagos.get_rng_state_all()]
        return {"args": {}, "attributes": {"rng_states": states}}

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if state.global_step == 0:  # not resuming
            return
        saved = state.stateful_callbacks.get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not saved:
            warnings.warn(
                f"flagos: the checkpoint of step {state.global_step} holds no flagos generator "
                f"state (it was saved without {type(self).__name__}): random ops on flagos "
                "(dropout) will not repeat the uninterrupted run's numbers", stacklevel=2)
            return
        states = saved["attributes"]["rng_states"]
        for index, values in enumerate(states[:torch.flagos.device_count()]):
            torch.flagos.set_rng_state(torch.tensor(values, dtype=torch.uint8), index)
