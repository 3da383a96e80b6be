"""One soak client: random work on flagos until its deadline, every result
checked against the same work on the CPU. Prints "ops N" as it goes and
exits 0; any wrong value raises (exit 1). Run by tests/soak/soak.py, which
SIGKILLs clients at random and restarts the daemon once: then the client
sees its session lost (torch.AcceleratorError), checks that a tensor of it
is refused, makes its kept tensors again from their CPU copies (its
checkpoint) in a new session and carries on, printing "lost N".

    python3 tests/soak/client.py SEED SECONDS
"""

from __future__ import annotations

import random
import sys
import time

import torch

import torch_fl  # noqa: F401  (registers "flagos")

MAX_ELEMENTS = 1 << 20  # 4 MiB of float32


def connect(seconds: float = 30.0) -> None:
    """The first session, waiting for a daemon that soak.py is restarting."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            torch.ones(1, device="flagos").sum().item()
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    seed, seconds = int(sys.argv[1]), float(sys.argv[2])
    rng = random.Random(seed)
    torch.manual_seed(seed)
    connect()
    devices = [torch.device("flagos", i) for i in range(torch.flagos.device_count())]
    streams = {d.index: [torch.flagos.Stream(d.index) for _ in range(3)] for d in devices}
    # The client's checkpoint: each kept tensor's CPU reference, from which
    # it is made again on the device after a lost session.
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # (on flagos, its CPU reference)
    ops = losses = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            step(rng, devices, streams, kept)
        except torch.AcceleratorError as error:
            # flagosd was restarted (soak.py): the session is lost. A tensor
            # of it must be refused, never read; then resume from the
            # checkpoint in a new session.
            assert "was lost" in str(error), f"not a lost session: {error}"
            losses += 1
            for on_device, _ in kept[:1]:
                try:
                    on_device.cpu()
                    raise AssertionError("a tensor of the lost session was read")
                except torch.AcceleratorError as refused:
                    assert "which was lost" in str(refused), str(refused)
            kept = [(reference.to(on_device.device), reference)
                    for on_device, reference in kept]
            print(f"lost {losses}", flush=True)
        ops += 1
        if ops % 5 == 0:
            print(f"ops {ops}", flush=True)
    for on_device, reference in kept:
        assert torch.equal(on_device.cpu(), reference), "a kept tensor changed"
    torch.flagos.synchronize()
    print(f"ops {ops}", flush=True)


def step(rng: random.Random, devices: list[torch.device],
         streams: dict[int, list[torch.flagos.Stream]],
         kept: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """One random operation, checked against the CPU."""
    device = rng.choice(devices)
    kind = rng.choice(("alloc", "copy", "op", "streams", "keep", "drop"))
    if kind == "alloc":
        x = torch.empty(rng.randint(1, MAX_ELEMENTS), device=device)
        del x
    elif kind == "copy":
        a = torch.randn(rng.randint(1, MAX_ELEMENTS))
        b = a.to(device)
        back = b.cpu()
        assert torch.equal(back, a), "a copy to the device and back changed the bytes"
        other = rng.choice(devices)
        assert torch.equal(b.to(other).cpu(), a), "a device-to-device copy changed bytes"
    elif kind == "op":
        n = rng.randint(1, 256)
        a, b = torch.randn(n, n), torch.randn(n, n)
        got = (a.to(device) @ b.to(device)).relu().sum(dim=0).cpu()
        want = (a @ b).relu().sum(dim=0)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-3), "matmul differs from CPU"
    elif kind == "streams":
        # Work on a side stream, ordered after the current one by an event
        # and back by another.
        side = rng.choice(streams[device.index])
        a = torch.randn(rng.randint(1, 1 << 16))
        x = a.to(device)
        ready = torch.flagos.Event()
        ready.record(torch.flagos.current_stream(device.index))
        with torch.flagos.stream(side):
            side.wait_event(ready)
            y = x * 2 + 1
            done = torch.flagos.Event()
            done.record(side)
        torch.flagos.current_stream(device.index).wait_event(done)
        assert torch.equal(y.cpu(), a * 2 + 1), "work on a side stream gave another result"
    elif kind == "keep" and len(kept) < 8:
        a = torch.randn(rng.randint(1, 1 << 18))
        kept.append((a.to(device), a))
    elif kind == "drop" and kept:
        on_device, reference = kept.pop(rng.randrange(len(kept)))
        assert torch.equal(on_device.cpu(), reference), "a kept tensor changed"


if __name__ == "__main__":
    main()
