"""Child-process bodies for test_sharing.py (torch.multiprocessing's spawn
needs them importable by name)."""
from __future__ import annotations

import os
import signal

import torch
import torch_fl  # noqa: F401  (the device, and the flagos reducers)


def expected_values(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * 0.5 - 3.0


def double_in_place(inbox, outbox) -> None:
    """Checks the tensor it receives, doubles it in place, reports."""
    t = inbox.get()
    ok = t.device.type == "flagos" and torch.equal(t.cpu(), expected_values(t.numel()))
    stats = torch_fl.daemon_stats()
    me = [s for s in stats["sessions"] if s["id"] == torch_fl._C._session_id()][0]
    t.mul_(2)
    torch.flagos.synchronize()
    outbox.put((ok, me["imported_bytes"], me["imported_segments"]))


def hold_until_told(inbox, outbox) -> None:
    """Receives a tensor, says so, and checks it again after the sender
    dropped its own and churned its allocator."""
    t = inbox.get()
    outbox.put("holding")
    assert inbox.get() == "check"
    outbox.put(torch.equal(t.cpu(), torch.full((t.numel(),), 7.0)))
    del t
    torch.flagos.synchronize()
    outbox.put("released")


def die_holding(inbox, outbox) -> None:
    """Receives a tensor, says so, and is killed holding it."""
    t = inbox.get()
    outbox.put(float(t.sum().item()))
    outbox.close()
    outbox.join_thread()  # the answer is in the pipe before the kill
    os.kill(os.getpid(), signal.SIGKILL)


def train_steps(model, inputs, targets, lr) -> None:
    """SGD steps on a model whose parameters are shared with the parent."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in zip(inputs, targets):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to("flagos")), y.to("flagos"))
        loss.backward()
        opt.step()
    torch.flagos.synchronize()
