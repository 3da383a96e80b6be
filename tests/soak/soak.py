"""The soak test: CLIENTS processes doing random checked work on one
private flagosd (cpu backend) for SECONDS, clients SIGKILLed at random and
replaced, and the daemon itself SIGKILLed once in the middle and started
again on its socket after RESTART_DELAY_S (as systemd restarts a crashed
unit): the clients then running see their session lost, resume from their
checkpoints in a new session and carry on. One of the CLIENTS lives through
the whole soak, never SIGKILLed, and must see exactly that one loss and
resume. At the end the daemon must be
back where it started: no device memory used, no session left, its threads
and descriptors at their baseline (the first daemon's, after the same
warm-up), its resident memory under a stated bound all along, and it never
crashed on its own.

    python3 tests/soak/soak.py SECONDS [CLIENTS]     (scripts/soak)

Prints a table of the figures; exits 1 when a check failed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugin"))

import torch_fl  # noqa: E402

CLIENT = Path(__file__).resolve().parent / "client.py"
DEVICE_MEMORY = 1 << 30
# What the daemon's resident memory may grow by over its baseline: the cpu
# backend's device memory is host memory, and the clients hold a few tens
# of MiB each at most (tests/soak/client.py: 4 MiB tensors, 8 kept).
RSS_BOUND_BYTES = 512 << 20
SETTLE_S = 20.0
RESTART_DELAY_S = 1.0
THREADS_SETTLE_S = 30.0
# The threads of gRPC's event-engine pool, which gRPC grows for a burst of
# work (the clients reconnecting at once after the restart) and may keep:
# one more than at the baseline was seen still there after 90 s idle. Up to
# GRPC_POOL_SLACK more are gRPC's sizing of its own pool, not a thread per
# session or stream, so not a leak of flagosd's.
GRPC_POOL_THREAD = "event_engine"
GRPC_POOL_SLACK = 2


def proc_figures(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmRSS:"))
    return {"rss": rss_kib * 1024, "threads": len(os.listdir(f"/proc/{pid}/task")),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def thread_names(pid: int) -> list[str]:
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
        except OSError:
            pass
    return sorted(names)


def daemon_state(endpoint: str) -> tuple[int, int, int]:
    stats = torch_fl.daemon_stats(endpoint)
    return (sum(int(d["used_memory"]) for d in stats["devices"]), len(stats["sessions"]),
            len(stats["closing_sessions"]))


def start_daemon(binary: str, workdir: Path, endpoint: str) -> subprocess.Popen | None:
    """flagosd on `endpoint`, once its socket is there; None (and the log printed) if not."""
    (workdir / "flagosd.sock").unlink(missing_ok=True)
    with open(workdir / "flagosd.log", "ab") as log:
        # One compute thread per worker: the cpu backend's workers each make
        # an OpenMP team the first time they run a parallel kernel and keep
        # it (docs/operations.md, "Threads"), which would grow the thread
        # count over the baseline by a bounded amount that says nothing
        # about leaks.
        daemon = subprocess.Popen([binary, f"--listen={endpoint}", "--backend=cpu",
                                   "--cpu-devices=2", f"--device-memory={DEVICE_MEMORY}",
                                   "--metrics-listen="], stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    if not settle(lambda: (workdir / "flagosd.sock").is_socket(), 30):
        print("soak: flagosd did not start:\n" + (workdir / "flagosd.log").read_text())
        daemon.kill()
        return None
    return daemon


class Client:
    def __init__(self, endpoint: str, seed: int, seconds: float) -> None:
        env = {**os.environ, "FLAGOS_ENDPOINT": endpoint,
               "PYTHONPATH": f"{REPO / 'plugin'}:{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen([sys.executable, str(CLIENT), str(seed), str(seconds)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.seed = seed

    def reap(self, failures: list[str]) -> int:
        """Waits for the client's end; returns the operations it reported, and
        adds to `failures` when it ended otherwise than by exit 0 or SIGKILL."""
        out, err = self.proc.communicate(timeout=300)
        counts = [int(line.split()[1]) for line in out.splitlines() if line.startswith("ops ")]
        self.losses = sum(1 for line in out.splitlines() if line.startswith("lost "))
        if self.proc.returncode not in (0, -signal.SIGKILL):
            failures.append(f"client seed {self.seed} exited {self.proc.returncode}: "
                            f"{err.strip()[-2000:]}")
        return max(counts, default=0)


def settle(predicate, seconds: float = SETTLE_S) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    clients_wanted = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    binary = os.environ.get("FLAGOS_DAEMON") or str(REPO / "build" / "bin" / "flagosd")
    workdir = Path(tempfile.mkdtemp(prefix="flagos-soak."))
    endpoint = f"unix://{workdir}/flagosd.sock"
    daemon = start_daemon(binary, workdir, endpoint)
    if daemon is None:
        return 1
    rng = random.Random(1234)
    failures: list[str] = []

    # Warm-up: the first sessions make what the daemon keeps (the backend's
    # lazily made state), then the baseline.
    warm = [Client(endpoint, 10_000 + i, 5.0) for i in range(clients_wanted)]
    for c in warm:
        c.proc.wait(timeout=300)
    settle(lambda: daemon_state(endpoint)[1:] == (0, 0))
    baseline = proc_figures(daemon.pid)
    baseline_names = thread_names(daemon.pid)
    max_rss = baseline["rss"]

    runs = kills = ops = losses = restarts = 0
    live: list[Client] = []
    # One client lives through the whole soak, never SIGKILLed: it is sure
    # to be at work when the daemon restarts, and must resume after it.
    survivor = Client(endpoint, 0, seconds + 5.0)
    seed = 0
    deadline = time.monotonic() + seconds
    next_kill = time.monotonic() + rng.uniform(2.0, 6.0)
    restart_at = time.monotonic() + seconds / 2
    crashed = False
    while time.monotonic() < deadline:
        if restarts == 0 and time.monotonic() >= restart_at:
            # The restart: SIGKILL, as a crash; the clients live on.
            max_rss = max(max_rss, proc_figures(daemon.pid)["rss"])
            daemon.kill()
            daemon.wait()
            restarts += 1
            time.sleep(RESTART_DELAY_S)
            restarted = start_daemon(binary, workdir, endpoint)
            if restarted is None:
                crashed = True
                break
            daemon = restarted
        while len(live) < clients_wanted - 1:
            seed += 1
            live.append(Client(endpoint, seed, rng.uniform(4.0, 15.0)))
            runs += 1
        if time.monotonic() >= next_kill:
            victim = rng.choice(live)
            victim.proc.send_signal(signal.SIGKILL)
            kills += 1
            next_kill = time.monotonic() + rng.uniform(2.0, 6.0)
        for c in list(live):
            code = c.proc.poll()
            if code is None:
                continue
            ops += c.reap(failures)
            losses += c.losses
            live.remove(c)
        if daemon.poll() is not None:
            crashed = True
            break
        max_rss = max(max_rss, proc_figures(daemon.pid)["rss"])
        time.sleep(0.05)
    for c in live + [survivor]:
        ops += c.reap(failures)
        losses += c.losses

    leaked = sessions_left = 0
    threads_settled_s = 0.0
    after, after_names = baseline, baseline_names
    if not crashed:
        settle(lambda: daemon_state(endpoint) == (0, 0, 0))
        leaked, sessions_left, closing_left = daemon_state(endpoint)
        sessions_left += closing_left
        # Threads and descriptors may take a moment to go after the last
        # client (closers, gRPC's pollers).
        settle_start = time.monotonic()
        settle(lambda: (proc_figures(daemon.pid)["threads"] <= baseline["threads"]
                        and proc_figures(daemon.pid)["fds"] <= baseline["fds"]),
               THREADS_SETTLE_S)
        threads_settled_s = time.monotonic() - settle_start
        after = proc_figures(daemon.pid)
        after_names = thread_names(daemon.pid)
        max_rss = max(max_rss, after["rss"])
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=60)
        if code != 0:
            failures.append(f"flagosd exited {code} on SIGTERM")
    else:
        failures.append(f"flagosd died with {daemon.returncode} during the soak "
                        "(not the restart's SIGKILL)")
    if restarts and survivor.losses != restarts:
        failures.append(f"the client that lived through the soak saw {survivor.losses} lost "
                        f"sessions for {restarts} daemon restart(s)")
    if leaked:
        failures.append(f"{leaked} bytes of device memory still used after every client ended")
    if sessions_left:
        failures.append(f"{sessions_left} sessions left after every client ended")
    # Every thread of flagosd's own, and of gRPC's server, must be back;
    # gRPC's event-engine pool is sized by gRPC to the load and bounded.
    extra = {n: after_names.count(n) - baseline_names.count(n) for n in set(after_names)
             if after_names.count(n) > baseline_names.count(n)}
    pool_extra = extra.pop(GRPC_POOL_THREAD, 0)
    if extra or pool_extra > GRPC_POOL_SLACK:
        failures.append(f"threads {baseline['threads']} -> {after['threads']} (more of: "
                        f"{', '.join(sorted(extra) + [GRPC_POOL_THREAD] * (pool_extra > 0))})")
    if after["fds"] > baseline["fds"]:
        failures.append(f"descriptors {baseline['fds']} -> {after['fds']}")
    if max_rss > baseline["rss"] + RSS_BOUND_BYTES:
        failures.append(f"resident memory reached {max_rss >> 20} MiB, over the bound of "
                        f"{(baseline['rss'] + RSS_BOUND_BYTES) >> 20} MiB")

    mib = lambda n: f"{n / (1 << 20):.0f} MiB"  # noqa: E731
    rows = [
        ("duration", f"{seconds:.0f} s, {clients_wanted} clients at a time"),
        ("client runs", f"{runs} (and 1 that lived through the whole soak)"),
        ("operations checked", str(ops)),
        ("clients SIGKILLed", str(kills)),
        ("daemon restarts (SIGKILL, back after 1 s)", str(restarts)),
        ("client sessions lost and resumed from checkpoints", str(losses)),
        ("leaked device bytes", str(leaked)),
        ("sessions left", str(sessions_left)),
        ("daemon RSS baseline / max / end",
         f"{mib(baseline['rss'])} / {mib(max_rss)} / {mib(after['rss'])} "
         f"(bound {mib(baseline['rss'] + RSS_BOUND_BYTES)})"),
        ("daemon threads before / after",
         f"{baseline['threads']} / {after['threads']} (after {threads_settled_s:.0f} s idle)"),
        ("daemon descriptors before / after", f"{baseline['fds']} / {after['fds']}"),
        ("daemon crashes", "1" if crashed else "0"),
        ("client failures (wrong data, errors)",
         str(sum(1 for f in failures if f.startswith("client")))),
    ]
    print("| soak | |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for failure in failures:
        print(f"soak: FAILED: {failure}")
    if failures:
        print(f"soak: flagosd's log: {workdir / 'flagosd.log'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
