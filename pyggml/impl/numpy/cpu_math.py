"""Scalar math as ggml's CPU backend does it (``ggml-cpu/vec.h``, ``unary-ops.cpp``): the
GELU tables, erf, SiLU, softplus and friends, so that the NumPy backend returns the CPU's
values (see :mod:`pyggml.impl.numpy.table` for the numerics)."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...raw import lib
from .memory import _F32, _f32, _fn64

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
