"""Runs sweep entries (OpInfo or ModuleInfo) in guarded worker processes and collects their verdicts.

    python3 tests/opinfo/driver.py --out build/opinfo/results.jsonl [--suite ops|modules]
        [--max-samples 8] [--timeout 60] [--timeout-per unit|sample] [--endpoint unix:///...]
        [--only ENTRY ...] [--log-dir DIR]

One bad operator or module never stops the run: entries run in a worker
process (worker.py); when it dies the unit it was on (an (entry, dtype), or
for modules an (entry, dtype, mode)) is a CRASH, when a unit (or with
--timeout-per sample, one sample of it) gives no result within --timeout
seconds it is a TIMEOUT; either way the worker is replaced and the entry goes
on with its next unit. When
flagosd died too (or stopped answering), the driver restarts it if it started
it. Without --endpoint the driver starts its own flagosd (build/bin/flagosd,
or FLAGOS_DAEMON).

Rows are appended to <out>.partial as entries finish (to watch a running
sweep); --out is written, sorted, at the end. With --only, just those entries
run and their rows replace theirs in an existing --out file (to recheck a fix
without a full sweep). --max-samples 0 runs every sample.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import (  # noqa: E402
    BACKWARD,
    CRASH,
    FORWARD,
    PASS,
    SKIPPED_ON_CPU,
    TIMEOUT,
    PairResult,
    read_results,
    write_results,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKER = HERE / "worker.py"
STARTUP_TIMEOUT_S = 120.0  # importing torch and op_db on a busy machine
PING_TIMEOUT_S = 60.0
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_SAMPLES = 8
SUITE_NAMES = {"ops": "OpInfo entries", "modules": "ModuleInfo entries", "mixed": "OpInfo entries with mixed operands",
               "mixed-modules": "ModuleInfo entries with mixed operands"}


class WorkerDied(Exception):
    pass


class WorkerHung(Exception):
    pass


class DaemonGone(Exception):
    """flagosd died (or stopped accepting connections) while a worker was using it."""


# ------------------------------------------------------------------ flagosd


def _python_conftest() -> ModuleType:
    """tests/python/conftest.py, for its Daemon class (loaded by path, under its own name)."""
    name = "flagos_tests_python_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "python" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def endpoint_answers(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether something accepts connections at the endpoint (not whether it is healthy)."""
    try:
        if endpoint.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(endpoint[len("unix://"):])
        else:
            host, _, port = endpoint.rpartition(":")
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                pass
    except OSError:
        return False
    return True


class DaemonHandle:
    """The flagosd the workers use: one this driver started (and may restart), or an external one.

    A daemon it starts listens in a temporary directory (socket paths are
    short-limited); at stop() its logs move to `log_dir` (when given) and the
    directory goes.
    """

    def __init__(self, endpoint: str | None, log_dir: Path | None = None, device_memory: str = "4GiB") -> None:
        self._daemon: Any = None
        self._workdir: Path | None = None
        self._log_dir = log_dir
        self.restarts = 0
        if endpoint:
            self.endpoint = endpoint
            return
        conftest = _python_conftest()
        self._workdir = Path(tempfile.mkdtemp(prefix="flagos-opinfo."))
        self._daemon = conftest.Daemon(
            conftest.flagosd_path(), self._workdir, cpu_devices=2, device_memory=device_memory
        )
        self._daemon.start()
        self.endpoint = self._daemon.endpoint

    @property
    def owned(self) -> bool:
        return self._daemon is not None

    def alive(self) -> bool:
        if self._daemon is not None and self._daemon.proc.poll() is not None:
            return False
        return endpoint_answers(self.endpoint)

    def describe_death(self) -> str:
        if self._daemon is not None and self._daemon.proc.poll() is not None:
            code = self._daemon.proc.returncode
            return f"flagosd died ({signal_name(code)})"
        return "flagosd stopped answering"

    def restart(self) -> None:
        """Kills (if needed) and restarts the daemon this driver owns; keeps the old log."""
        if self._daemon is None:
            return
        self._daemon.stop(timeout=10.0)
        self.restarts += 1
        log = Path(self._daemon.log_path)
        if log.exists():
            log.rename(log.with_name(f"flagosd.{self.restarts}.log"))
        self._daemon.socket.unlink(missing_ok=True)
        self._daemon.start()

    def stop(self) -> int | None:
        """Stops a daemon this driver started (its exit code; None if it had to be killed)."""
        if self._daemon is None:
            return 0
        code = self._daemon.stop()
        assert self._workdir is not None
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            for log in self._workdir.glob("flagosd*.log"):
                shutil.move(str(log), self._log_dir / log.name)
        shutil.rmtree(self._workdir, ignore_errors=True)
        self._daemon = None
        return code


def signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


# ------------------------------------------------------------------ worker


_INTERESTING = re.compile(
    r"(terminate called|what\(\):|Fatal Python error|Assertion|Segmentation|Error\b|error:|Exception)"
)


def crash_detail(stderr_tail: str) -> str:
    """The most telling line of a dead worker's stderr, without addresses."""
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("File ") and "Traceback" not in line]
    picked = next((line for line in reversed(lines) if _INTERESTING.search(line)), "")
    return re.sub(r"0x[0-9a-fA-F]+", "0x…", picked)[:200]


class Worker:
    """One worker.py child: requests on its stdin, events on a private pipe, stderr to a log."""

    def __init__(self, endpoint: str, log_path: Path, suite: str = "ops") -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, FLAGOS_ENDPOINT=endpoint)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "plugin")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--result-fd", str(write_fd), "--suite", suite],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=self._log,
            pass_fds=(write_fd,),
            env=env,
            cwd=REPO,
        )
        os.close(write_fd)
        self._events = read_fd
        self._buffer = b""
        self.mark = 0

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            raise WorkerDied() from e

    def event(self, timeout: float) -> dict[str, Any]:
        """The next event; WorkerDied at EOF, WorkerHung after `timeout` seconds of silence."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerHung()
            ready, _, _ = select.select([self._events], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._events, 65536)
            if not chunk:
                self.proc.wait()
                raise WorkerDied()
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def mark_log(self) -> None:
        self._log.flush()
        self.mark = self.log_path.stat().st_size

    def log_since_mark(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self.mark)
            return f.read()[-20000:].decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:  # a dead worker's pipe
                pass
        os.close(self._events)
        self._log.close()


# ------------------------------------------------------------------ sweep


class Sweeper:
    """Runs entries of one suite one by one in a (replaceable) worker; yields PairResults.

    The time limit applies to each unit (per_sample False) or to each sample's
    forward and each sample's backward within a unit (per_sample True).
    """

    def __init__(
        self,
        daemon: DaemonHandle,
        log_dir: Path,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        timeout: float = DEFAULT_TIMEOUT_S,
        suite: str = "ops",
        per_sample: bool = False,
    ) -> None:
        self.daemon = daemon
        self.log_dir = log_dir
        self.max_samples = max_samples
        self.timeout = timeout
        self.suite = suite
        self.per_sample = per_sample
        self._worker: Worker | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def _fresh_worker(self) -> Worker:
        if self._worker is None:
            self._worker = Worker(self.daemon.endpoint, self.log_dir / f"worker-{self.suite}.log", self.suite)
        return self._worker

    def _drop_worker(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def entries(self) -> list[str]:
        worker = self._fresh_worker()
        worker.send({"cmd": "list"})
        event = worker.event(STARTUP_TIMEOUT_S)
        assert event["event"] == "entries", event
        return list(event["entries"])

    def _daemon_serves(self) -> bool:
        """Whether a fresh worker gets a tiny operator through on every device."""
        if not self.daemon.alive():
            return False
        worker = self._fresh_worker()
        try:
            worker.send({"cmd": "ping"})
            return worker.event(STARTUP_TIMEOUT_S + PING_TIMEOUT_S)["event"] == "pong"
        except (WorkerDied, WorkerHung):
            self._drop_worker()
            return False

    def _recover(self) -> str:
        """After a dead or hung worker: restarts flagosd if it no longer serves; '' or what happened to it."""
        self._drop_worker()
        if self._daemon_serves():
            return ""
        what = self.daemon.describe_death()
        self._drop_worker()
        self.daemon.restart()
        return what

    def run_entry(self, entry: str) -> list[PairResult]:
        results: list[PairResult] = []
        # (dtype, mode, backward, reference: the wider dtype of the CPU reference for CUDA's extra dtypes);
        # None: not planned yet
        remaining: list[tuple[str, str, bool, str]] | None = None
        while remaining is None or remaining:
            worker = self._fresh_worker()
            current: tuple[str, str, bool, str] | None = None
            phase = "setup"
            try:
                worker.send({
                    "cmd": "run",
                    "entry": entry,
                    "units": None if remaining is None else [[d, m] for d, m, _, _ in remaining],
                    "max_samples": self.max_samples,
                })
                worker.mark_log()
                deadline = time.monotonic() + STARTUP_TIMEOUT_S
                while True:
                    # The limit is per unit, from its "begin" (or per sample, from its "phase").
                    event = worker.event(max(0.0, deadline - time.monotonic()))
                    kind = event["event"]
                    if kind == "plan":
                        # [dtype, mode, backward, reference] (reference: CUDA's extra dtypes), or
                        # [dtype, mode, backward] from a worker speaking the older form.
                        remaining = [(u[0], u[1], bool(u[2]), u[3] if len(u) > 3 else "") for u in event["units"]]
                        if not any(not u[3] for u in remaining) and not results:
                            supported = ", ".join(event["supported"]) or "nothing"
                            results.append(PairResult(entry, "-", FORWARD, SKIPPED_ON_CPU,
                                                      f"none of the sweep's dtypes (the CPU supports: {supported})"))
                    elif kind == "begin":
                        assert remaining is not None
                        current = next(u for u in remaining if u[:2] == (event["dtype"], event["mode"]))
                        phase = "setup"
                        worker.mark_log()
                        deadline = time.monotonic() + self.timeout
                    elif kind == "phase":
                        phase = f"{event['phase']} of sample {event['sample']}"
                        if self.per_sample:
                            deadline = time.monotonic() + self.timeout
                    elif kind in (FORWARD, BACKWARD):
                        assert remaining is not None and current is not None
                        row = PairResult(entry, event["dtype"], kind, *event["outcome"], mode=event["mode"],
                                         reference=current[3])
                        if row.verdict not in (PASS, SKIPPED_ON_CPU) and not self.daemon.alive():
                            raise DaemonGone()  # the failure is the daemon's death, not the entry's
                        results.append(row)
                        if kind == BACKWARD or not current[2]:
                            remaining.remove(current)
                            current = None
                    elif kind == "done":
                        return results
            except (WorkerDied, WorkerHung, DaemonGone) as failure:
                verdict = TIMEOUT if isinstance(failure, WorkerHung) else CRASH
                if isinstance(failure, WorkerHung):
                    # Without the sample index: how far a hung unit got depends on the machine's load.
                    per = " per sample" if self.per_sample else ""
                    message = f"no result within {self.timeout:g} s{per} (during {phase.split(' of ')[0]})"
                elif isinstance(failure, DaemonGone):
                    message = f"{self.daemon.describe_death()} during {phase}"
                else:
                    detail = crash_detail(worker.log_since_mark())
                    message = f"worker died ({signal_name(worker.proc.returncode)}) during {phase}"
                    if detail:
                        message += f": {detail}"
                daemon_news = self._recover()
                if daemon_news and not isinstance(failure, DaemonGone):
                    message = f"{daemon_news}; {message}"
                if current is None:
                    # Before any unit began (the plan itself failed): the entry as a whole.
                    results.append(PairResult(entry, "-", FORWARD, verdict, message))
                    return results
                dtype, mode, backward, reference = current
                if not any(r.dtype == dtype and r.mode == mode and r.direction == FORWARD for r in results):
                    results.append(PairResult(entry, dtype, FORWARD, verdict, message, mode=mode, reference=reference))
                if backward:
                    results.append(PairResult(entry, dtype, BACKWARD, verdict, message, mode=mode, reference=reference))
                assert remaining is not None
                remaining.remove(current)
        return results


def sweep(
    sweeper: Sweeper,
    entries: Iterable[str],
    on_entry: Callable[[int, int, str, list[PairResult]], None] | None = None,
    partial: Path | None = None,
) -> list[PairResult]:
    """Runs the entries in order; appends each entry's rows to `partial` (if given) as they come."""
    entries = list(entries)
    results: list[PairResult] = []
    for i, entry in enumerate(entries):
        rows = sweeper.run_entry(entry)
        results.extend(rows)
        if partial is not None:
            with open(partial, "a") as f:
                f.writelines(r.to_json() + "\n" for r in rows)
        if on_entry:
            on_entry(i, len(entries), entry, rows)
    return results


