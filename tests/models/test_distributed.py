"""One model over several devices and machines: SmolLM2 (examples/llama.py) split over two and
three RPC servers on 127.0.0.1 (child processes, each serving its CPU with one thread), by whole
layers (``--split layer``: ggml's scheduler) and by heads and FFN (``--split tensor``: ggml's meta
device), against the one-device run on the CPU and the transformers reference of test_llama.

Needs a build with the RPC backend (scripts/check_variants.sh vulkan-rpc, which CI runs);
skipped elsewhere. The tensor split computes attention with flash attention, so its one-device
run does too.

Split runs add the devices' partial sums in another order than one device does: float rounding.
With F32 weights that stays float noise: top-5 logits within ``F32_TOL`` of the one-device run
and 16 greedy tokens identical on all six prompts. With the quantized weights as shipped, the
next layer's Q8_1 quantization of its activations can turn it into a different rounding of an
activation (logits then move by up to about the quantization error, as between ggml builds: see
test_llama): greedy decoding may leave the one-device run only at a step where that run's top-2
logits are within ``QUANT_TOL`` of each other (on two servers, tensor split: "short" at step 14,
0.06 apart, and "non_english" at step 10, 0.11 apart).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from test_llama import CASES, QUANT_TOL, THREADS, _compare  # noqa: F401  (skips without the model)

import pyggml  # noqa: E402
from pyggml.models.common import layer_owners  # noqa: E402
from pyggml.models.llama import Llama, default_model_path  # noqa: E402
from pyggml.models.llama.split import TensorSplit  # noqa: E402

if "rpc" not in pyggml.dl.built_backends():
    pytest.skip("built without rpc (scripts/check_variants.sh vulkan-rpc builds it)", allow_module_level=True)

from pyggml import rpc  # noqa: E402

EXAMPLE = ROOT / "examples" / "llama.py"
FAST = ("short", "code")   # the cases of the three-server runs (all six run on two servers)
F32_TOL = 0.05             # F32 weights: float32 noise over 30 layers and up to 272 tokens
                           # (measured: layer split 0; tensor split 1e-5, 0.013 on the 272-token
                           # prompt: the partial sums add in another order, and each device's
                           # flash attention sees fewer heads); the quantized model's error is 0.5


@pytest.fixture(scope="session")
def rpc_trio():
    """Three more RPC servers for the whole session (ggml keeps RPC devices registered until the
    process ends and aborts when one whose server is gone is used: see conftest.rpc_session),
    and their device names (RPC<i>, in the order they were added)."""
    servers = [rpc.Server(devices=["CPU"], n_threads=1) for _ in range(3)]
    try:
        names = [rpc.add_server(s.endpoint).devices[0].name for s in servers]
        yield servers, names
    finally:
        for s in servers:
            s.close()


def _greedy(m: Llama, case: dict) -> tuple[list[int], list[int], list[float], np.ndarray]:
    """(prompt ids, 16 greedy ids, the top-2 logit gap at each step, the prompt's logits); the
    model is reset after."""
    ids = m.tokenize(case["text"]) if "chat_message" not in case else m.tokenize(m.chat_prompt(case["chat_message"]))
    logits = first = m.model.eval(ids)
    out, gaps = [], []
    for _ in range(16):
        top2 = np.sort(logits)[-2:]
        out.append(int(np.argmax(logits)))
        gaps.append(float(top2[1] - top2[0]))
        logits = m.model.eval([out[-1]])
    m.model.reset()
    return ids, out, gaps, first


def _same_greedy(name: str, got: list[int], ref: list[int], gaps: list[float], tie: float) -> str:
    for step, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            assert gaps[step] <= tie, (f"{name}: greedy step {step} chose {a}, one device {b} "
                                       f"(its top-2 gap {gaps[step]:.3f} > {tie})")
            return f"diverges at step {step} (one device's top-2 gap {gaps[step]:.3f})"
    return "identical"


@pytest.fixture(scope="module")
def one_device():
    """{(case, flash_attn, dequantize): (prompt ids, 16 greedy ids, top-2 gaps, prompt logits)}
    on the CPU alone."""
    pytest.importorskip("jinja2")   # the chat case
    out = {}
    for fa in (False, True):
        for dq in (False, True):
            with Llama(default_model_path(), n_threads=THREADS, flash_attn=fa, dequantize=dq,
                       kv_type="f32" if dq else "f16") as m:
                for c in CASES:
                    out[c["name"], fa, dq] = _greedy(m, c)
    return out


@pytest.mark.parametrize("n_servers", [2, 3])
@pytest.mark.parametrize("split", ["layer", "tensor"])
def test_llm_split_over_rpc_servers(rpc_trio, one_device, split, n_servers, capsys):
    """The model as shipped (Q4_1): prompt ids identical, top-5 logits and greedy tokens within
    the quantized model's tolerance against transformers (test_llama's check), greedy tokens as
    the one-device run's but for near-ties (the module docstring)."""
    _, names = rpc_trio
    devices = names[:n_servers]
    cases = CASES if n_servers == 2 else [c for c in CASES if c["name"] in FAST]
    lines = []
    with Llama(default_model_path(), devices=devices, split=split, n_threads=THREADS) as m:
        for case in cases:
            line = _compare(m, case, QUANT_TOL, QUANT_TOL)[1]
            m.model.reset()
            ids, generated, _, _ = _greedy(m, case)
            ref_ids, ref_generated, gaps, _ = one_device[case["name"], split == "tensor", False]
            assert ids == ref_ids
            same = _same_greedy(case["name"], generated, ref_generated, gaps, QUANT_TOL)
            lines.append(f"{line}; vs one device: {same}")
        placement = m.model.placement()
        if split == "layer":   # each server runs its layers' matmuls; the scheduler moves activations
            assert m.model.splits() >= n_servers
            assert sum("MUL_MAT" in ops for name, ops in placement.items() if name.startswith("RPC")) == n_servers
        else:                  # one meta backend runs every layer; ggml's meta backend splits it
            assert any(name.startswith("Meta") and "FLASH_ATTN_EXT" in ops for name, ops in placement.items())
    with capsys.disabled():
        print(f"\n{split} split over {devices}:\n  " + "\n  ".join(lines))


