"""The NumPy backend's kernels: binary element-wise ops (ggml broadcasting: src1 tiled over
src0), ADD1, ACC/SET, the unary ops with an op of their own, CLAMP, LEAKY_RELU, SCALE, UNARY and
GLU."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...raw import lib
from .cpu_math import (
    _ONE,
    _UNARY_FNS,
    _UNARY_SAME_TYPE,
    _f16_table,
    _gelu_erf,
    _gelu_quick_formula,
    _gelu_tanh,
    _silu,
)
from .memory import (
    _F16,
    _F32,
    _FLT,
    _I32,
    _PLAIN,
    _can_repeat,
    _f32,
    _fn64,
    _fparams,
    _iparams,
    _ne,
    _nel,
    _read_f32,
    _same_shape,
    _src,
    _tile,
    _view,
    _write,
)
from .table import _add

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


def _sup_acc_set(types: frozenset[int]) -> Callable[[Any], bool]:
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
    if int(lib.ggml_get_unary_op(p)) in _UNARY_SAME_TYPE:
        return a.type == p.type and a.type in (_F32, _F16)
    return a.type in _FLT and p.type in _FLT


def _comp_unary(p: Any) -> None:
    a = _src(p, 0)
    fn = _UNARY_FNS[int(lib.ggml_get_unary_op(p))]
    _write(p, fn(_read_f32(a), a.type, _fparams(p)))


_add("UNARY", _sup_unary, _comp_unary,
     "all 22 ggml_unary_op; GELU/GELU_QUICK/GELU_ERF/SILU: F32->F32 or F16->F16 "
     "(GELU, GELU_QUICK through ggml's F16 tables); the others F32/F16/BF16 -> F32/F16/BF16",
     variant=lib.ggml_get_unary_op, variants=_UNARY_FNS)


# --- GLU -----------------------------------------------------------------------------------

def _swiglu_oai(x: np.ndarray, g: np.ndarray, t: int, fp: np.ndarray) -> np.ndarray:
    alpha, limit = np.float32(fp[2]), np.float32(fp[3])
    xc = np.minimum(x, limit)
    yc = np.clip(g, -limit, limit)
    return xc / (_ONE + _fn64(np.exp, alpha * (-xc))) * (yc + _ONE)


def _swiglu_clamp(x: np.ndarray, g: np.ndarray, t: int, fp: np.ndarray) -> np.ndarray:
    """ggml_compute_forward_swiglu_clamp: silu(min(x, limit)) * clamp(g, -limit, limit)."""
    limit = np.float32(fp[3])
    return _silu(np.minimum(x, limit)) * np.clip(g, -limit, limit)


def _geglu(x: np.ndarray, g: np.ndarray, t: int, fp: np.ndarray) -> np.ndarray:
    y = _f16_table(_gelu_tanh, x)
    if t == _F32:   # ggml_vec_geglu_f32 cut-offs
        return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x * g, y * g))
    return y * g


#: GGML_GLU_OP_* -> f(x float32, g float32, src type, float op_params) -> float32: the GLU ops
#: this backend computes (an op a newer ggml adds is not claimed until it is here)
_GLU_FNS: dict[int, Callable[[np.ndarray, np.ndarray, int, np.ndarray], np.ndarray]] = {
    lib.GGML_GLU_OP_REGLU: lambda x, g, t, fp: np.where(x > 0, x * g, np.float32(0)),
    lib.GGML_GLU_OP_GEGLU: _geglu,
    lib.GGML_GLU_OP_SWIGLU: lambda x, g, t, fp: _silu(x) * g,
    lib.GGML_GLU_OP_SWIGLU_OAI: _swiglu_oai,
    lib.GGML_GLU_OP_GEGLU_ERF: lambda x, g, t, fp: _gelu_erf(x) * g,
    lib.GGML_GLU_OP_GEGLU_QUICK: lambda x, g, t, fp: _f16_table(_gelu_quick_formula, x) * g,
    lib.GGML_GLU_OP_SWIGLU_CLAMP: _swiglu_clamp,
}


def _sup_glu(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    if a is None or a.type not in (_F32, _F16) or p.type != a.type:
        return False
    if int(lib.ggml_get_glu_op(p)) == lib.GGML_GLU_OP_SWIGLU_OAI and a.type != _F32:
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
    _write(p, _GLU_FNS[int(ip[0])](_f32(x), _f32(g), a.type, fp))


_add("GLU", _sup_glu, _comp_glu,
     "REGLU, GEGLU, SWIGLU, SWIGLU_OAI (F32), GEGLU_ERF, GEGLU_QUICK, SWIGLU_CLAMP; F32 or F16 "
     "(one type); fused (halves of src0, swapped flag) or split (src1)",
     variant=lib.ggml_get_glu_op, variants=_GLU_FNS)
