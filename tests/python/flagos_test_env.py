"""Which backend this test run's daemons use, and the fake vendor runtime's
variables (shared by conftest.py and the tests)."""
from __future__ import annotations

import os
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
