"""The rewrites of pyggml.torch_lowering.rewrites made with torch's subgraph rewriter, against
eager torch: the rotary embedding as transformers writes it becomes torch.ops.pyggml.rope (one
ggml_rope_ext), only where its tables come from positions x inv_freq; grouped-query attention
with fewer K/V heads and a dynamic KV cache's empty start stay on ggml."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.nn import functional as F

from pyggml.torch_lowering import (
    custom_ops,
    explain,
)


def _compiled(model, dynamic=False):
    torch._dynamo.reset()
    return torch.compile(model, backend="pyggml", dynamic=dynamic, options={"weights": "f32"})


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Rotary(torch.nn.Module):
    """transformers' rotary embedding (LlamaRotaryEmbedding + apply_rotary_pos_emb) on q and k
    of shape (1, H, T, D) at positions start..start+T-1; ``inv_freq`` a buffer, as there.
    ``partial``: only the first half of each head turned (Phi-3's partial_rotary_factor)."""

    def __init__(self, D=16, base=10000.0, scale=1.0, partial=False, inv_freq=None):
        super().__init__()
        rd = D // 2 if partial else D
        if inv_freq is None:
            inv_freq = 1.0 / base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd)
        self.register_buffer("inv_freq", inv_freq)
        self.scale, self.rd = scale, rd

    def forward(self, q, k, start):
        T = q.shape[2]
        pos = torch.arange(T).unsqueeze(0) + start                  # (1, T) int64
        freqs = pos[:, :, None].float() * self.inv_freq              # (1, T, rd/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = (emb.cos() * self.scale).unsqueeze(1), (emb.sin() * self.scale).unsqueeze(1)
        rd = self.rd
        outs = []
        for x in (q, k):
            rot, rest = x[..., :rd], x[..., rd:]
            turned = rot * cos + _rotate_half(rot) * sin
            outs.append(torch.cat((turned, rest), -1) if rest.shape[-1] else turned)
        return outs[0] @ outs[1].transpose(-1, -2)


@pytest.mark.parametrize("kw", [{}, {"scale": 0.75, "base": 500.0}, {"partial": True},
                                {"inv_freq": torch.tensor([1.0, 0.3, 0.05, 0.01, 1e-3, 2e-4, 5e-5, 1e-5])}])
def test_a_rotary_embedding_becomes_one_rope_op(kw):
    """Default, scaled, partial and arbitrary (llama-3-like) frequencies: two pyggml.rope nodes,
    no cos or sin left, the result within 1e-4 of eager at positions up to 300."""
    torch.manual_seed(0)
    model = Rotary(**kw).eval()
    q, k = torch.randn(1, 4, 6, 16), torch.randn(1, 4, 6, 16)
    start = torch.tensor(294)
    e = explain(model, q, k, start)
    assert e.ggml.get("pyggml.rope.default") == 2, e
    assert not any(name.startswith(("aten.cos", "aten.sin")) for name in list(e.ggml) + list(e.torch)), e
    with torch.no_grad():
        got, want = _compiled(model)(q, k, start), model(q, k, start)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_a_rotary_embedding_across_shapes():
    """Under dynamic shapes (symbolic T) the rewrite holds and every length matches eager."""
    torch.manual_seed(1)
    model = Rotary().eval()
    f = _compiled(model, dynamic=True)
    for T in (3, 5, 9):
        q, k = torch.randn(1, 2, T, 16), torch.randn(1, 2, T, 16)
        with torch.no_grad():
            np.testing.assert_allclose(f(q, k, torch.tensor(7)).numpy(), model(q, k, torch.tensor(7)).numpy(),
                                       rtol=1e-4, atol=1e-4)


class GivenTables(torch.nn.Module):
    """The rotate-half form with cos and sin given as inputs: nothing proves them to be a
    rotation's, so nothing is rewritten."""

    def forward(self, x, cos, sin):
        return x * cos + _rotate_half(x) * sin


def test_tables_not_made_from_positions_are_left_alone():
    torch.manual_seed(2)
    x, cos, sin = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    e = explain(GivenTables(), x, cos, sin)
    assert "pyggml.rope.default" not in e.ggml and not e.torch, e
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(GivenTables())(x, cos, sin).numpy(),
                                   GivenTables()(x, cos, sin).numpy(), rtol=1e-5, atol=1e-6)


