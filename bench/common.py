"""Shared pieces of the benchmarks: timing, result rows, tables, the machine.

Every benchmark module (tiny_op, roundtrip, copies, training, multiproc, tcp,
allreduce)
exposes `run(ctx) -> list[Row]`; bench/run.py runs them all against one
flagosd and prints/writes the table. A module can also be run on its own
(`python3 bench/copies.py --quick`, with FLAGOS_ENDPOINT set) through
`standalone`.

Timing rules used throughout: time.perf_counter; every flagos measurement
ends with a synchronisation point inside the timed region (so asynchronous
work is paid for); each figure is the median over repetitions, after a
warm-up that is not timed (the first use of an operator registers it with
the daemon).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINGPONG = REPO / "build" / "bin" / "flagos-bench-pingpong"
# torch_fl from the source tree when nothing else provides it (scripts/bench
# sets PYTHONPATH=plugin; this makes `python3 bench/copies.py` work too).
if str(REPO / "plugin") not in sys.path:
    sys.path.append(str(REPO / "plugin"))

# ----------------------------------------------------------------- timing


def now() -> float:
    return time.perf_counter()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def repeat(measure: Callable[[], float], repeats: int, warmup: int = 1) -> list[float]:
    """Calls `measure` warmup times (discarded), then `repeats` times; its results."""
    for _ in range(warmup):
        measure()
    return [measure() for _ in range(repeats)]


def seconds(fn: Callable[[], object]) -> float:
    """Wall time of one call of fn."""
    start = now()
    fn()
    return now() - start


def stop_process(proc) -> None:
    """SIGTERM to a daemon the benchmark started, SIGKILL after 15 s."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


FLAGOSD = REPO / "build" / "bin" / "flagosd"
DAEMON_READY_TIMEOUT_S = 120.0


class PrivateDaemon:
    """A flagosd (cpu backend) of the benchmark's own on `listen`, logging to
    `log`; .endpoint once it listens; stop() ends it."""

    def __init__(self, listen: str, log: Path, *args: str) -> None:
        import re

        self.log = log
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(FLAGOSD), f"--listen={listen}", "--backend=cpu", "--metrics-listen=", *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while True:
            text = self.log.read_text(errors="replace")
            if match := re.search(r"listening on (\S+)", text):
                self.endpoint = match.group(1)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the benchmark's flagosd did not start:\n{text}")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.proc)


def synchronize(device) -> None:
    """Waits for all work queued on `device` (a no-op on the CPU)."""
    import torch

    if torch.device(device).type == "flagos":
        torch.flagos.synchronize()


