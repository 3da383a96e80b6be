"""How much memory this host can still give a private flagosd.

A private daemon's cpu-backend devices live in host memory (touched as
tensors are written). Sized beyond what the host, or the cgroup this process
runs in, can still give, the kernel's OOM killer ends the program before the
daemon's allocator could raise ``torch.OutOfMemoryError``. So a private
daemon's devices share half of what is available (``MemAvailable`` of
``/proc/meminfo``, and the headroom of every memory cgroup above this
process, v1 or v2), at most ``MAX_DEVICE_MEMORY`` each; the other half is
left to the program itself and to the daemon's kernels' temporaries.
"""
from __future__ import annotations

from pathlib import Path

MiB = 1 << 20
GiB = 1 << 30
# flagosd's own default --device-memory.
MAX_DEVICE_MEMORY = 8 * GiB
# A device smaller than this would fail at the first real model.
MIN_DEVICE_MEMORY = 64 * MiB
# cgroup v1 writes "no limit" as a huge number near 2**63.
_NO_LIMIT = 1 << 62


def mem_available(meminfo: str) -> int | None:
    """MemAvailable in bytes from the text of /proc/meminfo."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            return int(fields[1]) * 1024  # kB
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return None if value >= _NO_LIMIT else value


def cgroup_headroom(proc_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The least (limit - usage) over this process's memory cgroup and its
    ancestors, from the text of /proc/self/cgroup; None when none is limited."""
    headroom: int | None = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2
            base, limit_file, usage_file = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # v1
            base, limit_file, usage_file = root / "memory", "memory.limit_in_bytes", \
                "memory.usage_in_bytes"
        else:
            continue
        directory = base / path.lstrip("/")
        while True:
            limit = _read_int(directory / limit_file)
            usage = _read_int(directory / usage_file)
            if limit is not None and usage is not None:
                left = max(0, limit - usage)
                headroom = left if headroom is None else min(headroom, left)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return headroom


def private_device_memory(devices: int, available: int | None, headroom: int | None) -> int:
    """Bytes per device for a private daemon of `devices` cpu devices: half of
    min(available, headroom) shared among them, in whole MiB, within
    [MIN_DEVICE_MEMORY, MAX_DEVICE_MEMORY]."""
    budgets = [b for b in (available, headroom) if b is not None]
    if not budgets:
        return MAX_DEVICE_MEMORY
    share = min(budgets) // 2 // max(1, devices) // MiB * MiB
    return max(MIN_DEVICE_MEMORY, min(MAX_DEVICE_MEMORY, share))


def host_device_memory(devices: int) -> int:
    """private_device_memory for this host and this process's cgroups now."""
    try:
        available = mem_available(Path("/proc/meminfo").read_text())
    except OSError:
        available = None
    try:
        headroom = cgroup_headroom(Path("/proc/self/cgroup").read_text())
    except OSError:
        headroom = None
    return private_device_memory(devices, available, headroom)
