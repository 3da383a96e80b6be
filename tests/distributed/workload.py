"""torch.distributed on flagos tensors, as training jobs use it.

Run by tests/python/test_distributed.py, one process per rank (under
torchrun, or under the test's own launcher for the fault cases):

    python workload.py CASE

Each case checks its results against a reference computed here with plain
torch on the CPU (the same collective's arithmetic, or the same model
trained in one process on the global batch) and prints "rank N CASE ok";
a wrong value raises, and the process exits 1. The fault cases print
"rank N CASE: <the error>" for the test to read.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import torch_fl  # noqa: F401  (registers the flagos device and c10d backend)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
torch.flagos.set_device(LOCAL % torch.flagos.device_count())
DEV = torch.device("flagos", torch.flagos.current_device())
TIMEOUT_S = float(os.environ.get("FLAGOS_TEST_PG_TIMEOUT_S", "120"))


def say(case: str, what: str = "ok") -> None:
    print(f"rank {RANK} {case}{' ' if what == 'ok' else ': '}{what}", flush=True)


def same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    actual = actual.cpu()
    if expected.is_floating_point():
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(actual, expected), f"{what}: {actual.tolist()} != {expected.tolist()}"


def value(r: int, n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank r's contribution (on the CPU)."""
    return (torch.arange(n, dtype=torch.float64) * (r + 1) + r + 1).to(dtype)


