"""A program ends with exit 0 and a quiet stderr, whatever it still holds at exit.

Each test runs a program as users write them, which keeps flagos objects
alive in globals until the interpreter exits: device tensors and views,
pinned host tensors used by non_blocking copies, DataLoader batches (pinned,
from worker processes, with the iterator still alive), tensors shared with
another process and imported there, events, and tensors of a session the
daemon restarted. At exit torch_fl closes its session first; everything
freed after that (deleters, the pinned cache's events) must neither throw
(an exception leaving a deleter terminates the process: exit 134) nor print.
Each program also checks its values against the CPU, so a quiet exit is not
bought by doing nothing.
"""
from __future__ import annotations

import pytest

from test_reconnect import crash_and_restart


def assert_clean(result, expected_stdout: str) -> None:
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stderr == "", result.stderr[-4000:]
    assert result.stdout == expected_stdout, (result.stdout, result.stderr)


def test_device_tensors_views_and_events_held_at_exit(run_python) -> None:
    result = run_python("""
import torch, torch_fl
x = torch.arange(64, dtype=torch.float32, device="flagos")
view = x[::2]
transposed = x.view(8, 8).t()
grad_holder = torch.ones(3, device="flagos", requires_grad=True)
(grad_holder * 2).sum().backward()
start, end = torch.Event("flagos", enable_timing=True), torch.Event("flagos", enable_timing=True)
start.record(); y = x * 3; end.record()
stream = torch.flagos.Stream()
with torch.flagos.stream(stream):
    z = x + 1
torch.flagos.current_stream().wait_stream(stream)  # z was made on `stream`
ref = torch.arange(64, dtype=torch.float32)
print(torch.equal(view.cpu(), ref[::2]), torch.equal(transposed.cpu(), ref.view(8, 8).t()),
      torch.equal(grad_holder.grad.cpu(), torch.full((3,), 2.0)), torch.equal(z.cpu(), ref + 1))
""")
    assert_clean(result, "True True True True\n")


def test_a_pinned_tensor_used_with_flagos_held_at_exit(run_python) -> None:
    # The example: the pinned block's non_blocking copy recorded an
    # event on a flagos stream, which its free at exit recorded again.
    result = run_python("""
import torch, torch_fl
b = torch.randn(16, 4).pin_memory()
d = b.to("flagos", non_blocking=True)
back = torch.empty(16, 4).pin_memory()
back.copy_(d, non_blocking=True)
torch.flagos.synchronize()
unused = torch.ones(8).pin_memory()
print(torch.equal(d.cpu(), b), torch.equal(back, b))
""")
    assert_clean(result, "True True\n")


def test_dataloader_batches_and_a_live_iterator_held_at_exit(run_python) -> None:
    result = run_python("""
import torch, torch_fl
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.arange(64, dtype=torch.float32).view(32, 2), torch.arange(32))
# pin_memory pins into the current accelerator's (flagos's) pinned memory.
loader = DataLoader(data, batch_size=4, num_workers=2, pin_memory=True, persistent_workers=True)
batches = []
for x, y in loader:
    batches.append((x, x.to("flagos", non_blocking=True), y.to("flagos", non_blocking=True)))
first_x, first_on_device, first_y = batches[0]
live = iter(loader)      # workers running, prefetched pinned batches at exit
peek = next(live)
print(first_x.is_pinned(), torch.equal(first_on_device.cpu(), data.tensors[0][:4]),
      torch.equal(first_y.cpu(), torch.arange(4)), torch.equal(peek[0], data.tensors[0][:4]))
""", timeout=180)
    assert_clean(result, "True True True True\n")


SHARING_PROGRAM = """
import torch, torch_fl
import torch.multiprocessing as mp


def child(inbox, outbox):
    global held
    held = inbox.get()
    outbox.put(torch.equal(held.cpu(), torch.arange(256, dtype=torch.float32)))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    sent = torch.arange(256, dtype=torch.float32, device="flagos")
    proc = ctx.Process(target=child, args=(inbox, outbox))
    proc.start()
    inbox.put(sent)
    ok = outbox.get(timeout=120)
    proc.join(120)
    print(ok, proc.exitcode, torch.equal(sent.cpu(), torch.arange(256, dtype=torch.float32)))
"""


def test_tensors_shared_with_another_process_held_at_exit_by_both(run_python, tmp_path) -> None:
    # The parent keeps the tensor it sent; the child keeps the one it
    # imported and exits first (its stderr is the parent's), then the
    # parent exits. spawn needs the program in a file.
    program = tmp_path / "share.py"
    program.write_text(SHARING_PROGRAM)
    result = run_python(f"import runpy; runpy.run_path({str(program)!r}, run_name='__main__')",
                        timeout=180)
    assert_clean(result, "True 0 True\n")


def test_the_tensors_of_a_session_the_daemon_restarted_held_at_exit(
        start_daemon, spawn_python, read_line) -> None:
    daemon = start_daemon(device_memory="256MiB")
    proc = spawn_python("""
import sys, torch, torch_fl
old = torch.arange(128, dtype=torch.float32, device="flagos")
old_view = old[4:]
pinned = torch.arange(128, dtype=torch.float32).pin_memory()
copied = pinned.to("flagos", non_blocking=True)
event = torch.Event("flagos"); event.record()
torch.flagos.synchronize()
print("ready", flush=True)
sys.stdin.readline()  # the daemon is SIGKILLed and started again meanwhile
try:
    (old + 1).cpu()
    print("the lost session went unnoticed")
except torch.AcceleratorError:
    pass
new = torch.arange(128, dtype=torch.float32, device="flagos") * 2
print(torch.equal(new.cpu(), torch.arange(128, dtype=torch.float32) * 2), flush=True)
""", env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert read_line(proc) == "ready\n", proc.stderr.read()
    crash_and_restart(daemon)
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err[-4000:]
    assert err == "", err[-4000:]
    assert out == "True\n", (out, err)


@pytest.mark.parametrize("closing", ["exit", "sys.exit(0)", "raise SystemExit"])
def test_each_way_of_ending_a_program_is_quiet(run_python, closing: str) -> None:
    ending = {"exit": "", "sys.exit(0)": "sys.exit(0)", "raise SystemExit": "raise SystemExit"}
    result = run_python(f"""
import sys, torch, torch_fl
pinned = torch.ones(32).pin_memory()
device = pinned.to("flagos", non_blocking=True)
print(float(device.sum().item()))
{ending[closing]}
""")
    assert_clean(result, "32.0\n")
