"""ggml tensor types and their NumPy side: per-type facts, quantization, dequantization.

Shapes: ggml's ``ne[0]`` is the fastest-varying dimension (a row); a NumPy shape is ``ne``
reversed. ``ne`` arguments below are in ggml order, ``shape`` results in NumPy order. Raw tensor
data is a 1-D ``uint8`` array (or any bytes-like object) in ggml's layout: rows of ``ne[0]``
elements, each row ``row_size(t, ne[0])`` bytes, blocks of ``block_size(t)`` elements per
``type_size(t)`` bytes.

Everything here checks its arguments before calling ggml, whose failed asserts ``abort()`` the
interpreter: errors come back as :class:`ValueError` / :class:`TypeError`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from .enums import GGMLType
from .raw import ffi, lib

__all__ = ["GGMLType", "TypeLike", "ggml_type", "type_name", "block_size", "type_size",
           "is_quantized", "row_size", "type_of_dtype", "nbytes", "numpy_dtype", "can_quantize", "can_dequantize",
           "requires_imatrix", "to_float32", "quantize", "from_numpy_bytes", "to_numpy"]


#: The usable ``enum ggml_type`` values: :class:`pyggml.enums.GGMLType` without the types ggml
#: keeps only as removed placeholders (block size 0; gguf_init_from_file rejects them too).
_USABLE = frozenset(t for t in GGMLType if lib.ggml_get_type_traits(t).blck_size > 0)

#: A ggml type given as :class:`GGMLType`, its int value, or its name (``"q4_k"``, any case).
TypeLike = Union["GGMLType", int, str]

_BY_NAME = {m.name.lower(): m for m in _USABLE}
_BF16 = GGMLType.BF16
# the quantizers that search ggml_quantize_init's lattice tables; see quantize()
_GRID_TYPES = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"})
_PLAIN_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
                 "I16": np.int16, "I32": np.int32, "I64": np.int64, "BF16": np.uint16}
#: numpy_dtype's table: GGMLType -> np.dtype (an enum's ``.name`` costs a call per read)
_DTYPE_OF = {m: np.dtype(_PLAIN_DTYPES[m.name]) for m in _USABLE if m.name in _PLAIN_DTYPES}


def ggml_type(t: TypeLike) -> GGMLType:
    """Normalise a type given as :class:`GGMLType`, int or name to a :class:`GGMLType`.

    Raises ValueError for an int or name ggml does not know (or a removed type), TypeError for
    anything else (bool included)."""
    if t.__class__ is GGMLType and t in _USABLE:  # the common case, first
        return t
    if isinstance(t, str):
        try:
            return _BY_NAME[t.lower()]
        except KeyError:
            raise ValueError(f"unknown ggml type name {t!r}") from None
    if isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)):
        if isinstance(t, GGMLType) and t in _USABLE:
            return t
        try:
            m = GGMLType(int(t))
        except ValueError:
            m = None
        if m is None or m not in _USABLE:
            raise ValueError(f"unknown or removed ggml type {int(t)}")
        return m
    raise TypeError(f"a ggml type must be a GGMLType, int or str, not {type(t).__name__}")


def type_name(t: TypeLike) -> str:
    """ggml's own name of the type (``"q4_K"``, ``"f32"``); wraps ``ggml_type_name``."""
    return ffi.string(lib.ggml_type_name(ggml_type(t))).decode()


def block_size(t: TypeLike) -> int:
    """Elements per block (1 for plain types, 32 for Q4_0, 256 for K-quants); ``ggml_blck_size``."""
    return int(lib.ggml_blck_size(ggml_type(t)))


def type_size(t: TypeLike) -> int:
    """Bytes per block (per element for plain types); wraps ``ggml_type_size``."""
    return int(lib.ggml_type_size(ggml_type(t)))


def is_quantized(t: TypeLike) -> bool:
    """True for block-quantized types (not for F32/F16/BF16/F64/I*); ``ggml_is_quantized``."""
    return bool(lib.ggml_is_quantized(ggml_type(t)))


