"""The NumPy backend's kernels: view ops (nothing to compute) and DUP / CPY / CONT (type
conversions, any layout)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .memory import (
    _F32,
    _FLT,
    _I32,
    _PLAIN,
    _QUANT_DST,
    _is_quant,
    _nel,
    _read_f32,
    _readable,
    _row_bytes,
    _rows_packed,
    _shape,
    _src,
    _view,
    _write,
)
from .table import _add

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
