"""The version-skew workload (scripts/skew-check): runs in a torch of another
minor than flagosd's, with a torch_fl built from this source against it, and
trains on "flagos" what it also trains on the CPU of the same torch.

Prints one line per check and exits non-zero on the first mismatch. Needs
FLAGOS_ENDPOINT (a running flagosd built with another torch).
"""

from __future__ import annotations

import re
import sys

import torch
from torch import nn

import torch_fl

FL = "flagos"


def train(model_fn, batch_fn, steps: int, make_optimizer) -> list[float]:
    """Losses of `steps` steps on the CPU and on flagos from the same seed."""
    curves = {}
    for device in ("cpu", FL):
        torch.manual_seed(0)
        model = model_fn().to(device)
        optimizer = make_optimizer(model.parameters())
        torch.manual_seed(1)
        losses = []
        for _ in range(steps):
            x, y = batch_fn()
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves[device] = losses
    return curves["cpu"], curves[FL]


def check(name: str, cpu, fl, rtol=1e-4, atol=1e-5) -> None:
    torch.testing.assert_close(torch.tensor(fl), torch.tensor(cpu), rtol=rtol, atol=atol,
                               msg=lambda m: f"{name}: flagos differs from the CPU\n{m}")
    print(f"ok   {name}: {len(cpu)} values match the CPU (last {fl[-1]:.6f})")


def main() -> int:
    info = torch_fl._C._daemon_info()
    client_torch = torch.__version__.split("+")[0]
    daemon_torch = info["torch_version"]
    print(f"client torch {torch.__version__}, flagosd torch {daemon_torch}")
    if client_torch == daemon_torch:
        print("FAIL the client and flagosd have the same torch; nothing is skewed")
        return 1

    def mlp():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def mlp_batch():
        return torch.randn(8, 16), torch.randn(8, 4)

    check("MLP, 5 SGD steps", *train(mlp, mlp_batch, 5,
                                        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                                    batch_first=True)
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(self.layer(x).mean(dim=1))

    def block_batch():
        return torch.randn(4, 6, 32), torch.randn(4, 4)

    check("transformer block, 3 AdamW steps",
          *train(Block, block_batch, 3, lambda p: torch.optim.AdamW(p, lr=1e-3)))

    # aten::_cdist_backward renamed its first argument (grad -> grad_output)
    # between 2.13 and 2.14: names never travel, so the op is admitted.
    torch.manual_seed(2)
    x, y = torch.randn(5, 3), torch.randn(4, 3)
    grads = []
    for device in ("cpu", FL):
        xd = x.detach().to(device).requires_grad_()
        torch.cdist(xd, y.to(device)).pow(2).sum().backward()
        grads.append(xd.grad.cpu().flatten().tolist())
    check("cdist backward (schema differs only in argument names)", grads[0], grads[1])

    # An operator the daemon's torch lacks (aten::linalg_polar is new in
    # 2.14) is refused naming both torch versions, and the session goes on.
    if client_torch.startswith("2.14.") and daemon_torch.startswith("2.13."):
        # torch 2.14 gives linalg_polar a CompositeExplicitAutogradNonFunctional
        # kernel, which the flagos key may take and which reaches the daemon
        # as the out= overload: the overload name is free, both torch
        # versions must be named.
        expected = re.compile(
            r"operator aten::linalg_polar(\.\w+)? is not registered in flagosd's torch "
            + re.escape(daemon_torch) + r" \(the client's is " + re.escape(client_torch) + r"\)")
        try:
            torch.linalg.polar(torch.randn(3, 3, device=FL))
            torch.flagos.synchronize()
            print("FAIL aten::linalg_polar ran on a daemon whose torch has no such operator")
            return 1
        except RuntimeError as e:
            found = expected.search(str(e))
            if not found:
                print(f"FAIL unexpected error for linalg_polar: {e}")
                return 1
        print(f"ok   an operator new in {client_torch} is refused: {found.group(0)}")
        check("after it, the session goes on", [6.0], [torch.ones(2, 3, device=FL).sum().item()])

    # The daemon reports this session's torch beside its own.
    stats = torch_fl._C._daemon_stats("")
    mine = [s for s in stats["sessions"] if s["id"] == torch_fl._C._session_id()]
    if not mine or mine[0]["torch_version"] != client_torch:
        print(f"FAIL GetStats does not show this session's torch {client_torch}: {mine}")
        return 1
    print(f"ok   GetStats: this session's torch {mine[0]['torch_version']}, "
          f"flagosd's {stats['torch_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
