"""Buffer types and buffers written in Python (``struct ggml_backend_buffer_type``,
``struct ggml_backend_buffer``)."""
from __future__ import annotations

import abc
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from ..memory.buffer_type import BufferType
from ..backends.cpu import aligned_zeros
from ..raw import callbacks, ffi, lib
from ..core.tensor import EMPTY_OPS, Tensor
from ._vtable import LIVE, SIZE_MAX, Impl, addr, fill_iface, lent, make_struct, safe

__all__ = ["PyBuffer", "HostBuffer", "PyBufferType"]


@contextmanager
def _bytes(data: Any, size: int) -> Iterator[memoryview]:
    """``size`` bytes at ``data`` as a memoryview that is released when the call returns (C owns
    the memory only for the call)."""
    mv = memoryview(ffi.buffer(data, size))
    try:
        yield mv
    finally:
        mv.release()


#: ggml_op_alloc_size_may_expand (ggml >= 0.25; before it ggml_backend_buft_get_alloc_size
#: asserted nothing on a larger size)
_OP_MAY_EXPAND = getattr(lib, "ggml_op_alloc_size_may_expand", None)


def _may_expand(t: Any) -> bool:
    """Whether ggml_backend_buft_get_alloc_size lets tensor ``t`` take more than ggml_nbytes
    (it asserts so: ggml_op_is_empty, quantized, or an op that may expand)."""
    return (_OP_MAY_EXPAND is None or t.op in EMPTY_OPS or bool(lib.ggml_is_quantized(t.type))
            or bool(_OP_MAY_EXPAND(t.op)))


class PyBuffer(Impl):
    """A buffer (``struct ggml_backend_buffer``), made by :meth:`PyBufferType.alloc_buffer`.

    Required: :meth:`get_base` (an address: ggml computes tensor addresses from it),
    :meth:`set_tensor`, :meth:`get_tensor`, :meth:`clear`. Optional: ``free_buffer()``,
    ``init_tensor(tensor)`` (an exception it raises is raised by the pyggml call in progress,
    once ggml returns: ggml aborts on a failed init, so it is told the init succeeded),
    ``memset_tensor(tensor, value, offset, size)``,
    ``cpy_tensor(src, dst) -> bool``, ``reset()``. Tensors and memoryviews passed to the
    methods are valid during the call only.
    """

    _iface = "ggml_backend_buffer_i"
    size: int

    @abc.abstractmethod
    def get_base(self) -> int:
        """Address of the buffer's first byte (``tensor.data`` = base + offset)."""

    @abc.abstractmethod
    def set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        """Copy ``data`` (bytes) into ``tensor`` starting ``offset`` bytes into its data."""

    @abc.abstractmethod
    def get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        """Fill ``out`` (writable bytes) from ``tensor``'s data at byte ``offset``."""

    @abc.abstractmethod
    def clear(self, value: int) -> None:
        """Set every byte of the buffer to ``value``."""

    # --- C side (the buffer struct is made by ggml_backend_buffer_init and deleted by ggml)
    def _init_c(self, buft_ptr: Any, size: int) -> Any:
        iface = ffi.new("struct ggml_backend_buffer_i *")
        fill_iface(self, iface)
        # always: it releases this object
        iface.free_buffer = callbacks.slot("ggml_backend_buffer_i", "free_buffer")
        # the base never changes, and ggml aborts on a NULL one: ask once, here, where an
        # exception makes the allocation fail cleanly
        base = self.get_base()
        if not isinstance(base, int) or base <= 0:
            raise ValueError(f"{type(self).__name__}.get_base returned {base!r}: ggml needs an address")
        self._base = ffi.cast("void *", base)
        self.size = size
        ptr = lib.ggml_backend_buffer_init(buft_ptr, iface[0], self._handle, size)
        LIVE[addr(ptr)] = self
        return ptr

    def _c_free_buffer(self, buf: Any) -> None:
        try:
            if callable(getattr(self, "free_buffer", None)):
                self.free_buffer()  # type: ignore[attr-defined]
        finally:
            LIVE.pop(addr(buf), None)

    def _c_get_base(self, buf: Any) -> Any:
        return self._base

    def _c_init_tensor(self, buf: Any, t: Any) -> int:
        try:
            with lent("init_tensor") as scope:
                self.init_tensor(Tensor(t, scope))  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - ggml asserts on a failed init (graph_copy, gallocr)
            return safe(self, e, int(lib.GGML_STATUS_SUCCESS))  # type: ignore[no-any-return]
        return int(lib.GGML_STATUS_SUCCESS)

    def _c_memset_tensor(self, buf: Any, t: Any, value: int, offset: int, size: int) -> None:
        with lent("memset_tensor") as scope:
            self.memset_tensor(Tensor(t, scope), value, offset, size)  # type: ignore[attr-defined]

    def _c_set_tensor(self, buf: Any, t: Any, data: Any, offset: int, size: int) -> None:
        with lent("set_tensor") as scope, _bytes(data, size) as mv:
            self.set_tensor(Tensor(t, scope), mv, offset)

    def _c_get_tensor(self, buf: Any, t: Any, data: Any, offset: int, size: int) -> None:
        with lent("get_tensor") as scope, _bytes(data, size) as mv:
            self.get_tensor(Tensor(t, scope), mv, offset)

    def _c_cpy_tensor(self, buf: Any, src: Any, dst: Any) -> bool:
        with lent("cpy_tensor") as scope:
            return bool(self.cpy_tensor(Tensor(src, scope), Tensor(dst, scope)))  # type: ignore[attr-defined]

    def _c_clear(self, buf: Any, value: int) -> None:
        self.clear(value)

    def _c_reset(self, buf: Any) -> None:
        self.reset()  # type: ignore[attr-defined]


