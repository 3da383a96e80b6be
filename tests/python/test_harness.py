"""The harness itself: a run whose flagosd does not exit 0 when conftest.py
stops it fails, though every test passed. That is how scripts/sanitize's
pytest pass fails on a leak or an error its ASan flagosd reports at exit; it
must hold in one process and on pytest-xdist workers (scripts/test runs
`pytest -n N`), whose own exit status pytest-xdist does not pass on.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flagos_test_env import REPO


@pytest.mark.parametrize(("workers", "exit_code"), [("0", 3), ("1", 3), ("1", 0)],
                         ids=["one process", "xdist worker", "xdist worker, daemon exits 0"])
def test_a_daemon_that_does_not_exit_0_at_its_stop_fails_the_run(
    tmp_path: Path, flagosd_binary: Path, workers: str, exit_code: int
) -> None:
    # The run's flagosd, made to exit `exit_code` on SIGTERM once it stopped.
    daemon = tmp_path / "flagosd-wrapper"
    daemon.write_text(f"""#!/bin/bash
"{flagosd_binary}" "$@" &
pid=$!
trap 'kill -TERM $pid; wait $pid; exit {exit_code}' TERM
wait $pid
""")
    daemon.chmod(0o755)
    (tmp_path / "test_passes.py").write_text("def test_passes():\n    pass\n")
    python_path = [str(REPO / "tests" / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, FLAGOS_DAEMON=str(daemon), PYTHONPATH=os.pathsep.join(python_path))
    env.pop("FLAGOS_ENDPOINT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-p", "conftest", "-n", workers, "test_passes.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout, output
    stop_failure = f"the test flagosd exited with {exit_code} on SIGTERM (expected 0)"
    if exit_code == 0:
        assert proc.returncode == 0, output
        assert "on SIGTERM (expected 0)" not in output
    else:
        assert proc.returncode == 1, output
        assert stop_failure in proc.stderr, output
