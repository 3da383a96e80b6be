"""``torch.flagos``: the device module of the flagos device.

Devices are the daemon's; memory figures are this process's caching
allocator's (the same numbers ``torch.accelerator.memory_*`` reports).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from . import _C

_DeviceLike = Any  # int | str | torch.device | None


def _index(device: _DeviceLike = None) -> int:
    if device is None:
        return _C._current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "flagos":
        raise ValueError(f"expected a flagos device, got {device}")
    return _C._current_device() if device.index is None else device.index


def is_available() -> bool:
    """True if a daemon can be reached and serves at least one device."""
    return _C._device_count_no_throw() > 0


def is_initialized() -> bool:
    return _C._session_open()


def _lazy_init() -> None:
    _C._device_count()


def init() -> None:
    _lazy_init()


def device_count() -> int:
    """Devices served by the daemon; 0 if it cannot be reached."""
    return _C._device_count_no_throw()


def current_device() -> int:
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    _C._set_device(_index(device))


@contextlib.contextmanager
def device(device: _DeviceLike) -> Iterator[None]:
    """Context manager that makes ``device`` current for its body."""
    previous = _C._current_device()
    _C._set_device(_index(device))
    try:
        yield
    finally:
        _C._set_device(previous)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits until every operation enqueued on ``device`` has run; raises the
    first asynchronous error."""
    _C._synchronize(_index(device))


def get_device_name(device: _DeviceLike = None) -> str:
    idx = _index(device)
    return _C._daemon_info()["devices"][idx]["name"]


def get_device_properties(device: _DeviceLike = None) -> dict:
    idx = _index(device)
    return _C._daemon_info()["devices"][idx]


def memory_stats(device: _DeviceLike = None) -> dict:
    """The caching allocator's statistics, CUDA-style flat keys
    (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``, ...)."""
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: _DeviceLike = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: _DeviceLike = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    torch._C._accelerator_resetPeakStats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    torch._C._accelerator_resetAccumulatedStats(_index(device))


def empty_cache() -> None:
    """Returns wholly free cached segments to the daemon."""
    _C._empty_cache()


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device as the daemon accounts them."""
    idx = _index(device)
    stats = _C._daemon_stats("")
    for d in stats["devices"]:
        if d["index"] == idx:
            return d["total_memory"] - d["used_memory"], d["total_memory"]
    raise ValueError(f"flagos: the daemon reports no device {idx}")


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast("flagos", dtype=...) accepts."""
    return [torch.float16, torch.bfloat16]


def _is_in_bad_fork() -> bool:
    return False


# ---------------------------------------------------------------- random
# Each device has a default generator whose state is (seed, offset); every
# random op carries it, so results depend only on the seed and op order.


def default_generator(device: _DeviceLike = None) -> torch.Generator:
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator (no daemon round trip)."""
    _C._manual_seed_all(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic number."""
    default_generator().seed()


def seed_all() -> None:
    s = default_generator().seed()
    manual_seed_all(s)


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device: _DeviceLike = "flagos") -> torch.Tensor:
    """The generator state of ``device``: a CPU ByteTensor."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "flagos") -> None:
    default_generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
