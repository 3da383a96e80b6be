"""Asynchronous errors: reported at the next synchronisation point, or at
the offending call itself with FLAGOS_LAUNCH_BLOCKING=1."""

from __future__ import annotations

import json

# An index out of range passes shape inference (the index values are data)
# and fails in the daemon, asynchronously. The snippet reports the line that
# raised and the message.
SNIPPET = """
import json, sys, traceback, torch, torch_fl
a = torch.ones(4, device="flagos")
idx = torch.tensor([0, 9], device="flagos")
try:
    b = a[idx]                      # line 6: the offending call
    c = a + 1                       # line 7
    torch.flagos.synchronize()      # line 8
except RuntimeError as e:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<string>"]
    print(json.dumps({"line": frames[-1].lineno, "message": str(e)}))
    print(json.dumps({"after": (a * 2).cpu().tolist()}))
"""


def run(run_python, blocking: bool) -> list[dict]:
    env = {"FLAGOS_LAUNCH_BLOCKING": "1" if blocking else None}
    out = run_python(SNIPPET, env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_async_error_surfaces_at_the_next_synchronisation_point(run_python) -> None:
    report, after = run(run_python, blocking=False)
    assert report["line"] == 8
    assert "aten::index" in report["message"]
    assert "index 9 is out of bounds" in report["message"]
    assert after["after"] == [2.0, 2.0, 2.0, 2.0]  # the session goes on


def test_launch_blocking_raises_at_the_offending_call(run_python) -> None:
    report, after = run(run_python, blocking=True)
    assert report["line"] == 6
    assert "index 9 is out of bounds" in report["message"]
    assert after["after"] == [2.0, 2.0, 2.0, 2.0]
