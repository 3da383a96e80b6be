"""The Hugging Face Trainer and Accelerate on flagos (docs/usage.md,
"Frameworks"): the example of that section, run as the reader sees it.

References: the same script on the CPU (``ACCELERATE_TORCH_DEVICE=cpu``)
for the losses; the uninterrupted run for a resumed one; CPU bf16 autocast
for flagos bf16 autocast.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")
from flagos_test_env import REPO

pytest.importorskip("transformers", reason="transformers is not installed (scripts/bootstrap "
                    "installs it)")
pytest.importorskip("accelerate", reason="accelerate is not installed (scripts/bootstrap "
                    "installs it)")

USAGE = REPO / "docs" / "usage.md"
STEPS = 8
TOLERANCE = 1e-5
# bf16 keeps 8 bits of mantissa: one rounding step is 2**-8 relative.
BF16_TOLERANCE = 1.6e-2

# Runs the example with argv, recording the output dtype of every layer that
# multiplies matrices (GPT-2's Conv1D and the LM head's Linear), which
# autocast decides.
RUN_EXAMPLE = r"""
import runpy, sys, torch
dtypes = set()
def record(module, inputs, output):
    if type(module).__name__ in ("Conv1D", "Linear") and isinstance(output, torch.Tensor):
        dtypes.add(str(output.dtype))
torch.nn.modules.module.register_module_forward_hook(record)
script, *args = sys.argv[1:]
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
print("matmul dtypes", " ".join(sorted(dtypes)))
"""


def hf_trainer_example() -> str:
    """The example of docs/usage.md's "The Hugging Face Trainer and Accelerate"."""
    match = re.search(r"<!-- hf-trainer-example -->\n```python\n(.*?)```", USAGE.read_text(), re.S)
    assert match, "docs/usage.md lost its hf-trainer-example block"
    return match.group(1)


class Run:
    def __init__(self, stdout: str, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.losses = {int(m.group(1)): float(m.group(2))
                       for m in re.finditer(r"^step (\d+) loss (\S+)$", stdout, re.M)}
        self.device = re.search(r"^trained on (\S+)$", stdout, re.M).group(1)
        self.matmul_dtypes = set(re.search(r"^matmul dtypes (.*)$", stdout, re.M).group(1).split())


@pytest.fixture(scope="module")
def run_example(tmp_path_factory: pytest.TempPathFactory):
    """run_example(name, *args, device="flagos", mixed_precision=None) -> Run; the
    output folder is tmp/<name>."""
    workdir = tmp_path_factory.mktemp("hf")
    script = workdir / "train_gpt2.py"
    script.write_text(hf_trainer_example())

    def run(name: str, *args: str, device: str = "flagos",
            mixed_precision: str | None = None) -> Run:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "ACCELERATE_TORCH_DEVICE": device}
        env.pop("ACCELERATE_MIXED_PRECISION", None)
        if mixed_precision:
            env["ACCELERATE_MIXED_PRECISION"] = mixed_precision
        result = subprocess.run(
            [sys.executable, "-c", RUN_EXAMPLE, str(script), str(workdir / name), *args],
            env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=600)
        assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        return Run(result.stdout, workdir / name)

    return run


def test_trainer_on_flagos_matches_the_cpu(run_example) -> None:
    on_flagos = run_example("flagos", "--dropout", "0")
    on_cpu = run_example("cpu", "--dropout", "0", device="cpu")
    assert on_flagos.device == "flagos:0"
    assert on_cpu.device == "cpu"
    assert sorted(on_flagos.losses) == list(range(1, STEPS + 1))
    for step, loss in on_cpu.losses.items():
        assert on_flagos.losses[step] == pytest.approx(loss, rel=TOLERANCE), step
    assert (on_flagos.output_dir / "checkpoint-4" / "model.safetensors").is_file()
    assert on_flagos.matmul_dtypes == {"torch.float32"}


def test_resuming_restores_the_flagos_generator(run_example) -> None:
    # Dropout on: the resumed steps repeat only if flagos's generator state
    # came back from the checkpoint (the Trainer itself reseeds it).
    whole = run_example("whole")
    state = json.loads((whole.output_dir / "checkpoint-4" / "trainer_state.json").read_text())
    saved = state["stateful_callbacks"]["FlagosRngStateCallback"]["attributes"]["rng_states"]
    assert len(saved) == torch.flagos.device_count()
    assert all(len(s) == len(torch.flagos.get_rng_state(0)) for s in saved)

    resumed = run_example("whole", "--resume", str(whole.output_dir / "checkpoint-4"))
    assert resumed.device == "flagos:0"
    for step in range(5, STEPS + 1):
        assert resumed.losses[step] == pytest.approx(whole.losses[step], rel=1e-6), step


def test_accelerate_bf16_autocasts_on_flagos_as_on_the_cpu(run_example) -> None:
    on_flagos = run_example("flagos-bf16", "--dropout", "0", mixed_precision="bf16")
    on_cpu = run_example("cpu-bf16", "--dropout", "0", device="cpu", mixed_precision="bf16")
    assert on_flagos.device == "flagos:0"
    assert on_flagos.matmul_dtypes == {"torch.bfloat16"}
    assert on_cpu.matmul_dtypes == {"torch.bfloat16"}
    for step, loss in on_cpu.losses.items():
        assert on_flagos.losses[step] == pytest.approx(loss, rel=BF16_TOLERANCE), step


