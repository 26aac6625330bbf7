"""The torch backend's training kernels: CROSS_ENTROPY_LOSS, CROSS_ENTROPY_LOSS_BACK and
OPT_STEP_ADAMW (``ggml-cpu/ops.cpp``). The CPU reads these tensors as contiguous rows, so only
contiguous F32 tensors are claimed (there the CPU's result is the mathematical one)."""
from __future__ import annotations

from typing import Any

import torch

from ...raw import lib
from ..numpy.memory import _F32, _nel, _same_shape, _src
from .table import Step, _add, eager


def _contiguous_f32(*ts: Any) -> bool:
    return all(t is not None and t.type == _F32 and bool(lib.ggml_is_contiguous(t)) for t in ts)


def _sup_ce(p: Any) -> bool:
    a, b = _src(p, 0), _src(p, 1)
    return _contiguous_f32(a, b) and _same_shape(a, b) and p.type == _F32 and _nel(p) == 1


def _b_ce(p: Any, v: Any) -> Step | None:
    a, b = _src(p, 0), _src(p, 1)
    X, Y, D = v.tensor(a), v.tensor(b), v.tensor(p)
    nc = X.shape[-1]
    if nc == 0:
        return lambda: D.zero_()
    nr = X.numel() // nc

    def step() -> None:
        logp = torch.log_softmax(X.reshape(nr, nc), dim=-1)
        D.copy_((logp * Y.reshape(nr, nc)).sum().reshape(D.shape) * (-1.0 / nr))
    return step


_add("CROSS_ENTROPY_LOSS", _sup_ce, _b_ce,
     "F32 logits, F32 labels (contiguous, one shape) -> F32 scalar: -Σ labels·log_softmax(logits) / rows")


def _sup_ce_back(p: Any) -> bool:
    g, a, b = _src(p, 0), _src(p, 1), _src(p, 2)
    return (_contiguous_f32(g, a, b, p) and _nel(g) == 1 and _same_shape(a, b)
            and _same_shape(a, p))


def _b_ce_back(p: Any, v: Any) -> Step | None:
    g, a, b = _src(p, 0), _src(p, 1), _src(p, 2)
    G, X, Y, D = v.tensor(g), v.tensor(a), v.tensor(b), v.tensor(p)
    nc = X.shape[-1]
    if D.numel() == 0:
        return None
    nr = X.numel() // nc

    def step() -> None:
        sm = torch.softmax(X.reshape(nr, nc), dim=-1)
        D.copy_(((sm - Y.reshape(nr, nc)) * (G.reshape(()) / nr)).reshape(D.shape))
    return step


_add("CROSS_ENTROPY_LOSS_BACK", _sup_ce_back, _b_ce_back,
     "F32 grad (scalar), logits, labels (contiguous) -> F32: (softmax(logits) - labels)·grad / rows")


def _sup_adamw(p: Any) -> bool:
    w, g, m, s, prm = (_src(p, i) for i in range(5))
    return (_contiguous_f32(w, g, m, s, prm) and _same_shape(w, g) and _same_shape(w, m)
            and _same_shape(w, s) and _nel(prm) == 7)


def _b_adamw(p: Any, v: Any) -> Step | None:
    W, G, M, S, P = (v.tensor(_src(p, i)) for i in range(5))
    if W.numel() == 0:
        return None

    def step() -> None:
        alpha, beta1, beta2, eps, wd, beta1h, beta2h = P.reshape(-1).tolist()
        M.mul_(beta1).add_(G * (1.0 - beta1))
        S.mul_(beta2).add_(G * G * (1.0 - beta2))
        mh = M * beta1h
        vh = torch.sqrt(S * beta2h) + eps
        W.mul_(1.0 - alpha * wd).sub_(alpha * mh / vh)
    return eager(step)                                   # reads the parameters to the host


_add("OPT_STEP_ADAMW", _sup_adamw, _b_adamw,
     "F32 weights, grads, m, v (contiguous, one shape), F32 params [7]: "
     "[alpha, beta1, beta2, eps, wd, beta1h, beta2h]; updates weights, m and v in place")
