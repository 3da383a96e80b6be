"""Graphs on flagos: ``torch.cuda``'s graph names for ``torch.flagos``.

``torch.accelerator.Graph`` works on flagos as it is (the C++ side,
plugin/csrc/graph.cpp, implements torch's graph interface); this module adds
what CUDA code spells differently: :class:`Graph` (``torch.cuda.CUDAGraph``'s
methods), :class:`graph` (``torch.cuda.graph``), :func:`graph_pool_handle`,
:func:`is_current_stream_capturing` and :func:`make_graphed_callables`.

What a capture holds and refuses, and how random operators replay, is
described in docs/graphs.md.
"""
from __future__ import annotations

import gc
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import _C

__all__ = [
    "Graph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]


def is_current_stream_capturing() -> bool:
    """True while the current stream of the current device captures a graph."""
    return _C._is_current_stream_capturing(_C._current_device())


def graph_pool_handle() -> tuple[int, int]:
    """A new memory pool id that graphs may share (``pool=`` of their capture)."""
    return _C._graph_pool_handle()


def _refuse_uncapturable_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """A global optimizer step pre-hook: as CUDA's optimizers refuse it, a
    step captured into a graph with capturable=False (its step count on the
    host, baked into the graph: every replay would repeat the captured
    step's bias correction) is refused."""
    if not is_current_stream_capturing():
        return
    if any(group.get("capturable") is False for group in optimizer.param_groups):
        raise RuntimeError(
            f"flagos: capturing step() of {type(optimizer).__name__} into a graph, but its "
            "param_groups' capturable is False: its step count lives on the host and would be "
            "fixed in the graph; construct it with capturable=True (docs/graphs.md)"
        )


register_optimizer_step_pre_hook(_refuse_uncapturable_step)


class Graph(torch.accelerator.Graph):
    """``torch.cuda.CUDAGraph`` on flagos: ``capture_begin(pool, capture_error_mode)``,
    ``capture_end``, ``replay``, ``reset``, ``pool``, ``instantiate``,
    ``enable_debug_mode``, ``debug_dump``."""

    def __new__(cls, keep_graph: bool = False) -> "Graph":
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(keep_graph, capture_error_mode="global")

    def capture_begin(  # type: ignore[override]
        self, pool: tuple[int, int] | None = None, capture_error_mode: str = "global"
    ) -> None:
        self.graph_pool = pool
        self.capture_error_mode = capture_error_mode
        super().capture_begin()


class graph:
    """``with torch.flagos.graph(g):`` captures its body into ``g`` on a side
    stream (``stream``, or one shared by all such captures), after a
    synchronize, as ``torch.cuda.graph`` does."""

    default_capture_stream: torch.Stream | None = None

    def __init__(
        self,
        flagos_graph: Graph,
        pool: tuple[int, int] | None = None,
        stream: torch.Stream | None = None,
        capture_error_mode: str = "global",
    ) -> None:
        if stream is None:
            if graph.default_capture_stream is None:
                graph.default_capture_stream = torch.flagos.Stream()
            stream = graph.default_capture_stream
        self.flagos_graph = flagos_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = torch.flagos.stream(stream)

    def __enter__(self) -> None:
        torch.flagos.synchronize()
        gc.collect()
        torch.flagos.empty_cache()
        self._stream_ctx.__enter__()
        try:
            self.flagos_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.flagos_graph.capture_end()
        finally:
            self._stream_ctx.__exit__(*exc_info)


def _flat_tensors(value: Any) -> list[torch.Tensor]:
    flat, _ = torch.utils._pytree.tree_flatten(value)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _graph_one(
    func: Callable[..., Any],
    args: tuple[torch.Tensor, ...],
    pool: tuple[int, int],
    warmup: int,
    allow_unused_input: bool,
) -> Callable[..., Any]:
    """Captures ``func``'s forward and backward on ``args`` (static inputs) and
    returns a function that replays them through autograd."""
    params = tuple(func.parameters()) if isinstance(func, torch.nn.Module) else ()
    inputs = tuple(a for a in args + params if a.requires_grad)
    stream = torch.flagos.Stream()
    torch.flagos.synchronize()
    with torch.flagos.stream(stream):
        for _ in range(warmup):  # lazy state (optimizer-free), autograd's caches
            outs = _flat_tensors(func(*args))
            needed = [o for o in outs if o.requires_grad]
            if needed and inputs:
                torch.autograd.grad(
                    needed,
                    inputs,
                    grad_outputs=[torch.empty_like(o) for o in needed],
                    allow_unused=allow_unused_input,
                )
            del outs, needed
    torch.flagos.synchronize()

    fwd, bwd = Graph(), Graph()
    with graph(fwd, pool=pool, stream=stream):
        out_struct = func(*args)
    static_outs, spec = torch.utils._pytree.tree_flatten(out_struct)
    needs_grad = [isinstance(o, torch.Tensor) and o.requires_grad for o in static_outs]
    static_grad_outs = [
        torch.empty_like(o) if needed else None for o, needed in zip(static_outs, needs_grad)
    ]
    with graph(bwd, pool=pool, stream=stream):
        grads = torch.autograd.grad(
            [o for o, n in zip(static_outs, needs_grad) if n],
            inputs,
            grad_outputs=[g for g in static_grad_outs if g is not None],
            allow_unused=allow_unused_input,
        ) if inputs and any(needs_grad) else ()
    # One gradient per argument of the Function's forward (args, then params).
    by_input = dict(zip((id(t) for t in inputs), grads))
    static_grads = tuple(by_input.get(id(a)) for a in args + params)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *new: torch.Tensor) -> tuple[Any, ...]:
            for static, given in zip(args, new[: len(args)]):
                if static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            fwd.replay()
            return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in static_outs)

        @staticmethod
        def backward(ctx: Any, *grad_outs: torch.Tensor) -> tuple[Any, ...]:
            for static, given in zip(static_grad_outs, grad_outs):
                if static is not None and given is not None and static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            bwd.replay()
            return tuple(g.detach() if g is not None else None for g in static_grads)

    def run(*new: torch.Tensor) -> Any:
        outs = Graphed.apply(*(tuple(new) + params))
        return torch.utils._pytree.tree_unflatten(list(outs), spec)

    run._flagos_graphs = (fwd, bwd)  # type: ignore[attr-defined]
    return run


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: tuple[int, int] | None = None,
) -> Any:
    """``torch.cuda.make_graphed_callables`` on flagos: each callable (a module
    or a function of tensors) is captured, forward and backward, on its
    sample arguments; calls then replay the graphs (a module replays in the
    training mode it was captured in and runs eagerly in the other). The
    callables share one memory pool and must be called in the order given,
    as on CUDA. Arguments must be tensors of the sample shapes."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if pool is None:
        pool = graph_pool_handle()
    graphed = []
    for func, args in zip(callables, sample_args):
        if not isinstance(args, tuple):
            args = (args,)
        if isinstance(func, torch.nn.Module):
            for hooks in (func._backward_hooks, func._forward_hooks, func._forward_pre_hooks):
                if hooks:
                    raise RuntimeError(
                        "flagos: make_graphed_callables takes modules without hooks "
                        "(registered hooks would not run in a replay)"
                    )
        run = _graph_one(func, args, pool, num_warmup_iters, allow_unused_input)
        if isinstance(func, torch.nn.Module):
            captured_training = func.training
            eager_forward = func.forward

            def forward(*a: Any, _run=run, _eager=eager_forward, _mod=func,
                        _mode=captured_training, **kw: Any) -> Any:
                if _mod.training == _mode and not kw:
                    return _run(*a)
                return _eager(*a, **kw)

            func.forward = forward  # type: ignore[method-assign]
            graphed.append(func)
        else:
            graphed.append(run)
    return graphed[0] if single else tuple(graphed)
