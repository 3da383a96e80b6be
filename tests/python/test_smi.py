"""flagos-smi: the devices, memory and sessions a daemon reports."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch
import torch_fl

from flagos_test_env import run_backend

SMI = Path(__file__).resolve().parents[2] / "build" / "bin" / "flagos-smi"


def smi(*args: str, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if endpoint is not None:
        env["FLAGOS_ENDPOINT"] = endpoint
    return subprocess.run([str(SMI), *args], capture_output=True, text=True, timeout=30, env=env)


def test_json_lists_this_process_and_its_memory(endpoint: str) -> None:
    x = torch.ones(1 << 20, device="flagos")  # 4 MiB
    torch.flagos.synchronize()
    out = smi("--json", endpoint=endpoint)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    stats = torch_fl.daemon_stats()
    assert report["backend"] == stats["backend"] == run_backend()
    assert [int(d["total_memory"]) for d in report["devices"]] == [
        d["total_memory"] for d in stats["devices"]
    ]
    mine = [s for s in report["sessions"] if int(s["pid"]) == os.getpid()]
    assert len(mine) == 1
    assert int(mine[0]["segment_bytes"]) >= x.nbytes
    assert int(report["devices"][0]["used_memory"]) >= x.nbytes


def test_table_names_every_device(endpoint: str) -> None:
    out = smi(endpoint=endpoint)
    assert out.returncode == 0, out.stderr
    for i in range(torch.flagos.device_count()):
        assert f"flagos:{i}" in out.stdout
    assert "SESSION" in out.stdout


def test_endpoint_flag_overrides_the_environment(endpoint: str) -> None:
    out = smi(f"--endpoint={endpoint}", endpoint="unix:///nonexistent/flagosd.sock")
    assert out.returncode == 0, out.stderr


def test_unreachable_daemon_is_exit_1_with_a_message() -> None:
    out = smi(endpoint="unix:///nonexistent/flagosd.sock")
    assert out.returncode == 1
    assert "unix:///nonexistent/flagosd.sock is not reachable" in out.stderr
