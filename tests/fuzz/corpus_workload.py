"""The session scripts/fuzz records its seed corpus from: a short torch_fl
workload touching each kind of command a client sends (register_op and op
with every kind of argument the MLP step and the ops below need, allocate,
free, copies both ways and between devices, memset, streams, events,
synchronisation, data-dependent results, random ops), run against a
flagosd started with --record-client-messages (tests/fuzz/record_corpus.py).

It checks its results against CPU torch as it goes, so that a corpus is
only recorded from a session that worked.
"""

from __future__ import annotations

import torch

import torch_fl  # noqa: F401  (registers "flagos")

FL = "flagos"


def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-4)


def elementwise_and_reductions() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, generator=gen)
    b = torch.randn(4, 5, generator=gen)
    fa, fb = a.to(FL), b.to(FL)
    check(fa + fb * 2, a + b * 2)
    check(torch.where(fa > 0, fa, fb), torch.where(a > 0, a, b))
    check(fa.sum(dim=1, keepdim=True), a.sum(dim=1, keepdim=True))
    check(fa.t().contiguous(), a.t().contiguous())
    check(fa[:, 1:3].mean(), a[:, 1:3].mean())
    check(torch.cat([fa, fb], dim=0), torch.cat([a, b], dim=0))
    check(fa.to(torch.float64).to(torch.int32), a.to(torch.float64).to(torch.int32))
    assert fa.max().item() == a.max().item()
    # Data-dependent output shapes.
    check(torch.nonzero(fa > 0), torch.nonzero(a > 0))
    check(fa[fa > 0], a[a > 0])
    z = torch.zeros(3, 3, device=FL)
    z.fill_(2.5)
    check(z, torch.full((3, 3), 2.5))
    idx = torch.tensor([2, 0], dtype=torch.int64)
    check(fa.index_select(0, idx.to(FL)), a.index_select(0, idx))


def mlp_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    reference.load_state_dict(model.state_dict())
    model.to(FL)
    x = torch.randn(6, 8)
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    losses = []
    for net, dev in ((model, FL), (reference, "cpu")):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x.to(dev)), y.to(dev))
            loss.backward()
            optimizer.step()
        losses.append(loss.detach().cpu())
    check(losses[0], losses[1])
    dropped = torch.nn.functional.dropout(torch.ones(4, 4, device=FL), 0.5, training=True)
    assert set(dropped.cpu().unique().tolist()) <= {0.0, 2.0}


def streams_events_and_devices() -> None:
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    fa = a.to(FL)
    side = torch.flagos.Stream()
    start = torch.flagos.Event(enable_timing=True)
    end = torch.flagos.Event(enable_timing=True)
    start.record()
    side.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(side):
        fb = fa * 3
        end.record(side)
    torch.flagos.current_stream().wait_event(end)
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    assert end.query() and side.query()
    check(fb, a * 3)
    if torch.flagos.device_count() > 1:
        other = fa.to(f"{FL}:1")
        check(other + 1, a + 1)
        check(other.to(f"{FL}:0"), a)
    torch.flagos.synchronize()
    del fb
    torch.flagos.empty_cache()


def main() -> None:
    elementwise_and_reductions()
    mlp_step()
    streams_events_and_devices()
    print("corpus workload: ok")


if __name__ == "__main__":
    main()
