"""flagosd as a process: its flags, its stats, and its stop on SIGTERM."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch_fl

from flagos_test_env import (REPO, build_type, help_flags, parse_bytes, project_version,
                             run_backend, source_flags)

MiB = 1 << 20


def run_tool(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_help_lists_every_flag_of_flagosd_and_exits_0(flagosd_binary: Path) -> None:
    proc = run_tool(str(flagosd_binary), "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    listed = help_flags(proc.stdout)
    own = source_flags(REPO / "daemon" / "main.cc")
    assert own, "no ABSL_FLAG found in daemon/main.cc"
    # Its own flags, each once, and no library's (absl's --flagfile, say).
    assert sorted(listed) == sorted([*own, "help", "version"]), proc.stdout
    assert listed["max-op-host-memory"] == "0"


def test_the_help_synopsis_shows_the_defaults_the_flags_have(flagosd_binary: Path) -> None:
    text = run_tool(str(flagosd_binary), "--help").stdout
    listed = help_flags(text)
    synopsis = text[text.index("Usage:"):text.index("\n\n", text.index("Usage:"))]
    shown = re.findall(r"\[--([a-z-]+)=([^\]]*)\]", synopsis)
    assert len(shown) >= 8, synopsis
    for name, value in shown:
        assert listed[name] == value, f"the synopsis shows --{name}={value}; its default is " \
                                      f"{listed[name]}"


def test_a_daemon_started_without_flags_has_the_defaults_help_lists(
    flagosd_binary: Path, tmp_path: Path
) -> None:
    listed = help_flags(run_tool(str(flagosd_binary), "--help").stdout)
    socket = tmp_path / "d.sock"
    # Only what a test must set: where to listen, the cpu backend, no metrics port.
    proc = subprocess.Popen([str(flagosd_binary), f"--listen=unix://{socket}", "--backend=cpu",
                             "--metrics-listen="], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not socket.is_socket() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = torch_fl.daemon_stats(f"unix://{socket}")
        assert len(stats["devices"]) == int(listed["cpu-devices"])
        assert {d["total_memory"] for d in stats["devices"]} == {
            parse_bytes(listed["device-memory"])}
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0


def test_version_names_the_project_version_torch_and_build_type(flagosd_binary: Path) -> None:
    proc = run_tool(str(flagosd_binary), "--version")
    assert proc.returncode == 0, proc.stderr
    torch_version = torch.__version__.split("+")[0]
    assert proc.stdout == (f"flagosd {project_version()} (torch {torch_version}, "
                           f"{build_type()} build)\n")


def test_flag_names_take_dashes_and_underscores_alike(flagosd_binary: Path) -> None:
    for spelling in ("--cpu-devices=0", "--cpu_devices=0"):
        proc = run_tool(str(flagosd_binary), "--backend=cpu", spelling, "--metrics-listen=",
                        "--listen=unix:///nonexistent/d.sock")
        # Parsed alike: both reach the backend's own check of the value.
        assert proc.returncode == 1
        assert "Unknown command line flag" not in proc.stderr, proc.stderr
        assert "devices must be between 1 and 64, got 0" in proc.stderr, proc.stderr


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


def environment_of(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


# libgomp reads OMP_WAIT_POLICY when it is loaded, before main: flagosd sets
# it and executes itself again, as the same process, so that ATen's OpenMP
# threads do not spin on cores its clients need (daemon/openmp_wait_policy.h;
# the CPU time it saves is in docs/performance.md). A choice in the
# environment is kept, without executing again.
@pytest.mark.parametrize("chosen", [None, "ACTIVE"], ids=["unset", "set_by_the_user"])
def test_openmp_threads_wait_passively_unless_the_environment_chose(start_daemon, run_python,
                                                                    chosen) -> None:
    daemon = start_daemon(env={"OMP_WAIT_POLICY": chosen, "GOMP_SPINCOUNT": None})
    want = chosen or "PASSIVE"
    # The pid started is the one serving (execv keeps it), with the variable set.
    assert environment_of(daemon.proc.pid).get("OMP_WAIT_POLICY") == want
    line = f"ATen's OpenMP threads between parallel regions: OMP_WAIT_POLICY={want}"
    assert daemon.wait_for_log(line, timeout=60), daemon.log()
    # It serves: a matmul against the CPU's.
    x = torch.randn(256, 256)
    torch.save(x, daemon.workdir / "x.pt")
    out = run_python("import sys, torch, torch_fl\n"
                     f"x = torch.load({str(daemon.workdir / 'x.pt')!r}).to('flagos')\n"
                     "print(float((x @ x).sum().cpu()))", env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == pytest.approx(float((x @ x).sum()), rel=1e-4)


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
