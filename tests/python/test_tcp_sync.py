"""TCP sessions: the sync channel beside the session stream (flagos.proto, SyncAttach).

A daemon on plaintext loopback TCP (--insecure-tcp) offers each TCP session a
sync channel on a port of its own: synchronous calls go there, and bulk
copies travel raw on it, pipelined in 4 MiB pieces. Checked here: every
byte of copies at sizes around the raw-upload threshold, the 4 MiB piece and
the 8 MiB chunk, against the CPU tensor; that they did not pass through the
session stream; asynchronous errors still raised at the next
synchronisation point, a pipelined download's included, with the channel in
step afterwards; refusals of attaches that are not
the session's; a client killed in the middle of an upload; and, through a
relay that delays every byte (a 1 ms round trip; the kernel here has no
netem), that a training step makes no synchronous round trip and `.item()`
exactly one.
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from delay_relay import DelayRelay
from flagos_test_env import free_tcp_port

SYNC_LINE = re.compile(r"sync channels of TCP sessions on 127\.0\.0\.1:(\d+)")


def tcp_daemon(start_daemon):
    port = free_tcp_port()
    daemon = start_daemon(extra_args=[f"--listen=127.0.0.1:{port}", "--insecure-tcp"])
    deadline = time.monotonic() + 30
    while not (match := SYNC_LINE.search(daemon.log())):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.05)
    return daemon, port, int(match.group(1))


COPIES = """
import json, torch, torch_fl
from torch_fl import _C
sizes = [1, 1000, (256 << 10) - 1, (256 << 10) + 3, 4 << 20, (4 << 20) + 1, (8 << 20) + 5,
         (17 << 20) + 1]
g = torch.Generator().manual_seed(0)
ok = {}
for n in sizes:
    host = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    dev = host.to("flagos")
    dev[::7] += 1                       # a kernel between the copies, ordered after the upload
    expect = host.clone(); expect[::7] += 1
    back = torch.empty_like(host); back.copy_(dev)        # into a preallocated tensor
    fresh = dev[1:].cpu()                                   # at an offset, into fresh memory
    ok[n] = bool(torch.equal(back, expect)) and bool(torch.equal(fresh, expect[1:]))
x = torch.arange(10.0, device="flagos")
item = x.sum().item()
# An asynchronous error (an index out of range) is raised at the next sync point.
try:
    torch.zeros(4, device="flagos").index_add_(0, torch.tensor([9], device="flagos"),
                                                torch.ones(1, device="flagos"))
    torch.flagos.synchronize()
    raised = ""
except Exception as e:
    raised = str(e)
after = x.sum().item()
# The same, raised by a download of several pieces in flight at once; the
# pieces after the one that raised are read off the channel, so the next
# calls are answered in step.
big = torch.arange(17 << 18, dtype=torch.float32, device="flagos")   # 17 MiB
try:
    torch.zeros(4, device="flagos").index_add_(0, torch.tensor([9], device="flagos"),
                                                torch.ones(1, device="flagos"))
    big.cpu()
    raised_in_download = ""
except Exception as e:
    raised_in_download = str(e)
big_ok = bool(torch.equal(big.cpu(), torch.arange(17 << 18, dtype=torch.float32)))
after_download = x.sum().item()
sid = _C._session_id()
me = next(s for s in _C._daemon_stats("")["sessions"] if s["id"] == sid)
print(json.dumps({"ok": ok, "item": item, "after": after, "raised": raised,
                  "raised_in_download": raised_in_download, "big_ok": big_ok,
                  "after_download": after_download, "session": me}))
