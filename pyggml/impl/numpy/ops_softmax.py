"""The NumPy backend's kernels: DIAG_MASK_INF / DIAG_MASK_ZERO and SOFT_MAX (mask, scale,
ALiBi)."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .memory import (
    _F16,
    _F32,
    _fn64,
    _fparams,
    _iparams,
    _ne,
    _nel,
    _read_f32,
    _same_shape,
    _src,
    _sup_f32_same_shape,
    _tile,
    _write,
)
from .table import _add

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
