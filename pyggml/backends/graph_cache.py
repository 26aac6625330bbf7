"""Graph reuse: build a graph once per input shape, compute it again and again with new inputs.

A :class:`GraphCache` holds graphs built by your function, one per *key* (usually the input
shapes, e.g. a padded sequence length and a batch size), at most ``max_graphs`` of them (least
recently used first out). Computing a cached graph costs setting its inputs, ggml's compute and
reading its outputs: the graph is not rebuilt, and its checks are not repeated (see
:mod:`pyggml.core.graph`). Inputs are set and outputs read by name::

    def build(ctx, T, B):                      # called once per key (T, B)
        tokens = ctx.new_tensor("i32", [T, B]).set_input()
        ...
        return {"tokens": tokens}, {"embeddings": out}

    cache = GraphCache(build, backend=cpu)     # or backends=[gpu, cpu], or scheduler=...
    out = cache.compute((T, B), tokens=ids)    # {"embeddings": ndarray}, NumPy order

With ``backend`` the graphs share one graph allocator, and with ``scheduler`` one scheduler:
computing another key places that graph's tensors in the memory again (a C walk of the graph,
no Python one). With ``backends`` each graph has a scheduler of its own over those backends,
placed once: keys can alternate without placing anything again, and the splits a GPU backend
gets stay the same from one compute to the next (ggml-cuda replays its captured CUDA graph of
a split only then), at the cost of one compute buffer per cached graph. With
:meth:`GraphCache.compute_async` a backend that computes asynchronously (a GPU) gets the next
graph while Python prepares the following inputs.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from .. import types
from .alloc import GraphAllocator
from .backend import Backend
from ..core.context import Context
from ..enums import GGMLType
from ..errors import ClosedError
from ..core.graph import Graph
from .graph_run import run_of
from .sched import Scheduler
from ..core.tensor import Tensor

__all__ = ["GraphCache", "CachedGraph", "BuildFn"]

#: ``build(ctx, *key) -> (inputs, outputs)``: two {name: Tensor} mappings
BuildFn = Callable[..., "tuple[Mapping[str, Tensor], Mapping[str, Tensor]]"]


class CachedGraph:
    """One graph of a :class:`GraphCache`: its context, the graph, and its named input and
    output tensors. Closed (with its context) when the cache drops it."""

    def __init__(self, key: Hashable, ctx: Context, graph: Graph, inputs: Mapping[str, Tensor],
                 outputs: Mapping[str, Tensor], scheduler: Scheduler | None = None):
        self.key = key
        self.ctx = ctx
        self.graph = graph
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        #: the graph's own scheduler (a cache made with ``backends``), else None
        self.scheduler = scheduler
        self.computes = 0  # computations started: a pending result knows whether it is the last

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        self.ctx.close()


def _one_at_a_time(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A GraphCache method that holds the cache's lock (threads take turns)."""
    @functools.wraps(fn)
    def locked(self: "GraphCache", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(self, *args, **kwargs)
    return locked


class GraphCache:
    """Graphs built by ``build`` once per key, computed on ``backend`` (through one
    :class:`~pyggml.backends.alloc.GraphAllocator`), by ``scheduler``, or each by a
    :class:`~pyggml.backends.sched.Scheduler` of its own over ``backends`` (in priority order, the CPU
    last; the graph's ``graph_size`` is the scheduler's too).

    ``build(ctx, *key)`` makes the graph's tensors in ``ctx`` (a ``no_alloc`` context of
    ``n_tensors`` tensors) and returns ``(inputs, outputs)``, two ``{name: Tensor}`` mappings:
    inputs are marked ``set_input()`` and outputs ``set_output()`` for you. The graph holds up to
    ``graph_size`` nodes. Raises ValueError for bad arguments and what ``build`` raises.

    Threads may share a cache: :meth:`get`, :meth:`compute` and :meth:`close` run one at a
    time (a compute sets the inputs, computes and reads the outputs as one step).
    """

    def __init__(self, build: BuildFn, *, backend: Backend | None = None,
                 scheduler: Scheduler | None = None, backends: Sequence[Backend] | None = None,
                 graph_size: int = 2048, n_tensors: int | None = None, max_graphs: int = 8):
        if sum(x is not None for x in (backend, scheduler, backends)) != 1:
            raise ValueError("give a backend, a scheduler or backends (one of them)")
        if max_graphs < 1 or graph_size < 1:
            raise ValueError("max_graphs and graph_size must be >= 1")
        self._build = build
        self.backend = backend
        self.scheduler = scheduler
        self.backends = list(backends) if backends is not None else None
        self.graph_size = graph_size
        self.n_tensors = n_tensors or graph_size * 2
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Hashable, CachedGraph] = OrderedDict()
        self._galloc = GraphAllocator(backend) if backend is not None else None
        self._closed = False
        self._lock = threading.RLock()  # one get/compute/close at a time, outside the gate
        self.builds = 0  # how many graphs were built (for tests and benchmarks)

    # ------------------------------------------------------------------ graphs
    @_one_at_a_time
    def get(self, key: Hashable) -> CachedGraph:
        """The graph of ``key``, built (and allocated) on first use. Raises ClosedError once
        the cache is closed."""
        if self._closed:
            raise ClosedError("this graph cache is closed")
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry
        args = key if isinstance(key, tuple) else (key,)
        ctx = Context.for_tensors(self.n_tensors, graph_size=self.graph_size)
        try:
            inputs, outputs = self._build(ctx, *args)
            for name, t in {**inputs, **outputs}.items():
                if not isinstance(t, Tensor):
                    raise TypeError(f"build must return Tensors, {name!r} is {type(t).__name__}")
            for t in inputs.values():
                t.set_input()
            for t in outputs.values():
                t.set_output()
            graph = ctx.new_graph(self.graph_size).build_forward(*outputs.values())
            sched = (Scheduler(self.backends, graph_size=2 * self.graph_size + 64)
                     if self.backends is not None else None)
        except BaseException:
            ctx.close()
            raise
        entry = self._graphs[key] = CachedGraph(key, ctx, graph, inputs, outputs, sched)
        self.builds += 1
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)[1].close()
        return entry

    def _sched(self, entry: CachedGraph) -> Scheduler | None:
        """The scheduler that computes ``entry``: its own, the cache's, or None (a backend)."""
        return entry.scheduler or self.scheduler

    def _place(self, entry: CachedGraph) -> None:
        graph = entry.graph
        s = self._sched(entry)
        if s is not None:
            if not (s._graph is graph and s._is_alloc and run_of(graph).split_by is s):
                s.alloc_graph(graph)
        else:
            assert self._galloc is not None
            if self._galloc._graph is not graph:
                self._galloc.alloc_graph(graph)

    @staticmethod
    def _check_names(entry: CachedGraph, inputs: Mapping[str, Any]) -> None:
        if inputs.keys() == entry.inputs.keys():
            return
        missing = set(entry.inputs) - set(inputs)
        unknown = set(inputs) - set(entry.inputs)
        if missing or unknown:
            raise ValueError(f"inputs {sorted(entry.inputs)} expected; missing {sorted(missing)}, "
                             f"unknown {sorted(unknown)}")

    def _set_inputs(self, entry: CachedGraph, inputs: Mapping[str, Any]) -> None:
        self._check_names(entry, inputs)
        for name, value in inputs.items():
            entry.inputs[name].set(value)

    # ------------------------------------------------------------------ compute
    def compute(self, key: Hashable, outputs: list[str] | None = None, **inputs: Any) -> dict[str, np.ndarray]:
        """Compute the graph of ``key`` with ``inputs`` (``name=array``, NumPy order, every input
        of the graph) and return the outputs named in ``outputs`` (default: all) as NumPy arrays.
        Raises ValueError for missing or unknown inputs or a wrong shape, and what computing
        raises."""
        with self._lock:
            entry = self.get(key)
            self._place(entry)
            self._set_inputs(entry, inputs)
            entry.computes += 1
            sched = self._sched(entry)
            if sched is not None:
                sched.compute(entry.graph)
            else:
                assert self.backend is not None
                self.backend.graph_compute(entry.graph)
            names = list(entry.outputs) if outputs is None else outputs
            return {n: entry.outputs[n].numpy() for n in names}

    @_one_at_a_time
    def compute_async(self, key: Hashable, **inputs: Any) -> "PendingCompute":
        """Queue the graph of ``key`` with ``inputs`` on the backend
        (``ggml_backend_tensor_set_async`` + ``ggml_backend_graph_compute_async``, or the
        scheduler's ``compute_async``) and return at once; :meth:`PendingCompute.result`
        waits and reads the outputs. On a backend that computes synchronously (the CPU) the work
        is done before this returns. Threads: until ``result()``, the outputs are this call's
        only while no other compute of the same key starts (``result()`` raises ClosedError
        then, rather than return that compute's values)."""
        entry = self.get(key)
        self._place(entry)
        entry.computes += 1
        sched = self._sched(entry)
        if sched is not None:
            self._set_inputs(entry, inputs)
            sched.compute_async(entry.graph)
            return PendingCompute(self, entry, sched.synchronize)
        backend = self.backend
        assert backend is not None
        self._check_names(entry, inputs)
        for name, value in inputs.items():
            t = entry.inputs[name]
            dtype = types.numpy_dtype(t.type)
            if dtype is None or t.type == GGMLType.BF16:
                t.set(value)  # converted (quantized) by ggml's routines, synchronously
                continue
            a = np.ascontiguousarray(value, dtype=dtype)
            t._check_shape(a.shape)
            backend.tensor_set_async(t, a)
        backend.graph_compute_async(entry.graph)
        return PendingCompute(self, entry, backend.synchronize)

    @_one_at_a_time
    def close(self) -> None:
        """Close every cached graph and the graph allocator; the cache refuses further use
        (ClosedError)."""
        self._closed = True
        while self._graphs:
            self._graphs.popitem()[1].close()
        if self._galloc is not None:
            self._galloc.close()

    def __enter__(self) -> "GraphCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._graphs)

    @property
    def latest(self) -> CachedGraph | None:
        """The graph used most recently (None before the first)."""
        return next(reversed(self._graphs.values()), None)


class PendingCompute:
    """A computation queued by :meth:`GraphCache.compute_async`."""

    def __init__(self, cache: GraphCache, entry: CachedGraph, synchronize: Callable[[], None]):
        self._cache = cache
        self._entry = entry
        self._compute = entry.computes
        self._synchronize = synchronize
        self._done = False

    def result(self, outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Wait for the computation and return the outputs (default: all), NumPy order.
        Raises ClosedError if another compute of the same key started since (the outputs hold
        its values now), or what reading the outputs raises."""
        with self._cache._lock:
            if self._entry.computes != self._compute:
                raise ClosedError(f"the outputs of graph {self._entry.key!r} were overwritten by a later "
                                  "compute of the same key: read a result before computing its key again")
            if not self._done:
                self._synchronize()
                self._done = True
            names = list(self._entry.outputs) if outputs is None else outputs
            return {n: self._entry.outputs[n].numpy() for n in names}
