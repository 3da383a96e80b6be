"""9. A training step captured once and replayed (torch.flagos.graph) against native CPU eager.

A model bound by tiny ops: an MLP of four Linear layers 64→64→64→64→4 with
ReLU, batch 8, cross-entropy, built once on the CPU (fixed seed) and
deep-copied to flagos. The flagos step (zero_grad, forward, loss, backward,
optimizer step) is captured once into a graph after three eager warm-up
steps, as CUDA graph users do; each timed step copies the next batch into
the graph's static input and target (device to device) and replays. The
baseline is the same step run eagerly by native torch on the CPU (no graph:
what the model costs there). A timed loop is K steps, then `loss.item()`
once and a synchronize; µs/step = loop time / K, median over repetitions,
the loops interleaved. Every step's loss is kept and compared with the
CPU's at the end (the graph must compute what eager computes; see Adam
below). An extra
line per optimizer gives the same step run eagerly on flagos (the per-op
cost a graph removes).

- SGD: lr 0.05, momentum 0.9.
- Adam: lr 1e-3; flagos with capturable=True (its step count stays on the
  device, as CUDA graphs need), the CPU without (as people write it). The
  two forms round differently in the last bits, which thousands of steps
  amplify: the replayed Adam step's losses are compared with the same step
  run eagerly on flagos (equal), SGD's with that and with the CPU's.

A last line per optimizer (when scripts/bench says the daemon's pid in
FLAGOS_BENCH_DAEMON_PID): flagosd's CPU time (user + system, /proc) per
eager step on flagos, against the native step's time: what serving the
step costs the node's cores beside the client. Unlike the times, it hardly
moves with the machine's load; ATen's OpenMP threads spinning after each
parallel region showed here (daemon/openmp_wait_policy.h).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from common import (Context, Row, bench_daemon_pid, median, now, process_cpu_seconds, standalone,
                    synchronize)

import torch_fl  # noqa: F401,E402  registers "flagos"

SECTION = "9. captured training step (graphs)"
GOAL = 1.1  # replayed step <= 1.1 x the native CPU eager step
LOSS_RTOL = 1e-4
BATCH = 8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _optimizer(name: str, params, capturable: bool) -> torch.optim.Optimizer:
    if name == "SGD":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3, capturable=capturable)


class _Stepper:
    """Steps one model on one device, eagerly or by replaying a captured step."""

    def __init__(self, model: nn.Module, optimizer: str, device: str, batches, graphed: bool) -> None:
        self.device = device
        self.model = model.to(device)
        self.optimizer = _optimizer(optimizer, self.model.parameters(), device != "cpu")
        self.batches = [(x.to(device), y.to(device)) for x, y in batches]
        self.losses: list[torch.Tensor] = []
        self.graph = None
        self.static_x = torch.empty_like(self.batches[0][0])
        self.static_y = torch.empty_like(self.batches[0][1])
        for _ in range(3):  # warm-up: optimizer state, gradients, op registration
            self._eager(*self._next())
        if graphed:
            self.graph = torch.flagos.Graph()
            with torch.flagos.graph(self.graph):
                self.static_loss = self._step(self.static_x, self.static_y)
        synchronize(device)

    def _next(self):
        return self.batches[len(self.losses) % len(self.batches)]

    def _step(self, x, y) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss

    def _eager(self, x, y) -> None:
        self.losses.append(self._step(x, y).detach())

    def steps(self, count: int) -> float:
        start = now()
        for _ in range(count):
            x, y = self._next()
            if self.graph is None:
                self._eager(x, y)
            else:
                self.static_x.copy_(x)
                self.static_y.copy_(y)
                self.graph.replay()
                self.losses.append(self.static_loss.detach().clone())
        self.losses[-1].item()
        synchronize(self.device)
        return now() - start


def _bench(ctx: Context, optimizer: str) -> list[Row]:
    model = _model()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(BATCH, 64, generator=gen), torch.randint(0, 4, (BATCH,), generator=gen))
               for _ in range(8)]
    cpu = _Stepper(copy.deepcopy(model), optimizer, "cpu", batches, graphed=False)
    replayed = _Stepper(copy.deepcopy(model), optimizer, "flagos", batches, graphed=True)
    eager = _Stepper(copy.deepcopy(model), optimizer, "flagos", batches, graphed=False)
    steps, repeats = ctx.scale(300, 30), ctx.scale(7, 2)
    times: dict[str, list[float]] = {"replayed": [], "cpu": [], "eager": [], "daemon_cpu": []}
    daemon = bench_daemon_pid()
    for _ in range(repeats):
        times["replayed"].append(replayed.steps(steps) / steps * 1e6)
        times["cpu"].append(cpu.steps(steps) / steps * 1e6)
        before = process_cpu_seconds(daemon) if daemon else 0.0
        times["eager"].append(eager.steps(steps) / steps * 1e6)
        if daemon:
            times["daemon_cpu"].append((process_cpu_seconds(daemon) - before) / steps * 1e6)
    lc = torch.stack(cpu.losses).cpu()
    le = torch.stack(eager.losses).cpu()
    # The replayed step against the same step run eagerly on flagos (the
    # same kernels: equal), and, for SGD, against the CPU (Adam's capturable
    # form rounds differently, and a few thousand steps amplify that).
    checks = [("flagos eager", le, 0.0)]
    if optimizer == "SGD":
        checks.append(("CPU eager", lc, LOSS_RTOL * max(1.0, float(lc.abs().max()))))
    lr = torch.stack(replayed.losses).cpu()
    diffs = []
    for name, reference, limit in checks:
        diff = float((lr - reference).abs().max())
        if not diff <= limit:
            bad = int((lr - reference).abs().argmax())
            raise RuntimeError(f"{optimizer}: the replayed step's losses and {name}'s differ by "
                               f"{diff:.3e} (limit {limit:.1e}), first at step {bad}: "
                               f"{float(lr[bad])} against {float(reference[bad])}")
        diffs.append(diff)
    us = {k: median(v) for k, v in times.items() if v}
    ctx.log(f"{optimizer}: {steps} steps x {repeats}: replayed {us['replayed']:.0f} µs/step, "
            f"flagos eager {us['eager']:.0f}, cpu eager {us['cpu']:.0f}; max loss diff "
            f"{max(diffs):.1e} over {len(lc)} steps")
    label = f"MLP 4×64, batch {BATCH}, {optimizer}" + (" (capturable)" if optimizer == "Adam" else "")
    return [
        Row(SECTION, f"{label}: step replayed from a graph", "µs/step", us["replayed"], us["cpu"],
            "native CPU eager", lower_is_better=True, goal=GOAL,
            note=f"max loss diff {max(diffs):.1e} over {len(lc)} steps against "
                 + (" and ".join(name for name, _, _ in checks))),
        Row(SECTION, "↳ the same step eagerly on flagos", "µs/step", us["eager"], us["cpu"],
            "native CPU eager", lower_is_better=True),
    ] + ([
        Row(SECTION, "↳ flagosd's CPU time per eager step", "µs/step", us["daemon_cpu"],
            us["cpu"], "native CPU eager", lower_is_better=True),
    ] if daemon else [])


def run(ctx: Context) -> list[Row]:
    return _bench(ctx, "SGD") + _bench(ctx, "Adam")


if __name__ == "__main__":
    standalone(run, __doc__.splitlines()[0])
