"""ggml compute graphs (``struct ggml_cgraph``): nodes (tensors computed by an op) and leafs
(inputs, weights, constants), built from the result tensors and computed on a backend."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import CObject, GGMLError
from ._loader import ffi, lib
from .tensor import _EMPTY_OPS, Tensor

if TYPE_CHECKING:
    from .backend import Backend
    from .context import Context

__all__ = ["Graph", "status_name"]


def status_name(status: int) -> str:
    """``ggml_status_to_string``."""
    return ffi.string(lib.ggml_status_to_string(status)).decode()


def _is_node(p: Any) -> bool:  # as ggml_visit_parents decides
    return p.op != lib.GGML_OP_NONE or bool(p.flags & lib.GGML_TENSOR_FLAG_PARAM)


#: srcs whose gradient ggml ignores, per op (ggml_build_backward_expand)
_IGNORED_SRC = {lib.GGML_OP_IM2COL: (0,), lib.GGML_OP_CPY: (1,), lib.GGML_OP_GET_ROWS: (1,),
                lib.GGML_OP_ROPE: (1,)}
_VIEW_OK = {lib.GGML_OP_CPY, lib.GGML_OP_VIEW, lib.GGML_OP_RESHAPE, lib.GGML_OP_PERMUTE,
            lib.GGML_OP_TRANSPOSE}
#: the cases of ggml_compute_backward (ggml.c); anything else aborts
_BACKWARD_OPS = {getattr(lib, f"GGML_OP_{n}") for n in (
    "DUP ADD ADD1 ACC SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS MEAN REPEAT REPEAT_BACK "
    "RMS_NORM MUL_MAT SCALE SET CPY CONT RESHAPE VIEW PERMUTE TRANSPOSE GET_ROWS DIAG_MASK_INF "
    "DIAG_MASK_ZERO SOFT_MAX ROPE IM2COL POOL_2D WIN_PART WIN_UNPART UNARY CROSS_ENTROPY_LOSS GLU NONE").split()}
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


class Graph(CObject):
    """A graph borrowed from the context that holds it (``ggml_new_graph_custom``)."""

    _kind = "graph"

    def __init__(self, ptr: Any, ctx: "Context", size: int, grads: bool = False):
        super().__init__(ptr, owned=False, owner=ctx)
        self.size = size
        self.grads = grads
        self._backward = False
        self._trial_done = False
        self._seen: set[int] = set()
        self._n_leafs = 0
        self._keep: list[Tensor] = []

    @property
    def ctx(self) -> "Context":
        return self._owner

    def build_forward(self, *outputs: Tensor) -> "Graph":
        """``ggml_build_forward_expand`` for each output: add it and everything it depends on.

        Raises ValueError if the graph would exceed its size (ggml would abort).
        """
        from .ops import _tensor

        g = self.ptr
        for out in outputs:
            out = _tensor(out, "output")
            new_nodes, new_leafs, stack = set(), set(), [out.ptr]
            while stack:
                p = stack.pop()
                key = int(ffi.cast("uintptr_t", p))
                if key in self._seen or key in new_nodes or key in new_leafs:
                    continue
                (new_nodes if _is_node(p) else new_leafs).add(key)
                stack.extend(s for s in p.src if s != ffi.NULL)
            if lib.ggml_graph_n_nodes(g) + len(new_nodes) > self.size or self._n_leafs + len(new_leafs) > self.size:
                raise ValueError(f"graph of size {self.size} is too small: it would hold "
                                 f"{lib.ggml_graph_n_nodes(g) + len(new_nodes)} nodes and "
                                 f"{self._n_leafs + len(new_leafs)} leafs (Context.new_graph(size=...))")
            lib.ggml_build_forward_expand(g, out.ptr)
            self._seen |= new_nodes | new_leafs
            self._n_leafs += len(new_leafs)
            self._keep.append(out)
        return self

    def build_backward(self, ctx: "Context") -> "Graph":
        """``ggml_build_backward_expand``: add the gradient nodes of every parameter
        (``Tensor.set_param``) with respect to the loss (``Tensor.set_loss``), created in ``ctx``.

        Call after :meth:`build_forward` on a graph made with ``new_graph(grads=True)``; then
        allocate, :meth:`reset` (loss gradient 1, others 0), compute, and read :meth:`grad`.
        Raises ValueError for what ggml would abort on: no parameter or loss, a loss that does
        not depend on a parameter, ops without a backward pass in ggml, in-place ops, non-float
        types on the gradient path, a graph or context too small for the gradient nodes.
        """
        from .ops import _tensor

        if not self.grads:
            raise ValueError("build_backward needs a graph made with new_graph(..., grads=True)")
        if self._backward:
            raise ValueError("the backward pass is already built")
        nodes = self.nodes
        if not nodes:
            raise ValueError("the graph is empty: build_forward first")
        key = lambda p: int(ffi.cast("uintptr_t", p))  # noqa: E731
        needs: set[int] = set()
        n_grad = 0
        has_param = has_loss = False
        for t in nodes:
            p = t.ptr
            has_param |= bool(p.flags & lib.GGML_TENSOR_FLAG_PARAM)
            has_loss |= bool(p.flags & lib.GGML_TENSOR_FLAG_LOSS)
        for t in nodes:  # leaf params count too: they are visited as srcs
            for s in t.ptr.src:
                if s != ffi.NULL and s.flags & lib.GGML_TENSOR_FLAG_PARAM:
                    has_param = True
                    needs.add(key(s))
        if not has_param:
            raise ValueError("no trainable parameter in the graph: call Tensor.set_param()")
        if not has_loss:
            raise ValueError("no loss in the graph: call Tensor.set_loss()")
        for t in nodes:
            p = t.ptr
            if p.type == lib.GGML_TYPE_I32:
                continue
            ignored = _IGNORED_SRC.get(p.op, ())
            if p.op == lib.GGML_OP_UNARY and lib.ggml_get_unary_op(p) in (lib.GGML_UNARY_OP_SGN, lib.GGML_UNARY_OP_STEP):
                ignored = (0,)
            grad_srcs = [s for j, s in enumerate(p.src) if s != ffi.NULL and j not in ignored and key(s) in needs]
            if not (p.flags & lib.GGML_TENSOR_FLAG_PARAM or grad_srcs):
                continue
            for s in grad_srcs:
                if s.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16):
                    raise ValueError(f"gradient through a {t.type_name} input of {t.op_name}: only F32/F16")
            if p.view_src != ffi.NULL and p.op not in _VIEW_OK:
                raise ValueError(f"{t.op_name} ({t.name!r}) works in place: no backward pass in ggml")
            if not _has_backward(p):
                raise ValueError(f"ggml has no backward pass for {t.op_name} ({t.name!r})")
            needs.add(key(p))
            n_grad += 1
        loss = next(t for t in nodes if t.ptr.flags & lib.GGML_TENSOR_FLAG_LOSS)
        if key(loss.ptr) not in needs:
            raise ValueError("the loss does not depend on any parameter")
        # each node's backward adds a handful of nodes (mul_mat: out_prod, transposes, adds...)
        need_size = len(nodes) + 10 * n_grad + 16
        if self.size < need_size:
            raise ValueError(f"graph size {self.size} is too small for the backward pass: use at least {need_size}")
        _tensor(loss, "loss")
        ctx._reserve(0, n_objects=10 * n_grad + 16)
        lib.ggml_build_backward_expand(ctx.ptr, self.ptr, ffi.NULL)
        self._backward = True
        self._keep.append(ctx)  # type: ignore[arg-type]
        return self

    def grad(self, tensor: Tensor) -> Tensor | None:
        """The gradient of the loss with respect to ``tensor`` (``ggml_graph_get_grad``), or
        None if it has none."""
        if not self._backward:
            raise ValueError("no backward pass: call build_backward first")
        g = lib.ggml_graph_get_grad(self.ptr, tensor.ptr)
        return None if g == ffi.NULL else Tensor(g, self.ctx, (self,))

    def reset(self) -> None:
        """``ggml_graph_reset``: loss gradient 1, all other gradients 0 (they must be allocated)."""
        if not self._backward:
            raise ValueError("no backward pass: call build_backward first")
        for t in self.nodes:
            g = lib.ggml_graph_get_grad_acc(self.ptr, t.ptr)
            if g != ffi.NULL and g.data == ffi.NULL:
                raise ValueError("the gradients have no data: allocate the graph first")
        lib.ggml_graph_reset(self.ptr)

    @property
    def n_nodes(self) -> int:
        return lib.ggml_graph_n_nodes(self.ptr)

    def _raw_nodes(self) -> list[Any]:
        g = self.ptr
        return [lib.ggml_graph_node(g, i) for i in range(lib.ggml_graph_n_nodes(g))]

    def _raw_leafs(self, nodes: list[Any]) -> list[Any]:
        node_keys = {int(ffi.cast("uintptr_t", p)) for p in nodes}
        out, seen = [], set()
        for p in nodes:
            for s in p.src:
                if s == ffi.NULL:
                    continue
                key = int(ffi.cast("uintptr_t", s))
                if key not in node_keys and key not in seen:
                    seen.add(key)
                    out.append(s)
        return out

    @property
    def nodes(self) -> list[Tensor]:
        """The nodes in execution order (``ggml_graph_node``)."""
        return [Tensor(p, self.ctx, (self,)) for p in self._raw_nodes()]

    @property
    def leafs(self) -> list[Tensor]:
        """The tensors the nodes read that are not nodes themselves (inputs, weights)."""
        return [Tensor(p, self.ctx, (self,)) for p in self._raw_leafs(self._raw_nodes())]

    def get_tensor(self, name: str) -> Tensor:
        """``ggml_graph_get_tensor``; KeyError if no node or leaf has that name."""
        t = lib.ggml_graph_get_tensor(self.ptr, name.encode())
        if t == ffi.NULL:
            raise KeyError(name)
        return Tensor(t, self.ctx, (self,))

    def _check_computable(self, backend: "Backend") -> None:
        from ._base import ClosedError

        buffer_closed = getattr(self.ctx, "_buffer_closed", lambda buf: False)
        dead = bool(getattr(self.ctx, "_dead_buffers", None)) or any(
            b._ptr is None for b in getattr(self.ctx, "_buffers", ()))
        for p in self._raw_nodes():
            for s in [p] + [s for s in p.src if s != ffi.NULL]:
                if s.data == ffi.NULL and not (s.view_src != ffi.NULL and s.view_src.data != ffi.NULL):
                    name = ffi.string(s.name).decode() or "(unnamed)"
                    raise ValueError(f"tensor {name} of node {ffi.string(p.name).decode()} has no data: "
                                     "allocate the graph first (GraphAllocator, Scheduler, alloc_tensors)")
                if dead:
                    buf = s.view_src.buffer if s.view_src != ffi.NULL else s.buffer
                    if buf != ffi.NULL and buffer_closed(buf):
                        raise ClosedError(f"the buffer holding tensor {ffi.string(s.name).decode()} was "
                                          "freed (its allocator or buffer is closed): allocate the graph again")
            if p.op in _EMPTY_OPS or backend._supports_raw(p):
                continue
            t = Tensor(p, self.ctx, (self,))
            raise ValueError(f"backend {backend.name} cannot compute node {t.name!r} "
                             f"({t.op_name}, {t.type_name}, srcs {[s.type_name for s in t.src]})")

    def _trial_compute(self, backend: "Backend") -> None:
        """Graphs with nodes made by ``Context.op`` (ops pyggml has no checks for) are computed
        once in a forked copy of the process first, on the CPU: ggml aborting there raises
        ValueError here instead."""
        from ._fork import trial
        from .cpu import CPUBackend

        trial_ops = getattr(self.ctx, "_trial_ops", None)
        if not trial_ops or not isinstance(backend, CPUBackend) or self._trial_done:
            return
        if not any(p.op in trial_ops for p in self._raw_nodes()):
            return

        def run() -> None:
            be = lib.ggml_backend_cpu_init()
            # one thread: the OpenMP runtime of the parent does not survive fork()
            lib.ggml_backend_cpu_set_n_threads(be, 1)
            lib.ggml_backend_graph_compute(be, self.ptr)

        failure = trial(run, timeout=120)
        if failure is not None:
            raise ValueError(f"computing this graph would abort the process: {failure}")
        self._trial_done = True

    def compute(self, backend: "Backend | None" = None, n_threads: int | None = None) -> None:
        """Compute the graph (``ggml_backend_graph_compute``) on ``backend``, by default a new CPU
        backend with ``n_threads`` threads.

        Every tensor must have data; every node must be supported by the backend
        (``ggml_backend_supports_op``): otherwise ValueError before anything runs. A failed or
        aborted computation raises GGMLError (or the exception a Python callback raised, e.g.
        KeyboardInterrupt from the CPU backend's abort callback).
        """
        from . import callbacks
        from .backend import Backend

        own = backend is None
        if own:
            from .cpu import CPUBackend
            backend = CPUBackend(n_threads=n_threads)
        try:
            assert isinstance(backend, Backend)
            self._check_computable(backend)
            self._trial_compute(backend)
            status = lib.ggml_backend_graph_compute(backend.ptr, self.ptr)
            custom_errors = getattr(self.ctx, "_custom_errors", [])
            if custom_errors:  # raised by map_custom functions on CPU worker threads
                err = custom_errors[0]
                custom_errors.clear()
                callbacks.take_pending()
                raise err
            callbacks.raise_pending()
            if status != lib.GGML_STATUS_SUCCESS:
                raise GGMLError(f"graph compute failed: {status_name(status)}")
        finally:
            if own:
                backend.close()

    def __repr__(self) -> str:
        return "<Graph (closed)>" if self.closed else f"<Graph {self.n_nodes} nodes, size {self.size}>"
