"""flagos tensors shared between processes (torch.multiprocessing), with
CUDA IPC's semantics: the receiver gets a tensor over the same device
memory, no copy; the memory lives until every holder released it; a crashed
holder releases its share; grants go only to processes of the same user.

Each scenario runs in a fresh interpreter whose children are started with
the spawn method (a forked child cannot use its parent's session, as with
CUDA); the child bodies are in sharing_workers.py.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

PRELUDE = f"""
import sys, time
sys.path.insert(0, {str(HERE)!r})
import torch, torch_fl
import torch.multiprocessing as mp
import sharing_workers as w
ctx = mp.get_context("spawn")

def my_session():
    sid = torch_fl._C._session_id()
    return [s for s in torch_fl.daemon_stats()["sessions"] if s["id"] == sid][0]

def used(device=0):
    return torch_fl.daemon_stats()["devices"][device]["used_memory"]

def wait_until_released(base_used, base_reserved):
    # The daemon ends sessions and releases holds asynchronously: poll.
    deadline = time.monotonic() + 20
    while True:
        torch.flagos.empty_cache()
        if torch.flagos.memory_reserved() == base_reserved and used() == base_used:
            return
        assert time.monotonic() < deadline, (torch.flagos.memory_reserved(), used(), base_used)
        time.sleep(0.1)

def get(q, p, timeout=120):
    # q.get(), failing at once if the child `p` died without answering.
    import queue
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=0.2)
        except queue.Empty:
            if not p.is_alive():
                raise AssertionError(f"the child exited ({{p.exitcode}}) without answering")
            if time.monotonic() > deadline:
                raise
"""


def run_scenario(run_python, body: str, timeout: float = 180.0) -> str:
    proc = run_python(PRELUDE + body, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_a_queue_carries_a_flagos_tensor_over_the_same_memory(run_python):
    out = run_scenario(run_python, """
n = 1 << 18
t = w.expected_values(n).to("flagos")
inbox, outbox = ctx.Queue(), ctx.Queue()
p = ctx.Process(target=w.double_in_place, args=(inbox, outbox))
p.start()
inbox.put(t)
ok, imported_bytes, imported_segments = get(outbox, p)
p.join(60)
assert p.exitcode == 0, p.exitcode
assert ok, "the child read other values than were sent"
# The child held the parent's segment (1 MiB of floats: one 2 MiB segment).
assert imported_segments == 1 and imported_bytes == 2 << 20, (imported_segments, imported_bytes)
# The child's in-place write is in the parent's tensor: one memory, no copy.
torch.testing.assert_close(t.cpu(), w.expected_values(n) * 2, rtol=0, atol=0)
print("shared ok")
""")
    assert "shared ok" in out


def test_model_share_memory_trains_the_parents_parameters(run_python):
    """The Hogwild pattern of PyTorch's multiprocessing notes: children
    train the parent's model in place (one after the other here, so the
    result is exact), checked against the same steps on the CPU."""
    out = run_scenario(run_python, """
torch.manual_seed(0)
cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
model.load_state_dict(cpu_model.state_dict())
model.to("flagos").share_memory()
batches = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(6)]
for part in (batches[:3], batches[3:]):
    xs, ys = [b[0] for b in part], [b[1] for b in part]
    p = ctx.Process(target=w.train_steps, args=(model, xs, ys, 0.1))
    p.start()
    p.join(120)
    assert p.exitcode == 0, p.exitcode
    opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    for x, y in part:
        opt.zero_grad()
        torch.nn.functional.mse_loss(cpu_model(x), y).backward()
        opt.step()
for (name, a), b in zip(model.state_dict().items(), cpu_model.state_dict().values()):
    torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=name)
print("hogwild ok")
""")
    assert "hogwild ok" in out


def test_the_memory_outlives_the_senders_tensor_until_the_receiver_releases_it(run_python):
    out = run_scenario(run_python, """
torch.flagos.empty_cache()
base_used, base_reserved = used(), torch.flagos.memory_reserved()
n = 1 << 16
t = torch.full((n,), 7.0, device="flagos")
inbox, outbox = ctx.Queue(), ctx.Queue()
p = ctx.Process(target=w.hold_until_told, args=(inbox, outbox))
p.start()
inbox.put(t)
assert get(outbox, p) == "holding"
del t
# Without the receiver's hold the allocator would hand t's block out again
# here, and the receiver would read zeros.
churn = [torch.zeros(n, device="flagos") for _ in range(8)]
torch.flagos.synchronize()
inbox.put("check")
assert get(outbox, p) is True, "the receiver's tensor was overwritten"
assert get(outbox, p) == "released"
p.join(60)
assert p.exitcode == 0
del churn
# The receiver released its hold: the block goes back, and the segment with it.
wait_until_released(base_used, base_reserved)
print("lifetime ok")
""")
    assert "lifetime ok" in out


def test_a_receiver_that_crashes_releases_its_share(run_python):
    out = run_scenario(run_python, """
