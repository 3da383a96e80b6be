"""A session sees only its own memory, and a dead client leaks nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")

POLL_S = 10.0

# Process A: puts known bytes on flagos:0, checks it can read them through the
# test hook itself (positive control), reports where they are, then waits
# until its stdin closes.
HOLDER = """
import json, sys, torch, torch_fl
x = torch.arange(1024, dtype=torch.int32).to("flagos")   # 4 KiB
big = torch.ones(4 << 20, device="flagos")               # 16 MiB more
torch.flagos.synchronize()
own = torch_fl._C._test_read_device(x.data_ptr(), x.nbytes, x.device.index)
print(json.dumps({
    "addr": x.data_ptr(), "nbytes": x.nbytes, "device": x.device.index,
    "session": torch_fl._C._session_id(),
    "own_read_ok": own == torch.arange(1024, dtype=torch.int32).numpy().tobytes(),
}), flush=True)
sys.stdin.read()
"""


def wait_for(predicate: Callable[[], bool], timeout: float = POLL_S) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def used_memory() -> list[int]:
    return [d["used_memory"] for d in torch_fl.daemon_stats()["devices"]]


def session_ids() -> set[int]:
    return {s["id"] for s in torch_fl.daemon_stats()["sessions"]}


class Holder:
    def __init__(self, proc: subprocess.Popen[str], report: dict) -> None:
        self.proc = proc
        self.addr: int = report["addr"]
        self.nbytes: int = report["nbytes"]
        self.device: int = report["device"]
        self.session: int = report["session"]
        self.own_read_ok: bool = report["own_read_ok"]


@pytest.fixture
def own_session() -> Iterator[int]:
    """This process's session, with memory of its own, alone on the daemon."""
    mine = torch.arange(256, dtype=torch.int32, device="flagos")
    torch.flagos.synchronize()
    me = torch_fl._C._session_id()
    # Sessions of earlier tests' children may still be closing (and hold
    # their memory until they are gone).
    assert wait_for(
        lambda: session_ids() == {me} and not torch_fl.daemon_stats()["closing_sessions"]
    ), torch_fl.daemon_stats()
    yield me
    del mine


@pytest.fixture
def holder(own_session: int, spawn_python, read_line) -> Iterator[Holder]:
    proc = spawn_python(HOLDER)
    line = read_line(proc)
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"process A failed before reporting:\n{err}")
    yield Holder(proc, json.loads(line))


def test_owner_can_read_its_own_memory_through_the_hook(holder: Holder) -> None:
    assert holder.own_read_ok


def test_another_session_cannot_read_that_memory(holder: Holder) -> None:
    with pytest.raises(RuntimeError, match="segment"):
        torch_fl._C._test_read_device(holder.addr, holder.nbytes, holder.device)


def test_this_session_reads_its_own_memory_through_the_hook(own_session: int) -> None:
    x = torch.arange(64, dtype=torch.int64, device="flagos")
    torch.flagos.synchronize()
    data = torch_fl._C._test_read_device(x.data_ptr(), x.nbytes, 0)
    assert data == torch.arange(64, dtype=torch.int64).numpy().tobytes()


def test_each_client_process_has_a_session_with_its_pid(holder: Holder) -> None:
    sessions = {s["id"]: s for s in torch_fl.daemon_stats()["sessions"]}
    assert holder.session in sessions
    assert sessions[holder.session]["pid"] == holder.proc.pid
    assert sessions[holder.session]["segment_bytes"] >= 16 << 20


def test_killed_client_releases_its_memory_and_session(
    own_session: int, spawn_python, read_line
) -> None:
    baseline = used_memory()
    proc = spawn_python(HOLDER)
    line = read_line(proc)
    if not line:
        proc.kill()
        pytest.fail(f"process A failed before reporting:\n{proc.communicate(timeout=30)[1]}")
    report = json.loads(line)
    assert used_memory()[0] > baseline[0]
    assert report["session"] in session_ids()

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    assert wait_for(lambda: used_memory() == baseline), (used_memory(), baseline)
    assert wait_for(lambda: report["session"] not in session_ids()), session_ids()


# Process B for the clearing test: fills 16 MiB with a marker, reports where,
# waits to be killed.
MARKER_HOLDER = """
import json, sys, torch, torch_fl
marker = torch.full((16 << 20,), 0x5A, dtype=torch.uint8, device="flagos")
torch.flagos.synchronize()
print(json.dumps({"addr": marker.data_ptr(), "nbytes": marker.nbytes}), flush=True)
sys.stdin.read()
"""


def test_a_new_segment_never_holds_another_sessions_bytes(
    own_session: int, spawn_python, read_line
) -> None:
    # A device's allocator hands out memory another session freed (the fake
    # libxpurt's does, like a real one): flagosd clears it first.
    baseline = used_memory()
    proc = spawn_python(MARKER_HOLDER)
    line = read_line(proc)
    if not line:
        proc.kill()
        pytest.fail(f"process B failed before reporting:\n{proc.communicate(timeout=30)[1]}")
    marker = json.loads(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert wait_for(lambda: used_memory() == baseline), (used_memory(), baseline)

    torch.flagos.empty_cache()  # this process's next block is a new segment
    fresh = torch.empty(16 << 20, dtype=torch.uint8, device="flagos")
    start, end = fresh.data_ptr(), fresh.data_ptr() + fresh.nbytes
    overlaps = start < marker["addr"] + marker["nbytes"] and marker["addr"] < end
    values = fresh.cpu()
    assert int(values.count_nonzero()) == 0, (
        f"a new segment holds {int((values == 0x5A).sum())} marker bytes of a dead session "
        f"(its memory {'overlaps' if overlaps else 'does not overlap'} the marker's)"
    )
