"""The shared-memory data plane: a same-node session moves tensor bytes
through its staging region, never inside the gRPC session stream."""

from __future__ import annotations

import json
import os
import threading

import torch

import torch_fl  # noqa: F401  (registers "flagos")

MIB = 1 << 20


def my_session() -> dict:
    sid = torch_fl._C._session_id()
    for session in torch_fl._C._daemon_stats("")["sessions"]:
        if session["id"] == sid:
            return session
    raise AssertionError(f"session {sid} is not listed by the daemon")


def test_session_attaches_a_staging_region_and_reports_its_uid() -> None:
    torch.ones(1, device="flagos")
    session = my_session()
    assert session["staging_attached"]
    assert session["uid"] == os.getuid()


def test_256_mib_round_trip_moves_no_tensor_bytes_through_the_stream() -> None:
    x = torch.randint(-(2**31), 2**31 - 1, (64 * MIB,), dtype=torch.int32)  # 256 MiB
    torch.ones(1, device="flagos")
    torch.flagos.synchronize()
    before = my_session()
    y = x.to("flagos")
    z = y.cpu()
    after = my_session()
    assert torch.equal(x, z)
    assert after["staged_bytes"] - before["staged_bytes"] >= 2 * x.nbytes
    # Commands only: a few dozen bytes per chunk of up to 16 MiB.
    assert after["stream_bytes_received"] - before["stream_bytes_received"] < MIB
    assert after["stream_bytes_sent"] - before["stream_bytes_sent"] < MIB


# The counters do count tensor bytes when they travel inline (a negative
# control for the test above).
INLINE = """
import json, torch, torch_fl
def mine():
    sid = torch_fl._C._session_id()
    return next(s for s in torch_fl._C._daemon_stats("")["sessions"] if s["id"] == sid)
x = torch.arange(4 << 20, dtype=torch.float32)   # 16 MiB
torch.ones(1, device="flagos")
before = mine()
z = x.to("flagos").cpu()
after = mine()
print(json.dumps({
    "equal": bool(torch.equal(x, z)), "attached": after["staging_attached"],
    "received": after["stream_bytes_received"] - before["stream_bytes_received"],
    "sent": after["stream_bytes_sent"] - before["stream_bytes_sent"],
    "nbytes": x.nbytes,
}))
"""


