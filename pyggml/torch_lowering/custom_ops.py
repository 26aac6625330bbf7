"""pyggml's own torch ops, which :mod:`~pyggml.torch_lowering.rewrites` puts in an ATen graph in
place of a pattern of ATen ops that one ggml op computes: each has a torch implementation
(the same ATen ops as the pattern, so a graph part left in torch computes what eager torch
does) and a fake one (shapes, for dynamic-shape tracing). Their ggml lowerings are in the
``ops_*`` modules.

* ``torch.ops.pyggml.rope(x, positions, inv_freq, scale)``: the rotary embedding as
  transformers writes it (``rotate_half``), ``x * cos + rotate_half(x) * sin`` with
  ``cos, sin = cos(e) * scale, sin(e) * scale``, ``e = cat([f, f], -1)``, ``f = positions.float()
  * inv_freq``. ``x``: (B, H, T, D) float32, NumPy order; ``positions``: an integer tensor of
  shape (1, T, 1) (the same positions for every sequence of the batch); ``inv_freq``: float32
  (D / 2,), the angle per position of each pair of dims (radians); ``scale``: transformers'
  ``attention_scaling``. Lowered to ``ggml_rope_ext`` (NEOX mode).
"""
from __future__ import annotations

import torch

__all__ = ["rope"]


def _rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
    f = positions.to(torch.float32) * inv_freq
    e = torch.cat([f, f], -1)
    cos = (e.cos() * scale).unsqueeze(1)
    sin = (e.sin() * scale).unsqueeze(1)
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def _rope_fake(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


rope = torch.library.custom_op("pyggml::rope", mutates_args=())(_rope)
rope.register_fake(_rope_fake)