def _check_row(t: GGMLType, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"an element count must be an int, not {type(n).__name__}")
    n, blck = int(n), int(lib.ggml_blck_size(t))
    if n < 0:
        raise ValueError(f"element count must be >= 0, got {n}")
    if n % blck:
        raise ValueError(f"{t.name}: {n} elements per row is not a multiple of the block size {blck}")
    return n


def row_size(t: TypeLike, n: int) -> int:
    """Bytes of a row of ``n`` elements (``n`` a multiple of :func:`block_size`): ggml's
    ``ggml_row_size``, computed with Python integers (ggml's ``size_t`` product wraps around for
    rows of more than 2**64 bytes, which would make a huge row look small). Raises ValueError if
    ``n`` is negative or not a multiple of the block."""
    t = ggml_type(t)
    return int(lib.ggml_type_size(t)) * (_check_row(t, n) // int(lib.ggml_blck_size(t)))


def _check_ne(sizes: Sequence[int] | int) -> tuple[int, ...]:
    ne: tuple[Any, ...] = (sizes,) if isinstance(sizes, (int, np.integer)) else tuple(sizes)
    if not 1 <= len(ne) <= lib.GGML_MAX_DIMS:
        raise ValueError(f"ne must have 1..{lib.GGML_MAX_DIMS} dimensions, got {len(ne)}")
    for n in ne:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"ne must hold ints >= 0, got {ne}")
    return tuple(int(n) for n in ne)


def nbytes(t: TypeLike, ne: Sequence[int]) -> int:
    """Bytes of a contiguous tensor of type ``t`` and shape ``ne`` (ggml order, 1-4 dims):
    ``row_size(t, ne[0]) * ne[1] * ne[2] * ne[3]``. Raises ValueError for a bad ``ne``."""
    t, ne = ggml_type(t), _check_ne(ne)
    out = row_size(t, ne[0])
    for n in ne[1:]:  # Python integers: no int64 wrap-around
        out *= int(n)
    return out


def numpy_dtype(t: TypeLike) -> np.dtype | None:
    """The NumPy dtype holding one element of a plain type: float32/float16/float64/int8/int16/
    int32/int64 for F32/F16/F64/I8/I16/I32/I64, ``uint16`` (the raw bits) for BF16, which NumPy
    lacks; None for block-quantized types."""
    return _DTYPE_OF.get(ggml_type(t))


def type_of_dtype(dtype: object) -> GGMLType:
    """The ggml type of a NumPy dtype: float32 F32, float16 F16, float64 F64, int8..int64
    I8..I64, in either byte order (ggml's is the machine's: :meth:`Tensor.set
    <pyggml.core.tensor.Tensor.set>` swaps). TypeError for any other dtype (BF16 has no NumPy dtype:
    pass the type)."""
    dt = np.dtype(dtype).newbyteorder("=")  # type: ignore[call-overload]
    for name, d in _PLAIN_DTYPES.items():
        if name != "BF16" and np.dtype(d) == dt:
            return GGMLType[name]
    raise TypeError(f"no ggml type for NumPy dtype {dt}; pass the ggml type")


def requires_imatrix(t: TypeLike) -> bool:
    """True if ggml can quantize to ``t`` only with an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S);
    wraps ``ggml_quantize_requires_imatrix``."""
    return bool(lib.ggml_quantize_requires_imatrix(ggml_type(t)))


def can_dequantize(t: TypeLike) -> bool:
    """True if :func:`to_float32` handles ``t``: every type except Q8_1 and Q8_K, which ggml uses
    only for activations and gives no ``to_float``."""
    t = ggml_type(t)
    return t.name in _PLAIN_DTYPES or lib.ggml_get_type_traits(t).to_float != ffi.NULL


