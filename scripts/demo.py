"""Train a small model on a flagos device, next to the same model on the CPU.

The program needs a running flagosd: `scripts/demo` starts one and sets
FLAGOS_ENDPOINT. By hand:

    build/bin/flagosd --listen=unix:///tmp/flagosd.sock --backend=cpu &
    FLAGOS_ENDPOINT=unix:///tmp/flagosd.sock PYTHONPATH=plugin python3 scripts/demo.py

Apart from `import torch_fl` and the device name, this is ordinary PyTorch:
the model, the loss, autograd and the optimizer do not know that every
operator runs in another process.

It prints, per training step, the loss on flagos and on the CPU (both models
start from the same weights and see the same data, so the losses should agree
to float rounding), then what one training step and one tiny operator cost on
flagos compared with the CPU. Exits 1 if the two runs disagree.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from torch import nn

import torch_fl  # registers the "flagos" device

FLAGOS = torch.device("flagos", 0)
CPU = torch.device("cpu")
# Float32 rounding may differ in the last bits between runs of a kernel with
# different blocking; anything beyond this is a real disagreement.
TOLERANCE = 1e-5


def make_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic regression task: y = a fixed random nonlinear teacher of x, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    teacher = torch.randn(features, 1, generator=gen) / features**0.5
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(samples, 1, generator=gen)
    return x, y


def make_model(features: int, hidden: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 1),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "flagos":
        torch.flagos.synchronize(device)


def train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float
) -> tuple[list[float], list[float]]:
    """Trains in place; returns the loss and the wall time (s) of each step."""
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    losses, times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        value = loss.item()  # waits for the device
        synchronize(device)  # and for the optimizer's update
        times.append(time.perf_counter() - start)
        losses.append(value)
    return losses, times


def small_op_cost_us(device: torch.device, iterations: int) -> float:
    """Mean cost of `a.add_(b)` on 16 floats, in microseconds."""
    a = torch.zeros(16, device=device)
    b = torch.ones(16, device=device)
    for _ in range(100):  # warm up (on flagos: the op's registration)
        a.add_(b)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        a.add_(b)
    synchronize(device)
    elapsed = time.perf_counter() - start
    expected = float(100 + iterations)
    if a.cpu().ne(expected).any():
        raise SystemExit(f"add_ on {device} gave {a.cpu()[:4].tolist()}..., expected {expected}")
    return elapsed / iterations * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--op-iterations", type=int, default=2000)
    args = parser.parse_args()

    stats = torch_fl.daemon_stats()
    print(f"flagosd at {torch_fl.endpoint()}: backend {stats['backend']}, "
          f"{torch.flagos.device_count()} devices")
    for dev in stats["devices"]:
        print(f"  flagos:{dev['index']}  {dev['name']}  {dev['total_memory'] / 2**30:.2f} GiB")

    x, y = make_data(args.samples, args.features, seed=0)
    model_cpu = make_model(args.features, args.hidden, seed=1)
    model_fl = copy.deepcopy(model_cpu).to(FLAGOS)  # identical initial weights

    print(f"\ntraining a {args.features}-{args.hidden}-{args.hidden}-1 MLP, "
          f"{args.samples} samples, SGD lr={args.lr} momentum=0.9, {args.steps} steps\n")
    losses_fl, times_fl = train(model_fl, x, y, args.steps, args.lr)
    losses_cpu, times_cpu = train(model_cpu, x, y, args.steps, args.lr)

    print(f"{'step':>4}  {'loss flagos':>12}  {'loss cpu':>12}  {'abs diff':>9}")
    for step, (lf, lc) in enumerate(zip(losses_fl, losses_cpu), start=1):
        print(f"{step:>4}  {lf:>12.7f}  {lc:>12.7f}  {abs(lf - lc):>9.2e}")

    loss_diff = max(abs(lf - lc) for lf, lc in zip(losses_fl, losses_cpu))
    weight_diff = max(
        (pf.detach().cpu() - pc.detach()).abs().max().item()
        for pf, pc in zip(model_fl.parameters(), model_cpu.parameters())
    )
    print(f"\nlargest loss difference {loss_diff:.2e}, "
          f"largest final weight difference {weight_diff:.2e}")

    # The first step registers every operator with the daemon: leave it out.
    step_fl = statistics.mean(times_fl[1:]) * 1e3
    step_cpu = statistics.mean(times_cpu[1:]) * 1e3
    op_fl = small_op_cost_us(FLAGOS, args.op_iterations)
    op_cpu = small_op_cost_us(CPU, args.op_iterations)
    print(f"\n{'':<28}{'flagos':>10}{'cpu':>10}{'ratio':>8}")
    print(f"{'training step (ms)':<28}{step_fl:>10.3f}{step_cpu:>10.3f}{step_fl / step_cpu:>8.1f}")
    print(f"{'a.add_(b), 16 floats (us)':<28}{op_fl:>10.2f}{op_cpu:>10.2f}{op_fl / op_cpu:>8.1f}")
    print(f"(mean over steps 2..{args.steps}, and over {args.op_iterations} add_ calls "
          f"with one synchronize at the end)")

    if loss_diff > TOLERANCE or weight_diff > TOLERANCE:
        print(f"\nFAIL: flagos and CPU disagree by more than {TOLERANCE}", file=sys.stderr)
        return 1
    print("\nOK: flagos and CPU agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