def test_the_rope_op_computes_in_torch_what_the_pattern_does():
    """torch.ops.pyggml.rope's torch implementation (a graph part left in torch runs it) equals
    the ATen ops it replaces."""
    torch.manual_seed(3)
    model = Rotary(scale=0.5)
    q = torch.randn(1, 3, 4, 16)
    pos = (torch.arange(4) + 11)[None, :, None]
    freqs = pos.float() * model.inv_freq
    emb = torch.cat((freqs, freqs), -1)
    ref = q * (emb.cos() * 0.5).unsqueeze(1) + _rotate_half(q) * (emb.sin() * 0.5).unsqueeze(1)
    torch.testing.assert_close(custom_ops.rope(q, pos, model.inv_freq, 0.5), ref, rtol=0, atol=0)


class GQA(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v):
        if self.kind == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("kind", ["plain", "causal"])
def test_attention_with_fewer_kv_heads_runs_on_ggml(kind):
    """enable_gqa: q head h reads k/v head h // 3, as ggml's kernels broadcast them."""
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    e = explain(GQA(kind), q, k, v)
    assert not e.torch, e
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(GQA(kind))(q, k, v).numpy(), GQA(kind)(q, k, v).numpy(),
                                   rtol=2e-3, atol=2e-3)


class GrowingCache(torch.nn.Module):
    """A dynamic cache's first step: the keys so far are an empty tensor, concatenated with the
    new ones."""

    def forward(self, k):
        past = torch.zeros(1, 2, 0, 8)
        return torch.cat([past, k], -2) * 2.0


def test_an_empty_tensor_in_a_concatenation_is_dropped():
    k = torch.randn(1, 2, 3, 8)
    e = explain(GrowingCache(), k)
    assert not e.torch, e
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(GrowingCache())(k).numpy(), GrowingCache()(k).numpy())


