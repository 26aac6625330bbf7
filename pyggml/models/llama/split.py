"""One model over several devices, as llama.cpp's two split modes do it.

``layer`` (pipeline): whole layers go to each device in proportion to the ``tensor_split``
weights (:func:`pyggml.models.common.layer_owners`); a layer's KV cache lives with it, and ggml's scheduler moves the
activations from one device to the next. Works with any devices.

``tensor`` (tensor parallelism): every layer is split over the devices by ggml's meta device
(:mod:`pyggml.backends.meta`) with :class:`TensorSplit` as its policy: the attention heads (whole
groups of KV heads with their query heads: Q, K, V rows, the KV cache, the attention output's
columns) and the FFN's inner dimension (gate and up rows, down columns); norms and embeddings are
mirrored. Each device computes its heads and its share of the FFN; the meta backend sums the
partial outputs (an all-reduce) before the residual adds. The meta backend drives devices with
memory of their own (GPUs, RPC devices), not ggml's CPU device beside a CPU backend
(:mod:`pyggml.backends.meta`).
"""
from __future__ import annotations

import re
from typing import Sequence

from pyggml.backends.meta import SplitState

from .hparams import HParams

__all__ = ["SPLIT_MODES", "parse_weights", "TensorSplit"]

SPLIT_MODES = ("layer", "tensor")


def parse_weights(text: str | None, n: int) -> list[float]:
    """``"3,1"`` -> [3.0, 1.0]: one non-negative weight per device (default: equal). Raises
    ValueError for a count other than ``n``, a negative weight or a zero sum."""
    if not text:
        return [1.0] * n
    try:
        w = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--tensor-split takes numbers separated by commas, got {text!r}") from None
    if len(w) != n or any(x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(f"--tensor-split needs {n} non-negative weights (one per device) with a "
                         f"positive sum, got {text!r}")
    return w


_LAYER = re.compile(r"blk\.\d+\.(.+)")
_CACHE = re.compile(r"cache_[kv]_l\d+")


class TensorSplit:
    """The split policy of a llama model over ``n`` devices (llama.cpp's ``split_mode=tensor``
    rules for the llama architecture): heads by whole KV-head groups, the FFN by multiples of
    ``ffn_granularity`` (a multiple of every quantization block), both in proportion to
    ``weights``. KV caches must have the flash-attention layout (``[Hkv*D, C]``)."""

    def __init__(self, hp: HParams, n: int, weights: Sequence[float] | None = None,
                 ffn_granularity: int = 128):
        D, n_gqa = hp.head_dim, hp.n_head // hp.n_head_kv
        groups = SplitState.even(0, hp.n_head_kv, n, weights=weights).segments[0][0]
        if hp.n_ff % ffn_granularity:
            ffn_granularity = 32
        ffn = SplitState.even(0, hp.n_ff, n, granularity=ffn_granularity, weights=weights).segments[0][0]
        q = [g * n_gqa * D for g in groups]
        kv = [g * D for g in groups]
        self.rules = {
            "attn_q.weight": SplitState.split(1, q), "attn_q.bias": SplitState.split(0, q),
            "attn_k.weight": SplitState.split(1, kv), "attn_k.bias": SplitState.split(0, kv),
            "attn_v.weight": SplitState.split(1, kv), "attn_v.bias": SplitState.split(0, kv),
            "attn_output.weight": SplitState.split(0, q),
            "ffn_gate.weight": SplitState.split(1, ffn), "ffn_up.weight": SplitState.split(1, ffn),
            "ffn_down.weight": SplitState.split(0, ffn),
        }
        self.cache = SplitState.split(0, kv)
        self.heads_kv, self.ffn = list(groups), list(ffn)
        #: what the split depends on (one meta device per key is enough)
        self.key = (D, n_gqa, tuple(groups), tuple(ffn))

    def __call__(self, tensor: object) -> SplitState:
        name = getattr(tensor, "name", "")
        if _CACHE.fullmatch(name):
            return self.cache
        m = _LAYER.fullmatch(name)
        if m is not None and m.group(1) in self.rules:
            return self.rules[m.group(1)]
        return SplitState.mirrored()
