"""Graph reuse: build a graph once per input shape, compute it again and again with new inputs.

A :class:`GraphCache` holds graphs built by your function, one per *key* (usually the input
shapes, e.g. a padded sequence length and a batch size), at most ``max_graphs`` of them (least
recently used first out). Computing a cached graph costs setting its inputs, ggml's compute and
reading its outputs: the graph is not rebuilt, and its checks are not repeated (see
:mod:`pyggml.core.graph`). Inputs are set and outputs read by name::

    def build(g, T, B):                        # called once per key (T, B)
        tokens = g.input("i32", [T, B], "tokens")           # ne order
        pos = g.constant(np.arange(T, dtype=np.int32))      # written once
        ...
        return {"embeddings": out}             # built from g.ctx's ops

    cache = GraphCache(build, backend=cpu)     # or backends=[gpu, cpu], or scheduler=...
    out = cache.compute((T, B), tokens=ids)    # {"embeddings": ndarray}, NumPy order

Each cached graph (:class:`CachedGraph`) owns everything made for it: its context, its input
tensors (in memory of their own that outlives every compute: :attr:`CachedGraph.arrays` are
zero-copy NumPy views of them where that memory is the host's, so a model writes a step's
inputs in place), its constants (in a buffer of the first backend, written once) and its
graph; dropping it from the cache (eviction, :meth:`GraphCache.clear`, :meth:`GraphCache.close`)
frees all of them.

With ``scheduler`` the graphs share the scheduler you give, and with ``backends`` one scheduler
of the cache's own over those backends (as whisper.cpp's and llama.cpp's one scheduler per set
of devices): one compute buffer whatever the number of graphs, sized for the largest graph
placed so far, or ahead of time by :meth:`GraphCache.reserve` with the worst-case key.
Computing another key than the last places that graph again (ggml's split and allocation).
With ``backend`` each graph gets a graph allocator of its own, its compute buffer kept with it,
while those buffers total at most ``own_buffers`` bytes: computing one graph after another then
places nothing again (a model called on sentences of many lengths switches graph at every
call); the graphs beyond that share one allocator, placed again at each switch as above.
With :meth:`GraphCache.compute_async` a backend that computes asynchronously (a GPU) gets the
next graph while Python prepares the following inputs.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar, cast

import numpy as np

from .. import types
from .alloc import GraphAllocator
from .backend import Backend
from ..core.context import Context
from ..enums import BufferUsage, GGMLType
from ..errors import ClosedError
from ..core.graph import Graph
from .graph_run import run_of
from .sched import Scheduler
from ..core.tensor import Tensor

__all__ = ["GraphCache", "CachedGraph", "GraphParts", "BuildFn", "OWN_BUFFERS"]

#: default of :class:`GraphCache`'s ``own_buffers``: the bytes the compute buffers of graphs
#: placed once for good may total (with ``backend``)
OWN_BUFFERS = 64 << 20

#: ``build(g, *key) -> outputs``: a :class:`GraphParts` and the key's parts in, ``{name: Tensor}`` out
BuildFn = Callable[..., "Mapping[str, Tensor]"]


class GraphParts:
    """What a build function makes one graph of (it is given one, ``build(g, *key)``):

    * ``ctx`` -- a ``no_alloc`` :class:`~pyggml.core.context.Context` for the graph's tensors
      (``g.ctx.mul_mat(a, b)``...), placed by the cache's allocator or scheduler;
    * ``graph`` -- the graph; nodes built into it first (``g.graph.build_forward(write)``, e.g.
      a ``set_rows`` into a KV cache) are computed before the outputs, which the cache builds
      into it after ``build`` returns;
    * :meth:`input` -- a named input tensor, set by :meth:`GraphCache.compute` (or written in
      place through :attr:`CachedGraph.arrays`);
    * :meth:`output` -- an output copied into memory of its own at every compute, read without
      a call into C through :attr:`CachedGraph.arrays` (a decode step's logits);
    * :meth:`constant` -- a tensor holding an array;
    * ``extra`` -- a dict for what the build function keeps with this graph (a caller's plan of
      how to feed and read it), :attr:`CachedGraph.extra` afterwards, dropped with the graph.

    Inputs, outputs and constants are placed when made (each in a small buffer of its own), so
    views of them built afterwards are views of placed memory.
    """

    def __init__(self, n_tensors: int, graph_size: int, inputs_where: Any, constants_where: Any):
        self._n = n_tensors
        self._where = {"_input_ctx": inputs_where, "_const_ctx": constants_where}
        self._stack = contextlib.ExitStack()
        self.ctx = self._stack.enter_context(Context.for_tensors(n_tensors, graph_size=graph_size))
        try:
            self.graph = self.ctx.new_graph(graph_size)
        except BaseException:
            self._stack.close()
            raise
        self.inputs: dict[str, Tensor] = {}
        self.outputs: dict[str, Tensor] = {}
        #: NumPy views of the inputs and outputs in host memory
        self.arrays: dict[str, np.ndarray] = {}
        #: what the build function keeps with this graph (CachedGraph.extra)
        self.extra: dict[str, Any] = {}
        self._input_ctx: Context | None = None
        self._const_ctx: Context | None = None

    def _placed(self, which: str, type: types.TypeLike, ne: Sequence[int], name: str | None) -> tuple[Tensor, Any]:
        """A new tensor of the context ``which`` (made on first use), in a buffer of its own
        (none for 0 bytes: placed as the graph's other tensors then): (tensor, buffer or None)."""
        ctx: Context | None = getattr(self, which)
        if ctx is None:
            ctx = self._stack.enter_context(Context.for_tensors(self._n))
            setattr(self, which, ctx)
        t = ctx.new_tensor(type, ne, name=name)
        return t, (ctx.alloc_tensors(self._where[which]) if t.nbytes else None)

    def _host_tensor(self, type: types.TypeLike, ne: Sequence[int], name: str) -> Tensor:
        """A named tensor in memory of its own next to the inputs, with its NumPy view in
        :attr:`arrays` where that memory is the host's."""
        if not isinstance(name, str) or not name:
            raise ValueError("an input or output needs a name (a non-empty str)")
        if name in self.inputs or name in self.outputs:
            raise ValueError(f"input or output {name!r} made twice")
        if name in ("outputs", "into"):
            raise ValueError(f"{name!r} names an argument of GraphCache.compute, not an input")
        t, buf = self._placed("_input_ctx", type, ne, name)
        if buf is not None:
            buf.clear(0)
            if buf.is_host and types.numpy_dtype(t.type) is not None and t.type != GGMLType.BF16:
                self.arrays[name] = t.numpy(copy=False).reshape([int(n) for n in ne][::-1])
        return t

    def output(self, tensor: Tensor, name: str) -> Tensor:
        """Copy ``tensor`` (a node of this graph) into a new tensor named ``name`` of the same
        type and ``ne`` (its trailing 1s dropped: ne [8, 1] gives a view of NumPy shape (8,)),
        with ``ggml_cpy`` computed with the graph, in memory of its own next to the inputs:
        ``arrays[name]`` is a zero-copy NumPy view of it (NumPy order, ne reversed) where that
        memory is the host's, holding the last compute's values (a copy is yours to keep);
        :meth:`GraphCache.compute` reads it by name as any output. Returns the new tensor.
        Raises ValueError for a name given twice."""
        n = max(1, tensor.n_dims)
        t = self._host_tensor(tensor.type, tensor.ne[:n], name)
        self.graph.build_forward(self.ctx.cpy(tensor, t))
        self.outputs[name] = t
        return t

    def input(self, type: types.TypeLike, ne: Sequence[int], name: str) -> Tensor:
        """A new input tensor of ggml ``type`` and ``ne`` (ggml order) named ``name``, zeros
        until set; its NumPy view (if any) has the shape ``ne`` reversed, as given. Raises
        ValueError for a name given twice and what :meth:`Context.new_tensor
        <pyggml.core.context.Context.new_tensor>` raises."""
        t = self._host_tensor(type, ne, name).set_input()
        self.inputs[name] = t
        return t

    def constant(self, value: Any, type: types.TypeLike | None = None, name: str | None = None) -> Tensor:
        """A tensor holding ``value`` (array-like, NumPy order: ne is its shape reversed; a scalar
        is one element), of ggml ``type`` (default: the array's own, float64 as F32), converted
        or quantized by ggml's routines. Raises what :meth:`Tensor.set
        <pyggml.core.tensor.Tensor.set>` raises."""
        a = np.asarray(value)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        if a.ndim == 0:
            a = a.reshape(1)
        t, buf = self._placed("_const_ctx", types.type_of_dtype(a.dtype) if type is None else type,
                              list(a.shape[::-1]), name)
        if buf is not None:
            buf.usage = BufferUsage.WEIGHTS
            t.set(a, reshape=True)
        return t

    def close(self) -> None:
        self._stack.close()


class CachedGraph:
    """One graph of a :class:`GraphCache`: its context ``ctx``, ``graph``, named ``inputs`` and
    ``outputs`` (tensors), and :attr:`arrays`. Closed, with all it owns, when the cache drops it."""

    def __init__(self, key: Hashable, parts: GraphParts, outputs: Mapping[str, Tensor]):
        self.key = key
        self._parts = parts
        self.ctx = parts.ctx
        self.graph: Graph = parts.graph
        self.inputs = dict(parts.inputs)
        self.outputs = {**parts.outputs, **outputs}
        self._arrays = parts.arrays
        #: what the build function put in ``g.extra`` (dropped with this graph)
        self.extra = parts.extra
        #: the GraphParts.output outputs in host memory: a compute reads them there (a copy),
        #: without the checks of a call into C
        self._host_outputs = {n: parts.arrays[n] for n in parts.outputs if n in parts.arrays}
        self._unset = set(self.inputs)   # inputs never given a value (zeros)
        self._empty = {n for n, t in self.inputs.items() if not t.nbytes}  # 0 bytes: nothing to write
        self.computes = 0  # computations started: a pending result knows whether it is the last
        #: the graph allocator placing this graph (with a GraphCache's ``backend``): its own, or
        #: the cache's shared one; None until first placed
        self._galloc: GraphAllocator | None = None
        self._own_bytes = 0  # the size of its own allocator's buffer (0 when it shares)
        self._on_close: Callable[["CachedGraph"], None] | None = None

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """``{name: zero-copy NumPy view}`` (NumPy order, the tensor's dtype) of every input and
        :meth:`GraphParts.output` in host memory: write a compute's inputs there in place, then
        :meth:`GraphCache.compute` without them (and ``outputs=[]``), then read those outputs
        there. Tensors in device memory (a GPU backend's, without a scheduler) and of BF16 or
        quantized types have none."""
        self._unset.clear()   # the caller writes them
        return self._arrays

    def _set_inputs(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            t = self.inputs.get(name)
            if t is None:
                raise ValueError(f"inputs {sorted(self.inputs)} expected; unknown {sorted(set(values) - set(self.inputs))}")
            arr = self._arrays.get(name)
            if name in self._empty:
                t._check_shape(np.shape(value))
            elif arr is None:
                t.set(value)
            else:
                v = np.asarray(value)
                t._check_shape(v.shape)
                np.copyto(arr, v.reshape(arr.shape), casting="same_kind")
        if self._unset:
            self._unset.difference_update(values)
            if self._unset:
                raise ValueError(f"inputs {sorted(self.inputs)} expected; missing {sorted(self._unset)} "
                                 "(never given a value)")

    def close(self) -> None:
        self.extra.clear()   # it may hold views of the memory closed next
        try:
            if self._on_close is not None:
                self._on_close(self)   # its own allocator closed, the cache's count of them updated
        finally:
            self._on_close = None
            self._parts.close()


_F = TypeVar("_F", bound=Callable[..., Any])


def _one_at_a_time(fn: _F) -> _F:
    """A GraphCache method that holds the cache's lock (threads take turns)."""
    @functools.wraps(fn)
    def locked(self: "GraphCache", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(self, *args, **kwargs)
    return cast(_F, locked)


class GraphCache:
    """Graphs built by ``build`` once per key, computed on ``backend`` (each graph through a
    :class:`~pyggml.backends.alloc.GraphAllocator` of its own while their buffers total at most
    ``own_buffers`` bytes, the others through one they share), by ``scheduler``, or by a
    :class:`~pyggml.backends.sched.Scheduler` of the cache's own over ``backends`` (in priority
    order, the CPU last; one for every graph, closed with the cache).

    ``build(g, *key)`` makes the graph's tensors with ``g``, a :class:`GraphParts` (``g.ctx`` of
    ``n_tensors`` tensors, ``g.input(...)``, ``g.output(...)``, ``g.constant(...)``), and returns
    its outputs, ``{name: Tensor}`` (marked ``set_output()`` for you; ``{}`` for a graph that
    only writes into tensors of its own, as a KV cache). A graph holds up to ``graph_size``
    nodes. Inputs live in host memory (the last backend's) with a scheduler, in the backend's
    memory with ``backend``; constants in the first backend's. Raises ValueError for bad
    arguments (``own_buffers < 0`` among them) and what ``build`` raises.

    Threads may share a cache: :meth:`get`, :meth:`compute`, :meth:`clear` and :meth:`close`
    run one at a time (a compute sets the inputs, computes and reads the outputs as one step).
    """

    def __init__(self, build: BuildFn, *, backend: Backend | None = None,
                 scheduler: Scheduler | None = None, backends: Sequence[Backend] | None = None,
                 graph_size: int = 2048, n_tensors: int | None = None, max_graphs: int = 8,
                 own_buffers: int = OWN_BUFFERS):
        if sum(x is not None for x in (backend, scheduler, backends)) != 1:
            raise ValueError("give a backend, a scheduler or backends (one of them)")
        if max_graphs < 1 or graph_size < 1:
            raise ValueError("max_graphs and graph_size must be >= 1")
        if own_buffers < 0:
            raise ValueError("own_buffers must be >= 0")
        #: bytes the graphs' own compute buffers may total (``backend`` only; 0: all share one)
        self.own_buffers = own_buffers
        self._own_total = 0
        self._build = build
        self.backend = backend
        self.backends = list(backends) if backends is not None else None
        self.graph_size = graph_size
        self.n_tensors = n_tensors or graph_size * 2
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Hashable, CachedGraph] = OrderedDict()
        self._stack = contextlib.ExitStack()
        self._galloc: GraphAllocator | None = None
        if backend is not None:
            self._galloc = self._stack.enter_context(GraphAllocator(backend))
        elif self.backends is not None:
            scheduler = self._stack.enter_context(Scheduler(self.backends, graph_size=2 * graph_size + 64))
        #: the scheduler that computes the graphs (the cache's own with ``backends``), or None
        self.scheduler = scheduler
        self._closed = False
        self._lock = threading.RLock()  # one get/compute/close at a time, outside the gate
        self.builds = 0  # how many graphs were built (for tests and benchmarks)
        #: seconds spent in ggml's compute by :meth:`compute`, summed (the rest of a compute is
        #: setting inputs and reading outputs)
        self.compute_seconds = 0.0

    def _homes(self) -> tuple[Any, Any]:
        """(where inputs go, where constants go)."""
        if self.backend is not None:
            return self.backend, self.backend
        assert self.scheduler is not None
        backends = self.scheduler.backends
        return backends[-1], backends[0]

    @property
    def lock(self) -> contextlib.AbstractContextManager[Any]:
        """The cache's lock (re-entrant), which :meth:`get`, :meth:`compute` and the others hold:
        hold it (``with cache.lock:``) from writing a graph's :attr:`CachedGraph.arrays` to
        reading its outputs there when threads share the cache."""
        return self._lock

    # ------------------------------------------------------------------ graphs
    @_one_at_a_time
    def get(self, key: Hashable) -> CachedGraph:
        """The graph of ``key``, built on first use. Raises ClosedError once the cache is
        closed, ValueError for a build that returns no outputs or something else than Tensors."""
        if self._closed:
            raise ClosedError("this graph cache is closed")
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry
        args = key if isinstance(key, tuple) else (key,)
        parts = GraphParts(self.n_tensors, self.graph_size, *self._homes())
        try:
            outputs = self._build(parts, *args)
            if not isinstance(outputs, Mapping) or not (outputs or parts.outputs or parts.graph.n_nodes):
                raise ValueError(f"build must return {{name: Tensor}}: its outputs (none when it made them "
                                 f"with g.output or built nodes into g.graph), not {outputs!r:.80}")
            for name, t in outputs.items():
                if not isinstance(t, Tensor):
                    raise ValueError(f"build must return Tensors, output {name!r} is {type(t).__name__}")
                t.set_output()
            if outputs:
                parts.graph.build_forward(*outputs.values())
        except BaseException:
            parts.close()
            raise
        entry = self._graphs[key] = CachedGraph(key, parts, outputs)
        self.builds += 1
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)[1].close()
        return entry

    def _place(self, entry: CachedGraph) -> None:
        graph = entry.graph
        s = self.scheduler
        if s is not None:
            if not (s._graph is graph and s._is_alloc and run_of(graph).split_by is s):
                s.alloc_graph(graph)
        else:
            galloc = entry._galloc or self._allocator_for(entry)
            if galloc._graph is not graph:
                galloc.alloc_graph(graph)

    def _allocator_for(self, entry: CachedGraph) -> GraphAllocator:
        """The allocator of a graph placed for the first time: one of its own, reserved for it,
        while the own buffers stay within :attr:`own_buffers`; else the shared one."""
        assert self._galloc is not None and self.backend is not None
        entry._galloc = self._galloc
        if self._own_total >= self.own_buffers:
            return entry._galloc
        own = GraphAllocator(self.backend)
        try:
            own.reserve(entry.graph)
            size = own.buffer_size
        except MemoryError:   # it shares: the shared buffer may be large enough
            size = None
        except BaseException:
            own.close()
            raise
        if size is not None and self._own_total + size <= self.own_buffers:
            entry._galloc, entry._own_bytes, entry._on_close = own, size, self._release
            self._own_total += size
        else:
            own.close()
        return entry._galloc

    def _release(self, entry: CachedGraph) -> None:
        """Close ``entry``'s own allocator (it is being closed)."""
        self._own_total -= entry._own_bytes
        entry._own_bytes = 0
        galloc, entry._galloc = entry._galloc, None
        if galloc is not None and galloc is not self._galloc:
            galloc.close()

    @_one_at_a_time
    def prepare(self, key: Hashable) -> CachedGraph:
        """The graph of ``key``, built if it is not cached and placed in the compute buffer now,
        so that its next :meth:`compute` starts at once (where graphs share a compute buffer,
        the graph placed before is no longer: read its outputs first). Returns its
        :class:`CachedGraph`."""
        entry = self.get(key)
        self._place(entry)
        return entry

    @_one_at_a_time
    def reserve(self, key: Hashable) -> None:
        """Size the compute buffer for the graph of ``key`` (built now if it is not cached):
        ``ggml_backend_sched_reserve`` or ``ggml_gallocr_reserve`` (with ``backend``: that of
        the graph's own allocator, made now where it gets one, else the shared one's). Give
        the largest key a model will compute (the longest prompt batch) so that later graphs
        fit without growing it. Raises MemoryError if the buffer cannot be allocated."""
        entry = self.get(key)
        if self.scheduler is not None:
            self.scheduler.reserve(entry.graph)
        elif (entry._galloc or self._allocator_for(entry)) is self._galloc:
            self._galloc.reserve(entry.graph)   # (an allocator of its own was reserved for it)

    # ------------------------------------------------------------------ compute
    def compute(self, key: Hashable, outputs: list[str] | None = None, *,
                into: Mapping[str, np.ndarray] | None = None, **inputs: Any) -> dict[str, np.ndarray]:
        """Compute the graph of ``key`` with ``inputs`` (``name=array``, NumPy order) and return
        the outputs named in ``outputs`` (default: all) as NumPy arrays, those named in
        ``into`` copied into the arrays given there (:meth:`Tensor.numpy
        <pyggml.core.tensor.Tensor.numpy>`'s ``out``: a loop reading an output every step
        reuses its memory). An input not given keeps the value it holds (set by an earlier
        compute, or written through :attr:`CachedGraph.arrays`). Raises ValueError for an
        unknown input, one never given a value, or a wrong shape; TypeError for a dtype of
        another kind; and what computing raises."""
        with self._lock:
            entry = self.get(key)
            entry._set_inputs(inputs)
            self._place(entry)
            entry.computes += 1
            t0 = time.perf_counter()
            if self.scheduler is not None:
                self.scheduler.compute(entry.graph)
            else:
                assert self.backend is not None
                self.backend.graph_compute(entry.graph)
            self.compute_seconds += time.perf_counter() - t0
            names = list(entry.outputs) if outputs is None else outputs
            into = into or {}
            host = entry._host_outputs
            return {n: host[n].copy() if n in host and n not in into else entry.outputs[n].numpy(out=into.get(n))
                    for n in names}

    @_one_at_a_time
    def compute_async(self, key: Hashable, **inputs: Any) -> "PendingCompute":
        """Queue the graph of ``key`` with ``inputs`` (as :meth:`compute`) on the backend
        (``ggml_backend_graph_compute_async``, or the scheduler's ``compute_async``) and return at
        once; :meth:`PendingCompute.result` waits and reads the outputs. On a backend that
        computes synchronously (the CPU) the work is done before this returns. Threads: until
        ``result()``, the outputs are this call's only while no other compute of the same key
        starts (``result()`` raises ClosedError then, rather than return that compute's
        values)."""
        entry = self.get(key)
        entry._set_inputs(inputs)
        self._place(entry)
        entry.computes += 1
        if self.scheduler is not None:
            self.scheduler.compute_async(entry.graph)
            return PendingCompute(self, entry, self.scheduler.synchronize)
        backend = self.backend
        assert backend is not None
        backend.graph_compute_async(entry.graph)
        return PendingCompute(self, entry, backend.synchronize)

    @_one_at_a_time
    def clear(self) -> None:
        """Drop every cached graph (each closed with what it owns); the cache stays usable."""
        while self._graphs:
            self._graphs.popitem()[1].close()

    @_one_at_a_time
    def close(self) -> None:
        """Close every cached graph and the graph allocator or the cache's own scheduler; the
        cache refuses further use (ClosedError)."""
        self._closed = True
        self.clear()
        self._stack.close()

    def __enter__(self) -> "GraphCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._graphs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    @property
    def keys(self) -> list[Hashable]:
        """The keys of the cached graphs, least recently used first."""
        return list(self._graphs)

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
