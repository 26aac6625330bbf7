"""ggml compute graphs (``struct ggml_cgraph``): nodes (tensors computed by an op) and leafs
(inputs, weights, constants), built from the result tensors.

A graph is built here and computed by a backend (:meth:`pyggml.backends.backend.Backend.graph_compute`,
as in ggml) or a scheduler (:meth:`pyggml.backends.sched.Scheduler.compute`). Those check a graph once
and keep the result on the graph object: the check is not repeated while the graph, its
allocation and the memory its tensors live in stay unchanged (:attr:`Graph.version` counts the
changes made through pyggml; ``ggml_graph_n_nodes`` catches raw ``ggml_build_forward_expand``
calls).

Like a tensor, a graph is borrowed from the context that holds it and is invalid once that
context is closed or reset.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol

from .. import _cobject, _trial
from ..raw import threads
from . import tensor as _tensor
from ..enums import Op, TensorFlag
from ..errors import ClosedError
from ..raw import ffi, lib
from ..raw.boundary import calling
from .tensor import GGML_INTERNAL, BorrowScope, Tensor, context_of, tensor_arg

__all__ = ["Graph", "Computer"]


class Computer(Protocol):
    """What computes a graph: a :class:`~pyggml.backends.backend.Backend` (or a scheduler's ``compute``
    wrapped); :meth:`Graph.compute` takes one."""

    def graph_compute(self, graph: "Graph") -> None: ...

_MAX_SRC = int(lib.GGML_MAX_SRC)
_PARAM, _LOSS = int(TensorFlag.PARAM), int(TensorFlag.LOSS)
_IO = int(TensorFlag.INPUT) | int(TensorFlag.OUTPUT)


def _is_node(p: Any) -> bool:  # as ggml_visit_parents decides
    return p.op != lib.GGML_OP_NONE or bool(p.flags & _PARAM)


#: srcs whose gradient ggml ignores, per op (ggml_build_backward_expand)
_IGNORED_SRC = {Op.IM2COL: (0,), Op.CPY: (1,), Op.GET_ROWS: (1,), Op.ROPE: (1,)}
_VIEW_OK = {Op.CPY, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE}
#: the cases of ggml_compute_backward (ggml.c); anything else aborts
_BACKWARD_OPS = {Op[n] for n in (
    "DUP ADD ADD1 ACC SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS MEAN REPEAT REPEAT_BACK "
    "RMS_NORM MUL_MAT SCALE SET CPY CONT RESHAPE VIEW PERMUTE TRANSPOSE GET_ROWS DIAG_MASK_INF "
    "DIAG_MASK_ZERO SOFT_MAX ROPE IM2COL POOL_2D UNARY CROSS_ENTROPY_LOSS GLU NONE").split()}
# (ggml_compute_backward lists WIN_PART/WIN_UNPART in its UNARY case: ggml_get_unary_op asserts)
_BACKWARD_UNARY = {getattr(lib, f"GGML_UNARY_OP_{n}") for n in
                   "ABS SGN NEG STEP RELU SILU EXP EXPM1 SOFTPLUS".split()}


def _has_backward(p: Any) -> bool:
    if p.op not in _BACKWARD_OPS:
        return False
    if p.op == lib.GGML_OP_UNARY:
        return lib.ggml_get_unary_op(p) in _BACKWARD_UNARY
    if p.op == lib.GGML_OP_GLU:
        return lib.ggml_get_glu_op(p) == lib.GGML_GLU_OP_SWIGLU
    return True


class Graph(_cobject.CObject):
    """A graph borrowed from the context that holds it (``ggml_new_graph_custom``; make one
    with :meth:`pyggml.core.context.Context.new_graph`). ``size``: the most nodes (and the most
    leafs) it can hold."""

    _kind = "graph"

    def __init__(self, ptr: Any, ctx: _tensor.Arena, size: int, grads: bool = False):
        super().__init__(ptr, owned=False, owner=ctx)
        self._gen = ctx._gen
        self.size = size
        self.grads = grads
        self.version = 0              #: changes made through pyggml (``build_*``)
        self._backward = False
        self._seen: set[Any] = set()  # every node and leaf added so far
        self._n_leafs = 0
        self._keep: list[Any] = []
        self._deps: dict[Any, int] = {}  # contexts its tensors come from -> their generation then
        #: what the backends layer keeps about the graph (where it is placed, whether computed,
        #: each backend's check: :class:`pyggml.backends.graph_run.GraphRun`); None until then
        self.run: Any = None
        self._node_set: frozenset[Any] | None = None
        self._root_leafs: list[Any] | None = None
        # caches of what other modules work out once per graph version (keyed by it)
        self._io_flags: tuple[Any, tuple[tuple[int, ...], tuple[int, ...]]] | None = None  # io_flags()

    # ------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self._ptr is None or self._owner._gen != self._gen

    @property
    def ptr(self) -> Any:
        """The ``struct ggml_cgraph *``; ClosedError once its context is closed or reset."""
        if self._ptr is None or self._owner._gen != self._gen:
            raise ClosedError("the context holding this graph is closed or was reset")
        return self._ptr

    def _changed(self) -> None:
        self.version += 1
        self._node_set = None
        self._root_leafs = None

    # ------------------------------------------------------------------ building
    def build_forward(self, *outputs: Tensor) -> "Graph":
        """``ggml_build_forward_expand`` for each output: add it and everything it depends on.

        Raises ValueError if the graph would exceed its size (ggml would abort), TypeError for
        something that is not a tensor, ClosedError for a tensor of a closed context; every
        output is checked first, so a call that raises adds none of them.
        """
        # the graph's context: no build, reset or close meanwhile (resets and closes take every
        # context's lock; computes on other threads that read the outputs' contexts go on)
        with threads.using(self._owner, gate=False):
            return self._build_forward(outputs)

    def _build_forward(self, outputs: tuple[Tensor, ...]) -> "Graph":
        g = self.ptr
        # every output checked before anything is walked or added: a bad one (closed, not a
        # tensor) or a graph too small leaves the graph as it was
        outs = [tensor_arg(out, "output") for out in outputs]
        for out in outs:
            owner = out._owner
            if not isinstance(owner, BorrowScope) and owner._stale:  # its nodes may point at
                owner._check_deps()                                   # memory that is gone
        new_nodes: set[Any] = set()
        new_leafs: set[Any] = set()
        stack = [out._ptr for out in outs]
        seen = self._seen
        while stack:
            p = stack.pop()
            if p in seen or p in new_nodes or p in new_leafs:
                continue
            (new_nodes if _is_node(p) else new_leafs).add(p)
            stack.extend(s for s in p.src if s != ffi.NULL)
        n_nodes = int(lib.ggml_graph_n_nodes(g)) + len(new_nodes)
        if n_nodes > self.size or self._n_leafs + len(new_leafs) > self.size:
            raise ValueError(f"graph of size {self.size} is too small: it would hold "
                             f"{n_nodes} nodes and {self._n_leafs + len(new_leafs)} leafs "
                             "(Context.new_graph(size=...))")
        for out in outs:
            lib.ggml_build_forward_expand(g, out._ptr)
            self._record_deps(out._owner, out._gen)
            self._keep.append(out)
        seen |= new_nodes | new_leafs
        self._n_leafs += len(new_leafs)
        self._changed()
        return self

    def build_backward(self, ctx: _tensor.Arena) -> "Graph":
        """``ggml_build_backward_expand``: add the gradient nodes of every parameter
        (``Tensor.set_param``) with respect to the loss (``Tensor.set_loss``), created in ``ctx``.

        Call after :meth:`build_forward` on a graph made with ``new_graph(grads=True)``; then
        allocate, :meth:`reset` (loss gradient 1, others 0), compute, and read :meth:`grad`.
        Raises ValueError for what ggml would abort on: no parameter or loss, a loss that does
        not depend on a parameter, ops without a backward pass in ggml, in-place ops, non-float
        types on the gradient path, a graph or context too small for the gradient nodes, and
        (with ggml's message) anything else ggml_build_backward_expand asserts on, which runs
        first in a forked child (:mod:`pyggml._trial`). The gradient nodes' ops become trial
        ops of ``ctx``: the backward graph's first CPU compute is tried in a forked child too.
        """
        if not hasattr(ctx, "_reserve"):
            raise TypeError(f"build_backward makes the gradient nodes in a pyggml Context, not {type(ctx).__name__}")
        with self._holding(ctx):  # no reset or close meanwhile
            return self._build_backward(ctx)

    def _build_backward(self, ctx: Any) -> "Graph":
        if not self.grads:
            raise ValueError("build_backward needs a graph made with new_graph(..., grads=True)")
        if self._backward:
            raise ValueError("the backward pass is already built")
        nodes = self.raw_nodes()
        if not nodes:
            raise ValueError("the graph is empty: build_forward first")
        needs: set[Any] = set()
        n_grad = 0
        has_param = any(p.flags & _PARAM for p in nodes)
        has_loss = any(p.flags & _LOSS for p in nodes)
        for p in nodes:  # leaf params count too: they are visited as srcs
            for s in p.src:
                if s != ffi.NULL and s.flags & _PARAM:
                    has_param = True
                    needs.add(s)
        if not has_param:
            raise ValueError("no trainable parameter in the graph: call Tensor.set_param()")
        if not has_loss:
            raise ValueError("no loss in the graph: call Tensor.set_loss()")
        for p in nodes:
            if p.type == lib.GGML_TYPE_I32:
                continue
            ignored = _IGNORED_SRC.get(p.op, ())
            if p.op == lib.GGML_OP_UNARY and lib.ggml_get_unary_op(p) in (lib.GGML_UNARY_OP_SGN, lib.GGML_UNARY_OP_STEP):
                ignored = (0,)
            grad_srcs = [s for j, s in enumerate(p.src) if s != ffi.NULL and j not in ignored and s in needs]
            if not (p.flags & _PARAM or grad_srcs):
                continue
            t = Tensor._of(p)
            for s in grad_srcs:
                if s.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16):
                    raise ValueError(f"gradient through a {Tensor._of(s).type_name} input of {t.op_name}: only F32/F16")
            if p.view_src != ffi.NULL and p.op not in _VIEW_OK:
                raise ValueError(f"{t.op_name} ({t._label()}) works in place: no backward pass in ggml")
            if not _has_backward(p):
                raise ValueError(f"ggml has no backward pass for {t.op_name} ({t._label()})")
            needs.add(p)
            n_grad += 1
        loss = next(p for p in nodes if p.flags & _LOSS)
        if loss not in needs:
            raise ValueError("the loss does not depend on any parameter")
        # each node's backward adds a handful of nodes (mul_mat: out_prod, transposes, adds...)
        need_size = len(nodes) + 10 * n_grad + 16
        if self.size < need_size:
            raise ValueError(f"graph size {self.size} is too small for the backward pass: use at least {need_size}")
        # ctx is held (_holding): no op constructor makes nodes there meanwhile
        ctx._reserve(0, n_objects=10 * n_grad + 16)
        c, g = ctx._live_ptr(), self.ptr
        # what ggml_compute_backward and the constructors it calls assert about the sources
        # of each case (masks, freq_factors, labels, layouts of gradients...): tried in a
        # forked child first, once per graph
        failure = _trial.trial(lambda: lib.ggml_build_backward_expand(c, g, ffi.NULL))
        if failure is not None:
            raise ValueError(f"ggml cannot build the backward pass of this graph: {failure}")
        n_before = lib.ggml_graph_n_nodes(g)
        lib.ggml_build_backward_expand(c, g, ffi.NULL)
        ctx._recount()  # the reservation above was an estimate of the nodes C made
        # the gradient nodes have no checks of their own: their first CPU compute is a forked
        # trial (CPUBackend._trial_compute, Scheduler), as for Context.op nodes
        ctx._trial_ops.update(int(lib.ggml_graph_node(g, i).op)
                              for i in range(n_before, lib.ggml_graph_n_nodes(g)))
        self._backward = True
        self._keep.append(ctx)
        self._record_deps(ctx, ctx._gen)
        self._changed()
        return self

    def grad(self, tensor: Tensor) -> Tensor | None:
        """The gradient of the loss with respect to ``tensor`` (``ggml_graph_get_grad``), or
        None if it has none. Raises ValueError before :meth:`build_backward`."""
        if not self._backward:
            raise ValueError("no backward pass: call build_backward first")
        p = tensor_arg(tensor, "tensor")._ptr
        found = self._wrapped(lambda: [lib.ggml_graph_get_grad(self.ptr, p)])
        return found[0] if found else None

    def reset(self) -> None:
        """``ggml_graph_reset``: loss gradient 1, all other gradients 0 (they must be allocated;
        ValueError otherwise or before :meth:`build_backward`)."""
        if not self._backward:
            raise ValueError("no backward pass: call build_backward first")
        g = self.ptr
        for p in self.raw_nodes():
            acc = lib.ggml_graph_get_grad_acc(g, p)
            if acc != ffi.NULL and acc.data == ffi.NULL:
                raise ValueError("the gradients have no data: allocate the graph first")
        lib.ggml_graph_reset(g)

    # ------------------------------------------------------------------ inspection
    @property
    def n_nodes(self) -> int:
        """``ggml_graph_n_nodes``."""
        with calling():  # a call: no close meanwhile
            return int(lib.ggml_graph_n_nodes(self.ptr))

    @property
    def uid(self) -> int:
        """ggml's identifier of this graph (``ggml_cgraph.uid``; 0: not set). The scheduler gives
        each split a new one whenever it splits a graph; ggml-cuda replays its captured CUDA
        graph of a split without comparing the nodes while the uid stays the same. Read in a
        Python backend's ``graph_compute`` (the split's graph) to see whether a graph was split
        again."""
        return int(lib.pyggml_graph_uid(self.ptr))

    def raw_nodes(self) -> list[Any]:
        """The nodes in execution order as raw ``struct ggml_tensor *`` (no wrappers, no checks:
        for code ggml calls while it owns the graph, e.g. a Python backend's ``graph_compute``)."""
        g = self.ptr
        return [lib.ggml_graph_node(g, i) for i in range(lib.ggml_graph_n_nodes(g))]

    def _raw_leafs(self, nodes: list[Any]) -> list[Any]:
        """The structs the nodes read that are not nodes themselves."""
        node_set = set(nodes)
        out, seen = [], set()
        for p in nodes:
            for s in p.src:
                if s == ffi.NULL:
                    break
                if s not in node_set and s not in seen:
                    seen.add(s)
                    out.append(s)
        return out

    def _record_deps(self, ctx: Any, gen: int) -> None:
        """Record ``ctx`` (generation ``gen``) and the contexts its tensors read *now*
        (``Context._deps``, transitively) as contexts the graph's tensors come from, each with
        the oldest generation seen. Taken when tensors are added: nodes a context makes later
        from other contexts' tensors are not in this graph, and a reset of those contexts does
        not concern it (an allocator refused such a graph as closed while the backend computed
        it)."""
        deps = self._deps
        visited: set[Any] = set()
        todo = [(ctx, gen)]
        while todo:
            c, g = todo.pop()
            old = deps.get(c)
            if old is None or g < old:
                deps[c] = g
            if c not in visited:
                visited.add(c)
                todo.extend(getattr(c, "_deps", {}).items())

    def contexts(self) -> list[tuple[Any, int]]:
        """(context, generation) of the context holding the graph and of every context its
        tensors come from, with the generation they had when the graph's tensors were added
        (the outputs' contexts, and what op constructors had recorded then:
        ``Context._deps``, transitively). A context whose generation differs now was reset or
        closed since: the graph points at memory that is gone."""
        owner = self._owner
        if isinstance(owner, BorrowScope):
            return []
        out = dict(self._deps)
        gen = out.get(owner)
        if gen is None or self._gen < gen:
            out[owner] = self._gen
        return list(out.items())

    def _holding(self, *users: Any) -> threads.Held:
        """The :class:`~pyggml.raw.threads.using` of ``users`` (a backend, a placer...), the graph's
        context and every context its tensors come from (:meth:`contexts`), held: no close or
        reset meanwhile, and no thread places, sets or builds in those contexts while C walks
        the graph's tensor structs (checks, placements). The caller lets go (``with``). The
        contexts are looked at again once held (a build on another thread may have added one
        meanwhile), and the locks taken again if there are more."""
        while True:
            contexts = {c for c, _ in self.contexts()}
            held = threads.using(*users, self._owner, *contexts).hold()
            if {c for c, _ in self.contexts()} <= contexts:
                return held
            held.release()

    def check_contexts(self) -> list[tuple[Any, int]]:
        """:meth:`contexts`, after raising ClosedError if one of them was reset or closed since."""
        contexts = self.contexts()
        for ctx, gen in contexts:
            if ctx._gen != gen:
                raise ClosedError("a context holding tensors of this graph was closed or reset since "
                                  "the graph was built: it points at memory that is gone")
        return contexts

    def node_set(self) -> frozenset[Any]:
        """Every node and leaf struct of the graph (cached until the graph changes)."""
        if self._node_set is None:
            nodes = self.raw_nodes()
            # and the outputs built that are leafs read by no node
            node_set = (frozenset(nodes) | frozenset(self._raw_leafs(nodes))
                        | frozenset(t._ptr for t in self._keep if isinstance(t, Tensor)))
            saved = getattr(self.run, "sources", None)  # the sources a scheduler's split replaced
            if saved is not None:  # split by a scheduler: its sources read copies of the leafs
                # (inputs copied to another backend); the leafs themselves are still the graph's
                node_set |= frozenset(p for p in ffi.unpack(saved.saved, saved.n * _MAX_SRC)
                                      if p != ffi.NULL)
            self._node_set = node_set
        return self._node_set

    def io_flags(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ``set_input`` / ``set_output`` flags of the nodes (execution order) and of the
        leafs they read, by position: ggml-alloc's plan depends on them (inputs first, outputs
        never handed to an in-place node nor freed), but ``ggml_gallocr_alloc_graph`` keeps a
        plan while the counts and sizes fit, whatever the flags: placers plan again when they
        changed (:mod:`pyggml.backends.alloc`, :mod:`pyggml.backends.sched`). Cached until the graph changes or
        a flag is set through pyggml."""
        key = (self.version, int(lib.ggml_graph_n_nodes(self.ptr)), _tensor._io_epoch)
        cached = self._io_flags
        if cached is None or cached[0] != key:
            nodes = self.raw_nodes()
            cached = self._io_flags = (key, (tuple(p.flags & _IO for p in nodes),
                                                         tuple(p.flags & _IO for p in self._raw_leafs(nodes))))
        return cached[1]

    def root_leafs(self) -> list[Any]:
        """The structs of :meth:`node_set` that are leafs and not views: the tensors a graph
        allocator must place itself when they have no data (cached until the graph changes)."""
        if self._root_leafs is None:
            nodes = set(self.raw_nodes())
            self._root_leafs = [p for p in self.node_set() if p not in nodes and p.view_src == ffi.NULL]
        return self._root_leafs

    def _wrap(self, p: Any) -> Tensor:
        owner = self._owner
        return Tensor(p, context_of(p) or (owner if isinstance(owner, BorrowScope) else GGML_INTERNAL))

    def _wrapped(self, structs: Callable[[], list[Any]]) -> list[Tensor]:
        """``structs()`` (read from the graph; NULLs skipped) wrapped, holding the lock of the
        graph's context (no reset anywhere meanwhile: resets take every context's lock), after
        :meth:`check_contexts`: a wrapper takes its context's generation *now*, so one made for
        a struct of a context reset since (or meanwhile, on another thread) would call whatever
        is there now an open tensor (ggml's objects made there since: garbage read as a
        tensor)."""
        with threads.using(self._owner, gate=False):
            self.check_contexts()
            return [self._wrap(p) for p in structs() if p != ffi.NULL]

    @property
    def nodes(self) -> list[Tensor]:
        """The nodes in execution order (``ggml_graph_node``). ClosedError if a context holding
        tensors of the graph was reset or closed since they were added."""
        return self._wrapped(self.raw_nodes)

    @property
    def leafs(self) -> list[Tensor]:
        """The tensors the nodes read that are not nodes themselves (inputs, weights).
        ClosedError as :attr:`nodes`."""
        return self._wrapped(lambda: self._raw_leafs(self.raw_nodes()))

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def get_tensor(self, name: str) -> Tensor:
        """``ggml_graph_get_tensor``: the node or leaf named ``name`` (see :attr:`Tensor.name
        <pyggml.core.tensor.Tensor.name>`); KeyError if none has that name, TypeError unless a str."""
        raw = _tensor.lookup_name_bytes(name)
        found = self._wrapped(lambda: [] if raw is None else [lib.ggml_graph_get_tensor(self.ptr, raw)])
        if not found:
            raise KeyError(name)
        return found[0]

    # ------------------------------------------------------------------ compute
    def compute(self, backend: Computer) -> None:
        """Compute the graph on ``backend``: :meth:`pyggml.backends.backend.Backend.graph_compute`,
        which says what is checked and raised (:func:`pyggml.backends.cpu.graph_compute`: on a new CPU
        backend). TypeError for something that computes no graph (``None``: use
        :func:`pyggml.backends.cpu.graph_compute` for a new CPU backend)."""
        if not hasattr(backend, "graph_compute"):
            raise TypeError(f"Graph.compute takes a backend, not {type(backend).__name__} "
                            "(pyggml.backends.cpu.graph_compute(graph) computes on a new CPU backend)")
        backend.graph_compute(self)

    def __repr__(self) -> str:
        return "<Graph (closed)>" if self.closed else f"<Graph {self.n_nodes} nodes, size {self.size}>"

