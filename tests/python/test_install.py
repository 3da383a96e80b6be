"""torch_fl installs like a PyTorch device backend: `pip install .` (the one
command docs/usage.md gives) into a fresh virtual environment, with pip's
build isolation, builds against the environment's torch; then `import torch`
alone registers the device (PyTorch's `torch.backends` entry point), and
TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off.

The environment sees the system's packages (--system-site-packages), so the
installed torch is the one the run uses and nothing large is downloaded; only
scikit-build-core goes into pip's isolated build environment. The build
reuses <repo>/build-pip between runs and the objects the tree's own build
compiled (ccache, with that build's compilers): after scripts/build the
whole file took 39 s on 2 shared cores with build-pip/ absent (every
compilation a ccache hit), 44 s with it present.

Every check runs the environment's interpreter in another directory without
PYTHONPATH, so torch_fl can only come from the installed package.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from flagos_test_env import REPO

BUILD_DIR = REPO / "build-pip"
PIP_TIMEOUT_S = 1500


def tree_compilers() -> dict[str, str]:
    """CC and CXX as the tree's build (scripts/build) configured them: ccache
    keys include the compiler's name, and scikit-build-core would otherwise
    take Python's (gcc, g++) where CMake took cc, c++."""
    cache = REPO / "build" / "CMakeCache.txt"
    if not cache.exists():
        return {}
    found = {}
    for line in cache.read_text().splitlines():
        for var, key in (("CMAKE_C_COMPILER:FILEPATH=", "CC"), ("CMAKE_CXX_COMPILER:FILEPATH=", "CXX")):
            if line.startswith(var):
                found[key] = line[len(var):]
    return found


def clean_env(overrides: Mapping[str, str | None] = {}) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        check=True, timeout=120, env=clean_env(),
    )
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # This run's interpreter is itself a virtual environment, whose
        # packages (torch) --system-site-packages does not reach: a .pth
        # file adds them.
        site_packages = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, env=clean_env(),
        ).stdout.strip()
        import sysconfig
        outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        (Path(site_packages) / "flagos_test_outer_env.pth").write_text("\n".join(sorted(outer)) + "\n")
    BUILD_DIR.mkdir(exist_ok=True)
    env = clean_env({
        "CCACHE_BASEDIR": str(REPO),
        "CCACHE_NOHASHDIR": "1",
        "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("FLAGOS_JOBS") or str(os.cpu_count() or 2),
        **tree_compilers(),
    })
    # One pip build at a time in build-pip (pytest runs of several shells).
    with open(BUILD_DIR / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "--no-input",
             # The tree's build type, so its objects are reused.
             "-C", f"build-dir={BUILD_DIR}",
             "-C", "cmake.define.CMAKE_BUILD_TYPE=RelWithDebInfo",
             str(REPO)],
            cwd=venv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=PIP_TIMEOUT_S,
        )
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-4000:]}\n{pip.stderr[-4000:]}"
    yield python


def run_installed(python: Path, code: str, cwd: Path,
                  env: Mapping[str, str | None] = {}) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code], cwd=cwd, env=clean_env(env), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120,
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pip_install_puts_package_daemon_and_smi_in_the_environment(
        venv_python: Path, tmp_path: Path, endpoint: str) -> None:
    info = last_json(run_installed(venv_python, """
import json, sys, torch, torch_fl, torch_fl._endpoint as e
print(json.dumps({"torch_fl": torch_fl.__file__, "torch": torch.__file__,
                  "daemon": e.find_daemon_binary(), "prefix": sys.prefix}))
""", tmp_path))
    prefix = Path(info["prefix"])
    assert prefix == venv_python.parent.parent
    assert Path(info["torch_fl"]).is_relative_to(prefix)
    # The daemon a private session starts is the package's own.
    assert Path(info["daemon"]) == Path(info["torch_fl"]).parent / "bin" / "flagosd"
    # torch is the system's, the one this run uses: not a second copy.
    import torch
    import torch_fl
    assert Path(info["torch"]) == Path(torch.__file__)
    # flagos-smi on the environment's PATH reports the run's daemon.
    smi = subprocess.run([str(prefix / "bin" / "flagos-smi"), f"--endpoint={endpoint}", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert smi.returncode == 0, smi.stderr
    reported = json.loads(smi.stdout)
    expected = torch_fl.daemon_stats(endpoint)
    assert reported["backend"] == expected["backend"]
    assert [d["name"] for d in reported["devices"]] == [d["name"] for d in expected["devices"]]
    # The source tree keeps its own extension (a pip build installs, it does
    # not write into plugin/torch_fl).
    assert not Path(info["torch_fl"]).is_relative_to(REPO)


def test_import_torch_alone_registers_and_runs_flagos(
        venv_python: Path, tmp_path: Path, endpoint: str) -> None:
    out = last_json(run_installed(venv_python, """
import json, sys
import torch
autoloaded = "torch_fl" in sys.modules
x = torch.ones(2, device="flagos")
y = (x * 3 + 1).cpu()
print(json.dumps({"autoloaded": autoloaded, "device": str(torch.device("flagos", 1)),
                  "accelerator": str(torch.accelerator.current_accelerator()),
                  "flagos": y.tolist(), "cpu": (torch.ones(2) * 3 + 1).tolist(),
                  "endpoint": sys.modules["torch_fl"].endpoint()}))
""", tmp_path, {"FLAGOS_ENDPOINT": endpoint}))
    assert out["autoloaded"] is True
    assert out["device"] == "flagos:1"
    assert out["accelerator"] == "flagos"
    assert out["flagos"] == out["cpu"] == [4.0, 4.0]
    assert out["endpoint"] == endpoint


def test_autoload_off_leaves_torch_fl_unimported(venv_python: Path, tmp_path: Path,
                                                 endpoint: str) -> None:
    code = """
import json, sys
import torch
before = "torch_fl" in sys.modules
try:
    torch.ones(1, device="flagos")
    error = None
except RuntimeError as e:
    error = str(e).splitlines()[0]
import torch_fl  # an explicit import still works
after = torch.ones(2, device="flagos").cpu().tolist()
print(json.dumps({"before": before, "error": error, "after": after}))
"""
    out = last_json(run_installed(venv_python, code, tmp_path, {
        "FLAGOS_ENDPOINT": endpoint, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}))
    assert out["before"] is False
    # torch without the backend: "flagos" is no device type.
    assert out["error"] is not None
    assert out["error"].startswith("Expected one of cpu"), out["error"]
    assert out["error"].endswith("device type at start of device string: flagos"), out["error"]
    assert out["after"] == [1.0, 1.0]


def test_import_torch_needs_no_daemon(venv_python: Path, tmp_path: Path) -> None:
    # The device is registered at import; the daemon is reached at the first
    # use, whose error names the endpoint.
    missing = f"unix://{tmp_path}/no-daemon.sock"
    out = last_json(run_installed(venv_python, """
import json, sys
import torch
registered = torch._C._get_privateuse1_backend_name()
try:
    torch.ones(1, device="flagos")
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps({"registered": registered, "error": error}))
""", tmp_path, {"FLAGOS_ENDPOINT": missing}))
    assert out["registered"] == "flagos"
    assert out["error"] is not None
    assert out["error"].startswith(f"flagosd at {missing} is not reachable"), out["error"]
