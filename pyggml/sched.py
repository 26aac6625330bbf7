"""The backend scheduler (``ggml_backend_sched``): splits a graph between several backends by
what each supports, copies inputs between them, allocates and computes the splits."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from . import callbacks
from ._base import CObject, GGMLError
from ._loader import ffi, lib
from .alloc import _Placements
from .backend import Backend, BufferType
from .graph import Graph, status_name
from .tensor import _EMPTY_OPS, Tensor

__all__ = ["Scheduler", "MAX_BACKENDS"]

#: GGML_SCHED_MAX_BACKENDS of ggml-backend.cpp
MAX_BACKENDS = 16

EvalCallback = Callable[[Tensor, bool], bool]


class Scheduler(CObject):
    """``ggml_backend_sched_new`` / ``ggml_backend_sched_free``, owned.

    ``backends`` in priority order, the last one a CPU backend (ggml requires it); ``bufts``
    optional, one per backend, each supported by its backend. ``graph_size`` bounds nodes +
    leafs of the graphs it takes. The scheduler keeps the backends alive.

    Raises ValueError for what ggml would assert on.
    """

    _kind = "scheduler"
    _c_free = lib.ggml_backend_sched_free

    def __init__(self, backends: Sequence[Backend], bufts: Sequence[BufferType] | None = None,
                 graph_size: int = lib.GGML_DEFAULT_GRAPH_SIZE, parallel: bool = False,
                 op_offload: bool = True):
        backends = list(backends)
        if not 1 <= len(backends) <= MAX_BACKENDS:
            raise ValueError(f"a scheduler takes 1 to {MAX_BACKENDS} backends")
        if backends[-1].device.type != "cpu":
            raise ValueError("the last backend of a scheduler must be a CPU backend")
        if bufts is not None:
            bufts = list(bufts)
            if len(bufts) != len(backends):
                raise ValueError("bufts needs one buffer type per backend")
            for b, t in zip(backends, bufts):
                if not b.supports_buft(t):
                    raise ValueError(f"backend {b.name} does not support buffer type {t.name}")
        if graph_size < 1:
            raise ValueError("graph_size must be >= 1")
        c_backends = ffi.new("ggml_backend_t[]", [b.ptr for b in backends])
        c_bufts = ffi.new("ggml_backend_buffer_type_t[]", [t.ptr for t in bufts]) if bufts else ffi.NULL
        super().__init__(lib.ggml_backend_sched_new(c_backends, c_bufts, len(backends), graph_size,
                                                    parallel, op_offload), owned=True)
        self._backends = backends
        self._bufts = bufts
        self.graph_size = graph_size
        self._is_alloc = False
        self._eval: callbacks.Callback | None = None
        self._eval_func: EvalCallback | None = None
        self._graph: Graph | None = None
        self._stopped = False
        self._placed = _Placements()

    @property
    def backends(self) -> list[Backend]:
        return list(self._backends)

    def _index(self, backend: Backend) -> int:
        for i, b in enumerate(self._backends):
            if b is backend or b == backend:
                return i
        raise ValueError(f"backend {backend.name} is not one of this scheduler's")

    def _check_graph(self, graph: Graph) -> None:
        nodes = graph._raw_nodes()
        leafs = graph._raw_leafs(nodes)
        if len(nodes) + len(leafs) > self.graph_size:
            raise ValueError(f"graph has {len(nodes)} nodes and {len(leafs)} leafs, more than "
                             f"the scheduler's graph_size {self.graph_size}")
        for p in nodes:
            if p.op not in _EMPTY_OPS and not any(b._supports_raw(p) for b in self._backends):
                t = Tensor(p, graph.ctx, (graph,))
                raise ValueError(f"no backend of the scheduler can compute node {t.name!r} ({t.op_name})")
        bufts_ok: set[int] = set()
        for p in nodes + leafs:
            buf = p.view_src.buffer if p.view_src != ffi.NULL else p.buffer
            if buf == ffi.NULL:
                continue
            buft = lib.ggml_backend_buffer_get_type(buf)
            key = int(ffi.cast("uintptr_t", buft))
            if key in bufts_ok:
                continue
            if not any(lib.ggml_backend_supports_buft(b.ptr, buft) for b in self._backends):
                name = ffi.string(p.name).decode()
                raise ValueError(f"tensor {name!r} is in a buffer no backend of the scheduler can use")
            bufts_ok.add(key)

    # ------------------------------------------------------------------ allocation
    def reserve(self, graph: Graph) -> None:
        """``ggml_backend_sched_reserve``: size the compute buffers for a worst-case graph."""
        self._check_graph(graph)
        if not lib.ggml_backend_sched_reserve(self.ptr, graph.ptr):
            raise MemoryError("ggml_backend_sched_reserve could not allocate the compute buffers")
        self._is_alloc = False

    def alloc_graph(self, graph: Graph) -> None:
        """``ggml_backend_sched_alloc_graph``: split ``graph`` and allocate its tensors (resets
        the previous allocation first). Raises MemoryError on failure."""
        self._check_graph(graph)
        if self._is_alloc:
            self.reset()
        if not lib.ggml_backend_sched_alloc_graph(self.ptr, graph.ptr):
            raise MemoryError("ggml_backend_sched_alloc_graph failed")
        self._is_alloc = True
        self._graph = graph
        self._placed.record(graph, self)

    def reset(self) -> None:
        """``ggml_backend_sched_reset``: forget the allocation (tensor data becomes invalid)."""
        lib.ggml_backend_sched_reset(self.ptr)
        self._is_alloc = False

    # ------------------------------------------------------------------ compute
    def compute(self, graph: Graph) -> bool:
        """``ggml_backend_sched_graph_compute`` (allocating first if needed).

        Returns True, or False if the eval callback stopped the computation. Raises GGMLError
        on failure, or the exception the eval callback raised."""
        return self._compute(graph, lib.ggml_backend_sched_graph_compute)

    def compute_async(self, graph: Graph) -> bool:
        """``ggml_backend_sched_graph_compute_async``; :meth:`synchronize` before reading."""
        return self._compute(graph, lib.ggml_backend_sched_graph_compute_async)

    def _compute(self, graph: Graph, fn: Any) -> bool:
        self._check_graph(graph)
        self._graph = graph
        self._stopped = False
        allocates = not self._is_alloc  # ggml allocates the graph itself then
        status = fn(self.ptr, graph.ptr)
        self._is_alloc = True
        if allocates:
            self._placed.record(graph, self)
        callbacks.raise_pending()
        if status != lib.GGML_STATUS_SUCCESS:
            raise GGMLError(f"scheduler compute failed: {status_name(status)}")
        return not self._stopped

    def synchronize(self) -> None:
        lib.ggml_backend_sched_synchronize(self.ptr)

    def close(self) -> None:
        """``ggml_backend_sched_free``: tensors it placed lose their data (using them raises)."""
        super().close()
        self._placed.release()

    # ------------------------------------------------------------------ inspection
    @property
    def n_splits(self) -> int:
        """Splits of the last graph (``ggml_backend_sched_get_n_splits``)."""
        return lib.ggml_backend_sched_get_n_splits(self.ptr)

    @property
    def n_copies(self) -> int:
        """``ggml_backend_sched_get_n_copies`` (pipeline-parallel copies)."""
        return lib.ggml_backend_sched_get_n_copies(self.ptr)

    def buffer_size(self, backend: Backend) -> int:
        """Bytes of ``backend``'s compute buffer (``ggml_backend_sched_get_buffer_size``)."""
        self._index(backend)
        return lib.ggml_backend_sched_get_buffer_size(self.ptr, backend.ptr)

    def set_tensor_backend(self, tensor: Tensor, backend: Backend) -> None:
        """``ggml_backend_sched_set_tensor_backend``: pin a node to ``backend``."""
        self._index(backend)
        lib.ggml_backend_sched_set_tensor_backend(self.ptr, tensor.ptr, backend.ptr)

    def get_tensor_backend(self, tensor: Tensor) -> Backend | None:
        """The backend the last split put ``tensor`` on, or None."""
        p = lib.ggml_backend_sched_get_tensor_backend(self.ptr, tensor.ptr)
        return next((b for b in self._backends if b._ptr == p), None)

    # ------------------------------------------------------------------ eval callback
    @property
    def eval_callback(self) -> EvalCallback | None:
        return self._eval_func

    @eval_callback.setter
    def eval_callback(self, func: EvalCallback | None) -> None:
        """``ggml_backend_sched_set_eval_callback``: ``func(tensor, ask)`` is called with
        ``ask=True`` for each node ("do you want to see it?") and, for those answered True, with
        ``ask=False`` once it is computed (its data readable); returning False then stops the
        computation (ggml skips the rest of the split; :meth:`compute` returns False). An
        exception stops it too and is re-raised by :meth:`compute`."""
        self._eval_func = func
        if func is None:
            lib.ggml_backend_sched_set_eval_callback(self.ptr, ffi.NULL, ffi.NULL)
            self._eval = None
            return

        def trampoline(t: Any, ask: bool, user_data: Any) -> bool:
            owner = self._graph.ctx if self._graph is not None else None
            try:
                go_on = bool(func(Tensor(t, owner, ()), bool(ask)))
            except BaseException:
                self._stopped = True
                raise
            if not ask and not go_on:
                self._stopped = True
            return go_on

        self._eval = callbacks.Callback("ggml_backend_sched_eval_callback", trampoline)
        lib.ggml_backend_sched_set_eval_callback(self.ptr, self._eval.fn, self._eval.user_data)
