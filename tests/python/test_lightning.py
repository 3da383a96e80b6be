"""Lightning trains on flagos: ``Trainer(accelerator="flagos", devices=N)``
(docs/usage.md, "Frameworks"; torch_fl/lightning.py).

The reference for every one-device fit is the same fit on the CPU (same
seed, same data, same steps): the losses and the final weights agree. A
fit on two devices is Lightning's DDP on the flagos c10d backend
(tests/distributed/lightning_ddp.py), whose reference is one CPU process
training on the global batches.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from flagos_test_env import REPO

import torch_fl  # noqa: F401  (registers "flagos"; registers with Lightning on its import)

pl = pytest.importorskip("lightning.pytorch",
                         reason="lightning is not installed (scripts/bootstrap installs it)")
from lightning.pytorch.accelerators import AcceleratorRegistry  # noqa: E402
from lightning.pytorch.callbacks import DeviceStatsMonitor  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

from torch_fl.lightning import FlagosAccelerator  # noqa: E402

STEPS = 6
TOLERANCE = 1e-5
# bf16 keeps 8 bits of mantissa: one rounding step is 2**-8 relative.
BF16_TOLERANCE = 1.6e-2


class Regressor(pl.LightningModule):
    """A small MLP; records each step's loss, the device of each batch and
    the dtype of the first layer's output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []
        self.batch_devices: set[torch.device] = set()
        self.hidden_dtypes: set[torch.dtype] = set()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        self.batch_devices.add(x.device)
        hidden = self.net[0](x)
        self.hidden_dtypes.add(hidden.dtype)
        loss = nn.functional.mse_loss(self.net[2](self.net[1](hidden)).float(), y)
        self.losses.append(loss.item())
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def loader() -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def trainer(tmp_path: Path, **kwargs: object) -> pl.Trainer:
    options: dict[str, object] = dict(
        devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    options.update(kwargs)
    return pl.Trainer(**options)


def fit(tmp_path: Path, **kwargs: object) -> tuple[Regressor, pl.Trainer]:
    module = Regressor()
    t = trainer(tmp_path, **kwargs)
    t.fit(module, loader())
    return module, t


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def test_flagos_is_in_lightnings_accelerator_registry() -> None:
    assert "flagos" in AcceleratorRegistry
    assert AcceleratorRegistry["flagos"]["accelerator"] is FlagosAccelerator


def test_the_accelerator_name_puts_the_strategy_on_a_flagos_device(tmp_path: Path) -> None:
    t = trainer(tmp_path, accelerator="flagos")
    assert isinstance(t.accelerator, FlagosAccelerator)
    assert t.strategy.root_device == torch.device("flagos", 0)


def test_fit_on_flagos_matches_the_same_fit_on_the_cpu(tmp_path: Path) -> None:
    on_flagos, _ = fit(tmp_path, accelerator="flagos")
    on_cpu, _ = fit(tmp_path, accelerator="cpu")
    assert on_flagos.batch_devices == {torch.device("flagos", 0)}
    assert on_cpu.batch_devices == {torch.device("cpu")}
    assert len(on_flagos.losses) == STEPS
    assert on_flagos.losses == pytest.approx(on_cpu.losses, rel=TOLERANCE)
    assert on_flagos.losses[-1] < on_flagos.losses[0]  # it trained
    expected = weights(on_cpu)
    for name, value in weights(on_flagos).items():
        torch.testing.assert_close(value, expected[name], rtol=TOLERANCE, atol=TOLERANCE,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_an_accelerator_instance_works_as_the_name_does(tmp_path: Path) -> None:
    by_instance, t = fit(tmp_path, accelerator=FlagosAccelerator())
    by_name, _ = fit(tmp_path, accelerator="flagos")
    assert t.strategy.root_device == torch.device("flagos", 0)
    assert by_instance.losses == by_name.losses


def test_devices_list_selects_that_flagos_device(tmp_path: Path) -> None:
    module, t = fit(tmp_path, accelerator="flagos", devices=[1])
    assert t.strategy.root_device == torch.device("flagos", 1)
    assert module.batch_devices == {torch.device("flagos", 1)}


def test_bf16_mixed_autocasts_on_flagos_as_on_the_cpu(tmp_path: Path) -> None:
    on_flagos, _ = fit(tmp_path, accelerator="flagos", precision="bf16-mixed")
    on_cpu, _ = fit(tmp_path, accelerator="cpu", precision="bf16-mixed")
    full, _ = fit(tmp_path, accelerator="flagos")
    assert on_flagos.hidden_dtypes == {torch.bfloat16}
    assert full.hidden_dtypes == {torch.float32}
    assert on_flagos.losses == pytest.approx(on_cpu.losses, rel=BF16_TOLERANCE)


@pytest.mark.parametrize("devices", [2, -1, "0,1", [0, 1]])
def test_several_devices_get_ddp_on_the_flagos_process_group_backend(
        tmp_path: Path, devices: object) -> None:
    assert torch.flagos.device_count() == 2  # the test daemon serves 2: -1 means both
    built = trainer(tmp_path, accelerator="flagos", devices=devices)
    assert type(built.strategy).__name__ == "DDPStrategy", built.strategy
    assert built.strategy._get_process_group_backend() == "flagos"
    assert built.strategy.parallel_devices == [torch.device("flagos", 0),
                                               torch.device("flagos", 1)]


def test_several_nodes_get_ddp_on_the_flagos_process_group_backend(tmp_path: Path) -> None:
    built = trainer(tmp_path, accelerator="flagos", devices=1, num_nodes=2)
    assert type(built.strategy).__name__ == "DDPStrategy", built.strategy
    assert built.strategy._get_process_group_backend() == "flagos"


@pytest.mark.parametrize("strategy", ["", "ddp_spawn", "fsdp"])
def test_ddp_on_two_devices_matches_one_process_on_the_global_batch(strategy: str) -> None:
    # A user's script, run as one: Lightning's launcher starts rank 1 by
    # running it again (ddp_spawn: both ranks in spawned processes, which
    # pickle the strategy; fsdp: Lightning's FSDP, which Lightning refuses
    # for accelerators but CUDA unless torch_fl lets flagos through); rank 0
    # checks the weights against the reference.
    result = subprocess.run(
        [sys.executable, "lightning_ddp.py", *([strategy] if strategy else [])],
        cwd=REPO / "tests" / "distributed",
        env=dict(os.environ, OMP_NUM_THREADS="1"), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} trained on flagos:{rank}" in result.stdout, result.stdout
    # With ddp_spawn the launching process reports for rank 0 (its weights
    # came back from the spawned rank 0).
    for rank in (0,) if strategy == "ddp_spawn" else (0, 1):
        assert f"rank {rank} lightning_ddp ok" in result.stdout, result.stdout + result.stderr[-4000:]


@pytest.mark.parametrize("args", [["1"], ["1", "bf16-mixed"], ["2"]])
def test_fabric_on_flagos_matches_one_cpu_process(args: list[str]) -> None:
    # Fabric(accelerator="flagos"): one device (32-bit and bf16 autocast on
    # flagos), and two under DDP (Fabric's launcher runs the script again
    # for rank 1); rank 0 checks the weights against plain torch on the CPU
    # trained on the global batches. Before torch_fl registered flagos with
    # Fabric, the name was refused and an accelerator instance trained on
    # the CPU.
    result = subprocess.run(
        [sys.executable, "fabric_train.py", *args], cwd=REPO / "tests" / "distributed",
        env=dict(os.environ, OMP_NUM_THREADS="1"), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    for rank in range(int(args[0])):
        assert f"rank {rank} fabric ok on flagos:{rank}" in result.stdout, result.stdout


def test_a_device_the_daemon_does_not_serve_is_refused(tmp_path: Path) -> None:
    count = torch.flagos.device_count()
    with pytest.raises(MisconfigurationException,
                       match=rf"names no device the daemon serves \(it serves {count}"):
        trainer(tmp_path, accelerator="flagos", devices=[count])


def test_device_stats_monitor_logs_the_flagos_allocator(tmp_path: Path) -> None:
    module, _ = fit(tmp_path, accelerator="flagos", logger=CSVLogger(tmp_path, name="stats"),
                    callbacks=[DeviceStatsMonitor()], log_every_n_steps=1)
    with next(tmp_path.glob("stats/*/metrics.csv")).open() as f:
        rows = list(csv.DictReader(f))
    column = "DeviceStatsMonitor.on_train_batch_start/allocated_bytes.all.current"
    logged = [float(r[column]) for r in rows if r.get(column)]
    assert len(logged) == STEPS
    # At least the parameters (and SGD's momentum buffers after the first
    # step) are allocated on the device while it trains.
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    assert min(logged) >= param_bytes
    assert max(logged) >= 2 * param_bytes


def test_get_device_stats_is_torch_flagos_memory_stats() -> None:
    keep = torch.empty(1 << 20, device="flagos")  # noqa: F841  (held while asked)
    stats = FlagosAccelerator().get_device_stats(torch.device("flagos", 0))
    assert stats["allocated_bytes.all.current"] == torch.flagos.memory_allocated(0)
    assert stats["allocated_bytes.all.current"] >= 4 << 20


REGISTERED = """
import sys
if sys.argv[1] == "torch_fl_first":
    import torch_fl
    import {namespace}.accelerators as accelerators
else:
    import {namespace}.accelerators as accelerators
    import {namespace}.trainer
    import torch_fl
print("flagos" in accelerators.AcceleratorRegistry)
"""


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
@pytest.mark.parametrize("order", ["torch_fl_first", "lightning_first"])
def test_registered_whichever_is_imported_first(run_python, namespace: str, order: str) -> None:
    pytest.importorskip(namespace, reason=f"{namespace} is not installed")
    code = f"import sys; sys.argv = ['-', {order!r}]\n" + REGISTERED.format(namespace=namespace)
    result = run_python(code, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "True", result.stdout + result.stderr[-3000:]
