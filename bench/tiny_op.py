"""1. Asynchronous enqueue cost of a tiny operator.

`a.add_(b)` on 16-element float32 tensors, N calls after a warm-up, then one
`torch.flagos.synchronize()`: µs per op including the final synchronize,
against the same loop on native CPU torch in this process. The client-side
enqueue-only cost (the loop before the synchronize) is an extra line.
"""

from __future__ import annotations

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

    flagos, cpu = median(totals["flagos"]), median(totals["cpu"])
    ctx.log(f"a.add_(b) x {n}, {repeats} repetitions: flagos {flagos:.2f} µs/op "
            f"(enqueue {median(enqueue):.2f}), cpu {cpu:.2f} µs/op")
    return [
        Row(SECTION, f"a.add_(b), 16 floats, {n} calls + synchronize", "µs/op", flagos, cpu,
            "native CPU", lower_is_better=True, goal=GOAL),
        Row(SECTION, "client enqueue only (before the synchronize)", "µs/op", median(enqueue),
            cpu, "native CPU", lower_is_better=True, extra=True),
    ]


if __name__ == "__main__":
    standalone(run, __doc__.splitlines()[0])
