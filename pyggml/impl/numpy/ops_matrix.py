"""The NumPy backend's kernels: MUL_MAT and OUT_PROD (weights dequantized exactly, float32
products)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .memory import _F32, _FLT, _PLAIN, _ne, _read_f32, _readable, _src, _write
from .table import _add

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