def can_quantize(t: TypeLike) -> bool:
    """True if :func:`quantize` handles ``t``: F32, F16, BF16 and every quantized type with a
    ``to_float`` (exactly the cases of the switch in ``ggml_quantize_chunk``; not Q8_1/Q8_K,
    not the integer types or F64)."""
    t = ggml_type(t)
    if t.name in ("F32", "F16", "BF16"):
        return True
    return bool(lib.ggml_is_quantized(t)) and lib.ggml_get_type_traits(t).to_float != ffi.NULL


def _as_u8(raw: object) -> np.ndarray:
    """Any bytes-like object or ndarray as a flat C-contiguous uint8 array (a view if possible)."""
    if isinstance(raw, np.ndarray):
        return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(raw, dtype=np.uint8)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        raise TypeError(f"raw data must be bytes-like or an ndarray, not {type(raw).__name__}") from None


def to_float32(raw: object, t: TypeLike, n_elements: int | None = None) -> np.ndarray:
    """Decode raw ggml data of type ``t`` to a new 1-D float32 array of ``n_elements``.

    ``raw`` is bytes-like or an ndarray (its bytes are used), exactly ``row_size(t, n_elements)``
    bytes; ``n_elements`` defaults to what ``len(raw)`` holds. F16, BF16 and every quantized type
    go through ggml's own ``ggml_get_type_traits(t)->to_float``; F32 is copied, F64 and the integer
    types are cast by NumPy (ggml has no ``to_float`` for them).

    Raises ValueError if the length does not match, ``n_elements`` is not a multiple of the block
    size, or ``t`` is Q8_1/Q8_K (see :func:`can_dequantize`); TypeError for a bad ``raw``.
    """
    t, data = ggml_type(t), _as_u8(raw)
    if not can_dequantize(t):
        raise ValueError(f"ggml has no to_float for {t.name}")
    blck, tsize = block_size(t), type_size(t)
    if n_elements is None:
        if data.size % tsize:
            raise ValueError(f"{t.name}: {data.size} bytes is not a whole number of {tsize}-byte blocks")
        n_elements = data.size // tsize * blck
    n = _check_row(t, n_elements)
    if data.size != row_size(t, n):
        raise ValueError(f"{t.name}: {n} elements take {row_size(t, n)} bytes, got {data.size}")
    dt = numpy_dtype(t)
    if dt is not None and t.name not in ("F16", "BF16"):
        return data.view(dt).astype(np.float32)
    out = np.empty(n, dtype=np.float32)
    if n:
        lib.ggml_get_type_traits(t).to_float(ffi.from_buffer(data), ffi.from_buffer("float[]", out), n)
    return out


