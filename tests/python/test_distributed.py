"""torch.distributed on flagos tensors (docs/distributed.md): the flagos
c10d backend, whose collectives run in flagosd.

Each test runs tests/distributed/workload.py as two ranks on a private
daemon of the run's backend (so that its /metrics are the test's own): under
torchrun for the collectives and DDP training, under a launcher of its own
for the faults (torchrun would stop the job when a rank dies). The workload
checks its values against plain torch on the CPU; the tests check its
reports, its exit statuses and what the daemon shows afterwards.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flagos_test_env import REPO, on_kunlunxin
from test_reconnect import crash_and_restart

WORKLOAD = REPO / "tests" / "distributed" / "workload.py"
RUN_TIMEOUT_S = 300
# On kunlunxin the collectives BKCL can take run through it (the fake
# libbkcl lies beside the fake libxpurt), and their signature says so.
THROUGH = r"(?: through the collective library)?"


@pytest.fixture
def daemon(start_daemon):
    return start_daemon(extra_args=["--metrics-listen=127.0.0.1:0"])


def metrics(daemon) -> dict[str, float]:
    with urllib.request.urlopen(daemon.metrics_url(), timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = samples.get(name, 0.0) + float(value)
    return samples


def summed(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k == prefix or k.startswith(prefix + "{"))


def env_for(daemon, **extra: str) -> dict[str, str]:
    return {**os.environ, "FLAGOS_ENDPOINT": daemon.endpoint, "OMP_NUM_THREADS": "1", **extra}


def torchrun(daemon, case: str, nproc: int = 2, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
         str(WORKLOAD), case],
        env=env_for(daemon, **extra), cwd=WORKLOAD.parent, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(daemon, case: str, **extra: str) -> list[subprocess.Popen[str]]:
    """Both ranks as plain processes, with text pipes."""
    port = str(free_port())
    return [subprocess.Popen(
        [sys.executable, str(WORKLOAD), case],
        env=env_for(daemon, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra),
        cwd=WORKLOAD.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for r in range(2)]


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """[(exit status, stdout, stderr)] by rank; kills every rank on a timeout."""
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        results.append((p.returncode, out, err))
    return results


def launch(daemon, case: str, **extra: str) -> list[tuple[int, str, str]]:
    """Both ranks as plain processes: [(exit status, stdout, stderr)] by rank."""
    return finish(spawn(daemon, case, **extra))


def reports(stdout: str, case: str) -> list[str]:
    """The ranks' "rank N <case>..." lines, sorted (two ranks share a pipe
    under torchrun, so a report ends at the next one)."""
    what = re.escape(case)
    return sorted(m.strip() for m in re.findall(rf"rank \d {what}.*?(?=rank \d {what}|$)",
                                                stdout, re.M))


def ok(result: subprocess.CompletedProcess[str], case: str, nproc: int = 2) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert reports(result.stdout, case) == [f"rank {r} {case} ok" for r in range(nproc)], \
        result.stdout


def settled(daemon, what, timeout: float = 30.0) -> dict[str, float]:
    """The daemon's metrics once `what(samples)` holds (sessions close on
    their own threads after the clients exit)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = metrics(daemon)
        if what(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def quiet(samples: dict[str, float]) -> bool:
    return samples.get("flagosd_communicators", -1) == 0 and summed(samples, "flagosd_sessions") == 0


def test_every_collective_on_flagos_tensors_matches_its_arithmetic(daemon) -> None:
    ok(torchrun(daemon, "collectives"), "collectives")
    after = settled(daemon, quiet)
    # Counted once per collective (not per rank), with the bytes the ranks gave.
    assert after["flagosd_collectives_total"] >= 20, after
    assert after["flagosd_collective_bytes_total"] > 0
    assert after["flagosd_collective_failures_total"] == 0
    assert quiet(after), after  # no communicator or session outlives the job
    by_library = after["flagosd_collectives_by_library_total"]
    if on_kunlunxin():
        # BKCL ran some (test_bkcl.py checks which), flagosd's threads the rest.
        assert 0 < by_library < after["flagosd_collectives_total"], after
    else:
        assert by_library == 0, after


def test_no_tensor_byte_of_a_collective_passes_through_the_clients(daemon) -> None:
    before = metrics(daemon)
    ok(torchrun(daemon, "large"), "large")
    after = settled(daemon, quiet)
    collective = (after["flagosd_collective_bytes_total"]
                  - before.get("flagosd_collective_bytes_total", 0))
    copied = summed(after, "flagosd_copy_bytes_total") - summed(before, "flagosd_copy_bytes_total")
    # 2 ranks x 4 allreduces x 16 MiB (and a barrier's few bytes, if any)
    assert 2 * 4 * (16 << 20) <= collective < 2 * 4 * (16 << 20) + 4096, after
    # What the clients copied: the checked values and the group's setup, not
    # the 128 MiB the collectives moved.
    assert copied < 64 << 10, (copied, after)


def test_more_ranks_on_one_device_than_it_has_workers(start_daemon) -> None:
    # Five ranks on flagos:0, whose pool has two workers: a rank waiting for
    # its peers holds its worker, and the pool stands spares in for it (with
    # no spares the third rank's collective would never run and all would
    # time out).
    daemon = start_daemon(cpu_devices=1,
                          extra_args=["--metrics-listen=127.0.0.1:0", "--workers-per-device=2"])
    ok(torchrun(daemon, "collectives", nproc=5), "collectives", nproc=5)
    after = settled(daemon, quiet)
    assert after["flagosd_collective_failures_total"] == 0, after
    assert quiet(after), after


@pytest.mark.parametrize("case, backend", [("ddp_mlp", "cpu:gloo,flagos:flagos"),
                                           ("ddp_syncbn", ""), ("fsdp2", ""), ("streams", ""),
                                           ("p2p", ""), ("dtensor", ""),
                                           ("dcp", "")])
def test_training_matches_one_process_on_the_global_batch(daemon, case, backend) -> None:
    # ddp_mlp with a comm hook (its future's TensorList) and the backend
    # named per device; ddp_syncbn: a CNN whose BatchNorm is SyncBatchNorm,
    # with no backend named; fsdp2: fully_shard of a small transformer;
    # streams: collectives on two side streams, one held back on rank 0;
    # p2p: every rank sends before it receives (batch_isend_irecv, isend);
    # dtensor: DTensor ops and redistributions; dcp: a checkpoint saved in
    # one sharding and loaded into another.
    ok(torchrun(daemon, case, FLAGOS_TEST_PG_BACKEND=backend), case)
    assert quiet(settled(daemon, quiet))


def test_a_collective_whose_sizes_differ_across_ranks_fails_on_every_rank(daemon) -> None:
    result = torchrun(daemon, "mismatch")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    lines = reports(result.stdout, "mismatch")
    assert len(lines) == 2, result.stdout
    # The error names the later rank's call first: either rank may arrive first.
    calls = {"0": rf"rank 0 called all_reduce\(sum\) Float\[4\]{THROUGH}",
             "1": rf"rank 1 called all_reduce\(sum\) Float\[5\]{THROUGH}"}
    either = "|".join(f"{calls[a]}, {calls[b]}" for a, b in (("0", "1"), ("1", "0")))
    for line in lines:
        assert re.search(rf"collective #0 on communicator \S+: (?:{either}): every rank must",
                         line), line
    after = settled(daemon, quiet)
    assert after["flagosd_collective_failures_total"] == 1, after
    assert quiet(after), after


def test_a_killed_rank_fails_its_peers_collective_at_once_naming_it(daemon, run_python) -> None:
    # The timeout is long: the error must come from rank 1's session
    # closing, not from the timeout.
    killed_rank_named(launch(daemon, "killed", FLAGOS_TEST_PG_TIMEOUT_S="600"))
    after = settled(daemon, quiet)
    assert quiet(after), after
    serves_on(daemon, run_python)


def killed_rank_named(results: list[tuple[int, str, str]]) -> None:
    """Rank 1 was SIGKILLed; both of rank 0's collectives after named it."""
    (code0, out0, err0), (code1, _, _) = results
    assert code1 == -9
    assert code0 == 0, out0 + err0[-6000:]
    lines = reports(out0, "killed")
    assert len(lines) == 2, out0
    for line in lines:
        assert re.search(r"rank 1 \(process \d+\) left the process group: its session with "
                         r"flagosd closed", line), line


def serves_on(daemon, run_python) -> None:
    check = run_python("import torch, torch_fl; print((torch.ones(3, device='flagos') * 2).sum().item())",
                       env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert check.returncode == 0 and check.stdout.strip() == "6.0", check.stderr


def test_a_rank_that_never_joins_times_out_naming_it(daemon) -> None:
    (code0, out0, err0), (code1, out1, err1) = launch(daemon, "late", FLAGOS_TEST_PG_TIMEOUT_S="3")
    assert code0 == 0 and code1 == 0, out0 + err0[-4000:] + out1 + err1[-4000:]
    lines = reports(out0, "late")
    assert len(lines) == 1 and re.search(
        rf"collective #0 on communicator \S+ \(all_reduce\(sum\) Float\[4\]{THROUGH}\): rank 1 "
        r"did not join it within 3s", lines[0]), out0
    assert quiet(settled(daemon, quiet))


def test_a_daemon_restart_ends_the_process_group_with_the_sessions_loss(daemon) -> None:
    procs = spawn(daemon, "restarted")
    try:
        for p in procs:  # both ranks all_reduce in a loop
            line = p.stdout.readline()
            assert line.strip().endswith("restarted: running"), line + p.stderr.read()[-4000:]
        crash_and_restart(daemon)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    for code, out, err in finish(procs):
        assert code == 0, out + err[-6000:]
        lines = [line for line in reports(out, "restarted") if "running" not in line]
        lost = [line for line in lines if ": lost: " in line]
        ended = [line for line in lines if ": lost: " not in line]
        assert len(lost) == 1 and len(ended) == 1, out
        # The first flagos call after: the session's loss, naming the daemon.
        assert "was lost" in lost[0] and daemon.endpoint in lost[0], lost
        # The group's next collective: the group ended, and what to do.
        assert re.search(r"session \d+ with flagosd \(" + re.escape(daemon.endpoint)
                         + r"\).* was lost .* the process group ended with it; restart the job",
                         ended[0]), ended
    # The new daemon holds no communicator or session of the job.
    assert quiet(settled(daemon, quiet))


RAW_CALLS = r'''
import torch, torch_fl
import torch_fl.distributed  # the flagos_c10d schemas
ops = torch.ops.flagos_c10d
x = torch.ones(4, device="flagos")
calls = {
    "huge group": lambda: ops.all_reduce_(x, "raw-a", 0, 2**31 - 1, 0, 1.0),
    "rank outside": lambda: ops.all_reduce_(x, "raw-b", 5, 2, 0, 1.0),
    "bad op": lambda: ops.all_reduce_(x, "raw-c", 0, 1, 99, 1.0),
    "bad root": lambda: ops.broadcast_(x, "raw-d", 0, 1, 3, 1.0),
    "bad splits": lambda: ops.all_to_all_single_(x, x, [1, 2], [4], "raw-e", 0, 1, 1.0),
    "negative split": lambda: ops.all_to_all_single_(x, x, [5, -1], [4, 0], "raw-f", 0, 2, 1.0),
    "self peer": lambda: ops.send_(x, "raw-g", 0, 2, 0, 0, 1.0),
}
for name, call in calls.items():
    try:
        call()
        x.cpu()
        print(name, "-> no error")
    except RuntimeError as e:
        print(name, "->", str(e).splitlines()[0])
# A group of one needs no peer: it runs.
ops.all_reduce_(x, "raw-h", 0, 1, 0, 1.0)
print("alone ->", x.cpu().tolist())
'''


def test_raw_collective_calls_with_bad_arguments_fail_clearly(daemon, run_python) -> None:
    # What a client that bypasses torch.distributed could send: each is
    # refused naming what is wrong, and the session goes on.
    result = run_python(RAW_CALLS, env={"FLAGOS_ENDPOINT": daemon.endpoint}, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = dict(line.split(" -> ", 1) for line in result.stdout.splitlines())
    expected = {
        "huge group": r"a group of 2147483647 ranks; one flagosd forms groups of 1 to 4096 ranks",
        "rank outside": r"rank 5 of 2 is not a rank of a group of that size",
        "bad op": r"reduce op 99 is not one flagosd runs",
        "bad root": r"root 3 is not a rank of 1",
        "bad splits": r"2 output split sizes for a group of 1 ranks",
        "negative split": r"a negative output split size \(-1\)",
        "self peer": r"peer rank 0 is not another rank of the group of 2 \(this is rank 0\)",
    }
    for name, pattern in expected.items():
        assert re.search(pattern, lines.get(name, "")), (name, lines.get(name), result.stdout)
    assert lines["alone"] == "[1.0, 1.0, 1.0, 1.0]"
    after = settled(daemon, quiet)
    assert quiet(after), after
