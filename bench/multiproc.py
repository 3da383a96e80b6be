"""5. Aggregate tiny-op throughput of 1, 2 and 4 client processes.

For each n, n flagos worker processes (one session each, all on the same
daemon) and n CPU worker processes (native torch; they never import
torch_fl) are started. A round tells all n workers of one kind "go" at the
same moment; each runs `a.add_(b)` on 16 floats for a fixed time (0.5 s),
then synchronizes, and reports (ops, seconds). The round's figure is the sum
over workers of ops / seconds. flagos and CPU rounds alternate; the first
round of each kind is a warm-up, the median of the other five is reported.
Scaling is the n-process figure over the 1-process one. A worker that does
not answer within a minute fails the benchmark (a hang, not a slow run).

CPU per op: each worker reports its process CPU time over the round
(time.process_time), and for flagos rounds the parent reads flagosd's CPU
time (/proc/<pid>/stat of FLAGOS_BENCH_DAEMON_PID, which scripts/bench sets) before and after; the
row is (the workers' CPU + flagosd's) / ops, against the native workers'
CPU / ops. On a machine with few cores it says why flagos cannot scale
there: one process with its share of the daemon already keeps that much
CPU busy per op.

Worker mode (started by the parent, speaks on stdin/stdout):
    python3 bench/multiproc.py --worker --device=flagos --seconds=0.5
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from common import Context, Row, bench_daemon_pid, median, process_cpu_seconds, standalone

SECTION = "5. tiny-op throughput, several processes"
PROCESSES = (1, 2, 4)
READY_TIMEOUT_S = 120.0  # importing torch in 8 processes at once on 2 cores
ROUND_TIMEOUT_S = 60.0  # beyond the round's own length: a worker that hangs


# ----------------------------------------------------------------- worker


def worker(device: str, seconds: float) -> int:
    """Imports torch, says "ready", then runs one timed round per "go" line.

    The device is first touched in the first round (which the parent
    discards as a warm-up), so a flagos session opens only when rounds begin.
    """
    import torch

    if device == "flagos":
        import torch_fl  # noqa: F401

    def sync() -> None:
        if device == "flagos":
            torch.flagos.synchronize()

    print("ready", flush=True)
    a = b = None
    done = 0
    chunk = 200
    for line in sys.stdin:
        if line.strip() != "go":
            break
        if a is None:
            a = torch.zeros(16, device=device)
            b = torch.ones(16, device=device)
        ops = 0
        cpu_start = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(chunk):
                a.add_(b)
            ops += chunk
            if time.perf_counter() >= deadline:
                break
        sync()
        elapsed = time.perf_counter() - start
        done += ops
        value = a[0].item()
        if value != float(done):
            print(f"error add_ gave {value}, expected {done}", flush=True)
            return 1
        cpu = time.process_time() - cpu_start
        print(f"result {ops} {elapsed:.9f} {cpu:.9f}", flush=True)
    return 0


# ----------------------------------------------------------------- parent


class _Workers:
    """n worker processes of one device kind, spoken to over their stdin/stdout."""

    def __init__(self, device: str, count: int, seconds: float) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", f"--device={device}",
               f"--seconds={seconds}"]
        self.device = device
        self.seconds = seconds
        self.procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=os.environ.copy())
                      for _ in range(count)]
        self.buffers = {proc.pid: b"" for proc in self.procs}
        try:
            for i, proc in enumerate(self.procs):
                self._expect(i, "ready", READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _readline(self, proc: subprocess.Popen, timeout: float) -> str:
        """The worker's next line, or "" if it ended or said nothing within timeout."""
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        while b"\n" not in self.buffers[proc.pid]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return ""
            data = os.read(fd, 4096)
            if not data:
                return ""
            self.buffers[proc.pid] += data
        line, _, rest = self.buffers[proc.pid].partition(b"\n")
        self.buffers[proc.pid] = rest
        return line.decode(errors="replace")

    def _expect(self, index: int, word: str, timeout: float) -> str:
        proc = self.procs[index]
        line = self._readline(proc, timeout)
        if not line.startswith(word):
            state = (f"exit code {proc.returncode}" if proc.poll() is not None
                     else f"still running, no answer within {timeout:.0f} s: it hangs")
            raise RuntimeError(f"{self.device} worker {index + 1} of {len(self.procs)} "
                               f"(pid {proc.pid}) said {line.strip()!r} instead of {word!r} "
                               f"({state})")
        return line

    def round(self) -> tuple[float, int, float]:
        """One timed round on all workers at once: summed ops per second, ops, and
        the workers' CPU seconds."""
        for proc in self.procs:
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        total = 0.0
        all_ops = 0
        cpu = 0.0
        for i in range(len(self.procs)):
            _, ops, elapsed, seconds = self._expect(
                i, "result", ROUND_TIMEOUT_S + self.seconds).split()
            total += int(ops) / float(elapsed)
            all_ops += int(ops)
            cpu += float(seconds)
        return total, all_ops, cpu

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(ctx: Context) -> list[Row]:
    seconds = 0.5 if not ctx.quick else 0.2
    rounds = ctx.scale(5, 2)
    start = time.perf_counter()
    rates: dict[str, dict[int, float]] = {"flagos": {}, "cpu": {}}
    daemon = bench_daemon_pid()
    # CPU µs per op: the workers' (and, for flagos, the daemon's) over all
    # measured rounds.
    cpu_per_op: dict[str, dict[int, float]] = {"flagos": {}, "cpu": {}}
    daemon_per_op: dict[int, float] = {}
    for n in PROCESSES:
        # Exactly n processes of each kind exist while n is measured; flagos
        # and CPU rounds alternate, so load that drifts hits both alike.
        pools: dict[str, _Workers] = {}
        try:
            for device in rates:
                pools[device] = _Workers(device, n, seconds)
            samples: dict[str, list[float]] = {device: [] for device in rates}
            ops = {device: 0 for device in rates}
            cpu = {device: 0.0 for device in rates}
            daemon_cpu = 0.0
            for r in range(rounds + 1):
                for device, pool in pools.items():
                    measured = device == "flagos" and daemon > 0
                    before = process_cpu_seconds(daemon) if measured else 0.0
                    rate, done, used = pool.round()
                    if r > 0:  # round 0: warm-up (session, registration)
                        samples[device].append(rate)
                        ops[device] += done
                        cpu[device] += used
                        if measured:
                            daemon_cpu += process_cpu_seconds(daemon) - before
        finally:
            for pool in pools.values():
                pool.close()
        for device in rates:
            rates[device][n] = median(samples[device])
            cpu_per_op[device][n] = cpu[device] / max(ops[device], 1) * 1e6
        daemon_per_op[n] = daemon_cpu / max(ops["flagos"], 1) * 1e6
        ctx.log(f"{n} process(es): flagos {rates['flagos'][n] / 1e3:.1f} kops/s, "
                f"cpu {rates['cpu'][n] / 1e3:.1f} kops/s; CPU per op: flagos client "
                f"{cpu_per_op['flagos'][n]:.2f} µs + flagosd {daemon_per_op[n]:.2f} µs, "
                f"native {cpu_per_op['cpu'][n]:.2f} µs")
    ctx.log(f"({rounds} rounds of {seconds} s per count, {time.perf_counter() - start:.0f} s "
            f"with process start-up)")

    rows = []
    for n in PROCESSES:
        rows.append(Row(SECTION, f"a.add_(b), {n} process{'es' if n > 1 else ''}, summed",
                        "kops/s", rates["flagos"][n] / 1e3, rates["cpu"][n] / 1e3,
                        "native CPU processes", lower_is_better=False))
    for n in PROCESSES[1:]:
        rows.append(Row(SECTION, f"scaling: {n} processes ÷ 1", "×",
                        rates["flagos"][n] / rates["flagos"][1], rates["cpu"][n] / rates["cpu"][1],
                        "native CPU scaling", lower_is_better=False, extra=True))
    if daemon > 0:
        for n in PROCESSES:
            rows.append(Row(SECTION, f"CPU per op, {n} process{'es' if n > 1 else ''}: "
                            "clients + flagosd", "µs", cpu_per_op["flagos"][n] + daemon_per_op[n],
                            cpu_per_op["cpu"][n], "native CPU per op", lower_is_better=True,
                            extra=True))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--device", default="flagos")
    parser.add_argument("--seconds", type=float, default=0.5)
    known, rest = parser.parse_known_args()
    if known.worker:
        sys.exit(worker(known.device, known.seconds))
    sys.argv = [sys.argv[0], *rest]
    standalone(run, __doc__.splitlines()[0])
