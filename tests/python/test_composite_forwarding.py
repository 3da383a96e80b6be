"""Composite operators go to the daemon whole exactly when it says it runs them so.

flagosd reports at the handshake the composite operators (those with a
CompositeExplicitAutograd implementation) it runs as one call on the kernel
of their route (NegotiateResponse.composite_ops); torch_fl forwards those and
decomposes the others, as PyTorch does on a device without the kernel. A
daemon started with --decompose-ops leaves operators out of its report. What
reached the daemon is read from its own record of the client's messages
(--record-client-messages): the register_op of each operator the session ran.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from flagos_test_env import on_kunlunxin

# linalg_vector_norm's composite is the functional wrapper around its out=
# variant (CompositeExplicitAutogradNonFunctional); narrow_copy's a
# decomposition into narrow and clone (CompositeExplicitAutograd).
OPS = ("aten::linalg_vector_norm", "aten::narrow_copy")

PROGRAM = """
import torch, torch_fl
torch.manual_seed(0)
x = torch.randn(5, 7, dtype=torch.float64)
d = x.to("flagos")
norm = torch.linalg.vector_norm(d, ord=3, dim=1).cpu()
narrowed = torch.narrow_copy(d, 1, 2, 4).cpu()
torch.testing.assert_close(norm, torch.linalg.vector_norm(x, ord=3, dim=1))
assert torch.equal(narrowed, torch.narrow_copy(x, 1, 2, 4)), (narrowed, x)
print("ok")
"""


def registered_schemas(record_dir: Path) -> bytes:
    """Every byte the client sent (register_op carries each op's schema text)."""
    return b"".join(p.read_bytes() for p in sorted(record_dir.iterdir()))


def run_against(start_daemon, run_python, record_dir: Path, extra_args: list[str]) -> bytes:
    daemon = start_daemon(extra_args=[f"--record-client-messages={record_dir}", *extra_args])
    result = run_python(PROGRAM, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    assert daemon.stop() == 0, daemon.log()
    return registered_schemas(record_dir)


def test_ops_the_daemon_runs_whole_are_forwarded_as_one_call(
    start_daemon, run_python, tmp_path: Path
) -> None:
    sent = run_against(start_daemon, run_python, tmp_path, [])
    for op in OPS:
        assert f"{op}(".encode() in sent, f"{op} was not forwarded whole"
    # Not their decompositions: linalg_vector_norm's out= variant.
    assert b"aten::linalg_vector_norm.out(" not in sent


def test_ops_the_daemon_does_not_run_whole_are_decomposed(
    start_daemon, run_python, tmp_path: Path
) -> None:
    sent = run_against(start_daemon, run_python, tmp_path, [f"--decompose-ops={','.join(OPS)}"])
    for op in OPS:
        assert f"{op}(".encode() not in sent, f"{op} was forwarded, though not reported"
    # What they decompose into ran on the daemon instead.
    assert b"aten::linalg_vector_norm.out(" in sent


ADAM = """
import copy, torch, torch_fl
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
twin = copy.deepcopy(model).to("flagos")
for m in (model, twin):
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)  # foreach: a list op per step stage
    device = next(m.parameters()).device
    torch.manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(4, 6).to(device), torch.randn(4, 2).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
for a, b in zip(model.parameters(), twin.parameters()):
    torch.testing.assert_close(b.cpu(), a.detach(), rtol=1e-6, atol=1e-7)
print("ok")
"""


def test_an_optimizer_steps_foreach_lists_go_whole_to_the_cpu_backend(
    start_daemon, run_python, tmp_path: Path
) -> None:
    daemon = start_daemon(extra_args=[f"--record-client-messages={tmp_path}"])
    result = run_python(ADAM, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    assert daemon.stop() == 0, daemon.log()
    sent = registered_schemas(tmp_path)
    whole = b"aten::_foreach_addcdiv_.ScalarList(" in sent
    pieces = b"aten::addcdiv_(" in sent
    if on_kunlunxin():
        # Its cpu_fallback route does not claim the lists: decomposed, their
        # pieces may take a native route.
        assert pieces and not whole
    else:
        # One call per list: the daemon runs ATen's CPU loop over it.
        assert whole and not pieces


def test_daemon_refuses_to_decompose_an_op_that_is_not_composite(flagosd_binary: Path) -> None:
    result = subprocess.run(
        [str(flagosd_binary), "--backend=cpu", "--decompose-ops=aten::linalg_vector_norm.out",
         "--list-served-ops"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "--decompose-ops names aten::linalg_vector_norm.out" in result.stderr, result.stderr
