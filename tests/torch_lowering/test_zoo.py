"""Every architecture of the zoo (tests/torch_lowering/zoo.py: small random-weight transformers
models) compiled with torch.compile(backend="pyggml"): its last hidden state within 1e-4 of eager
torch (float32 weights), no graph break, and at least as many of its ATen nodes on ggml as
docs/torch_zoo.rst (written by scripts/torch_lowering_zoo.py) says; the decoder-only ones
generating with transformers' static cache, their decode steps compiled: eager's greedy tokens
and logits."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402
from zoo import CAUSAL, ZOO, coverage  # noqa: E402


def _table() -> dict[str, int]:
    """architecture -> the nodes on ggml the docs' table records."""
    text = (ROOT / "docs" / "torch_zoo.rst").read_text(encoding="utf-8")
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"\* - (.+)\n     - (\d+) / \d+", text)}


@pytest.mark.parametrize("name", list(ZOO))
def test_architecture(name):
    s = coverage(name)
    assert s["max_diff"] <= 1e-4, s
    assert s["breaks"] == 0, s
    recorded = _table().get(name)
    assert recorded is not None, f"{name} is not in docs/torch_zoo.rst: run python scripts/torch_lowering_zoo.py"
    assert s["ggml"] >= recorded, f"{name}: {s['ggml']} nodes on ggml, the table says {recorded}: {s['torch']}"


@pytest.mark.parametrize("name", list(CAUSAL))
def test_generation_with_a_static_cache(name):
    """transformers' generate with a StaticCache and ``compile_config`` (backend "pyggml"): the
    decode steps run whole on ggml (no node left in torch; its compute time grows), the greedy tokens are eager's up to the
    first step whose two best logits eager puts within 1e-3 (a near tie that float order may
    turn), and the logits of those steps within 1e-4."""
    import torch
    from transformers import CompileConfig, StaticCache

    from pyggml.raw import lib
    from pyggml.torch_lowering import backend
    from pyggml.torch_lowering.partition import explain_graph

    torch.manual_seed(0)
    model = CAUSAL[name]().eval()
    with torch.no_grad():   # weights 8x their initial spread: attention that picks positions, not a mean
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(1))

    def generate(**kw):
        cache = StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False, cache=cache,
                                 pad_token_id=0, output_scores=True, return_dict_in_generate=True, **kw)
        return out.sequences[0, 6:].tolist(), torch.stack(out.scores)[:, 0]

    want, want_scores = generate(disable_compile=True)
    config = CompileConfig(backend="pyggml", dynamic=False, mode=None, options={"attention": "exact"})
    config._compile_all_devices = True      # transformers compiles on GPUs only unless told
    torch._dynamo.reset()
    before = lib.pyggml_compute_ns()
    lower, in_torch = backend.lower_module, {}

    def counting(gm, *args, **kw):
        in_torch.update(explain_graph(backend.rewrite(gm)).torch)
        return lower(gm, *args, **kw)

    backend.lower_module = counting
    try:
        got, got_scores = generate(compile_config=config)
    finally:
        backend.lower_module = lower
        torch._dynamo.reset()
    assert lib.pyggml_compute_ns() > before, "no decode step ran on ggml"
    assert not in_torch, f"decode step nodes left in torch: {in_torch}"
    top2 = want_scores.topk(2, dim=-1).values
    near = [i for i in range(len(want)) if float(top2[i, 0] - top2[i, 1]) < 1e-3]
    n = near[0] + 1 if near else len(want)
    assert got[:n] == want[:n], (got, want)
    scale = float(want_scores[want_scores.isfinite()].abs().max())
    torch.testing.assert_close(got_scores[:n], want_scores[:n], rtol=0, atol=1e-5 * scale)   # -inf: eos held back
