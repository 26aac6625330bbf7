"""Scaled-dot-product attention through torch.compile(backend="pyggml"): one
ggml_flash_attn_ext node by default (``options={"attention": "flash"}``: ggml's CPU kernel
computes many queries in F16 tiles), the float32 products with ``"exact"``; no mask, a float
mask, a bool key-padding mask and a causal mask, against eager torch."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch._dynamo  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from pyggml.torch_lowering import backend  # noqa: E402
from pyggml.torch_lowering.backend import compile_fx  # noqa: E402


def _computed(model, args, options, monkeypatch):
    """(result, the ggml nodes of the graphs it computed) of ``model(*args)`` compiled with
    ``options``."""
    fused = []
    lower = backend.lower_module

    def spy(*a, **kw):
        fused.append(lower(*a, **kw))
        return fused[-1]

    monkeypatch.setattr(backend, "lower_module", spy)
    torch._dynamo.reset()
    try:
        out = torch.compile(model, backend="pyggml", dynamic=False, options=options)(*args)
    finally:
        torch._dynamo.reset()
    return out, [n for f in fused for m in f.modules() if hasattr(m, "lowered")
                 for e in [m.lowered.cache.latest] if e is not None for n in e.graph.nodes]


def _nodes(model, args, options, monkeypatch):
    """(result, the ggml ops of the graphs it computed) of ``model(*args)`` compiled with
    ``options``."""
    out, nodes = _computed(model, args, options, monkeypatch)
    return out, {n.op_name for n in nodes}


class Attention(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, pad):
        if self.kind == "none":
            return F.scaled_dot_product_attention(q, k, v)
        if self.kind == "float":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :] * -1e4)
        if self.kind == "bool":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :] < 0.5)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("kind", ["none", "float", "bool", "causal"])
@pytest.mark.parametrize("attention, tol", [("flash", 2e-3), ("exact", 2e-5)])
def test_attention_matches_eager(kind, attention, tol, monkeypatch):
    torch.manual_seed(0)
    B, H, L, E = 2, 4, 40, 32              # 40 queries: the CPU kernel's F16 tiles
    q, k, v = (torch.randn(B, H, L, E) for _ in range(3))
    pad = torch.zeros(B, L)
    pad[1, 30:] = 1.0                      # the second sequence's last 10 keys are padding
    model = Attention(kind)
    with torch.no_grad():
        want = model(q, k, v, pad)
        got, ops = _nodes(model, (q, k, v, pad), {"attention": attention, "threads": 2}, monkeypatch)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert ("FLASH_ATTN_EXT" in ops) == (attention == "flash") and ("SOFT_MAX" in ops) == (attention == "exact"), ops


def test_a_bad_attention_option_is_refused():
    with pytest.raises(ValueError, match="attention"):
        compile_fx(torch.fx.symbolic_trace(torch.nn.Identity()), [torch.zeros(1)], options={"attention": "fast"})


class ProjectedAttention(torch.nn.Module):
    """Attention as transformers writes it: heads split from [B, L, H*E] by view + transpose,
    so a sequence's rows follow the previous sequence's in memory."""

    def __init__(self, kind: str, H: int = 4):
        super().__init__()
        self.kind, self.H = kind, H

    def forward(self, x, y, pad):
        B, L, D = x.shape
        S = y.shape[1]
        q = x.view(B, L, self.H, D // self.H).transpose(1, 2)
        k = y.view(B, S, self.H, D // self.H).transpose(1, 2)
        v = (y * 0.5).view(B, S, self.H, D // self.H).transpose(1, 2)
        mask = None
        if self.kind == "float":
            mask = pad[:, None, None, :] * -1e4
        elif self.kind == "bool":
            mask = pad[:, None, None, :] < 0.5
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.kind == "causal")


@pytest.mark.parametrize("kind, B, L, S, group", [
    (kind, *shape) for shape in [(8, 12, 12, 8), (6, 16, 20, 6), (5, 16, 16, 5), (3, 16, 16, 1), (4, 64, 64, 1)]
    for kind in ["none", "float", "bool", "causal"] if kind != "causal" or shape[1] == shape[2]])
def test_short_sequences_share_a_flash_attention_block_on_the_cpu(kind, B, L, S, group, monkeypatch):
    """On the CPU, G sequences of fewer than FLASH_ATTN_TILE_ROWS queries are one block of G*L
    query rows in ggml_flash_attn_ext (the CPU kernel's tiled path), G the least divisor of B
    that makes as many rows (none for 3 of 16: one block each), the block's mask keeping each
    sequence to its own keys; the result is eager's (a causal mask where keys and queries are
    as many)."""
    torch.manual_seed(1)
    x, y = torch.randn(B, L, 64), torch.randn(B, S, 64)
    pad = torch.zeros(B, S)
    pad[1, S - 5:] = 1.0                   # the second sequence's last 5 keys are padding
    model = ProjectedAttention(kind)
    with torch.no_grad():
        want = model(x, y, pad)
        got, nodes = _computed(model, (x, y, pad), {"threads": 2}, monkeypatch)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    rows = [n.src[0].ne[1] for n in nodes if n.op_name == "FLASH_ATTN_EXT"]
    assert rows == [group * L], rows