class PositionIds(torch.nn.Module):
    """BERT's position and token-type ids: int64 buffers sliced and expanded, an arange, all
    read as embedding indices; and an int64 view returned."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(16, 8)
        self.register_buffer("position_ids", torch.arange(16).expand((1, -1)))
        self.register_buffer("token_type_ids", torch.zeros(1, 16, dtype=torch.long))

    def forward(self, x):
        T = x.shape[1]
        ids = self.position_ids[:, :T].expand(x.shape[0], T)
        types = self.token_type_ids[:, :T].expand(x.shape[0], T)
        steps = torch.arange(T).unsqueeze(0)
        return x + self.pos(ids) + self.pos(types) + self.pos(steps), ids.reshape(-1)


def test_integer_views_and_constants_run_on_ggml():
    """Slices, expands and views of int64 buffers and an int64 arange are I32 in ggml: nothing
    stays in torch, and an int64 result comes back int64."""
    torch.manual_seed(5)
    model = PositionIds().eval()
    x = torch.randn(2, 5, 8)
    e = explain(model, x)
    assert not e.torch, e
    with torch.no_grad():
        got, want = _compiled(model)(x), model(x)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-6, atol=1e-6)
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])


class IntsFromTorch(torch.nn.Module):
    """Integers computed in torch (int64 arithmetic ggml does not take) and then only moved:
    the move stays in torch too, as their values need not fit I32."""

    def forward(self, ids, table):
        big = ids * (1 << 40) // (1 << 40)        # int64 arithmetic: torch
        return table[big.reshape(-1)]


def test_integers_computed_in_torch_are_not_moved_in_ggml():
    ids, table = torch.tensor([[1, 3], [0, 2]]), torch.randn(4, 3)
    e = explain(IntsFromTorch(), ids, table)
    assert any("computed in torch" in why for why in e.torch.values()), e
    with torch.no_grad():
        torch.testing.assert_close(_compiled(IntsFromTorch())(ids, table), IntsFromTorch()(ids, table))


class Positions(torch.nn.Module):
    """A static KV cache's positions, as transformers writes them: ``arange(T) + offset`` (an
    int64 input) picks embedding rows, and ``offset + 1`` comes back as an integer result."""

    def forward(self, x, offset, table):
        pos = torch.arange(x.shape[1]) + offset
        return x + table[pos], offset + 1


def test_small_integer_sums_run_on_ggml_and_large_ones_in_torch():
    """Sums of small integers (inputs checked at each call, constants) are exact in ggml's
    float32: the graph is all on ggml. An input beyond 2^23 runs that call in torch, with a
    warning: exact there too."""
    from pyggml.raw import lib
    model = Positions()
    x, table = torch.randn(1, 5, 3), torch.randn(40, 3)
    e = explain(model, x, torch.tensor(7), table)
    assert not e.torch, e
    compiled = _compiled(model)
    for offset in (0, 7, 35):
        before = lib.pyggml_compute_ns()
        got, want = compiled(x, torch.tensor(offset), table), model(x, torch.tensor(offset), table)
        assert lib.pyggml_compute_ns() > before
        torch.testing.assert_close(got[0], want[0])
        assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])
    shifted = _compiled(Shifted())
    x = torch.randn(3)
    torch.testing.assert_close(shifted(x, torch.tensor(9)), Shifted()(x, torch.tensor(9)))
    big = torch.tensor(2**24 + 1)   # float32 holds 2^24 and 2^24 + 2, not 2^24 + 1
    with pytest.warns(UserWarning, match="beyond the 8388608"):
        got = shifted(x, big)
    assert torch.equal(got[1], torch.arange(3) + 2**24 + 1)
    # an input of several integers: its least and largest are checked
    # (the first such call warns; each runs in torch, exact)
    counters = _compiled(lambda x, i: (x * 2, i + 1))
    for i in (torch.tensor([0, 5, -(2**23)]), torch.tensor([0, 5, 2**24 + 1]), torch.tensor([-(2**24) - 1, 0, 1]),
              torch.tensor([2**23, 0, 1])):
        before = lib.pyggml_compute_ns()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = counters(x, i)
        assert torch.equal(got[1], i + 1) and got[1].dtype == torch.int64
        assert (lib.pyggml_compute_ns() > before) == bool(i.abs().max() <= 2**23), i


class Shifted(torch.nn.Module):
    def forward(self, x, offset):
        return x * 2, torch.arange(x.shape[0]) + offset


def test_integer_sums_beyond_float32s_exact_range_and_integers_in_float_sums_stay_in_torch():
    """An input's integers are checked to hold at most 2^23 at each call: a sum of two of them
    is exact in float32 (at most 2^24), of three it may not be."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from pyggml.torch_lowering import why_not
    gm = make_fx(lambda i, x: ((i + i) + 1, (i + i) + i, x + i))(torch.arange(4), torch.randn(4))
    why = {n.name: why_not(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert why["add"] is None and why["add_1"] is not None, why   # 2^24 + 1
    assert "beyond 16777216" in why["add_1"] and "beyond 16777216" in why["add_3"], why
    assert "integer operand" in why["add_4"], why


class Masked(torch.nn.Module):
    """transformers' masks, written out: a padding mask read at [batch, kv] by constant index
    tensors, a causal mask compared from positions, the two and-ed and made additive."""

    def forward(self, x, mask):
        B, S = x.shape[:2]
        kv = torch.arange(S)
        pad = mask.bool()[torch.arange(B)[:, None], kv[None, :]]
        allowed = pad[:, None, :] & (kv[None, :] <= kv[:, None])[None]
        bias = torch.where(allowed, 0.0, float("-inf"))
        return torch.softmax(x @ x.transpose(1, 2) + bias, -1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_masks_made_from_sizes_and_inputs_run_on_ggml(dynamic):
    from pyggml.raw import lib
    model = Masked()
    x, mask = torch.randn(2, 5, 4), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert not explain(model, x, mask).torch
    compiled = _compiled(model, dynamic=dynamic)
    for B, S in ((2, 5), (2, 7), (3, 6)):
        x = torch.randn(B, S, 4)
        mask = (torch.arange(S)[None, :] < torch.randint(1, S + 1, (B, 1))).long()
        before = lib.pyggml_compute_ns()
        torch.testing.assert_close(compiled(x, mask), model(x, mask))
        assert lib.pyggml_compute_ns() > before