def test_with_staging_off_bytes_travel_inline_and_are_counted(run_python) -> None:
    result = run_python(INLINE, env={"FLAGOS_STAGING": "0"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["equal"]
    assert not out["attached"]
    assert out["received"] >= out["nbytes"]
    assert out["sent"] >= out["nbytes"]


def test_strided_and_dtype_converting_copies_through_staging() -> None:
    base = torch.randn(300, 500, dtype=torch.float64)
    cases = [
        base,
        base.t(),                      # non-contiguous source
        base[::3, 1::2],               # gaps
        base.to(torch.float16),
        torch.randint(0, 2, (777,), dtype=torch.bool),
    ]
    for x in cases:
        assert torch.equal(x.to("flagos").cpu(), x)
    # Into a strided destination on the device.
    dst = torch.zeros(500, 300, dtype=torch.float64, device="flagos").t()
    dst.copy_(base)
    assert torch.equal(dst.cpu(), base)


def test_large_copies_at_odd_sizes_and_offsets_keep_every_byte() -> None:
    """Sizes around the 1 MiB line where host copies switch to streaming
    stores, and past one 16 MiB staging chunk; sources and destinations that
    start mid-line; destinations fresh (`.cpu()`) and already written (the
    bytes around the range must stay)."""
    pattern = torch.randint(0, 256, (41 * MIB + 64,), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(5))
    for n in (MIB - 1, MIB, MIB + 3, 17 * MIB + 5, 41 * MIB):
        for offset in (0, 1, 37):
            src = pattern[offset:offset + n]
            dev = src.to("flagos")
            assert torch.equal(dev.cpu(), src), (n, offset)
            landing = torch.full((n + 80,), 7, dtype=torch.uint8)
            landing[offset + 3:offset + 3 + n].copy_(dev)
            assert torch.equal(landing[offset + 3:offset + 3 + n], src), (n, offset)
            assert int((landing[:offset + 3] != 7).sum()) == 0, (n, offset)
            assert int((landing[offset + 3 + n:] != 7).sum()) == 0, (n, offset)
            # Device to device (the cpu backend's own copies) at an odd offset.
            moved = torch.empty(n + 9, dtype=torch.uint8, device="flagos")
            moved[9:].copy_(dev)
            assert torch.equal(moved[9:].cpu(), src), (n, offset)


def test_concurrent_copies_from_several_threads_stay_intact() -> None:
    errors: list[str] = []

    def worker(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for size in (17, 4096, 3 * MIB + 5, 9 * MIB):
            x = torch.randint(0, 255, (size,), dtype=torch.uint8, generator=g)
            back = x.to("flagos").cpu()
            if not torch.equal(back, x):
                errors.append(f"thread {seed}: {size} bytes came back different")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_batch_left_idle_is_sent_without_a_synchronize() -> None:
    import time

    a = torch.ones(16, device="flagos")
    torch.flagos.synchronize()
    before = my_session()["commands"]
    a.add_(1)  # one command, far below the batch bound, and no sync point
    deadline = time.monotonic() + 10
    while my_session()["commands"] == before and time.monotonic() < deadline:
        time.sleep(0.005)
    assert my_session()["commands"] > before, "the idle batch never reached the daemon"
    assert torch.equal(a.cpu(), torch.full((16,), 2.0))


# A data-dependent result stays in the daemon: the client learns its sizes,
# allocates device memory and the daemon places it there (hold_results /
# place_result), so its bytes never come to the client. Inline (no staging
# region, no sync channel) every byte the daemon sends is counted.
HELD = """
import json, torch, torch_fl
def mine():
    sid = torch_fl._C._session_id()
    return next(s for s in torch_fl._C._daemon_stats("")["sessions"] if s["id"] == sid)
n = 2 << 20
x = torch.ones(n, device="flagos")
torch.flagos.synchronize()
before = mine()
idx = torch.nonzero(x)                    # 2M x 1 int64: 16 MiB
picked = torch.masked_select(x, x > 0)    # 2M floats: 8 MiB
torch.flagos.synchronize()
after = mine()
print(json.dumps({
    "shape": list(idx.shape), "last": idx[-1].item(), "sum": idx.sum().item(),
    "picked": picked.numel(), "picked_sum": picked.sum().item(),
    "sent": after["stream_bytes_sent"] - before["stream_bytes_sent"],
}))
"""


def test_data_dependent_results_stay_in_the_daemon(run_python) -> None:
    proc = run_python(HELD, env={"FLAGOS_STAGING": "0"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    n = 2 << 20
    assert out["shape"] == [n, 1] and out["last"] == n - 1
    assert out["sum"] == n * (n - 1) // 2
    assert out["picked"] == n and out["picked_sum"] == float(n)
    assert out["sent"] < MIB, f"{out['sent']} bytes came back for 24 MiB of held results"


# A client that attaches its staging region while others hold connections
# to the staging socket open, dripping a byte at a time.
ATTACH_AFTER_GO = """
import json, sys, torch, torch_fl
print("ready", flush=True)
sys.stdin.readline()
x = torch.ones(4 << 20, device="flagos")  # 16 MiB: through its staging region
sid = torch_fl._C._session_id()
s = next(s for s in torch_fl._C._daemon_stats("")["sessions"] if s["id"] == sid)
print(json.dumps({"attached": s["staging_attached"], "sum": x.sum().item()}), flush=True)
"""

ATTACH_DEADLINE_S = 5  # kAttachDeadlineSeconds (daemon/transport/attach_frame.h)


def test_clients_dripping_into_the_staging_socket_hold_up_no_other_attach(
    endpoint: str, spawn_python, read_line
) -> None:
    import socket

    client = spawn_python(ATTACH_AFTER_GO)
    assert read_line(client) == "ready\n"
    path = endpoint.removeprefix("unix://") + ".staging"
    stop = threading.Event()
    drippers = []
    for _ in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.send((1000).to_bytes(4, "little"))  # a frame of 1000 bytes, never all sent
        drippers.append(sock)

    def drip() -> None:
        while not stop.is_set():
            for sock in drippers:
                try:
                    sock.send(b"x")
                except OSError:
                    pass
            stop.wait(0.2)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        client.stdin.write("go\n")
        client.stdin.flush()
        line = read_line(client)
        assert line, client.communicate(timeout=30)[1]
        out = json.loads(line)
        assert out == {"attached": True, "sum": float(4 << 20)}
        # Each dripping connection is answered and closed at the attach
        # deadline, however it keeps sending.
        for sock in drippers:
            sock.settimeout(ATTACH_DEADLINE_S + 30)
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
            assert f"the attach did not complete within {ATTACH_DEADLINE_S} s".encode() in received
    finally:
        stop.set()
        thread.join(timeout=10)
        for sock in drippers:
            sock.close()
