"""Callgrind instructions per tiny op: native CPU torch, the flagos client, flagosd.

scripts/instructions-per-op runs this (it checks for valgrind, compiles the
start/stop shim and names the tree to measure); see its header for usage.

What is counted: `a.add_(b)` on 16-element float32 tensors, `--ops` calls
after `--warmup` calls and a synchronize, in a loop of plain Python (the
loop of bench/tiny_op.py). The figure is callgrind's Ir (instructions
executed, every thread of the process) inside the window divided by
`--ops`. Each run measures, in fresh processes:

- native: the loop on CPU tensors, in the client interpreter (under
  callgrind, instrumentation switched on and off around the loop by the
  shim's CALLGRIND_START/STOP_INSTRUMENTATION client requests).
- client: the same loop on flagos tensors, then torch.flagos.synchronize(),
  in the same interpreter; the daemon runs natively meanwhile.
- replayed (with --phases=...,replayed): flagosd under callgrind as for
  daemon, but the client captures `--graph-ops` of the calls into one graph
  (torch.accelerator.Graph) before the window and replays it --ops /
  --graph-ops times in it: the daemon's instructions per op replayed.
- daemon: flagosd under callgrind (started with instrumentation off); the
  client runs natively. The driver switches the daemon's instrumentation on
  and zeroes its counters (callgrind_control -i on, -z) while the client
  waits, tells the client to go, and dumps the counters (callgrind_control
  -d) once the client's synchronize has returned: every command of the loop
  has run by then. The same window length with the session idle is dumped
  next, as the noise floor (background threads; reported, not subtracted).

The daemon is started as scripts/bench starts it (cpu backend, 2 devices,
metrics on at 127.0.0.1:0), with WATCHDOG_USEC set to two hours and no
NOTIFY_SOCKET: its health check (a Negotiate through a new gRPC channel,
about a million instructions, every 5 s without systemd) then runs once at
start and not again during the windows; nothing else changes.

Two settings make the figures repeat (spread under 1% where it was up to
4%), in both measured processes: one malloc arena
(GLIBC_TUNABLES=glibc.malloc.arena_max=1) and valgrind's --fair-sched=yes.
They change what is counted a little (flagosd's malloc takes other paths):
compare figures measured by this script only with each other.

Valgrind runs one thread at a time and switches between them every hundred
thousand basic blocks or so, so the client's idle flusher (kIdleFlush,
500 µs) rarely gets to send a batch before it fills: on a quiet machine
every batch is full, 64 commands as a native client sends them (157 for
10000 calls: the "client batches sent" line), and the client figure
repeats to 0.2%. On a busy one (load 6-8 on 2 cores) the flusher cut some
(160-200 batches), and the client figure rose by up to 3% with them: read
that line before comparing client figures, or compare two trees in one
command (--baseline, runs interleaved). The daemon figure comes from a
native client, with batches as a real one sends them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# The daemon's health check runs every WATCHDOG_USEC / 2 when that is set
# (observability/watchdog.cc); without NOTIFY_SOCKET sd_notify does nothing.
WATCHDOG_USEC = str(2 * 3600 * 10**6)
# One malloc arena in the measured processes: which arena a thread lands on,
# and which thread frees what another allocated, vary from run to run and
# moved flagosd's figure by up to 3% (malloc's slow paths: 0.9-1.8% spread
# over 3 runs); with one arena the spread was 0.1-0.4%.
MALLOC_TUNABLE = "glibc.malloc.arena_max=1"
# Valgrind runs one thread at a time; a fair (FIFO) hand-over between them
# makes the interleaving, and so lock contention, repeat better.
CALLGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--fair-sched=yes"]
OPEN_ATTEMPTS = 5
READY_TIMEOUT_S = 180
CONTROL_TIMEOUT_S = 120
PROCESS_TIMEOUT_S = 600

# ----------------------------------------------------------------- worker
# Runs in the measured client process: `--worker=client` under callgrind,
# `--worker=daemon` natively. Talks to the driver by lines on stdin/stdout.


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _expect(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"instructions-per-op worker: expected {word!r} from the driver, "
                         f"got {line!r}")


def worker(kind: str, shim: str, ops: int, warmup: int, graph_ops: int) -> None:
    import ctypes

    import torch
    import torch_fl  # noqa: F401  registers "flagos"

    devices = ("cpu", "flagos") if kind == "client" else ("flagos",)
    # The session opens within torch_fl's fixed 1.8 s; a client under
    # valgrind on a busy machine can miss that. Opening again is harmless.
    for attempt in range(1, OPEN_ATTEMPTS + 1):
        try:
            torch.flagos.synchronize()
            break
        except RuntimeError as e:
            if attempt == OPEN_ATTEMPTS:
                raise
            print(f"instructions-per-op: opening the session, attempt {attempt}: {e}; "
                  "trying again", file=sys.stderr)
    state = {}
    for device in devices:
        a = torch.zeros(16, device=device)
        b = torch.ones(16, device=device)
        for _ in range(warmup):
            a.add_(b)
        if device == "flagos":
            torch.flagos.synchronize()
        state[device] = (a, b)

    if kind == "client":
        cg = ctypes.CDLL(shim)
        cg.flagos_callgrind_dump.argtypes = [ctypes.c_char_p]
        for device, name in (("cpu", b"native"), ("flagos", b"client")):
            a, b = state[device]
            cg.flagos_callgrind_start()
            cg.flagos_callgrind_zero()
            for _ in range(ops):
                a.add_(b)
            if device == "flagos":
                torch.flagos.synchronize()
            cg.flagos_callgrind_dump(name)
            cg.flagos_callgrind_stop()
    elif kind == "replayed":
        a, b = state["flagos"]
        graph = torch.accelerator.Graph()
        with graph:
            for _ in range(graph_ops):
                a.add_(b)
        _say("ready")
        _expect("go")
        for _ in range(ops // graph_ops):
            graph.replay()
        torch.flagos.synchronize()
        _say("done")
        _expect("finish")
    else:
        a, b = state["flagos"]
        _say("ready")
        _expect("go")
        for _ in range(ops):
            a.add_(b)
        torch.flagos.synchronize()
        _say("done")
        _expect("finish")

    expected = float(warmup + ops)
    for device, (a, _) in state.items():
        got = a.cpu()
        if not bool(got.eq(expected).all()):
            raise SystemExit(f"instructions-per-op: add_ on {device} gave {got[:4].tolist()}, "
                             f"expected {expected} everywhere")
    _say("verified")


# ----------------------------------------------------------------- callgrind output


@dataclass
class Dump:
    trigger: str
    instructions: int
    calls: dict[str, int] = field(default_factory=dict)  # callee name -> calls


def read_dump(path: Path, count_calls_to: tuple[str, ...] = ()) -> Dump:
    """The trigger, total Ir and the calls to functions whose names contain
    one of `count_calls_to`, from one callgrind output file."""
    trigger, totals, summary = "", None, None
    names: dict[str, str] = {}  # compressed id "(12)" -> function name
    callee = ""
    calls = {key: 0 for key in count_calls_to}
    name_re = re.compile(r"^c?fn=(\(\d+\))(?: (.*))?$")
    with path.open(errors="replace") as f:
        for line in f:
            if line.startswith("desc: Trigger:"):
                trigger = line.split(":", 2)[2].strip()
            elif line.startswith("totals:"):
                totals = int(line.split()[1])
            elif line.startswith("summary:"):
                summary = int(line.split()[1])
            elif count_calls_to and (line.startswith("fn=") or line.startswith("cfn=")):
                m = name_re.match(line.rstrip("\n"))
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    if line.startswith("cfn="):
                        callee = names.get(m.group(1), "")
            elif count_calls_to and line.startswith("calls=") and callee:
                for key in count_calls_to:
                    if key in callee:
                        calls[key] += int(line.split("=", 1)[1].split()[0])
    count = totals if totals is not None else summary
    if count is None:
        raise RuntimeError(f"{path}: no totals: or summary: line (a callgrind output file?)")
    return Dump(trigger, count, calls)


def dumps_by_trigger(prefix: Path, count_calls_to: tuple[str, ...] = ()) -> dict[str, Dump]:
    """Every numbered dump `prefix.N` by the name its client request or
    callgrind_control -d gave it."""
    found = {}
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        if not re.fullmatch(r"\d+", path.suffix[1:]):
            continue
        dump = read_dump(path, count_calls_to)
        if dump.trigger:
            found[dump.trigger.split()[-1]] = dump  # "Client Request: native", "dump loop"
    return found


# ----------------------------------------------------------------- driver


def _die_with_driver() -> None:
    """preexec_fn: the child gets SIGTERM when the driver dies, however it dies."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Run:
    native: float
    client: float
    daemon: float
    daemon_idle: float
    client_batches: int
    daemon_window_s: float
    replayed: float = float("nan")


