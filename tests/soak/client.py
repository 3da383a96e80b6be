"""One soak client: random work on flagos until its deadline, every result
checked against the same work on the CPU. Prints "ops N" as it goes and
exits 0; any wrong value raises (exit 1). Run by tests/soak/soak.py, which
SIGKILLs clients at random.

    python3 tests/soak/client.py SEED SECONDS
"""

from __future__ import annotations

import random
import sys
import time

import torch

import torch_fl  # noqa: F401  (registers "flagos")

MAX_ELEMENTS = 1 << 20  # 4 MiB of float32


def main() -> None:
    seed, seconds = int(sys.argv[1]), float(sys.argv[2])
    rng = random.Random(seed)
    torch.manual_seed(seed)
    devices = [torch.device("flagos", i) for i in range(torch.flagos.device_count())]
    streams = {d.index: [torch.flagos.Stream(d.index) for _ in range(3)] for d in devices}
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # (on flagos, its CPU reference)
    ops = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
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
        ops += 1
        if ops % 5 == 0:
            print(f"ops {ops}", flush=True)
    for on_device, reference in kept:
        assert torch.equal(on_device.cpu(), reference), "a kept tensor changed"
    torch.flagos.synchronize()
    print(f"ops {ops}", flush=True)


if __name__ == "__main__":
    main()
