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

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
# FLAGOS_TEST_ENDPOINTS ("a,b"): rank r uses the r-th daemon (a private
# daemon per rank: the group spans daemons).
if os.environ.get("FLAGOS_TEST_ENDPOINTS"):
    os.environ["FLAGOS_ENDPOINT"] = os.environ["FLAGOS_TEST_ENDPOINTS"].split(",")[RANK]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import torch_fl  # noqa: F401,E402  (registers the flagos device and c10d backend)

# FLAGOS_TEST_DEVICE puts every rank on one device (same_device).
torch.flagos.set_device(int(os.environ.get("FLAGOS_TEST_DEVICE", LOCAL % torch.flagos.device_count())))
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
    # Half-precision and int32 (BKCL's other types on kunlunxin).
    for dtype in (torch.bfloat16, torch.float16):
        x = value(RANK, dtype=dtype).to(DEV)
        dist.all_reduce(x)
        same(x, everyone(dtype=dtype).float().sum(0).to(dtype), f"all_reduce {dtype}")
    flat = torch.empty(WORLD * 6, dtype=torch.int32, device=DEV)
    dist.all_gather_into_tensor(flat, value(RANK, dtype=torch.int32).to(DEV))
    same(flat, everyone(dtype=torch.int32).reshape(-1), "all_gather_into_tensor int32")
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
    # Uneven splits: rank s sends rank r (r + s + 1) rows of 3.
    def rows(s: int, r: int) -> torch.Tensor:
        return value(s, 3 * (r + s + 1)).reshape(-1, 3) * (r + 1)
    send = torch.cat([rows(RANK, r) for r in range(WORLD)]).to(DEV)
    out = torch.empty(sum(r + RANK + 1 for r in range(WORLD)), 3, device=DEV)
    dist.all_to_all_single(out, send, [s + RANK + 1 for s in range(WORLD)],
                           [r + RANK + 1 for r in range(WORLD)])
    same(out, torch.cat([rows(s, RANK) for s in range(WORLD)]), "all_to_all_single, uneven")
    outs = [torch.empty(s + RANK + 1, 3, device=DEV) for s in range(WORLD)]
    dist.all_to_all(outs, [rows(RANK, r).to(DEV) for r in range(WORLD)])
    for s in range(WORLD):
        same(outs[s], rows(s, RANK), f"all_to_all of uneven blocks, from {s}")
    # premul_sum: the sum of each input times the factor (FSDP2's gradient
    # divide factor), with a float and with a tensor factor.
    for factor in (0.25, torch.tensor(3.0)):
        premul = dist._make_nccl_premul_sum(factor)
        x = value(RANK).to(DEV)
        dist.all_reduce(x, op=premul)
        same(x, all_values.sum(0) * factor, f"all_reduce premul_sum({factor})")
        out = torch.empty(4, device=DEV)
        source = blocks.reshape(-1).to(DEV)
        dist.reduce_scatter_tensor(out, source, op=premul)
        same(out, all_blocks.sum(0)[RANK] * factor, f"reduce_scatter premul_sum({factor})")
        same(source, blocks.reshape(-1), "reduce_scatter premul_sum leaves its input")
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


def large() -> None:
    """Four allreduces of 16 MiB made on the device: the test checks that no
    tensor byte went through the client (flagosd_copy_bytes_total)."""
    x = torch.full((4 << 20,), float(RANK + 1), device=DEV)
    for _ in range(4):
        dist.all_reduce(x)
    total = WORLD * (WORLD + 1) / 2 * WORLD ** 3
    same(x[-3:], torch.full((3,), total), "16 MiB all_reduce, 4 times")
    assert x.min().item() == x.max().item() == total
    say("large")


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
    if case == "ddp_mlp":
        # DDP's logging samples its timer (flagos's TimerRegistry entry) at
        # iteration 10: device times between the reducer's marks.
        for _ in range(8):
            wrapped(X[mine].to(DEV)).sum().backward()
        stats = wrapped._get_ddp_logging_data()
        for key in ("avg_forward_compute_time", "avg_backward_compute_time",
                    "avg_backward_comm_time"):
            assert stats.get(key, 0) > 0, (key, {k: v for k, v in stats.items() if "time" in k})
    say(case)


