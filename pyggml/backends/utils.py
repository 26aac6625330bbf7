"""ggml-backend's utilities: graph copies between backends, backend comparison, placing tensors
in buffers by hand, and tensors over NumPy memory."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import _cobject
from ..memory import buffer
from .backend import Backend
from ..memory.buffer import Buffer
from ..core.context import Context
from .cpu import cpu_buffer_from_array
from ..errors import GGMLError
from ..core.graph import Graph
from ..raw import callbacks, ffi, lib
from ..raw.boundary import calling, check_status
from ..core.tensor import BorrowScope, Tensor, tensor_arg

__all__ = ["GraphCopy", "graph_copy", "compare_graph_backend", "tensor_alloc", "view_init",
           "tensor_from_numpy", "from_dlpack"]


def _check_in_buffers(graph: Graph) -> None:
    for t in graph.nodes + graph.leafs:
        if t.buffer_ptr == ffi.NULL:  # ggml_backend_tensor_copy would assert on the NULL buffer
            raise ValueError(f"tensor {t._label()} is not in a backend buffer: allocate the graph "
                             "with a GraphAllocator/Scheduler or Context.alloc_tensors first")


class GraphCopy(_cobject.CObject):
    """``ggml_backend_graph_copy``: a graph and all its tensors copied to another backend's
    buffer (data included). Owned: :meth:`close` calls ``ggml_backend_graph_copy_free``; the
    copied graph and its tensors are unusable afterwards."""

    _kind = "graph copy"

    def __init__(self, backend: Backend, graph: Graph):
        _, lock, _ = backend._prepare(graph)
        copy = None
        try:
            _check_in_buffers(graph)
            with calling(), buffer.lifecycle:  # the gate first, as every call
                with calling():
                    copy = lib.ggml_backend_graph_copy(backend.ptr, graph.ptr)
                if copy.buffer != ffi.NULL:
                    buffer.track(copy.buffer, self)  # the copied tensors' buffer, freed with the copy
        except BaseException:  # a Python buffer's callback raised: free what ggml made
            if copy is not None and copy.buffer != ffi.NULL:
                with calling():
                    lib.ggml_backend_graph_copy_free(copy)
            raise
        finally:
            lock.__exit__()
        if copy.buffer == ffi.NULL:
            raise GGMLError(f"could not copy the graph to backend {backend.name}")
        super().__init__(ffi.new("struct ggml_backend_graph_copy *", copy), owned=True, keep=(backend, graph))
        self._scope = BorrowScope("a graph copy")
        #: the copied graph; its tensors belong to this object
        self.graph = Graph(copy.graph, self._scope, int(lib.ggml_graph_size(copy.graph)))

    def _free(self, ptr: Any) -> None:
        self._scope.close()
        buffer.retire(ptr.buffer)  # before it is freed (no lifecycle lock needed)
        with calling():  # frees the copy's buffer
            lib.ggml_backend_graph_copy_free(ptr[0])


def graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    """Copy ``graph`` (tensors and data) to ``backend`` (``ggml_backend_graph_copy``)."""
    return GraphCopy(backend, graph)


def compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph,
                          callback: Callable[[int, Tensor, Tensor], bool],
                          test_nodes: Sequence[Tensor] = ()) -> bool:
    """``ggml_backend_compare_graph_backend``: compute ``graph`` on ``backend1`` and a copy on
    ``backend2`` node by node, calling ``callback(node_index, t1, t2)`` after each node (t1 on
    backend1, t2 on backend2, lent for the call; return False to stop). With ``test_nodes``,
    the nodes up to the last of them are computed as one graph instead. Returns False if the
    graph copy failed. An exception in ``callback`` stops the comparison and is re-raised here.
    """
    _, lock1, _ = backend1._prepare(graph)
    try:
        _, lock2, _ = backend2._prepare(graph)
    except BaseException:
        lock1.__exit__()
        raise
    try:
        return _compare(backend1, backend2, graph, callback, test_nodes)
    finally:
        lock2.__exit__()
        lock1.__exit__()


def _compare(backend1: Backend, backend2: Backend, graph: Graph,
             callback: Callable[[int, Tensor, Tensor], bool], test_nodes: Sequence[Tensor]) -> bool:
    _check_in_buffers(graph)
    nodes = set(graph.raw_nodes())
    for t in test_nodes:
        if tensor_arg(t, "test node")._ptr not in nodes:
            raise ValueError(f"test node {t._label()} is not a node of the graph")  # ggml asserts

    def trampoline(i: int, t1: Any, t2: Any, user_data: Any) -> bool:
        scope = BorrowScope("a compare_graph_backend callback")
        try:
            return bool(callback(i, Tensor(t1, scope), Tensor(t2, scope)))
        finally:
            scope.close()

    cb = callbacks.Callback("ggml_backend_eval_callback", trampoline)
    arr = ffi.new("struct ggml_tensor *[]", [t._ptr for t in test_nodes]) if test_nodes else ffi.NULL
    with calling():
        ok = lib.ggml_backend_compare_graph_backend(backend1.ptr, backend2.ptr, graph.ptr, cb.fn,
                                                    cb.user_data, arr, len(test_nodes))
    return bool(ok)


def tensor_alloc(buffer: Buffer, tensor: Tensor, offset: int = 0) -> None:
    """``ggml_backend_tensor_alloc``: place ``tensor`` (no data yet, not a view) at byte
    ``offset`` of ``buffer``. Raises ValueError if it does not fit or already has data. The
    tensor's context keeps the buffer alive."""
    p = tensor_arg(tensor, "tensor")._ptr
    if p.buffer != ffi.NULL or p.data != ffi.NULL or p.view_src != ffi.NULL:
        raise ValueError(f"tensor {tensor._label()} already has data or is a view")
    need = buffer.alloc_size(tensor)
    align = buffer.alignment
    if offset < 0 or offset % align or offset + need > buffer.size:
        raise ValueError(f"{need} bytes at offset {offset} do not fit in a buffer of {buffer.size} "
                         f"(offsets are multiples of its alignment {align})")
    addr = ffi.cast("char *", lib.ggml_backend_buffer_get_base(buffer.ptr)) + offset
    with calling():
        check_status(lib.ggml_backend_tensor_alloc(buffer.ptr, p, addr), "ggml_backend_tensor_alloc")
    Context.of(tensor)._adopt(buffer)


