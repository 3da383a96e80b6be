"""4. Training steps: a 4-layer MLP, a transformer encoder block, a small MLP with AdamW.

Each model is built once on the CPU (fixed seed) and deep-copied to flagos,
so both start from the same weights; both see the same batches (made on the
CPU, copied to the device before timing). A timed loop is K steps (zero_grad,
forward, loss, backward, optimizer step), then `loss.item()` once and a
synchronize; ms/step = loop time / K, median over repetitions, flagos and CPU
loops interleaved. Every step's loss is kept on its device and compared at
the end: the largest |loss_flagos - loss_cpu| over all steps is printed.

- MLP: Linear 1024→1024, ReLU, ×3, then Linear 1024→10; batch 128;
  cross-entropy; SGD lr 0.01, momentum 0.9.
- Transformer block: nn.TransformerEncoderLayer(d_model=256, nhead=4,
  dim_feedforward=1024, dropout=0, batch_first=True); batch 32 × seq 64;
  MSE against a random target; Adam lr 1e-3. (Dropout 0, so that both
  devices compute the same function.)
- Small MLP as people train it: Linear 64→64, ReLU, ×3, then Linear 64→4;
  batch 8; cross-entropy; AdamW lr 1e-3 (not capturable: its bias
  corrections are new host floats each step) under a LambdaLR schedule
  stepped each step. Bound by per-op costs, not by kernels; no goal (the
  graphs of section 9 are what such a model should use). torch_fl's shape
  inference once ran meta kernels for the optimizer's calls each step, as
  their float scalars changed (plugin/csrc/op_schema.h,
  float_values_keep_metadata).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from common import Context, Row, median, now, standalone, synchronize

import torch_fl  # noqa: F401,E402  registers "flagos"

SECTION = "4. training step"
# Float32 results may differ in the last bits (different kernel blocking in
# the daemon); beyond this relative difference the devices disagree.
LOSS_RTOL = 1e-4
MLP_GOAL = 1.15  # ms/step <= 1.15 x native CPU
TRANSFORMER_GOAL = 1.5


def _mlp() -> tuple[nn.Module, Callable, Callable, list]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(128, 1024, generator=gen), torch.randint(0, 10, (128,), generator=gen))
               for _ in range(4)]
    return (model, nn.functional.cross_entropy,
            lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9), batches)


class _Scheduled:
    """An optimizer and a LambdaLR schedule stepped after it, as a training loop does."""

    def __init__(self, params) -> None:
        self.optimizer = torch.optim.AdamW(params, lr=1e-3)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                          lambda step: 1.0 / (1 + 0.01 * step))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.optimizer.step()
        self.schedule.step()


def _small_mlp() -> tuple[nn.Module, Callable, Callable, list]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 64, generator=gen), torch.randint(0, 4, (8,), generator=gen))
               for _ in range(4)]
    return model, nn.functional.cross_entropy, _Scheduled, batches


def _transformer() -> tuple[nn.Module, Callable, Callable, list]:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.0,
                                       batch_first=True)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, 256, generator=gen), torch.randn(32, 64, 256, generator=gen))
               for _ in range(2)]
    return model, nn.functional.mse_loss, lambda params: torch.optim.Adam(params, lr=1e-3), batches


class _Trainer:
    def __init__(self, model, loss_fn, make_optimizer, batches, device: str) -> None:
        self.device = device
        self.model = model.to(device)
        self.loss_fn = loss_fn
        self.optimizer = make_optimizer(self.model.parameters())
        self.batches = [(x.to(device), y.to(device)) for x, y in batches]
        self.losses: list[torch.Tensor] = []
        synchronize(device)

    def steps(self, count: int) -> float:
        """Runs `count` steps; returns the wall time including the final item() and sync."""
        start = now()
        for _ in range(count):
            x, y = self.batches[len(self.losses) % len(self.batches)]
            self.optimizer.zero_grad()
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.losses.append(loss.detach())
        loss.item()
        synchronize(self.device)
        return now() - start

    def loss_values(self) -> torch.Tensor:
        return torch.stack(self.losses).cpu()


def _bench(ctx: Context, label: str, build, goal: float | None, steps: int,
           repeats: int) -> list[Row]:
    model, loss_fn, make_optimizer, batches = build()
    cpu = _Trainer(copy.deepcopy(model), loss_fn, make_optimizer, batches, "cpu")
    fl = _Trainer(copy.deepcopy(model), loss_fn, make_optimizer, batches, "flagos")
    for trainer in (fl, cpu):
        trainer.steps(2)  # warm-up: registration, allocator, optimizer state
    times = {"flagos": [], "cpu": []}
    for _ in range(repeats):
        times["flagos"].append(fl.steps(steps) / steps * 1e3)
        times["cpu"].append(cpu.steps(steps) / steps * 1e3)

    lf, lc = fl.loss_values(), cpu.loss_values()
    diff = float((lf - lc).abs().max())
    limit = LOSS_RTOL * max(1.0, float(lc.abs().max()))
    ms_fl, ms_cpu = median(times["flagos"]), median(times["cpu"])
    ctx.log(f"{label}: {steps} steps x {repeats} repetitions: flagos {ms_fl:.1f} ms/step, "
            f"cpu {ms_cpu:.1f} ms/step; {len(lc)} losses, first {float(lc[0]):.6f}, "
            f"last {float(lc[-1]):.6f}, max |flagos - cpu| = {diff:.2e}")
    if not diff <= limit:
        raise RuntimeError(f"{label}: flagos and CPU losses differ by {diff:.3e} (limit {limit:.1e}):"
                           f"\nflagos {lf.tolist()}\ncpu    {lc.tolist()}")
    return [Row(SECTION, label, "ms/step", ms_fl, ms_cpu, "native CPU", lower_is_better=True,
                goal=goal, note=f"max loss diff {diff:.1e} over {len(lc)} steps")]


def run(ctx: Context) -> list[Row]:
    return (
        _bench(ctx, "MLP 4×1024, batch 128, SGD", _mlp, MLP_GOAL,
               steps=ctx.scale(10, 3), repeats=ctx.scale(5, 2))
        + _bench(ctx, "TransformerEncoderLayer 256/4/1024, 32×64, Adam", _transformer,
                 TRANSFORMER_GOAL, steps=ctx.scale(3, 1), repeats=ctx.scale(5, 2))
        + _bench(ctx, "MLP 4×64, batch 8, AdamW + LambdaLR (eager, as people write it)",
                 _small_mlp, None, steps=ctx.scale(300, 30), repeats=ctx.scale(5, 2))
    )


if __name__ == "__main__":
    standalone(run, __doc__.splitlines()[0])