@pytest.mark.parametrize("split", ["layer", "tensor"])
def test_llm_split_with_f32_weights_equals_one_device(rpc_trio, one_device, split, capsys):
    """F32 weights (dequantized by ggml) over two servers: top-5 logits within float noise of the
    one-device run and 16 greedy tokens identical, on all six prompts."""
    _, names = rpc_trio
    lines = []
    with Llama(default_model_path(), devices=names[:2], split=split, n_threads=THREADS, dequantize=True,
               kv_type="f32") as m:
        for case in CASES:
            ids, generated, _, logits = _greedy(m, case)
            ref_ids, ref_generated, gaps, ref_logits = one_device[case["name"], split == "tensor", True]
            top5 = np.argsort(-ref_logits, kind="stable")[:5]
            diff = float(np.abs(logits[top5] - ref_logits[top5]).max())
            assert ids == ref_ids
            assert diff <= F32_TOL, f"{case['name']}: top-5 logits differ by {diff:.5f}"
            assert generated == ref_generated, f"{case['name']}: {generated} != {ref_generated}"
            lines.append(f"{case['name']:18s} max |top-5 logit diff| {diff:.5f}; 16 greedy tokens identical")
    with capsys.disabled():
        print(f"\n{split} split over {names[:2]}, F32 weights, vs one device:\n  " + "\n  ".join(lines))


