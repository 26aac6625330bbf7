"""Tensors made from nothing but their arguments: ``arange``, ``full``, ``zeros``, ``ones``,
``scalar_tensor``, ``linspace``, ``eye``, the ``*_like`` / ``new_*`` forms and ``fill``. Their values are
known when the graph is built: torch computes them once and they become a constant input."""
from __future__ import annotations

from typing import Any, Callable, cast

import numpy as np
import torch
from torch import fx

from ..core.tensor import Tensor
from .graph import Builder
from .layout import INDEX_DTYPES, val
from .table import Val, args_of, kw_of, register

aten = torch.ops.aten


def _creation_check(node: fx.Node) -> str | None:
    device = kw_of(node).get("device")
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        return f"a tensor made on {device}"
    if val(node).dtype in INDEX_DTYPES and not _fits_i32(node):
        return "integers outside int32's range (ggml holds them as I32)"
    return None


def _fits_i32(node: fx.Node) -> bool:
    """Whether an integer constant's arguments keep its values within int32 (the bounds and
    fill values among them)."""
    nums = [a for a in list(args_of(node)) + list(kw_of(node).values()) if isinstance(a, (int, float))
            and not isinstance(a, bool)]
    return all(-2**31 <= a < 2**31 for a in nums)


def _fold(b: Builder, node: fx.Node, *args: Any, **kwargs: Any) -> Tensor:
    def plain(x: Any) -> Any:
        if isinstance(x, Val):   # the *_like forms read only their argument's shape
            return torch.empty(x.shape)
        return x
    kw = {k: plain(v) for k, v in kwargs.items() if k not in ("device", "pin_memory")}
    values = cast(Callable[..., torch.Tensor], node.target)(*[plain(a) for a in args], **kw)
    if values.dtype in INDEX_DTYPES:   # position ids and the like: I32
        return b.constant(values.detach().numpy(), np.int32)
    return b.constant(values.detach().numpy())


register(aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default, aten.zeros.default,
         aten.ones.default, aten.scalar_tensor.default, aten.linspace.default, aten.eye.default,
         aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.new_zeros.default,
         aten.new_ones.default, aten.new_full.default, aten.fill.Scalar,
         notes="a constant input (the values torch computes when the graph is built; integers as I32)",
         check=_creation_check, int_results=True)(_fold)
