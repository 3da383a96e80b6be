"""Streams and events on flagos: the daemon runs each stream's work in order
and different streams concurrently; events order streams and time work;
the caching allocator keeps a block used on another stream (record_stream)
until that stream's work is done. Values are compared with CPU torch."""

from __future__ import annotations

import time

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")

from flagos_test_env import on_kunlunxin

FL = "flagos"
POLL_TIMEOUT_S = 120.0


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def long_chain(x: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` matmuls of x with itself, scaled to stay finite: long work
    (on flagos about 0.1 s per step at 2048x2048 on two cores)."""
    scale = x.shape[0] ** 0.5
    y = x
    for _ in range(steps):
        y = (y @ x) / scale
    return y


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-4)


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {POLL_TIMEOUT_S} s")
        time.sleep(0.001)


# ----------------------------------------------------------- stream objects


def test_default_stream_semantics() -> None:
    current = torch.flagos.current_stream()
    assert isinstance(current, torch.flagos.Stream) and isinstance(current, torch.Stream)
    assert current == torch.flagos.default_stream()
    assert current.stream_id == 0 and current.device == torch.device(FL, 0)
    assert torch.flagos.default_stream(1).device == torch.device(FL, 1)
    assert torch.flagos.default_stream(1) != torch.flagos.default_stream(0)
    side = torch.flagos.Stream()
    assert side != torch.flagos.default_stream()
    assert 1 <= side.stream_id <= torch_fl._C._stream_pool_size()
    assert side.device == torch.device(FL, 0)
    assert torch.flagos.Stream(device=1).device == torch.device(FL, 1)
    # Creating a stream does not make it current.
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_stream_context_makes_the_stream_current_and_restores() -> None:
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        assert torch.flagos.current_stream() == side
        assert torch.accelerator.current_stream() == side
    assert torch.flagos.current_stream() == torch.flagos.default_stream()
    # A stream of another device makes that device current for the body.
    other = torch.flagos.Stream(1)
    with torch.flagos.stream(other):
        assert torch.flagos.current_device() == 1
        assert torch.flagos.current_stream() == other
        t = torch.ones(3, device=FL)
        assert t.device == torch.device(FL, 1)
    assert torch.flagos.current_device() == 0
    assert torch.flagos.current_stream(1) == torch.flagos.default_stream(1)
    # torch.Stream's own context manager, and stream(None), work too.
    with side:
        assert torch.flagos.current_stream() == side
    assert torch.flagos.current_stream() == torch.flagos.default_stream()
    with torch.flagos.stream(None):
        assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_set_stream_and_accelerator_stream_api() -> None:
    side = torch.flagos.Stream()
    try:
        torch.flagos.set_stream(side)
        assert torch.flagos.current_stream() == side
        assert torch.accelerator.current_stream() == side
    finally:
        torch.flagos.set_stream(torch.flagos.default_stream())
    assert torch.accelerator.current_stream().stream_id == 0
    try:
        torch.accelerator.set_stream(side)
        assert torch.flagos.current_stream() == side
    finally:
        torch.accelerator.set_stream(torch.flagos.default_stream())
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_a_stream_id_that_is_not_a_flagos_stream_is_refused() -> None:
    bogus = torch.flagos.Stream(stream_id=999, device_index=0, device_type=torch_fl._C._device_type)
    with pytest.raises(RuntimeError, match="not a flagos stream"):
        torch.flagos.set_stream(bogus)
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


# ------------------------------------------------------------------ ordering


def test_ops_on_a_side_stream_are_correct_after_synchronize() -> None:
    a, b = randn(64, 32, seed=1), randn(32, 16, seed=2)
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        x, y = a.to(FL), b.to(FL)
        z = torch.relu(x @ y) * 3 - 1
        w = z.sum(dim=0)
    side.synchronize()
    assert side.query()
    close(z, torch.relu(a @ b) * 3 - 1)
    close(w, (torch.relu(a @ b) * 3 - 1).sum(dim=0))


def test_work_on_one_stream_runs_in_order() -> None:
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        t = torch.zeros(1000, device=FL)
        for i in range(50):
            t.mul_(2).add_(i)
        got = t.cpu()  # the copy runs on `side`, after every update
    expected = torch.zeros(1000)
    for i in range(50):
        expected.mul_(2).add_(i)
    assert torch.equal(got, expected)


def test_cross_stream_wait_with_an_event() -> None:
    a = randn(1024, 1024, seed=3)
    producer, consumer = torch.flagos.Stream(), torch.flagos.Stream()
    assert producer != consumer
    with torch.flagos.stream(producer):
        x = a.to(FL)
        y = long_chain(x, 4)
        ready = producer.record_event()
    consumer.wait_event(ready)
    with torch.flagos.stream(consumer):
        z = y * 2 + 1
        got = z.cpu()
    close(got, long_chain(a, 4) * 2 + 1)


def test_wait_stream_orders_the_whole_stream() -> None:
    a = randn(512, 512, seed=4)
    producer, consumer = torch.flagos.Stream(), torch.flagos.Stream()
    with torch.flagos.stream(producer):
        y = long_chain(a.to(FL), 3)
    consumer.wait_stream(producer)
    with torch.flagos.stream(consumer):
        got = (y - 0.5).cpu()
    close(got, long_chain(a, 3) - 0.5)


def test_an_event_orders_the_default_stream_after_a_side_stream() -> None:
    a = randn(256, 256, seed=5)
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        y = long_chain(a.to(FL), 2)
        done = torch.flagos.Event()
        done.record()
    done.wait()  # on the current (default) stream
    close(y + 0, long_chain(a, 2))


# -------------------------------------------------------------------- events


def test_event_query_and_synchronize() -> None:
    fresh = torch.flagos.Event()
    assert fresh.query()  # never recorded: complete, as in CUDA
    fresh.synchronize()
    a = randn(1024, 1024, seed=6)
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        y = long_chain(a.to(FL), 3)
    event = side.record_event()
    assert isinstance(event, torch.flagos.Event) and isinstance(event, torch.Event)
    event.synchronize()
    assert event.query()
    with torch.flagos.stream(side):
        close(y, long_chain(a, 3))


def test_elapsed_time_with_enable_timing() -> None:
    start = torch.flagos.Event(enable_timing=True)
    end = torch.flagos.Event(enable_timing=True)
    x = randn(1024, 1024, seed=7).to(FL)
    start.record()
    y = long_chain(x, 2)
    end.record()
    end.synchronize()
    close(y, long_chain(x.cpu(), 2))
    if on_kunlunxin():
        # libxpurt has no elapsed-time call: a declared gap, a clear error.
        with pytest.raises(NotImplementedError, match="not supported by the kunlunxin backend"):
            start.elapsed_time(end)
        return
    ms = start.elapsed_time(end)
    assert ms > 0.0
    assert end.elapsed_time(start) <= 0.0
    assert start.elapsed_time(start) == 0.0
    close(y, long_chain(x.cpu(), 2))
    # torch.Event on flagos (the device-generic event) times the same way.
    g0, g1 = torch.Event(FL, enable_timing=True), torch.Event(FL, enable_timing=True)
    g0.record()
    torch.flagos.synchronize()
    g1.record()
    g1.synchronize()
    assert g0.elapsed_time(g1) >= 0.0


def test_elapsed_time_needs_timing_events_that_were_recorded() -> None:
    timed = torch.flagos.Event(enable_timing=True)
    untimed = torch.flagos.Event()
    timed.record()
    untimed.record()
    torch.flagos.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):
        timed.elapsed_time(untimed)
    with pytest.raises(ValueError, match="enable_timing=True"):
        untimed.elapsed_time(timed)
    with pytest.raises(ValueError, match="recorded"):
        timed.elapsed_time(torch.flagos.Event(enable_timing=True))
    # The device-generic torch.Event checks the same.
    g0, g1 = torch.Event(FL), torch.Event(FL)
    g0.record()
    g1.record()
    g1.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):
        g0.elapsed_time(g1)


def test_many_short_lived_events_leave_no_error() -> None:
    x = torch.ones(16, device=FL)
    side = torch.flagos.Stream()
    for i in range(200):
        e = torch.flagos.Event(enable_timing=i % 2 == 0)
        e.record(side if i % 3 else None)
        e.wait()
        x = x + 1
        del e
    torch.flagos.synchronize()  # raises any asynchronous error
    assert torch.equal(x.cpu(), torch.full((16,), 201.0))


def test_interprocess_events_are_not_supported() -> None:
    with pytest.raises(NotImplementedError, match="interprocess"):
        torch.flagos.Event(interprocess=True)


# ------------------------------------------------------------------- overlap


def test_two_streams_run_concurrently() -> None:
    big = randn(2048, 2048, seed=8)
    small = randn(8, 8, seed=9)
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    x = big.to(FL)
    s = small.to(FL)
    torch.flagos.synchronize()
    s1.wait_stream(torch.flagos.default_stream())
    s2.wait_stream(torch.flagos.default_stream())
    with torch.flagos.stream(s1):
        y = long_chain(x, 10)  # about a second of work
        e1 = s1.record_event()
    with torch.flagos.stream(s2):
        t = s @ s + 1
        e2 = s2.record_event()
    # Stream 2's work finishes while stream 1 is still busy.
    wait_until(e2.query, "the event of stream 2 did not complete")
    assert not e1.query(), "stream 2 waited for stream 1's long work"
    assert not s1.query()
    assert s2.query()
    e1.synchronize()
    assert e1.query() and s1.query()
    with torch.flagos.stream(s2):
        close(t, small @ small + 1)
    with torch.flagos.stream(s1):
        close(y, long_chain(big, 10))


def test_accelerator_synchronize_waits_for_every_stream() -> None:
    a = randn(1024, 1024, seed=10)
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    with torch.flagos.stream(s1):
        y1 = long_chain(a.to(FL), 3)
        e1 = s1.record_event()
    with torch.flagos.stream(s2):
        y2 = long_chain(a.to(FL), 2)
        e2 = s2.record_event()
    torch.accelerator.synchronize()
    assert e1.query() and e2.query() and s1.query() and s2.query()
    close(y1, long_chain(a, 3))
    close(y2, long_chain(a, 2))


# ----------------------------------------------------------------- allocator


def test_blocks_are_reused_only_on_their_stream() -> None:
    torch.flagos.empty_cache()  # stream ids recur: start from empty pools
    side = torch.flagos.Stream()
    n = 1 << 16
    with torch.flagos.stream(side):
        t = torch.empty(n, device=FL)
        ptr = t.data_ptr()
        del t
        again = torch.empty(n, device=FL)
        assert again.data_ptr() == ptr  # same stream: reused
    other = torch.flagos.Stream()
    assert other != side
    with torch.flagos.stream(other):
        elsewhere = torch.empty(n, device=FL)
    assert elsewhere.data_ptr() != ptr  # held by `again`; and never from side's pool
    del again
    with torch.flagos.stream(other):
        third = torch.empty(n, device=FL)
    assert third.data_ptr() != ptr  # side's free block is not other's
    del elsewhere, third


def test_record_stream_keeps_a_block_until_the_other_streams_work_is_done() -> None:
    torch.flagos.empty_cache()  # stream ids recur: start from empty pools
    a, b = torch.flagos.Stream(), torch.flagos.Stream()
    assert a != b
    n = 1 << 20
    big = randn(2048, 2048, seed=11).to(FL)
    torch.flagos.synchronize()
    before = torch.flagos.memory_allocated()
    with torch.flagos.stream(a):
        x = torch.full((n,), 1.0, device=FL)  # a block of stream a
        ptr = x.data_ptr()
    b.wait_stream(a)
    with torch.flagos.stream(b):
        slow = long_chain(big, 6)  # b reads x only after this
        y = x * 2
    x.record_stream(b)
    del x  # the block goes back to a's pool at once ...
    with torch.flagos.stream(a):
        x2 = torch.empty(n, device=FL)
        assert x2.data_ptr() == ptr  # ... and is reused on a,
        x2.fill_(5.0)  # but this write waits for b's read
    with torch.flagos.stream(b):
        got = y.cpu()
    assert torch.equal(got, torch.full((n,), 2.0))
    with torch.flagos.stream(a):
        assert torch.equal(x2.cpu(), torch.full((n,), 5.0))
    del x2, y, slow
    torch.flagos.synchronize()
    assert torch.flagos.memory_allocated() == before


def test_memory_statistics_stay_correct_with_streams() -> None:
    torch.flagos.synchronize()
    before = torch.flagos.memory_allocated()
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        t = torch.empty(1000, device=FL)  # 4000 bytes, rounded up to 4096
    assert torch.flagos.memory_allocated() == before + 4096
    t.record_stream(torch.flagos.default_stream())
    del t
    assert torch.flagos.memory_allocated() == before
    assert torch.flagos.memory_reserved() >= torch.flagos.memory_allocated()