def quantize(x: np.ndarray, t: TypeLike, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Encode float values to type ``t`` with ``ggml_quantize_chunk`` (after ``ggml_quantize_init``).

    ``x``: array-like of real numbers, any shape; its last NumPy axis is the row (``ne[0]``), which
    must be a multiple of :func:`block_size`. ``imatrix``: optional importance weights, float32 of
    length ``x.shape[-1]`` (required for IQ2_XXS, IQ2_XS, IQ1_S; the other quantizers use them too).
    Returns uint8 of shape ``(*x.shape[:-1], row_size(t, x.shape[-1]))`` -- the layout of
    ``gguf.quants.quantize``. ``t`` may be F32, F16, BF16 or a quantized type (:func:`can_quantize`).

    Input ggml would ``abort()`` on is refused first: for quantized types the values (and the
    imatrix, which must be >= 0) must be finite, and the grid-search quantizers (IQ1_S, IQ1_M,
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S; "point not on grid" aborts once their float sums
    overflow) also need ``max|x| <= 1e10`` and ``max(imatrix) * max|x|**2 <= 1e30`` -- limits
    found by fuzzing ggml v0.20.2 (aborts began at 1e13 and 1e40), with margin; such magnitudes
    overflow the fp16 block scales of every quantized type anyway.

    Raises ValueError for a type ggml cannot quantize to, a missing/mis-sized/invalid imatrix, a
    row length that is not a multiple of the block size, or values outside the limits above;
    TypeError for non-numeric input.
    """
    t = ggml_type(t)
    if not can_quantize(t):
        raise ValueError(f"ggml_quantize_chunk cannot produce {t.name}")
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"quantize needs real numbers, got dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim == 0:
        a = a.reshape(1)
    n_per_row = _check_row(t, a.shape[-1])
    out = np.zeros((*a.shape[:-1], row_size(t, n_per_row)), dtype=np.uint8)
    w = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    if w is None and requires_imatrix(t):
        raise ValueError(f"quantizing to {t.name} requires an importance matrix (imatrix=...)")
    if w is not None and w.shape != (n_per_row,):
        raise ValueError(f"imatrix must have shape ({n_per_row},), got {w.shape}")
    if w is not None and not (np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("imatrix values must be finite and >= 0")
    if a.size == 0:
        return out
    if is_quantized(t):
        if not np.isfinite(a).all():
            raise ValueError(f"cannot quantize non-finite values to {t.name}")
        amax = float(np.abs(a).max())
        wmax = 1.0 if w is None else float(w.max(initial=0.0))
        if t.name in _GRID_TYPES and (amax > 1e10 or wmax * amax * amax > 1e30):
            raise ValueError(f"{t.name}: values up to {amax:g} (imatrix up to {wmax:g}) are too large for "
                             "ggml's grid search, which aborts on them; need max|x| <= 1e10 and "
                             "max(imatrix) * max|x|**2 <= 1e30")
    lib.ggml_quantize_init(t)
    imat = ffi.NULL if w is None else ffi.from_buffer("float[]", w)
    n_rows = a.size // n_per_row
    written = lib.ggml_quantize_chunk(t, ffi.from_buffer("float[]", a), ffi.from_buffer(out), 0,
                                      n_rows, n_per_row, imat)
    assert written == out.nbytes
    return out


def from_numpy_bytes(arr: np.ndarray, t: TypeLike) -> np.ndarray:
    """Raw ggml data (flat uint8) of type ``t`` for the values in ``arr``, NumPy shape = ``ne``
    reversed (so ``ne = arr.shape[::-1]``; the last axis is the row).

    Plain types: ``arr`` is cast to :func:`numpy_dtype` (only a safe or same-kind cast: floats to
    an integer type raise TypeError). BF16 and quantized types: ``arr`` holds the *values* and is
    encoded with :func:`quantize` (ggml's rounding). Raises like :func:`quantize`.
    """
    t, a = ggml_type(t), np.asarray(arr)
    dt = numpy_dtype(t)
    if dt is not None and t is not _BF16:
        if not np.can_cast(a.dtype, dt, casting="same_kind"):
            raise TypeError(f"cannot store dtype {a.dtype} as {t.name} without changing its kind")
        return np.ascontiguousarray(a, dtype=dt).reshape(-1).view(np.uint8)
    return quantize(a, t).reshape(-1)


def to_numpy(raw: object, t: TypeLike, ne: Sequence[int]) -> np.ndarray:
    """Raw ggml data of type ``t`` and shape ``ne`` (ggml order, 1-4 dims) as an array of NumPy
    shape ``ne[::-1]``.

    Plain types: a view of ``raw`` (no copy; read-only if ``raw`` is) in the native dtype. BF16
    and quantized types: a new float32 array decoded by :func:`to_float32`. Raises ValueError if
    ``raw`` does not hold exactly ``nbytes(t, ne)`` bytes or ``ne`` is invalid.
    """
    t, ne, data = ggml_type(t), _check_ne(ne), _as_u8(raw)
    size = nbytes(t, ne)
    if data.size != size:
        raise ValueError(f"{t.name} tensor with ne={list(ne)} takes {size} bytes, got {data.size}")
    dt = numpy_dtype(t)
    flat = data.view(dt) if dt is not None and t is not _BF16 else to_float32(data, t)
    return flat.reshape(ne[::-1])