"""


def test_tcp_copies_keep_every_byte_and_bypass_the_stream(start_daemon, run_python) -> None:
    daemon, port, _ = tcp_daemon(start_daemon)
    out = run_python(COPIES, env={"FLAGOS_ENDPOINT": f"127.0.0.1:{port}"}, timeout=240)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(got["ok"].values()), got["ok"]
    assert got["item"] == 45.0 and got["after"] == 45.0
    assert "index" in got["raised"].lower(), got["raised"]
    assert "index" in got["raised_in_download"].lower(), got["raised_in_download"]
    assert got["big_ok"] and got["after_download"] == 45.0, got
    session = got["session"]
    assert session["sync_channel_attached"] is True and session["staging_attached"] is False
    moved = sum(int(n) for n in got["ok"])
    # Each size goes up once and down twice (the 17 MiB tensor only adds);
    # what is above the raw-upload threshold travels on the sync channel,
    # not inside the stream.
    assert int(session["sync_bytes_received"]) >= moved - 3 * (256 << 10)
    assert int(session["sync_bytes_sent"]) >= 2 * moved - 4 * (256 << 10)
    assert int(session["stream_bytes_received"]) < 2 << 20, session
    assert int(session["stream_bytes_sent"]) < 2 << 20, session
    assert "sync channel attached over TCP" in daemon.log()


def attach_frame(session_id: int, token: bytes) -> bytes:
    """A SyncAttach (fields 1 and 2), length-prefixed."""
    def varint(v: int) -> bytes:
        out = b""
        while True:
            out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
            v >>= 7
            if not v:
                return out
    body = b"\x08" + varint(session_id) + b"\x12" + varint(len(token)) + token
    return len(body).to_bytes(4, "little") + body


def answer(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


HOLD_SESSION = """
import sys, torch, torch_fl
from torch_fl import _C
torch.ones(1, device="flagos").item()
print(_C._session_id(), flush=True)
sys.stdin.readline()
print(torch.ones(3, device="flagos").sum().item(), flush=True)
"""


def test_sync_attaches_that_are_not_the_sessions_are_refused(start_daemon, spawn_python,
                                                              read_line) -> None:
    daemon, port, sync_port = tcp_daemon(start_daemon)
    client = spawn_python(HOLD_SESSION, env={"FLAGOS_ENDPOINT": f"127.0.0.1:{port}"})
    session_id = int(read_line(client))
    cases = {
        "no live session": attach_frame(session_id + 1000, b"x" * 32),
        "carries the wrong token": attach_frame(session_id, b"x" * 32),
        "is not a SyncAttach": (3).to_bytes(4, "little") + b"\xff\xff\xff",
        "claims 1000000 bytes": (1000000).to_bytes(4, "little"),
    }
    for expected, frame in cases.items():
        with socket.create_connection(("127.0.0.1", sync_port)) as sock:
            sock.sendall(frame)
            assert expected.encode() in answer(sock), expected
    # The session's own channel is untouched by all of that.
    client.stdin.write("go\n")
    client.stdin.flush()
    assert float(read_line(client)) == 3.0
    assert client.wait(timeout=60) == 0, client.stderr.read()
    assert "sync-channel attach refused" in daemon.log()


UPLOAD_FOREVER = """
import torch, torch_fl
dev = torch.empty(64 << 20, dtype=torch.uint8, device="flagos")
host = torch.ones(64 << 20, dtype=torch.uint8)
print("uploading", flush=True)
while True:
    dev.copy_(host)
"""

STATS = """
import json, torch_fl
from torch_fl import _C
print(json.dumps(_C._daemon_stats("")))
"""


def test_a_client_killed_inside_an_upload_leaves_nothing_behind(start_daemon, spawn_python,
                                                                read_line, run_python) -> None:
    daemon, port, _ = tcp_daemon(start_daemon)
    env = {"FLAGOS_ENDPOINT": f"127.0.0.1:{port}"}
    client = spawn_python(UPLOAD_FOREVER, env=env)
    assert read_line(client) == "uploading\n"
    time.sleep(1.0)  # 64 MiB copies back to back: the kill lands inside one
    client.kill()
    client.wait(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        out = run_python(STATS, env=env)
        assert out.returncode == 0, out.stderr
        stats = json.loads(out.stdout)
        mine = [s for s in stats["sessions"] if s["pid"] == str(client.pid) or s["pid"] == client.pid]
        if not mine and all(int(d.get("used_memory", 0)) == 0 for d in stats["devices"]):
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    # And the daemon serves on.
    out = run_python(COPIES, env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    assert all(json.loads(out.stdout.strip().splitlines()[-1])["ok"].values())
    assert daemon.proc.poll() is None


STEPS = """
import json, sys, time, torch, torch_fl
from torch_fl import _C
torch.manual_seed(0)
cpu = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                          torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                          torch.nn.Linear(64, 1))
import copy
dev = copy.deepcopy(cpu).to("flagos")
opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.01)
opt_dev = torch.optim.SGD(dev.parameters(), lr=0.01)
data = [(torch.randn(8, 64), torch.randn(8, 1)) for _ in range(4)]
data_dev = [(x.to("flagos"), y.to("flagos")) for x, y in data]
losses_cpu, losses_dev = [], []