def test_training_arguments_bf16_is_refused_by_transformers(run_python) -> None:
    # What the docs tell the reader to avoid: transformers lists the devices
    # it allows bf16=True on, and flagos is not among them.
    code = ("import torch_fl\nfrom transformers import TrainingArguments\n"
            "try:\n    TrainingArguments(output_dir='unused', bf16=True, report_to=[])\n"
            "except ValueError as e:\n    print('refused:', e)\n")
    result = run_python(code, env={"ACCELERATE_TORCH_DEVICE": "flagos"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused: Your setup doesn't support bf16/gpu" in result.stdout, result.stdout


ACCELERATE_STATE = r"""
import json, sys, tempfile
import torch
import torch_fl  # noqa: F401
from accelerate import Accelerator
from accelerate.utils.memory import clear_device_cache
from accelerate.utils.modeling import get_max_memory

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(4, 4))
report = {"device": str(accelerator.device),
          "param_device": str(next(model.parameters()).device)}
folder = tempfile.mkdtemp()
torch.manual_seed(3)
torch.rand(5, device="flagos")
accelerator.save_state(folder)
after_save = torch.rand(5, device="flagos").cpu()
torch.manual_seed(99)
accelerator.load_state(folder)
after_load = torch.rand(5, device="flagos").cpu()
report["draws_repeat"] = torch.equal(after_save, after_load)
report["saved_keys"] = sorted(torch.load(f"{folder}/random_states_0.pkl", weights_only=False))
memory = get_max_memory()
report["max_memory"] = {str(k): v for k, v in memory.items()}
report["totals"] = [torch.flagos.mem_get_info(i)[1] for i in range(torch.flagos.device_count())]
clear_device_cache(garbage_collection=True)
print(json.dumps(report))
"""


def test_accelerate_saves_and_restores_the_flagos_generator_and_reads_memory(run_python) -> None:
    result = run_python(ACCELERATE_STATE, env={"ACCELERATE_TORCH_DEVICE": "flagos"},
                        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["device"] == "flagos"
    assert report["param_device"] == "flagos:0"
    assert "torch_flagos_manual_seed" in report["saved_keys"]
    assert report["draws_repeat"] is True
    for index, total in enumerate(report["totals"]):
        assert 0 < report["max_memory"][str(index)] <= total


# The Trainer under torchrun, 2 processes: on flagos (ACCELERATE_TORCH_DEVICE)
# and, as the reference, on the CPU (use_cpu: Accelerate's own multi-CPU
# launch over gloo). Dropout off, so both draw nothing. Each rank writes what
# it saw into files of its own: the ranks share torchrun's stdout, where
# their lines (and the Trainer's) may land inside one another.
DDP_TRAINER = r"""
import json, sys, torch, torch_fl
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
out, device = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
tokens = torch.randint(0, 128, (64, 16))
dataset = [{"input_ids": t, "labels": t} for t in tokens]
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=16,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(config)
args = TrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=4,
                         learning_rate=1e-3, logging_steps=1, report_to=[], disable_tqdm=True,
                         save_strategy="no", use_cpu=device == "cpu")
trainer = Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()
state = trainer.accelerator.state
with open(f"{out}/rank{state.process_index}.json", "w") as f:
    json.dump([state.process_index, state.num_processes, str(model.device)], f)
if state.process_index == 0:
    losses = [[e["step"], e["loss"], e["epoch"]] for e in trainer.state.log_history if "loss" in e]
    with open(f"{out}/losses.json", "w") as f:
        json.dump(losses, f)
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out + "/params.pt")
"""


def trainer_under_torchrun(tmp_path: Path, device: str) -> tuple[list, list, dict]:
    from test_distributed import free_port

    script = tmp_path / "ddp_trainer.py"
    script.write_text(DDP_TRAINER)
    out = tmp_path / device
    out.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ACCELERATE_TORCH_DEVICE", None)
    if device == "flagos":
        env["ACCELERATE_TORCH_DEVICE"] = "flagos"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(script), str(out), device],
        env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    ranks = sorted(json.loads((out / f"rank{i}.json").read_text()) for i in range(2))
    losses = json.loads((out / "losses.json").read_text())
    return ranks, losses, torch.load(out / "params.pt")


def test_trainer_under_torchrun_trains_data_parallel_on_flagos_as_on_the_cpu(tmp_path) -> None:
    # Before torch_fl told Accelerate about flagos, each process trained
    # alone on the whole dataset (Accelerate found no distributed type).
    ranks, losses, params = trainer_under_torchrun(tmp_path, "flagos")
    ref_ranks, ref_losses, ref_params = trainer_under_torchrun(tmp_path, "cpu")
    assert ranks == [[0, 2, "flagos:0"], [1, 2, "flagos:1"]], ranks
    assert ref_ranks == [[0, 2, "cpu"], [1, 2, "cpu"]], ref_ranks
    # 64 samples, 2 processes of 4 a step: 8 steps an epoch, as on the CPU.
    assert [(s, e) for s, _, e in losses] == [(s, e) for s, _, e in ref_losses], (losses, ref_losses)
    assert [s for s, _, _ in losses] == [1, 2, 3, 4, 5, 6], losses
    assert losses[-1][2] == 0.75, losses
    for (step, loss, _), (_, ref, _) in zip(losses, ref_losses):
        assert loss == pytest.approx(ref, rel=TOLERANCE), step
    assert params.keys() == ref_params.keys()
    for name, value in params.items():
        torch.testing.assert_close(value, ref_params[name], rtol=1e-4, atol=1e-5, msg=name)
