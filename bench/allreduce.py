"""6. allreduce between 2 ranks on one daemon (and on two), against memcpy and gloo.

Two rank processes form a `cpu:gloo,flagos:flagos` process group on the
run's daemon (one flagos device each, both served by the same flagosd, the
cpu backend). For each size from 1 KiB to 256 MiB of float32, each rank runs
`dist.all_reduce(x)` a fixed number of times on a flagos tensor, then
`torch.flagos.synchronize()`; the time per allreduce is that over the count
(median of the repetitions, both ranks starting together after a gloo
barrier). The same ranks time a gloo allreduce of a CPU tensor of the same
size (a plain gloo group beside the flagos one). Bus bandwidth is NCCL's:
2(n-1)/n x bytes / time, for n = 2 ranks bytes / time, in 10^9 bytes/s. The
memcpy baseline is `ctypes.memmove` of the same size between two touched
buffers in the parent (one thread). Goals: at least 0.5x memcpy bus
bandwidth at 64 MiB; at 1 KiB, an allreduce at most 3x a gloo one.

Then the same between two daemons: rank 1 uses a second flagosd the run
starts (a private daemon per rank, as on two nodes), so each rank's daemon
joins the group through gloo and the allreduces run between the daemons
over loopback TCP (docs/distributed.md, "Several nodes"); no goal, the
figures against the same processes' gloo allreduce of CPU tensors.

Worker mode (two are started by the parent, rank 0 prints the figures):
    python3 bench/allreduce.py --worker --sizes=1024,... --repeats=5
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Context, PrivateDaemon, Row, median, now, standalone

SECTION = "6. allreduce, 2 ranks on one daemon"
SECTION_BETWEEN = "6. allreduce, 2 ranks on two daemons"
BETWEEN_SIZES = [1 << 10, 1 << 20, 64 << 20]
RANKS = 2
SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [1 << 10, 1 << 20, 64 << 20]
GOAL_BANDWIDTH = 0.5  # bus bandwidth at GOAL_BANDWIDTH_BYTES >= 0.5 x memcpy
GOAL_BANDWIDTH_BYTES = 64 << 20
GOAL_LATENCY = 3.0  # at 1 KiB, <= 3 x a gloo allreduce of CPU tensors
TIMEOUT_S = 300.0


def _count(nbytes: int) -> int:
    """Allreduces per timed repetition: about the same time per size."""
    return max(2, min(200, (32 << 20) // nbytes))


def _size_name(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _bus_gbps(nbytes: int, seconds: float) -> float:
    return 2 * (RANKS - 1) / RANKS * nbytes / seconds / 1e9


# ----------------------------------------------------------------- worker


def worker(sizes: list[int], repeats: int) -> int:
    import datetime

    # FLAGOS_BENCH_ENDPOINTS ("a,b"): rank r's daemon (before torch_fl reads
    # FLAGOS_ENDPOINT).
    if os.environ.get("FLAGOS_BENCH_ENDPOINTS"):
        os.environ["FLAGOS_ENDPOINT"] = os.environ["FLAGOS_BENCH_ENDPOINTS"].split(",")[
            int(os.environ["RANK"])]

    import torch
    import torch.distributed as dist

    import torch_fl  # noqa: F401  (the flagos device and c10d backend)

    rank = int(os.environ["RANK"])
    dist.init_process_group("cpu:gloo,flagos:flagos", timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    torch.flagos.set_device(rank % torch.flagos.device_count())
    dev = torch.device("flagos", torch.flagos.current_device())

    def timed(x: torch.Tensor, group, count: int) -> float:
        dist.barrier(group=gloo)
        start = now()
        for _ in range(count):
            dist.all_reduce(x, group=group)
        if x.device.type == "flagos":
            torch.flagos.synchronize()
        return (now() - start) / count

    figures = {}
    for nbytes in sizes:
        n = nbytes // 4
        # Checked once: each rank gives rank + 1.
        for device, group in ((dev, None), ("cpu", gloo)):
            x = torch.full((n,), float(rank + 1), device=device)
            dist.all_reduce(x, group=group)
            if x[-1].item() != RANKS * (RANKS + 1) / 2:
                print(f"error allreduce of {nbytes} bytes on {device} gave {x[-1].item()}",
                      flush=True)
                return 1
        # Zeros from here on: a sum that stays finite however often it runs.
        count = _count(nbytes)
        result = {}
        for kind, x, group in (("flagos", torch.zeros(n, device=dev), None),
                               ("gloo", torch.zeros(n), gloo)):
            timed(x, group, min(count, 5))  # warm-up
            result[kind] = median([timed(x, group, count) for _ in range(repeats)])
        figures[nbytes] = result
    if rank == 0:
        print("result " + json.dumps(figures), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 0


# ----------------------------------------------------------------- parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memcpy_s(nbytes: int, repeats: int) -> float:
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    samples = []
    for _ in range(repeats + 1):
        start = now()
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
        samples.append(now() - start)
    return median(samples[1:])


def _figures(sizes: list[int], repeats: int, endpoints: str = "") -> dict[int, dict]:
    """{bytes: {"flagos": s, "gloo": s}} from the two ranks (on the run's
    daemon, or rank r on the r-th of `endpoints`)."""
    port = str(_free_port())
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
           f"--sizes={','.join(map(str, sizes))}", f"--repeats={repeats}"]
    env = {**os.environ, "WORLD_SIZE": str(RANKS), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": port, "OMP_NUM_THREADS": "1", "FLAGOS_BENCH_ENDPOINTS": endpoints}
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, text=True) for r in range(RANKS)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"allreduce ranks exited with {bad}: {outputs[0][-2000:]}")
    line = next(l for l in outputs[0].splitlines() if l.startswith("result "))
    return {int(k): v for k, v in json.loads(line[len("result "):]).items()}


def run(ctx: Context) -> list[Row]:
    if os.environ.get("FLAGOS_ENDPOINT"):
        return _run(ctx)
    # Run alone: both ranks need one daemon, which the run starts.
    with tempfile.TemporaryDirectory(prefix="flagos-bench-allreduce.") as workdir:
        daemon = PrivateDaemon(f"unix:{workdir}/flagosd.sock", Path(workdir) / "flagosd.log")
        os.environ["FLAGOS_ENDPOINT"] = daemon.endpoint
        try:
            return _run(ctx)
        finally:
            del os.environ["FLAGOS_ENDPOINT"]
            daemon.stop()


def _run(ctx: Context) -> list[Row]:
    sizes = QUICK_SIZES if ctx.quick else SIZES
    repeats = ctx.scale(5, 2)
    figures = _figures(sizes, repeats)
    rows = []
    for nbytes in sizes:
        flagos_s, gloo_s = figures[nbytes]["flagos"], figures[nbytes]["gloo"]
        memcpy_s = _memcpy_s(nbytes, ctx.scale(9, 3))
        ctx.log(f"{_size_name(nbytes)}: flagos {flagos_s * 1e6:.1f} us "
                f"({_bus_gbps(nbytes, flagos_s):.2f} GB/s), gloo {gloo_s * 1e6:.1f} us, "
                f"memcpy {memcpy_s * 1e6:.1f} us")
        rows.append(Row(SECTION, f"bus bandwidth, {_size_name(nbytes)}", "GB/s",
                        _bus_gbps(nbytes, flagos_s), nbytes / memcpy_s / 1e9, "memcpy",
                        lower_is_better=False,
                        goal=GOAL_BANDWIDTH if nbytes == GOAL_BANDWIDTH_BYTES else None))
        rows.append(Row(SECTION, f"bus bandwidth, {_size_name(nbytes)}, against gloo", "GB/s",
                        _bus_gbps(nbytes, flagos_s), _bus_gbps(nbytes, gloo_s),
                        "gloo, CPU tensors", lower_is_better=False, extra=True))
        if nbytes == sizes[0]:
            rows.append(Row(SECTION, f"latency, {_size_name(nbytes)}", "µs", flagos_s * 1e6,
                            gloo_s * 1e6, "gloo, CPU tensors", lower_is_better=True,
                            goal=GOAL_LATENCY))

    between_sizes = BETWEEN_SIZES[:1] + BETWEEN_SIZES[-1:] if ctx.quick else BETWEEN_SIZES
    with tempfile.TemporaryDirectory(prefix="flagos-bench-allreduce.") as workdir:
        second = PrivateDaemon(f"unix:{workdir}/flagosd.sock", Path(workdir) / "flagosd.log")
        try:
            figures = _figures(between_sizes, repeats,
                               f"{os.environ['FLAGOS_ENDPOINT']},{second.endpoint}")
        finally:
            second.stop()
    for nbytes in between_sizes:
        flagos_s, gloo_s = figures[nbytes]["flagos"], figures[nbytes]["gloo"]
        ctx.log(f"{_size_name(nbytes)} between daemons: flagos {flagos_s * 1e6:.1f} us "
                f"({_bus_gbps(nbytes, flagos_s):.2f} GB/s), gloo {gloo_s * 1e6:.1f} us")
        if nbytes == between_sizes[0]:
            rows.append(Row(SECTION_BETWEEN, f"latency, {_size_name(nbytes)}", "µs",
                            flagos_s * 1e6, gloo_s * 1e6, "gloo, CPU tensors",
                            lower_is_better=True))
        else:
            rows.append(Row(SECTION_BETWEEN, f"bus bandwidth, {_size_name(nbytes)}", "GB/s",
                            _bus_gbps(nbytes, flagos_s), _bus_gbps(nbytes, gloo_s),
                            "gloo, CPU tensors", lower_is_better=False))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeats", type=int, default=5)
    known, rest = parser.parse_known_args()
    if known.worker:
        sys.exit(worker([int(s) for s in known.sizes.split(",")], known.repeats))
    sys.argv = [sys.argv[0], *rest]
    standalone(run, __doc__.splitlines()[0])