@dataclass
class Tree:
    """What one column of figures measures: a flagosd binary and a torch_fl."""
    label: str
    daemon: str
    plugin_dir: str
    runs: list[Run] = field(default_factory=list)


def with_malloc_tunable(env: dict) -> dict:
    tunables = env.get("GLIBC_TUNABLES", "")
    env["GLIBC_TUNABLES"] = f"{tunables}:{MALLOC_TUNABLE}" if tunables else MALLOC_TUNABLE
    return env


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(args.workdir)
        self.python = sys.executable  # the real interpreter, not a pyenv shim
        self.children: list[subprocess.Popen] = []
        self.phases = {p for p in args.phases.split(",") if p}
        if not self.phases or self.phases - {"client", "daemon", "replayed"}:
            raise SystemExit(f"instructions-per-op: --phases={args.phases}: name client, "
                             "daemon, replayed or several")
        if "replayed" in self.phases and (args.graph_ops <= 0 or args.ops % args.graph_ops):
            raise SystemExit(f"instructions-per-op: --ops={args.ops} must be a multiple of "
                             f"--graph-ops={args.graph_ops} (> 0)")

    def log(self, text: str) -> None:
        print(f"instructions-per-op: {text}", file=sys.stderr, flush=True)

    def env(self, tree: Tree, endpoint: str) -> dict:
        plugin = str(Path(tree.plugin_dir).resolve())
        env = dict(os.environ, FLAGOS_ENDPOINT=endpoint)
        env["PYTHONPATH"] = plugin + (os.pathsep + env["PYTHONPATH"]
                                      if env.get("PYTHONPATH") else "")
        return with_malloc_tunable(env)

    def start_daemon(self, tree: Tree, name: str,
                     under_callgrind: bool) -> tuple[subprocess.Popen, str]:
        socket = self.workdir / f"{name}.sock"
        log = self.workdir / f"{name}.log"
        command = [tree.daemon, f"--listen=unix://{socket}", "--backend=cpu",
                   "--cpu-devices=2", "--device-memory=4GiB", "--metrics-listen=127.0.0.1:0"]
        if under_callgrind:
            command = CALLGRIND + [f"--callgrind-out-file={self.workdir / name}.%p"] + command
        env = with_malloc_tunable(dict(os.environ, WATCHDOG_USEC=WATCHDOG_USEC))
        env.pop("WATCHDOG_PID", None)
        env.pop("NOTIFY_SOCKET", None)
        # As flagosd sets it for itself by executing itself again, which
        # callgrind would not follow (daemon/openmp_wait_policy.h).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        with log.open("w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=_die_with_driver)
        self.children.append(proc)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "listening on" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"flagosd ({' '.join(command)}) exited with {proc.returncode} "
                                   f"before it was ready; its log:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"flagosd was not ready within {READY_TIMEOUT_S} s "
                                   f"(log {log}); is the machine overloaded?")
            time.sleep(0.2)
        return proc, f"unix://{socket}"

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.log(f"pid {proc.pid} did not stop within 60 s of SIGTERM; killing it")
                proc.kill()
                proc.wait()
        if proc in self.children:
            self.children.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.children):
            self.stop(proc)

    def control(self, pid: int, *words: str) -> None:
        command = ["callgrind_control", *words, str(pid)]
        try:
            out = subprocess.run(command, capture_output=True, text=True,
                                 timeout=CONTROL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"`{' '.join(command)}` did not answer within "
                               f"{CONTROL_TIMEOUT_S} s: vgdb could not reach the daemon "
                               "(it needs ptrace; in a container add CAP_SYS_PTRACE)") from None
        if out.returncode != 0 or "OK." not in out.stdout:
            raise RuntimeError(f"`{' '.join(command)}` failed (exit {out.returncode}): "
                               f"{(out.stdout + out.stderr).strip()}")

    def worker_command(self, kind: str) -> list[str]:
        a = self.args
        return [self.python, str(Path(__file__).resolve()), f"--worker={kind}",
                f"--shim={a.shim}", f"--ops={a.ops}", f"--warmup={a.warmup}",
                f"--graph-ops={a.graph_ops}"]

    def measure_client(self, tree: Tree, name: str) -> tuple[float, float, int]:
        daemon, endpoint = self.start_daemon(tree, f"{name}-native-daemon", under_callgrind=False)
        prefix = self.workdir / f"{name}-client"
        command = CALLGRIND + [f"--callgrind-out-file={prefix}.%p"] + self.worker_command("client")
        try:
            out = subprocess.run(command, env=self.env(tree, endpoint), capture_output=True,
                                 text=True, timeout=PROCESS_TIMEOUT_S, stdin=subprocess.DEVNULL,
                                 preexec_fn=_die_with_driver)
        finally:
            self.stop(daemon)
        if out.returncode != 0 or "verified" not in out.stdout:
            raise RuntimeError(f"the client under callgrind failed (exit {out.returncode}):\n"
                               f"{out.stderr[-3000:]}")
        pid = re.search(r"==(\d+)== Callgrind", out.stderr)
        files = Path(f"{prefix}.{pid.group(1)}") if pid else None
        if files is None:
            raise RuntimeError(f"no callgrind pid in the client's output:\n{out.stderr[-2000:]}")
        dumps = dumps_by_trigger(files, ("SessionConnection::SendPendingLocked",))
        for name in ("native", "client"):
            if name not in dumps:
                raise RuntimeError(f"no callgrind dump named {name!r} under {files}.* "
                                   f"(found {sorted(dumps)})")
        batches = dumps["client"].calls["SessionConnection::SendPendingLocked"]
        ops = self.args.ops
        return dumps["native"].instructions / ops, dumps["client"].instructions / ops, batches

    def measure_daemon(self, tree: Tree, name: str,
                       kind: str = "daemon") -> tuple[float, float, float]:
        name = f"{name}-{kind}"
        daemon, endpoint = self.start_daemon(tree, name, under_callgrind=True)
        client = subprocess.Popen(self.worker_command(kind), env=self.env(tree, endpoint),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=_die_with_driver)
        self.children.append(client)

        def expect(word: str) -> None:
            line = client.stdout.readline().strip()
            if line != word:
                client.wait(timeout=30)
                raise RuntimeError(f"the client said {line!r} where {word!r} was expected "
                                   f"(exit {client.returncode}); daemon log "
                                   f"{self.workdir / name}.log")

        def tell(word: str) -> None:
            client.stdin.write(word + "\n")
            client.stdin.flush()

        try:
            expect("ready")
            self.control(daemon.pid, "-i", "on")
            self.control(daemon.pid, "-z")
            start = time.monotonic()
            tell("go")
            expect("done")
            self.control(daemon.pid, "-d", "loop")
            window = time.monotonic() - start
            # The same length of time, the session open and idle: background work.
            self.control(daemon.pid, "-z")
            time.sleep(window)
            self.control(daemon.pid, "-d", "idle")
            self.control(daemon.pid, "-i", "off")
            tell("finish")
            expect("verified")
            client.wait(timeout=60)
        finally:
            self.stop(client)
            self.stop(daemon)
        dumps = dumps_by_trigger(self.workdir / f"{name}.{daemon.pid}")
        for key in ("loop", "idle"):
            if key not in dumps:
                raise RuntimeError(f"no daemon dump {key!r} (found {sorted(dumps)})")
        ops = self.args.ops
        return dumps["loop"].instructions / ops, dumps["idle"].instructions / ops, window

    def run(self, trees: list[Tree]) -> None:
        """Measures every tree `--runs` times, interleaved (A B, B A, A B ...),
        so that drift in the machine's state touches each alike."""
        total = self.args.runs
        for run in range(1, total + 1):
            order = list(enumerate(trees))
            if run % 2 == 0:
                order.reverse()
            for index, tree in order:
                name = f"tree{index + 1}-run{run}"
                native = client = daemon = idle = window = float("nan")
                batches = 0
                if "client" in self.phases:
                    self.log(f"run {run} of {total}, {tree.label}: client under callgrind")
                    native, client, batches = self.measure_client(tree, name)
                if "daemon" in self.phases:
                    self.log(f"run {run} of {total}, {tree.label}: flagosd under callgrind")
                    daemon, idle, window = self.measure_daemon(tree, name)
                replayed = float("nan")
                if "replayed" in self.phases:
                    self.log(f"run {run} of {total}, {tree.label}: flagosd under callgrind, "
                             f"graph replays")
                    replayed, _, _ = self.measure_daemon(tree, name, kind="replayed")
                tree.runs.append(Run(native, client, daemon, idle, batches, window, replayed))
                self.log(f"run {run}, {tree.label}: native {native:,.0f}, client {client:,.0f}, "
                         f"daemon {daemon:,.0f} (idle {idle:,.0f}) instructions per op")


