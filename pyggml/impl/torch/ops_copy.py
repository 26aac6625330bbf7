"""The torch backend's kernels that move data: view ops (nothing to compute), DUP / CPY / CONT,
GET_ROWS / SET_ROWS (row indices read and checked when the step runs: on the host, or on the
device where the views have ``checks``, :mod:`pyggml.impl.torch.checks`), REPEAT, REPEAT_BACK,
CONCAT and PAD."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..numpy.memory import _FLT, _is_quant, _iparams, _ne, _nel, _src
from .quant import DEQUANT, dequantize
from .table import Step, _add, eager, numpy_rule

# --- view ops: nothing to compute -------------------------------------------------------------


def _sup_true(p: Any) -> bool:
    return True


def _b_nothing(p: Any, v: Any) -> Step | None:
    return None


for _name in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
    _add(_name, _sup_true, _b_nothing, "no computation (data is the source's)")


# --- DUP / CPY / CONT -------------------------------------------------------------------------

_dup_rule = numpy_rule("DUP")


def _sup_dup(p: Any) -> bool:
    s = _src(p, 0)
    if not _dup_rule(p):
        return False
    if s.type == p.type:
        return True
    if _is_quant(p.type):
        return False                       # no quantizer here
    return not _is_quant(s.type) or s.type in DEQUANT


def _b_dup(p: Any, v: Any) -> Step | None:
    s = _src(p, 0)
    if _nel(p) == 0:
        return None
    if _is_quant(p.type):                  # the same quantized type: the blocks in order
        S, D = v.rows(s), v.rows(p)
        return lambda: D.copy_(S.reshape(-1).reshape(D.shape))
    D = v.tensor(p)
    if _is_quant(s.type):
        S, t, n = v.rows(s), s.type, _ne(s)[0]
        return lambda: D.copy_(dequantize(S, t, n).reshape(D.shape))
    S = v.tensor(s)
    return lambda: D.copy_(S.reshape(D.shape))


_DUP_NOTES = ("same type: any plain type, any layout; quantized same type with packed rows. "
              "F32/F16/BF16 -> F32/F16/BF16, F32 <-> I32, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 -> F32 "
              "(no quantized destinations)")
for _name in ("DUP", "CPY", "CONT"):
    _add(_name, _sup_dup, _b_dup, _DUP_NOTES)


# --- rows -------------------------------------------------------------------------------------

def _check_rows(rows: torch.Tensor, n: int, what: str) -> None:
    if rows.numel() and bool(((rows < 0) | (rows >= n)).any()):
        raise ValueError(f"{what}: row index out of range [0, {n})")


def _row_guard(v: Any, n: int, what: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], bool]:
    """(guard, on the host): how a step checks its row indices against [0, ``n``) before using
    them (``rows = guard(rows)``). Without ``v.checks`` (or with no rows to index), on the host:
    ValueError at once, and the step is :func:`~pyggml.impl.torch.table.eager`. With them, on the
    device: the flag of the error is set and the indices are clamped into range."""
    checks = v.checks
    if checks is None or n == 0:
        def host(rows: torch.Tensor) -> torch.Tensor:
            _check_rows(rows, n, what)
            return rows
        return host, True
    flag = checks.flag(f"{what}: row index out of range [0, {n})")

    def device(rows: torch.Tensor) -> torch.Tensor:
        flag.logical_or_(((rows < 0) | (rows >= n)).any())
        return rows.clamp(0, n - 1)
    return device, False


_get_rows_rule = numpy_rule("GET_ROWS")


def _sup_get_rows(p: Any) -> bool:
    a = _src(p, 0)
    return _get_rows_rule(p) and (not _is_quant(a.type) or a.type in DEQUANT)


def _b_get_rows(p: Any, v: Any) -> Step | None:
    a, idx = _src(p, 0), _src(p, 1)
    n0, n1 = _ne(a)[0], _ne(a)[1]
    D = v.tensor(p)
    if D.numel() == 0:
        return None
    quant = _is_quant(a.type)
    A = v.rows(a) if quant else v.tensor(a)
    index = v.tensor(idx)[0]                             # (n12, n11, n10)
    i12 = torch.arange(index.shape[0], device=D.device)[:, None, None]
    i11 = torch.arange(index.shape[1], device=D.device)[None, :, None]
    t = a.type
    guard, on_host = _row_guard(v, n1, "get_rows")

    def step() -> None:
        rows = guard(index.long())
        picked = A[i12, i11, rows]                       # (n12, n11, n10, ne0 or row bytes)
        D.copy_(dequantize(picked, t, n0) if quant else picked)
    return eager(step) if on_host else step


_add("GET_ROWS", _sup_get_rows, _b_get_rows,
     "src0 F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 (-> F32/F16/BF16) or I32 (-> I32); "
     "src1 I32 rows ne [k, ne02, ne03]")

_set_rows_rule = numpy_rule("SET_ROWS")


def _sup_set_rows(p: Any) -> bool:
    return _set_rows_rule(p) and p.type in _FLT


def _b_set_rows(p: Any, v: Any) -> Step | None:
    b, idx = _src(p, 0), _src(p, 1)
    B, D = v.tensor(b), v.tensor(p)
    if B.numel() == 0:
        return None
    index = v.tensor(idx)[0]                             # (m2, m1, n1)
    n3, n2 = B.shape[0], B.shape[1]
    reps = (n3 // index.shape[0], n2 // index.shape[1], 1)
    i3 = torch.arange(n3, device=D.device)[:, None, None]
    i2 = torch.arange(n2, device=D.device)[None, :, None]
    guard, on_host = _row_guard(v, _ne(p)[1], "set_rows")

    def step() -> None:
        rows = index.long()
        if reps != (1, 1, 1):
            rows = rows.repeat(reps)                     # i12 = i03 % ne12, i11 = i02 % ne11
        D[i3, i2, guard(rows)] = B.to(D.dtype)
    return eager(step) if on_host else step


_add("SET_ROWS", _sup_set_rows, _b_set_rows,
     "src0 F32/F16/BF16 rows, I32/I64 indices (tiled over dims 2, 3), dst F32/F16/BF16")


# --- repeat / concat / pad -------------------------------------------------------------------

def _b_repeat(p: Any, v: Any) -> Step | None:
    S, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    reps = tuple(d // s for d, s in zip(D.shape, S.shape))
    return lambda: D.copy_(S.repeat(reps))


_add("REPEAT", numpy_rule("REPEAT"), _b_repeat, "any plain type, src tiled to dst")


def _b_repeat_back(p: Any, v: Any) -> Step | None:
    S, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    n3, n2, n1, n0 = D.shape
    s3, s2, s1, s0 = S.shape
    if S.numel() == 0:
        return lambda: D.zero_()
    shape = (s3 // n3, n3, s2 // n2, n2, s1 // n1, n1, s0 // n0, n0)
    return lambda: D.copy_(S.double().reshape(shape).sum(dim=(0, 2, 4, 6)))


_add("REPEAT_BACK", numpy_rule("REPEAT_BACK"), _b_repeat_back, "F32; sums the tiles of src into dst")


def _b_concat(p: Any, v: Any) -> Step | None:
    A, B, D = v.tensor(_src(p, 0)), v.tensor(_src(p, 1)), v.tensor(p)
    if D.numel() == 0:
        return None
    axis = 3 - int(_iparams(p)[0])
    return lambda: D.copy_(torch.cat([A, B], dim=axis))


_add("CONCAT", numpy_rule("CONCAT"), _b_concat, "any plain type (one type); op_params [dim]")


def _b_pad(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    ip = _iparams(p)
    pads = [int(x) for x in ip[:8]]
    if not ip[8]:
        return lambda: D.copy_(F.pad(X, pads))
    # circular: dst index i reads src index (i - lp) mod ne, per axis
    index = [(axis, (torch.arange(D.shape[axis]) - pads[2 * (3 - axis)]) % X.shape[axis])
             for axis in range(4)]
    index = [(axis, i.to(D.device)) for axis, i in index]

    def step() -> None:
        out = X
        for axis, i in index:
            out = out.index_select(axis, i)
        D.copy_(out)
    return step


_add("PAD", numpy_rule("PAD"), _b_pad, "F32; op_params [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular]")

