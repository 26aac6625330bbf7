"""Host memory and NumPy for the NumPy backend: the plain types, strided views of a tensor's
data (NumPy shape = ``ne`` reversed, strides = ``nb`` reversed), reading any type as float32 and
writing float values back with ggml's rounding."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ... import types as _types
from ...memory.buffer import host_array_owner
from ...raw import ffi, lib
from ...core.tensor import can_repeat

# ---------------------------------------------------------------------------------------------
# types

_F32, _F16, _BF16, _F64 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, lib.GGML_TYPE_BF16, lib.GGML_TYPE_F64
_I8, _I16, _I32, _I64 = lib.GGML_TYPE_I8, lib.GGML_TYPE_I16, lib.GGML_TYPE_I32, lib.GGML_TYPE_I64

#: float types read and written by the element-wise kernels
_FLT = frozenset({_F32, _F16, _BF16})
#: NumPy dtype holding one element of each plain type (BF16: its raw bits)
_PLAIN: dict[int, np.dtype[Any]] = {_F32: np.dtype(np.float32), _F16: np.dtype(np.float16), _BF16: np.dtype(np.uint16),
          _F64: np.dtype(np.float64), _I8: np.dtype(np.int8), _I16: np.dtype(np.int16),
          _I32: np.dtype(np.int32), _I64: np.dtype(np.int64)}

#: quantized destination types (CPY/DUP/CONT/SET_ROWS) whose CPU ``from_float`` is the same
#: reference quantizer that ``ggml_quantize_chunk`` (pyggml.types.quantize) runs without imatrix
#: (byte-identical results, tested). Not IQ4_NL: its CPU from_float and ggml_quantize_chunk
#: pick different scales.
_QUANT_DST = frozenset(getattr(lib, f"GGML_TYPE_{n}") for n in (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))

_TENSOR_PTR = ffi.typeof("struct ggml_tensor *")


def _raw(node: Any) -> Any:
    """The ``struct ggml_tensor *`` of a pyggml Tensor or a raw cffi pointer."""
    if isinstance(node, ffi.CData):
        if ffi.typeof(node) != _TENSOR_PTR or node == ffi.NULL:
            raise TypeError(f"expected a non-NULL struct ggml_tensor *, got {node!r}")
        return node
    ptr = getattr(node, "ptr", None)
    if isinstance(ptr, ffi.CData) and ffi.typeof(ptr) == _TENSOR_PTR:
        return ptr
    raise TypeError(f"expected a pyggml Tensor or a struct ggml_tensor *, not {type(node).__name__}")


def _src(p: Any, i: int) -> Any:
    s = p.src[i]
    return None if s == ffi.NULL else s


def _ne(p: Any) -> tuple[int, int, int, int]:
    return tuple(int(x) for x in p.ne)  # type: ignore[return-value]


def _nb(p: Any) -> tuple[int, int, int, int]:
    return tuple(int(x) for x in p.nb)  # type: ignore[return-value]


def _shape(p: Any) -> tuple[int, ...]:
    return _ne(p)[::-1]


def _nel(p: Any) -> int:
    return int(np.prod(_ne(p), dtype=np.int64))


def _iparams(p: Any) -> np.ndarray:
    return np.frombuffer(ffi.buffer(p.op_params), dtype=np.int32).copy()


def _fparams(p: Any) -> np.ndarray:
    return _iparams(p).view(np.float32)


def _same_shape(a: Any, b: Any) -> bool:
    return _ne(a) == _ne(b)


def _can_repeat(small: Any, big: Any) -> bool:
    """ggml_can_repeat of two tensor structs (:func:`pyggml.core.tensor.can_repeat`)."""
    return can_repeat(_ne(small), _ne(big))


def _is_quant(t: int) -> bool:
    return bool(lib.ggml_is_quantized(t))


def _rows_packed(p: Any) -> bool:
    """Blocks of a row are contiguous (nb[0] is the block size) and ne[0] is whole blocks."""
    return (int(p.nb[0]) == int(lib.ggml_type_size(p.type))
            and int(p.ne[0]) % int(lib.ggml_blck_size(p.type)) == 0)


def _readable(p: Any) -> bool:
    """:func:`_read_f32` can decode this tensor."""
    t = p.type
    if t in _PLAIN:
        return True
    return (_is_quant(t) and lib.ggml_get_type_traits(t).to_float != ffi.NULL and _rows_packed(p))


# ---------------------------------------------------------------------------------------------
# host memory <-> NumPy


def _data(p: Any) -> Any:
    if p.data == ffi.NULL:
        name = ffi.string(p.name).decode("utf-8", "replace") or "(unnamed)"
        raise ValueError(f"tensor {name} has no data: allocate the graph before computing it")
    return p.data


def _view(p: Any, dtype: Any = None, ne: Any = None, nb: Any = None, offset: int = 0) -> np.ndarray:
    """A writable strided NumPy view (NumPy shape ``ne`` reversed) of a plain-type tensor's data,
    optionally with another ``ne``/``nb`` and a byte ``offset`` (ACC/SET views)."""
    dt = np.dtype(dtype) if dtype is not None else _PLAIN[p.type]
    ne = tuple(int(x) for x in (ne if ne is not None else p.ne))
    nb = tuple(int(x) for x in (nb if nb is not None else p.nb))
    if any(n == 0 for n in ne):
        return np.empty(ne[::-1], dtype=dt)
    address = int(ffi.cast("uintptr_t", _data(p))) + offset
    return np.asarray(host_array_owner(address, ne[::-1], nb[::-1], dt, None))


def _row_bytes(p: Any) -> np.ndarray:
    """uint8 view of shape (ne3, ne2, ne1, row_size) of a tensor whose rows are packed blocks."""
    ne, nb = _ne(p), _nb(p)
    rs = int(lib.ggml_row_size(p.type, ne[0]))
    return _view(p, np.uint8, ne=(rs, ne[1], ne[2], ne[3]), nb=(1, nb[1], nb[2], nb[3]))


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even, NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


def _read_f32(p: Any) -> np.ndarray:
    """The tensor's values as float32, NumPy shape ``ne`` reversed (a view for F32 tensors:
    do not write to it)."""
    t = p.type
    if t == _F32:
        return _view(p)
    if t == _BF16:
        return _bf16_to_f32(_view(p))
    if t in _PLAIN:
        return _view(p).astype(np.float32)
    raw = np.ascontiguousarray(_row_bytes(p))
    return _types.to_float32(raw.reshape(-1), t, _nel(p)).reshape(_shape(p))


def _write(p: Any, values: Any) -> None:
    """Store float values (broadcast to the tensor's shape) in the tensor, converted as ggml
    converts a float32: F32, F16 and BF16 round to nearest even, integer types truncate, the
    quantized types of :data:`_QUANT_DST` use ggml's reference quantizer per row."""
    t = p.type
    shape = _shape(p)
    if 0 in shape:
        return
    x = np.asarray(values, dtype=np.float32)
    if t == _F32:
        _view(p)[...] = x
    elif t == _F16:
        _view(p)[...] = x.astype(np.float16)
    elif t == _BF16:
        _view(p)[...] = _f32_to_bf16(np.broadcast_to(x, shape))
    elif t in (_I8, _I16, _I32, _I64, _F64):
        _view(p)[...] = x.astype(_PLAIN[t])
    elif t in _QUANT_DST:
        rows = np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1, shape[-1])
        if not np.isfinite(rows).all():
            raise ValueError(f"cannot quantize non-finite values to {_types.type_name(t)}")
        q = _types.quantize(rows, t)
        _row_bytes(p)[...] = q.reshape(_row_bytes(p).shape)
    else:
        raise ValueError(f"cannot write {_types.type_name(t)} tensors")


def _tile(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml broadcasting: ``b`` repeated (tiled) to ``shape``; each dim a multiple of b's (an
    empty ``b`` goes with an empty ``shape`` only, ggml_can_repeat)."""
    if b.size == 0:
        return np.empty(shape, b.dtype)
    reps = tuple(s // bs for s, bs in zip(shape, b.shape))
    return b if all(r == 1 for r in reps) else np.tile(b, reps)


def _f32(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _fn64(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """A float32 -> float32 math function evaluated in float64 and rounded once (as close to a
    correctly rounded libm ``expf``/``tanhf``/... as it gets)."""
    return fn(np.asarray(x, dtype=np.float64)).astype(np.float32)


def _sup_f32_same_shape(p: Any) -> bool:
    """A kernel over one F32 source of the node's own shape."""
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _same_shape(a, p)