def spread(values: list[float]) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def table(tree: Tree, args: argparse.Namespace) -> str:
    runs = tree.runs
    measured = {p for p in args.phases.split(",") if p}
    rows = []
    if "client" in measured:
        rows += [("native CPU torch", [r.native for r in runs]),
                 ("flagos client", [r.client for r in runs])]
    if "daemon" in measured:
        rows += [("flagosd", [r.daemon for r in runs]),
                 ("flagosd idle, same window", [r.daemon_idle for r in runs])]
    if "replayed" in measured:
        rows += [("flagosd, graph replays", [r.replayed for r in runs])]
    head = f"{'instructions per op':<27}" + "".join(f"{f'run {i + 1}':>10}"
                                                     for i in range(len(runs)))
    head += f"{'median':>10}{'spread':>8}"
    lines = [
        f"{tree.label}: a.add_(b), 16 float32, {args.ops} calls after {args.warmup} "
        "(callgrind Ir)",
        f"flagosd {tree.daemon}",
        f"torch_fl {Path(tree.plugin_dir).resolve()}",
        "",
        head,
    ]
    for label, values in rows:
        lines.append(f"{label:<27}" + "".join(f"{v:>10,.0f}" for v in values)
                     + f"{statistics.median(values):>10,.0f}{spread(values):>8.1%}")
    if "client" in measured:
        lines.append(f"{'client batches sent':<27}" + "".join(f"{r.client_batches:>10}"
                                                              for r in runs))
    if "daemon" in measured:
        lines.append(f"{'flagosd window (s)':<27}" + "".join(f"{r.daemon_window_s:>10.1f}"
                                                             for r in runs))
    if "client" in measured:
        native = statistics.median(r.native for r in runs)
        ratios = [f"client / native {statistics.median(r.client for r in runs) / native:.2f}x"]
        if "daemon" in measured:
            ratios.append(f"daemon / native "
                          f"{statistics.median(r.daemon for r in runs) / native:.2f}x")
        lines += ["", ", ".join(ratios) + " (medians)"]
    return "\n".join(lines)


