"""7. TCP on loopback: `.item()` and bulk copies of a TCP session against raw TCP.

The run starts a second flagosd (CPU backend) on 127.0.0.1 with
--insecure-tcp, and a worker process whose FLAGOS_ENDPOINT is that daemon
(one process holds one session, and this one's is on the run's Unix
socket). The worker measures, one figure per request from the parent:
`.item()` of a ready 0-dim tensor (µs per call, over many calls),
`host.copy_(d)`-style copies of 64 and 256 MiB of uint8 host→device
(`d.copy_(host)` + synchronize) and device→host into a preallocated,
touched host tensor (`host.copy_(d)`), and `.cpu()` into fresh memory (an
extra line). Baselines, measured between the worker's figures so that both
see the same load: build/bin/flagos-bench-pingpong --tcp (1-byte round trips
on a 127.0.0.1 connection with TCP_NODELAY) and --tcp --stream-bytes=N (N
bytes one way, then a 1-byte answer). Each figure is the median of the
repetitions; ratio = flagos / raw TCP.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (DAEMON_READY_TIMEOUT_S, FLAGOSD, Context, PrivateDaemon, Row, median,
                    standalone)

SECTION = "7. TCP on loopback"
ITEM_GOAL = 2.0  # .item() <= 2 x a raw TCP ping-pong
BULK_GOAL = 0.5  # copies >= 0.5 x raw TCP throughput
SIZES_MIB = (64, 256)
ANSWER_TIMEOUT_S = 120.0


# ----------------------------------------------------------------- worker


def worker() -> int:
    """Answers one line per request ("item N", "h2d BYTES", "d2h BYTES", "cpu BYTES")."""
    import torch
    import torch_fl  # noqa: F401

    x = torch.tensor(1.5, device="flagos")
    tensors: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def pair(nbytes: int):
        if nbytes not in tensors:
            host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8,
                                 generator=torch.Generator().manual_seed(nbytes))
            dev = host.to("flagos")
            back = torch.empty_like(host)
            back.copy_(dev)
            if not torch.equal(back, host):
                raise RuntimeError(f"a {nbytes}-byte round trip over TCP changed the bytes")
            tensors[nbytes] = (host, dev, back)
        return tensors[nbytes]

    print("ready", flush=True)
    for line in sys.stdin:
        kind, _, arg = line.strip().partition(" ")
        n = int(arg or 0)
        if kind == "item":
            for _ in range(100):
                x.item()
            start = time.perf_counter()
            for _ in range(n):
                x.item()
            value = (time.perf_counter() - start) / n * 1e6
        elif kind in ("h2d", "d2h", "cpu"):
            host, dev, back = pair(n)
            torch.flagos.synchronize()
            start = time.perf_counter()
            if kind == "h2d":
                dev.copy_(host)
                torch.flagos.synchronize()
            elif kind == "d2h":
                back.copy_(dev)
            else:
                fresh = dev.cpu()
            seconds = time.perf_counter() - start
            if kind == "cpu" and not torch.equal(fresh, host):
                raise RuntimeError(".cpu() over TCP changed the bytes")
            value = n / seconds / 1e9
        else:
            break
        print(json.dumps(value), flush=True)
    if tensors:
        host, _, back = next(iter(tensors.values()))
        if not torch.equal(back, host):
            raise RuntimeError("device→host over TCP changed the bytes")
    return 0


# ----------------------------------------------------------------- parent


def _pingpong(ctx: Context, *args: str, key: str) -> float:
    out = subprocess.run([str(ctx.pingpong), "--tcp", "--repeats=1", *args],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    for line in out.splitlines():
        if line.startswith(f"{key}="):
            return float(line.split("=", 1)[1])
    raise RuntimeError(f"{ctx.pingpong} printed no {key}= line:\n{out}")


class _Worker:
    def __init__(self, endpoint: str) -> None:
        env = dict(os.environ, FLAGOS_ENDPOINT=endpoint)
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("ready", DAEMON_READY_TIMEOUT_S)

    def _line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            raise RuntimeError(f"the TCP worker did not answer within {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the TCP worker exited with {self.proc.wait()}")
        return line.strip()

    def _expect(self, word: str, timeout: float) -> None:
        if (line := self._line(timeout)) != word:
            raise RuntimeError(f"the TCP worker said {line!r}, expected {word!r}")

    def ask(self, request: str) -> float:
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return float(json.loads(self._line(ANSWER_TIMEOUT_S)))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                code = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise RuntimeError("the TCP worker did not exit")
            if code != 0:
                raise RuntimeError(f"the TCP worker exited with {code}")


def run(ctx: Context) -> list[Row]:
    if not FLAGOSD.is_file() or not ctx.pingpong.is_file():
        raise RuntimeError(f"no {FLAGOSD} or {ctx.pingpong}: build them with scripts/build")
    repeats = ctx.scale(5, 2)
    calls = ctx.scale(2000, 300)
    trips = ctx.scale(10000, 2000)
    sizes = SIZES_MIB if not ctx.quick else SIZES_MIB[:1]
    item, ping = [], []
    flagos: dict[tuple[str, int], list[float]] = {}
    raw: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="flagos-bench-tcp.") as workdir:
        # On 127.0.0.1, an ephemeral port.
        daemon = PrivateDaemon("127.0.0.1:0", Path(workdir) / "flagosd-tcp.log", "--insecure-tcp",
                               "--cpu-devices=1", "--device-memory=2GiB")
        try:
            w = _Worker(daemon.endpoint)
            try:
                for mib in sizes:  # the first copy of each size allocates: not timed
                    w.ask(f"h2d {mib << 20}")
                for _ in range(repeats):  # interleaved, so drifting load hits both alike
                    item.append(w.ask(f"item {calls}"))
                    ping.append(_pingpong(ctx, f"--iterations={trips}", key="median_us"))
                    for mib in sizes:
                        n = mib << 20
                        for kind in ("h2d", "d2h", "cpu"):
                            flagos.setdefault((kind, mib), []).append(w.ask(f"{kind} {n}"))
                        raw.setdefault(mib, []).append(
                            _pingpong(ctx, f"--stream-bytes={n}", key="median_gbps"))
            finally:
                w.close()
        finally:
            daemon.stop()
    item_us, ping_us = median(item), median(ping)
    ctx.log(f".item() over TCP {item_us:.1f} µs; raw TCP ping-pong {ping_us:.1f} µs")
    rows = [Row(SECTION, ".item() of a ready 0-dim tensor, TCP session", "µs", item_us, ping_us,
                "TCP ping-pong (C)", lower_is_better=True, goal=ITEM_GOAL)]
    for mib in sizes:
        base = median(raw[mib])
        figures = {kind: median(flagos[(kind, mib)]) for kind in ("h2d", "d2h", "cpu")}
        ctx.log(f"{mib} MiB over TCP: H2D {figures['h2d']:.2f}, D2H {figures['d2h']:.2f}, "
                f".cpu() {figures['cpu']:.2f} GB/s; raw TCP {base:.2f} GB/s")
        rows += [
            Row(SECTION, f"host→device {mib} MiB, TCP session", "GB/s", figures["h2d"], base,
                "raw TCP stream (C)", lower_is_better=False, goal=BULK_GOAL),
            Row(SECTION, f"device→host {mib} MiB into a preallocated tensor, TCP session",
                "GB/s", figures["d2h"], base, "raw TCP stream (C)", lower_is_better=False, goal=BULK_GOAL),
            Row(SECTION, f"device→host {mib} MiB .cpu() (fresh memory), TCP session", "GB/s",
                figures["cpu"], base, "raw TCP stream (C)", lower_is_better=False, extra=True),
        ]
    return rows


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        sys.exit(worker())
    standalone(run, __doc__.splitlines()[0])
