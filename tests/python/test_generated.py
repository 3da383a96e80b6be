"""Files generated from the code stay in step with it: each backend's
ops.conf (scripts/gen-ops-conf), docs/reference/backends.md
(scripts/gen-backends-doc, from flagosd --describe-backend) and
docs/reference/served-operators.md (scripts/gen-served-ops-doc, from flagosd
--list-served-ops)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from flagos_test_env import REPO, on_kunlunxin

pytestmark = pytest.mark.skipif(on_kunlunxin(), reason="checked once, in the cpu pass")


@pytest.mark.parametrize("script", ["gen-ops-conf", "gen-backends-doc", "gen-served-ops-doc"])
def test_regenerating_changes_nothing(script: str) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
