"""The torch backend's kernels: reductions (SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, COUNT_EQUAL),
sorting (ARGSORT, TOP_K) and generators (ARANGE, TIMESTEP_EMBEDDING, FILL, TRI)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ...raw import lib
from ..numpy.memory import _fparams, _iparams, _ne, _src
from .table import Step, _add, eager, numpy_rule


def _acc(device: torch.device) -> torch.dtype:
    """The accumulation type of sums: float64 (as the CPU's ggml_float), float32 on MPS."""
    return torch.float32 if device.type == "mps" else torch.float64


def _b_sum(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    acc = _acc(D.device)
    return lambda: D.copy_(X.to(acc).sum().reshape(D.shape))


def _b_sum_rows(mean: bool) -> Any:
    def build(p: Any, v: Any) -> Step | None:
        X, D = v.tensor(_src(p, 0)), v.tensor(p)
        if D.numel() == 0:
            return None
        acc, n = _acc(D.device), X.shape[-1]
        if mean:   # float32 sum, then divided in float32 (as the CPU)
            return lambda: D.copy_(X.to(acc).sum(dim=-1, keepdim=True).float() / float(n))
        return lambda: D.copy_(X.to(acc).sum(dim=-1, keepdim=True))
    return build


_add("SUM", numpy_rule("SUM"), _b_sum, "F32/F16/BF16 -> scalar F32/F16/BF16 (float64 accumulation)")
_add("SUM_ROWS", numpy_rule("SUM_ROWS"), _b_sum_rows(False), "F32/F16/BF16, ne [n, a, b, c] -> [1, a, b, c]")
_add("MEAN", numpy_rule("MEAN"), _b_sum_rows(True), "F32, ne [n, a, b, c] -> [1, a, b, c]")


def _b_cumsum(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    return lambda: D.copy_(torch.cumsum(X, dim=-1))


_add("CUMSUM", numpy_rule("CUMSUM"), _b_cumsum, "F32, along ne[0]")


def _argmax_row_c(row: list[float]) -> int:
    """ggml_vec_argmax_f32's loop, for rows with NaN."""
    m, idx = -math.inf, 0
    for i, x in enumerate(row):
        m = m if m > x else x
        if m == x:
            idx = i
    return idx


def _b_argmax(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    n0 = X.shape[-1]

    def step() -> None:
        x = X[0, 0]                                      # (ne1, ne0)
        if n0 == 0:
            D.zero_()
            return
        # the last index of the maximum (the C loop updates on equality)
        out = (n0 - 1) - torch.argmax(torch.flip(x, dims=(-1,)), dim=-1)
        nan_rows = torch.isnan(x).any(dim=-1)
        if bool(nan_rows.any()):
            for r in torch.nonzero(nan_rows).flatten().tolist():
                out[r] = _argmax_row_c(x[r].tolist())
        D.copy_(out.reshape(D.shape))
    return eager(step)                                   # reads whether a row has NaN


_add("ARGMAX", numpy_rule("ARGMAX"), _b_argmax, "F32 matrix -> I32 [ne1]; the last index of the maximum")


def _b_count_equal(p: Any, v: Any) -> Step | None:
    A, B, D = v.tensor(_src(p, 0)), v.tensor(_src(p, 1)), v.tensor(p)
    return lambda: D.copy_((A == B).sum().reshape(D.shape))


_add("COUNT_EQUAL", numpy_rule("COUNT_EQUAL"), _b_count_equal, "I32, I32 -> I64 scalar")


def _op_param0(p: Any) -> int:
    return int(_iparams(p)[0])


def _b_argsort(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    desc = _op_param0(p) == lib.GGML_SORT_ORDER_DESC
    return lambda: D.copy_(torch.argsort(X, dim=-1, descending=desc, stable=True))


_add("ARGSORT", numpy_rule("ARGSORT"), _b_argsort, "F32 -> I32 per row; op_params [order] (ties: stable)",
     variant=_op_param0, variants=(lib.GGML_SORT_ORDER_ASC, lib.GGML_SORT_ORDER_DESC))


def _b_top_k(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    k = D.shape[-1]
    order = list(range(k))
    if k > 1:   # ggml's CPU kernel swaps the first two (the order is not part of the result)
        order[0], order[1] = 1, 0
    perm = torch.tensor(order, device=D.device)

    def step() -> None:
        idx = torch.argsort(X, dim=-1, descending=True, stable=True)[..., :k]
        D.copy_(idx.index_select(-1, perm))
    return step


_add("TOP_K", numpy_rule("TOP_K"), _b_top_k,
     "F32 -> I32 [k, ...]: indices of the k largest, descending, the first two swapped (as the CPU)")


def _b_arange(p: Any, v: Any) -> Step | None:
    D = v.tensor(p)
    if D.numel() == 0:
        return None
    fp = _fparams(p)
    start, step_ = np.float32(fp[0]), np.float32(fp[2])
    values = torch.from_numpy(start + step_ * np.arange(D.shape[-1], dtype=np.float32)).to(D.device)
    return lambda: D.copy_(values)


_add("ARANGE", numpy_rule("ARANGE"), _b_arange, "F32 [n]; op_params [start, stop, step]: start + step*i")


def _b_timestep(p: Any, v: Any) -> Step | None:
    T, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    ip = _iparams(p)
    dim, max_period = int(ip[0]), int(ip[1])
    half = dim // 2
    n = _ne(p)[1]
    j = np.arange(half, dtype=np.float32)
    freq = torch.from_numpy(np.exp((-np.float32(math.log(max_period)) * j) / np.float32(half)
                                   ).astype(np.float32)).to(D.device)

    def step() -> None:
        t = T.reshape(-1)[:n].float()
        arg = t[:, None] * freq[None, :]
        out = torch.zeros((n, dim), dtype=torch.float32, device=D.device)
        out[:, :half] = torch.cos(arg)
        out[:, half:2 * half] = torch.sin(arg)
        D.copy_(out.reshape(D.shape))
    return step


_add("TIMESTEP_EMBEDDING", numpy_rule("TIMESTEP_EMBEDDING"), _b_timestep,
     "F32 timesteps -> F32 [dim, n]; op_params [dim, max_period]")


def _b_fill(p: Any, v: Any) -> Step | None:
    D = v.tensor(p)
    if D.numel() == 0:
        return None
    c = float(_fparams(p)[0])
    return lambda: D.fill_(c)


_add("FILL", numpy_rule("FILL"), _b_fill, "F32 or F16; op_params [c]")


def _b_tri(p: Any, v: Any) -> Step | None:
    X, D = v.tensor(_src(p, 0)), v.tensor(p)
    if D.numel() == 0:
        return None
    n1, n0 = X.shape[-2], X.shape[-1]
    i0, r = torch.arange(n0)[None, :], torch.arange(n1)[:, None]
    keep = {lib.GGML_TRI_TYPE_LOWER: i0 < r, lib.GGML_TRI_TYPE_LOWER_DIAG: i0 <= r,
            lib.GGML_TRI_TYPE_UPPER: i0 > r, lib.GGML_TRI_TYPE_UPPER_DIAG: i0 >= r}[_op_param0(p)].to(D.device)
    return lambda: D.copy_(torch.where(keep, X, 0.0))


_add("TRI", numpy_rule("TRI"), _b_tri, "F32; op_params [ggml_tri_type]; keeps a triangle of each ne0 x ne1 matrix",
     variant=_op_param0, variants=(lib.GGML_TRI_TYPE_LOWER, lib.GGML_TRI_TYPE_LOWER_DIAG,
                                   lib.GGML_TRI_TYPE_UPPER, lib.GGML_TRI_TYPE_UPPER_DIAG))
