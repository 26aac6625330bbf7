"""The NumPy backend's kernels: PAD, ARANGE, TIMESTEP_EMBEDDING, ARGSORT, TOP_K, FILL, TRI."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...raw import lib
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
    _shape,
    _src,
    _sup_f32_same_shape,
    _view,
    _write,
)
from .table import _add

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


def _op_param0(p: Any) -> int:
    """The sub-op of ARGSORT (ggml_sort_order) and TRI (ggml_tri_type): op_params[0]."""
    return int(_iparams(p)[0])


def _sup_argsort(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == _F32 and p.type == _I32 and _same_shape(a, p)


def _comp_argsort(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    desc = int(_iparams(p)[0]) == lib.GGML_SORT_ORDER_DESC
    idx = np.argsort(-x if desc else x, axis=-1, kind="stable")
    _view(p)[...] = idx.astype(np.int32)


_add("ARGSORT", _sup_argsort, _comp_argsort, "F32 -> I32 per row; op_params [order] (ties: stable)",
     variant=_op_param0, variants=(lib.GGML_SORT_ORDER_ASC, lib.GGML_SORT_ORDER_DESC))


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


def _comp_tri(p: Any) -> None:
    ttype = int(_iparams(p)[0])
    x = _read_f32(_src(p, 0))
    i0 = np.arange(x.shape[-1])[None, :]
    r = np.arange(x.shape[-2])[:, None]
    keep = {lib.GGML_TRI_TYPE_LOWER: i0 < r, lib.GGML_TRI_TYPE_LOWER_DIAG: i0 <= r,
            lib.GGML_TRI_TYPE_UPPER: i0 > r, lib.GGML_TRI_TYPE_UPPER_DIAG: i0 >= r}[ttype]
    _write(p, np.where(keep, x, np.float32(0)))


_add("TRI", _sup_f32_same_shape, _comp_tri,
     "F32; op_params [ggml_tri_type]; keeps a triangle of each ne0 x ne1 matrix",
     variant=_op_param0, variants=(lib.GGML_TRI_TYPE_LOWER, lib.GGML_TRI_TYPE_LOWER_DIAG,
                                   lib.GGML_TRI_TYPE_UPPER, lib.GGML_TRI_TYPE_UPPER_DIAG))
