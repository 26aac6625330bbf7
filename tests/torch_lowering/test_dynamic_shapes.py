"""torch.compile(backend="pyggml") with dynamic shapes: a dynamo graph of symbolic sizes is
partitioned once and lowered at each call's sizes, so that every call is computed by ggml, with
no more dynamo compilations than ``backend="eager"`` needs for the same calls (``"aot_eager"``
with ``dynamic=True``); sizes whose lowering a condition refuses run that call in torch, with a
warning."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import torch._dynamo  # noqa: E402
from torch import nn  # noqa: E402
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend  # noqa: E402

from pyggml.raw import lib  # noqa: E402
from pyggml.torch_lowering.backend import compile_fx  # noqa: E402


class Encoder(nn.Module):
    """Embedding, linear, GELU, LayerNorm, mean over the sequence: (B, T) ids -> (B, 32)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.lin = nn.Linear(32, 32)
        self.ln = nn.LayerNorm(32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        return self.ln(nn.functional.gelu(self.lin(x)) + x).mean(dim=1)


def _calls(fn, shapes):
    """(outputs, whether ggml computed in each call) for ids of each (B, T)."""
    torch.manual_seed(1)
    outs, on_ggml = [], []
    with torch.no_grad():
        for shape in shapes:
            ids = torch.randint(0, 100, shape)
            before = lib.pyggml_compute_ns()
            outs.append((ids, fn(ids)))
            on_ggml.append(lib.pyggml_compute_ns() > before)
    return outs, on_ggml


@pytest.mark.parametrize("how", ["default", "dynamic=True", "mark_dynamic", "dynamic=False"])
def test_every_shape_is_computed_by_ggml(how):
    torch.manual_seed(0)
    model = Encoder().eval()
    shapes = [(2, n) for n in range(5, 25)] + [(3, 7), (4, 30)]
    compiles = 0

    def counting(gm, example_inputs, **kw):
        nonlocal compiles
        compiles += 1
        return compile_fx(gm, example_inputs, options={"weights": "f32"})

    kwargs = {"dynamic": True} if how == "dynamic=True" else {"dynamic": False} if how == "dynamic=False" else {}
    # dynamic=True also makes Python floats inputs (LayerNorm's eps): AOT autograd, which the
    # backend runs, specializes them and dynamo compiles once more, as for backend="aot_eager"
    eager = CompileCounter() if how != "dynamic=True" else CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    if how == "dynamic=False":
        torch._dynamo.config.cache_size_limit = 64   # every shape its own graph, as eager's
    try:
        ref = torch.compile(model, backend=eager, **kwargs)
        fn = torch.compile(model, backend=counting, **kwargs)
        if how == "mark_dynamic":
            def marked(ids, f=fn):
                torch._dynamo.mark_dynamic(ids, 1)
                return f(ids)
            outs, on_ggml = _calls(marked, shapes)
        else:
            outs, on_ggml = _calls(fn, shapes)
        torch._dynamo.reset()
        _calls(ref if how != "mark_dynamic" else (lambda ids: (torch._dynamo.mark_dynamic(ids, 1), ref(ids))[1]),
               shapes)
    finally:
        torch._dynamo.reset()
        torch._dynamo.config.cache_size_limit = 8
    assert all(on_ggml), [s for s, ok in zip(shapes, on_ggml) if not ok]
    with torch.no_grad():
        for ids, got in outs:
            torch.testing.assert_close(got, model(ids), rtol=1e-4, atol=1e-5)
    assert compiles == eager.frame_count, (compiles, eager.frame_count)
    if how != "dynamic=False":
        assert compiles <= 3   # static, dynamic sequence length, dynamic batch too (eager's)


def test_a_size_a_lowering_refuses_runs_in_torch_with_a_warning(monkeypatch):
    """A lowering whose condition holds for the sizes the graph was partitioned at but not for
    one a later call brings (here GELU made to refuse 7 tokens): that call computes the
    partition holding it in torch, with a warning the first time only; every result is eager
    torch's and the other sizes run on ggml."""
    from pyggml.torch_lowering import table
    from pyggml.torch_lowering.layout import val

    gelu = table.TABLE[torch.ops.aten.gelu.default]
    monkeypatch.setitem(table.TABLE, torch.ops.aten.gelu.default, gelu._replace(
        check=lambda node: "7 tokens" if val(node).shape[1] == 7 else gelu.check(node)))
    torch.manual_seed(0)
    model = Encoder().eval()
    torch._dynamo.reset()
    fn = torch.compile(model, backend="pyggml", dynamic=True, options={"weights": "f32"})
    warned = []
    try:
        with torch.no_grad():
            for n in (5, 6, 7, 7, 8):
                ids = torch.randint(0, 100, (2, n))
                before = lib.pyggml_compute_ns()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    got = fn(ids)
                torch.testing.assert_close(got, model(ids), rtol=1e-4, atol=1e-5)
                if n != 7:
                    assert lib.pyggml_compute_ns() > before, n
                warned += [(n, str(w.message)) for w in caught if "runs in torch" in str(w.message)]
    finally:
        torch._dynamo.reset()
    assert [n for n, _ in warned] == [7], warned
    assert "7 tokens" in warned[0][1]


def test_auto_weights_are_bf16_where_the_cpu_has_its_products():
    """The default ``weights="auto"``: BF16 on the CPU where ggml has AVX512-BF16 kernels (else
    F32), except in a graph that writes into its inputs (a KV cache); an encoder's outputs stay
    within cosine 0.9999 of eager float32."""
    from pyggml.torch_lowering.backend import Options

    bf16 = bool(lib.ggml_cpu_has_avx512_bf16())
    assert Options().weights == "auto" and Options().weight_type() == ("bf16" if bf16 else "f32")
    assert Options().weight_type(writes_inputs=True) == "f32"
    assert Options(weights="auto", device="CUDA0").weight_type() == "f32"
    torch.manual_seed(0)
    model = Encoder().eval()
    torch._dynamo.reset()
    try:
        fn = torch.compile(model, backend="pyggml")
        with torch.no_grad():
            ids = torch.randint(0, 100, (3, 9))
            got, want = fn(ids), model(ids)
    finally:
        torch._dynamo.reset()
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert float(cos.min()) >= 0.9999, cos


def test_what_stays_in_torch_is_reported_once_with_its_reason(caplog, monkeypatch):
    """Each compile says (logger pyggml.torch_lowering, INFO) how many nodes ggml takes, and a
    reason a node stays in torch the first time it is met."""
    import logging

    from pyggml.torch_lowering import backend

    monkeypatch.setattr(backend, "_reported", set())

    class WithErf(nn.Module):
        def forward(self, x):
            return torch.special.erf(x) * 2 + 1

    caplog.set_level(logging.INFO, logger="pyggml.torch_lowering")
    with torch.no_grad():
        for n in (3, 4):   # two compilations (the second of symbolic sizes): one report of erf
            torch._dynamo.reset()
            torch.compile(WithErf(), backend="pyggml")(torch.randn(n, 4))
    torch._dynamo.reset()
    said = [r.getMessage() for r in caplog.records if r.name == "pyggml.torch_lowering"]
    assert said and all(m.startswith("pyggml lowers") for m in said)
    assert sum("aten.erf.default stays in torch: aten.erf.default has no lowering" in m for m in said) == 1, said
