"""What the backends layer keeps about a graph (:attr:`pyggml.core.graph.Graph.run`, a
:class:`GraphRun`): the graph allocator or scheduler that placed it last and whether it was
computed since, the scheduler that split it and the node sources that split rewrote, and what
each backend's or scheduler's check of it found (:class:`Checked`: one kind for
:class:`~pyggml.backends.backend.Backend`, :class:`~pyggml.backends.backend.GraphPlan` and
:class:`~pyggml.backends.sched.Scheduler`). The core modules never look inside: a graph's
``version`` tells a check whether the graph changed since.
"""
from __future__ import annotations

import weakref
from typing import Any

from ..core.graph import Graph
from ..errors import GGMLError
from ..memory import buffer
from ..raw import ffi, lib, threads
from ..raw.boundary import call_status, calling, check_status

__all__ = ["GraphRun", "run_of", "Checked", "Sources", "save_sources", "restore_sources",
           "callback_owners", "compute_lock", "compute", "placed", "check_meta_views"]

_MAX_SRC = int(lib.GGML_MAX_SRC)


class GraphRun:
    """The backends layer's state of one graph (see the module docstring)."""

    __slots__ = ("placed_by", "computed", "split_by", "sources", "checks", "zero_byte", "sched_loose",
                 "meta_views", "supported", "indices", "trialed")

    def __init__(self) -> None:
        self.placed_by: Any = None    # the graph allocator or scheduler that placed it last
        self.computed = False         # computed since it was placed
        self.split_by: Any = None     # the scheduler that split it (it rewrote node sources)
        self.sources: Sources | None = None  # the sources before that
        self.checks: dict[Any, Checked] = {}  # backend or scheduler pointer -> its check
        self.zero_byte: Any = None    # (key, zero-byte tensors ggml-alloc would place): pyggml.backends.alloc
        self.sched_loose: Any = None  # (version, leafs pinned to the last backend): pyggml.backends.sched
        self.meta_views: tuple[int, int] | None = None  # where ggml keeps its meta views: check_meta_views
        #: (backend, graph version, node count, buffer types) for which every node was found
        #: supported: what supports_op reads (ops, types, layouts, the buffers' types) does not
        #: change when the graph is placed again, so a placement does not repeat that walk
        self.supported: list[tuple[Any, int, int, frozenset[int]]] = []
        #: (graph version, node count, the row-index check of its nodes): which tensors hold
        #: indices is the graph's own structure, which a placement does not change
        self.indices: tuple[int, int, Any] | None = None
        #: (graph version, node count) for which the forked trial compute of the nodes pyggml
        #: has no checks for passed (CPUBackend._trial_compute): what aborts ggml there is the
        #: nodes' ops, types and shapes, which a placement does not change
        self.trialed: list[tuple[int, int]] = []


def run_of(graph: Graph) -> GraphRun:
    """``graph``'s :class:`GraphRun` (made on first use)."""
    r = graph.run
    if r is None:
        r = graph.run = GraphRun()
    return r  # type: ignore[no-any-return]


class _MetaViews:
    """What ggml's meta backend does with the views a graph makes of tensors in a meta device's
    buffers (a KV cache view; ggml-backend-meta.cpp): the first placement of a graph puts them
    in set ``idx`` (of two) after ``idx = next``; computing a graph other than the last one
    makes ``next = idx ^ 1`` and empties set ``next`` (``gen`` counts each set's emptyings),
    then looks the graph's views up in set ``idx``, aborting (``GGML_ASSERT(bcj.nodes[i])``)
    for one it lost. Modelled for all meta buffers together (one model's weights and cache)."""

    idx = 0
    next = 0
    gen = [0, 0]
    last: Any = None  # weak reference to the graph computed last on a meta backend


_meta = _MetaViews()


def placed(graph: Graph) -> None:
    """``graph`` was placed: its first placement initialized its views (:class:`_MetaViews`)."""
    run = run_of(graph)
    if run.meta_views is None and any(r is not None and r.meta for r in map(buffer.lookup, buffer.graph_buffers(graph.ptr))):
        _meta.idx = _meta.next
        run.meta_views = (_meta.idx, _meta.gen[_meta.idx])