class Block(nn.Module):
    """A small pre-norm transformer block (attention through sdpa)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        # No bias (as in LLaMA): a key bias's exact gradient is 0, and Adam
        # would turn its rounding noise into full-size steps that differ
        # between any two ways of computing it.
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                       v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def transformer() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(32, 16), Block(), Block(), nn.LayerNorm(16),
                         nn.Linear(16, 32))


def fsdp2() -> None:
    """fully_shard of a small transformer, 3 AdamW steps, against one process."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(1)
    tokens = torch.randint(0, 32, (2 * WORLD, 8))
    targets = torch.randint(0, 32, (2 * WORLD, 8))

    def steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    reference = transformer()
    expected = steps(reference, tokens, targets)  # one process, the global batch, on the CPU
    model = transformer().to(DEV)
    for block in model[1:3]:
        fully_shard(block)
    fully_shard(model)
    mine = slice(2 * RANK, 2 * RANK + 2)
    losses = steps(model, tokens[mine].to(DEV), targets[mine].to(DEV))
    mean = torch.tensor(losses, device=DEV)
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    same(mean, torch.tensor(expected), "fsdp2 losses, averaged over ranks")
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
        assert isinstance(p, dist.tensor.DTensor), (name, type(p))
        torch.testing.assert_close(p.full_tensor().cpu(), q, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"fsdp2 {name} after 3 steps: {m}")
    say("fsdp2")


def dtensor() -> None:
    """Basic DTensor ops on a 1-D mesh of flagos devices, against plain torch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("flagos", (WORLD,))
    torch.manual_seed(2)
    a, b = torch.randn(4 * WORLD, 6), torch.randn(6, 5)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Replicate()])
    assert da.to_local().device.type == "flagos" and da.to_local().shape == (4, 6)
    same(da.to_local(), a[4 * RANK:4 * RANK + 4], "distribute_tensor Shard(0), local shard")
    same((da * 2 + 1).full_tensor(), a * 2 + 1, "elementwise on a sharded DTensor")
    same((da @ db).full_tensor(), a @ b, "sharded @ replicated")
    same(da.redistribute(mesh, [Replicate()]).to_local(), a, "Shard(0) -> Replicate")
    same(da.sum().full_tensor(), a.sum().reshape(()), "sum of a sharded DTensor")
    dc = distribute_tensor(a, mesh, [Shard(1)])
    same((da.redistribute(mesh, [Shard(1)]) - dc).full_tensor(), torch.zeros_like(a),
         "Shard(0) -> Shard(1) (all_to_all)")
    partial = dist.tensor.DTensor.from_local(torch.full((3,), float(RANK + 1), device=DEV),
                                             mesh, [Partial()])
    same(partial.redistribute(mesh, [Replicate()]).to_local(),
         torch.full((3,), float(WORLD * (WORLD + 1) / 2)), "Partial -> Replicate (all_reduce)")
    say("dtensor")


def dcp() -> None:
    """torch.distributed.checkpoint: save sharded flagos tensors, load them into
    another sharding of the same model."""
    import tempfile
    import torch.distributed.checkpoint as dcp_
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("flagos", (WORLD,))
    torch.manual_seed(3)
    weight, bias = torch.randn(4 * WORLD, 3), torch.randn(5)
    directory = [tempfile.mkdtemp(prefix="flagos-dcp.") if RANK == 0 else None]
    dist.broadcast_object_list(directory, src=0)
    saved = {"weight": distribute_tensor(weight, mesh, [Shard(0)]),
             "bias": distribute_tensor(bias, mesh, [Replicate()]),
             "plain": torch.arange(4.0, device=DEV) + 10, "step": 7}
    dcp_.save(saved, checkpoint_id=directory[0])
    loaded = {"weight": distribute_tensor(torch.zeros_like(weight), mesh, [Shard(1)]),
              "bias": distribute_tensor(torch.zeros(5), mesh, [Shard(0)]),
              "plain": torch.zeros(4, device=DEV), "step": 0}
    dcp_.load(loaded, checkpoint_id=directory[0])
    same(loaded["weight"].full_tensor(), weight, "dcp weight, saved Shard(0), loaded Shard(1)")
    assert loaded["weight"].to_local().device.type == "flagos"
    same(loaded["bias"].full_tensor(), bias, "dcp bias, saved Replicate, loaded Shard(0)")
    same(loaded["plain"], torch.arange(4.0) + 10, "dcp plain flagos tensor")
    assert loaded["step"] == 7, loaded["step"]
    dist.barrier()
    if RANK == 0:
        import shutil
        shutil.rmtree(directory[0])
    say("dcp")


def streams() -> None:
    """Collectives called on two side streams in turn, with rank 0's first
    stream held back by compute queued before its collectives: each rank's
    collectives must still run in the order it called them (as FSDP2's
    all-gathers and reduce-scatters on their own streams), or rank 0's
    all_gather would meet rank 1's all_reduce."""
    current = torch.flagos.current_stream()
    a, b = torch.flagos.Stream(), torch.flagos.Stream()
    x = value(RANK, 4).to(DEV)
    y = value(RANK, 4).to(DEV)
    gathered = torch.empty(WORLD * 4, device=DEV)
    m = torch.randn(512, 512, device=DEV) / 512 ** 0.5
    for s in (a, b):
        s.wait_stream(current)
    for _ in range(3):
        with torch.flagos.stream(a):
            if RANK == 0:
                for _ in range(8):
                    m = m @ m  # keeps stream a busy on rank 0 only
            dist.all_reduce(x)
        with torch.flagos.stream(b):
            dist.all_gather_into_tensor(gathered, y)
    for s in (a, b):
        current.wait_stream(s)
    same(x, everyone(4).sum(0) * WORLD ** 2, "three all_reduces on stream a")
    same(gathered, everyone(4).reshape(-1), "all_gathers on stream b")
    say("streams")