def everyone(n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.stack([value(r, n, dtype) for r in range(WORLD)])


def collectives() -> None:
    all_values = everyone()
    for op, expected in [(dist.ReduceOp.SUM, all_values.sum(0)),
                         (dist.ReduceOp.AVG, all_values.mean(0)),
                         (dist.ReduceOp.PRODUCT, all_values.prod(0)),
                         (dist.ReduceOp.MIN, all_values.min(0).values),
                         (dist.ReduceOp.MAX, all_values.max(0).values)]:
        x = value(RANK).to(DEV)
        dist.all_reduce(x, op=op)
        same(x, expected, f"all_reduce {op}")
    ints = torch.stack([torch.tensor([r + 1, 3 * r + 5, 7 << r]) for r in range(WORLD)])
    for op, fold in [(dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                     (dist.ReduceOp.BXOR, torch.bitwise_xor), (dist.ReduceOp.SUM, torch.add)]:
        x = ints[RANK].to(DEV)
        dist.all_reduce(x, op=op)
        expected = ints[0]
        for r in range(1, WORLD):
            expected = fold(expected, ints[r])
        same(x, expected, f"all_reduce int64 {op}")
    # A non-contiguous view, reduced in place.
    base = value(RANK, 12).reshape(3, 4).to(DEV)
    view = base.t()
    dist.all_reduce(view)
    same(base, everyone(12).sum(0).reshape(3, 4), "all_reduce of a transposed view")
    # async_op: the Work and its future hold the reduced tensors.
    x = value(RANK).to(DEV)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    future_value = work.get_future().wait()
    same(future_value[0], all_values.sum(0), "all_reduce async_op future")
    for root in range(WORLD):
        x = value(RANK).to(DEV)
        dist.broadcast(x, src=root)
        same(x, value(root), f"broadcast from {root}")
    gathered = [torch.empty(6, device=DEV) for _ in range(WORLD)]
    dist.all_gather(gathered, value(RANK).to(DEV))
    for r in range(WORLD):
        same(gathered[r], value(r), f"all_gather block {r}")
    flat = torch.empty(WORLD * 6, device=DEV)
    dist.all_gather_into_tensor(flat, value(RANK).to(DEV))
    same(flat, all_values.reshape(-1), "all_gather_into_tensor")
    # Every rank contributes WORLD blocks; rank r receives the sum of blocks r.
    blocks = torch.stack([value(RANK, 4) * (b + 1) for b in range(WORLD)])
    all_blocks = torch.stack([torch.stack([value(r, 4) * (b + 1) for b in range(WORLD)])
                              for r in range(WORLD)])
    out = torch.empty(4, device=DEV)
    dist.reduce_scatter_tensor(out, blocks.reshape(-1).to(DEV))
    same(out, all_blocks.sum(0)[RANK], "reduce_scatter_tensor")
    out = torch.empty(4, device=DEV)
    dist.reduce_scatter(out, [b.to(DEV) for b in blocks])
    same(out, all_blocks.sum(0)[RANK], "reduce_scatter")
    out = torch.empty(WORLD * 4, device=DEV)
    dist.all_to_all_single(out, blocks.reshape(-1).to(DEV))
    same(out, all_blocks[:, RANK].reshape(-1), "all_to_all_single")
    outs = [torch.empty(4, device=DEV) for _ in range(WORLD)]
    dist.all_to_all(outs, [b.to(DEV) for b in blocks])
    for r in range(WORLD):
        same(outs[r], all_blocks[r, RANK], f"all_to_all block from {r}")
    x = value(RANK).to(DEV)
    dist.reduce(x, dst=0)
    same(x, all_values.sum(0) if RANK == 0 else value(RANK), "reduce to 0")
    gather_list = [torch.empty(6, device=DEV) for _ in range(WORLD)] if RANK == 1 else None
    dist.gather(value(RANK).to(DEV), gather_list, dst=1)
    if RANK == 1:
        for r in range(WORLD):
            same(gather_list[r], value(r), f"gather block {r}")
    out = torch.empty(6, device=DEV)
    dist.scatter(out, [value(r).to(DEV) * 10 for r in range(WORLD)] if RANK == 0 else None, src=0)
    same(out, value(RANK) * 10, "scatter")
    # A ring of send/recv (even ranks send first, so no rank's stream
    # waits on a send its peer's stream queued behind its own).
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(6, device=DEV)
    if RANK % 2 == 0:
        dist.send(value(RANK).to(DEV), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(value(RANK).to(DEV), nxt)
    same(got, value(prv), "recv from the previous rank")
    got = torch.empty(6, device=DEV)
    if RANK % 2 == 0:
        works = [dist.isend(value(RANK).to(DEV) * 2, nxt), dist.irecv(got, prv)]
    else:
        works = [dist.irecv(got, prv), dist.isend(value(RANK).to(DEV) * 2, nxt)]
    for w in works:
        w.wait()
    same(got, value(prv) * 2, "irecv from the previous rank")
    # CPU tensors go to gloo through the same group.
    y = value(RANK)
    dist.all_reduce(y)
    same(y, all_values.sum(0), "all_reduce of a CPU tensor")
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": RANK, "word": "x" * (RANK + 3)})
    assert objects == [{"rank": r, "word": "x" * (r + 3)} for r in range(WORLD)], objects
    listed = [f"from {RANK}", RANK] if RANK == 1 else [None, None]
    dist.broadcast_object_list(listed, src=1)
    assert listed == ["from 1", 1], listed
    dist.barrier()
    say("collectives")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 1))


def data(case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: 4 samples per rank."""
    torch.manual_seed(1)
    shape = (4 * WORLD, 8) if case == "ddp_mlp" else (4 * WORLD, 3, 6, 6)
    return torch.randn(shape), torch.randn(4 * WORLD, 1)


def train(model: nn.Module, step_model: nn.Module, xs, ys, steps: int = 3) -> None:
    opt = torch.optim.SGD(step_model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        loss = ((model(xs) - ys) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def ddp(case: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    build = mlp if case == "ddp_mlp" else cnn
    X, Y = data(case)
    reference = build()
    train(reference, reference, X, Y)  # one process, the global batch, on the CPU
    model = build()
    if case == "ddp_syncbn":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(DEV)
    wrapped = nn.parallel.DistributedDataParallel(model)
    if case == "ddp_mlp":
        # A comm hook: its future's value is the TensorList DDP expects.
        wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
    mine = slice(4 * RANK, 4 * RANK + 4)
    train(wrapped, wrapped, X[mine].to(DEV), Y[mine].to(DEV))
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
        same(p, q, f"{case} {name} after 3 steps")
    say(case)


def failing_all_reduce(x: torch.Tensor, case: str, why: str) -> None:
    """An all_reduce that must fail: reports its error's first line."""
    try:
        dist.all_reduce(x)
        x.cpu()
    except RuntimeError as e:
        say(case, str(e).splitlines()[0])
        return
    raise AssertionError(f"all_reduce {why} did not fail")


def mismatch() -> None:
    failing_all_reduce(torch.ones(4 + RANK, device=DEV), "mismatch",
                       "of 4 elements on rank 0 and 5 on rank 1")


def killed() -> None:
    x = torch.ones(4, device=DEV)
    dist.all_reduce(x)
    same(x, torch.full((4,), float(WORLD)), "the all_reduce before the kill")
    if RANK == 1:
        time.sleep(1.0)  # rank 0 waits in its next all_reduce meanwhile
        os.kill(os.getpid(), signal.SIGKILL)
    for attempt in ("during", "after"):
        failing_all_reduce(x, f"killed {attempt}", f"{attempt} rank 1's death")


def late() -> None:
    store = dist.distributed_c10d._get_default_store()
    if RANK == 1:
        store.wait(["rank 0 timed out"], datetime.timedelta(seconds=TIMEOUT_S * 10))
        return
    failing_all_reduce(torch.ones(4, device=DEV), "late", "without rank 1")
    store.set("rank 0 timed out", "1")


CASES = {"collectives": collectives, "ddp_mlp": lambda: ddp("ddp_mlp"),
         "ddp_syncbn": lambda: ddp("ddp_syncbn"), "mismatch": mismatch, "killed": killed,
         "late": late}


def main() -> None:
    case = sys.argv[1]
    # No backend: torch 2.13 picks the accelerator's only ("flagos:flagos";
    # CPU tensors then go to the group's inner gloo); or the one named.
    backend = os.environ.get("FLAGOS_TEST_PG_BACKEND") or None
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    expected = backend or "flagos:flagos"
    assert dist.get_backend_config() == expected, (dist.get_backend_config(), expected)
    CASES[case]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
