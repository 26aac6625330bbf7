"""ggml tensors (``struct ggml_tensor``) as Python objects, and their NumPy interop.

**Shapes.** ggml's ``ne[0]`` is the fastest-varying dimension, so a NumPy shape is ``ne``
reversed: NumPy ``(rows, cols)`` is ggml ``ne = [cols, rows, 1, 1]``. :attr:`Tensor.ne` and
:attr:`Tensor.nb` are always the four ggml values; :attr:`Tensor.shape` is the NumPy order with
ggml's trailing 1s dropped (``ggml_n_dims``), so it has 1 to 4 entries.

A :class:`Tensor` borrows its C struct from the :class:`~pyggml.context.Context` that made it
and keeps that context alive (and, for op results, the tensors it was computed from).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ._base import ClosedError, CObject
from ._loader import ffi, lib

if TYPE_CHECKING:
    from .context import Context

__all__ = ["Tensor", "op_name"]

_EMPTY_OPS = {lib.GGML_OP_NONE, lib.GGML_OP_RESHAPE, lib.GGML_OP_VIEW, lib.GGML_OP_PERMUTE,
              lib.GGML_OP_TRANSPOSE}


def _layouts() -> dict[int, list[tuple[str, str]]]:
    """op -> [(name, "i" int32 | "f" float32)] per op_params slot, from the op constructors of
    ggml.c (ggml_set_op_params calls)."""
    f, i = "f", "i"
    L = {
        "NORM": [("eps", f)], "RMS_NORM": [("eps", f)], "L2_NORM": [("eps", f)],
        "GROUP_NORM": [("n_groups", i), ("eps", f)],
        "SOFT_MAX": [("scale", f), ("max_bias", f)], "SOFT_MAX_BACK": [("scale", f), ("max_bias", f)],
        "SCALE": [("s", f), ("b", f)], "LEAKY_RELU": [("negative_slope", f)],
        "CLAMP": [("min", f), ("max", f)],
        "ROPE": [("n_past", i), ("n_dims", i), ("mode", i), ("n_ctx", i), ("n_ctx_orig", i),
                 ("freq_base", f), ("freq_scale", f), ("ext_factor", f), ("attn_factor", f),
                 ("beta_fast", f), ("beta_slow", f)],
        "CONCAT": [("dim", i)], "PERMUTE": [("axis0", i), ("axis1", i), ("axis2", i), ("axis3", i)],
        "ARGSORT": [("order", i)], "TOP_K": [("k", i)], "DIAG_MASK_INF": [("n_past", i)],
        "DIAG_MASK_ZERO": [("n_past", i)],
        "PAD": [("lp0", i), ("rp0", i), ("lp1", i), ("rp1", i), ("lp2", i), ("rp2", i),
                ("lp3", i), ("rp3", i), ("circular", i)],
        "IM2COL": [("s0", i), ("s1", i), ("p0", i), ("p1", i), ("d0", i), ("d1", i), ("is_2D", i)],
        "POOL_1D": [("op", i), ("k0", i), ("s0", i), ("p0", i)],
        "POOL_2D": [("op", i), ("k0", i), ("k1", i), ("s0", i), ("s1", i), ("p0", f), ("p1", f)],
        "FLASH_ATTN_EXT": [("scale", f), ("max_bias", f), ("logit_softcap", f), ("prec", i)],
        "ACC": [("nb1", i), ("nb2", i), ("nb3", i), ("offset", i), ("inplace", i)],
        "SET": [("nb1", i), ("nb2", i), ("nb3", i), ("offset", i), ("inplace", i)],
        "ARANGE": [("start", f), ("stop", f), ("step", f)],
        "TIMESTEP_EMBEDDING": [("dim", i), ("max_period", i)],
        "UPSCALE": [("mode", i)], "MUL_MAT": [("prec", i)],
        "VIEW": [("offset_lo", i), ("offset_hi", i)],
    }
    return {getattr(lib, f"GGML_OP_{k}"): v for k, v in L.items() if hasattr(lib, f"GGML_OP_{k}")}


_PARAM_LAYOUTS = _layouts()


def decode_op_params(t: "Tensor") -> dict[str, Any]:
    """See :attr:`Tensor.params`."""
    p = t.ptr
    raw = np.frombuffer(ffi.buffer(p.op_params), dtype=np.int32).copy()
    if p.op == lib.GGML_OP_UNARY:
        return {"unary_op": ffi.string(lib.ggml_unary_op_name(lib.ggml_get_unary_op(p))).decode()}
    if p.op == lib.GGML_OP_GLU:
        return {"glu_op": ffi.string(lib.ggml_glu_op_name(lib.ggml_get_glu_op(p))).decode(),
                "swapped": bool(raw[1])}
    layout = _PARAM_LAYOUTS.get(p.op)
    if layout is None:
        return {"raw": raw}
    out: dict[str, Any] = {}
    for k, (name, kind) in enumerate(layout):
        out[name] = float(raw[k:k + 1].view(np.float32)[0]) if kind == "f" else int(raw[k])
    if p.op == lib.GGML_OP_VIEW:
        out = {"offset": int(raw[:2].view(np.int64)[0])}
    if p.op == lib.GGML_OP_ROPE:
        out["sections"] = raw[11:15].tolist()
    return out


def op_name(op: int) -> str:
    """``ggml_op_name``: ``"ADD"``, ``"MUL_MAT"``...; raises ValueError for an unknown op."""
    if not 0 <= op < lib.GGML_OP_COUNT:
        raise ValueError(f"unknown ggml op {op}")
    return ffi.string(lib.ggml_op_name(op)).decode()


class _ArrayOwner:
    """Exposes host memory to NumPy through ``__array_interface__`` while holding the owner."""

    def __init__(self, address: int, shape, strides, dtype: np.dtype, owner: Any):
        self.owner = owner
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape),
                                    "strides": tuple(strides), "typestr": dtype.str, "version": 3}


def _host_view(t: "Tensor", dtype: np.dtype, owner: Any) -> np.ndarray:
    """NumPy view (shape ``ne`` reversed, strides ``nb`` reversed) of ``t``'s host data that
    keeps ``owner`` alive. No checks: callers make sure the data is in host memory."""
    ne, nb = t.ne[:t.n_dims], t.nb[:t.n_dims]
    return np.asarray(_ArrayOwner(int(ffi.cast("uintptr_t", t.ptr.data)), reversed(ne), reversed(nb), dtype, owner))


class Tensor(CObject):
    """A ggml tensor (borrowed from its context).

    ``inputs`` are the Tensor objects it was made from; they are kept alive with it.
    """

    _kind = "tensor"

    def __init__(self, ptr: Any, ctx: "Context", inputs: tuple["Tensor", ...] = ()):
        super().__init__(ptr, owned=False, owner=ctx)
        self._inputs = inputs

    @property
    def ctx(self) -> "Context":
        """The context whose memory holds this tensor's struct."""
        return self._owner

    # ------------------------------------------------------------------ description
    @property
    def name(self) -> str:
        """``ggml_get_name`` / ``ggml_set_name`` (at most ``GGML_MAX_NAME - 1`` = 63 bytes)."""
        return ffi.string(lib.ggml_get_name(self.ptr)).decode("utf-8", "replace")

    @name.setter
    def name(self, value: str) -> None:
        raw = value.encode()
        if len(raw) >= lib.GGML_MAX_NAME:
            raise ValueError(f"tensor name is {len(raw)} bytes, ggml keeps at most {lib.GGML_MAX_NAME - 1}")
        lib.ggml_set_name(self.ptr, raw)

    @property
    def type(self) -> int:
        """The ggml type (``GGML_TYPE_*``; see :class:`pyggml.types.GGMLType`)."""
        return self.ptr.type

    @property
    def type_name(self) -> str:
        return ffi.string(lib.ggml_type_name(self.ptr.type)).decode()

    @property
    def ne(self) -> tuple[int, int, int, int]:
        """Number of elements per dimension, ggml order (``ne[0]`` fastest)."""
        return tuple(self.ptr.ne)  # type: ignore[return-value]

    @property
    def nb(self) -> tuple[int, int, int, int]:
        """Stride in bytes per dimension, ggml order (quantized: ``nb[0]`` is the block size in bytes)."""
        return tuple(self.ptr.nb)  # type: ignore[return-value]

    @property
    def n_dims(self) -> int:
        """``ggml_n_dims``: 1 + index of the last dimension > 1 (1 for scalars)."""
        return lib.ggml_n_dims(self.ptr)

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order: ``ne[:n_dims]`` reversed."""
        return tuple(reversed(self.ne[:self.n_dims]))

    @property
    def nelements(self) -> int:
        return lib.ggml_nelements(self.ptr)

    @property
    def nbytes(self) -> int:
        """``ggml_nbytes``: bytes spanned by the data (strides included)."""
        return lib.ggml_nbytes(self.ptr)

    @property
    def op(self) -> int:
        """The op that computes this tensor (``GGML_OP_*``; ``GGML_OP_NONE`` for leaves)."""
        return self.ptr.op

    @property
    def op_name(self) -> str:
        return op_name(self.ptr.op)

    @property
    def op_params(self) -> np.ndarray:
        """A copy of the op parameters as int32 (float parameters are bit-cast: ``.view(np.float32)``)."""
        p = self.ptr
        return np.frombuffer(ffi.buffer(p.op_params), dtype=np.int32).copy()

    @property
    def params(self) -> dict[str, Any]:
        """``op_params`` decoded for this node's op (names as in ggml.c), e.g. ROPE ->
        ``{"n_dims", "mode", "n_ctx_orig", "freq_base", "freq_scale", "ext_factor",
        "attn_factor", "beta_fast", "beta_slow"}``; SOFT_MAX -> ``{"scale", "max_bias"}``;
        UNARY -> ``{"unary_op": "GELU"}``. Ops without a known layout give
        ``{"raw": int32 array}``."""
        return decode_op_params(self)

    @property
    def src(self) -> list["Tensor"]:
        """The source tensors of the op, in order (NULL entries end the list)."""
        out = []
        known = {t._ptr: t for t in self._inputs}
        for s in self.ptr.src:
            if s == ffi.NULL:
                break
            out.append(known.get(s) or Tensor(s, self.ctx, (self,)))
        return out

    @property
    def view_src(self) -> "Tensor | None":
        v = self.ptr.view_src
        return None if v == ffi.NULL else Tensor(v, self.ctx, (self,))

    @property
    def flags(self) -> int:
        """``GGML_TENSOR_FLAG_*`` bits (input, output, param, loss, compute)."""
        return self.ptr.flags

    def is_contiguous(self) -> bool:
        return bool(lib.ggml_is_contiguous(self.ptr))

    def is_transposed(self) -> bool:
        return bool(lib.ggml_is_transposed(self.ptr))

    def set_input(self) -> "Tensor":
        """``ggml_set_input``: allocate first, never overwritten by the graph allocator."""
        lib.ggml_set_input(self.ptr)
        return self

    def set_output(self) -> "Tensor":
        """``ggml_set_output``: the graph allocator keeps it until the end of the graph."""
        lib.ggml_set_output(self.ptr)
        return self

    def set_param(self) -> "Tensor":
        """``ggml_set_param``: a trainable parameter (gets a gradient in backward graphs)."""
        lib.ggml_set_param(self.ptr)
        return self

    def set_loss(self) -> "Tensor":
        """``ggml_set_loss``: the scalar F32 loss of a backward graph. Raises ValueError otherwise."""
        if self.nelements != 1 or self.type != lib.GGML_TYPE_F32:
            raise ValueError("a loss must be a scalar F32 tensor")
        lib.ggml_set_loss(self.ptr)
        return self

    def __repr__(self) -> str:
        if self.closed:
            return "<Tensor (closed)>"
        return f"<Tensor {self.name!r} {self.type_name} ne={list(self.ne)} op={self.op_name}>"

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a ggml Tensor is not iterable: use .numpy()")

    # ------------------------------------------------------------------ data
    @property
    def buffer_ptr(self) -> Any:
        """The backend buffer holding the data (``view_src``'s for views), or NULL."""
        p = self.ptr
        return p.view_src.buffer if p.view_src != ffi.NULL else p.buffer

    def _check_data(self) -> Any:
        p = self.ptr
        if p.data == ffi.NULL:
            raise ValueError(f"tensor {self.name!r} has no data yet: allocate it in a buffer "
                             "(Context.alloc_tensors, a graph allocator or a scheduler)")
        buf = self.buffer_ptr
        buffer_closed = getattr(self.ctx, "_buffer_closed", None)
        if buf != ffi.NULL and buffer_closed is not None and buffer_closed(buf):
            raise ClosedError(f"the buffer holding tensor {self.name!r} is closed")
        return p

    def _is_host(self) -> bool:
        buf = self.buffer_ptr
        return buf == ffi.NULL or bool(lib.ggml_backend_buffer_is_host(buf))

    def numpy(self, copy: bool = True) -> np.ndarray:
        """The data as a NumPy array of shape :attr:`shape` (NumPy order).

        Plain types keep their dtype (F32 float32, F16 float16, F64, I8...I64); BF16 and quantized
        types are dequantized to float32 with ggml's own ``to_float``. ``copy=False`` returns a
        zero-copy view of host memory instead (plain types only), writable, that keeps this
        tensor's context alive; writes through it are seen by ggml.

        Raises ValueError if the tensor has no data or (``copy=False``) is not in host memory or
        not a plain type; ClosedError if its context or buffer is closed. Wraps
        ``ggml_backend_tensor_get`` for tensors in backend buffers.
        """
        from . import types

        p = self._check_data()
        dtype = types.numpy_dtype(p.type)
        if not copy:
            if dtype is None or p.type == lib.GGML_TYPE_BF16:
                raise ValueError(f"no zero-copy NumPy view of a {self.type_name} tensor")
            if not self._is_host():
                raise ValueError(f"tensor {self.name!r} is not in host memory: use copy=True")
            owners = [self.ctx]
            if self.buffer_ptr != ffi.NULL:
                buf = next((b for b in getattr(self.ctx, "_buffers", ()) if b._c_addr == self.buffer_ptr), None)
                if buf is None:
                    raise ValueError(f"tensor {self.name!r} lives in a buffer its context does not own "
                                     "(a graph allocator or scheduler reuses it): use copy=True")
                owners.append(buf)
            view = _host_view(self, dtype, self)
            for o in owners:
                o._export(view.base)
            return view
        if not self.is_contiguous():
            raise ValueError(f"tensor {self.name!r} is not contiguous: copy it with Context.cont first")
        raw = np.empty(self.nbytes, dtype=np.uint8)
        if self.buffer_ptr != ffi.NULL:
            lib.ggml_backend_tensor_get(p, ffi.from_buffer(raw), 0, raw.nbytes)
        else:
            ffi.memmove(ffi.from_buffer(raw), p.data, raw.nbytes)
        return types.to_numpy(raw, p.type, self.ne[:self.n_dims])

    def set(self, array: Any) -> "Tensor":
        """Copy ``array`` (NumPy order, shape :attr:`shape` or any shape with the same number of
        elements in C order) into the tensor, converted to its type (quantized types are
        quantized with ggml's routines).

        Raises ValueError on a size mismatch or a non-contiguous/unallocated tensor. Wraps
        ``ggml_backend_tensor_set`` for tensors in backend buffers.
        """
        from . import types

        p = self._check_data()
        if not self.is_contiguous():
            raise ValueError(f"tensor {self.name!r} is not contiguous")
        a = np.asarray(array)
        if a.size != self.nelements:
            raise ValueError(f"array of {a.size} elements for tensor {self.name!r} of shape {self.shape}")
        raw = types.from_numpy_bytes(a.reshape(self.shape), p.type)
        if raw.nbytes != self.nbytes:
            raise ValueError(f"{raw.nbytes} bytes for a tensor of {self.nbytes}")
        if self.buffer_ptr != ffi.NULL:
            lib.ggml_backend_tensor_set(p, ffi.from_buffer(raw), 0, raw.nbytes)
        else:
            ffi.memmove(p.data, ffi.from_buffer(raw), raw.nbytes)
        return self

    # ------------------------------------------------------------------ operators
    def __add__(self, other: "Tensor") -> "Tensor":
        return self.ctx.add(self, other)

    def __sub__(self, other: "Tensor") -> "Tensor":
        return self.ctx.sub(self, other)

    def __mul__(self, other: "Tensor | float") -> "Tensor":
        if isinstance(other, (int, float)):
            return self.ctx.scale(self, float(other))
        return self.ctx.mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other: "Tensor") -> "Tensor":
        return self.ctx.div(self, other)

    def __neg__(self) -> "Tensor":
        return self.ctx.neg(self)

    @property
    def T(self) -> "Tensor":
        """``ggml_transpose`` (swaps ``ne[0]`` and ``ne[1]``; a view)."""
        return self.ctx.transpose(self)

    def is_empty_op(self) -> bool:
        """True for ops that compute nothing (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE)."""
        return self.op in _EMPTY_OPS