def p2p() -> None:
    """Every rank sends before it receives, as batch_isend_irecv rings and
    isend/irecv pairs do (pipeline stages, ring attention): sends do not hold
    the recv queued after them; a sent tensor may be written after wait()."""
    nxt, prev = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for n in (6, 1 << 20):
        sent = (torch.arange(n, dtype=torch.float32) + RANK).to(DEV)
        got = torch.empty(n, device=DEV)
        ops = [dist.P2POp(dist.isend, sent, nxt), dist.P2POp(dist.irecv, got, prev)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        same(got, torch.arange(n, dtype=torch.float32) + prev, f"batch_isend_irecv of {n}")
        works = [dist.isend(sent, nxt, tag=3), dist.irecv(got, prev, tag=3)]
        for work in works:
            work.wait()
        sent.fill_(-1.0)  # after wait(): the send has read its bytes
        same(got, torch.arange(n, dtype=torch.float32) + prev, f"isend/irecv of {n}")
    say("p2p")


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


def library_failure() -> None:
    """The collective library fails to issue (FAKE_BKCL_FAIL=all_reduce): the
    collective fails on every rank, and so does the broken group's next one."""
    failing_all_reduce(torch.ones(4, device=DEV), "library_failure", "whose library call failed")
    failing_all_reduce(torch.ones(4, device=DEV), "library_failure", "on the broken group")


def same_device() -> None:
    """Both ranks on one device (FLAGOS_TEST_DEVICE=0)."""
    failing_all_reduce(torch.ones(4, device=DEV), "same_device", "of two ranks on one device")


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


def restarted() -> None:
    """All_reduces until the daemon restarts under the ranks (the test kills
    and restarts it once both say "running"): the first flagos call after
    is the session's loss error, and the group's next collective says the
    group has ended."""
    x = torch.ones(4, device=DEV)
    dist.all_reduce(x)
    same(x, torch.full((4,), float(WORLD)), "the all_reduce before the restart")
    say("restarted", "running")
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            x.fill_(1.0)
            dist.all_reduce(x)
            x.cpu()
            time.sleep(0.01)
        raise AssertionError("the daemon was not restarted within 120 s")
    except RuntimeError as e:
        say("restarted", "lost: " + str(e).splitlines()[0])
    failing_all_reduce(torch.ones(4, device=DEV), "restarted", "after the restart")


CASES = {"collectives": collectives, "ddp_mlp": lambda: ddp("ddp_mlp"),
         "ddp_syncbn": lambda: ddp("ddp_syncbn"), "fsdp2": fsdp2, "streams": streams, "p2p": p2p, "dtensor": dtensor,
         "dcp": dcp, "large": large, "mismatch": mismatch, "killed": killed, "late": late,
         "restarted": restarted, "library_failure": library_failure,
         "same_device": same_device}


def main() -> None:
    case = sys.argv[1]
    # No backend: torch 2.13 picks the accelerator's only ("flagos:flagos";
    # CPU tensors then go to the group's inner gloo); or the one named.
    backend = os.environ.get("FLAGOS_TEST_PG_BACKEND") or None
    # ddp_syncbn binds the group to the rank's device, as Lightning does.
    bound = {"device_id": DEV} if case == "ddp_syncbn" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT_S), **bound)
    expected = backend or "flagos:flagos"
    assert dist.get_backend_config() == expected, (dist.get_backend_config(), expected)
    if os.environ.get("FLAGOS_TEST_ENDPOINTS"):
        group = dist.group.WORLD._get_backend(DEV)
        assert group.between_daemons, "a private daemon per rank, yet the group is one daemon's"
    CASES[case]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
