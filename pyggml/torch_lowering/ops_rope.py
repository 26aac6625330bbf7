"""Rotary position embeddings: ``torch.ops.pyggml.rope`` (what
:func:`~pyggml.torch_lowering.rewrites.rotary_embeddings` makes of transformers'
``apply_rotary_pos_emb``) as one ``ggml_rope_ext`` node.

ggml's rope turns each pair of dims i, i + D/2 (NEOX mode) of a row by the angle position /
freq_factors[i] x freq_base^(-2i/D); with freq_base 1 and freq_factors 1 / inv_freq that is
torch's position x inv_freq, for any inv_freq (default, linear-scaled or llama-3 ones alike).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import fx

from ..core.tensor import Tensor
from ..enums import RopeType
from . import custom_ops  # noqa: F401  (registers torch.ops.pyggml.rope)
from .graph import Builder
from .table import Val, register


@register(torch.ops.pyggml.rope.default, index_args=(1,),
          notes="ggml_rope_ext (NEOX mode, freq_factors 1 / inv_freq) between two permutes")
def _rope(b: Builder, node: fx.Node, x: Val, positions: Val, inv_freq: Val, scale: float) -> Tensor:
    T, D = x.shape[2], x.shape[3]
    ctx = b.ctx
    heads_first = ctx.permute(x.t, 0, 2, 1, 3)                        # ne [D, H, T, B]: rows by position
    pos = b.reshape(positions.t, [T])                                  # I32 [T]
    factors = ctx.div(b.constant(np.ones(D // 2, np.float32)), b.reshape(inv_freq.t, [D // 2]))
    out = ctx.rope(heads_first, pos, D, mode=RopeType.NEOX, freq_base=1.0, freq_scale=1.0, ext_factor=0.0,
                   attn_factor=float(scale), beta_fast=0.0, beta_slow=0.0, freq_factors=factors)
    return ctx.permute(out, 0, 2, 1, 3)                                # ne [D, T, H, B]