def comparison(base: Tree, other: Tree, args: argparse.Namespace) -> str:
    """Each figure of `other` over the same of `base`: medians, and the range
    of the run-by-run ratios (run i of one beside run i of the other)."""
    measured = {p for p in args.phases.split(",") if p}
    keys = (["native", "client"] if "client" in measured else []) + (
        ["daemon"] if "daemon" in measured else [])
    lines = [f"{other.label} / {base.label}:"]
    for key in keys:
        mine = [getattr(r, key) for r in other.runs]
        theirs = [getattr(r, key) for r in base.runs]
        pairs = [m / t for m, t in zip(mine, theirs)]
        lines.append(f"  {key:<8} {statistics.median(mine) / statistics.median(theirs) - 1:+.2%}"
                     f" (medians {statistics.median(theirs):,.0f} -> "
                     f"{statistics.median(mine):,.0f}; run by run "
                     f"{min(pairs) - 1:+.2%} .. {max(pairs) - 1:+.2%})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("client", "daemon", "replayed"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--daemon", action="append", default=[],
                        help="the flagosd binary to measure (once per tree; the first is "
                             "the baseline of the comparison)")
    parser.add_argument("--plugin-dir", action="append", default=[],
                        help="the directory holding torch_fl (PYTHONPATH), once per --daemon")
    parser.add_argument("--label", action="append", default=[],
                        help="a name for each tree in the output (default: its flagosd path)")
    parser.add_argument("--shim", required=True,
                        help="shared object with flagos_callgrind_{start,stop,zero,dump}")
    parser.add_argument("--workdir", help="where callgrind writes its files")
    parser.add_argument("--ops", type=int, default=10000,
                        help="calls measured (default 10000)")
    parser.add_argument("--warmup", type=int, default=2000,
                        help="calls before the window (default 2000)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--phases", default="client,daemon",
                        help="which processes to measure: client (native and client figures), "
                             "daemon, replayed (flagosd replaying a graph of the calls), "
                             "comma-separated (default client,daemon)")
    parser.add_argument("--graph-ops", type=int, default=100,
                        help="calls per captured graph in the replayed phase (default 100)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", type=Path,
                        help="copy the callgrind files here (for callgrind_annotate)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.shim, args.ops, args.warmup, args.graph_ops)
        return 0
    if not args.daemon or len(args.daemon) != len(args.plugin_dir) or not args.workdir:
        parser.error("--workdir and one --plugin-dir for each --daemon are required")
    if args.label and len(args.label) != len(args.daemon):
        parser.error("one --label for each --daemon, or none")
    labels = args.label or args.daemon
    trees = [Tree(label, daemon, plugin)
             for label, daemon, plugin in zip(labels, args.daemon, args.plugin_dir)]
    # SIGTERM (timeout, the script's trap) unwinds, so that the daemons stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    driver = Driver(args)
    try:
        driver.run(trees)
    finally:
        driver.stop_all()
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for path in Path(args.workdir).glob("tree*"):
                if path.is_file() and not path.name.endswith(".sock"):
                    shutil.copy2(path, args.keep / path.name)
    print("\n\n".join(table(tree, args) for tree in trees))
    for other in trees[1:]:
        print()
        print(comparison(trees[0], other, args))
    if args.json:
        args.json.write_text(json.dumps({
            "ops": args.ops, "warmup": args.warmup,
            "trees": [{"label": t.label, "daemon": t.daemon,
                       "plugin_dir": str(Path(t.plugin_dir).resolve()),
                       "runs": [r.__dict__ for r in t.runs]} for t in trees]},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