def check_meta_views(graph: Graph, state: "Checked") -> None:
    """Before ``graph`` is computed: ValueError if it reads a meta device's buffers and ggml's
    meta backend has dropped, or would drop, its views (:class:`_MetaViews`). Placing the graph
    again keeps its views (ggml initializes a view once): build it again."""
    if not state.meta:
        return
    m = _meta
    views = run_of(graph).meta_views
    last = m.last() if m.last is not None else None
    ok = views == (m.idx, m.gen[m.idx])
    if last is graph and ok:
        return
    if not ok:
        raise ValueError("this graph reads tensors of a meta device, and ggml's meta backend has dropped "
                         "its views of them (it keeps those of the graphs placed since it last switched "
                         "between graphs): build the graph again, or compute one graph at a time")
    m.next = m.idx ^ 1
    m.gen[m.next] += 1
    m.last = weakref.ref(graph)


class Sources:
    """A graph's nodes, in their order, and their sources, as they were before a scheduler
    rewrote the sources (to read its copies of a split's inputs) and a backend's
    ``graph_optimize`` reordered the nodes of a split in the graph's own array (Vulkan's and
    CUDA's do). C helpers of the extension copy them in one call."""

    __slots__ = ("saved", "n", "version")

    def __init__(self, graph: Graph):
        g = graph.ptr
        n = int(lib.ggml_graph_n_nodes(g))
        self.version = graph.version
        self.saved = ffi.new("struct ggml_tensor *[]", max(n * (1 + _MAX_SRC), 1))
        self.n = lib.pyggml_graph_save_srcs(g, self.saved, n * (1 + _MAX_SRC))

    def restore(self, graph: Graph) -> None:
        # the order only while the graph holds the same nodes (no build_forward since)
        lib.pyggml_graph_restore_srcs(graph._ptr, self.saved, self.n, graph.version == self.version)


def save_sources(graph: Graph, split_by: Any) -> Sources:
    """Save the node sources before a scheduler splits ``graph`` (it rewrites them to read its
    copies); ``split_by``: the scheduler that will hold the split, if any."""
    saved = Sources(graph)
    if split_by is not None:
        r = run_of(graph)
        r.sources = saved
        r.split_by = split_by
    return saved


def restore_sources(graph: Graph, saved: Sources | None = None) -> None:
    """Put back the node sources a scheduler rewrote (``saved``, else those saved when it split
    ``graph``); a no-op if none did."""
    r = run_of(graph)
    saved = saved or r.sources
    if saved is not None and graph._ptr is not None:
        # it writes into the nodes' structs: under the locks of their contexts (all at once),
        # and only while none was reset or closed (another thread's tensors may lie there now)
        contexts = graph.contexts()
        with threads.using(*(c for c, _ in contexts), gate=False):
            if not graph.closed and all(c._gen == gen for c, gen in contexts):
                saved.restore(graph)
    if saved is r.sources:
        r.sources = None
        if r.split_by is not None:
            r.split_by = None
            r.checks.clear()


