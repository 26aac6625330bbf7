"""The NumPy backend's kernels: reductions (SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, COUNT_EQUAL)
and REPEAT / REPEAT_BACK / CONCAT."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...raw import lib
from .memory import (
    _F32,
    _FLT,
    _I32,
    _I64,
    _PLAIN,
    _can_repeat,
    _iparams,
    _ne,
    _nel,
    _read_f32,
    _same_shape,
    _shape,
    _src,
    _tile,
    _view,
    _write,
)
from .table import _add

# --- reductions ----------------------------------------------------------------------------

def _sup_sum(p: Any) -> bool:
    a = _src(p, 0)
    # the CPU kernel sums each row as contiguous whatever nb[0] is (wrong for a permuted
    # src); ggml's CPU is the reference, so only rows with unit stride are claimed
    return (a is not None and a.type in _FLT and p.type in _FLT and _nel(p) == 1
            and int(a.nb[0]) == lib.ggml_type_size(a.type))


def _comp_sum(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    _write(p, np.float32(x.sum(dtype=np.float64)))


_add("SUM", _sup_sum, _comp_sum, "F32/F16/BF16 -> scalar F32/F16/BF16 (float64 accumulation)")


def _sup_rows_reduce(types: frozenset[int]) -> Callable[[Any], bool]:
    def sup(p: Any) -> bool:
        a = _src(p, 0)
        if a is None or a.type not in types or p.type not in types:
            return False
        na, nd = _ne(a), _ne(p)
        return nd[0] == 1 and nd[1:] == na[1:]
    return sup


def _comp_sum_rows(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    _write(p, x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32))


def _comp_mean(p: Any) -> None:
    a = _src(p, 0)
    x = _read_f32(a)
    s = x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    _write(p, s / np.float32(_ne(a)[0]))


_add("SUM_ROWS", _sup_rows_reduce(_FLT), _comp_sum_rows, "F32/F16/BF16, ne [n, a, b, c] -> [1, a, b, c]")
_add("MEAN", _sup_rows_reduce(frozenset({_F32})), _comp_mean, "F32, ne [n, a, b, c] -> [1, a, b, c]")


def _sup_cumsum(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _same_shape(a, p)


def _comp_cumsum(p: Any) -> None:
    x = _read_f32(_src(p, 0))
    _write(p, np.cumsum(x, axis=-1, dtype=np.float32))  # sequential float32, as the CPU


_add("CUMSUM", _sup_cumsum, _comp_cumsum, "F32, along ne[0], float32 running sum")


def _sup_argmax(p: Any) -> bool:
    a = _src(p, 0)
    if a is None or a.type != _F32 or p.type != _I32:
        return False
    na = _ne(a)
    return na[2] == na[3] == 1 and _ne(p) == (na[1], 1, 1, 1)


def _comp_argmax(p: Any) -> None:
    x = _read_f32(_src(p, 0))[0, 0]              # (ne1, ne0)
    n0 = x.shape[1]
    out = np.empty(x.shape[0], dtype=np.int64)
    nan_rows = np.isnan(x).any(axis=1)
    clean = ~nan_rows
    if n0 == 0:
        out[:] = 0
    else:
        # last index of the maximum (ggml_vec_argmax_f32 updates on equality)
        out[clean] = n0 - 1 - np.argmax(x[clean, ::-1], axis=1)
        for r in np.nonzero(nan_rows)[0]:       # replay the C loop where NaNs break max()
            m, idx = -np.inf, 0
            for i, v in enumerate(x[r]):
                m = m if m > v else v
                if m == v:
                    idx = i
            out[r] = idx
    _view(p)[...] = out.astype(np.int32).reshape(_shape(p))


_add("ARGMAX", _sup_argmax, _comp_argmax, "F32 matrix -> I32 [ne1]; the last index of the maximum")


def _sup_count_equal(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    return (a is not None and b is not None and a.type == b.type == _I32
            and _same_shape(a, b) and p.type == _I64 and _nel(p) == 1)


def _comp_count_equal(p: Any) -> None:
    n = np.count_nonzero(_view(_src(p, 0)) == _view(_src(p, 1)))
    _view(p)[...] = np.int64(n)


_add("COUNT_EQUAL", _sup_count_equal, _comp_count_equal, "I32, I32 -> I64 scalar")


# --- repeat / concat -------------------------------------------------------------------------

def _sup_repeat(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type and a.type in _PLAIN and _can_repeat(a, p)


def _comp_repeat(p: Any) -> None:
    if _nel(p):
        _view(p)[...] = _tile(_view(_src(p, 0)), _shape(p))


_add("REPEAT", _sup_repeat, _comp_repeat, "any plain type (F32/F16/BF16/F64/I8..I64), src tiled to dst")


def _sup_repeat_back(p: Any) -> bool:
    a = _src(p, 0)
    return a is not None and a.type == p.type == _F32 and _can_repeat(p, a)


def _comp_repeat_back(p: Any) -> None:
    x = _read_f32(_src(p, 0)).astype(np.float64)
    n3, n2, n1, n0 = _shape(p)
    s3, s2, s1, s0 = x.shape
    y = x.reshape(s3 // n3, n3, s2 // n2, n2, s1 // n1, n1, s0 // n0, n0).sum(axis=(0, 2, 4, 6))
    _write(p, y)


_add("REPEAT_BACK", _sup_repeat_back, _comp_repeat_back, "F32; sums the tiles of src into dst")


def _sup_concat(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    if a is None or b is None or not (a.type == b.type == p.type) or a.type not in _PLAIN:
        return False
    dim = int(_iparams(p)[0])
    if not 0 <= dim < 4:
        return False
    na, nb_, nd = _ne(a), _ne(b), _ne(p)
    return all((nd[d] == na[d] + nb_[d]) if d == dim else (nd[d] == na[d] == nb_[d]) for d in range(4))


def _comp_concat(p: Any) -> None:
    dim = int(_iparams(p)[0])
    if _nel(p):
        _view(p)[...] = np.concatenate([_view(_src(p, 0)), _view(_src(p, 1))], axis=3 - dim)


_add("CONCAT", _sup_concat, _comp_concat, "any plain type (one type); op_params [dim]")
