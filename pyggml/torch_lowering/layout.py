"""How torch's tensors map onto ggml's: shapes and ``ne``, dims and axes, dtypes and types.

A torch shape ``(d0, ..., d{n-1})`` is ggml ``ne [d{n-1}, ..., d0]`` (the last torch dim varies
fastest, ggml's ``ne[0]``); torch dim ``d`` of an ``n``-dim tensor is ggml axis ``n - 1 - d``. A
0-dim torch tensor is ggml ``ne [1]``. ggml has 4 dims at most.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..enums import GGMLType

__all__ = ["DTYPES", "INDEX_DTYPES", "MAX_DIMS", "ne_of", "axis_of", "val", "shape_of", "is_static", "tiles"]

#: torch dtype -> the ggml type of lowered tensors of that dtype
DTYPES: dict[torch.dtype, GGMLType] = {torch.float32: GGMLType.F32}
#: dtypes of index tensors (token ids, rows), given to ggml as I32
INDEX_DTYPES = (torch.int64, torch.int32)
MAX_DIMS = 4


def ne_of(shape: Sequence[int]) -> list[int]:
    """ggml ``ne`` of torch ``shape``."""
    return [int(d) for d in reversed(shape)] or [1]


def axis_of(dim: int, ndim: int) -> int:
    """ggml axis of torch dim ``dim`` (negative counts from the end) of an ``ndim``-dim tensor."""
    return ndim - 1 - (dim % ndim if ndim else 0)


def val(x: Any) -> Any:
    """The fake tensor torch recorded for FX node ``x`` (``node.meta["val"]``), or None."""
    meta = getattr(x, "meta", None)
    return meta.get("val") if meta else None


def is_static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, int) for d in shape)


def shape_of(x: Any) -> tuple[int, ...]:
    """The static shape of node ``x`` (its fake tensor's)."""
    return tuple(int(d) for d in val(x).shape)


def tiles(small: Sequence[int], big: Sequence[int]) -> bool:
    """Whether torch shape ``small`` broadcasts to ``big`` by NumPy's rule with only size-1 (or
    equal) dims: then ggml's tiling of a second operand gives the same result."""
    s = (1,) * (len(big) - len(small)) + tuple(small)
    return all(a == c or a == 1 for a, c in zip(s, big))
