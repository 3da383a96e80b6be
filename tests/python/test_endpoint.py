"""How torch_fl finds its daemon: FLAGOS_ENDPOINT, or a private flagosd."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SYSTEM_SOCKET = Path("/run/flagosd/flagosd.sock")
ERROR_DEADLINE_S = 2.0

# Measures, inside the child, how long the first flagos use takes to fail.
FIRST_USE = """
import json, time, torch, torch_fl
start = time.monotonic()
try:
    torch.ones(1, device="flagos")
except RuntimeError as e:
    error, message = type(e).__name__, str(e)
else:
    error, message = None, None
print(json.dumps({"elapsed": time.monotonic() - start, "error": error, "message": message}))
"""


def first_use_report(run_python, endpoint: str) -> dict:
    proc = run_python(FIRST_USE, env={"FLAGOS_ENDPOINT": endpoint}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def closed_tcp_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: connecting is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_unreachable_unix_endpoint_fails_fast_naming_it(run_python) -> None:
    endpoint = "unix:///nonexistent/x.sock"
    report = first_use_report(run_python, endpoint)
    assert report["error"] == "RuntimeError", report
    assert endpoint in report["message"]
    assert "flagosd" in report["message"]
    assert report["elapsed"] < ERROR_DEADLINE_S, report


def test_unreachable_tcp_endpoint_fails_fast_naming_it(run_python, closed_tcp_port: int) -> None:
    endpoint = f"127.0.0.1:{closed_tcp_port}"
    report = first_use_report(run_python, endpoint)
    assert report["error"] == "RuntimeError", report
    assert endpoint in report["message"]
    assert "flagosd" in report["message"]
    assert report["elapsed"] < ERROR_DEADLINE_S, report


def test_import_alone_does_not_connect(run_python) -> None:
    proc = run_python(
        "import torch, torch_fl; print('imported')",
        env={"FLAGOS_ENDPOINT": "unix:///nonexistent/x.sock"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "imported"


def test_unreachable_daemon_means_not_available_rather_than_an_error(run_python) -> None:
    proc = run_python(
        "import torch, torch_fl; print(torch.flagos.is_available(), torch.flagos.device_count())",
        env={"FLAGOS_ENDPOINT": "unix:///nonexistent/x.sock"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "0"]


PRIVATE_DAEMON_PROGRAM = """
import json, torch, torch_fl
x = torch.arange(6.0, device="flagos").view(2, 3)
print(json.dumps({"result": (x * 2).sum(dim=1).tolist(), "endpoint": torch_fl.endpoint()}))
"""


def flagosd_processes(binary: Path, listening_on: str) -> set[int]:
    """Pids of live (not zombie) processes running `binary` that listen on
    `listening_on` (other daemons on the machine are not this test's)."""
    target = str(binary.resolve())
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if exe.removesuffix(" (deleted)") == target and state != "Z" and listening_on in cmdline:
            pids.add(int(entry.name))
    return pids


@pytest.mark.skipif(SYSTEM_SOCKET.exists(),
                    reason=f"a system flagosd socket exists at {SYSTEM_SOCKET}: "
                           "torch_fl would use it instead of starting a private daemon")
def test_without_endpoint_a_private_daemon_serves_and_is_stopped_at_exit(
    run_python, flagosd_binary: Path, endpoint: str
) -> None:
    proc = run_python(
        PRIVATE_DAEMON_PROGRAM,
        env={"FLAGOS_ENDPOINT": None, "FLAGOS_DAEMON": str(flagosd_binary)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["result"] == [6.0, 24.0]

    notices = [line for line in proc.stderr.splitlines() if re.search("flagosd", line, re.I)]
    assert len(notices) == 1, proc.stderr
    assert re.search("start", notices[0], re.I), notices[0]

    assert report["endpoint"] != endpoint  # not the test run's daemon

    # The private daemon must not outlive the program (a short, bounded wait
    # covers the daemon finishing its exit).
    deadline = time.monotonic() + 5.0
    while (
        leftovers := flagosd_processes(flagosd_binary, report["endpoint"])
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"flagosd still running after its client exited: pids {leftovers}"
