"""Every command an error message suggests works in that situation: each test
provokes the error, runs the command the message names, exactly as written
(`flagosd` being the build's binary), and tries again."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagos_test_env import FAKE_XPU_ROOT, free_tcp_port

FIRST_USE = """
import json, torch, torch_fl
try:
    x = torch.arange(4.0, device="flagos") * 2
    print(json.dumps({"sum": float(x.sum().cpu())}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def first_use(run_python, endpoint: str) -> dict:
    proc = run_python(FIRST_USE, env={"FLAGOS_ENDPOINT": endpoint}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def suggested_command(message: str) -> list[str]:
    match = re.search(r"start it with `([^`]+)`", message)
    assert match, f"the error suggests no command: {message}"
    return shlex.split(match.group(1))


@pytest.fixture
def run_suggestion(flagosd_binary: Path) -> Iterator:
    """run_suggestion(argv, ready=callable) starts argv (argv[0] `flagosd`: the build's),
    waits until ready() and stops it after the test, which fails if it did not exit 0."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def run(argv: list[str], ready) -> None:
        assert argv[0] == "flagosd", argv
        log = Path(tempfile.mkstemp(prefix="flagosd-advice.", suffix=".log")[1])
        logs.append(log)
        with open(log, "wb") as out:
            procs.append(subprocess.Popen([str(flagosd_binary), *argv[1:]],
                                          stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 20
        while not ready():
            assert procs[-1].poll() is None, f"{argv} exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"{argv} not ready:\n{log.read_text()}"
            time.sleep(0.02)

    yield run
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    codes = [proc.wait(timeout=15) for proc in procs]
    for log in logs:
        log.unlink()
    assert codes == [0] * len(codes)


def test_a_closed_loopback_port_suggests_a_daemon_this_client_can_use(
    run_python, run_suggestion
) -> None:
    endpoint = f"127.0.0.1:{free_tcp_port()}"
    report = first_use(run_python, endpoint)
    assert report.get("error") == "RuntimeError", report
    argv = suggested_command(report["message"])
    assert f"--listen={endpoint}" in argv, argv
    port = int(endpoint.rsplit(":", 1)[1])

    def listening() -> bool:
        import socket
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    run_suggestion(argv, listening)
    assert first_use(run_python, endpoint) == {"sum": 12.0}


def test_a_bare_socket_path_is_a_unix_endpoint_and_its_suggestion_serves_it(
    run_python, run_suggestion, tmp_path: Path
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fl."))  # short: socket paths are limited
    socket_path = workdir / "d.sock"
    report = first_use(run_python, str(socket_path))
    assert report.get("error") == "RuntimeError", report
    assert f"no such socket: {socket_path}" in report["message"], report
    argv = suggested_command(report["message"])
    assert argv[1:] == [f"--listen=unix://{socket_path}"], argv
    run_suggestion(argv, socket_path.is_socket)
    assert first_use(run_python, str(socket_path)) == {"sum": 12.0}


def test_an_endpoint_that_is_neither_a_socket_nor_host_port_says_what_to_write(
    run_python
) -> None:
    report = first_use(run_python, "flagosd.sock")
    assert report.get("error") == "RuntimeError", report
    assert report["message"].startswith(
        "flagos: endpoint flagosd.sock is neither a unix socket (unix:///path/to/flagosd.sock, "
        "or the absolute path) nor host:port"), report


def test_no_daemon_binary_suggests_flagos_daemon_which_then_serves(
    run_python, flagosd_binary: Path, tmp_path: Path
) -> None:
    # torch_fl away from the source tree (whose build/bin/flagosd it would find),
    # with no flagosd on PATH and no system daemon.
    if Path("/run/flagosd/flagosd.sock").exists():
        pytest.skip("a system flagosd socket exists: torch_fl would use it")
    import torch_fl
    package = Path(torch_fl.__file__).parent
    shutil.copytree(package, tmp_path / "torch_fl", ignore=shutil.ignore_patterns("bin"))
    env = {"PYTHONPATH": str(tmp_path), "FLAGOS_ENDPOINT": None, "FLAGOS_DAEMON": None,
           "PATH": "/usr/bin:/bin"}
    report = json.loads(run_python(FIRST_USE, env=env).stdout.strip().splitlines()[-1])
    assert report.get("error") == "RuntimeError", report
    assert "no flagosd binary was found" in report["message"], report
    assert "Set FLAGOS_DAEMON to a flagosd binary" in report["message"], report
    env["FLAGOS_DAEMON"] = str(flagosd_binary)
    report = json.loads(run_python(FIRST_USE, env=env).stdout.strip().splitlines()[-1])
    assert report == {"sum": 12.0}


def test_a_kunlunxin_daemon_without_libxpurt_says_to_set_xpu_root_which_then_works(
    flagosd_binary: Path, tmp_path: Path
) -> None:
    argv = [str(flagosd_binary), "--backend=kunlunxin", "--metrics-listen=",
            f"--listen=unix://{tmp_path}/d.sock", "--describe-backend"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("XPU_ROOT", "FLAGOS_KUNLUNXIN_XPURT", "LD_LIBRARY_PATH")}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout
    assert "set XPU_ROOT to its root" in proc.stderr, proc.stderr
    # The advice, followed: the fake SDK root stands in for /usr/local/xpu.
    env["XPU_ROOT"] = str(FAKE_XPU_ROOT)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("## kunlunxin"), proc.stdout[:200]
