"""Backends (``ggml_backend_t``): a stream of work on one device. Compute lives here, as in ggml.

A :class:`Backend` made from a device is owned (``ggml_backend_free`` on close) and keeps the
device's library alive. :meth:`Backend.graph_compute` computes a graph; before the first compute
of a graph on a backend it checks everything ggml would assert on or misuse (every tensor has
data in live memory, the backend supports every node, the graph's memory still holds it) and
keeps what it found on the graph: computing the unchanged graph again costs a few attribute
reads on top of ggml's own call (see :mod:`pyggml.core.graph`).
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _cobject
from ..memory import buffer
from ..raw import threads
from ..memory.buffer import Buffer
from ..memory.buffer_type import BufferType
from ..errors import ClosedError
from ..raw import ffi, lib
from ..raw.boundary import calling, check_status
from ..core.tensor import EMPTY_OPS, Tensor, tensor_arg
from .graph_run import Checked, check_meta_views, compute, compute_lock, restore_sources, run_of
from . import meta_check

if TYPE_CHECKING:
    from ..core.graph import Graph

__all__ = ["Backend", "GraphPlan"]


def _str(p: Any) -> str:
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


def _tensor_with_data(t: Tensor) -> Any:
    p, _, in_buffer = t._memory()
    if not in_buffer:
        raise ValueError(f"tensor {t._label()} is not in a backend buffer")
    return p


def _copy_arg(t: Tensor, read: bool) -> Any:
    """A tensor for ggml_backend_tensor_copy(_async) (its source if ``read``), which reads the
    tensor's own buffer (not its view source's): a view made after its source was allocated has
    none (buffer NULL) and would abort in ggml_backend_buffer_get_type."""
    p = _tensor_with_data(t)
    buffer.check_layout(p, read=read)
    if p.buffer == ffi.NULL:
        raise ValueError(f"view {t._label()} has no buffer of its own (made after its source was "
                         "allocated): give it one with pyggml.backends.utils.view_init first")
    return p


def _check_own_layouts(nodes: list[Any]) -> None:
    """ValueError if a node reads a view of a tensor in memory with a layout of its own (an
    extra buffer type's: :func:`pyggml.memory.buffer.check_layout`): the view's bytes are not
    the tensor's. (A node reading such a tensor itself is refused by supports_op.)"""
    for p in nodes:
        for s in p.src:
            if s != ffi.NULL and s.view_src != ffi.NULL and s.view_src.buffer != ffi.NULL \
                    and s.view_src.buffer.iface.get_tensor == ffi.NULL:
                raise ValueError(f"node {buffer.label(p)} reads a view {buffer.label(s)} of "
                                 f"{buffer.label(s.view_src)}, which a "
                                 f"{_str(lib.ggml_backend_buffer_name(s.view_src.buffer))} buffer "
                                 "keeps in a layout of its own: read the tensor itself")


def _same_layout(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_layout (static in ggml-impl.h): same type, ne and nb."""
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def _check_range(t: Tensor, offset: int, size: int) -> None:
    if offset < 0 or size < 0 or offset + size > t.nbytes:
        raise ValueError(f"bytes [{offset}, {offset + size}) are outside tensor {t._label()} ({t.nbytes} bytes)")


class Backend(_cobject.CObject):
    """A backend (``ggml_backend_t``), owned by default. ``keep``: objects kept alive with it."""

    _kind = "backend"
    _c_free = lib.ggml_backend_free

    def __init__(self, ptr: Any, *, owned: bool = True, keep: Any = None):
        super().__init__(ptr, owned=owned, keep=keep)
        self._async_keep: list[Any] = []
        self._pending: list["Graph"] = []  # computed asynchronously, done at synchronize()

    def _free(self, ptr: Any) -> None:
        with calling():
            lib.ggml_backend_free(ptr)

    # --- description
    @property
    def name(self) -> str:
        """``ggml_backend_name``."""
        with calling():
            return _str(lib.ggml_backend_name(self.ptr))

    @property
    def guid(self) -> bytes:
        """The 16-byte backend identifier (``ggml_backend_guid``)."""
        with calling():
            return bytes(ffi.buffer(lib.ggml_backend_guid(self.ptr), 16))

    @property
    def default_buffer_type(self) -> BufferType:
        """``ggml_backend_get_default_buffer_type``."""
        with calling():
            return BufferType(lib.ggml_backend_get_default_buffer_type(self.ptr))

    @property
    def alignment(self) -> int:
        """``ggml_backend_get_alignment``, bytes."""
        with calling():
            return int(lib.ggml_backend_get_alignment(self.ptr))

    @property
    def max_size(self) -> int:
        """``ggml_backend_get_max_size``, bytes."""
        with calling():
            return int(lib.ggml_backend_get_max_size(self.ptr))

    def alloc_buffer(self, size: int) -> Buffer:
        """A buffer of the default buffer type (``ggml_backend_alloc_buffer``)."""
        return self.default_buffer_type.alloc_buffer(size)

    def set_n_threads(self, n: int) -> bool:
        """Threads for this backend's compute, through its registry's
        ``ggml_backend_set_n_threads`` (``ggml_backend_reg_get_proc_address``: the CPU and BLAS
        backends have it; a GPU backend has not). Returns whether the backend took it. Raises
        ValueError outside 1..GGML_MAX_N_THREADS."""
        if not isinstance(n, int) or not 1 <= n <= lib.GGML_MAX_N_THREADS:
            raise ValueError(f"n_threads must be 1..{lib.GGML_MAX_N_THREADS}, not {n!r}")
        with calling():
            reg = lib.ggml_backend_dev_backend_reg(lib.ggml_backend_get_device(self.ptr))
            p = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_set_n_threads")
            if p == ffi.NULL:
                return False
            ffi.cast("ggml_backend_set_n_threads_t", p)(self.ptr, n)
        return True

    # --- capabilities
    def supports_op(self, op: Tensor) -> bool:
        """``ggml_backend_supports_op``: can this backend compute node ``op``? Raises what a
        Python device's ``supports_op`` raised."""
        p = tensor_arg(op, "op")._ptr
        with calling():
            return self._supports_raw(p)

    def _supports_raw(self, p: Any) -> bool:
        return bool(lib.ggml_backend_supports_op(self._ptr, p))

    def supports_buft(self, buft: BufferType) -> bool:
        """``ggml_backend_supports_buft``: can it use tensors in buffers of ``buft``?"""
        with calling():
            return bool(lib.ggml_backend_supports_buft(self.ptr, buft.ptr))

    def offload_op(self, op: Tensor) -> bool:
        """``ggml_backend_offload_op``: worth moving this op's weights here?"""
        p = tensor_arg(op, "op")._ptr
        with calling():
            return bool(lib.ggml_backend_offload_op(self.ptr, p))

    # --- tensor data
    def tensor_set_async(self, tensor: Tensor, array: np.ndarray, offset: int = 0) -> None:
        """``ggml_backend_tensor_set_async``: copy ``array``'s bytes into ``tensor`` at byte
        ``offset``; ``array`` is kept alive until :meth:`synchronize`."""
        p = _tensor_with_data(tensor)
        a = np.ascontiguousarray(array)
        _check_range(tensor, offset, a.nbytes)
        buffer.check_layout(p, read=False, offset=offset, size=a.nbytes)
        self._async_keep.append(a)
        with calling():
            lib.ggml_backend_tensor_set_async(self.ptr, p, ffi.from_buffer(a), offset, a.nbytes)

    def tensor_get_async(self, tensor: Tensor, out: np.ndarray, offset: int = 0) -> None:
        """``ggml_backend_tensor_get_async``: copy bytes from ``tensor`` into the writable,
        C-contiguous ``out``; valid after :meth:`synchronize`."""
        p = _tensor_with_data(tensor)
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be a writable C-contiguous array")
        _check_range(tensor, offset, out.nbytes)
        buffer.check_layout(p, read=True)
        self._async_keep.append(out)
        with calling():
            lib.ggml_backend_tensor_get_async(self.ptr, p, ffi.from_buffer(out), offset, out.nbytes)

    def synchronize(self) -> None:
        """Wait for all queued work (``ggml_backend_synchronize``); graphs computed with
        :meth:`graph_compute_async` are computed from now on."""
        with calling():
            lib.ggml_backend_synchronize(self.ptr)
        self._async_keep.clear()
        for g in self._pending:
            _mark_computed(g)
        self._pending.clear()

    @staticmethod
    def tensor_memset(tensor: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
        """``ggml_backend_tensor_memset``: set bytes [offset, offset+size) to ``value``."""
        p = _tensor_with_data(tensor)
        size = tensor.nbytes - offset if size is None else size
        _check_range(tensor, offset, size)
        if not 0 <= value <= 255:
            raise ValueError("memset value is a byte: 0..255")
        buf = tensor.buffer_ptr
        if buf.iface.memset_tensor == ffi.NULL:
            raise ValueError(f"buffer {_str(lib.ggml_backend_buffer_name(buf))} does not support memset")
        with calling():
            lib.ggml_backend_tensor_memset(p, value, offset, size)

    @staticmethod
    def tensor_copy(src: Tensor, dst: Tensor) -> None:
        """``ggml_backend_tensor_copy`` between any buffers; layouts must match. Raises
        ValueError for a tensor outside a backend buffer, a view without a buffer of its own
        (see :func:`pyggml.backends.utils.view_init`) and differing layouts."""
        ps, pd = _copy_arg(src, True), _copy_arg(dst, False)
        if not _same_layout(src, dst):
            raise ValueError("tensor_copy needs tensors of the same type, ne and nb")
        with calling():
            lib.ggml_backend_tensor_copy(ps, pd)

    def tensor_copy_async(self, dst_backend: "Backend", src: Tensor, dst: Tensor) -> None:
        """``ggml_backend_tensor_copy_async`` from this backend to ``dst_backend``; raises
        ValueError as :meth:`tensor_copy` does."""
        ps, pd = _copy_arg(src, True), _copy_arg(dst, False)
        if not _same_layout(src, dst):
            raise ValueError("tensor_copy_async needs tensors of the same type, ne and nb")
        with calling():
            lib.ggml_backend_tensor_copy_async(self.ptr, dst_backend.ptr, ps, pd)

    # --- compute
    def _check_graph(self, graph: "Graph", n_nodes: int) -> Checked:
        """Check the whole graph once: everything ggml would assert on or misuse. The memory of
        every node and source is checked in one C call (:func:`pyggml.memory.buffer.check_graph_memory`)."""
        contexts = graph.check_contexts()  # before anything walks the graph's tensors
        run = run_of(graph)
        if run.split_by is not None:  # a scheduler rewrote its sources: put them back
            restore_sources(graph)
        placer = run.placed_by
        if placer is not None and not placer.covers(graph):
            raise ClosedError("the graph allocator or scheduler that placed this graph has since "
                              "placed another one, or tensors were added to this graph after it was "
                              "placed: allocate this graph again")
        g = graph.ptr
        buffer.check_graph_memory(g, need_data=True)
        records = [r for r in map(buffer.lookup, buffer.graph_buffers(g)) if r is not None]
        foreign = buffer.check_placements(graph, records, placer)
        if any(r.ptr.iface.get_tensor == ffi.NULL for r in records):
            _check_own_layouts(graph.raw_nodes()[:n_nodes])
        unusable = self._unusable(records)
        known = run.indices
        if known is not None and known[:2] == (graph.version, n_nodes):
            indices = known[2]
        else:
            indices = buffer.IndexCheck.of(graph.raw_nodes())
            run.indices = (graph.version, n_nodes, indices)
        if lib.ggml_backend_is_meta(self._ptr):  # how ggml's meta backend splits each node
            meta_check.check_compute(graph.raw_nodes()[:n_nodes], graph.grads)
        bufts = frozenset(int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_type(r.ptr))) for r in records)
        done = run.supported
        if not any(ref() is self and (v, n, b) == (graph.version, n_nodes, bufts) for ref, v, n, b in done):
            supports = self._supports_raw
            for i in range(n_nodes):
                node = lib.ggml_graph_node(g, i)
                if node.op in EMPTY_OPS or supports(node):
                    continue
                t = Tensor._of(node)
                raise ValueError(f"backend {self.name} cannot compute node {t._label()} "
                                 f"({t.op_name}, {t.type_name}, srcs {[s.type_name for s in t.src]}): "
                                 f"{self._why_not(node)}")
            done[:] = [e for e in done if e[0]() is not None and e[0]() is not self][-3:]
            done.append((weakref.ref(self), graph.version, n_nodes, bufts))
        state = Checked(graph, self, n_nodes, records, contexts, indices, foreign=foreign)
        state.unusable = unusable
        return state

    def _unusable(self, records: list[buffer.LiveBuffer]) -> str | None:
        """Why this backend cannot compute on the graph's memory, or None: a buffer ggml would
        hand its kernels from another device (``ggml_backend_supports_buft``), or a meta
        device's, whose tensors' ``data`` are not addresses, to a backend other than a meta one.
        (:func:`pyggml.backends.utils.compare_graph_backend` computes on a copy: no matter.)"""
        me = self._ptr
        with calling():
            is_meta = bool(lib.ggml_backend_is_meta(me))
            for r in records:
                buft = lib.ggml_backend_buffer_get_type(r.ptr)
                if r.meta != is_meta or not lib.ggml_backend_supports_buft(me, buft):
                    return (f"backend {self.name} cannot use tensors in a buffer of type "
                            f"{ffi.string(lib.ggml_backend_buft_name(buft)).decode()}: compute the "
                            "graph on that buffer's backend, or use a Scheduler")
        return None

    #: whether :meth:`_kernel_ok` narrows what ggml's scheduler may give this backend (a table
    #: of what its kernels assume beyond its ``supports_op``: CPU, BLAS)
    _has_kernel_table = False

    def _kernel_ok(self, p: Any) -> bool:
        """Whether this backend's kernel computes node ``p``, given that its supports_op said yes."""
        return True

    def _why_not(self, p: Any) -> str:
        """What to say when this backend cannot compute node ``p`` (``_supports_raw`` false)."""
        return "its supports_op refuses the op or these types (compute it on another backend)"

    def _prepare(self, graph: "Graph", indices: bool = True) -> tuple[Any, threads.using, Checked]:
        """(the graph's C pointer, the held locks of what computing it uses, the check), after
        the check (cached on the graph) of everything computing it needs; the caller releases
        the locks (``__exit__``). Raises ValueError/ClosedError (holding nothing). ``indices``:
        also check the row indices now (a compute through ``graph_run.compute`` checks them in
        its own call into C)."""
        while True:
            seen = threads.changes
            g = graph.ptr
            n_nodes = lib.ggml_graph_n_nodes(g)
            key = self.ptr
            checks = run_of(graph).checks
            state = checks.get(key)
            if state is None or state.by is not self or not state.still_valid(graph, n_nodes, seen):
                # checked holding the backend, the graph and its contexts (no close or reset
                # meanwhile), then round again to take the locks of all computing uses
                with graph._holding(self), calling():  # calling: supports_op of a Python device
                    if threads.changes == seen:
                        state = checks[key] = self._check_graph(graph, n_nodes)
                continue
            lock = state.lock
            if lock is None:
                lock = state.lock = compute_lock(graph, self, *state.users)
            lock.__enter__()
            # nothing closed, placed anew or built into the graph while it waited
            if threads.changes == seen and state.version == graph.version and lib.ggml_graph_n_nodes(g) == n_nodes:
                break
            lock.__exit__()
        if indices and state.indices is not None:  # data: checked before every compute
            try:
                state.indices.run()
            except BaseException:
                lock.__exit__()
                raise
        return g, lock, state

    def graph_compute(self, graph: "Graph") -> None:
        """Compute ``graph`` (``ggml_backend_graph_compute``).

        Every tensor must have data in memory that is still alive and still holds this graph,
        and every node must be supported by the backend (``ggml_backend_supports_op``):
        otherwise ValueError or ClosedError before anything runs (checked once per graph and
        backend, and again only when something changed). A failed or aborted computation raises
        GGMLError, or the exception a Python callback raised (e.g. KeyboardInterrupt from the
        CPU backend's abort callback, or what a Python backend's ``graph_compute`` raised).
        """
        self._run(graph, "ggml_backend_graph_compute")
        _mark_computed(graph)

    def graph_compute_async(self, graph: "Graph") -> None:
        """``ggml_backend_graph_compute_async``: queue the computation; :meth:`synchronize`
        before reading results (until then the graph's outputs raise as not computed)."""
        self._run(graph, "ggml_backend_graph_compute_async")
        self._pending.append(graph)

    def _run(self, graph: "Graph", what: str) -> None:
        """The C compute ``what`` (``ggml_backend_graph_compute`` or its ``_async`` form) after
        :meth:`_prepare`, holding its locks (:func:`~pyggml.backends.graph_run.compute`)."""
        g, lock, state = self._prepare(graph, indices=False)
        try:
            if state.unusable is not None:
                raise ValueError(state.unusable)
            check_meta_views(graph, state)
            compute(what, self._ptr, g, state, state.owners, lock.locks)
        finally:
            lock.__exit__()

    def graph_plan(self, graph: "Graph") -> "GraphPlan":
        """``ggml_backend_graph_plan_create``. Raises ValueError if the backend has no plans
        (ggml would abort)."""
        if self.ptr.iface.graph_plan_create == ffi.NULL:
            raise ValueError(f"backend {self.name} does not support graph plans")
        g, lock, state = self._prepare(graph)
        try:
            if state.unusable is not None:
                raise ValueError(state.unusable)
            with calling(*state.owners, held=lock.locks):
                plan = lib.ggml_backend_graph_plan_create(self._ptr, g)
        finally:
            lock.__exit__()
        return GraphPlan(plan, self, graph)

    def __repr__(self) -> str:
        return "<Backend (closed)>" if self.closed else f"<Backend {self.name}>"


def _mark_computed(graph: "Graph") -> None:
    run = run_of(graph)
    run.computed = True
    placer = run.placed_by
    if placer is not None and placer._graph is not graph:
        placer._computed_too.append(graph)


class GraphPlan(_cobject.CObject):
    """A backend's compiled plan of a graph (``ggml_backend_graph_plan_t``), owned."""

    _kind = "graph plan"

    def __init__(self, ptr: Any, backend: Backend, graph: "Graph"):
        super().__init__(ptr, owned=True, owner=backend, keep=graph)
        self._graph = graph

    def _free(self, ptr: Any) -> None:
        lib.ggml_backend_graph_plan_free(self._owner.ptr, ptr)

    def compute(self) -> None:
        """``ggml_backend_graph_plan_compute`` (the graph is checked as by
        :meth:`Backend.graph_compute`); raises GGMLError on failure, or what a callback raised."""
        backend: Backend = self._owner
        _, lock, state = backend._prepare(self._graph)
        try:
            with threads.using(self), calling(*state.owners, held=(self._lock, *lock.locks)):
                status = lib.ggml_backend_graph_plan_compute(backend._ptr, self.ptr)
                check_status(status, "ggml_backend_graph_plan_compute")
        finally:
            lock.__exit__()
        _mark_computed(self._graph)
