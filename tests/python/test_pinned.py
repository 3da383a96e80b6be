"""Pinned host memory: pin_memory(), torch.empty(..., pin_memory=True) and
DataLoader(pin_memory=True) allocate from regions of shared memory that only
this process and flagosd map; non_blocking copies from and into them move no
bytes in the client (the daemon copies straight from and into the region,
ordered on the stream), with CUDA's semantics."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_fl  # noqa: F401  (registers "flagos")
from flagos_test_env import free_tcp_port, on_kunlunxin
from test_data_plane import my_session
from test_metrics import scrape, value

MIB = 1 << 20


def test_pin_memory_and_empty_pin_memory_give_pinned_tensors() -> None:
    x = torch.randn(1000, 3)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned()
    assert p.data_ptr() != x.data_ptr()
    assert torch.equal(p, x)
    assert p[10:].is_pinned()  # a view inside a pinned block
    e = torch.empty(4096, dtype=torch.float64, pin_memory=True)
    assert e.is_pinned()
    assert e.device.type == "cpu"
    z = torch.zeros(7, pin_memory=True)
    assert z.is_pinned() and torch.equal(z, torch.zeros(7))


def test_pinned_memory_is_a_region_the_daemon_maps() -> None:
    torch.ones(1, device="flagos")
    before = my_session()["pinned_bytes"]
    p = torch.empty(3 * MIB, dtype=torch.uint8, pin_memory=True)
    assert p.is_pinned()
    # A fresh 4 MiB block (sizes round up to powers of two, as CUDA's do).
    session = my_session()
    assert session["pinned_bytes"] - before >= 3 * MIB
    # Registered for DMA through the backend's host_register slot where it
    # has one (kunlunxin: xpu_host_register); a gap on cpu.
    if on_kunlunxin():
        assert session["pinned_registered_bytes"] == session["pinned_bytes"]
    else:
        assert session["pinned_registered_bytes"] == 0


def test_blocking_copies_from_and_into_pinned_memory_match_cpu() -> None:
    x = torch.randn(257, 129).pin_memory()
    first = x.clone()
    y = x.to("flagos")
    x.fill_(0)  # a blocking copy has read x already
    ref = torch.randn(257, 129, generator=torch.Generator().manual_seed(0))
    x.copy_(ref)
    y2 = x.to("flagos") * 2
    out = torch.empty(257, 129, pin_memory=True)
    out.copy_(y2)
    assert torch.equal(out, ref * 2)
    assert torch.equal(y.cpu(), first)
    # Strided and dtype-converting copies into pinned memory.
    half = torch.empty(129, 257, dtype=torch.float64, pin_memory=True)
    half.copy_(y2.t())
    assert torch.equal(half, (ref * 2).t().double())


@pytest.mark.parametrize("sync", ["stream", "event", "device"])
def test_non_blocking_copies_are_right_after_synchronisation(sync: str) -> None:
    ref = torch.randn(64, 1024)
    src = ref.pin_memory()
    out = torch.empty(64, 1024, pin_memory=True)
    s = torch.flagos.Stream()
    with torch.flagos.stream(s):
        y = src.to("flagos", non_blocking=True)
        z = y * 3 + 1
        out.copy_(z, non_blocking=True)
        if sync == "event":
            done = torch.flagos.Event()
            done.record()
    if sync == "stream":
        s.synchronize()
    elif sync == "event":
        done.synchronize()
    else:
        torch.flagos.synchronize()
    assert torch.equal(out, ref * 3 + 1)


def test_non_blocking_copies_move_no_bytes_through_the_client() -> None:
    n = 16 * MIB
    src = torch.randint(0, 255, (n,), dtype=torch.uint8).pin_memory()
    out = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    torch.ones(1, device="flagos")
    torch.flagos.synchronize()
    before = my_session()
    y = src.to("flagos", non_blocking=True)
    out.copy_(y, non_blocking=True)
    torch.flagos.synchronize()
    after = my_session()
    assert torch.equal(out, src)
    # Neither staged nor inline: the daemon read and wrote the regions.
    assert after["staged_bytes"] == before["staged_bytes"]
    assert after["stream_bytes_received"] - before["stream_bytes_received"] < MIB
    assert after["stream_bytes_sent"] - before["stream_bytes_sent"] < MIB


def test_a_pinned_copy_larger_than_an_inline_reply_is_one_command_and_right() -> None:
    """Copies into pinned memory reply no bytes, so the 128 MiB limit of an
    inline copy_from_device does not apply: 160 MiB each way in one command
    (the daemon's one memcpy of a range is faster than several of its parts)."""
    n = 160 * MIB
    src = torch.randint(0, 255, (n,), dtype=torch.uint8).pin_memory()
    out = torch.zeros(n, dtype=torch.uint8, pin_memory=True)
    y = src.to("flagos", non_blocking=True)
    torch.flagos.synchronize()
    before = my_session()["commands"]
    out.copy_(y, non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(out, src)
    assert my_session()["commands"] - before <= 3  # the copy and the syncs
    del y


def test_reusing_a_pinned_buffer_right_after_a_non_blocking_copy_keeps_the_copy() -> None:
    # The stream is kept busy, so the copies run well after the buffers are
    # freed and their sizes allocated again and overwritten: the caching
    # allocator must hold each block until the stream has passed its copy.
    busy = torch.randn(384, 384, device="flagos")
    n = 1 << 16
    refs = [torch.full((n,), float(i)) for i in range(8)]
    copies = []
    for ref in refs:
        for _ in range(6):
            busy = busy @ busy / 384
        buf = torch.empty(n, pin_memory=True)
        buf.copy_(ref)
        copies.append(buf.to("flagos", non_blocking=True))
        del buf
        clobber = torch.empty(n, pin_memory=True)
        clobber.fill_(-1.0)
        del clobber
    torch.flagos.synchronize()
    for ref, copy in zip(refs, copies):
        assert torch.equal(copy.cpu(), ref)
    # Once the stream has passed, the cache hands the block out again.
    a = torch.empty(n, pin_memory=True)
    ptr = a.data_ptr()
    del a
    assert torch.empty(n, pin_memory=True).data_ptr() == ptr


def test_dataloader_with_pin_memory_trains_like_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(256, 12, generator=g)
    Y = X @ torch.randn(12, 3, generator=g) + 0.1 * torch.randn(256, 3, generator=g)
    torch.manual_seed(5)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    fl_model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    fl_model.load_state_dict(cpu_model.state_dict())
    fl_model.to("flagos")
    models = {"cpu": cpu_model, "flagos": fl_model}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
    losses: dict[str, list[float]] = {"cpu": [], "flagos": []}
    for device, model in models.items():
        loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=False,
                            pin_memory=(device == "flagos"))
        for epoch in range(2):
            for xb, yb in loader:
                if device == "flagos":
                    assert xb.is_pinned() and yb.is_pinned()
                xb = xb.to(device, non_blocking=True)
                yb = yb.to(device, non_blocking=True)
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opts[device].zero_grad()
                loss.backward()
                opts[device].step()
                losses[device].append(loss.item())
    assert losses["flagos"] == pytest.approx(losses["cpu"], rel=1e-4, abs=1e-6)
    for (name, p_cpu), p_fl in zip(cpu_model.named_parameters(), fl_model.parameters()):
        torch.testing.assert_close(p_fl.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=name)


def test_a_copy_naming_an_unknown_region_is_refused() -> None:
    with pytest.raises(RuntimeError) as e:
        torch_fl._C._test_bad_command("pinned_region_unknown")
    assert "names pinned region 2147483632, which session" in str(e.value)
    assert "has not attached (or has released)" in str(e.value)


def test_a_copy_past_the_end_of_a_region_is_refused() -> None:
    with pytest.raises(RuntimeError) as e:
        torch_fl._C._test_bad_command("pinned_range_outside_region")
    assert "pinned bytes [4088, +64) lie outside pinned region" in str(e.value)
    assert "(4096 bytes)" in str(e.value)


# Without shared memory (over TCP, or staging off) pinned memory is ordinary
# memory with the same semantics.
FALLBACK = """
import json, torch, torch_fl
ref = torch.randn(1000, 17)
p = ref.pin_memory()
out = torch.empty(1000, 17, pin_memory=True)
s = torch.flagos.Stream()
with torch.flagos.stream(s):
    y = p.to("flagos", non_blocking=True)
    out.copy_(y * 2, non_blocking=True)
s.synchronize()
sid = torch_fl._C._session_id()
me = next(x for x in torch_fl._C._daemon_stats("")["sessions"] if x["id"] == sid)
print(json.dumps({"pinned": p.is_pinned() and out.is_pinned(),
                  "equal": bool(torch.equal(out, ref * 2)),
                  "pinned_bytes": me["pinned_bytes"], "attached": me["staging_attached"]}))
"""


@pytest.mark.parametrize("carrier", ["tcp", "staging_off"])
def test_without_shared_memory_pinning_falls_back_to_ordinary_memory(
        carrier: str, run_python, start_daemon) -> None:
    if carrier == "tcp":
        port = free_tcp_port()
        start_daemon(extra_args=[f"--listen=127.0.0.1:{port}", "--insecure-tcp"])
        env = {"FLAGOS_ENDPOINT": f"127.0.0.1:{port}"}
    else:
        env = {"FLAGOS_STAGING": "0"}
    result = run_python(FALLBACK, env=env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"pinned": True, "equal": True, "pinned_bytes": 0, "attached": False}


CRASHING = """
import sys, torch, torch_fl
p = torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True)
y = p.to("flagos", non_blocking=True)
torch.flagos.synchronize()
print("pinned", flush=True)
sys.stdin.readline()
"""


def test_a_crashed_session_frees_its_pinned_regions(start_daemon, spawn_python, read_line) -> None:
    d = start_daemon(extra_args=["--metrics-listen=127.0.0.1:0"])
    url = d.metrics_url()
    baseline = scrape(url)
    assert value(baseline, "flagosd_pinned_bytes") == 0
    proc = spawn_python(CRASHING, env={"FLAGOS_ENDPOINT": d.endpoint})
    assert read_line(proc).strip() == "pinned"
    alive = scrape(url)
    assert value(alive, "flagosd_pinned_bytes") >= 8 * MIB
    assert value(alive, "flagosd_staging_bytes") > 0
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while value(scrape(url), "flagosd_sessions") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = scrape(url)
    assert value(after, "flagosd_sessions") == 0
    assert value(after, "flagosd_pinned_bytes") == 0
    assert value(after, "flagosd_staging_bytes") == 0
