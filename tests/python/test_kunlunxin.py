"""The kunlunxin backend as a user meets it, on the test-only fake libxpurt
(tests/fakes/xpurt): start-up without an SDK, backend selection, and the
client errors of injected vendor failures.

These tests start their own daemons with --backend=kunlunxin whatever the
run's backend is, so they run in the cpu pass only (the kunlunxin pass runs
every other test on that backend).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch_fl

from flagos_test_env import FAKE_XPU_ROOT, REPO, fake_xpu_env, on_kunlunxin

pytestmark = [
    pytest.mark.skipif(on_kunlunxin(), reason="starts its own kunlunxin daemons: runs once, in "
                       "the cpu pass"),
    pytest.mark.skipif(not (FAKE_XPU_ROOT / "so" / "libxpurt.so").exists(),
                       reason="the fake libxpurt is not built (scripts/build builds it)"),
]

NO_SDK = {"XPU_ROOT": None, "FLAGOS_KUNLUNXIN_XPURT": None,
          "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR": None}


def test_kunlunxin_without_the_sdk_exits_naming_the_library_and_the_variables(
    flagosd_binary: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in NO_SDK}
    proc = subprocess.run(
        [str(flagosd_binary), "--backend=kunlunxin", f"--listen=unix://{tmp_path}/s.sock"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode != 0
    message = proc.stderr
    assert "libxpurt" in message, message
    assert "XPU_ROOT" in message, message
    assert "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR" in message, message
    assert "/usr/local/xpu/so" in message, message  # a directory it searched
    assert "listening" not in proc.stdout


def test_auto_picks_kunlunxin_when_libxpurt_loads_and_cpu_otherwise(start_daemon) -> None:
    with_fake = start_daemon(backend="auto", env=fake_xpu_env(devices="3"))
    assert torch_fl.daemon_stats(with_fake.endpoint)["backend"] == "kunlunxin"
    assert len(torch_fl.daemon_stats(with_fake.endpoint)["devices"]) == 3
    without = start_daemon(backend="auto", env=NO_SDK)
    assert torch_fl.daemon_stats(without.endpoint)["backend"] == "cpu"


OOM = """
import torch, torch_fl
try:
    torch.empty(1 << 20, device="flagos")
except torch.OutOfMemoryError as e:
    print("oom:", str(e).replace("\\n", " "))
x = torch.arange(4.0, device="flagos")  # the daemon serves on
print("after:", (x * 2).cpu().tolist())
"""


def test_injected_out_of_memory_raises_torch_out_of_memory_error(
    start_daemon, spawn_python
) -> None:
    # The client's allocation and its one retry fail as the driver reports
    # it (negated 705). The first two allocations of the process are the
    # health probes' buffers, one per device, made at start.
    daemon = start_daemon(backend="kunlunxin",
                          env=fake_xpu_env(fail="xpu_malloc:3:-705,xpu_malloc:4:-705"))
    client = spawn_python(OOM, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("oom:") and "705" in lines[0], out
    assert lines[1] == "after: [0.0, 2.0, 4.0, 6.0]", out


def test_a_device_larger_than_the_fake_is_out_of_memory(start_daemon, spawn_python) -> None:
    daemon = start_daemon(backend="kunlunxin", device_memory="64MiB")
    code = OOM.replace("1 << 20", "64 << 20")
    client = spawn_python(code, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert out.splitlines()[0].startswith("oom:"), out


ABNORMAL = """
import torch, torch_fl
x = torch.arange(1024.0, device="flagos")
try:
    for i in range(200):
        x = x * 1.0
        torch.flagos.synchronize()
    print("no error")
except RuntimeError as e:
    print("error:", str(e).replace("\\n", " "))
"""


def test_an_abnormal_device_error_names_the_op_and_the_vendor_code(
    start_daemon, spawn_python
) -> None:
    daemon = start_daemon(backend="kunlunxin", env=fake_xpu_env(fail="xpu_memcpy_async:40:-713"))
    client = spawn_python(ABNORMAL, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert out.startswith("error:"), out
    assert "aten::mul" in out and "713" in out, out
    # The daemon serves on: a new session works.
    again = spawn_python(OOM, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert "after: [0.0, 2.0, 4.0, 6.0]" in out


def test_the_p800_smoke_script_passes_on_the_fake(flagosd_binary: Path) -> None:
    env = dict(os.environ, **fake_xpu_env(devices="2"))
    env.pop("FLAGOS_ENDPOINT", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "kunlunxin-smoke"),
         f"--flagosd={flagosd_binary}"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "devices: 2" in proc.stdout, proc.stdout
    assert "mm 256x128 @ 128x64 against the CPU" in proc.stdout, proc.stdout
    assert proc.stdout.strip().endswith("kunlunxin smoke: all checks passed"), proc.stdout


def test_the_p800_smoke_script_fails_without_the_sdk(flagosd_binary: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in NO_SDK and k != "FLAGOS_ENDPOINT"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "kunlunxin-smoke"),
         f"--flagosd={flagosd_binary}"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode != 0
    assert "FAILED: flagosd --backend=kunlunxin exited" in proc.stdout, proc.stdout
    assert "XPU_ROOT" in proc.stdout, proc.stdout
