"""ggml-alloc: the graph allocator (``ggml_gallocr``), which places a graph's tensors in one
buffer per buffer type, reusing memory of tensors no longer needed.

**Placement.** An allocator's memory belongs to the graph it placed last. pyggml records that
graph: its tensors may be read once it is computed; a graph the allocator placed before (unless
the last one holds all its tensors) raises :class:`~pyggml.errors.ClosedError` when computed or
read, since its memory now holds another graph's values. When ggml grows the allocator's buffer
for a larger graph it frees the old one: the tensors placed in it raise too, instead of reading
freed memory. The same bookkeeping serves the scheduler (:class:`Placer`).

**Zero-byte tensors.** ggml-alloc places a tensor of zero elements at an offset of its buffer
like any other; when every tensor it places in a buffer has zero bytes the buffer is empty, its
base NULL, and the tensor's data stays NULL: ggml then takes it for unplaced when the graph
reads it a second time (``GGML_ASSERT(tensor->buffer == NULL)`` in
``ggml_backend_tensor_alloc``), or reads a chunk it never allocated
(``GGML_ASSERT(buffer)``). A placer therefore gives the zero-byte tensors of a graph a place
of their own before ggml places the rest: the base of a small buffer it owns (one per buffer
type), which it frees when it is freed. ggml sees them placed and places only tensors that hold
bytes.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .. import _cobject
from ..memory import buffer
from ..raw import threads
from ..memory.buffer_type import BufferType
from ..enums import BufferUsage
from ..errors import ClosedError
from ..raw import ffi, lib
from ..raw.boundary import calling, check_status
from ..core.tensor import EMPTY_OPS, Tensor
from .graph_run import placed as graph_placed, restore_sources, run_of
from . import meta_check

if TYPE_CHECKING:
    from .backend import Backend
    from ..core.graph import Graph

__all__ = ["GraphAllocator", "Placer"]

_COMPUTE = int(BufferUsage.COMPUTE)
_NONE = int(lib.GGML_OP_NONE)


def _zero_byte_tensors(graph: "Graph") -> list[Any]:
    """The tensors of ``graph`` ggml-alloc would place that hold zero bytes (nodes, their
    sources and the outputs; not views), found once per graph version."""
    g = graph.ptr
    key = (graph.version, int(lib.ggml_graph_n_nodes(g)))
    run = run_of(graph)
    cached = run.zero_byte
    if cached is not None and cached[0] == key:
        return cached[1]  # type: ignore[no-any-return]
    seen: dict[Any, None] = {}
    for p in graph.raw_nodes():
        seen[p] = None
        for s in p.src:
            if s != ffi.NULL:
                seen[s] = None
    for t in graph._keep:
        if isinstance(t, Tensor):
            seen[t._ptr] = None
    found = [p for p in seen if p.view_src == ffi.NULL and lib.ggml_nbytes(p) == 0]
    run.zero_byte = (key, found)
    return found


def _needs_compute(p: Any) -> bool:
    """Whether the data of tensor struct ``p`` is written by computing its graph: a node, or a
    view of one (views of leafs show the leaf's data)."""
    while p.op in EMPTY_OPS and p.view_src != ffi.NULL:
        p = p.view_src
    return bool(p.op != _NONE)


_F = TypeVar("_F", bound=Callable[..., Any])


def placing(fn: _F) -> _F:
    """A placer's method that places or plans ``graph`` (its first argument): run holding the
    locks of the placer, the graph, the contexts its tensors come from (``Graph.contexts``:
    ggml walks their tensor structs, so no reset or close of one meanwhile) and a scheduler's
    backends (another thread's compute of a graph placed by it waits, and waits for it; a close
    of a backend the split asks waits) and :data:`pyggml.memory.buffer.lifecycle`, and counted as a
    change at its start and its end (``threads.changed``: a compute that checked its graph
    before taking its locks checks again)."""
    @functools.wraps(fn)
    def placed(self: Any, graph: Any, *args: Any, **kwargs: Any) -> Any:
        with graph._holding(self, *getattr(self, "_backends", ()), buffer.LIFECYCLE):
            threads.changed()
            try:
                return fn(self, graph, *args, **kwargs)
            finally:
                threads.changed()  # at the end too, under the locks (see threads.changes)
    return placed  # type: ignore[return-value]


class Placer:
    """What graph allocators and schedulers share: which graph their memory holds, and which
    buffers they own (see the module docstring). Subclasses give :meth:`_sizes` (their buffer
    sizes, which change exactly when ggml reallocates, for single-chunk buffers) and
    :meth:`_may_chunk` (whether a buffer may be split in chunks, when the sizes do not tell)."""

    _graph: "Graph | None"
    _records: list[buffer.LiveBuffer]
    _last_sizes: tuple[int, ...] | None

    if TYPE_CHECKING:
        def _sizes(self) -> tuple[int, ...]: ...

    def _init_placer(self) -> None:
        self._graph = None
        self._placed_nodes: frozenset[Any] = frozenset()  # the graph's tensors when it was placed
        self._records = []
        self._last_sizes = None
        self._computed_too: list["Graph"] = []  # graphs within the placed one, computed since
        self._zero_byte_homes: dict[Any, buffer.LiveBuffer] = {}  # buft -> its small buffer
        # ggml's allocator after a failed reservation: its plan kept for that graph, its buffer
        # NULL. Allocating that graph again would place tensors in the NULL buffer (a crash):
        # the next allocation reserves first (GraphAllocator/Scheduler.alloc_graph).
        self._broken = False
        # (graph, version, its leafs without data, Graph.io_flags) when GraphAllocator last
        # reserved
        self._leaf_plan: tuple[Any, int, frozenset[Any], Any] | None = None

    def _may_chunk(self) -> bool:
        return False

    def _buffer_types(self) -> list[Any]:
        return []

    def _unplace(self, graph: "Graph") -> None:
        """Before ggml places ``graph``: forget the places of its tensors that sit in a
        placer's buffers (this one's, another allocator's or scheduler's, whose memory may
        hold another graph by now) or in buffers a placer has freed (ggml keeps a tensor that
        has data where it is, which would leave it in memory about to be freed, already freed,
        or given to another graph), so that they are placed again: the placer that placed a
        graph last holds all of it. Tensors in the user's buffers (weights) stay."""
        g = graph.ptr
        stale = [b for b in buffer.graph_buffers(g)
                 if buffer.retired_by_placer(b) or isinstance(getattr(buffer.lookup(b), "owner", None), Placer)]
        if stale:
            if lib.pyggml_graph_unplace(g, ffi.new("ggml_backend_buffer_t[]", stale), len(stale)):
                buffer.note_unplaced()
            run_of(graph).checks.clear()
        for t in graph._keep:
            # outputs that are leafs read by no node (not seen above): the same, and a zero-byte
            # one placed at the NULL base of an empty buffer (data NULL, buffer set, which
            # ggml_backend_tensor_alloc asserts against when it is placed again)
            if not isinstance(t, Tensor):
                continue
            p = t._ptr
            b = p.buffer
            if b == ffi.NULL or p.view_src != ffi.NULL:
                continue
            if (p.data == ffi.NULL or buffer.retired_by_placer(b)
                    or isinstance(getattr(buffer.lookup(b), "owner", None), Placer)):
                p.data = ffi.NULL
                p.buffer = ffi.NULL
                buffer.note_unplaced()

    def _zero_byte_bufts(self, tensors: list[Any]) -> list[Any]:
        """The buffer type to place each of ``tensors`` (zero-byte) in, or None to leave it to
        ggml."""
        return [self._buffer_types()[0]] * len(tensors)

    def _place_zero_byte(self, graph: "Graph") -> list[Any]:
        """Before ggml places ``graph`` (after :meth:`_unplace`): place its zero-byte tensors
        that have no data at the base of this placer's small buffer of their buffer type (see
        the module docstring); returns them (for :meth:`_unplace_zero_byte` if placing the
        rest fails). A zero-byte tensor whose data is NULL although its buffer is set (placed at
        the NULL base of an empty buffer) is placed again too: there is nothing in it to lose,
        and ggml-alloc would assert on it."""
        todo = [p for p in _zero_byte_tensors(graph) if p.data == ffi.NULL]
        if not todo:
            return []
        placed: list[Any] = []
        try:
            with calling():  # a Python buffer type's get_alloc_size, alloc_buffer, init_tensor
                for p, buft in zip(todo, self._zero_byte_bufts(todo)):
                    if buft is None or lib.ggml_backend_buft_get_alloc_size(buft, p) != 0:
                        continue  # ggml places it (it takes bytes there: that buffer is not empty)
                    home = self._zero_byte_home(buft)
                    p.buffer = ffi.NULL
                    placed.append(p)
                    check_status(lib.ggml_backend_tensor_alloc(home, p, lib.ggml_backend_buffer_get_base(home)),
                                 "ggml_backend_tensor_alloc")
        except BaseException:
            self._unplace_zero_byte(placed)
            raise
        run_of(graph).checks.clear()
        return placed

    @staticmethod
    def _unplace_zero_byte(tensors: list[Any]) -> None:
        """Undo :meth:`_place_zero_byte` (ggml failed to place the rest of the graph)."""
        for p in tensors:
            p.data = ffi.NULL
            p.buffer = ffi.NULL
        if tensors:
            buffer.note_unplaced()

    def _zero_byte_home(self, buft: Any) -> Any:
        """This placer's small buffer of ``buft`` (allocated on first use; call under
        ``calling()``)."""
        rec = self._zero_byte_homes.get(buft)
        if rec is not None and rec.alive:
            return rec.ptr
        size = max(1, int(lib.ggml_backend_buft_get_alignment(buft)))
        ptr = lib.ggml_backend_buft_alloc_buffer(buft, size)
        if ptr == ffi.NULL:
            raise MemoryError(f"could not allocate a buffer of {size} bytes for zero-byte tensors")
        lib.ggml_backend_buffer_set_usage(ptr, _COMPUTE)
        rec = self._zero_byte_homes[buft] = buffer.track(ptr, self)
        return ptr

    def _free_zero_byte_homes(self) -> None:
        """Free the small buffers (the placer is freed): tensors placed in them are placed
        again by the next placer, and raise ClosedError until then."""
        homes = list(self._zero_byte_homes.values())
        self._zero_byte_homes.clear()
        for rec in homes:
            if rec.alive:
                buffer.retire(rec.ptr, by_placer=True)
                with calling():
                    lib.ggml_backend_buffer_free(rec.ptr)

    @staticmethod
    def _check_outputs_memory(graph: "Graph") -> None:
        """ClosedError for an output of ``graph`` in a buffer that was closed: a leaf read by
        no node is not seen by :func:`pyggml.memory.buffer.check_graph_memory`, and placing it would
        ask its freed buffer for its type (scheduler) or leave it there."""
        for t in graph._keep:
            if isinstance(t, Tensor):
                buffer.check_tensor_memory(t._ptr, t._label)

    def _placed(self, graph: "Graph | None", *, placed: bool = True) -> None:
        """After ggml allocated (or reserved for) ``graph``: notice reallocated buffers, and
        record the graph as the one the memory holds (unless ``placed`` is False: a reserve)."""
        sizes = self._sizes()
        freed = []
        if sizes != self._last_sizes or self._may_chunk():
            freed = [rec.ptr for rec in self._records if rec.alive]
            self._retire(sweep=False)
            self._last_sizes = sizes
        if graph is not None:
            self._track_buffers(graph)
        for ptr in freed:
            if buffer.lookup(ptr) is None:  # not the address of one of the new buffers
                buffer.forget(ptr, by_placer=True)
        if placed and graph is not None:
            old = self._graph
            if old is not None and old is not graph:
                run_of(old).checks.clear()
            self._graph = graph
            self._placed_nodes = graph.node_set()  # tensors added later were not placed with it
            self._computed_too.clear()
            run = run_of(graph)
            run.placed_by = self
            run.computed = False
            run.checks.clear()
            graph_placed(graph)

    def _track_buffers(self, graph: "Graph") -> None:
        """Record the buffers ggml allocated for this placer that ``graph``'s tensors are in."""
        bufts = set(self._buffer_types())
        outs = {t._ptr.buffer for t in graph._keep if isinstance(t, Tensor) and t._ptr.buffer != ffi.NULL}
        if run_of(graph).sources is not None:
            # split by a scheduler: nodes that read an input may read the split's copy of it
            # now, and no node the input itself: its buffer is found among the leafs (each
            # buffer once: the weights' leafs share a few)
            outs.update(p.buffer for p in graph.root_leafs() if p.buffer != ffi.NULL)
        found = buffer.graph_buffers(graph.ptr)
        for buf in found + [b for b in outs if b not in found]:  # outputs: leafs read by no node too
            if buffer.lookup(buf) is not None:
                continue  # a buffer pyggml knows already (weights, inputs, ours)
            if lib.ggml_backend_buffer_get_usage(buf) == _COMPUTE and (
                    not bufts or lib.ggml_backend_buffer_get_type(buf) in bufts):
                self._records.append(buffer.track(buf, self))

    def _retire(self, sweep: bool = True) -> None:
        for rec in self._records:
            if rec.alive:
                buffer.retire(rec.ptr, by_placer=True, sweep=sweep)
        self._records.clear()
        if self._graph is not None:
            run_of(self._graph).checks.clear()

    def covers(self, graph: "Graph") -> bool:
        """Whether the memory holds ``graph``: all its tensors were in the graph placed last,
        when it was placed (a tensor added to that graph since, by ``build_forward``, keeps
        a place it had before, which may hold the placed graph's values now)."""
        g = self._graph
        if g is None or graph.closed or (g is not graph and g.closed):
            return False
        nodes = graph.node_set()  # cached until the graph changes: the same object if it did not
        return nodes is self._placed_nodes or nodes <= self._placed_nodes

    def still_holds(self, p: Any) -> bool:
        """Whether tensor struct ``p`` is in this placer's memory as part of the graph it
        placed last (:func:`pyggml.memory.buffer.check_placements`)."""
        g = self._graph
        return g is not None and not g.closed and p in self._placed_nodes

    def holding(self) -> Any:
        """A token of what this placer holds now, which changes when it places another graph
        or is reset (compared by identity)."""
        return self._placed_nodes if self._graph is not None else None

    def check_placed(self, tensor: Tensor) -> None:
        """Raise unless ``tensor``'s data may be read: ClosedError if the memory holds another
        graph now (or the tensor was added to the placed graph after it was placed),
        ValueError if ``tensor`` is computed by a graph that has not been computed since it
        was placed."""
        p = tensor._ptr
        if not self.still_holds(p):
            raise ClosedError(f"tensor {tensor._label()} was placed by a {self._kind_name()} that has since "
                              "placed another graph (its memory holds that graph's values now): "
                              "allocate this tensor's graph again")
        g = self._graph
        assert g is not None  # still_holds
        if not run_of(g).computed and _needs_compute(p) and not any(
                not h.closed and p in h.node_set() for h in self._computed_too):
            raise ValueError(f"tensor {tensor._label()} has not been computed yet: its graph was "
                             "allocated but not computed since (compute it first)")

    def _kind_name(self) -> str:
        return "graph allocator"


class GraphAllocator(_cobject.CObject, Placer):
    """``ggml_gallocr_new(buft)`` / ``ggml_gallocr_free``, owned. ``where`` is a backend (its
    default buffer type) or a buffer type. A graph it placed keeps it alive."""

    _kind = "graph allocator"

    def __init__(self, where: "Backend | BufferType"):
        buft = where if isinstance(where, BufferType) else where.default_buffer_type
        with calling():  # asks the buffer type's alignment and maximum size
            ptr = lib.ggml_gallocr_new(buft.ptr)
        super().__init__(ptr, owned=True, keep=buft)
        self._buft = buft
        self._init_placer()

    def _free(self, ptr: Any) -> None:
        self._retire()
        self._free_zero_byte_homes()
        with calling():  # frees its buffers (a Python buffer's free_buffer)
            lib.ggml_gallocr_free(ptr)

    def _sizes(self) -> tuple[int, ...]:
        return (int(lib.ggml_gallocr_get_buffer_size(self.ptr, 0)),)

    def _may_chunk(self) -> bool:
        size = self._last_sizes[0] if self._last_sizes else 0
        return size > self._buft.max_size

    def _buffer_types(self) -> list[Any]:
        return [self._buft.ptr]

    def _graph_ok(self, graph: "Graph") -> Any:
        """The graph's pointer, after checking it may be placed: its contexts open and not
        reset since (ClosedError), its sources as built. A closed allocator raises
        ClosedError first, before anything about the graph changes (its tensors keep their
        places)."""
        self.ptr  # closed: ClosedError, before _unplace forgets where the graph's tensors are
        g = graph.ptr
        graph.check_contexts()
        if run_of(graph).split_by is not None:  # a scheduler rewrote its sources: put them back
            restore_sources(graph)
        return g

    @placing
    def reserve(self, graph: "Graph") -> None:
        """``ggml_gallocr_reserve``: size the buffer for ``graph`` (a worst case) without
        allocating its tensors. Raises MemoryError if the buffer cannot be allocated,
        ClosedError if a tensor of the graph is in a buffer that was closed."""
        g = self._graph_ok(graph)
        self._unplace(graph)
        # a tensor left in a freed buffer (one of the user's, closed): ggml would skip it as
        # placed, and init a view of it through the freed buffer
        buffer.check_graph_memory(g, need_data=False)
        self._check_outputs_memory(graph)
        nodata = self._leaf_plan_holds(graph)[1]
        with calling():
            ok = lib.ggml_gallocr_reserve(self.ptr, g)
            self._broken = not ok
            self._leaf_plan = (graph, graph.version, nodata, graph.io_flags()) if ok else None
            self._placed(graph, placed=False)
            if not ok:
                raise MemoryError("ggml_gallocr_reserve could not allocate its buffer")

    def _leaf_plan_holds(self, graph: "Graph") -> tuple[bool, frozenset[Any]]:
        """Whether ggml's plan (made by the last reservation) places every leaf of ``graph``
        that has no data now, with the input/output flags its tensors have now; and those
        leafs. ggml plans no place for a leaf that had data when it planned, and does not plan
        again for a graph of as many nodes and leafs whose nodes fit: a leaf without data there
        is placed through buffer -1 (a crash), and a tensor marked ``set_output`` since would
        keep a place the plan gave to a node too (a NEG in place over a leaf read once)."""
        nodata = frozenset(p for p in graph.root_leafs() if p.data == ffi.NULL)
        plan = self._leaf_plan
        holds = (plan is not None and plan[0] is graph and plan[1] == graph.version and nodata <= plan[2]
                 and plan[3] == graph.io_flags())
        return holds, nodata

    @placing
    def alloc_graph(self, graph: "Graph") -> None:
        """``ggml_gallocr_alloc_graph``: give every tensor of ``graph`` that has no data a place
        in the allocator's buffer (growing it if needed, which frees the old one: tensors placed
        in it before become unusable). Inputs (``set_input``) come first and outputs
        (``set_output``) are kept; other intermediate memory is reused. Raises MemoryError on
        failure, ClosedError if a tensor of the graph is in a buffer that was closed (a
        buffer of this or another allocator that was freed is not one: its tensors are placed
        again)."""
        g = self._graph_ok(graph)
        self._unplace(graph)
        # a tensor left in a freed buffer (one of the user's, closed): ggml would skip it as
        # placed, and init a view of it through the freed buffer
        buffer.check_graph_memory(g, need_data=False)
        self._check_outputs_memory(graph)
        zero = self._place_zero_byte(graph)
        holds, nodata = self._leaf_plan_holds(graph)
        if lib.ggml_backend_buft_is_meta(self._buft.ptr):  # ggml's meta buffers split what they place
            meta_check.check_alloc(g, graph.raw_nodes(), self._buft.ptr)
        with calling():
            # after a failed reservation ggml would skip its own (the plan looks current) and
            # place the tensors in its NULL buffer; and ggml re-plans only when the node or
            # leaf counts or the nodes changed, never for the leafs: reserve first unless the
            # plan of this graph gives every leaf without data a place
            ok = True
            if self._broken or not holds:
                ok = lib.ggml_gallocr_reserve(self.ptr, g)
                self._leaf_plan = (graph, graph.version, nodata, graph.io_flags()) if ok else None
            if ok:
                ok = lib.ggml_gallocr_alloc_graph(self.ptr, g)
            self._broken = not ok
            if not ok:
                self._unplace_zero_byte(zero)
            self._placed(graph if ok else None, placed=bool(ok))
            if not ok:
                raise MemoryError("ggml_gallocr_alloc_graph failed")

    @property
    def buffer_size(self) -> int:
        """Bytes of the allocator's buffer (``ggml_gallocr_get_buffer_size``, buffer 0)."""
        return int(lib.ggml_gallocr_get_buffer_size(self.ptr, 0))

    def close(self) -> None:
        """``ggml_gallocr_free``: tensors it placed lose their data (using them raises)."""
        if self._ptr is not None:
            self._retire()
        super().close()

