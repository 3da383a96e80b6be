"""1. Asynchronous enqueue cost of a tiny operator.

`a.add_(b)` on 16-element float32 tensors, N calls after a warm-up, then one
`torch.flagos.synchronize()`: µs per op including the final synchronize,
against the same loop on native CPU torch in this process. The client-side
enqueue-only cost (the loop before the synchronize) is an extra line.

Metrics on and off: when scripts/bench also started a daemon with
`--metrics-listen=` (FLAGOS_BENCH_METRICS_OFF_ENDPOINT), the same loop runs
in fresh processes against each daemon in turn, and the metrics-on figure is
reported against the metrics-off one (the cost of counting per command).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from common import Context, Row, median, now, standalone, synchronize

import torch_fl  # noqa: F401,E402  registers "flagos"

SECTION = "1. async tiny op"
GOAL = 2.0  # flagos µs/op <= 2.0 x native CPU


def run(ctx: Context) -> list[Row]:
    n = ctx.scale(20000, 5000)
    repeats = ctx.scale(7, 3)
    warmup = 1000
    state = {}
    for device in ("flagos", "cpu"):
        a = torch.zeros(16, device=device)
        b = torch.ones(16, device=device)
        for _ in range(warmup):
            a.add_(b)
        synchronize(device)
        state[device] = (a, b)

    totals = {"flagos": [], "cpu": []}
    enqueue = []
    for _ in range(repeats):  # interleaved, so drifting load hits both alike
        for device in ("flagos", "cpu"):
            a, b = state[device]
            start = now()
            for _ in range(n):
                a.add_(b)
            queued = now()
            synchronize(device)
            end = now()
            totals[device].append((end - start) / n * 1e6)
            if device == "flagos":
                enqueue.append((queued - start) / n * 1e6)

    expected = float(warmup + repeats * n)
    for device, (a, _) in state.items():
        got = a.cpu()
        if not bool(got.eq(expected).all()):
            raise RuntimeError(f"add_ on {device} gave {got[:4].tolist()}, expected {expected}")

    metrics_rows = metrics_on_off(ctx, n)
    flagos, cpu = median(totals["flagos"]), median(totals["cpu"])
    ctx.log(f"a.add_(b) x {n}, {repeats} repetitions: flagos {flagos:.2f} µs/op "
            f"(enqueue {median(enqueue):.2f}), cpu {cpu:.2f} µs/op")
    return [
        Row(SECTION, f"a.add_(b), 16 floats, {n} calls + synchronize", "µs/op", flagos, cpu,
            "native CPU", lower_is_better=True, goal=GOAL),
        Row(SECTION, "client enqueue only (before the synchronize)", "µs/op", median(enqueue),
            cpu, "native CPU", lower_is_better=True, extra=True),
    ] + metrics_rows


def flagos_loop(n: int, repeats: int) -> float:
    """Median µs per a.add_(b) on flagos, including the final synchronize."""
    a = torch.zeros(16, device="flagos")
    b = torch.ones(16, device="flagos")
    for _ in range(1000):
        a.add_(b)
    synchronize("flagos")
    times = []
    for _ in range(repeats):
        start = now()
        for _ in range(n):
            a.add_(b)
        synchronize("flagos")
        times.append((now() - start) / n * 1e6)
    return median(times)


def metrics_on_off(ctx: Context, n: int) -> list[Row]:
    off = os.environ.get("FLAGOS_BENCH_METRICS_OFF_ENDPOINT")
    on = os.environ.get("FLAGOS_ENDPOINT")
    if not off or not on:
        return []
    rounds = ctx.scale(5, 2)
    figures: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):  # alternating, so drifting load hits both alike
        for which, endpoint in (("on", on), ("off", off)):
            out = subprocess.run(
                [sys.executable, __file__, "--loop-only", str(n)],
                env=dict(os.environ, FLAGOS_ENDPOINT=endpoint),
                capture_output=True, text=True, timeout=300, check=True)
            figures[which].append(float(out.stdout.split()[-1]))
    with_metrics, without = median(figures["on"]), median(figures["off"])
    ctx.log(f"metrics on {with_metrics:.2f} µs/op, off {without:.2f} µs/op ({rounds} rounds)")
    return [Row(SECTION, "a.add_(b) with metrics on (vs the same daemon, metrics off)", "µs/op",
                with_metrics, without, "metrics off", lower_is_better=True, extra=True)]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--loop-only":
        print(f"{flagos_loop(int(sys.argv[2]), 3):.4f}")
    else:
        standalone(run, __doc__.splitlines()[0])
