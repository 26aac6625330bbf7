"""examples/minilm.py against sentence-transformers (torch) embeddings made by
tests/data/make_minilm_reference.py."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, load_example

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

REFERENCE = ROOT / "tests" / "data" / "minilm_reference.npz"
EXAMPLE = ROOT / "examples" / "minilm.py"


@pytest.fixture(scope="module")
def reference():
    ref = np.load(REFERENCE)
    return [str(s) for s in ref["sentences"]], ref["embeddings"], ref["n_tokens"]


@pytest.fixture(scope="module")
def model(minilm_dir):
    minilm = load_example("minilm")
    with minilm.MiniLM(minilm_dir, n_threads=2) as m:
        yield m


def _cosine(a, b):
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_reference_covers_what_the_issue_asks(reference):
    sentences, emb, n_tokens = reference
    assert len(sentences) >= 16 and emb.shape == (len(sentences), 384)
    assert min(n_tokens) <= 3 and max(n_tokens) == 256   # one word ... truncated at 256
    assert any(ord(c) > 127 for s in sentences for c in s)


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_embeddings_match_sentence_transformers(model, reference, batch_size):
    sentences, expected, _ = reference
    got = model.embed(sentences, batch_size=batch_size)
    assert got.dtype == np.float32 and got.shape == expected.shape
    cos = _cosine(got, expected)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.9999, f"{sentences[worst]!r}: cosine {cos[worst]}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


def test_cli_in_out_keeps_input_order(tmp_path, reference, minilm_dir):
    sentences, expected, _ = reference
    picked = [sentences[i] for i in (21, 0, 10, 3)]  # long, short, non-ASCII, plain
    (tmp_path / "in.txt").write_text("\n".join(picked) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, str(EXAMPLE), "--in", str(tmp_path / "in.txt"),
                    "--out", str(tmp_path / "emb.npy"), "--threads", "2",
                    "--model-dir", str(minilm_dir)], check=True)
    emb = np.load(tmp_path / "emb.npy")
    assert emb.shape == (4, 384) and emb.dtype == np.float32
    assert _cosine(emb, expected[[21, 0, 10, 3]]).min() >= 0.9999


def test_cli_prints_first_values_and_norm(reference, minilm_dir):
    sentences, expected, _ = reference
    out = subprocess.run([sys.executable, str(EXAMPLE), sentences[2], "--model-dir", str(minilm_dir)],
                         check=True, capture_output=True, text=True).stdout
    assert "norm=1.000000" in out
    assert f"{expected[2][0]:+.4f}" in out


def test_cli_rejects_bad_threads(minilm_dir):
    r = subprocess.run([sys.executable, str(EXAMPLE), "x", "--threads", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--threads" in r.stderr


def test_minilm_through_the_scheduler_with_the_numpy_backend(reference, minilm_dir):
    """[NumPy backend, CPU] under ggml's scheduler: same embeddings."""
    minilm = load_example("minilm")
    sentences, expected, _ = reference
    with minilm.MiniLM(minilm_dir, n_threads=2, backend="numpy") as m:
        got = m.embed(sentences, batch_size=8)
        assert m.n_splits >= 1
    assert _cosine(got, expected).min() >= 0.9999
