"""--backend=auto on a node with Kunlun P800 device nodes: when the vendor
runtime does not load, flagosd fails at start naming the library and the
variable to set, and never comes up on emulated CPU devices. Without device
nodes it takes the cpu backend; with them and a runtime that loads (the fake
libxpurt), kunlunxin.

The device nodes are files in a temporary directory, which the test-only
variable FLAGOS_XPU_DEVICE_GLOB points flagosd at instead of /dev/xpu*."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from flagos_test_env import FAKE_XPU_ROOT


def auto_daemon(binary: Path, tmp_path: Path, glob: str, xpu_root: Path,
                timeout: float = 60) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLAGOS_KUNLUNXIN_XPURT", "FLAGOS_KUNLUNXIN_XDNN_LIB_DIR", "LD_LIBRARY_PATH")}
    env.update(FLAGOS_XPU_DEVICE_GLOB=glob, XPU_ROOT=str(xpu_root), FAKE_XPU_DEVICES="2",
               FAKE_XPU_MEMORY=str(64 << 20))
    return subprocess.Popen(
        [str(binary), f"--listen=unix://{tmp_path}/d.sock", "--backend=auto",
         "--cpu-devices=2", "--device-memory=64MiB", "--metrics-listen="],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ready_line(proc: subprocess.Popen[str]) -> str:
    line = proc.stdout.readline()
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return line


@pytest.fixture
def p800_node(tmp_path: Path) -> str:
    """Device nodes as a P800 node has them (the driver's /dev/xpuN and /dev/xpuctrl)."""
    nodes = tmp_path / "dev"
    nodes.mkdir()
    for name in ("xpu0", "xpu1", "xpuctrl"):
        (nodes / name).touch()
    return str(nodes / "xpu*")


def test_a_p800_node_whose_runtime_does_not_load_fails_the_start(
        flagosd_binary: Path, tmp_path: Path, p800_node: str) -> None:
    empty_sdk = tmp_path / "sdk"
    (empty_sdk / "so").mkdir(parents=True)
    proc = auto_daemon(flagosd_binary, tmp_path, p800_node, empty_sdk)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "listening on" not in out, out
    nodes = Path(p800_node).parent
    assert err.startswith(
        f"flagosd: --backend=auto: this node has Kunlun P800 device nodes ({nodes}/xpu0, "
        f"{nodes}/xpu1, {nodes}/xpuctrl) but the kunlunxin backend cannot start: "), err
    # The kunlunxin error: the library, where it looked, the variables.
    assert "libxpurt.so.2" in err and f"{empty_sdk}/so" in err, err
    assert "set XPU_ROOT" in err and "FLAGOS_KUNLUNXIN_XPURT" in err, err
    assert err.rstrip().endswith(
        "flagosd does not fall back to emulated devices on a P800 node; to emulate on the CPU "
        "anyway, start it with --backend=cpu"), err


def test_without_device_nodes_auto_takes_the_cpu_backend(
        flagosd_binary: Path, tmp_path: Path) -> None:
    empty_sdk = tmp_path / "sdk"
    (empty_sdk / "so").mkdir(parents=True)
    proc = auto_daemon(flagosd_binary, tmp_path, str(tmp_path / "no-dev" / "xpu*"), empty_sdk)
    line = ready_line(proc)
    assert "listening on" in line and "(backend cpu, 2 devices x 64MiB)" in line, line


def test_with_device_nodes_and_a_runtime_that_loads_auto_takes_kunlunxin(
        flagosd_binary: Path, tmp_path: Path, p800_node: str) -> None:
    assert (FAKE_XPU_ROOT / "so" / "libxpurt.so.2").is_file(), \
        "the fake libxpurt is missing: build it with scripts/build fake_xpurt"
    proc = auto_daemon(flagosd_binary, tmp_path, p800_node, FAKE_XPU_ROOT)
    line = ready_line(proc)
    assert "listening on" in line and "(backend kunlunxin, 2 devices x 64MiB)" in line, line
