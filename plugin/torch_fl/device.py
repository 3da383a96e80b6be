"""``torch.flagos``: the device module of the flagos device.

Devices are the daemon's; memory figures are this process's caching
allocator's (the same numbers ``torch.accelerator.memory_*`` reports).
Streams and events (:class:`Stream`, :class:`Event`, :func:`stream`) work as
CUDA's do: the daemon runs the work of each stream in order and different
streams concurrently.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from . import _C
from . import _inductor

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


# --------------------------------------------------------- streams, events
# Stream ids are minted by the client: 0 is each device's default stream,
# 1.._C._stream_pool_size() its pool, handed out round-robin by Stream() (as
# torch.cuda.Stream() uses CUDA's pool). Each thread has a current stream per
# device; every operation runs on the current stream of its device.

_DEVICE_TYPE = _C._device_type  # c10::DeviceType::PrivateUse1, as torch.Stream.device_type


class Stream(torch.Stream):
    """A flagos stream: an in-order queue of work on one device.

    ``Stream(device=None, priority=0)`` takes the next stream of the device's
    pool (priorities are accepted and ignored). Work on different streams
    runs concurrently; order it with events (:meth:`wait_event`,
    :meth:`wait_stream`). ``with stream:`` or ``with torch.flagos.stream(s):``
    makes it current.
    """

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:  # wraps an existing stream
            return super().__new__(
                cls,
                stream_id=kwargs["stream_id"],
                device_index=kwargs["device_index"],
                device_type=kwargs["device_type"],
            )
        return super().__new__(cls, torch.device("flagos", _index(device)), priority=priority)

    @classmethod
    def _wrap(cls, stream: torch.Stream) -> "Stream":
        return cls(
            stream_id=stream.stream_id,
            device_index=stream.device_index,
            device_type=stream.device_type,
        )

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Records ``event`` (a new :class:`Event` when None) on this stream."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def wait_event(self, event: torch.Event) -> None:
        """Work queued on this stream after this call waits for ``event``."""
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Work queued on this stream after this call waits for the work
        queued so far on ``stream``."""
        self.wait_event(Stream._wrap(stream).record_event())

    def __repr__(self) -> str:
        return f"<torch.flagos.Stream device=flagos:{self.device_index} stream_id={self.stream_id}>"


