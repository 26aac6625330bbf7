"""ggml-alloc: the graph allocator (``ggml_gallocr``), which places a graph's tensors in one
buffer per buffer type, reusing memory of tensors no longer needed."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import CObject, GGMLError
from ._loader import ffi, lib

if TYPE_CHECKING:
    from .backend import Backend, BufferType
    from .graph import Graph

__all__ = ["GraphAllocator"]


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

    @property
    def buffer_size(self) -> int:
        """Bytes of the allocator's buffer (``ggml_gallocr_get_buffer_size``, buffer 0)."""
        return lib.ggml_gallocr_get_buffer_size(self.ptr, 0)