# ------------------------------------------------------------------ CLI


def _print_entry(i: int, n: int, entry: str, rows: list[PairResult]) -> None:
    summary = " ".join(f"{r.dtype}{'/' + r.mode if r.mode else ''}/{r.direction[0]}:{r.verdict}"
                       for r in rows if r.verdict != "PASS")
    print(f"[{i + 1}/{n}] {entry}: {len(rows)} rows{' ' + summary if summary else ', all PASS'}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results file (JSON lines)")
    parser.add_argument("--suite", choices=sorted(SUITE_NAMES), default="ops")
    parser.add_argument("--max-samples", type=int, default=DEFAULT_MAX_SAMPLES)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds per unit (or sample) before it is a TIMEOUT")
    parser.add_argument("--timeout-per", choices=("unit", "sample"), default="unit",
                        help="what --timeout limits: a whole (entry, dtype[, mode]) or each sample of it")
    parser.add_argument("--endpoint", help="use this flagosd instead of starting one")
    parser.add_argument("--only", nargs="+", metavar="ENTRY",
                        help="run only these entries; merge into an existing --out")
    parser.add_argument("--log-dir", type=Path, help="worker and daemon logs (default: next to --out)")
    args = parser.parse_args()

    log_dir = args.log_dir or args.out.parent / "logs"
    # SIGTERM unwinds like Ctrl-C, so that the worker and the daemon are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    daemon = DaemonHandle(args.endpoint, log_dir)
    sweeper = Sweeper(daemon, log_dir, args.max_samples, args.timeout, args.suite, args.timeout_per == "sample")
    try:
        known = sweeper.entries()
        if args.only:
            unknown = sorted(set(args.only) - set(known))
            if unknown:
                sys.exit(f"unknown entries: {' '.join(unknown)}")
            entries = sorted(set(args.only))
        else:
            entries = known
        samples = f"at most {args.max_samples}" if args.max_samples > 0 else "all"
        print(f"sweeping {len(entries)} {SUITE_NAMES[args.suite]}, {samples} samples per unit, "
              f"{args.timeout:g} s limit per {args.timeout_per}, flagosd at {daemon.endpoint}", flush=True)
        partial = args.out.with_name(args.out.name + ".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        results = sweep(sweeper, entries, _print_entry, partial)
    finally:
        sweeper.close()
        owned = daemon.owned
        code = daemon.stop()
        if owned:
            print(f"flagosd stopped ({signal_name(code)}); logs in {log_dir}", flush=True)

    if args.only and args.out.exists():
        rerun = set(entries)
        results = [r for r in read_results(args.out) if r.entry not in rerun] + results
    write_results(args.out, results)
    partial.unlink(missing_ok=True)
    print(f"wrote {len(results)} results to {args.out}; wall time {time.monotonic() - started:.0f} s",
          flush=True)


if __name__ == "__main__":
    main()
