"""The NumPy backend's kernels: NORM, RMS_NORM, L2_NORM, GROUP_NORM."""
from __future__ import annotations

from typing import Any

import numpy as np

from .cpu_math import _ONE
from .memory import _fparams, _iparams, _read_f32, _src, _sup_f32_same_shape, _write
from .table import _add

# --- normalisation ---------------------------------------------------------------------------

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
