"""The NumPy backend's kernels: GET_ROWS and SET_ROWS (row indices checked)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import types as _types
from .memory import (
    _BF16,
    _F16,
    _F32,
    _F64,
    _FLT,
    _I8,
    _I16,
    _I32,
    _I64,
    _PLAIN,
    _QUANT_DST,
    _bf16_to_f32,
    _f32_to_bf16,
    _ne,
    _read_f32,
    _readable,
    _row_bytes,
    _rows_packed,
    _src,
    _tile,
    _view,
    _write,
)
from .table import _add

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
