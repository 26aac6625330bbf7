"""The backend scheduler (``ggml_backend_sched``): splits a graph between several backends by
what each supports, copies inputs between them, allocates and computes the splits.

Splitting rewrites the graph: a node whose source lives where its backend cannot read it reads
a copy the scheduler made instead. pyggml saves the sources before the scheduler splits a graph
and puts them back before the graph is used any other way (split again after the scheduler has
split another graph, allocated by a graph allocator, computed on a backend), so a graph can be
computed by a scheduler, then another graph, then the first again.

Computing the graph the scheduler holds (allocated, unchanged, its memory alive) goes straight
to ``ggml_backend_sched_graph_compute``: the checks run once per graph (see :mod:`pyggml.core.graph`).
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Sequence

from .. import _cobject, _trial
from ..memory import buffer
from ..raw import threads
from .alloc import Placer, placing
from .backend import Backend
from ..memory.buffer_type import BufferType
from .cpu import CPUBackend, graph_trial_ops
from .device import Device
from .graph_run import Checked, check_meta_views, compute, compute_lock, restore_sources, run_of, save_sources
from . import meta_check
from ..enums import DeviceType
from ..core.graph import Graph
from ..raw import callbacks, ffi, lib, requires
from ..raw.boundary import calling
from ..core.tensor import EMPTY_OPS, BorrowScope, Tensor, tensor_arg

__all__ = ["Scheduler", "MAX_BACKENDS", "EvalCallback", "CopyCallback"]

#: GGML_SCHED_MAX_BACKENDS of ggml-backend.cpp
MAX_BACKENDS = 16

#: ``f(tensor, ask) -> bool``, see :attr:`Scheduler.eval_callback`
EvalCallback = Callable[[Tensor, bool], bool]

#: ``f(backend, src, dst, graph) -> bool``, see :attr:`Scheduler.copy_callback`
CopyCallback = Callable[[Backend, Tensor, Tensor, Graph], bool]

_VIEW_OPS = frozenset(int(o) for o in EMPTY_OPS if o != lib.GGML_OP_NONE)


class Scheduler(_cobject.CObject, Placer):
    """``ggml_backend_sched_new`` / ``ggml_backend_sched_free``, owned.

    ``backends`` in priority order, the last one a CPU backend (ggml requires it); ``bufts``
    optional, one per backend, each supported by its backend. ``graph_size`` must exceed nodes +
    leafs of the graphs it takes (plus the tensors pinned outside them). The scheduler keeps
    the backends alive.

    Every split (:meth:`alloc_graph`, :meth:`reserve`, :meth:`compute` of a graph it does not
    hold) starts from ``ggml_backend_sched_reset``: ggml keeps the split's tensors, and the pins
    of :meth:`set_tensor_backend`, in one hash set of ``graph_size`` tensors that only a reset
    empties, and aborts when it is full. pyggml keeps the pins and makes them again after that
    reset, until :meth:`reset`.

    Raises ValueError for what ggml would assert on.
    """

    _kind = "scheduler"

    def __init__(self, backends: Sequence[Backend], bufts: Sequence[BufferType] | None = None,
                 graph_size: int = lib.GGML_DEFAULT_GRAPH_SIZE, parallel: bool = False,
                 op_offload: bool = True):
        backends = list(backends)
        if not 1 <= len(backends) <= MAX_BACKENDS:
            raise ValueError(f"a scheduler takes 1 to {MAX_BACKENDS} backends")
        for b in backends:
            if not isinstance(b, Backend):
                raise TypeError(f"a scheduler takes pyggml Backends, not {type(b).__name__}")
        if Device.of(backends[-1]).type != DeviceType.CPU:
            raise ValueError("the last backend of a scheduler must be a CPU backend")
        if len({b.ptr for b in backends}) != len(backends):
            raise ValueError("a backend appears twice")
        if len(backends) > 1:
            for b in backends:
                if lib.ggml_backend_is_meta(b.ptr) and b.default_buffer_type.is_host:
                    # ggml's CPU backend would take the meta tensors (their buffer type says
                    # host) and read their data, which are not addresses
                    raise ValueError(f"{b.name}: a meta device made of host devices cannot share a "
                                     "scheduler (the other backends would read its tensors' data as "
                                     "host memory); compute on it alone, or make it of devices with "
                                     "memory of their own (GPUs, RPC)")
        if bufts is not None:
            bufts = list(bufts)
            if len(bufts) != len(backends):
                raise ValueError("bufts needs one buffer type per backend")
            for b, t in zip(backends, bufts):
                if not b.supports_buft(t):
                    raise ValueError(f"backend {b.name} does not support buffer type {t.name}")
        if graph_size < 1:
            raise ValueError("graph_size must be >= 1")
        c_bufts = ffi.new("ggml_backend_buffer_type_t[]", [t.ptr for t in bufts]) if bufts else ffi.NULL
        with threads.using(*backends), calling():  # no backend closed meanwhile (another thread)
            c_backends = ffi.new("ggml_backend_t[]", [b.ptr for b in backends])
            ptr = lib.ggml_backend_sched_new(c_backends, c_bufts, len(backends), graph_size, parallel, op_offload)
        super().__init__(ptr, owned=True, keep=(backends, bufts))
        self._backends = backends
        self._cpus = [b for b in backends if isinstance(b, CPUBackend)]  # their abort clocks restart
        self._bufts = bufts or [b.default_buffer_type for b in backends]
        self.graph_size = graph_size
        self._is_alloc = False
        self._eval: callbacks.Callback | None = None
        self._eval_func: EvalCallback | None = None
        self._copy: callbacks.Callback | None = None
        self._copy_func: CopyCallback | None = None
        self._stopped = False
        # set_tensor_backend's pins for the next split, kept here: ggml keeps them in the hash
        # set that a reset empties, and pyggml resets before every split (see alloc_graph)
        self._pins: dict[Any, tuple[Tensor, Backend]] = {}
        # Graph.io_flags of the graph ggml's allocator last planned for (None: no plan yet)
        self._io_plan: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        # meta backends: the graphs whose split they passed (meta_check), with what it depended on
        self._metas = {b._ptr for b in backends if lib.ggml_backend_is_meta(b.ptr)}
        self._meta_checked: weakref.WeakKeyDictionary[Graph, Any] = weakref.WeakKeyDictionary()
        # the graphs this scheduler checked: (their check, what the kernel-table check of its
        # split depended on, or None). Placing another graph undoes a graph's split and drops
        # its check; placing it again, unchanged (its version, node count, contexts and
        # buffers: Checked.still_valid), the same check and the same split's verdict hold: a
        # cache of graphs that share this scheduler re-checks none of them when keys alternate
        self._checked: weakref.WeakKeyDictionary[Graph, tuple[Checked, Any]] = weakref.WeakKeyDictionary()
        self._init_placer()

    def _free(self, ptr: Any) -> None:
        self._retire()
        self._checked.clear()   # its checks name this scheduler (a cycle, and nothing to keep)
        self._free_zero_byte_homes()
        if self._graph is not None:
            restore_sources(self._graph)
        with calling():
            lib.ggml_backend_sched_free(ptr)

    def close(self) -> None:
        """``ggml_backend_sched_free``: tensors it placed lose their data (using them raises)."""
        if self._ptr is not None:
            self._retire()
        super().close()

    @property
    def backends(self) -> list[Backend]:
        """The backends, in priority order."""
        return list(self._backends)

    def _index(self, backend: Backend) -> int:
        for i, b in enumerate(self._backends):
            if b is backend or b == backend:
                return i
        raise ValueError(f"backend {backend.name} is not one of this scheduler's")

    # ------------------------------------------------------------------ placement (Placer)
    def _sizes(self) -> tuple[int, ...]:
        s = self.ptr
        return tuple(int(lib.ggml_backend_sched_get_buffer_size(s, b._ptr)) for b in self._backends)

    def _may_chunk(self) -> bool:
        sizes = self._last_sizes or ()
        return any(size > t.max_size for size, t in zip(sizes, self._bufts))

    def _buffer_types(self) -> list[Any]:
        return [t.ptr for t in self._bufts]

    def _kind_name(self) -> str:
        return "scheduler"

    def _zero_byte_bufts(self, tensors: list[Any]) -> list[Any]:
        """Zero-byte tensors (:meth:`Placer._place_zero_byte`) all go to the buffer type of the
        first backend that runs all of them (leafs included: the split asks ``supports_op`` of
        a placed leaf too), so that no split copies one to another backend (a copy of zero
        bytes alone in a backend's buffer would meet the same assert); failing that each to the
        first backend that runs it, or to ggml if none does (the check of the graph refuses
        it). Call under ``calling()``."""
        backends = [b._ptr for b in self._backends]
        runs = [[bool(lib.ggml_backend_supports_op(b, p)) for b in backends] for p in tensors]
        for i in range(len(backends)):
            if all(r[i] for r in runs):
                return [self._bufts[i].ptr] * len(tensors)
        return [next((self._bufts[i].ptr for i, ok in enumerate(r) if ok), None) for r in runs]

    # ------------------------------------------------------------------ checks
    def _check_graph(self, graph: Graph) -> Any:
        """Everything ggml would assert on when splitting ``graph`` (cached on the graph)."""
        seen = threads.changes
        g = graph.ptr
        n_nodes = lib.ggml_graph_n_nodes(g)
        run = run_of(graph)
        state = run.checks.get(self._ptr)
        if state is not None and state.by is self and state.still_valid(graph, n_nodes, seen):
            return g
        memo = self._checked.get(graph)
        if state is None and memo is not None and memo[0].still_valid(graph, n_nodes, seen):
            run.checks[self._ptr] = memo[0]   # this scheduler's own check, of this graph unchanged
            return g
        # holding the scheduler, its backends, the graph and its contexts: no close or reset
        with graph._holding(self, *self._backends):
            return self._check_new_graph(graph)

    def _check_new_graph(self, graph: Graph) -> Any:
        g = graph.ptr
        n_nodes = int(lib.ggml_graph_n_nodes(g))
        nodes = graph.raw_nodes()
        leafs = graph._raw_leafs(nodes)
        if len(nodes) + len(leafs) >= self.graph_size:
            # the scheduler's hash set (ggml_hash_set_new(graph_size)) takes the nodes, the leafs
            # and one more key (the NULL view_src of a source it looks up): when full it aborts
            raise ValueError(f"graph has {len(nodes)} nodes and {len(leafs)} leafs: the scheduler's "
                             f"graph_size {self.graph_size} must be larger than their sum")
        if not any(p.op not in _VIEW_OPS for p in nodes):
            raise ValueError("the graph has no node that computes anything: a scheduler cannot split it")
        contexts = graph.check_contexts()
        buffer.check_graph_memory(g, need_data=False)
        backends = [b._ptr for b in self._backends]
        with calling():  # supports_op / supports_buft of Python devices
            for p in nodes:
                if p.op not in EMPTY_OPS and not any(lib.ggml_backend_supports_op(b, p) for b in backends):
                    raise ValueError(f"no backend of the scheduler can compute node {buffer.label(p)} "
                                     f"({ffi.string(lib.ggml_op_name(p.op)).decode()})")
            for p in nodes + leafs:
                v = p.view_src
                buf = v.buffer if v != ffi.NULL else p.buffer
                if buf == ffi.NULL:
                    if v != ffi.NULL and v.data != ffi.NULL:
                        # a view of a tensor in a context's own memory (no backend buffer): the
                        # scheduler gives it no backend and ggml-alloc asserts buffer_id >= 0
                        raise ValueError(f"tensor {buffer.label(p)} is a view of a tensor in an allocating "
                                         "context's memory, which a scheduler cannot place: make the "
                                         "graph in a no_alloc context (Context.for_tensors) or compute "
                                         "it with a backend")
                    continue
                buft = lib.ggml_backend_buffer_get_type(buf)
                # ggml_backend_sched_backend_id_from_cur aborts for a pre-allocated tensor no
                # backend can both read (its buffer type) and run (its op)
                if not any(lib.ggml_backend_supports_buft(b, buft) and lib.ggml_backend_supports_op(b, p)
                           for b in backends):
                    raise ValueError(f"tensor {buffer.label(p)} is in a buffer ({ffi.string(lib.ggml_backend_buffer_name(buf)).decode()}) "
                                     "that no backend of the scheduler can use for its op")
        records = [r for r in map(buffer.lookup, buffer.graph_buffers(g)) if r is not None]
        saved = None
        run = run_of(graph)
        if run.sources is not None:
            # split: nodes read the split's copies of tensors another backend cannot use, and
            # the compute copies the originals then: their memory must be live too (a closed
            # buffer of an input was read after its free), and row indices are read there
            saved = run.sources.saved
            for p in graph.root_leafs():
                rec = buffer.check_tensor_memory(p, functools.partial(buffer.label, p))
                if rec is not None:
                    records.append(rec)
        run.checks[self._ptr] = state = Checked(graph, self, n_nodes, records, contexts,
                                                buffer.IndexCheck.of(nodes, saved), placed=False)
        self._checked[graph] = (state, None)
        return g

    def _take(self, graph: Graph) -> Any:
        """``graph``'s pointer, ready to be split: its sources restored if a scheduler rewrote
        them (another one, or this one before it split another graph), its tensors in memory an
        allocator freed or this scheduler owns forgotten (they are placed again), checked."""
        if not isinstance(graph, Graph):
            raise TypeError(f"a scheduler computes pyggml Graphs, not {type(graph).__name__}")
        self.ptr  # a closed scheduler: ClosedError before anything about the graph
        for b in self._backends:
            b.ptr  # a backend of the scheduler closed since: ClosedError (not a TypeError from cffi)
        graph.check_contexts()  # before anything walks the graph's tensors
        split_by = run_of(graph).split_by
        if split_by is not None and not (split_by is self and self._graph is graph):
            restore_sources(graph)
        self._unplace(graph)
        self._check_outputs_memory(graph)
        return self._check_graph(graph)

    # ------------------------------------------------------------------ allocation
    def _pin_loose_leafs(self, graph: Graph) -> None:
        """Leafs outside a backend buffer that no node other than a view reads (built as
        outputs, or read only through a view): the split gives them no backend (its pass 4
        gives a view's source the backend of the view before the view has one) and ggml-alloc
        asserts (buffer_id >= 0). They are pinned to the last backend (the CPU one), which
        places them as a graph allocator would. Which leafs those are is worked out once per
        graph version."""
        run = run_of(graph)
        cached = run.sched_loose
        if cached is None or cached[0] != graph.version:
            leafs: dict[Any, None] = {}
            read = set()
            for p in graph.raw_nodes():
                view = p.op in _VIEW_OPS
                for src in p.src:
                    if src != ffi.NULL and src.op == lib.GGML_OP_NONE:
                        leafs[src] = None
                        if not view:
                            read.add(src)
            for t in graph._keep:
                if isinstance(t, Tensor) and t._ptr.op == lib.GGML_OP_NONE:
                    leafs[t._ptr] = None
            cached = run.sched_loose = (graph.version, [p for p in leafs if p not in read])
        if cached[1]:
            host = self._backends[-1]._ptr
            for p in cached[1]:
                if p.buffer == ffi.NULL:
                    lib.ggml_backend_sched_set_tensor_backend(self.ptr, p, host)

    @placing
    def reserve(self, graph: Graph) -> None:
        """``ggml_backend_sched_reserve``: size the compute buffers for a worst-case graph
        (its sources are put back afterwards). Raises MemoryError if they cannot be allocated."""
        g = self._take(graph)
        self._check_pins(graph)
        # ggml's reserve splits without resetting first: the tensors of a split that no reset
        # followed (a failed alloc_graph or reserve) would stay in the scheduler's hash set,
        # which holds graph_size tensors, and fill it (an abort in ggml_hash_find_or_insert)
        self._reset()
        io = graph.io_flags()  # before the split rewrites the sources
        saved = save_sources(graph, None)
        try:
            self._pin_loose_leafs(graph)
            with calling():
                ok = lib.ggml_backend_sched_reserve(self.ptr, g)
                self._broken = not ok
                if ok:
                    self._io_plan = io
                self._is_alloc = False
                self._placed(graph, placed=False)
                if not ok:
                    raise MemoryError("ggml_backend_sched_reserve could not allocate the compute buffers")
        finally:
            restore_sources(graph, saved)
            if self._graph is graph:
                self._graph = None

    @placing
    def alloc_graph(self, graph: Graph) -> None:
        """``ggml_backend_sched_alloc_graph``: split ``graph`` and allocate its tensors (resets
        the previous allocation first: tensors of the graph placed before become unusable).
        Raises MemoryError on failure, ValueError when the split puts on a CPU backend a node
        whose CPU kernel cannot compute it (the allocation is then reset)."""
        g = self._take(graph)
        state = run_of(graph).checks.get(self._ptr)
        if state is not None and state.by is not self:  # another scheduler's, at this address
            state = None
        self._check_pins(graph)
        self._reset()  # always: ggml's alloc_graph does not, and its hash set may hold a failed split's tensors
        io = graph.io_flags()  # (the sources as built: the reset put them back)
        old = self._io_plan
        if self._broken:
            # a reservation failed (its own or alloc_graph's): ggml's allocator kept the plan and
            # a NULL buffer, and would place this graph's tensors there: reserve again first
            self.reserve(graph)
        elif old is not None and old != io and tuple(map(len, old)) == tuple(map(len, io)):
            # ggml keeps its plan for a graph of as many nodes and leafs that fit, whatever
            # their input/output flags: a tensor marked set_output since the plan would keep a
            # place the plan gave to a node too (a NEG in place over a leaf).
            # Plan again (other counts: ggml plans again itself)
            self.reserve(graph)
        zero = self._place_zero_byte(graph)
        self._pin_loose_leafs(graph)
        if self._metas:
            try:
                self._check_meta(graph)
            except BaseException:
                self._unplace_zero_byte(zero)
                raise
        save_sources(graph, self)
        with calling():
            ok = lib.ggml_backend_sched_alloc_graph(self.ptr, g)
            self._broken = not ok
            if not ok:
                self._unplace_zero_byte(zero)
                restore_sources(graph)
                self._placed(None, placed=False)
                raise MemoryError("ggml_backend_sched_alloc_graph failed")
            self._is_alloc = True
            self._io_plan = io
            self._placed(graph)
        try:
            # the split depends on the graph (its check), the pins and the backends: unchanged,
            # the verdict of its kernel-table check holds
            memo = self._checked.get(graph)
            key = (frozenset((p, b._ptr) for p, (_, b) in self._pins.items()),)
            if state is None or memo is None or memo[0] is not state or memo[1] != key:
                self._check_kernels(graph)
                if state is not None and memo is not None and memo[0] is state:
                    self._checked[graph] = (state, key)
        except ValueError:
            # nothing of the refused split stays: its tensors are not left placed in memory
            # this scheduler now regards as free (they would stay there, as ggml keeps a
            # tensor that has data where it is, and an alloc_tensors would skip them)
            self._pins.clear()  # reset(), which a callback may not call during a use
            self._reset()
            self._unplace(graph)
            self._unplace_zero_byte(zero)
            raise
        if state is not None:  # the check made before splitting still holds for the split graph
            run_of(graph).checks[self._ptr] = state

    def _check_meta(self, graph: Graph) -> None:
        """Before ggml places ``graph`` with a meta backend among this scheduler's: split it
        (``ggml_backend_sched_split_graph``, undone after) and check how ggml's meta backend
        would split the nodes the split gives it (:mod:`pyggml.backends.meta_check`: ValueError
        where it would abort). Once per graph version and pins."""
        key = (graph.version, int(lib.ggml_graph_n_nodes(graph.ptr)),
               frozenset((p, b._ptr) for p, (_, b) in self._pins.items()))
        if self._meta_checked.get(graph) == key:
            return
        nodes = graph.raw_nodes()
        before = [list(p.src) for p in nodes]
        saved = save_sources(graph, None)
        s = self.ptr
        try:
            with calling():
                lib.ggml_backend_sched_split_graph(s, graph.ptr)
            bufts = {b._ptr: t.ptr for b, t in zip(self._backends, self._bufts)}
            meta_check.check_sched(nodes, before, lambda p: lib.ggml_backend_sched_get_tensor_backend(s, p),
                                   bufts, self._metas)
        finally:
            restore_sources(graph, saved)
            self._reset()  # the split's assignments would pin the next split; pins made again
            self._pin_loose_leafs(graph)
        self._meta_checked[graph] = key

    def _check_kernels(self, graph: Graph) -> None:
        """After the split: each node the scheduler put on a backend with a kernel table (CPU:
        :func:`pyggml.backends.cpu.cpu_kernel_supports`; BLAS: :func:`pyggml.backends.blas.blas_kernel_supports`)
        must pass it; the table is stricter than the ``supports_op`` the scheduler asks (a node
        it refuses would abort in its kernel, or be computed wrong)."""
        tables = [b for b in self._backends if b._has_kernel_table]
        if not tables:
            return
        s = self.ptr
        for p in graph.raw_nodes():
            if p.op in EMPTY_OPS:
                continue
            for b in tables:  # the table first (Python): the C call only for a node it refuses
                if not b._kernel_ok(p) and lib.ggml_backend_sched_get_tensor_backend(s, p) == b._ptr:
                    raise ValueError(f"the scheduler put node {buffer.label(p)} on the {b.name} backend, "
                                     f"which cannot compute it: {b._why_not(p)}")

    def reset(self) -> None:
        """``ggml_backend_sched_reset``: forget the allocation (tensor data becomes invalid; the
        graph's sources are put back) and the pins of :meth:`set_tensor_backend`."""
        self._pins.clear()
        self._reset()

    def _reset(self) -> None:
        """``ggml_backend_sched_reset``, then the pins set since the last split made again."""
        s = self.ptr
        with calling():
            lib.ggml_backend_sched_reset(s)
        self._is_alloc = False
        old = self._graph
        self._graph = None
        if old is not None:
            restore_sources(old)
        if self._pins:
            for p, (t, b) in list(self._pins.items()):
                if t._owner._gen != t._gen or b._ptr is None:  # its context or backend closed since
                    del self._pins[p]
                else:
                    lib.ggml_backend_sched_set_tensor_backend(s, p, b._ptr)

    def _check_pins(self, graph: Graph) -> None:
        """The hash set of the split holds the graph's nodes and leafs, one more key, and the
        pinned tensors outside the graph: refuse (ValueError) what would fill it (an abort)."""
        if not self._pins:
            return
        inside = graph.node_set()
        outside = sum(1 for p in self._pins if p not in inside)
        if len(inside) + outside >= self.graph_size:
            raise ValueError(f"graph has {len(inside)} nodes and leafs and {outside} tensors pinned by "
                             f"set_tensor_backend are not in it: the scheduler's graph_size "
                             f"{self.graph_size} must be larger than their sum")

    # ------------------------------------------------------------------ compute
    def compute(self, graph: Graph) -> bool:
        """``ggml_backend_sched_graph_compute``, allocating ``graph`` first unless it is the
        graph this scheduler holds.

        Returns True, or False if the eval callback stopped the computation. Raises GGMLError
        on failure, or the exception a callback raised (the eval callback, a Python backend)."""
        return self._compute(graph, "ggml_backend_sched_graph_compute")

    def compute_async(self, graph: Graph) -> bool:
        """``ggml_backend_sched_graph_compute_async``; :meth:`synchronize` before reading."""
        return self._compute(graph, "ggml_backend_sched_graph_compute_async")

    def _compute(self, graph: Graph, what: str) -> bool:
        for cpu in self._cpus:
            cpu._restart_abort_clock()
        while True:
            seen = threads.changes  # a close after this is seen below, under the locks
            for b in self._backends:
                b.ptr  # a backend of the scheduler closed since the graph was placed: ClosedError
            if not (self._is_alloc and self._graph is graph and run_of(graph).split_by is self):
                self.alloc_graph(graph)
                seen = threads.changes  # its own change
            g = self._check_graph(graph)
            state = run_of(graph).checks.get(self._ptr)
            if state is None:  # another thread put the graph's sources back meanwhile
                continue
            lock = state.lock
            if lock is None:
                lock = state.lock = compute_lock(graph, self, *self._backends, *state.users)
            lock.__enter__()
            # nothing closed, placed anew or built into the graph while it waited
            if threads.changes == seen and state.version == graph.version and lib.ggml_graph_n_nodes(g) == state.n_nodes:
                break
            lock.__exit__()
        try:
            check_meta_views(graph, state)
            if not state.trialed:
                if state.indices is not None:
                    state.indices.run()  # the trial computes the graph: its indices first
                self._trial_compute(graph, g)
                state.trialed = True
            self._stopped = False
            mine = (self,) if self._eval is not None or self._copy is not None else ()
            compute(what, self._ptr, g, state, (*state.owners, *mine), lock.locks)
        finally:
            lock.__exit__()
        if not self._stopped:
            run_of(graph).computed = True
        return not self._stopped

    def _trial_compute(self, graph: Graph, g: Any) -> None:
        """As CPUBackend's: when the split put on a CPU backend a node of an op made by
        ``Context.op`` or ``Graph.build_backward`` (ops pyggml has no checks for), the graph is
        computed once by this scheduler in a forked copy of the process first (its CPU backends
        on one thread there), and ggml aborting there raises ValueError here. Skipped when a
        backend is a GPU, which does not survive fork()."""
        cpus = [b._ptr for b in self._backends if isinstance(b, CPUBackend)]
        if not cpus:
            return
        trial_ops = graph_trial_ops(graph)
        if not trial_ops:
            return
        s = self.ptr
        if not any(p.op in trial_ops and lib.ggml_backend_sched_get_tensor_backend(s, p) in cpus
                   for p in graph.raw_nodes()):
            return
        if any(Device.of(b).type in (DeviceType.GPU, DeviceType.IGPU) for b in self._backends):
            return

        def run() -> None:
            for be in cpus:  # the OpenMP runtime and threads of the parent do not survive fork()
                lib.ggml_backend_cpu_set_threadpool(be, ffi.NULL)
                lib.ggml_backend_cpu_set_n_threads(be, 1)
            lib.ggml_backend_sched_graph_compute(s, g)

        failure = _trial.trial(run, timeout=120)
        if failure is not None:
            raise ValueError(f"computing this graph would abort the process: {failure}")

    def synchronize(self) -> None:
        """``ggml_backend_sched_synchronize``: wait for every backend."""
        with calling():
            lib.ggml_backend_sched_synchronize(self.ptr)

    # ------------------------------------------------------------------ inspection
    @property
    def n_splits(self) -> int:
        """Splits of the last graph (``ggml_backend_sched_get_n_splits``)."""
        with calling():  # a call: no close meanwhile
            return int(lib.ggml_backend_sched_get_n_splits(self.ptr))

    @property
    def n_copies(self) -> int:
        """``ggml_backend_sched_get_n_copies`` (pipeline-parallel copies)."""
        with calling():  # a call: no close meanwhile
            return int(lib.ggml_backend_sched_get_n_copies(self.ptr))

    def buffer_size(self, backend: Backend) -> int:
        """Bytes of ``backend``'s compute buffer (``ggml_backend_sched_get_buffer_size``)."""
        self._index(backend)
        return int(lib.ggml_backend_sched_get_buffer_size(self.ptr, backend.ptr))

    def set_tensor_backend(self, tensor: Tensor, backend: Backend) -> None:
        """``ggml_backend_sched_set_tensor_backend``: pin ``tensor`` to ``backend`` for the
        splits to come (:meth:`alloc_graph`, :meth:`reserve`, :meth:`compute` of a graph not
        held) until :meth:`reset` forgets the pins (or the tensor's context closes).

        Raises ClosedError (closed scheduler or tensor), ValueError if ``backend`` is not one of
        the scheduler's or ``graph_size - 1`` tensors are pinned already (ggml keeps the pins in
        its hash set of ``graph_size`` tensors and aborts when it is full)."""
        self.ptr
        self._index(backend)
        p = tensor_arg(tensor, "tensor")._ptr
        if p not in self._pins and len(self._pins) + 1 >= self.graph_size:
            raise ValueError(f"{len(self._pins)} tensors are pinned already: the scheduler's graph_size "
                             f"{self.graph_size} must be larger than the number of pins")
        # made in ggml by the reset before every split (_reset): made now, under a held graph, it
        # would change the backend that graph's split inputs are copied from
        self._pins[p] = (tensor, backend)

    def get_tensor_backend(self, tensor: Tensor) -> Backend | None:
        """``ggml_backend_sched_get_tensor_backend``: the backend the split of the graph this
        scheduler holds put ``tensor`` on; else the backend it is pinned to; else None."""
        s = self.ptr
        t = tensor_arg(tensor, "tensor")
        graph = self._graph
        # only the held graph's tensors: ggml's lookup inserts the tensor into the hash set
        if graph is not None and t._ptr in graph.node_set():
            p = lib.ggml_backend_sched_get_tensor_backend(s, t._ptr)
            return next((b for b in self._backends if b._ptr == p), None)
        pin = self._pins.get(t._ptr)
        return pin[1] if pin is not None else None

    # ------------------------------------------------------------------ eval callback
    @property
    def eval_callback(self) -> EvalCallback | None:
        """``ggml_backend_sched_set_eval_callback``: ``func(tensor, ask)`` is called with
        ``ask=True`` for each node ("do you want to see it?") and, for those answered True, with
        ``ask=False`` once it is computed (its data readable during the call); returning False
        then stops the computation (ggml skips the rest of the split; :meth:`compute` returns
        False). An exception stops it too and is re-raised by :meth:`compute`. The tensor is
        lent for the call only."""
        return self._eval_func

    @eval_callback.setter
    def eval_callback(self, func: EvalCallback | None) -> None:
        self._eval_func = func
        if func is None:
            lib.ggml_backend_sched_set_eval_callback(self.ptr, ffi.NULL, ffi.NULL)
            self._eval = None
            return

        def trampoline(t: Any, ask: bool, user_data: Any) -> bool:
            scope = BorrowScope("an eval callback")
            try:
                go_on = bool(func(Tensor(t, scope), bool(ask)))
            except BaseException:
                self._stopped = True
                raise
            finally:
                scope.close()
            if not ask and not go_on:
                self._stopped = True
            return go_on

        self._eval = callbacks.Callback("ggml_backend_sched_eval_callback", trampoline, owner=self)
        lib.ggml_backend_sched_set_eval_callback(self.ptr, self._eval.fn, self._eval.user_data)

    # ------------------------------------------------------------------ copy callback
    @property
    def copy_callback(self) -> CopyCallback | None:
        """``ggml_backend_sched_set_copy_callback`` (ggml >= 0.26): ``func(backend, src, dst,
        graph)`` is called when a split copies a weight (a tensor of a host buffer whose usage is
        ``WEIGHTS``) to the split's backend, after the split's other inputs were copied:
        ``backend`` is the split's backend, ``src`` the weight, ``dst`` its copy in the split and
        ``graph`` the split's graph (all lent for the call). Return True if ``func`` filled what
        the split needs of ``dst`` itself (e.g. the rows of the experts a MUL_MAT_ID uses), False
        to let the scheduler copy the whole weight. An exception makes the scheduler copy the
        whole weight and is re-raised by :meth:`compute`. None removes the callback.

        Raises AttributeError (on setting) with a ggml older than 0.26."""
        return self._copy_func

    @copy_callback.setter
    def copy_callback(self, func: CopyCallback | None) -> None:
        set_copy_callback = requires("ggml_backend_sched_set_copy_callback")
        s = self.ptr
        self._copy_func = func
        if func is None:
            set_copy_callback(s, ffi.NULL, ffi.NULL)
            self._copy = None
            return
        backends = {b._ptr: b for b in self._backends}

        def trampoline(backend: Any, src: Any, dst: Any, cgraph: Any, user_data: Any) -> bool:
            scope = BorrowScope("a copy callback")
            try:
                graph = Graph(cgraph, scope, int(lib.ggml_graph_n_nodes(cgraph)))
                return bool(func(backends[backend], Tensor(src, scope), Tensor(dst, scope), graph))
            finally:
                scope.close()

        self._copy = callbacks.Callback("ggml_backend_sched_copy_callback", trampoline, owner=self)
        set_copy_callback(s, self._copy.fn, self._copy.user_data)
