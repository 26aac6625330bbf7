"""ggml-alloc: the graph allocator (``ggml_gallocr``), which places a graph's tensors in one
buffer per buffer type, reusing memory of tensors no longer needed."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import CObject
from ._loader import ffi, lib

if TYPE_CHECKING:
    from .backend import Backend, BufferType
    from .graph import Graph

__all__ = ["GraphAllocator"]


class _Placements:
    """Which contexts hold tensors placed in an allocator's buffers, and in which buffers.

    The contexts keep the allocator alive; when the allocator frees a buffer (close, or a
    reallocation that grows it) the contexts learn that tensors in it have no data any more.
    """

    def __init__(self) -> None:
        self.contexts: list[Any] = []
        self.buffers: set[int] = set()

    def record(self, graph: "Graph", allocator: Any) -> None:
        nodes = graph._raw_nodes()
        bufs = set()
        for p in nodes + graph._raw_leafs(nodes):
            buf = p.view_src.buffer if p.view_src != ffi.NULL else p.buffer
            if buf != ffi.NULL:
                bufs.add(int(ffi.cast("uintptr_t", buf)))
        self.release(keep=bufs)  # buffers not used any more were freed by a reallocation
        self.buffers |= bufs
        ctx = graph.ctx
        if hasattr(ctx, "_adopt_allocator"):
            ctx._adopt_allocator(allocator)
            if not any(c is ctx for c in self.contexts):
                self.contexts.append(ctx)

    def release(self, keep: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        gone = self.buffers - keep
        for ctx in self.contexts:
            ctx._dead_buffers |= gone
        self.buffers &= keep


class GraphAllocator(CObject):
    """``ggml_gallocr_new(buft)`` / ``ggml_gallocr_free``, owned. ``where`` is a backend (its
    default buffer type) or a buffer type."""

    _kind = "graph allocator"
    _c_free = lib.ggml_gallocr_free

    def __init__(self, where: "Backend | BufferType"):
        from .backend import Backend

        buft = where.default_buffer_type if isinstance(where, Backend) else where
        super().__init__(lib.ggml_gallocr_new(buft.ptr), owned=True)
        self._buft = buft
        self._placed = _Placements()

    def reserve(self, graph: "Graph") -> None:
        """``ggml_gallocr_reserve``: size the buffer for ``graph`` (a worst case) without
        allocating its tensors. Raises MemoryError if the buffer cannot be allocated."""
        if not lib.ggml_gallocr_reserve(self.ptr, graph.ptr):
            raise MemoryError("ggml_gallocr_reserve could not allocate its buffer")

    def alloc_graph(self, graph: "Graph") -> None:
        """``ggml_gallocr_alloc_graph``: give every tensor of ``graph`` that has no data a place
        in the allocator's buffer (growing it if needed). Inputs (``set_input``) come first and
        outputs (``set_output``) are kept; other intermediate memory is reused.
        Raises MemoryError on failure."""
        if not lib.ggml_gallocr_alloc_graph(self.ptr, graph.ptr):
            raise MemoryError("ggml_gallocr_alloc_graph failed")
        self._placed.record(graph, self)

    def close(self) -> None:
        """``ggml_gallocr_free``: tensors it placed lose their data (using them raises)."""
        super().close()
        self._placed.release()

    @property
    def buffer_size(self) -> int:
        """Bytes of the allocator's buffer (``ggml_gallocr_get_buffer_size``, buffer 0)."""
        return lib.ggml_gallocr_get_buffer_size(self.ptr, 0)
