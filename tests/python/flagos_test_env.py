"""Which backend this test run's daemons use, and the fake vendor runtime's
variables (shared by conftest.py and the tests)."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_backend() -> str:
    """The backend every test daemon runs: FLAGOS_BACKEND (cpu by default).

    scripts/test runs the suite a second time with FLAGOS_BACKEND=kunlunxin
    against the fake libxpurt (tests/fakes/xpurt), whose variables it sets.
    """
    return os.environ.get("FLAGOS_BACKEND", "").strip() or "cpu"


def on_kunlunxin() -> bool:
    return run_backend() == "kunlunxin"


# The test-only fake libxpurt (tests/fakes/xpurt), laid out as an SDK root.
FAKE_XPU_ROOT = REPO / "build" / "tests" / "fakes" / "xpu"


def fake_xpu_env(**fake: str) -> dict[str, str]:
    """Variables that make a flagosd's kunlunxin backend load the fake runtime;
    keyword arguments add FAKE_XPU_<NAME> settings (delay_us=..., fail=...)."""
    env = {"XPU_ROOT": str(FAKE_XPU_ROOT)}
    for name, value in fake.items():
        env[f"FAKE_XPU_{name.upper()}"] = value
    return env


_UNITS = {"": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TIB": 1 << 40}


def parse_bytes(text: str) -> int:
    """'1GiB' -> 1073741824 (the --device-memory syntax)."""
    number = text.rstrip("KMGTiBkmgtib")
    return int(float(number) * _UNITS[text[len(number):].upper()])


def free_tcp_port() -> int:
    """A loopback TCP port nothing listens on now (for a daemon's --listen)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_xdist_controller(config) -> bool:
    """True in the process of `pytest -n N` (pytest-xdist) that only hands tests
    to its workers: it runs none, so it starts no flagosd; each worker starts its own."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def project_version() -> str:
    """The version CMakeLists.txt gives the project (`project(flagos VERSION x.y.z ...)`)."""
    match = re.search(r"project\(flagos VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert match, "CMakeLists.txt names no project version"
    return match.group(1)


def build_type() -> str:
    """CMAKE_BUILD_TYPE of build/ (its CMakeCache.txt)."""
    for line in (REPO / "build" / "CMakeCache.txt").read_text().splitlines():
        if line.startswith("CMAKE_BUILD_TYPE:"):
            return line.split("=", 1)[1]
    raise AssertionError("build/CMakeCache.txt has no CMAKE_BUILD_TYPE")


def help_flags(help_text: str) -> dict[str, str]:
    """{dashed name: default} of the flags a tool's --help lists (`  --name=DEFAULT`
    lines; --help and --version have none and map to '')."""
    return {name: default for name, default in
            re.findall(r"^  --([a-z][a-z0-9-]*)(?:=(.*))?$", help_text, re.M)}


def source_flags(source: Path) -> list[str]:
    """The dashed names of the ABSL_FLAGs defined in a source file."""
    return [name.replace("_", "-")
            for name in re.findall(r"ABSL_FLAG\(\s*[^,]+,\s*(\w+)\s*,", source.read_text())]
