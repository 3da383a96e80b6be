"""flagosd as a process: its flags, its stats, and its stop on SIGTERM."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch_fl

from flagos_test_env import run_backend

MiB = 1 << 20


def test_help_documents_the_flags(flagosd_binary: Path) -> None:
    proc = subprocess.run(
        [str(flagosd_binary), "--help"], capture_output=True, text=True, timeout=30
    )
    text = proc.stdout + proc.stderr
    for flag in ("listen", "backend", "cpu-devices", "device-memory"):
        assert flag in text, f"--{flag} not in flagosd --help:\n{text}"


def test_stats_of_another_daemon_describe_its_configuration(start_daemon) -> None:
    daemon = start_daemon(cpu_devices=3, device_memory="64MiB")
    stats = torch_fl.daemon_stats(daemon.endpoint)
    assert stats["backend"] == run_backend()
    assert [d["index"] for d in stats["devices"]] == [0, 1, 2]
    assert all(d["total_memory"] == 64 * MiB for d in stats["devices"])
    assert all(d["used_memory"] == 0 for d in stats["devices"])
    assert stats["sessions"] == []
    assert stats["sessions_total"] == 0


def test_idle_daemon_exits_0_on_sigterm(start_daemon) -> None:
    daemon = start_daemon()
    assert daemon.stop() == 0, daemon.log()


CLIENT = """
import sys, torch, torch_fl
x = torch.ones(1000, device="flagos")
torch.flagos.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def test_daemon_with_a_connected_client_exits_0_on_sigterm(
    start_daemon, spawn_python, read_line
) -> None:
    daemon = start_daemon()
    client = spawn_python(CLIENT, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert read_line(client) == "ready\n", client.communicate(timeout=30)[1]
    assert daemon.stop() == 0, daemon.log()


def test_client_exits_after_its_daemon_stopped(start_daemon, spawn_python, read_line) -> None:
    daemon = start_daemon()
    client = spawn_python(CLIENT, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert read_line(client) == "ready\n", client.communicate(timeout=30)[1]
    daemon.stop()
    client.stdin.close()  # lets the program end: it must not hang on the lost daemon
    try:
        client.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("a client whose daemon stopped did not exit within 30 s")