class HostBuffer(PyBuffer):
    """A buffer in host memory owned by NumPy (64-byte aligned bytes)."""

    def __init__(self, size: int):
        self.array = aligned_zeros(max(size, 1), "uint8")

    def get_base(self) -> int:
        return int(self.array.__array_interface__["data"][0])

    def _offset(self, tensor: Tensor, offset: int, size: int) -> int:
        start = addr(tensor.ptr.data) - self.get_base() + offset
        if start < 0 or start + size > self.array.size:
            raise ValueError("access outside the buffer")
        return start

    def set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        start = self._offset(tensor, offset, data.nbytes)
        self.array[start:start + data.nbytes] = np.frombuffer(data, dtype=np.uint8)

    def get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        start = self._offset(tensor, offset, out.nbytes)
        np.frombuffer(out, dtype=np.uint8)[:] = self.array[start:start + out.nbytes]

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        start = self._offset(tensor, offset, size)
        self.array[start:start + size] = value

    def clear(self, value: int) -> None:
        self.array[:] = value


class PyBufferType(Impl):
    """A buffer type (``struct ggml_backend_buffer_type``).

    Required: :meth:`get_name`, :meth:`alloc_buffer`. Defaults: :meth:`get_alignment` 32.
    Optional: ``get_max_size() -> int``, ``get_alloc_size(tensor) -> int`` (at least
    ``ggml_nbytes``, and more only for quantized tensors, views and the ops of
    ``ggml_op_alloc_size_may_expand``, as ggml asserts; otherwise the pyggml call raises
    ValueError and ggml gets ``ggml_nbytes``), ``is_host() -> bool`` (True lets the CPU backend
    read these buffers in place), and ``layout_n(tensors) -> offsets``: where a set of tensors
    goes in one buffer of this type, which fills the ``alloc_buffer_n`` and ``get_alloc_size_n``
    slots (ggml >= 0.26: ``ggml_backend_alloc_ctx_tensors_from_buft``, i.e.
    ``Context.alloc_tensors``, and its ``_size`` twin call them for a context's tensors).
    ``tensors`` is a list of :class:`~pyggml.core.tensor.Tensor` (lent for the call); return one entry
    per tensor: an ``int`` byte offset (a multiple of :meth:`get_alignment`) for each tensor that
    needs memory here (no data, not a view), ``None`` for the others. pyggml checks the layout
    (length, alignment, overlaps, ``get_max_size``: ValueError from the pyggml call otherwise),
    makes ``alloc_buffer(end of the last tensor)``, places the tensors at their offsets and the
    views in their sources' memory. Without it ggml's default applies (the tensors one after
    another, split at ``get_max_size``).
    """

    _iface = "ggml_backend_buffer_type_i"
    _struct = "ggml_backend_buffer_type"

    def __init__(self) -> None:
        make_struct(self)

    @abc.abstractmethod
    def get_name(self) -> str:
        """Name of the buffer type."""

    @abc.abstractmethod
    def alloc_buffer(self, size: int) -> PyBuffer:
        """A new buffer of ``size`` bytes."""

    def get_alignment(self) -> int:
        """Alignment of tensor data in bytes (default 32)."""
        return 32

    @property
    def ptr(self) -> Any:
        """The ``ggml_backend_buffer_type_t`` to hand to ggml (keep this object alive while ggml
        may use it: :meth:`as_buffer_type` and devices do)."""
        return self._c

    def as_buffer_type(self) -> BufferType:
        """This buffer type as a pyggml :class:`~pyggml.memory.buffer_type.BufferType`, which keeps it
        alive."""
        return BufferType(self._c, keep=self)

    def _c_get_name(self, buft: Any) -> Any:
        try:
            return self._cstr(self.get_name())
        except Exception as e:  # noqa: BLE001 - ggml would strcmp/print a NULL name
            return safe(self, e, self._cstr("(error)"))

    def _c_alloc_buffer(self, buft: Any, size: int) -> Any:
        buf = self.alloc_buffer(size)
        if not isinstance(buf, PyBuffer):
            raise TypeError(f"alloc_buffer must return a PyBuffer, not {type(buf).__name__}")
        return buf._init_c(buft, size)

    def _c_get_alignment(self, buft: Any) -> int:
        try:
            n = int(self.get_alignment())
            if n < 1 or n & (n - 1):
                raise ValueError(f"get_alignment returned {n}: ggml needs a power of two")
            return n
        except Exception as e:  # noqa: BLE001 - ggml divides by the alignment
            return safe(self, e, 32)  # type: ignore[no-any-return]

    def _c_get_max_size(self, buft: Any) -> int:
        try:
            n = int(self.get_max_size())  # type: ignore[attr-defined]
            if n < 1:
                raise ValueError(f"get_max_size returned {n}")
            return n
        except Exception as e:  # noqa: BLE001 - 0 would make every allocation impossible
            return safe(self, e, SIZE_MAX)  # type: ignore[no-any-return]

    def _c_get_alloc_size(self, buft: Any, t: Any) -> int:
        nbytes = int(lib.ggml_nbytes(t))
        try:
            with lent("get_alloc_size") as scope:
                n = int(self.get_alloc_size(Tensor(t, scope)))  # type: ignore[attr-defined]
            if n < nbytes:
                raise ValueError(f"get_alloc_size returned {n} bytes for a tensor of {nbytes}")
            if n > nbytes and not _may_expand(t):
                op = ffi.string(lib.ggml_op_desc(t)).decode()
                raise ValueError(f"get_alloc_size returned {n} bytes for a {op} tensor of {nbytes}: "
                                 "ggml lets only quantized tensors, views and the ops of "
                                 "ggml_op_alloc_size_may_expand take more")
            return n
        except Exception as e:  # noqa: BLE001 - too small a size makes tensors overlap
            return safe(self, e, nbytes)  # type: ignore[no-any-return]

    def _c_is_host(self, buft: Any) -> bool:
        return bool(self.is_host())  # type: ignore[attr-defined]

    # --- a set of tensors in one buffer (GGML_BACKEND_API_VERSION 3)
    def _implements(self, member: str) -> bool:
        if member in ("alloc_buffer_n", "get_alloc_size_n"):
            return callable(getattr(self, "layout_n", None))
        return super()._implements(member)

    def _layout(self, buft: Any, tensors: Any, n: int, scope: Any) -> tuple[list[Tensor], list[int | None], int]:
        """The tensors of the C array ``tensors[n]`` (lent to ``scope``), their offsets from
        ``layout_n`` (a sequence of ``n`` entries, an ``int`` byte offset for each tensor that
        needs memory here, i.e. has no data and no ``view_src``, and ``None`` for the others),
        checked, and the buffer size they need (the end of the furthest tensor).
        Raises ValueError for a wrong length, an offset that is missing, not an int, negative,
        not a multiple of :meth:`get_alignment` or over ``get_max_size``, given to a tensor that
        needs none, or two tensors that overlap."""
        ts = [Tensor(tensors[i], scope) for i in range(n)]
        offsets = list(self.layout_n(ts))  # type: ignore[attr-defined]
        if len(offsets) != n:
            raise ValueError(f"layout_n returned {len(offsets)} offsets for {n} tensors")
        align = self._c_get_alignment(buft)
        spans = []
        for t, off in zip(ts, offsets):
            p = t.ptr
            needs = p.data == ffi.NULL and p.view_src == ffi.NULL
            if not needs:
                if off is not None:
                    raise ValueError(f"layout_n gave an offset to {t._label()}, which has data "
                                     "or is a view: give it None")
                continue
            if not isinstance(off, int) or isinstance(off, bool) or off < 0 or off % align:
                raise ValueError(f"layout_n gave {t._label()} the offset {off!r}: tensors need a "
                                 f"non-negative int, a multiple of the alignment {align}")
            size = int(lib.ggml_backend_buft_get_alloc_size(buft, p))
            spans.append((off, off + size, t))
        spans.sort(key=lambda s: (s[0], s[1]))
        for (a0, a1, ta), (b0, _, tb) in zip(spans, spans[1:]):
            if b0 < a1:
                raise ValueError(f"layout_n placed {ta._label()} [{a0}, {a1}) and {tb._label()} "
                                 f"at {b0}: tensors overlap")
        total = max([end for _, end, _ in spans], default=0)
        max_size = self._c_get_max_size(buft) if callable(getattr(self, "get_max_size", None)) else SIZE_MAX
        if total > max_size:
            raise ValueError(f"layout_n needs {total} bytes, over get_max_size {max_size}")
        return ts, offsets, total

    def _c_get_alloc_size_n(self, buft: Any, tensors: Any, n: int) -> int:
        with lent("get_alloc_size_n") as scope:
            return self._layout(buft, tensors, n, scope)[2]

    def _c_alloc_buffer_n(self, buft: Any, tensors: Any, n: int) -> Any:
        """alloc_buffer(size) and each tensor placed at its offset (``ggml_backend_tensor_alloc``),
        views initialised (``ggml_backend_view_init``), as ggml's default does. A failure frees
        the buffer and returns NULL (ggml's callers return NULL too); so does a layout of 0 bytes,
        as ggml's default (no buffer, nothing placed)."""
        with lent("alloc_buffer_n") as scope:
            ts, offsets, size = self._layout(buft, tensors, n, scope)
            if size == 0:
                return ffi.NULL
            ptr = self._c_alloc_buffer(buft, size)
            try:
                base = int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(ptr)))
                for t, off in zip(ts, offsets):
                    p = t.ptr
                    if off is not None:
                        status = lib.ggml_backend_tensor_alloc(ptr, p, ffi.cast("void *", base + off))
                    elif p.view_src != ffi.NULL and p.buffer == ffi.NULL:
                        if p.view_src.buffer == ffi.NULL or p.view_src.data == ffi.NULL:
                            raise ValueError(f"{t._label()} is a view of a tensor that is placed "
                                             "nowhere")
                        status = lib.ggml_backend_view_init(p)
                    else:
                        continue
                    if status != lib.GGML_STATUS_SUCCESS:
                        raise RuntimeError(f"placing {t._label()} failed (ggml_status {status})")
            except BaseException:
                lib.ggml_backend_buffer_free(ptr)
                raise
            return ptr
