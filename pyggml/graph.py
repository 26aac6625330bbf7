"""ggml compute graphs (``struct ggml_cgraph``): nodes (tensors computed by an op) and leafs
(inputs, weights, constants), built from the result tensors and computed on a backend."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import CObject, GGMLError
from ._loader import ffi, lib
from .tensor import Tensor

if TYPE_CHECKING:
    from .backend import Backend
    from .context import Context

__all__ = ["Graph", "status_name"]


def status_name(status: int) -> str:
    """``ggml_status_to_string``."""
    return ffi.string(lib.ggml_status_to_string(status)).decode()


def _is_node(p: Any) -> bool:  # as ggml_visit_parents decides
    return p.op != lib.GGML_OP_NONE or bool(p.flags & lib.GGML_TENSOR_FLAG_PARAM)


class Graph(CObject):
    """A graph borrowed from the context that holds it (``ggml_new_graph_custom``)."""

    _kind = "graph"

    def __init__(self, ptr: Any, ctx: "Context", size: int):
        super().__init__(ptr, owned=False, owner=ctx)
        self.size = size
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

    @property
    def n_nodes(self) -> int:
        return lib.ggml_graph_n_nodes(self.ptr)

    @property
    def nodes(self) -> list[Tensor]:
        """The nodes in execution order (``ggml_graph_node``)."""
        g = self.ptr
        return [Tensor(lib.ggml_graph_node(g, i), self.ctx, (self._keep_tensor(),))
                for i in range(lib.ggml_graph_n_nodes(g))]

    @property
    def leafs(self) -> list[Tensor]:
        """The tensors the nodes read that are not nodes themselves (inputs, weights)."""
        nodes = {int(ffi.cast("uintptr_t", t.ptr)) for t in self.nodes}
        out, seen = [], set()
        for t in self.nodes:
            for s in t.ptr.src:
                key = int(ffi.cast("uintptr_t", s))
                if s != ffi.NULL and key not in nodes and key not in seen:
                    seen.add(key)
                    out.append(Tensor(s, self.ctx, (self._keep_tensor(),)))
        return out

    def _keep_tensor(self) -> Any:
        return self  # node wrappers keep the graph (and so its context) alive

    def get_tensor(self, name: str) -> Tensor:
        """``ggml_graph_get_tensor``; KeyError if no node or leaf has that name."""
        t = lib.ggml_graph_get_tensor(self.ptr, name.encode())
        if t == ffi.NULL:
            raise KeyError(name)
        return Tensor(t, self.ctx, (self,))

    def _check_computable(self, backend: "Backend") -> None:
        from ._base import ClosedError

        buffer_closed = getattr(self.ctx, "_buffer_closed", lambda buf: False)
        for t in self.nodes:
            p = t.ptr
            for s in [p] + [s for s in p.src if s != ffi.NULL]:
                name = ffi.string(s.name).decode() or "(unnamed)"
                if s.data == ffi.NULL and not (s.view_src != ffi.NULL and s.view_src.data != ffi.NULL):
                    raise ValueError(f"tensor {name} of node {t.name or t.op_name} has no data: "
                                     "allocate the graph first (GraphAllocator, Scheduler, alloc_tensors)")
                buf = s.view_src.buffer if s.view_src != ffi.NULL else s.buffer
                if buf != ffi.NULL and buffer_closed(buf):
                    raise ClosedError(f"the buffer holding tensor {name} was freed (its allocator "
                                      "or buffer is closed): allocate the graph again")
            if not t.is_empty_op() and not backend.supports_op(t):
                raise ValueError(f"backend {backend.name} cannot compute node {t.name!r} "
                                 f"({t.op_name}, {t.type_name}, srcs "
                                 f"{[s.type_name for s in t.src]})")

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
