"""flagos-smi: the devices, memory and sessions a daemon reports."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch
import torch_fl

from flagos_test_env import (REPO, build_type, help_flags, project_version, run_backend,
                             source_flags)

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
    # What an operator needs to tell sessions apart.
    assert mine[0]["torch_version"] == torch.__version__.split("+")[0]
    assert mine[0]["client"] == "torch_fl"
    assert int(mine[0]["streams"]) >= 1
    # This process's command line as the kernel has it, arguments joined by
    # spaces (a pytest-xdist worker's is `python3 -u -c ...`, not pytest's).
    own = "".join(" " if ord(c) < 0x20 or c == "\x7f" else c
                  for c in Path("/proc/self/cmdline").read_text(errors="replace")).rstrip(" ")
    assert mine[0]["command_line"] == own
    assert "python" in mine[0]["command_line"]
    assert report["daemon_version"] == "0.1.0"
    assert report["torch_version"] == torch.__version__.split("+")[0]
    assert float(report["start_time_unix"]) > 1.7e9
    for device in report["devices"]:
        assert 0.0 <= float(device["utilization"]) <= 1.0
        assert float(device["busy_seconds"]) >= 0.0


def test_table_names_every_device(endpoint: str) -> None:
    out = smi(endpoint=endpoint)
    assert out.returncode == 0, out.stderr
    for i in range(torch.flagos.device_count()):
        assert f"flagos:{i}" in out.stdout
    assert "SESSION" in out.stdout
    header = next(line for line in out.stdout.splitlines() if line.startswith("SESSION"))
    for column in ("PID", "UID", "TORCH", "STREAMS", "MEMORY", "CLIENT / COMMAND"):
        assert column in header
    assert "UTIL%" in out.stdout


def test_busy_device_shows_utilisation(endpoint: str) -> None:
    x = torch.randn(512, 512, device="flagos")
    before = json.loads(smi("--json", endpoint=endpoint).stdout)["devices"][0]
    for _ in range(40):
        x = (x @ x).tanh_()
    torch.flagos.synchronize()
    after = json.loads(smi("--json", endpoint=endpoint).stdout)["devices"][0]
    assert float(after["busy_seconds"]) > float(before["busy_seconds"])


def test_loop_refreshes_and_stops_after_count(endpoint: str) -> None:
    out = smi("-l", "0.2", "--count=3", endpoint=endpoint)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("DEVICE ") == 3
    lines = smi("--json", "-l", "0.2", "--count=2", endpoint=endpoint)
    assert lines.returncode == 0, lines.stderr
    reports = [json.loads(line) for line in lines.stdout.splitlines()]
    assert len(reports) == 2 and all("devices" in r for r in reports)


def test_loop_needs_seconds() -> None:
    out = smi("-l", "soon")
    assert out.returncode == 2
    assert "-l needs a number of seconds" in out.stderr


def test_health_is_serving(endpoint: str) -> None:
    out = smi("--health", endpoint=endpoint)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "SERVING\n"


def test_health_of_an_unreachable_daemon_is_exit_1() -> None:
    out = smi("--health", endpoint="unix:///nonexistent/flagosd.sock")
    assert out.returncode == 1
    assert "unix:///nonexistent/flagosd.sock is not reachable" in out.stderr


def test_endpoint_flag_overrides_the_environment(endpoint: str) -> None:
    out = smi(f"--endpoint={endpoint}", endpoint="unix:///nonexistent/flagosd.sock")
    assert out.returncode == 0, out.stderr


def test_unreachable_daemon_is_exit_1_with_a_message() -> None:
    out = smi(endpoint="unix:///nonexistent/flagosd.sock")
    assert out.returncode == 1
    assert "unix:///nonexistent/flagosd.sock is not reachable" in out.stderr


def test_help_lists_every_flag_of_flagos_smi_and_exits_0() -> None:
    out = smi("--help")
    assert out.returncode == 0, out.stderr
    assert "No flags matched" not in out.stdout
    listed = help_flags(out.stdout)
    own = source_flags(REPO / "client" / "smi" / "flagos_smi.cc")
    assert sorted(listed) == sorted([*own, "help", "version"]), out.stdout
    # The defaults the code has.
    assert listed["timeout-ms"] == "2000"
    assert listed["json"] == "false"


def test_version_names_the_project_version_torch_and_build_type() -> None:
    out = smi("--version")
    assert out.returncode == 0, out.stderr
    torch_version = torch.__version__.split("+")[0]
    assert out.stdout == (f"flagos-smi {project_version()} (torch {torch_version}, "
                          f"{build_type()} build)\n")


def test_flag_names_take_dashes_and_underscores_alike(endpoint: str) -> None:
    for spelling in ("--timeout-ms=5000", "--timeout_ms=5000"):
        out = smi(spelling, "--json", endpoint=endpoint)
        assert out.returncode == 0, (spelling, out.stderr)
        assert json.loads(out.stdout)["devices"], out.stdout


def test_a_bare_socket_path_is_a_unix_endpoint(endpoint: str) -> None:
    path = endpoint.removeprefix("unix://")
    assert path.startswith("/")
    out = smi(f"--endpoint={path}", "--health")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SERVING"


def test_only_flag_names_are_rewritten_not_their_values() -> None:
    out = smi("--endpoint=/nonexistent/a-b/c-d.sock", "--timeout-ms=500")
    assert out.returncode == 1
    assert "no such socket: /nonexistent/a-b/c-d.sock" in out.stderr, out.stderr
