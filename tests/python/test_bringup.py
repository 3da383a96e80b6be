"""The device comes up: tensors, copies, device selection, memory accounting."""

from __future__ import annotations

import os

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")

from flagos_test_env import run_backend

MiB = 1 << 20


def exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=gen, dtype=dtype)


def test_is_available_and_has_two_devices() -> None:
    assert torch.flagos.is_available()
    assert torch.flagos.device_count() == 2


def test_empty_tensor_is_on_flagos_0_with_the_requested_shape() -> None:
    t = torch.empty(4, 4, device="flagos")
    assert t.device == torch.device("flagos", 0)
    assert t.shape == (4, 4)
    assert t.dtype == torch.float32
    assert t.is_flagos


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
     torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64],
)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1000, 33)])
def test_host_device_host_round_trip_is_exact(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    src = sample(dtype, shape)
    on_device = src.to("flagos")
    assert on_device.device.type == "flagos"
    assert on_device.dtype == dtype and on_device.shape == src.shape
    exact(on_device.cpu(), src)


def test_round_trip_of_a_64_mib_tensor_is_exact() -> None:
    src = sample(torch.float32, (16 * MiB,))  # 64 MiB: several copy chunks
    exact(src.to("flagos").cpu(), src)


def test_round_trip_of_a_non_contiguous_source_is_exact() -> None:
    src = sample(torch.float32, (40, 30)).t()[::2]
    exact(src.to("flagos").cpu(), src)


def test_tensor_flagos_method_moves_to_the_current_device() -> None:
    src = sample(torch.float32, (5,))
    t = src.flagos()
    assert t.is_flagos and t.device == torch.device("flagos", 0)
    assert not src.is_flagos
    exact(t.cpu(), src)


def test_synchronize_returns_after_pending_work() -> None:
    a = torch.arange(1000.0, device="flagos")
    b = a * 3 + 1
    torch.flagos.synchronize()
    torch.flagos.synchronize(0)
    exact(b.cpu(), torch.arange(1000.0) * 3 + 1)


def test_tensors_on_device_1_compute_on_device_1() -> None:
    x = torch.arange(10.0, device="flagos:1")
    y = x * 2 + x
    assert x.device == torch.device("flagos", 1)
    assert y.device == torch.device("flagos", 1)
    torch.flagos.synchronize(1)
    exact(y.cpu(), torch.arange(10.0) * 3)


def test_device_context_manager_selects_the_device_and_restores_it() -> None:
    assert torch.flagos.current_device() == 0
    with torch.flagos.device(1):
        assert torch.flagos.current_device() == 1
        t = torch.ones(3, device="flagos")
    assert torch.flagos.current_device() == 0
    assert t.device == torch.device("flagos", 1)
    exact(t.cpu(), torch.ones(3))


def test_set_device_changes_the_default_device() -> None:
    try:
        torch.flagos.set_device(1)
        assert torch.flagos.current_device() == 1
        assert torch.zeros(2, device="flagos").device.index == 1
    finally:
        torch.flagos.set_device(0)
    assert torch.zeros(2, device="flagos").device.index == 0


def test_memory_allocated_grows_with_a_live_tensor_and_returns_when_it_is_freed() -> None:
    before = torch.flagos.memory_allocated()
    t = torch.empty(MiB, dtype=torch.float32, device="flagos")  # 4 MiB
    assert torch.flagos.memory_allocated() >= before + t.nbytes
    assert torch.flagos.memory_allocated(0) == torch.flagos.memory_allocated()
    del t
    assert torch.flagos.memory_allocated() == before


def test_memory_allocated_is_counted_per_device() -> None:
    before0 = torch.flagos.memory_allocated(0)
    before1 = torch.flagos.memory_allocated(1)
    t = torch.empty(MiB, device="flagos:1")
    assert torch.flagos.memory_allocated(1) >= before1 + t.nbytes
    assert torch.flagos.memory_allocated(0) == before0
    del t
    assert torch.flagos.memory_allocated(1) == before1


def test_memory_reserved_covers_memory_allocated() -> None:
    t = torch.empty(MiB, device="flagos")
    assert torch.flagos.memory_reserved() >= torch.flagos.memory_allocated() >= t.nbytes


def test_max_memory_allocated_tracks_the_peak_since_reset() -> None:
    torch.flagos.reset_peak_memory_stats()
    base = torch.flagos.memory_allocated()
    assert torch.flagos.max_memory_allocated() == base
    t = torch.empty(2 * MiB, device="flagos")  # 8 MiB
    nbytes = t.nbytes
    del t
    assert torch.flagos.max_memory_allocated() >= base + nbytes
    torch.flagos.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == torch.flagos.memory_allocated()


def test_memory_stats_agree_with_memory_allocated_and_reserved() -> None:
    t = torch.empty(MiB, device="flagos")  # noqa: F841  (kept alive)
    stats = torch.flagos.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.flagos.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.flagos.memory_reserved()


def test_memory_summary_prints_the_stats_of_the_device() -> None:
    x = torch.empty(3 * 2**20, dtype=torch.uint8, device="flagos:1")
    stats = torch.flagos.memory_stats(1)
    text = torch.flagos.memory_summary(device=1)
    assert text.startswith("flagos memory summary, device 1 (")
    rows = {line[:32].strip(): line[32:].split("  ") for line in text.splitlines()[3:]}
    current = [c.strip() for c in rows["Allocated memory"] if c.strip()][0]
    assert current == f"{stats['allocated_bytes.all.current'] / 2**20:.2f} MiB"
    assert [c.strip() for c in rows["Allocations"] if c.strip()][0] == \
        str(stats["allocation.all.current"])
    free, total = torch.flagos.mem_get_info(1)
    assert rows["Device free, total"][-1].strip() == f"{total / 2**30:.2f} GiB"
    del x
    # A tensor's device, current for a block.
    with torch.flagos.device_of(torch.empty(1, device="flagos:1")):
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0
    with torch.flagos.device_of(torch.empty(1)):
        assert torch.flagos.current_device() == 0


def test_empty_cache_returns_free_segments_to_the_daemon() -> None:
    t = torch.empty(8 * MiB, device="flagos")  # 32 MiB: a segment of its own
    del t
    torch.flagos.synchronize()
    reserved = torch.flagos.memory_reserved()
    used = torch_fl.daemon_stats()["devices"][0]["used_memory"]
    torch.flagos.empty_cache()
    torch.flagos.synchronize()  # the segments' release has reached the daemon
    assert torch.flagos.memory_reserved() < reserved
    assert torch_fl.daemon_stats()["devices"][0]["used_memory"] < used


# The caching allocator (plugin/csrc/device_allocator.h), in a process of
# its own (nothing else allocated): a freed block is taken again as it is by
# the next allocation of its size; free neighbours merge only when nothing
# fits, before a new segment would be asked for, and before empty_cache
# gives segments back.
ALLOCATOR_REUSE = r"""
import torch, torch_fl
MiB = 1 << 20
assert torch.flagos.memory_reserved() == 0, torch.flagos.memory_reserved()
quarter = MiB // 8  # float32 elements in 512 KiB
blocks = [torch.full((quarter,), float(i), device="flagos") for i in range(4)]
assert torch.flagos.memory_reserved() == 2 * MiB  # small requests share a 2 MiB segment
addrs = [t.data_ptr() for t in blocks]
assert addrs == [addrs[0] + i * MiB // 2 for i in range(4)], addrs
blocks[1] = None
again = torch.zeros(quarter, device="flagos")
assert again.data_ptr() == addrs[1]  # the block freed, as it was
del again
blocks[2] = None
# Two free 512 KiB neighbours: a 1 MiB tensor fits once they merge, in the
# same segment.
pair = torch.ones(2 * quarter, device="flagos")
assert pair.data_ptr() == addrs[1] and torch.flagos.memory_reserved() == 2 * MiB
assert blocks[0].cpu().eq(0).all() and blocks[3].cpu().eq(3).all()
assert pair.cpu().eq(1).all()
del pair, blocks
torch.flagos.empty_cache()
torch.flagos.synchronize()
assert torch.flagos.memory_reserved() == 0, torch.flagos.memory_reserved()
x = torch.arange(10.0, device="flagos")
assert x.sum().item() == 45.0
print("ok")
"""


def test_a_freed_block_is_reused_as_it_is_and_merged_when_nothing_fits(run_python) -> None:
    out = run_python(ALLOCATOR_REUSE)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# A training step allocates and frees the same sizes in the same order each
# step; its tensors land at the same addresses from step to step, or at two
# alternating sets (gradients freed by zero_grad after the next step's
# forward): what lets flagosd run its op calls prepared
# (daemon/sessions/repeated_op_calls.h). The addresses each op reads and
# writes, logged per step.
STEP_ADDRESSES = r"""
import torch, torch_fl
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

class Addresses(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten((args, kwargs or {}, out))
        self.calls.append((str(func), tuple(t.data_ptr() for t in flat
                                            if isinstance(t, torch.Tensor)
                                            and t.device.type == "flagos")))
        return out

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1,
                                         batch_first=True)
model = torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.Linear(8 * 32, 4)).to("flagos")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(4, 8, 32), torch.randint(0, 4, (4,))
steps = []
for step in range(12):
    log = Addresses()
    with log:
        loss = torch.nn.functional.cross_entropy(model(x.to("flagos")), y.to("flagos"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    steps.append(log.calls)
    assert torch.isfinite(loss).item()
settled = steps[6:]
for a, b in zip(settled, settled[2:]):
    assert a == b, [(p, q) for p, q in zip(a, b) if p != q][:3]
print("ok", len(settled[0]))
"""


def test_a_training_steps_tensors_land_at_the_same_addresses_each_step(run_python) -> None:
    out = run_python(STEP_ADDRESSES)
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stderr


def test_accelerator_reports_flagos() -> None:
    accelerator = torch.accelerator.current_accelerator()
    assert accelerator is not None and accelerator.type == "flagos"


def test_accelerator_synchronize_waits_for_the_device() -> None:
    x = torch.arange(100, device="flagos") + 1
    torch.accelerator.synchronize()
    exact(x.cpu(), torch.arange(100) + 1)


def test_accelerator_memory_allocated_matches_torch_flagos() -> None:
    t = torch.empty(MiB, device="flagos")
    assert torch.accelerator.memory_allocated() == torch.flagos.memory_allocated()
    assert torch.accelerator.memory_allocated() >= t.nbytes


def test_endpoint_is_the_one_from_the_environment(endpoint: str) -> None:
    torch.empty(1, device="flagos")
    assert torch_fl.endpoint() == endpoint


def test_daemon_stats_describe_the_cpu_backend_and_its_devices() -> None:
    stats = torch_fl.daemon_stats()
    assert stats["backend"] == run_backend()
    assert [d["index"] for d in stats["devices"]] == [0, 1]
    for device in stats["devices"]:
        assert device["total_memory"] == 1 << 30
        assert 0 <= device["used_memory"] <= device["total_memory"]
    assert stats["sessions_total"] >= 1


def test_daemon_stats_list_this_process_session() -> None:
    torch.empty(1, device="flagos")
    sessions = {s["id"]: s for s in torch_fl.daemon_stats()["sessions"]}
    mine = sessions[torch_fl._C._session_id()]
    assert mine["pid"] == os.getpid()
    assert mine["uid"] == os.getuid()
    assert mine["segments"] >= 1 and mine["segment_bytes"] > 0