def step(model, opt, x, y, out):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    out.append(loss.detach())

def requests():
    sid = _C._session_id()
    return int(next(s for s in _C._daemon_stats("")["sessions"] if s["id"] == sid)["sync_requests"])

for i in range(3):  # warm-up: operators registered, the caching allocator filled
    step(dev, opt_dev, *data_dev[i % 4], losses_dev); step(cpu, opt_cpu, *data[i % 4], losses_cpu)
torch.flagos.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    steps = int(line)
    before = requests()
    start = time.perf_counter()
    for i in range(steps):
        step(dev, opt_dev, *data_dev[i % 4], losses_dev)
        step(cpu, opt_cpu, *data[i % 4], losses_cpu)
    mid = requests()
    t_item = time.perf_counter()
    last = losses_dev[-1].item()
    item_s = time.perf_counter() - t_item
    step_s = (t_item - start) / steps
    after = requests()
    print(json.dumps({"step_requests": mid - before, "item_requests": after - mid,
                      "step_ms": step_s * 1e3, "item_ms": item_s * 1e3}), flush=True)
diff = max(abs(a.item() - b.item()) for a, b in zip(losses_dev, losses_cpu))
print(json.dumps({"max_loss_diff": diff}), flush=True)
"""


def test_at_a_1ms_round_trip_a_training_step_waits_for_none_and_item_for_one(
    start_daemon, spawn_python, read_line
) -> None:
    daemon, port, sync_port = tcp_daemon(start_daemon)
    # The client reaches the daemon through 127.0.0.2, where the relays
    # listen on the daemon's two ports; the session stream and the sync
    # channel both cross them.
    relays = [DelayRelay(("127.0.0.2", p), ("127.0.0.1", p)) for p in (port, sync_port)]
    try:
        client = spawn_python(STEPS, env={"FLAGOS_ENDPOINT": f"127.0.0.2:{port}"})
        assert read_line(client, timeout=240) == "ready\n"
        results = {}
        for delay in (0.0, 0.0005):
            for relay in relays:
                relay.delay_s = delay
            client.stdin.write("20\n")
            client.stdin.flush()
            results[delay] = json.loads(read_line(client, timeout=240))
        client.stdin.close()
        final = json.loads(read_line(client, timeout=120))
        assert client.wait(timeout=60) == 0, client.stderr.read()
    finally:
        for relay in relays:
            relay.close()
    for delay, r in results.items():
        # Counted by the daemon, not timed: no step waits on the daemon, and
        # the loss's value is one round trip.
        assert r["step_requests"] == 0, (delay, r)
        assert r["item_requests"] == 1, (delay, r)
    assert final["max_loss_diff"] < 1e-5, final
    zero, rtt = results[0.0], results[0.0005]
    print(f"\nthrough the relay: step {zero['step_ms']:.2f} ms at RTT 0, {rtt['step_ms']:.2f} ms "
          f"at RTT 1 ms ({rtt['step_ms'] / zero['step_ms']:.2f}x); .item() {zero['item_ms']:.2f} "
          f"-> {rtt['item_ms']:.2f} ms")