class Event(torch.Event):
    """A flagos event: marks a point in a stream's work.

    ``record()`` on a stream (the current one by default), ``wait()`` makes a
    stream wait for it, ``query()`` / ``synchronize()`` ask or wait for it
    from the host, ``elapsed_time(end)`` gives the milliseconds between two
    completed events created with ``enable_timing=True``. Creating, recording
    and waiting cost no round trip to the daemon.
    """

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> "Event":
        if interprocess:
            raise NotImplementedError(
                "flagos: interprocess events are not supported (event_ipc is a capability gap)"
            )
        event = super().__new__(
            cls, torch.device("flagos"), enable_timing=enable_timing, blocking=blocking
        )
        event._enable_timing = bool(enable_timing)
        return event

    def record(self, stream: torch.Stream | None = None) -> None:
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: torch.Stream | None = None) -> None:
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event to ``end_event``; both must have been
        created with ``enable_timing=True``, recorded and completed (as CUDA's)."""
        # torch.Event.elapsed_time accepts exactly torch.Event, not a
        # subclass: the same checks as c10::Event, then the daemon.
        if not (self._enable_timing and getattr(end_event, "_enable_timing", True)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if not (self.event_id and end_event.event_id):
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return _C._event_elapsed_time(self.event_id, end_event.event_id)

    def __repr__(self) -> str:
        return f"<torch.flagos.Event event_id={self.event_id}>"


def _check_stream(s: torch.Stream) -> None:
    if s.device_type != _DEVICE_TYPE:
        raise ValueError(f"expected a flagos stream, got a stream of {s.device}")


def current_stream(device: _DeviceLike = None) -> Stream:
    """The calling thread's current stream on ``device``."""
    idx = _index(device)
    return Stream(stream_id=_C._current_stream(idx), device_index=idx, device_type=_DEVICE_TYPE)


def default_stream(device: _DeviceLike = None) -> Stream:
    """The default stream of ``device`` (id 0)."""
    return Stream(stream_id=0, device_index=_index(device), device_type=_DEVICE_TYPE)


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` current on its device and its device current (as
    ``torch.accelerator.set_stream``). Prefer :func:`stream`."""
    if stream is None:
        return
    _check_stream(stream)
    _C._exchange_stream(stream.device_index, stream.stream_id)
    _C._set_device(stream.device_index)


class StreamContext:
    """Context manager that makes ``stream`` current for its body: its device
    becomes the current device, and its device's current stream is restored
    afterwards (as ``torch.cuda.StreamContext``). ``None`` does nothing."""

    def __init__(self, stream: torch.Stream | None) -> None:
        if stream is not None:
            _check_stream(stream)
        self.stream = stream
        self._saved: list[tuple[int, int]] = []

    def __enter__(self) -> torch.Stream | None:
        s = self.stream
        if s is not None:
            previous_device = _C._current_device()
            previous_stream = _C._exchange_stream(s.device_index, s.stream_id)
            self._saved.append((previous_device, previous_stream))
            if s.device_index != previous_device:
                _C._set_device(s.device_index)
        return s

    def __exit__(self, *exc_info: object) -> None:
        s = self.stream
        if s is not None:
            previous_device, previous_stream = self._saved.pop()
            _C._exchange_stream(s.device_index, previous_stream)
            _C._set_device(previous_device)


def stream(stream: torch.Stream | None) -> StreamContext:
    """``with torch.flagos.stream(s):`` runs its body with ``s`` current."""
    return StreamContext(stream)


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


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A table of :func:`memory_stats` for printing, as
    ``torch.cuda.memory_summary`` gives one: each figure's current value,
    its peak, and the totals allocated and freed since the last reset. The
    flagos allocator keeps no separate small and large pools, so there are
    no pool rows (``abbreviated`` changes nothing)."""
    del abbreviated
    idx = _index(device)
    stats = memory_stats(idx)
    rows = [("allocated_bytes", "Allocated memory", True),
            ("active_bytes", "Active memory", True),
            ("requested_bytes", "Requested memory", True),
            ("reserved_bytes", "Reserved memory (segments)", True),
            ("inactive_split_bytes", "Non-releasable memory", True),
            ("allocation", "Allocations", False),
            ("active", "Active allocations", False),
            ("segment", "Segments", False),
            ("inactive_split", "Non-releasable allocations", False)]
    width = 32
    head = f"{'':<{width}} {'current':>12} {'peak':>12} {'allocated':>12} {'freed':>12}"
    lines = [f"flagos memory summary, device {idx} ({get_device_name(idx)})", head,
             "-" * len(head)]
    for key, title, in_bytes in rows:
        values = [stats.get(f"{key}.all.{field}", 0)
                  for field in ("current", "peak", "allocated", "freed")]
        cells = [_human_bytes(v) if in_bytes else str(v) for v in values]
        lines.append(f"{title:<{width}} " + " ".join(f"{c:>12}" for c in cells))
    lines.append("-" * len(head))
    for key, title in (("num_device_alloc", "Segments from the daemon"),
                       ("num_device_free", "Segments returned to it"),
                       ("num_alloc_retries", "Retries after emptying the cache"),
                       ("num_ooms", "Out-of-memory errors")):
        lines.append(f"{title:<{width}} {stats.get(key, 0):>12}")
    free, total = mem_get_info(idx)
    lines.append(f"{'Device free, total':<{width}} {_human_bytes(free):>12} "
                 f"{_human_bytes(total):>12}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def device_of(obj: Any) -> Iterator[None]:
    """Makes the device of ``obj`` (a tensor) current for the body; a tensor
    that is not on flagos changes nothing."""
    if obj.device.type != "flagos":
        yield
        return
    with device(obj.device.index):
        yield


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


# ------------------------------------------------------------- graphs
# torch.cuda's graph names (torch_fl/graphs.py); torch.accelerator.Graph
# works as it is.

from .graphs import (  # noqa: E402
    Graph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)


# ------------------------------------------------- attributes torch reads
# torch.compile's inductor asks the device module for its code generators;
# flagos has none, and the answer makes inductor raise a clear error
# (torch_fl/_inductor.py).


# ``_initialized``: what torch.utils.checkpoint reads (as torch.cuda's
# attribute) to decide whether to save and restore the device's RNG state
# around a recomputation; without it a checkpointed dropout draws a new mask
# in the backward pass. True once this process has a session.


def __getattr__(name: str) -> Any:
    if name == "_initialized":
        return is_initialized()
    if name in _inductor.CODE_GENERATOR_NAMES:
        return _inductor.code_generator(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
