"""2. Synchronous round trip: `.item()` of a ready 0-dim flagos tensor.

µs per `.item()` against a raw Unix-socket ping-pong between two processes
(build/bin/flagos-bench-pingpong, bench/pingpong.cc: a socketpair, fork,
1-byte messages), measured in the same run. That is the floor under any
request/reply protocol on this machine. The ping-pong runs once per
repetition, between the `.item()` loops, so that both see the same load. An
extra line times `torch.flagos.synchronize()` with nothing queued (one bare
round trip to the daemon).
"""

from __future__ import annotations

import subprocess

import torch

from common import Context, Row, median, now, standalone, synchronize

import torch_fl  # noqa: F401,E402  registers "flagos"

SECTION = "2. sync round trip"
GOAL = 3.0  # .item() <= 3 x the raw ping-pong


def pingpong_us(ctx: Context, iterations: int, repeats: int) -> float:
    if not ctx.pingpong.is_file():
        raise RuntimeError(f"no {ctx.pingpong}: build it with scripts/build flagos-bench-pingpong")
    out = subprocess.run(
        [str(ctx.pingpong), f"--iterations={iterations}", f"--repeats={repeats}"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("median_us="):
            return float(line.split("=", 1)[1])
    raise RuntimeError(f"{ctx.pingpong} printed no median_us= line:\n{out}")


def run(ctx: Context) -> list[Row]:
    calls = ctx.scale(2000, 300)
    repeats = ctx.scale(7, 3)
    trips = ctx.scale(10000, 3000)
    x = torch.tensor(1.5, device="flagos")
    synchronize("flagos")
    for _ in range(200):
        x.item()
        synchronize("flagos")

    def per_call_us(fn) -> float:
        start = now()
        for _ in range(calls):
            fn()
        return (now() - start) / calls * 1e6

    item, sync, ping = [], [], []
    for _ in range(repeats):  # interleaved, so drifting load hits all three alike
        item.append(per_call_us(x.item))
        sync.append(per_call_us(lambda: synchronize("flagos")))
        ping.append(pingpong_us(ctx, iterations=trips, repeats=1))
    if x.item() != 1.5:
        raise RuntimeError(f".item() gave {x.item()}, expected 1.5")

    item_us, sync_us, ping_us = median(item), median(sync), median(ping)
    ctx.log(f".item() x {calls}, {repeats} repetitions: {item_us:.1f} µs; synchronize() with "
            f"nothing queued {sync_us:.1f} µs; raw Unix-socket ping-pong {ping_us:.1f} µs")
    return [
        Row(SECTION, ".item() of a ready 0-dim tensor", "µs", item_us, ping_us,
            "Unix-socket ping-pong (C)", lower_is_better=True, goal=GOAL),
        Row(SECTION, "torch.flagos.synchronize(), nothing queued", "µs", sync_us, ping_us,
            "Unix-socket ping-pong (C)", lower_is_better=True, extra=True),
    ]

if __name__ == "__main__":
    standalone(run, __doc__.splitlines()[0])