torch.flagos.empty_cache()
base_used, base_reserved = used(), torch.flagos.memory_reserved()
t = torch.ones(1 << 20, device="flagos")  # 4 MiB: a segment of its own
inbox, outbox = ctx.Queue(), ctx.Queue()
p = ctx.Process(target=w.die_holding, args=(inbox, outbox))
p.start()
inbox.put(t)
assert get(outbox, p) == float(1 << 20)
p.join(60)
assert p.exitcode == -9, p.exitcode
del t
wait_until_released(base_used, base_reserved)
print("crash ok")
""")
    assert "crash ok" in out


def test_a_tensor_sent_to_its_own_process_is_the_same_storage(run_python):
    out = run_scenario(run_python, """
from multiprocessing.reduction import ForkingPickler
import pickle
torch.flagos.empty_cache()
t = torch.arange(10, dtype=torch.float32, device="flagos")
back = pickle.loads(ForkingPickler.dumps(t))
assert back.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
back[0] = 42.0
assert t[0].item() == 42.0
# Plain pickle copies, as for CUDA tensors.
copy = pickle.loads(pickle.dumps(t))
assert copy.device.type == "flagos" and torch.equal(copy.cpu(), t.cpu())
copy[1] = -1.0
assert t[1].item() == 1.0
# Nothing is kept for a receiver that is not coming.
del t, back, copy
torch.flagos.empty_cache()
assert torch.flagos.memory_reserved() == 0, torch.flagos.memory_reserved()
print("same process ok")
""")
    assert "same process ok" in out


def test_a_non_leaf_tensor_that_requires_grad_is_refused_as_torch_refuses_it(run_python):
    out = run_scenario(run_python, """
from multiprocessing.reduction import ForkingPickler
x = torch.ones(3, device="flagos", requires_grad=True) * 2
try:
    ForkingPickler.dumps(x)
except RuntimeError as e:
    assert "Cowardly refusing to serialize non-leaf tensor" in str(e), e
    print("refused ok")
""")
    assert "refused ok" in out


NOBODY = 65534


def open_to_everyone(daemon) -> None:
    """Lets another user reach the daemon's sockets (a test daemon's are
    0600), once flagosd has set their modes itself (after "listening on")."""
    assert daemon.wait_for_log("listening on", timeout=20), daemon.log()
    os.chmod(daemon.workdir, 0o755)
    for sock in (daemon.socket, Path(f"{daemon.socket}.staging")):
        os.chmod(sock, 0o666)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (util-linux) to run a client as another user; "
                           "CI runs as root")
def test_a_process_of_another_user_is_refused_the_grant(run_python, start_daemon):
    """The receiver is build/bin/flagos_import_grant (a C++ client; the test
    interpreter may live where another user cannot read it), run as
    `nobody` and then as root, the sender's user."""
    tool = HERE.parent.parent / "build" / "bin" / "flagos_import_grant"
    assert tool.exists(), f"{tool} is missing: run scripts/build"
    daemon = start_daemon()
    open_to_everyone(daemon)
    sender = PRELUDE + f"""
import subprocess
t = torch.ones(16, device="flagos")
grant, device, offset, nbytes = torch_fl._C._share_storage(t.untyped_storage())
for user in (["setpriv", "--reuid={NOBODY}", "--regid={NOBODY}", "--clear-groups"], []):
    r = subprocess.run(user + [{str(tool)!r}, {daemon.endpoint!r}, grant.hex(), str(device)],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    print(r.stdout.strip())
print("sender session", torch_fl._C._session_id())
"""
    proc = run_python(sender, env={"FLAGOS_ENDPOINT": daemon.endpoint}, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    sender_session = lines[-1].split()[-1]
    assert lines[0].startswith("REFUSED PERMISSION_DENIED: flagos: import a grant failed: session "), lines
    assert lines[0].endswith(
        f"(uid {NOBODY}) may not use device memory of session {sender_session} (uid 0): flagosd "
        "shares memory only between processes of one user; the operator may allow more with "
        "--memory-sharing=any-user"), lines[0]
    assert lines[1] == f"IMPORTED {2 << 20}", lines  # the sender's user: its 2 MiB segment


def test_any_user_policy_lets_another_user_import(run_python, start_daemon):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run a client as another user; "
                    "CI runs as root")
    tool = HERE.parent.parent / "build" / "bin" / "flagos_import_grant"
    daemon = start_daemon(extra_args=["--memory-sharing=any-user"])
    open_to_everyone(daemon)
    proc = run_python(PRELUDE + f"""
import subprocess
t = torch.ones(16, device="flagos")
grant, device, offset, nbytes = torch_fl._C._share_storage(t.untyped_storage())
r = subprocess.run(["setpriv", "--reuid={NOBODY}", "--regid={NOBODY}", "--clear-groups",
                    {str(tool)!r}, {daemon.endpoint!r}, grant.hex(), str(device)],
                   capture_output=True, text=True, timeout=60, cwd="/")
assert r.returncode == 0, r.stderr
print(r.stdout.strip())
""", env={"FLAGOS_ENDPOINT": daemon.endpoint}, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == f"IMPORTED {2 << 20}", proc.stdout


def test_flagos_tensors_are_shared_and_share_memory_is_a_no_op_as_for_cuda() -> None:
    # docs/usage.md, "Sharing tensors between processes".
    import torch
    import torch_fl  # noqa: F401

    x = torch.arange(4.0, device="flagos")
    assert x.is_shared() is True
    assert torch.arange(4.0).is_shared() is False  # a CPU tensor, for contrast
    ptr = x.data_ptr()
    assert x.share_memory_() is x
    assert x.data_ptr() == ptr
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
