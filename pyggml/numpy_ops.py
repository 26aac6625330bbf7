"""NumPy kernels for ggml ops: the compute half of a ggml backend written in Python.

``supports(node)`` says whether :func:`compute` handles a graph node (its op, types, op
parameters and shapes); ``compute(node)`` reads ``node``'s sources from host memory and writes
the result into ``node``'s own data, honouring ``node.nb`` (the destination may be a strided
view, e.g. the view of ``b`` that ``ggml_cpy`` returns, or an in-place view of a source).
:data:`OPS` is the op table behind both, keyed by ``GGML_OP_*``.

A node is a :class:`pyggml.Tensor` or a raw cffi ``struct ggml_tensor *`` (what a backend's
``graph_compute`` gets from ``ggml_graph_node``). Shapes below are ggml ``ne`` order
(``ne[0]`` fastest); NumPy arrays are ``ne`` reversed.

**Numerics.** The reference is ggml's CPU backend (``ggml-cpu/ops.cpp``, ``binary-ops.cpp``,
``unary-ops.cpp``, ``vec.h``). Element-wise results are computed in float32 from float32 inputs
(F16/BF16 sources are widened first, results are rounded to the destination type with ggml's
rounding: round-to-nearest-even for F16 and BF16, truncation for F32 -> I32), transcendental
functions in float64 and rounded once. Where the CPU deliberately approximates, the
approximation is reproduced:

* ``GELU`` (tanh form) and ``GEGLU``: the CPU reads a 65536-entry F16 table: ``x`` is rounded
  to F16, the tanh formula is evaluated and the result rounded to F16; for F32 inputs
  ``x <= -10`` gives 0 and ``x >= 10`` gives ``x``. ``GELU_QUICK``/``GEGLU_QUICK`` use their
  own F16 table with no cut-off. So the CPU's F32 GELU is off the exact formula by up to
  4e-3 (near x = 8; NMSE ~5e-8 over [-9.5, 9.5]); this module returns the CPU's values.
* ``GELU_ERF`` is computed accurately (erf in float64); the CPU's ``1.0f + erff(x/√2)`` loses
  relative precision in the far negative tail, where the values are below 1e-5 anyway.
* ``ARGMAX`` returns the *last* index of the maximum (ggml's loop updates it on ties).
* Reductions accumulate in float64 (the CPU uses ``ggml_float`` = double for most of them).
* ``MUL_MAT``/``OUT_PROD`` dequantize quantized/F16/BF16 weights exactly and multiply in
  float32; the CPU instead rounds ``src1`` to the weight's ``vec_dot_type`` (F16, Q8_0, Q8_K)
  first, so results differ by that rounding (test-backend-ops allows NMSE 5e-4 for them).

Errors: :func:`compute` raises ValueError for a node :func:`supports` rejects, for a tensor
without data, for out-of-range row indices (GET_ROWS/SET_ROWS) and for non-finite values
written to a quantized destination; TypeError for something that is not a tensor.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

from . import types as _types
from ._loader import ffi, lib

__all__ = ["supports", "compute", "OPS", "OpImpl", "supported_op_names"]

# ---------------------------------------------------------------------------------------------
# types

_F32, _F16, _BF16, _F64 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, lib.GGML_TYPE_BF16, lib.GGML_TYPE_F64
_I8, _I16, _I32, _I64 = lib.GGML_TYPE_I8, lib.GGML_TYPE_I16, lib.GGML_TYPE_I32, lib.GGML_TYPE_I64

#: float types read and written by the element-wise kernels
_FLT = frozenset({_F32, _F16, _BF16})
#: NumPy dtype holding one element of each plain type (BF16: its raw bits)
_PLAIN = {_F32: np.dtype(np.float32), _F16: np.dtype(np.float16), _BF16: np.dtype(np.uint16),
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
    """ggml_can_repeat: every big.ne[i] is a multiple of small.ne[i]."""
    if any(n == 0 for n in _ne(small)):
        return any(n == 0 for n in _ne(big))
    return all(b % s == 0 for s, b in zip(_ne(small), _ne(big)))


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
    span = offset + sum((n - 1) * s for n, s in zip(ne, nb)) + dt.itemsize
    buf = ffi.buffer(_data(p), span)
    return np.ndarray(ne[::-1], dtype=dt, buffer=buf, offset=offset, strides=nb[::-1])


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
    """ggml broadcasting: ``b`` repeated (tiled) to ``shape``; each dim a multiple of b's."""
    reps = tuple(s // bs for s, bs in zip(shape, b.shape))
    return b if all(r == 1 for r in reps) else np.tile(b, reps)


def _f32(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _fn64(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """A float32 -> float32 math function evaluated in float64 and rounded once (as close to a
    correctly rounded libm ``expf``/``tanhf``/... as it gets)."""
    return fn(np.asarray(x, dtype=np.float64)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# scalar math as the CPU does it

_ONE, _HALF = np.float32(1.0), np.float32(0.5)
_GELU_COEF_A = np.float32(0.044715)
_GELU_QUICK_COEF = np.float32(-1.702)
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_SQRT_2_INV = np.float32(0.70710678118654752440084436210484)


def _erf_parts(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(erf(|z|), erfc(|z|))`` in float64 (relative error < 1e-11): a positive-term series
    below 2.5, the continued fraction of erfc above."""
    u = np.abs(np.asarray(z, dtype=np.float64))
    small = u < 2.5
    us = np.where(small, u, 0.0)
    term, acc, a = us.copy(), us.copy(), 2.0 * us * us
    for n in range(1, 90):
        term = term * a / (2 * n + 1)
        acc += term
    erf_small = (2.0 / math.sqrt(math.pi)) * np.exp(-us * us) * acc
    ul = np.where(small, 3.0, u)
    f = ul.copy()
    for k in range(120, 0, -1):
        f = ul + (k / 2.0) / f
    erfc_large = np.exp(-ul * ul) / math.sqrt(math.pi) / f
    return np.where(small, erf_small, 1.0 - erfc_large), np.where(small, 1.0 - erf_small, erfc_large)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5·x·(1 + erf(x/√2)) (CPU: ``erff``), float32; 1 + erf(z) is taken as erfc(-z) so the
    negative tail keeps its relative precision."""
    z = np.asarray(x, dtype=np.float32) * _SQRT_2_INV
    erf_u, erfc_u = _erf_parts(z)
    one_plus_erf = np.where(z >= 0, 1.0 + erf_u, erfc_u)
    return (0.5 * np.asarray(x, dtype=np.float64) * one_plus_erf).astype(np.float32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32: 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)))."""
    x = _f32(x)
    inner = _SQRT_2_OVER_PI * x * (_ONE + _GELU_COEF_A * x * x)
    return _HALF * x * (_ONE + _fn64(np.tanh, inner))


def _gelu_quick_formula(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_quick_f32: x*(1.0f/(1.0f+expf(GELU_QUICK_COEF*x)))."""
    x = _f32(x)
    return x * (_ONE / (_ONE + _fn64(np.exp, _GELU_QUICK_COEF * x)))


def _f16_table(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """What ggml's F16 lookup tables give: f16(fn(f16(x)))."""
    h = _f32(x).astype(np.float16).astype(np.float32)
    return fn(h).astype(np.float16).astype(np.float32)


def _gelu_cpu(x: np.ndarray, src_type: int) -> np.ndarray:
    """ggml_vec_gelu_f32 / _f16 (GGML_GELU_FP16): table lookup, with the F32 cut-offs."""
    y = _f16_table(_gelu_tanh, x)
    if src_type == _F32:
        y = np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, y))
    return y


def _silu(x: np.ndarray) -> np.ndarray:
    x = _f32(x)
    return x / (_ONE + _fn64(np.exp, -x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return _ONE / (_ONE + _fn64(np.exp, -_f32(x)))


def _hardsigmoid(x: np.ndarray) -> np.ndarray:
    # fminf/fmaxf: NaN gives 0, as in C
    return np.fmin(_ONE, np.fmax(np.float32(0), (_f32(x) + np.float32(3)) / np.float32(6)))


def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf: halfway cases away from zero."""
    x = _f32(x)
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t).astype(np.float32)


def _softplus(x: np.ndarray) -> np.ndarray:
    x = _f32(x)
    return np.where(x > 20.0, x, _fn64(np.log, _ONE + _fn64(np.exp, x)))


def _xielu(x: np.ndarray, fp: np.ndarray) -> np.ndarray:
    x = _f32(x)
    alpha_n, alpha_p, beta, eps = (np.float32(v) for v in fp[1:5])
    pos = alpha_p * x * x + beta * x
    neg = (_fn64(np.expm1, np.fmin(x, eps)) - x) * alpha_n + beta * x
    return np.where(x > 0, pos, neg)


def _wheref(cond: np.ndarray, a: Any, b: Any) -> np.ndarray:
    """np.where as float32 (a comparison with NaN is false, as in C's ternaries)."""
    return np.where(cond, a, b).astype(np.float32)


#: GGML_UNARY_OP_* -> f(x float32, src type, float op_params) -> float32
_UNARY_FNS: dict[int, Callable[[np.ndarray, int, np.ndarray], np.ndarray]] = {
    lib.GGML_UNARY_OP_ABS: lambda x, t, fp: np.abs(x),
    lib.GGML_UNARY_OP_SGN: lambda x, t, fp: _wheref(x > 0, 1.0, np.where(x < 0, -1.0, 0.0)),
    lib.GGML_UNARY_OP_NEG: lambda x, t, fp: -x,
    lib.GGML_UNARY_OP_STEP: lambda x, t, fp: _wheref(x > 0, 1.0, 0.0),
    lib.GGML_UNARY_OP_TANH: lambda x, t, fp: _fn64(np.tanh, x),
    lib.GGML_UNARY_OP_ELU: lambda x, t, fp: _wheref(x > 0, x, _fn64(np.expm1, x)),
    lib.GGML_UNARY_OP_RELU: lambda x, t, fp: _wheref(x > 0, x, 0.0),
    lib.GGML_UNARY_OP_SIGMOID: lambda x, t, fp: _sigmoid(x),
    lib.GGML_UNARY_OP_GELU: lambda x, t, fp: _gelu_cpu(x, t),
    lib.GGML_UNARY_OP_GELU_QUICK: lambda x, t, fp: _f16_table(_gelu_quick_formula, x),
    lib.GGML_UNARY_OP_SILU: lambda x, t, fp: _silu(x),
    lib.GGML_UNARY_OP_HARDSWISH: lambda x, t, fp: _f32(x) * _hardsigmoid(x),
    lib.GGML_UNARY_OP_HARDSIGMOID: lambda x, t, fp: _hardsigmoid(x),
    lib.GGML_UNARY_OP_EXP: lambda x, t, fp: _fn64(np.exp, x),
    lib.GGML_UNARY_OP_EXPM1: lambda x, t, fp: _fn64(np.exp, x) - _ONE,
    lib.GGML_UNARY_OP_SOFTPLUS: lambda x, t, fp: _softplus(x),
    lib.GGML_UNARY_OP_GELU_ERF: lambda x, t, fp: _gelu_erf(x),
    lib.GGML_UNARY_OP_XIELU: lambda x, t, fp: _xielu(x, fp),
    lib.GGML_UNARY_OP_FLOOR: lambda x, t, fp: np.floor(x),
    lib.GGML_UNARY_OP_CEIL: lambda x, t, fp: np.ceil(x),
    lib.GGML_UNARY_OP_ROUND: lambda x, t, fp: _roundf(x),
    lib.GGML_UNARY_OP_TRUNC: lambda x, t, fp: np.trunc(x),
}
#: unary ops the CPU runs with ops.cpp kernels: same type in and out, F32 or F16 only
_UNARY_SAME_TYPE = frozenset({lib.GGML_UNARY_OP_GELU, lib.GGML_UNARY_OP_GELU_QUICK,
                              lib.GGML_UNARY_OP_GELU_ERF, lib.GGML_UNARY_OP_SILU})

# ---------------------------------------------------------------------------------------------
# op table


class OpImpl(NamedTuple):
    """One entry of :data:`OPS`: ``supports(ptr) -> bool`` and ``compute(ptr) -> None`` take the
    raw ``struct ggml_tensor *`` of the node; ``notes`` states the types/params handled.
    ``compute`` assumes ``supports`` is true: call the module's :func:`compute`, which checks."""
    name: str
    supports: Callable[[Any], bool]
    compute: Callable[[Any], None]
    notes: str


#: GGML_OP_* -> :class:`OpImpl`
OPS: dict[int, OpImpl] = {}


def _add(op_name: str, sup: Callable[[Any], bool], comp: Callable[[Any], None], notes: str) -> None:
    op = getattr(lib, f"GGML_OP_{op_name}")
    OPS[op] = OpImpl(op_name, sup, comp, notes)


# --- view ops: nothing to compute -------------------------------------------------------------

def _sup_true(p: Any) -> bool:
    return True


def _comp_nothing(p: Any) -> None:
    return None


for _name in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
    _add(_name, _sup_true, _comp_nothing, "no computation (data is the source's)")


# --- DUP / CPY / CONT -------------------------------------------------------------------------

def _sup_dup(p: Any) -> bool:
    s = _src(p, 0)
    if s is None or _nel(s) != _nel(p):
        return False
    st, dt = s.type, p.type
    if st == dt:
        return st in _PLAIN or (_is_quant(st) and _rows_packed(s) and _rows_packed(p))
    if st in _FLT and dt in _FLT:
        return True
    if (st, dt) in ((_F32, _I32), (_I32, _F32)):
        return True
    if _is_quant(st) and dt == _F32:
        return _readable(s)
    if st == _F32 and dt in _QUANT_DST:
        # only from F32: F16/BF16 values land on exact rounding ties far more often, where the
        # CPU's SIMD quantizer and ggml's reference one may pick neighbouring values
        # (test-backend-ops' CPY bf16->q8_0 failed at NMSE 2e-7)
        return _rows_packed(p)
    return False


def _comp_dup(p: Any) -> None:
    s = _src(p, 0)
    shape = _shape(p)
    if _nel(p) == 0:
        return
    if s.type == p.type and s.type in _PLAIN:
        _view(p)[...] = _view(s).reshape(shape)
    elif s.type == p.type:  # quantized: the blocks in order
        src_rows = _row_bytes(s).reshape(-1)
        dst = _row_bytes(p)
        dst[...] = src_rows.reshape(dst.shape)
    elif s.type == _I32 and p.type == _F32:
        _view(p)[...] = _view(s).reshape(shape).astype(np.float32)
    else:
        _write(p, _read_f32(s).reshape(shape))


_DUP_NOTES = ("same type: any plain type, any layout; quantized same type with packed rows. "
              "F32/F16/BF16 -> F32/F16/BF16, F32 <-> I32, quantized -> F32, "
              "F32 -> Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K..Q6_K (reference quantizer)")
for _name in ("DUP", "CPY", "CONT"):
    _add(_name, _sup_dup, _comp_dup, _DUP_NOTES)


# --- binary element-wise ----------------------------------------------------------------------

def _sup_binary(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    return (a is not None and b is not None and a.type in _FLT and b.type in _FLT
            and p.type in _FLT and _same_shape(a, p) and _can_repeat(b, a))


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[Any], None]:
    def comp(p: Any) -> None:
        a, b = _src(p, 0), _src(p, 1)
        x = _read_f32(a)
        y = _tile(_read_f32(b), x.shape)
        _write(p, fn(x, y))
    return comp


_BIN_NOTES = "src0, src1, dst F32/F16/BF16 (any mix); src1 tiled over src0 (ggml_can_repeat)"
_add("ADD", _sup_binary, _binary(np.add), _BIN_NOTES)
_add("SUB", _sup_binary, _binary(np.subtract), _BIN_NOTES)
_add("MUL", _sup_binary, _binary(np.multiply), _BIN_NOTES)
_add("DIV", _sup_binary, _binary(np.divide), _BIN_NOTES)


def _sup_add1(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    return (a is not None and b is not None and a.type in _FLT and b.type in _FLT
            and p.type in _FLT and _same_shape(a, p) and _nel(b) == 1)


def _comp_add1(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    v = _read_f32(_src(p, 1)).reshape(-1)[0]
    _write(p, x + np.float32(v))


_add("ADD1", _sup_add1, _comp_add1, "src0/dst F32/F16/BF16 + scalar src1 F32/F16/BF16")


def _offset_params(p: Any) -> tuple[int, int, int, int]:
    ip = _iparams(p)
    return int(ip[0]), int(ip[1]), int(ip[2]), int(ip[3])


def _sup_acc_set(types: frozenset) -> Callable[[Any], bool]:
    def sup(p: Any) -> bool:
        a, b = _src(p, 0), _src(p, 1)
        if a is None or b is None or not (a.type == b.type == p.type and a.type in types):
            return False
        if not (_same_shape(a, p) and lib.ggml_is_contiguous(a)):
            return False
        nb1, nb2, nb3, offset = _offset_params(p)
        es = int(lib.ggml_type_size(a.type))
        ne = _ne(b)
        if any(n == 0 for n in ne):
            return True
        if min(nb1, nb2, nb3, offset) < 0:
            return False
        last = offset + (ne[0] - 1) * es + (ne[1] - 1) * nb1 + (ne[2] - 1) * nb2 + (ne[3] - 1) * nb3
        return last + es <= _nel(a) * es
    return sup


def _acc_set(accumulate: bool) -> Callable[[Any], None]:
    def comp(p: Any) -> None:
        a, b = _src(p, 0), _src(p, 1)
        nb1, nb2, nb3, offset = _offset_params(p)
        dt = _PLAIN[a.type]
        res = np.array(_view(a), dtype=dt, order="C")   # src0, contiguous copy
        flat = res.reshape(-1).view(np.uint8)
        ne = _ne(b)
        if all(n > 0 for n in ne):
            sub = np.ndarray(ne[::-1], dtype=dt, buffer=flat, offset=offset,
                             strides=(nb3, nb2, nb1, dt.itemsize))
            if accumulate:
                sub += _view(b)
            else:
                sub[...] = _view(b)
        _view(p)[...] = res
    return comp


_add("ACC", _sup_acc_set(frozenset({_F32})), _acc_set(True),
     "F32, contiguous src0; op_params [nb1, nb2, nb3, offset, inplace]")
_add("SET", _sup_acc_set(frozenset({_F32, _I32})), _acc_set(False),
     "F32 or I32 (src0, src1, dst one type), contiguous src0; op_params [nb1, nb2, nb3, offset, inplace]")


# --- unary element-wise ops with their own GGML_OP ---------------------------------------------

def _sup_elementwise(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type in _FLT and p.type in _FLT and _same_shape(a, p)


def _elementwise(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Any], None]:
    def comp(p: Any) -> None:
        _write(p, fn(_read_f32(_src(p, 0))))
    return comp


_EW_NOTES = "src/dst F32/F16/BF16 (computed in float32)"
_add("SQR", _sup_elementwise, _elementwise(lambda x: x * x), _EW_NOTES)
_add("SQRT", _sup_elementwise, _elementwise(np.sqrt), _EW_NOTES)
_add("LOG", _sup_elementwise, _elementwise(lambda x: _fn64(np.log, x)), _EW_NOTES)
_add("SIN", _sup_elementwise, _elementwise(lambda x: _fn64(np.sin, x)), _EW_NOTES)
_add("COS", _sup_elementwise, _elementwise(lambda x: _fn64(np.cos, x)), _EW_NOTES)


def _sup_f32_or_f16_same(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type and a.type in (_F32, _F16) and _same_shape(a, p)


def _comp_clamp(p: Any) -> None:
    fp = _fparams(p)
    lo, hi = np.float32(fp[0]), np.float32(fp[1])
    x = _read_f32(_src(p, 0))
    y = np.where(x < hi, x, hi)          # MIN(x, max): NaN -> max, as the CPU's macro
    _write(p, np.where(y > lo, y, lo))   # MAX(., min)


_add("CLAMP", _sup_f32_or_f16_same, _comp_clamp, "F32 or F16 (same type); op_params [min, max]")


def _comp_leaky_relu(p: Any) -> None:
    ns = np.float32(_fparams(p)[0])
    x = _read_f32(_src(p, 0))
    _write(p, np.where(x > 0, x, np.float32(0)) + ns * np.where(x < 0, x, np.float32(0)))


_add("LEAKY_RELU", _sup_f32_or_f16_same, _comp_leaky_relu,
     "F32 or F16 (same type); op_params [negative_slope]")


def _sup_scale(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _same_shape(a, p)


def _comp_scale(p: Any) -> None:
    fp = _fparams(p)
    s, b = np.float32(fp[0]), np.float32(fp[1])
    x = _read_f32(_src(p, 0))
    _write(p, x * s if b == 0 else x * s + b)


_add("SCALE", _sup_scale, _comp_scale, "F32; op_params [s, b]: x*s + b")


def _sup_unary(p: Any) -> bool:
    a = _src(p, 0)
    if a is None or not _same_shape(a, p):
        return False
    op = int(lib.ggml_get_unary_op(p))
    if op not in _UNARY_FNS:
        return False
    if op in _UNARY_SAME_TYPE:
        return a.type == p.type and a.type in (_F32, _F16)
    return a.type in _FLT and p.type in _FLT


def _comp_unary(p: Any) -> None:
    a = _src(p, 0)
    fn = _UNARY_FNS[int(lib.ggml_get_unary_op(p))]
    _write(p, fn(_read_f32(a), a.type, _fparams(p)))


_add("UNARY", _sup_unary, _comp_unary,
     "all 22 ggml_unary_op; GELU/GELU_QUICK/GELU_ERF/SILU: F32->F32 or F16->F16 "
     "(GELU, GELU_QUICK through ggml's F16 tables); the others F32/F16/BF16 -> F32/F16/BF16")


# --- GLU -----------------------------------------------------------------------------------

def _glu_fn(op: int, x: np.ndarray, g: np.ndarray, t: int, fp: np.ndarray) -> np.ndarray:
    if op == lib.GGML_GLU_OP_REGLU:
        return np.where(x > 0, x * g, np.float32(0))
    if op == lib.GGML_GLU_OP_GEGLU:
        y = _f16_table(_gelu_tanh, x)
        if t == _F32:   # ggml_vec_geglu_f32 cut-offs
            return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x * g, y * g))
        return y * g
    if op == lib.GGML_GLU_OP_SWIGLU:
        return _silu(x) * g
    if op == lib.GGML_GLU_OP_SWIGLU_OAI:
        alpha, limit = np.float32(fp[2]), np.float32(fp[3])
        xc = np.minimum(x, limit)
        yc = np.clip(g, -limit, limit)
        out_glu = xc / (_ONE + _fn64(np.exp, alpha * (-xc)))
        return out_glu * (yc + _ONE)
    if op == lib.GGML_GLU_OP_GEGLU_ERF:
        return _gelu_erf(x) * g
    if op == lib.GGML_GLU_OP_GEGLU_QUICK:
        return _f16_table(_gelu_quick_formula, x) * g
    raise ValueError(f"unknown glu op {op}")


def _sup_glu(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    if a is None or a.type not in (_F32, _F16) or p.type != a.type:
        return False
    op = int(lib.ggml_get_glu_op(p))
    if not 0 <= op < lib.GGML_GLU_OP_COUNT:
        return False
    if op == lib.GGML_GLU_OP_SWIGLU_OAI and a.type != _F32:
        return False
    na, nd = _ne(a), _ne(p)
    if b is None:
        return nd[0] == na[0] // 2 and nd[1:] == na[1:]
    return b.type == a.type and _same_shape(a, b) and nd == na


def _comp_glu(p: Any) -> None:
    a, b = _src(p, 0), _src(p, 1)
    ip, fp = _iparams(p), _fparams(p)
    xa = _read_f32(a)
    if b is None:
        nc = _ne(p)[0]
        x, g = xa[..., :nc], xa[..., nc:2 * nc]
        if ip[1]:  # swapped
            x, g = g, x
    else:
        x, g = xa, _read_f32(b)
    _write(p, _glu_fn(int(ip[0]), _f32(x), _f32(g), a.type, fp))


_add("GLU", _sup_glu, _comp_glu,
     "REGLU, GEGLU, SWIGLU, SWIGLU_OAI (F32), GEGLU_ERF, GEGLU_QUICK; F32 or F16 (one type); "
     "fused (halves of src0, swapped flag) or split (src1)")


# --- reductions ----------------------------------------------------------------------------

def _sup_sum(p: Any) -> bool:
    a = _src(p, 0)
    # the CPU kernel sums each row as contiguous whatever nb[0] is (wrong for a permuted
    # src); ggml's CPU is the reference, so only rows with unit stride are claimed
    return (a is not None and a.type in _FLT and p.type in _FLT and _nel(p) == 1
            and int(a.nb[0]) == lib.ggml_type_size(a.type))


def _comp_sum(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    _write(p, np.float32(x.sum(dtype=np.float64)))


_add("SUM", _sup_sum, _comp_sum, "F32/F16/BF16 -> scalar F32/F16/BF16 (float64 accumulation)")


def _sup_rows_reduce(types: frozenset) -> Callable[[Any], bool]:
    def sup(p: Any) -> bool:
        a = _src(p, 0)
        if a is None or a.type not in types or p.type not in types:
            return False
        na, nd = _ne(a), _ne(p)
        return nd[0] == 1 and nd[1:] == na[1:]
    return sup


def _comp_sum_rows(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    _write(p, x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32))


def _comp_mean(p: Any) -> None:
    a = _src(p, 0)
    x = _read_f32(a)
    s = x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    _write(p, s / np.float32(_ne(a)[0]))


_add("SUM_ROWS", _sup_rows_reduce(_FLT), _comp_sum_rows, "F32/F16/BF16, ne [n, a, b, c] -> [1, a, b, c]")
_add("MEAN", _sup_rows_reduce(frozenset({_F32})), _comp_mean, "F32, ne [n, a, b, c] -> [1, a, b, c]")


def _sup_cumsum(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _same_shape(a, p)


def _comp_cumsum(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    _write(p, np.cumsum(x, axis=-1, dtype=np.float32))  # sequential float32, as the CPU


_add("CUMSUM", _sup_cumsum, _comp_cumsum, "F32, along ne[0], float32 running sum")


def _sup_argmax(p: Any) -> bool:
    a = _src(p, 0)
    if a is None or a.type != _F32 or p.type != _I32:
        return False
    na = _ne(a)
    return na[2] == na[3] == 1 and _ne(p) == (na[1], 1, 1, 1)


def _comp_argmax(p: Any) -> None:
    x = _read_f32(_src(p, 0))[0, 0]              # (ne1, ne0)
    n0 = x.shape[1]
    out = np.empty(x.shape[0], dtype=np.int64)
    nan_rows = np.isnan(x).any(axis=1)
    clean = ~nan_rows
    if n0 == 0:
        out[:] = 0
    else:
        # last index of the maximum (ggml_vec_argmax_f32 updates on equality)
        out[clean] = n0 - 1 - np.argmax(x[clean, ::-1], axis=1)
        for r in np.nonzero(nan_rows)[0]:       # replay the C loop where NaNs break max()
            m, idx = -np.inf, 0
            for i, v in enumerate(x[r]):
                m = m if m > v else v
                if m == v:
                    idx = i
            out[r] = idx
    _view(p)[...] = out.astype(np.int32).reshape(_shape(p))


_add("ARGMAX", _sup_argmax, _comp_argmax, "F32 matrix -> I32 [ne1]; the last index of the maximum")


def _sup_count_equal(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    return (a is not None and b is not None and a.type == b.type == _I32
            and _same_shape(a, b) and p.type == _I64 and _nel(p) == 1)


def _comp_count_equal(p: Any) -> None:
    n = np.count_nonzero(_view(_src(p, 0)) == _view(_src(p, 1)))
    _view(p)[...] = np.int64(n)


_add("COUNT_EQUAL", _sup_count_equal, _comp_count_equal, "I32, I32 -> I64 scalar")


# --- repeat / concat -------------------------------------------------------------------------

def _sup_repeat(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type and a.type in _PLAIN and _can_repeat(a, p)


def _comp_repeat(p: Any) -> None:
    if _nel(p):
        _view(p)[...] = _tile(_view(_src(p, 0)), _shape(p))


_add("REPEAT", _sup_repeat, _comp_repeat, "any plain type (F32/F16/BF16/F64/I8..I64), src tiled to dst")


def _sup_repeat_back(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _can_repeat(p, a)


def _comp_repeat_back(p: Any) -> None:
    x = _read_f32(_src(p, 0)).astype(np.float64)
    n3, n2, n1, n0 = _shape(p)
    s3, s2, s1, s0 = x.shape
    y = x.reshape(s3 // n3, n3, s2 // n2, n2, s1 // n1, n1, s0 // n0, n0).sum(axis=(0, 2, 4, 6))
    _write(p, y)


_add("REPEAT_BACK", _sup_repeat_back, _comp_repeat_back, "F32; sums the tiles of src into dst")


def _sup_concat(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    if a is None or b is None or not (a.type == b.type == p.type) or a.type not in _PLAIN:
        return False
    dim = int(_iparams(p)[0])
    if not 0 <= dim < 4:
        return False
    na, nb_, nd = _ne(a), _ne(b), _ne(p)
    return all((nd[d] == na[d] + nb_[d]) if d == dim else (nd[d] == na[d] == nb_[d]) for d in range(4))


def _comp_concat(p: Any) -> None:
    dim = int(_iparams(p)[0])
    if _nel(p):
        _view(p)[...] = np.concatenate([_view(_src(p, 0)), _view(_src(p, 1))], axis=3 - dim)


_add("CONCAT", _sup_concat, _comp_concat, "any plain type (one type); op_params [dim]")


# --- normalisation ---------------------------------------------------------------------------

def _sup_f32_same_shape(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _same_shape(a, p)


def _comp_norm(p: Any) -> None:
    eps = np.float32(_fparams(p)[0])
    x = _read_f32(_src(p, 0))
    n = np.float32(x.shape[-1])
    mean = x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32) / n
    y = x - mean
    var = ((y.astype(np.float64) ** 2).sum(axis=-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    scale = _ONE / np.sqrt(var + eps)
    _write(p, y * scale)


def _comp_rms_norm(p: Any) -> None:
    eps = np.float32(_fparams(p)[0])
    x = _read_f32(_src(p, 0))
    sq = (x * x).sum(axis=-1, keepdims=True, dtype=np.float64)
    mean = (sq / x.shape[-1]).astype(np.float32)
    _write(p, x * (_ONE / np.sqrt(mean + eps)))


def _comp_l2_norm(p: Any) -> None:
    eps = np.float32(_fparams(p)[0])
    x = _read_f32(_src(p, 0))
    sq = (x * x).sum(axis=-1, keepdims=True, dtype=np.float64)
    _write(p, x * (_ONE / np.fmax(np.sqrt(sq.astype(np.float32)), eps)))


def _sup_group_norm(p: Any) -> bool:
    return _sup_f32_same_shape(p) and int(_iparams(p)[0]) > 0


def _comp_group_norm(p: Any) -> None:
    ip, fp = _iparams(p), _fparams(p)
    n_groups, eps = int(ip[0]), np.float32(fp[1])
    x = _read_f32(_src(p, 0))                       # (n3, C, n1, n0)
    out = np.empty(x.shape, dtype=np.float32)
    n_channels = x.shape[1]
    per_group = (n_channels + n_groups - 1) // n_groups
    for g in range(n_groups):
        start, end = g * per_group, min(g * per_group + per_group, n_channels)
        if start >= end:
            continue
        xs = x[:, start:end]
        cnt = xs.shape[1] * xs.shape[2] * xs.shape[3]
        mean = (xs.sum(axis=(1, 2, 3), keepdims=True, dtype=np.float64) / cnt).astype(np.float32)
        y = xs - mean
        var = ((y.astype(np.float64) ** 2).sum(axis=(1, 2, 3), keepdims=True) / cnt).astype(np.float32)
        out[:, start:end] = y * (_ONE / np.sqrt(var + eps))
    _write(p, out)


_add("NORM", _sup_f32_same_shape, _comp_norm, "F32; op_params [eps]; (x - mean)/sqrt(var + eps) along ne[0]")
_add("RMS_NORM", _sup_f32_same_shape, _comp_rms_norm, "F32; op_params [eps]; x/sqrt(mean(x²) + eps)")
_add("L2_NORM", _sup_f32_same_shape, _comp_l2_norm, "F32; op_params [eps]; x/max(‖x‖, eps)")
_add("GROUP_NORM", _sup_group_norm, _comp_group_norm,
     "F32; op_params [n_groups, eps]; groups of channels along ne[2]")


# --- matrix products -------------------------------------------------------------------------

def _sup_mul_mat(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    if a is None or b is None or p.type != _F32 or b.type not in _FLT:
        return False
    if not (a.type in _FLT or (a.type not in _PLAIN and _readable(a))):
        return False
    na, nb_, nd = _ne(a), _ne(b), _ne(p)
    if na[0] != nb_[0] or na[2] == 0 or na[3] == 0:
        return False
    if nb_[2] % na[2] or nb_[3] % na[3]:
        return False
    return nd == (na[1], nb_[1], nb_[2], nb_[3])


def _comp_mul_mat(p: Any) -> None:
    a, b = _src(p, 0), _src(p, 1)
    A = _read_f32(a)                                 # (d3, d2, M, K)
    B = _read_f32(b)                                 # (e3, e2, N, K)
    d3, d2, M, K = A.shape
    e3, e2, N, _ = B.shape
    r2, r3 = e2 // d2, e3 // d3
    # ggml broadcasts src0 by repetition: src1 batch i12 uses src0 batch i12 // r2
    Bv = B.reshape(d3, r3, d2, r2, N, K)
    At = np.swapaxes(A, -1, -2)[:, None, :, None]   # (d3, 1, d2, 1, K, M)
    out = np.matmul(Bv, At)                          # (d3, r3, d2, r2, N, M)
    _write(p, out.reshape(e3, e2, N, M))


_add("MUL_MAT", _sup_mul_mat, _comp_mul_mat,
     "src0 F32/F16/BF16 or any quantized type with to_float (packed rows), src1 F32/F16/BF16, "
     "dst F32; src0 batches broadcast over src1's (i02 = i12 / (ne12/ne02))")


def _sup_out_prod(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    if a is None or b is None or p.type != _F32 or b.type != _F32:
        return False
    if not (a.type in _FLT or (a.type not in _PLAIN and _readable(a))):
        return False
    na, nb_, nd = _ne(a), _ne(b), _ne(p)
    if na[1] != nb_[1] or na[2] == 0 or na[3] == 0 or nb_[2] % na[2] or nb_[3] % na[3]:
        return False
    return nd == (na[0], nb_[0], nb_[2], nb_[3])


def _comp_out_prod(p: Any) -> None:
    a, b = _src(p, 0), _src(p, 1)
    A = _read_f32(a)                                 # (d3, d2, K, M)
    B = _read_f32(b)                                 # (e3, e2, K, N)
    d3, d2, K, M = A.shape
    e3, e2, _, N = B.shape
    r2, r3 = e2 // d2, e3 // d3
    Bt = np.swapaxes(B, -1, -2).reshape(d3, r3, d2, r2, N, K)
    out = np.matmul(Bt, A[:, None, :, None])         # (d3, r3, d2, r2, N, M)
    _write(p, out.reshape(e3, e2, N, M))


_add("OUT_PROD", _sup_out_prod, _comp_out_prod,
     "src0 F32/F16/BF16/quantized, src1 F32, dst F32: dst[m,n] = Σ_k src0[m,k]·src1[n,k] (ggml order)")


# --- rows -------------------------------------------------------------------------------------

def _sup_get_rows(p: Any) -> bool:
    a, idx = _src(p, 0), _src(p, 1)
    if a is None or idx is None or idx.type != _I32 or not _readable(a):
        return False
    if a.type == _I32:
        if p.type != _I32:
            return False
    elif p.type not in _FLT or a.type in (_I8, _I16, _I64, _F64):
        return False
    na, ni, nd = _ne(a), _ne(idx), _ne(p)
    return na[2] == ni[1] and na[3] == ni[2] and ni[3] == 1 and nd == (na[0], ni[0], ni[1], ni[2])


def _check_rows(rows: np.ndarray, n: int, what: str) -> None:
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise ValueError(f"{what}: row index out of range [0, {n})")


def _comp_get_rows(p: Any) -> None:
    a, idx = _src(p, 0), _src(p, 1)
    rows = _view(idx)[0].astype(np.int64)            # (n12, n11, n10)
    if rows.size == 0 or _ne(a)[0] == 0:
        return
    _check_rows(rows, _ne(a)[1], "get_rows")
    i12 = np.arange(rows.shape[0])[:, None, None]
    i11 = np.arange(rows.shape[1])[None, :, None]
    if a.type in _PLAIN:
        src = _view(a)[i12, i11, rows]               # (n12, n11, n10, ne0)
        if a.type == _I32:
            _view(p)[...] = src
            return
        vals = _bf16_to_f32(src) if a.type == _BF16 else src.astype(np.float32)
    else:                                            # quantized: dequantize the picked rows only
        raw = np.ascontiguousarray(_row_bytes(a)[i12, i11, rows])
        vals = _types.to_float32(raw.reshape(-1), a.type, rows.size * _ne(a)[0])
        vals = vals.reshape(*rows.shape, _ne(a)[0])
    _write(p, vals)


_add("GET_ROWS", _sup_get_rows, _comp_get_rows,
     "src0 F32/F16/BF16/any quantized with to_float (-> F32/F16/BF16) or I32 (-> I32); "
     "src1 I32 rows ne [k, ne02, ne03]")


def _sup_set_rows(p: Any) -> bool:
    b, idx = _src(p, 0), _src(p, 1)
    if b is None or idx is None or b.type not in _FLT or idx.type not in (_I32, _I64):
        return False
    if not (p.type in _FLT or (p.type in _QUANT_DST and _rows_packed(p))):
        return False
    nb_, ni, nd = _ne(b), _ne(idx), _ne(p)
    return (nd[0] == nb_[0] and nd[2] == nb_[2] and nd[3] == nb_[3] and nb_[1] == ni[0]
            and ni[1] > 0 and ni[2] > 0 and nb_[2] % ni[1] == 0 and nb_[3] % ni[2] == 0 and ni[3] == 1)


def _comp_set_rows(p: Any) -> None:
    b, idx = _src(p, 0), _src(p, 1)
    vals = _read_f32(b)                              # (n3, n2, n1, n0)
    n3, n2, n1, _ = vals.shape
    if vals.size == 0:
        return
    rows = _view(idx)[0].astype(np.int64)            # (m2, m1, n1)
    rows = _tile(rows, (n3, n2, n1))                 # i12 = i03 % ne12, i11 = i02 % ne11
    _check_rows(rows, _ne(p)[1], "set_rows")
    i3 = np.arange(n3)[:, None, None]
    i2 = np.arange(n2)[None, :, None]
    if p.type in _FLT:
        dst = _view(p)
        if p.type == _F32:
            dst[i3, i2, rows] = vals
        elif p.type == _F16:
            dst[i3, i2, rows] = vals.astype(np.float16)
        else:
            dst[i3, i2, rows] = _f32_to_bf16(vals)
    else:
        finite = np.isfinite(vals).all()
        if not finite:
            raise ValueError(f"cannot quantize non-finite values to {_types.type_name(p.type)}")
        q = _types.quantize(np.ascontiguousarray(vals), p.type)   # (n3, n2, n1, row_size)
        _row_bytes(p)[i3, i2, rows] = q


_add("SET_ROWS", _sup_set_rows, _comp_set_rows,
     "src0 F32/F16/BF16 rows, I32/I64 indices (tiled over dims 2, 3), dst F32/F16/BF16 or "
     "Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K..Q6_K")


# --- masks and softmax -------------------------------------------------------------------------

def _diag_mask(value: float) -> Callable[[Any], None]:
    def comp(p: Any) -> None:
        n_past = int(_iparams(p)[0])
        x = _read_f32(_src(p, 0))
        n1, n0 = x.shape[-2], x.shape[-1]
        mask = np.arange(n0)[None, :] > (n_past + np.arange(n1)[:, None])
        _write(p, np.where(mask, np.float32(value), x))
    return comp


def _sup_diag_mask(p: Any) -> bool:
    return _sup_f32_same_shape(p) and int(_iparams(p)[0]) >= 0


_add("DIAG_MASK_INF", _sup_diag_mask, _diag_mask(-np.inf), "F32; op_params [n_past]")
_add("DIAG_MASK_ZERO", _sup_diag_mask, _diag_mask(0.0), "F32; op_params [n_past]")


def _sup_soft_max(p: Any) -> bool:
    a, mask, sinks = _src(p, 0), _src(p, 1), _src(p, 2)
    if a is None or a.type != _F32 or p.type != _F32 or not _same_shape(a, p):
        return False
    na = _ne(a)
    if mask is not None:
        nm = _ne(mask)
        if mask.type not in (_F32, _F16) or nm[0] != na[0] or nm[1] < na[1]:
            return False
        if nm[2] == 0 or nm[3] == 0 or na[2] % nm[2] or na[3] % nm[3]:
            return False
    if sinks is not None and (sinks.type != _F32 or _nel(sinks) < na[2]):
        return False
    return True


def _alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head ALiBi slopes as ggml computes them (float32)."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=np.float32)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    mb = np.float32(max_bias)
    m0 = np.float32(np.power(np.float64(2.0), np.float64(-mb / np.float32(n_head_log2))))
    m1 = np.float32(np.power(np.float64(2.0), np.float64(-(mb / np.float32(2.0)) / np.float32(n_head_log2))))
    h = np.arange(n_head)
    return np.where(h < n_head_log2,
                    np.power(np.float64(m0), h + 1),
                    np.power(np.float64(m1), 2 * (h - n_head_log2) + 1)).astype(np.float32)


def _comp_soft_max(p: Any) -> None:
    a, mask, sinks = _src(p, 0), _src(p, 1), _src(p, 2)
    fp = _fparams(p)
    scale, max_bias = np.float32(fp[0]), float(fp[1])
    x = _read_f32(a)                                 # (n3, n2, n1, n0)
    n3, n2, n1, n0 = x.shape
    w = x * scale
    if mask is not None:
        m = _read_f32(mask)[:, :, :n1, :]
        m = _tile(m, (n3, n2, n1, n0))
        slope = _alibi_slopes(n2, max_bias).reshape(1, n2, 1, 1)
        w = w + slope * m
    mx = w.max(axis=-1, keepdims=True) if n0 else np.full((n3, n2, n1, 1), -np.inf, np.float32)
    sk = None
    if sinks is not None:
        sk = _read_f32(sinks).reshape(-1)[:n2].reshape(1, n2, 1, 1)
        mx = np.maximum(mx, sk)
    e = _fn64(np.exp, w - mx)
    total = e.sum(axis=-1, keepdims=True, dtype=np.float64)
    if sk is not None:
        total = total + _fn64(np.exp, sk - mx).astype(np.float64)
    _write(p, e * (1.0 / total).astype(np.float32))


_add("SOFT_MAX", _sup_soft_max, _comp_soft_max,
     "F32; optional mask src1 F32/F16 (ne0 == ne00, ne1 >= ne01, tiled over dims 2, 3); "
     "op_params [scale, max_bias] (ALiBi slopes per ne2 head); optional sinks src2 F32 [ne02]")


# --- rope ----------------------------------------------------------------------------------

_ROPE_MODES = (0, lib.GGML_ROPE_TYPE_NEOX)


def _sup_rope(p: Any) -> bool:
    a, pos, ff = _src(p, 0), _src(p, 1), _src(p, 2)
    if a is None or pos is None or a.type not in (_F32, _F16) or p.type != a.type:
        return False
    if not _same_shape(a, p) or pos.type != _I32:
        return False
    ip = _iparams(p)
    n_dims, mode = int(ip[1]), int(ip[2])
    na = _ne(a)
    if mode not in _ROPE_MODES or n_dims <= 0 or n_dims % 2 or n_dims > na[0]:
        return False
    if _nel(pos) < na[2]:
        return False
    if ff is not None and (ff.type != _F32 or _nel(ff) < n_dims // 2):
        return False
    fp = _fparams(p)
    return bool(fp[5] > 0 and fp[6] != 0)


def _rope_cache(p: Any, positions: np.ndarray, sin_sign: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of shape (len(positions), n_dims/2) as ggml_rope_cache_init + rope_yarn."""
    ip, fp = _iparams(p), _fparams(p)
    n_dims, n_ctx_orig = int(ip[1]), int(ip[4])
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (np.float32(v) for v in fp[5:11])
    half = n_dims // 2
    theta_scale = np.float32(np.power(np.float64(freq_base), np.float64(np.float32(-2.0) / np.float32(n_dims))))
    theta = np.empty((positions.size, half), dtype=np.float32)
    cur = positions.astype(np.float32)
    for k in range(half):                            # float32 running product, as the CPU
        theta[:, k] = cur
        cur = cur * theta_scale
    ff_t = _src(p, 2)
    ff = _read_f32(ff_t).reshape(-1)[:half] if ff_t is not None else np.ones(half, dtype=np.float32)
    theta_extrap = theta / ff
    theta_interp = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        dims = ffi.new("float[2]")
        lib.ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, float(freq_base), float(beta_fast), float(beta_slow), dims)
        low, high = np.float32(dims[0]), np.float32(dims[1])
        y = (np.arange(half, dtype=np.float32) - low) / max(np.float32(0.001), high - low)
        ramp_mix = (_ONE - np.minimum(_ONE, np.maximum(np.float32(0), y))) * ext_factor
        theta_final = theta_interp * (_ONE - ramp_mix) + theta_extrap * ramp_mix
        mscale = mscale * (_ONE + np.float32(0.1) * np.float32(math.log(float(_ONE / freq_scale))))
    else:
        theta_final = theta_interp
    cos = _fn64(np.cos, theta_final) * mscale
    sin = _fn64(np.sin, theta_final) * mscale * np.float32(sin_sign)
    return cos, sin


def _rope(sin_sign: float) -> Callable[[Any], None]:
    def comp(p: Any) -> None:
        a = _src(p, 0)
        ip = _iparams(p)
        n_dims, mode = int(ip[1]), int(ip[2])
        x = _read_f32(a)                             # (n3, n2, n1, n0)
        n2 = x.shape[1]
        positions = _view(_src(p, 1)).reshape(-1)[:n2]
        cos, sin = _rope_cache(p, positions, sin_sign)
        c = cos.reshape(1, n2, 1, -1)
        s = sin.reshape(1, n2, 1, -1)
        out = np.array(x, dtype=np.float32, copy=True)
        half = n_dims // 2
        if mode == 0:
            x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
            out[..., 0:n_dims:2] = x0 * c - x1 * s
            out[..., 1:n_dims:2] = x0 * s + x1 * c
        else:
            x0, x1 = x[..., :half], x[..., half:n_dims]
            out[..., :half] = x0 * c - x1 * s
            out[..., half:n_dims] = x0 * s + x1 * c
        _write(p, out)
    return comp


_ROPE_NOTES = ("F32 or F16 (same type in and out); modes 0 (normal) and 2 (NeoX) only, no "
               "mrope/vision; I32 positions [ne2]; optional F32 freq_factors; YaRN ext_factor")
_add("ROPE", _sup_rope, _rope(1.0), _ROPE_NOTES)
_add("ROPE_BACK", _sup_rope, _rope(-1.0), _ROPE_NOTES + " (inverse rotation)")


# --- generators and index ops ------------------------------------------------------------------

def _sup_pad(p: Any) -> bool:
    a = _src(p, 0)
    if a is None or a.type != _F32 or p.type != _F32:
        return False
    ip = _iparams(p)
    pads = [int(v) for v in ip[:8]]
    if min(pads) < 0:
        return False
    na, nd = _ne(a), _ne(p)
    if any(nd[d] != na[d] + pads[2 * d] + pads[2 * d + 1] for d in range(4)):
        return False
    return not (ip[8] and any(n == 0 for n in na) and _nel(p) > 0)


def _comp_pad(p: Any) -> None:
    ip = _iparams(p)
    pads = [int(v) for v in ip[:8]]
    x = _read_f32(_src(p, 0))
    width = [(pads[2 * d], pads[2 * d + 1]) for d in (3, 2, 1, 0)]
    if ip[8]:   # circular: dst index i reads src index (i - lp) mod ne
        out = x
        for axis, (lp, _rp) in enumerate(width):
            n = x.shape[axis]
            idx = (np.arange(_shape(p)[axis]) - lp) % n
            out = np.take(out, idx, axis=axis)
    else:
        out = np.pad(x, width)
    _write(p, out)


_add("PAD", _sup_pad, _comp_pad, "F32; op_params [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular]")


def _sup_arange(p: Any) -> bool:
    return p.type == _F32 and _ne(p)[1:] == (1, 1, 1)


def _comp_arange(p: Any) -> None:
    fp = _fparams(p)
    start, step = np.float32(fp[0]), np.float32(fp[2])
    n = _ne(p)[0]
    _write(p, start + step * np.arange(n, dtype=np.float32))


_add("ARANGE", _sup_arange, _comp_arange, "F32 [n]; op_params [start, stop, step]: start + step*i")


def _sup_timestep(p: Any) -> bool:
    a = _src(p, 0)
    if a is None or a.type != _F32 or p.type != _F32:
        return False
    dim = int(_iparams(p)[0])
    na, nd = _ne(a), _ne(p)
    return dim > 0 and nd[0] == dim and nd[1] == na[0] and nd[2] == nd[3] == 1


def _comp_timestep(p: Any) -> None:
    ip = _iparams(p)
    dim, max_period = int(ip[0]), int(ip[1])
    half = dim // 2
    t = _read_f32(_src(p, 0)).reshape(-1)[: _ne(p)[1]]
    j = np.arange(half, dtype=np.float32)
    freq = _fn64(np.exp, (-np.float32(math.log(max_period)) * j) / np.float32(half))
    arg = t[:, None] * freq[None, :]
    out = np.zeros((t.size, dim), dtype=np.float32)
    out[:, :half] = _fn64(np.cos, arg)
    out[:, half:2 * half] = _fn64(np.sin, arg)
    if dim % 2:
        out[:, 2 * half] = 0.0
    _write(p, out[None, None])


_add("TIMESTEP_EMBEDDING", _sup_timestep, _comp_timestep, "F32 timesteps -> F32 [dim, n]; op_params [dim, max_period]")


def _sup_argsort(p: Any) -> bool:
    a = _src(p, 0)
    return (a is not None and a.type == _F32 and p.type == _I32 and _same_shape(a, p)
            and int(_iparams(p)[0]) in (lib.GGML_SORT_ORDER_ASC, lib.GGML_SORT_ORDER_DESC))


def _comp_argsort(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    desc = int(_iparams(p)[0]) == lib.GGML_SORT_ORDER_DESC
    idx = np.argsort(-x if desc else x, axis=-1, kind="stable")
    _view(p)[...] = idx.astype(np.int32)


_add("ARGSORT", _sup_argsort, _comp_argsort, "F32 -> I32 per row; op_params [order] (ties: stable)")


def _sup_top_k(p: Any) -> bool:
    a = _src(p, 0)
    if a is None or a.type != _F32 or p.type != _I32:
        return False
    na, nd = _ne(a), _ne(p)
    return nd[1:] == na[1:] and nd[0] <= na[0]


def _comp_top_k(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    k = _ne(p)[0]
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k].copy()
    if k > 1:   # ggml's CPU kernel swaps the first two to show the order is not part of the result
        idx[..., [0, 1]] = idx[..., [1, 0]]
    _view(p)[...] = idx.astype(np.int32)


_add("TOP_K", _sup_top_k, _comp_top_k,
     "F32 -> I32 [k, ...]: indices of the k largest, in descending order with the first two swapped (as the CPU)")


def _sup_fill(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type and p.type in (_F32, _F16) and _same_shape(a, p)


def _comp_fill(p: Any) -> None:
    _write(p, np.float32(_fparams(p)[0]))


_add("FILL", _sup_fill, _comp_fill, "F32 or F16; op_params [c]")


def _sup_tri(p: Any) -> bool:
    return _sup_f32_same_shape(p) and int(_iparams(p)[0]) in (
        lib.GGML_TRI_TYPE_LOWER, lib.GGML_TRI_TYPE_LOWER_DIAG,
        lib.GGML_TRI_TYPE_UPPER, lib.GGML_TRI_TYPE_UPPER_DIAG)


def _comp_tri(p: Any) -> None:
    ttype = int(_iparams(p)[0])
    x = _read_f32(_src(p, 0))
    i0 = np.arange(x.shape[-1])[None, :]
    r = np.arange(x.shape[-2])[:, None]
    keep = {lib.GGML_TRI_TYPE_LOWER: i0 < r, lib.GGML_TRI_TYPE_LOWER_DIAG: i0 <= r,
            lib.GGML_TRI_TYPE_UPPER: i0 > r, lib.GGML_TRI_TYPE_UPPER_DIAG: i0 >= r}[ttype]
    _write(p, np.where(keep, x, np.float32(0)))


_add("TRI", _sup_tri, _comp_tri, "F32; op_params [ggml_tri_type]; keeps a triangle of each ne0 x ne1 matrix")


# ---------------------------------------------------------------------------------------------
# public API


def supports(node: Any) -> bool:
    """True if :func:`compute` computes ``node`` correctly: its op is in :data:`OPS` and the
    op's types, op_params and shapes are ones that kernel handles (see ``OPS[op].notes``).

    ``node``: a :class:`pyggml.Tensor` or a raw ``struct ggml_tensor *``. Only metadata is
    looked at (types, ``ne``, ``nb``, op_params), never the data, so this can be asked before
    the graph is allocated. Never raises for a valid node; TypeError for a non-tensor.
    """
    p = _raw(node)
    impl = OPS.get(int(p.op))
    if impl is None:
        return False
    try:
        return bool(impl.supports(p))
    except (ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError):
        return False


def compute(node: Any) -> None:
    """Compute ``node`` from its sources (``node.src``) into its own data, in host memory,
    honouring ``node.nb`` (the destination may be a view or non-contiguous). View ops
    (NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE) do nothing.

    ``node``: a :class:`pyggml.Tensor` or a raw ``struct ggml_tensor *`` whose data and whose
    sources' data are readable/writable host memory. Raises ValueError if
    :func:`supports` is False for it, if a tensor has no data, if a row index is out of range
    (GET_ROWS, SET_ROWS) or if non-finite values are written to a quantized tensor;
    TypeError for a non-tensor.
    """
    p = _raw(node)
    impl = OPS.get(int(p.op))
    if impl is None or not supports(p):
        name = ffi.string(p.name).decode("utf-8", "replace") or "(unnamed)"
        srcs = [_types.type_name(s.type) for s in p.src if s != ffi.NULL]
        raise ValueError(f"numpy_ops cannot compute node {name} ({_op_name(p.op)}, "
                         f"{_types.type_name(p.type)}, srcs {srcs})")
    with np.errstate(all="ignore"):
        impl.compute(p)


def supported_op_names() -> list[str]:
    """The names of the ops in :data:`OPS` (``"ADD"``, ``"MUL_MAT"``...), sorted."""
    return sorted(impl.name for impl in OPS.values())


def _op_name(op: int) -> str:
    return ffi.string(lib.ggml_op_name(op)).decode() if 0 <= op < lib.GGML_OP_COUNT else str(op)
