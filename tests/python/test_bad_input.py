"""Bad input is an error for the caller, never the end of the daemon."""

from __future__ import annotations

import json

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")

MiB = 1 << 20

# Each deliberately bad command and words its error must contain (any of).
BAD_COMMANDS = {
    "address_outside_segments": ("segment", "address"),
    "unknown_op_id": ("op",),
    "malformed_tensor_ref": ("tensor", "stride", "size", "rank"),
    "altered_schema": ("schema",),
}


def assert_daemon_still_serves() -> None:
    a = torch.arange(12.0).view(3, 4)
    result = (a.to("flagos") * 2 + 1).sum(dim=0)
    torch.testing.assert_close(result.cpu(), (a * 2 + 1).sum(dim=0), rtol=0, atol=0)


@pytest.mark.parametrize("kind", sorted(BAD_COMMANDS))
def test_bad_command_raises_an_informative_runtime_error(kind: str) -> None:
    torch.ones(1, device="flagos")  # a live session
    with pytest.raises(RuntimeError) as info:
        torch_fl._C._test_bad_command(kind)
    message = str(info.value).lower()
    assert any(word in message for word in BAD_COMMANDS[kind]), message


@pytest.mark.parametrize("kind", sorted(BAD_COMMANDS))
def test_daemon_keeps_serving_after_a_bad_command(kind: str) -> None:
    torch.ones(1, device="flagos")
    with pytest.raises(RuntimeError):
        torch_fl._C._test_bad_command(kind)
    assert_daemon_still_serves()


def test_an_op_whose_schema_differs_in_the_clients_torch_is_refused() -> None:
    # Version skew: a client on another torch minor whose schema for an op
    # changed would have its arguments read in the wrong places.
    torch.ones(1, device="flagos")
    with pytest.raises(RuntimeError) as info:
        torch_fl._C._test_bad_command("altered_schema")
    daemon_torch = torch_fl._C._daemon_info()["torch_version"]
    client_torch = torch.__version__.split("+")[0]
    own = str(torch.ops.aten.add.Tensor._schema)
    assert (
        "register_op aten::add.Tensor: the client's schema differs from flagosd's, so its "
        "arguments would be read in the wrong places. client (torch " + client_torch + "): "
        "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=2) -> Tensor; "
        "flagosd (torch " + daemon_torch + "): " + own + "."
    ) in str(info.value)
    # The session goes on, and add itself (registered with its real schema) works.
    assert_daemon_still_serves()
    torch.testing.assert_close(
        torch.add(torch.ones(2, device="flagos"), torch.ones(2, device="flagos")).cpu(),
        torch.full((2,), 2.0),
    )


def test_raw_resize_of_an_empty_tensor_is_refused_on_every_route() -> None:
    # Its storage is no memory: the cpu backend's native route and a device's
    # cpu_fallback route (whose host copy of it is no memory either) refuse
    # alike, instead of resizing a host copy and answering OK.
    with pytest.raises(RuntimeError, match="not resizable"):
        torch_fl._C._test_bad_command("resize_empty")
    assert_daemon_still_serves()


def test_unknown_bad_command_kind_is_rejected_by_the_hook() -> None:
    with pytest.raises((RuntimeError, ValueError)):
        torch_fl._C._test_bad_command("no_such_kind")


# Shape errors come from the meta kernels that infer output shapes in the
# client (some written in Python, worded differently from the CPU kernels);
# what matters is that they are raised by the call itself, naming the sizes.
def test_shape_mismatch_raises_at_the_call_site() -> None:
    a = torch.ones(3, device="flagos")
    b = torch.ones(4, device="flagos")
    with pytest.raises(RuntimeError, match=r"must match the size|broadcast.*\[4\]"):
        torch.add(a, b)
    assert_daemon_still_serves()


def test_matmul_shape_error_raises_at_the_call_site() -> None:
    a = torch.ones(2, 3, device="flagos")
    with pytest.raises(RuntimeError, match=r"cannot be multiplied|same reduction dim.*\[2, 3\]"):
        a @ a
    assert_daemon_still_serves()


OOM_PROGRAM = f"""
import json, torch, torch_fl
report = {{}}
try:
    torch.empty({256 * MiB}, dtype=torch.uint8, device="flagos")
except torch.OutOfMemoryError as e:
    report["error"] = "OutOfMemoryError"
    report["message"] = str(e)
except Exception as e:
    report["error"] = type(e).__name__
    report["message"] = str(e)
else:
    report["error"] = None
x = torch.arange(1000.0, device="flagos")
report["after"] = (x * 2).sum().item()
print(json.dumps(report))
"""


def test_allocation_beyond_device_memory_raises_out_of_memory_and_the_process_continues(
    start_daemon, run_python
) -> None:
    small = start_daemon(device_memory="64MiB")
    proc = run_python(OOM_PROGRAM, env={"FLAGOS_ENDPOINT": small.endpoint}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["error"] == "OutOfMemoryError", report
    assert report["after"] == 2 * sum(range(1000))
