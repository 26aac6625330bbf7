"""ggml contexts (``struct ggml_context``): the memory arena that holds tensor structs, graphs and,
unless ``no_alloc``, tensor data.

A context is fixed-size: ggml asserts (and aborts the process) when it is full. :class:`Context`
checks the free space before every tensor or graph it creates and raises :class:`MemoryError`
instead. Op constructors are methods (:class:`pyggml.ops.Ops`), as in C: ``ctx.add(a, b)`` is
``ggml_add(ctx, a, b)``; the result lives in ``ctx``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from ._base import CObject
from ._loader import ffi, lib
from .ops import Ops
from .tensor import Tensor

if TYPE_CHECKING:
    from .backend import Backend, Buffer, BufferType
    from .graph import Graph

__all__ = ["Context"]

DEFAULT_MEM_SIZE = 16 * 1024 * 1024


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class Context(CObject, Ops):
    """A ggml context (``ggml_init`` / ``ggml_free``); owns its memory.

    ``mem_size`` is in bytes. With ``no_alloc=True`` tensors get no data in the context (allocate
    them in a backend buffer: :meth:`alloc_tensors`, a graph allocator or a scheduler); each
    tensor then needs :func:`tensor_overhead` bytes. Raises MemoryError if ggml cannot allocate
    the arena, ValueError for a negative size.
    """

    _kind = "context"
    _c_free = lib.ggml_free

    def __init__(self, mem_size: int = DEFAULT_MEM_SIZE, *, no_alloc: bool = False):
        if mem_size < 0:
            raise ValueError("mem_size must be >= 0")
        ptr = lib.ggml_init({"mem_size": mem_size, "mem_buffer": ffi.NULL, "no_alloc": no_alloc})
        if ptr == ffi.NULL:
            raise MemoryError(f"ggml_init could not allocate {mem_size} bytes")
        super().__init__(ptr, owned=True)
        self._buffers: list["Buffer"] = []
        self._callbacks: list[Any] = []       # Python ops (map_custom) live as long as the context
        self._allocators: list[Any] = []      # graph allocators / schedulers holding our tensors' data
        self._dead_buffers: set[int] = set()  # addresses of buffers freed under our tensors
        self._custom_errors: list[BaseException] = []
        self._trial_ops: set[int] = set()      # ops made by Ops.op without checks of their own

    @classmethod
    def for_tensors(cls, n_tensors: int, *, graph_size: int = 0) -> "Context":
        """A ``no_alloc`` context sized for ``n_tensors`` tensor structs plus, if ``graph_size``,
        one graph of that many nodes."""
        size = n_tensors * lib.ggml_tensor_overhead()
        if graph_size:
            size += lib.ggml_graph_overhead_custom(graph_size, False)
        return cls(size, no_alloc=True)

    # ------------------------------------------------------------------ properties
    @property
    def mem_size(self) -> int:
        """Arena size in bytes (``ggml_get_mem_size``)."""
        return lib.ggml_get_mem_size(self.ptr)

    @property
    def used_mem(self) -> int:
        """Bytes in use (``ggml_used_mem``)."""
        return lib.ggml_used_mem(self.ptr)

    @property
    def no_alloc(self) -> bool:
        return bool(lib.ggml_get_no_alloc(self.ptr))

    def reset(self) -> None:
        """``ggml_reset``: forget every tensor and graph (their Python wrappers become invalid
        only in the sense that ggml will reuse the memory: do not use them afterwards)."""
        lib.ggml_reset(self.ptr)

    def tensors(self) -> Iterator[Tensor]:
        """Every tensor of the context, in creation order (``ggml_get_first/next_tensor``)."""
        t = lib.ggml_get_first_tensor(self.ptr)
        while t != ffi.NULL:
            yield Tensor(t, self)
            t = lib.ggml_get_next_tensor(self.ptr, t)

    def get_tensor(self, name: str) -> Tensor:
        """``ggml_get_tensor``; raises KeyError if no tensor has that name."""
        t = lib.ggml_get_tensor(self.ptr, name.encode())
        if t == ffi.NULL:
            raise KeyError(name)
        return Tensor(t, self)

    # ------------------------------------------------------------------ memory checks
    def _reserve(self, data_bytes: int = 0, n_objects: int = 1, extra: int = 0) -> None:
        """Raise MemoryError unless ``n_objects`` tensors (with ``data_bytes`` of data when the
        context allocates) and ``extra`` bytes fit (ggml would assert instead)."""
        ptr = self.ptr
        need = n_objects * lib.ggml_tensor_overhead() + extra
        if data_bytes and not lib.ggml_get_no_alloc(ptr):
            need += _pad(data_bytes, lib.GGML_MEM_ALIGN)
        free = lib.ggml_get_mem_size(ptr) - lib.ggml_used_mem(ptr)
        if need > free:
            raise MemoryError(f"ggml context full: {need} bytes needed, {free} free of "
                              f"{lib.ggml_get_mem_size(ptr)} (make a larger Context)")

    def _wrap(self, ptr: Any, inputs: Sequence[Tensor] = ()) -> Tensor:
        return Tensor(ptr, self, tuple(inputs))

    # ------------------------------------------------------------------ tensor creation
    def new_tensor(self, type: int, ne: Sequence[int], name: str | None = None) -> Tensor:
        """``ggml_new_tensor``: a tensor of ggml ``type`` with ``ne`` (ggml order, 1 to 4 dims).

        Raises ValueError for an unknown type, 0 or more than 4 dims, negative sizes, or
        ``ne[0]`` not a multiple of a quantized type's block size; MemoryError if the context is
        full.
        """
        from . import types

        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= lib.GGML_MAX_DIMS:
            raise ValueError(f"a ggml tensor has 1 to {lib.GGML_MAX_DIMS} dims, got {len(ne)}")
        if any(n < 0 for n in ne):
            raise ValueError(f"negative size in ne={ne}")
        blck = types.block_size(type)  # raises ValueError for an unknown or removed type
        if ne[0] % blck:
            raise ValueError(f"ne[0]={ne[0]} is not a multiple of the {types.type_name(type)} block size {blck}")
        nbytes = types.row_size(type, ne[0]) * int(np.prod(ne[1:], dtype=np.int64))
        self._reserve(nbytes)
        t = self._wrap(lib.ggml_new_tensor(self.ptr, type, len(ne), ffi.new("int64_t[]", ne)))
        if name is not None:
            t.name = name
        return t

    def new_tensor_1d(self, type: int, ne0: int) -> Tensor:
        return self.new_tensor(type, [ne0])

    def new_tensor_2d(self, type: int, ne0: int, ne1: int) -> Tensor:
        return self.new_tensor(type, [ne0, ne1])

    def new_tensor_3d(self, type: int, ne0: int, ne1: int, ne2: int) -> Tensor:
        return self.new_tensor(type, [ne0, ne1, ne2])

    def new_tensor_4d(self, type: int, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
        return self.new_tensor(type, [ne0, ne1, ne2, ne3])

    def dup_tensor(self, t: Tensor) -> Tensor:
        """``ggml_dup_tensor``: a new tensor with ``t``'s type and ne (no data copied)."""
        return self.new_tensor(t.type, t.ne)

    def from_numpy(self, array: Any, type: int | None = None, name: str | None = None) -> Tensor:
        """A tensor with ``array``'s shape (NumPy order; ne = shape reversed) and type (from the
        dtype unless ``type`` is given: float32 F32, float16 F16, float64 F64, int8..int64 I8..I64).
        In an allocating context the data is copied in; in a ``no_alloc`` context only the tensor
        is created (set its data once allocated). Raises TypeError for a dtype without a ggml type.
        """
        from . import types

        a = np.asarray(array)
        if a.ndim > lib.GGML_MAX_DIMS:
            raise ValueError(f"{a.ndim}-d array: ggml tensors have at most {lib.GGML_MAX_DIMS} dims")
        ggml_type = types.type_of_dtype(a.dtype) if type is None else type
        t = self.new_tensor(ggml_type, a.shape[::-1] or (1,), name=name)
        if not self.no_alloc:
            t.set(a)
        return t

    # ------------------------------------------------------------------ graphs and buffers
    def new_graph(self, size: int = lib.GGML_DEFAULT_GRAPH_SIZE, grads: bool = False) -> "Graph":
        """``ggml_new_graph_custom``: an empty graph of at most ``size`` nodes and ``size`` leafs."""
        from .graph import Graph

        if size < 1:
            raise ValueError("graph size must be >= 1")
        self._reserve(0, n_objects=0, extra=lib.ggml_graph_overhead_custom(size, grads) + 64)
        return Graph(lib.ggml_new_graph_custom(self.ptr, size, grads), self, size, grads)

    def alloc_tensors(self, where: "Backend | BufferType") -> "Buffer":
        """Allocate every tensor of this ``no_alloc`` context in one backend buffer
        (``ggml_backend_alloc_ctx_tensors`` / ``_from_buft``). The context keeps the buffer alive.

        Raises ValueError if the context allocates its own data or holds no unallocated tensor;
        GGMLError if the allocation fails.
        """
        from ._base import GGMLError
        from .backend import Backend, Buffer

        if not self.no_alloc:
            raise ValueError("alloc_tensors needs a no_alloc context")
        if not any(t.ptr.data == ffi.NULL and t.ptr.view_src == ffi.NULL for t in self.tensors()):
            raise ValueError("no tensor of this context needs allocation")
        if isinstance(where, Backend):
            ptr = lib.ggml_backend_alloc_ctx_tensors(self.ptr, where.ptr)
        else:
            ptr = lib.ggml_backend_alloc_ctx_tensors_from_buft(self.ptr, where.ptr)
        if ptr == ffi.NULL:
            raise GGMLError("ggml_backend_alloc_ctx_tensors failed (out of memory?)")
        buf = Buffer(ptr, owned=True, keep=where)
        self._buffers.append(buf)
        return buf

    def _buffer_closed(self, buf_ptr: Any) -> bool:
        if int(ffi.cast("uintptr_t", buf_ptr)) in self._dead_buffers:
            return True
        return any(b._ptr is None and b._c_addr == buf_ptr for b in self._buffers)

    def _adopt_allocator(self, allocator: Any) -> None:
        """Keep a graph allocator/scheduler that placed tensors of this context alive."""
        if not any(a is allocator for a in self._allocators):
            self._allocators.append(allocator)

    def close(self) -> None:
        """``ggml_free``, then the backend buffers made by :meth:`alloc_tensors`."""
        super().close()
        for b in self._buffers:
            b.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<Context (closed)>"
        return f"<Context {self.used_mem}/{self.mem_size} bytes{' no_alloc' if self.no_alloc else ''}>"


def tensor_overhead() -> int:
    """Bytes a tensor struct takes in a context (``ggml_tensor_overhead``)."""
    return lib.ggml_tensor_overhead()
