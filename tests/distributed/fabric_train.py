"""Lightning Fabric on flagos, as a user's script: ``Fabric(accelerator="flagos",
devices=N, precision=P)``, ``fabric.launch()``, ``fabric.setup`` and
``fabric.backward``.

Run by tests/python/test_lightning.py as ``python fabric_train.py N [P]``;
with N = 2 Fabric's launcher starts rank 1 by running this script again and
the ranks train under DDP. Rank 0 then trains the same model with plain
torch on the CPU (under CPU autocast for a mixed precision) on the global
batches and checks that the weights agree. Each rank prints
"rank R fabric ok on flagos:R".
"""
from __future__ import annotations

import sys

import torch
from torch import nn

import torch_fl  # noqa: F401  (registers "flagos" and, with Fabric, its accelerator)
from lightning.fabric import Fabric

STEPS = 6
BATCH = 8  # the global batch; each of N ranks trains on BATCH / N rows


def model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(STEPS * BATCH, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(STEPS * BATCH, 1, generator=gen)


def reference(precision: str) -> nn.Module:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x, y = data()
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = nn.functional.mse_loss(net(x[rows]), y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net


def main() -> int:
    devices = int(sys.argv[1])
    precision = sys.argv[2] if len(sys.argv) > 2 else "32-true"
    fabric = Fabric(accelerator="flagos", devices=devices, precision=precision)
    fabric.launch()
    rank, world = fabric.global_rank, fabric.world_size
    assert world == devices, world
    assert fabric.device == torch.device("flagos", rank), fabric.device
    expected = "DDPStrategy" if devices > 1 else "SingleDeviceStrategy"
    assert type(fabric.strategy).__name__ == expected, fabric.strategy
    net = model()
    dtypes = set()
    net[0].register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    net, opt = fabric.setup(net, opt)
    x, y = data()
    share = BATCH // world
    for step in range(STEPS):
        rows = slice(step * BATCH + rank * share, step * BATCH + (rank + 1) * share)
        xb, yb = fabric.to_device((x[rows], y[rows]))
        out = net(xb)
        assert out.device == fabric.device, out.device
        loss = nn.functional.mse_loss(out, yb)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
    # The precision's autocast ran on flagos.
    expected_dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    assert dtypes == {expected_dtype}, dtypes
    if rank == 0:
        # bf16 keeps 8 bits of mantissa: the two runs round differently.
        tolerance = 3e-2 if precision == "bf16-mixed" else 1e-5
        ref = reference(precision).state_dict()
        for (name, p), q in zip(fabric.strategy.get_module_state_dict(net).items(),
                                ref.values()):
            torch.testing.assert_close(p.float().cpu(), q, rtol=tolerance, atol=tolerance,
                                       msg=lambda m: f"fabric {name}: {m}")
    print(f"rank {rank} fabric ok on {fabric.device}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
