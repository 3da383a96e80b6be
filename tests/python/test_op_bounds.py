"""Per-op bounds (--max-op-elements, --max-op-host-memory) as a torch_fl user
meets them: out of reach of a normal program, a torch.OutOfMemoryError that
names the flag when a call goes past them, and the process goes on."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

import torch_fl  # noqa: F401  (registers "flagos")

# Runs `body` (which fills `report`) in a fresh interpreter, then a check
# that the session is still served; prints the report as JSON.
PROGRAM = """
import json, torch, torch_fl
report = {{}}
def attempt(name, fn):
    try:
        report[name] = {{"value": fn()}}
    except torch.OutOfMemoryError as e:
        report[name] = {{"error": "OutOfMemoryError", "message": str(e)}}
    except Exception as e:
        report[name] = {{"error": type(e).__name__, "message": str(e)}}
{body}
x = torch.arange(1000.0, device="flagos")
report["after"] = (x * 2).sum().item()
print(json.dumps(report))
"""


def run_report(run_python, endpoint: str, body: str) -> dict:
    proc = run_python(PROGRAM.format(body=body), env={"FLAGOS_ENDPOINT": endpoint}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["after"] == 2 * sum(range(1000)), report
    return report


def test_a_normal_workload_runs_under_the_default_bounds() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x = torch.randn(256, 64)
    target = torch.randn(256, 8)
    expected_loss = torch.nn.functional.mse_loss(model(x), target)
    model_fl = model.to("flagos")
    loss = torch.nn.functional.mse_loss(model_fl(x.to("flagos")), target.to("flagos"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), expected_loss.detach())
    # Broadcasting through expand() (stride-0 views) and kernels that copy
    # their input, at sizes a program uses.
    a = torch.randn(1 << 20)
    a_fl = a.to("flagos")
    torch.testing.assert_close((a_fl.view(1, -1).expand(8, -1) * 2).sum(dim=0).cpu(),
                               (a.view(1, -1).expand(8, -1) * 2).sum(dim=0))
    assert a_fl.median().item() == a.median().item()
    torch.testing.assert_close(a_fl.sort().values.cpu(), a.sort().values)


def test_a_kernel_past_the_host_memory_bound_raises_out_of_memory(start_daemon, run_python) -> None:
    d = start_daemon(extra_args=["--max-op-host-memory=1MiB"])
    report = run_report(run_python, d.endpoint, """
small = torch.tensor([1.0, 5.0, 3.0], device="flagos")
attempt("small", lambda: small.median().item())
big = torch.arange(1 << 20, dtype=torch.float32).to("flagos")  # 4 MiB: median copies it
attempt("big", lambda: big.median().item())
""")
    assert report["small"] == {"value": 3.0}, report
    assert report["big"]["error"] == "OutOfMemoryError", report
    message = report["big"]["message"]
    assert "aten::median: its kernel asked for 4194304 bytes of host memory" in message, message
    assert "(--max-op-host-memory=1MiB)" in message, message
    assert "start flagosd with a larger --max-op-host-memory" in message, message


def test_a_call_past_the_element_bound_raises_out_of_memory(run_python, endpoint) -> None:
    report = run_report(run_python, endpoint, """
one = torch.ones(1, device="flagos")
attempt("huge", lambda: one.expand(1 << 40).sum().item())
""")
    assert report["huge"]["error"] == "OutOfMemoryError", report
    message = report["huge"]["message"]
    # The view and the 1-element result.
    assert "aten::sum.dim_IntList: the call names 1099511627777 tensor elements" in message, message
    assert "the largest is argument 'self' (#0) with 1099511627776 elements" in message, message
    assert "start flagosd with a larger --max-op-elements" in message, message


def logged(daemon, line: str, timeout: float = 30.0) -> bool:
    """Whether `line` appears in the daemon's log within `timeout` (it logs
    the bounds just after it starts listening)."""
    if daemon.wait_for_log(line, timeout):
        return True
    print(daemon.log())
    return False


def test_the_bounds_in_force_are_logged_and_reported(start_daemon) -> None:
    d = start_daemon(extra_args=["--max-op-elements=123456", "--max-op-host-memory=3MiB"])
    smi = Path(__file__).resolve().parents[2] / "build" / "bin" / "flagos-smi"
    out = subprocess.run([str(smi), "--json"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "FLAGOS_ENDPOINT": d.endpoint})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert int(report["max_op_elements"]) == 123456, report
    assert int(report["max_op_host_memory_bytes"]) == 3 << 20, report
    assert logged(d, "per-op limits: 123456 tensor elements per call (--max-op-elements), 3MiB of "
                     "host memory per kernel (--max-op-host-memory)")
    # The defaults, from the device memory (start_daemon's 1GiB): the floors.
    default = start_daemon()
    assert logged(default, "per-op limits: 4294967296 tensor elements per call "
                           "(--max-op-elements), 1GiB of host memory per kernel "
                           "(--max-op-host-memory)")
