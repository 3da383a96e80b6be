"""3. Host↔device bandwidth against a single-thread memcpy.

For 1, 64 and 256 MiB of uint8: host→device is `host.to("flagos")` followed
by `torch.flagos.synchronize()`; device→host is `d.cpu()` (which allocates a
fresh host tensor, as user code does). An extra line per size gives
device→host into a preallocated, already-touched host tensor
(`host.copy_(d)`), which separates the transport from the page faults of a
new allocation. The baseline is `ctypes.memmove` between two preallocated,
touched host buffers of the same size (glibc memcpy, one thread). GB/s are
10^9 bytes per second of the median time; ratio = flagos / memcpy.
A second line under `.cpu()` compares it with native torch paying the same
fresh allocation: `host.clone()` on CPU (a new tensor, its pages faulted in
by the copy).

Pinned rows (64 and 256 MiB): host→device is
`pinned.to("flagos", non_blocking=True)` + `torch.flagos.synchronize()`,
device→host is `pinned.copy_(d, non_blocking=True)` + synchronize, with
`pinned` from `pin_memory()` (shared with flagosd, which copies straight
from and into it: one copy in all, none in the client). Goal: 0.9 x memcpy.
"""

from __future__ import annotations

import ctypes

import torch

from common import Context, Row, median, now, standalone, synchronize

import torch_fl  # noqa: F401,E402  registers "flagos"

SECTION = "3. host↔device copies"
GOAL = 0.7  # copies of >= 64 MiB at >= 0.7 x memcpy
GOAL_MIN_BYTES = 64 << 20
PINNED_GOAL = 0.9  # pinned copies of 64 and 256 MiB at >= 0.9 x memcpy
PINNED_SIZES_MIB = (64, 256)


def _pattern(nbytes: int) -> torch.Tensor:
    """nbytes of non-constant bytes (so a copy that loses data is noticed)."""
    chunk = torch.randint(0, 256, (min(nbytes, 1 << 20),), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(nbytes))
    return chunk.repeat(nbytes // chunk.numel())


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def run(ctx: Context) -> list[Row]:
    sizes_mib = (1, 64, 256) if not ctx.quick else (1, 64)
    rows: list[Row] = []
    for mib in sizes_mib:
        nbytes = mib << 20
        repeats = ctx.scale({1: 21, 64: 9}.get(mib, 5), 3)
        host = _pattern(nbytes)
        dst = torch.empty_like(host).fill_(0)  # touched, like host

        def memcpy() -> float:
            start = now()
            ctypes.memmove(dst.data_ptr(), host.data_ptr(), nbytes)
            return now() - start

        h2d_s, d2h_s, d2h_pre_s, memcpy_s, clone_s = [], [], [], [], []
        memcpy()
        dev = host.to("flagos")  # warm-up: allocator segment, registration
        synchronize("flagos")
        dev.cpu()
        for _ in range(repeats):
            del dev
            start = now()
            dev = host.to("flagos")
            synchronize("flagos")
            h2d_s.append(now() - start)

            start = now()
            back = dev.cpu()
            d2h_s.append(now() - start)
            del back

            start = now()
            dst.copy_(dev)
            d2h_pre_s.append(now() - start)

            start = now()
            native = host.clone()
            clone_s.append(now() - start)
            del native

            memcpy_s.append(memcpy())
        if not torch.equal(dst, host):
            raise RuntimeError(f"{mib} MiB: the bytes that came back differ from those sent")
        del dev

        base = _gbps(nbytes, median(memcpy_s))
        h2d, d2h, d2h_pre, clone = (_gbps(nbytes, median(s))
                                    for s in (h2d_s, d2h_s, d2h_pre_s, clone_s))
        goal = GOAL if nbytes >= GOAL_MIN_BYTES else None
        best = [_gbps(nbytes, min(s)) for s in (h2d_s, d2h_s, d2h_pre_s, memcpy_s)]
        ctx.log(f"{mib} MiB, {repeats} repetitions: H2D {h2d:.2f} GB/s, D2H {d2h:.2f} GB/s "
                f"(preallocated {d2h_pre:.2f}), memcpy {base:.2f} GB/s, native clone {clone:.2f} GB/s; "
                f"best of each "
                + ", ".join(f"{b:.2f}" for b in best))
        rows += [
            Row(SECTION, f"H2D {mib} MiB: .to(\"flagos\") + synchronize", "GB/s", h2d, base,
                "memcpy, 1 thread", lower_is_better=False, goal=goal),
            Row(SECTION, f"D2H {mib} MiB: .cpu()", "GB/s", d2h, base, "memcpy, 1 thread",
                lower_is_better=False, goal=goal),
            Row(SECTION, "D2H .cpu() against native torch's clone() into fresh memory", "GB/s",
                d2h, clone, "CPU clone()", lower_is_better=False, extra=True),
            Row(SECTION, "D2H into a preallocated tensor: .copy_()", "GB/s", d2h_pre, base,
                "memcpy, 1 thread", lower_is_better=False, extra=True),
        ]
        if mib in PINNED_SIZES_MIB:
            rows += _pinned_rows(ctx, mib, host, dst, repeats, memcpy)
    return rows


def _pinned_rows(ctx: Context, mib: int, host: torch.Tensor, dst: torch.Tensor, repeats: int,
                 memcpy) -> list[Row]:
    """H2D from and D2H into pinned memory (non_blocking + synchronize)."""
    nbytes = mib << 20
    pinned = host.pin_memory()
    landing = torch.empty_like(host, pin_memory=True).fill_(0)  # touched
    dev = pinned.to("flagos", non_blocking=True)  # warm-up
    landing.copy_(dev, non_blocking=True)
    synchronize("flagos")
    h2d_s, d2h_s, memcpy_s = [], [], []
    for _ in range(repeats):
        start = now()
        dev.copy_(pinned, non_blocking=True)
        synchronize("flagos")
        h2d_s.append(now() - start)

        start = now()
        landing.copy_(dev, non_blocking=True)
        synchronize("flagos")
        d2h_s.append(now() - start)

        memcpy_s.append(memcpy())
    if not torch.equal(landing, host):
        raise RuntimeError(f"{mib} MiB pinned: the bytes that came back differ from those sent")
    del dev, pinned, landing
    base = _gbps(nbytes, median(memcpy_s))
    h2d, d2h = (_gbps(nbytes, median(s)) for s in (h2d_s, d2h_s))
    ctx.log(f"{mib} MiB pinned, {repeats} repetitions: H2D {h2d:.2f} GB/s, D2H {d2h:.2f} GB/s, "
            f"memcpy {base:.2f} GB/s")
    return [
        Row(SECTION, f"H2D {mib} MiB from pinned: .to(non_blocking=True) + synchronize", "GB/s",
            h2d, base, "memcpy, 1 thread", lower_is_better=False, goal=PINNED_GOAL),
        Row(SECTION, f"D2H {mib} MiB into pinned: .copy_(non_blocking=True) + synchronize",
            "GB/s", d2h, base, "memcpy, 1 thread", lower_is_better=False, goal=PINNED_GOAL),
    ]


if __name__ == "__main__":
    standalone(run, __doc__.splitlines()[0])