def test_tensor_split_policy_shares_heads_and_ffn():
    """SmolLM2's 3 KV heads (9 query heads) and FFN of 1536 over 2 and 3 devices, and weights."""
    with Llama(default_model_path(), n_threads=THREADS) as m:
        hp = m.model.hp
    two = TensorSplit(hp, 2)
    assert two.heads_kv == [1, 2] and two.ffn == [768, 768]
    three = TensorSplit(hp, 3, weights=[1, 1, 2])
    assert sum(three.heads_kv) == 3 and sum(three.ffn) == 1536 and three.ffn[2] > three.ffn[0]
    assert two.rules["attn_q.weight"].segments[0][0] == (192, 384)   # 3 query heads per KV head
    assert layer_owners(30, [1, 1]) == [0] * 15 + [1] * 15
    assert layer_owners(30, [1, 2]) == [0] * 10 + [1] * 20


def _run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def test_cli_splits_over_two_servers(rpc_trio, one_device, tmp_path):
    """``--rpc`` twice and ``--devices``: the command line of the docs, each split mode, in a
    process of its own (its devices are RPC0 and RPC1), against the one-device run."""
    servers, _ = rpc_trio
    case = CASES[2]
    for split in ("layer", "tensor"):
        dump = tmp_path / f"{split}.json"
        r = _run_cli("--rpc", servers[0].endpoint, "--rpc", servers[1].endpoint, "--devices", "RPC0,RPC1",
                     "--split", split, "--greedy", "-n", "16", "-t", "1", "--dump", str(dump), case["text"])
        assert r.returncode == 0, r.stderr
        assert f"RPC0+RPC1 ({split} split)" in r.stderr
        got = json.loads(dump.read_text(encoding="utf-8"))
        ref_ids, ref_generated, gaps, _ = one_device[case["name"], split == "tensor", False]
        assert got["prompt_ids"] == ref_ids
        n = len(got["generated_ids"])   # fewer at an end-of-sequence token
        _same_greedy(case["name"], got["generated_ids"], ref_generated[:n], gaps, QUANT_TOL)


def _dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"   # closed again: nothing listens


def test_server_gone_before_the_start_is_a_clear_error():
    """A server that refuses (nothing listens, or it was stopped) is an error message and exit
    code 1, not ggml's abort ("Failed to connect"). A server that dies *during* use still aborts
    the client: docs/distributed.rst says so."""
    with rpc.Server(devices=["CPU"], n_threads=1) as s:
        gone = s.endpoint
    for endpoint in (_dead_endpoint(), gone):
        r = _run_cli("--rpc", endpoint, "--devices", "RPC0,RPC1", "--split", "tensor", "-n", "1", "hi")
        assert r.returncode == 1 and "no ggml RPC server answered" in r.stderr, r.stderr


def test_bad_device_lists_are_errors_before_loading():
    r = _run_cli("--devices", "cpu,cpu", "-n", "1", "hi")
    assert r.returncode == 1 and "appears twice" in r.stderr, r.stderr
    r = _run_cli("--devices", "RPC9,cpu", "-n", "1", "hi")
    assert r.returncode == 1 and "RPC9" in r.stderr, r.stderr
    r = _run_cli("--devices", "cpu", "--tensor-split", "1,2", "-n", "1", "hi")
    assert r.returncode == 2 and "one per device" in r.stderr, r.stderr
    r = _run_cli("--backend", "cpu", "--devices", "cpu", "--tensor-split", "-1", "-n", "1", "hi")
    assert r.returncode == 2


def test_minilm_over_two_rpc_servers(rpc_trio, minilm_dir, minilm_reference):
    """MiniLM's six layers, three on each server: the embeddings of sentence-transformers, as
    on one device."""
    pytest.importorskip("safetensors")

    from pyggml.models.bert import Embedder
    _, names = rpc_trio
    sentences, expected = minilm_reference
    with Embedder(minilm_dir, n_threads=1, devices=names[:2]) as m:
        got = m.encode(sentences, batch_size=8)
        assert m.n_splits >= 2   # the scheduler moves activations from one server to the other
    cos = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cos.min() >= 0.9999, cos.min()