# ----------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the table: a flagos figure beside its baseline.

    ratio = flagos / baseline. For a time (lower is better) a goal is met
    when ratio <= goal; for a rate (higher is better) when ratio >= goal.
    """

    section: str
    name: str
    unit: str
    flagos: float
    baseline: float | None
    baseline_name: str
    lower_is_better: bool
    goal: float | None = None
    note: str = ""
    extra: bool = False  # an informational line under the one before it

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.flagos / self.baseline

    @property
    def met(self) -> bool | None:
        if self.goal is None or self.ratio is None:
            return None
        return self.ratio <= self.goal if self.lower_is_better else self.ratio >= self.goal

    def goal_text(self) -> str:
        if self.goal is None:
            return ""
        return f"{'≤' if self.lower_is_better else '≥'} {self.goal:g}×"

    def met_text(self) -> str:
        return {None: "", True: "yes", False: "NO"}[self.met]


@dataclass
class Context:
    """What every benchmark gets: the run's options and a logger."""

    quick: bool = False
    pingpong: Path = PINGPONG
    log_lines: list[str] = field(default_factory=list)

    def scale(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def log(self, message: str) -> None:
        print(f"  {message}", flush=True)
        self.log_lines.append(message)


def fmt(value: float | None) -> str:
    """A figure with 3-4 significant digits, no exponent for the usual ranges."""
    if value is None:
        return "—"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 10:
        return f"{value:.2f}"
    if magnitude >= 0.1:
        return f"{value:.3f}"
    return f"{value:.2g}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}×" if value < 10 else f"{value:.0f}×"


_HEADERS = ("benchmark", "unit", "flagos", "baseline", "baseline is", "ratio", "goal", "met")


def _cells(row: Row) -> list[str]:
    name = ("  ↳ " + row.name) if row.extra else row.name
    return [
        name,
        row.unit,
        fmt(row.flagos),
        fmt(row.baseline),
        row.baseline_name,
        fmt_ratio(row.ratio),
        row.goal_text(),
        row.met_text(),
    ]


def text_table(rows: Sequence[Row]) -> str:
    """A fixed-width table for the terminal, one block per section."""
    body = [_cells(r) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(_HEADERS)]
    right = {2, 3, 5}

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [line(_HEADERS), "  ".join("-" * w for w in widths)]
    section = None
    for row, cells in zip(rows, body):
        if row.section != section:
            section = row.section
            lines.append(f"[{section}]")
        lines.append(line(cells))
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = [
        "| " + " | ".join(_HEADERS) + " |",
        "| " + " | ".join("---:" if i in (2, 3, 5) else "---" for i in range(len(_HEADERS))) + " |",
    ]
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            lines.append(f"| **{section}** |" + " |" * (len(_HEADERS) - 1))
        cells = _cells(row)
        if row.extra:
            cells[0] = "&nbsp;&nbsp;↳ " + row.name
        cells = [c.replace("|", "\\|") for c in cells]
        if row.met is False:
            cells[7] = "**NO**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals_summary(rows: Sequence[Row]) -> list[tuple[Row, str]]:
    """Each row with a goal and a sentence saying whether it is met."""
    out = []
    for row in rows:
        if row.goal is None:
            continue
        verdict = "met" if row.met else "not met"
        out.append((row, f"{row.section}: {row.name}: {fmt_ratio(row.ratio)} "
                         f"(goal {row.goal_text()}) — {verdict}"))
    return out


# ----------------------------------------------------------------- the machine


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str:
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    subject = _git("log", "-1", "--format=%s")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    text = f"{commit[:12]} ({subject[:70]})"
    if dirty:
        text += ", with uncommitted changes to tracked files"
    return text


def load_average() -> str:
    fields = _read("/proc/loadavg").split()
    return " ".join(fields[:3]) if fields else "unknown"


def machine() -> list[tuple[str, str]]:
    """(label, value) pairs describing where the figures were measured."""
    import torch

    cpuinfo = _read("/proc/cpuinfo")
    model = next(
        (l.split(":", 1)[1].strip() for l in cpuinfo.splitlines() if l.startswith("model name")),
        platform.processor() or "unknown",
    )
    virtual = " (virtual machine)" if " hypervisor" in cpuinfo else ""
    mem_kib = next(
        (int(l.split()[1]) for l in _read("/proc/meminfo").splitlines() if l.startswith("MemTotal:")),
        0,
    )
    os_name = next(
        (l.split("=", 1)[1].strip().strip('"') for l in _read("/etc/os-release").splitlines()
         if l.startswith("PRETTY_NAME=")),
        platform.system(),
    )
    return [
        ("CPU", f"{model}{virtual}"),
        ("cores", f"{os.cpu_count()} logical CPUs; torch intra-op threads {torch.get_num_threads()}"),
        ("memory", f"{mem_kib / 2**20:.1f} GiB"),
        ("kernel", f"{platform.system()} {platform.release()} ({os_name})"),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("torch", torch.__version__),
    ]


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in _read("/proc/stat").splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def bench_daemon_pid() -> int:
    """The pid of the daemon scripts/bench started (FLAGOS_BENCH_DAEMON_PID); 0 when not told."""
    return int(os.environ.get("FLAGOS_BENCH_DAEMON_PID", "0") or 0)


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used; 0 when unknown."""
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
    if len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class OtherLoad:
    """How busy other processes kept the CPUs while the benchmarks ran.

    Busy CPU time of the whole machine (/proc/stat) minus that of this
    process, its waited-for children and the daemon (pid in
    FLAGOS_BENCH_DAEMON_PID): approximately what other work took from the
    benchmarks. A fraction of all CPUs.
    """

    def __init__(self) -> None:
        self.daemon = bench_daemon_pid()
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        busy, total = _cpu_jiffies()
        t = os.times()
        ours = t.user + t.system + t.children_user + t.children_system
        if self.daemon:
            ours += process_cpu_seconds(self.daemon)
        tick = os.sysconf("SC_CLK_TCK")
        return busy / tick, total / tick, ours

    def fraction(self) -> float:
        busy, total, ours = self._sample()
        b0, t0, o0 = self.start
        if total <= t0:
            return 0.0
        return max(0.0, ((busy - b0) - (ours - o0)) / (total - t0))


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over the next `seconds` (this process sleeps)."""
    b0, t0 = _cpu_jiffies()
    time.sleep(seconds)
    b1, t1 = _cpu_jiffies()
    return (b1 - b0) / max(1, t1 - t0)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ----------------------------------------------------------------- running one module


def standalone(run: Callable[[Context], list[Row]], description: str) -> None:
    """`python3 bench/<module>.py [--quick]`: runs one benchmark, prints its rows."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--pingpong", type=Path, default=PINGPONG)
    args = parser.parse_args()
    if not os.environ.get("FLAGOS_ENDPOINT"):
        print("note: FLAGOS_ENDPOINT is not set; torch_fl uses the system daemon or a private one",
              file=sys.stderr)
    rows = run(Context(quick=args.quick, pingpong=args.pingpong))
    print(text_table(rows))
