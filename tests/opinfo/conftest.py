"""pytest harness for tests/opinfo: a flagosd, and Sweepers whose workers run the entries.

The daemon: the one FLAGOS_ENDPOINT names when it is set (so that
`pytest tests/python tests/opinfo` shares tests/python's daemon: this
pytest_configure runs after that one), else one started here with
tests/python/conftest.py's Daemon and stopped at the end. The entries run in
a worker process guarded by driver.Sweeper, never in the pytest process, so a
crashing operator fails its test instead of the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from driver import DaemonHandle, Sweeper, signal_name  # noqa: E402
sys.path.append(str(HERE.parent / "python"))
from flagos_test_env import is_xdist_controller  # noqa: E402
from families import MIXED_SUBSET_MAX_SAMPLES, MODULE_SUBSET_MAX_SAMPLES  # noqa: E402

SUBSET_MAX_SAMPLES = 8  # as scripts/op-sweep
SUBSET_TIMEOUT_S = 60.0  # per (entry, dtype) for operators, per sample for modules (as the sweeps)

_daemon: DaemonHandle | None = None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _daemon
    if _daemon is not None or is_xdist_controller(config):
        return
    try:
        _daemon = DaemonHandle(os.environ.get("FLAGOS_ENDPOINT") or None)
    except (RuntimeError, FileNotFoundError) as e:
        pytest.exit(f"tests/opinfo could not start flagosd: {e}", returncode=4)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _daemon
    if _daemon is not None:
        code = _daemon.stop()
        if code != 0:
            sys.stderr.write(f"\ntests/opinfo: its flagosd stopped with {signal_name(code)}\n")
        _daemon = None


# Each sweeper serves one file and is module-scoped: its worker process holds
# a session on the run's daemon, which ends with its file (under pytest -n a
# worker runs its files one after another in any order, and
# tests/python/test_isolation.py needs the daemon to itself).
@pytest.fixture(scope="module")
def sweeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweeper]:
    """Runs OpInfo entries against the run's flagosd, at most SUBSET_MAX_SAMPLES samples each."""
    assert _daemon is not None
    s = Sweeper(_daemon, tmp_path_factory.mktemp("opinfo-logs"), SUBSET_MAX_SAMPLES, SUBSET_TIMEOUT_S)
    yield s
    s.close()


@pytest.fixture(scope="module")
def module_sweeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweeper]:
    """Runs ModuleInfo entries against the run's flagosd, at most MODULE_SUBSET_MAX_SAMPLES samples each."""
    assert _daemon is not None
    s = Sweeper(_daemon, tmp_path_factory.mktemp("module-logs"), MODULE_SUBSET_MAX_SAMPLES, SUBSET_TIMEOUT_S,
                suite="modules", per_sample=True)
    yield s
    s.close()


@pytest.fixture(scope="module")
def mixed_sweeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweeper]:
    """Runs OpInfo entries of the mixed-operand sweep against the run's flagosd."""
    assert _daemon is not None
    s = Sweeper(_daemon, tmp_path_factory.mktemp("mixed-logs"), MIXED_SUBSET_MAX_SAMPLES, SUBSET_TIMEOUT_S,
                suite="mixed")
    yield s
    s.close()