class Checked:
    """What a backend's or scheduler's check of a graph found (``by``: the object that
    checked), valid while nothing it depends on changes. A backend's check (``placed``) also
    holds only while the graph stays placed where it was (the same placer, still holding it,
    no tensor of it unplaced by another placer since); a scheduler places the graph itself
    before each compute."""

    __slots__ = ("version", "n_nodes", "records", "contexts", "placer", "indices", "foreign", "unplaced",
                 "users", "by", "valid_at", "lock", "owners", "trialed", "placed", "meta", "unusable")

    def __init__(self, graph: Graph, by: Any, n_nodes: int, records: list[buffer.LiveBuffer],
                 contexts: list[tuple[Any, int]], indices: buffer.IndexCheck | None, *,
                 foreign: list[tuple[Any, Any]] = (), placed: bool = True):  # type: ignore[assignment]
        self.by = by  # the object that checked (the key, its pointer, may be another's later)
        self.version = graph.version
        self.n_nodes = n_nodes
        self.records = records
        self.meta = any(r.meta for r in records)  # reads a meta device's buffers: check_meta_views
        #: why the checking backend cannot read the graph's memory itself (Backend._unusable), or
        #: None: a compute raises it, a comparison on a copy of the graph does not
        self.unusable: str | None = None
        self.contexts = contexts
        self.indices = indices  # the row indices in data, checked before every compute
        self.foreign = list(foreign)  # other placers whose memory holds tensors of the graph
        self.placed = placed
        self.placer = run_of(graph).placed_by
        self.unplaced = buffer.unplaced
        # what computing the graph uses, locked around the C call (threads.using): its
        # contexts, the owners of its buffers, its placer
        self.users = (*(c for c, _ in contexts), *(r.owner for r in records), self.placer,
                      *(o for o, _ in self.foreign))
        self.lock: threads.using | None = None     # what a compute locks, on first use (threads share it)
        self.owners = callback_owners(graph)       # to declare to calling() around a compute
        self.trialed = False  # the forked trial compute (Scheduler._trial_compute) was done
        # threads.changes when this was last found valid: until the next close, reset or
        # placement anywhere, only the graph's own version and node count need a look
        self.valid_at = -1

    def still_valid(self, graph: Graph, n_nodes: int, seen: int) -> bool:
        """Whether the check holds for ``graph`` of ``n_nodes`` nodes; ``seen``: the
        ``threads.changes`` read before (while it has not moved since the check was last found
        valid, only the graph's version and node count need a look)."""
        if self.version != graph.version or self.n_nodes != n_nodes:
            return False
        if self.valid_at == seen:
            return True
        if self.placed and (self.placer is not run_of(graph).placed_by or self.unplaced != buffer.unplaced):
            # a placer placing another graph forgot where some tensors were (data NULL), maybe
            # this graph's: computing would run kernels on NULL (a crash: GraphAllocator.reserve
            # of another graph of the same tensors)
            return False
        for rec in self.records:
            if not rec.alive:
                return False
        for ctx, gen in self.contexts:
            if ctx._gen != gen:
                return False
        for owner, holding in self.foreign:
            if owner.holding() is not holding:
                return False
        if self.placed and self.placer is not None and not self.placer.covers(graph):
            return False
        self.valid_at = seen
        return True


def callback_owners(graph: Graph) -> tuple[Any, ...]:
    """The owners to declare to :class:`~pyggml.raw.boundary.calling` for computing ``graph``:
    the contexts of its tensors that made Python ops (``map_custom``, whose callbacks may run on
    ggml's worker threads), else none (the other callbacks run on the calling thread; declaring
    no owner skips a lock)."""
    return tuple(c for c, _ in graph.contexts() if getattr(c, "_callbacks", None))


def compute_lock(graph: Graph, *users: Any) -> threads.using:
    """The :class:`~pyggml.raw.threads.using` of a compute of ``graph`` by ``users`` (backends,
    contexts, buffer owners, placers): the graph's own lock is covered by its context's
    (everything that changes a graph holds both), so that one instead, where it has one."""
    owner = graph._owner
    return threads.using(graph if owner._lock is None else owner, *users)


_COMPUTE_FNS: dict[str, Any] = {}


def compute(what: str, obj: Any, g: Any, state: Checked, owners: tuple[Any, ...] = (),
            held: tuple[Any, ...] = ()) -> None:
    """The C compute named ``what`` (``ggml_backend_graph_compute``,
    ``ggml_backend_sched_graph_compute`` or their ``_async`` forms) of ``obj`` (the backend's or
    scheduler's pointer) on the cgraph ``g`` checked by ``state``, holding its lock: one call into
    C (``pyggml_compute``) that checks the graph's row indices (:class:`~pyggml.memory.buffer.IndexCheck`)
    first, and times the compute (``lib.pyggml_compute_ns()``). ``owners`` and ``held`` go to
    :class:`~pyggml.raw.boundary.calling`. Raises ValueError for an index out of range (nothing
    computed), GGMLError for a failed status, or what a callback raised."""
    fn = _COMPUTE_FNS.get(what)
    if fn is None:
        fn = _COMPUTE_FNS[what] = ffi.cast("pyggml_compute_fn", ffi.addressof(lib, what))
    idx = state.indices
    if idx is None:
        args: tuple[Any, ...] = (fn, obj, g, ffi.NULL, ffi.NULL, 0, ffi.NULL)
    else:
        if idx.meta:
            idx.run_meta()
        args = (fn, obj, g, idx.tensors, idx.bounds, idx.n, idx.bad)
    try:
        if owners:
            with calling(*owners, held=held):
                check_status(lib.pyggml_compute(*args), what)
        else:
            call_status(what, lib.pyggml_compute, *args)
        return
    except GGMLError:
        if idx is None or idx.bad[0] < 0:
            raise
    idx.raise_bad()  # outside the except: the ValueError alone, not chained to the failed status
