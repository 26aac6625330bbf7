"""The NumPy backend's kernels: ROPE and ROPE_BACK (normal and NeoX modes)."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...raw import ffi, lib
from .cpu_math import _ONE
from .memory import (
    _F16,
    _F32,
    _I32,
    _fn64,
    _fparams,
    _iparams,
    _ne,
    _nel,
    _read_f32,
    _same_shape,
    _src,
    _view,
    _write,
)
from .table import _add

# --- rope ----------------------------------------------------------------------------------

_ROPE_MODES = (0, lib.GGML_ROPE_TYPE_NEOX)


def _rope_mode(p: Any) -> int:
    """The rope mode (op_params[2]): normal (0) and NEOX are computed."""
    return int(_iparams(p)[2])


def _sup_rope(p: Any) -> bool:
    a, pos, ff = _src(p, 0), _src(p, 1), _src(p, 2)
    if a is None or pos is None or a.type not in (_F32, _F16) or p.type != a.type:
        return False
    if not _same_shape(a, p) or pos.type != _I32:
        return False
    ip = _iparams(p)
    n_dims, n_offs = int(ip[1]), int(ip[15])
    na = _ne(a)
    if n_dims <= 0 or n_dims % 2 or n_offs < 0 or n_offs % 2 or n_offs + n_dims > na[0]:
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


def rotate(x: Any, out: Any, c: Any, s: Any, mode: int, o: int, n_dims: int) -> None:
    """RoPE's rotation of dims ``[o, o + n_dims)`` of ``x`` (last axis ``ne[0]``) into ``out`` (a
    copy of ``x``), by angles of cosine ``c`` and sine ``s`` (broadcast over the pairs): mode 0
    pairs neighbours (2i, 2i+1), NeoX (mode 2) pairs i with i + n_dims/2. Any arrays with
    NumPy's slicing and arithmetic (NumPy, torch: the torch backend's ROPE uses it too)."""
    half = n_dims // 2
    if mode == 0:
        x0, x1 = x[..., o:o + n_dims:2], x[..., o + 1:o + n_dims:2]
        out[..., o:o + n_dims:2] = x0 * c - x1 * s
        out[..., o + 1:o + n_dims:2] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., o:o + half], x[..., o + half:o + n_dims]
        out[..., o:o + half] = x0 * c - x1 * s
        out[..., o + half:o + n_dims] = x0 * s + x1 * c


def _rope(sin_sign: float) -> Callable[[Any], None]:
    def comp(p: Any) -> None:
        a = _src(p, 0)
        ip = _iparams(p)
        n_dims, mode = int(ip[1]), int(ip[2])
        o = int(ip[15])                              # ggml >= 0.25: rotate dims [o, o + n_dims)
        x = _read_f32(a)                             # (n3, n2, n1, n0)
        n2 = x.shape[1]
        positions = _view(_src(p, 1)).reshape(-1)[:n2]
        cos, sin = _rope_cache(p, positions, sin_sign)
        c = cos.reshape(1, n2, 1, -1)
        s = sin.reshape(1, n2, 1, -1)
        out = np.array(x, dtype=np.float32, copy=True)
        rotate(x, out, c, s, mode, o, n_dims)
        _write(p, out)
    return comp


_ROPE_NOTES = ("F32 or F16 (same type in and out); modes 0 (normal) and 2 (NeoX) only, no "
               "mrope/vision; I32 positions [ne2]; optional F32 freq_factors; YaRN ext_factor; "
               "the rotated dims' offset (op_params[15], ggml_rope_set_offset)")
_add("ROPE", _sup_rope, _rope(1.0), _ROPE_NOTES, variant=_rope_mode, variants=_ROPE_MODES)
_add("ROPE_BACK", _sup_rope, _rope(-1.0), _ROPE_NOTES + " (inverse rotation)",
     variant=_rope_mode, variants=_ROPE_MODES)