def view_init(tensor: Tensor) -> None:
    """``ggml_backend_view_init``: give a view the data of its (allocated) source."""
    p = tensor_arg(tensor, "tensor")._ptr
    if p.view_src == ffi.NULL or p.buffer != ffi.NULL:
        raise ValueError(f"tensor {tensor._label()} is not an unplaced view")
    if p.view_src.buffer == ffi.NULL or p.view_src.data == ffi.NULL:
        raise ValueError(f"the source of view {tensor._label()} is not allocated in a buffer")
    with calling():
        check_status(lib.ggml_backend_view_init(p), "ggml_backend_view_init")


def tensor_from_numpy(ctx: Context, array: np.ndarray, name: str | None = None) -> Tensor:
    """A tensor in ``ctx`` (a ``no_alloc`` context) whose data *is* ``array``'s memory: no copy
    (``ggml_backend_cpu_buffer_from_ptr`` + ``ggml_backend_tensor_alloc``). Shape and dtype as
    :meth:`Context.from_numpy`; writes on either side are seen by the other. The array must be
    C-contiguous, writable and 32-byte aligned (:func:`pyggml.backends.cpu.aligned_zeros`); the context
    keeps it alive. Raises ValueError otherwise."""
    if not ctx.no_alloc:
        raise ValueError("tensor_from_numpy needs a no_alloc context")
    buf = cpu_buffer_from_array(array)
    # the context's lock for the buffer too: a compute of a graph reading many such tensors
    # (a model's weights in torch's memory) takes one lock for all, not one per buffer
    buf._lock = ctx._lock
    t = ctx.from_numpy(array, name=name)
    tensor_alloc(buf, t)
    return t


def from_dlpack(x: Any, ctx: Context, name: str | None = None) -> Tensor:
    """A tensor in ``ctx`` (a ``no_alloc`` context) over the memory of ``x``, any object with
    ``__dlpack__`` in host memory (a torch CPU tensor, a JAX or NumPy array...), without a copy:
    ``np.from_dlpack`` reads the capsule and :func:`tensor_from_numpy` places the tensor there.
    NumPy shape and dtype as :meth:`Context.from_numpy` (ne = shape reversed). The context keeps
    ``x``'s memory alive; writes on either side are seen by the other.

    Raises ValueError (from :func:`tensor_from_numpy`) unless the memory is C-contiguous,
    writable and 32-byte aligned (copy it first, e.g. ``x.contiguous().clone()``); BufferError
    for device memory (``kDLCUDA``...: ggml cannot place a tensor in memory another library
    allocated on a GPU) or a dtype ggml has no type for."""
    try:
        array = np.from_dlpack(x)
    except (AttributeError, BufferError, RuntimeError, TypeError) as e:
        raise BufferError(f"cannot import {type(x).__name__} through DLPack into host memory: {e}") from e
    return tensor_from_numpy(ctx, array, name=name)
