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


def _nodes(model, args, options, monkeypatch):
    """(result, the ggml ops of the graphs it computed) of ``model(*args)`` compiled with
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
    ops = {n.op_name for f in fused for m in f.modules() if hasattr(m, "lowered")
           for e in [m.lowered.cache.latest] if e is not None for n in e.graph.nodes}
    return out, ops


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
