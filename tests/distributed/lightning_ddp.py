"""Lightning DDP on flagos, as a user's script: ``Trainer(accelerator="flagos",
devices=2)`` with no strategy named.

Run by tests/python/test_lightning.py as ``python lightning_ddp.py
[STRATEGY]``; Lightning's launcher starts the second rank by running this
script again (with ``ddp_spawn``: both ranks in spawned processes, whose
rank 0 hands the weights back to this one; with ``fsdp``: Lightning's FSDP,
each rank holding a shard).
Rank 0 then trains the same module in one process on the CPU, with plain
torch, on the global batches (each rank's batch of 4 is half of one:
Lightning gives a training loader a shuffling DistributedSampler, seed 0, so
the reference draws its batches from the same samplers) and checks that the
weights agree. Each rank prints "rank N trained on flagos:N" and
"rank N lightning_ddp ok".
"""
from __future__ import annotations

import sys

import torch
from torch import nn

import torch_fl  # noqa: F401  (registers "flagos" and, with Lightning, its accelerator)
import lightning.pytorch as pl

STEPS = 6


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.devices: set[str] = set()

    def training_step(self, batch, _):
        x, y = batch
        self.devices.add(str(x.device))
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def on_train_end(self) -> None:
        print(f"rank {self.global_rank} trained on {','.join(sorted(self.devices))}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def loader(batch_size: int) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                       batch_size=batch_size)


def single_process_reference(world: int, batch_size: int) -> Regressor:
    """STEPS of SGD on CPU, each on the union of the ranks' batches."""
    dataset = loader(batch_size).dataset
    ranks = [list(torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=r,
                                                      shuffle=True, seed=0))
             for r in range(world)]
    module = Regressor()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        rows = [i for r in ranks for i in r[step * batch_size:(step + 1) * batch_size]]
        x, y = dataset[rows]
        loss = nn.functional.mse_loss(module.net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module


def fit(batch_size: int, **options) -> tuple[Regressor, pl.Trainer]:
    module = Regressor()
    trainer = pl.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **options)
    trainer.fit(module, loader(batch_size))
    return module, trainer


def main() -> int:
    strategy_name = sys.argv[1] if len(sys.argv) > 1 else None
    options = {"strategy": strategy_name} if strategy_name else {}
    module, trainer = fit(4, accelerator="flagos", devices=2, **options)
    rank = trainer.global_rank
    strategy = trainer.strategy
    expected = "FSDPStrategy" if strategy_name == "fsdp" else "DDPStrategy"
    assert type(strategy).__name__ == expected, type(strategy)
    assert strategy._get_process_group_backend() == "flagos", strategy._get_process_group_backend()
    if strategy_name != "ddp_spawn":  # else the steps ran in the spawned processes
        assert module.devices == {f"flagos:{rank}"}, module.devices
    # FSDP holds a shard of the flattened parameters on each rank: the whole
    # state dict is gathered (a collective: every rank calls it).
    state = (strategy.lightning_module_state_dict() if strategy_name == "fsdp"
             else module.state_dict())
    if rank == 0:
        reference = single_process_reference(world=2, batch_size=4)
        assert list(state) == list(reference.state_dict()), list(state)
        for (name, p), q in zip(state.items(), reference.state_dict().values()):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"lightning ddp {name}: {m}")
    print(f"rank {rank} lightning_ddp ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
