#!/usr/bin/env python3
"""LLM speed: examples/llama.py (pyggml) against llama.cpp's own ``llama-bench`` on the same GGUF
file and thread count, side by side.

    scripts/build_llama_bench.sh                      # once: build/llama.cpp/build/bin/llama-bench
    python benchmarks/bench_llama.py [--threads 2] [--repeat 5] [--rounds 3] [--model X.gguf]
    python benchmarks/bench_llama.py --pyggml-only    # without llama-bench, even where it is built

Tests, as llama-bench names them: ``pp64`` processes a 64-token prompt in one batch (tokens/s);
``tg64`` generates 64 tokens one at a time from an empty cache, without sampling (tokens/s).
Random token ids, F16 KV cache, with and without flash attention (``-fa off`` / ``-fa on``).
pyggml's figure is the median of ``repeat`` timed runs after a warm-up; llama-bench is asked for
``-r repeat`` and the median of its samples is used. The two alternate for ``rounds`` rounds;
the table shows the median of the rounds for each, and the median of the per-round ratios (on a
busy machine the rounds move a lot, and a ratio of two runs made one after the other moves less:
still, run it when nothing else runs).

Also printed: the Python time per decode step, i.e. the step's wall time minus the time spent
inside :meth:`pyggml.Scheduler.compute` (``ggml_backend_sched_graph_compute`` and pyggml's
checks of a graph it holds, cached: a C check of the graph's memory) -- setting the five inputs,
reading the logits, the bookkeeping, and the cost of pyggml's Ctrl-C check in the CPU backend (``interruptible=True``, a C throttle that asks Python at most every 10 ms),
which the example switches off by default. Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _timing import median_seconds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from llama_ggml import Llama  # noqa: E402
from llama_ggml.generate import default_model_path  # noqa: E402

DEFAULT_LLAMA_BENCH = ROOT / "build" / "llama.cpp" / "build" / "bin" / "llama-bench"
N = 64


def bench_pyggml(model: Path, threads: int, repeat: int, flash_attn: bool) -> dict[str, float]:
    """pp64 and tg64 tokens/s, and the per-step times (seconds) of the tg64 runs."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for interruptible in (False, True):
        with Llama(model, n_threads=threads, n_ctx=256, flash_attn=flash_attn, interruptible=interruptible) as llm:
            m = llm.model
            tokens = rng.integers(0, m.hp.n_vocab, N).tolist()

            def pp() -> None:
                m.reset()
                m.eval(tokens)

            steps: list[tuple[float, float]] = []

            def tg() -> None:
                m.reset()
                c0, t0 = m.t_compute, time.perf_counter()
                for t in tokens:
                    m.eval([t])
                steps.append(((time.perf_counter() - t0) / N, (m.t_compute - c0) / N))

            tg_s = median_seconds(tg, repeat)
            steps = steps[1:]  # not the warm-up
            step = statistics.median(s for s, _ in steps)
            if interruptible:
                out["step_interruptible"] = step
                continue
            out["pp"] = N / median_seconds(pp, repeat)
            out["tg"] = N / tg_s
            out["step"] = step
            out["python"] = statistics.median(s - c for s, c in steps)
    return out


def bench_llama_cpp(exe: Path, model: Path, threads: int, repeat: int, flash_attn: bool) -> dict[str, float]:
    """pp64 and tg64 tokens/s from ``llama-bench -o json`` (median of its samples)."""
    cmd = [str(exe), "-m", str(model), "-t", str(threads), "-p", str(N), "-n", str(N), "-r", str(repeat),
           "-fa", "on" if flash_attn else "off", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = {}
    for entry in json.loads(r.stdout):
        key = "pp" if entry["n_prompt"] else "tg"
        samples = entry.get("samples_ts") or [entry["avg_ts"]]
        out[key] = float(statistics.median(samples))
        out["build"] = entry.get("build_commit", "?")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--llama-bench", type=Path, default=DEFAULT_LLAMA_BENCH)
    p.add_argument("--pyggml-only", action="store_true", help="do not run llama-bench")
    a = p.parse_args()
    model = a.model or default_model_path()
    found = shutil.which("llama-bench")
    exe: Path = a.llama_bench if a.llama_bench.is_file() or found is None else Path(found)
    have_cpp = exe.is_file() and not a.pyggml_only
    if a.pyggml_only:
        print("--pyggml-only: pyggml only\n")
    elif not have_cpp:
        print(f"no llama-bench at {a.llama_bench} (scripts/build_llama_bench.sh builds it): pyggml only\n")

    print(f"{model.name}, {a.threads} threads, median of {a.repeat} runs, median of {a.rounds} rounds\n")
    print("| attention | test | pyggml t/s | llama-bench t/s | ratio | median ratio of the rounds |")
    print("|---|---|---|---|---|---|")
    notes = []
    for fa in (False, True):
        rounds = []
        for _ in range(a.rounds):
            ours = bench_pyggml(model, a.threads, a.repeat, fa)
            cpp = bench_llama_cpp(exe, model, a.threads, a.repeat, fa) if have_cpp else {}
            rounds.append((ours, cpp))
        ours = {k: statistics.median(r[0][k] for r in rounds) for k in rounds[0][0]}
        cpp = {k: statistics.median(r[1][k] for r in rounds) for k in ("pp", "tg")} if have_cpp else {}
        name = "flash-attn" if fa else "mul_mat + soft_max"
        for test in ("pp", "tg"):
            theirs = f"{cpp[test]:.1f}" if cpp else "-"
            ratio = f"{ours[test] / cpp[test]:.2f}x" if cpp else "-"
            per_round = f"{statistics.median(o[test] / c[test] for o, c in rounds):.2f}x" if cpp else "-"
            print(f"| {name} | {test}{N} | {ours[test]:.1f} | {theirs} | {ratio} | {per_round} |")
        notes.append(f"{name}: decode step {ours['step'] * 1e3:.2f} ms, of which Python outside ggml compute "
                     f"{ours['python'] * 1e3:.3f} ms ({100 * ours['python'] / ours['step']:.1f} %); with pyggml's "
                     f"Ctrl-C check (interruptible=True, throttled) the step takes "
                     f"{ours['step_interruptible'] * 1e3:.2f} ms "
                     f"({100 * (ours['step_interruptible'] / ours['step'] - 1):+.1f} %)")
    print()
    for n in notes:
        print(n)
    if have_cpp:
        print(f"\nllama-bench: {exe} (llama.cpp of llama_cpp_python 0.3.36, build {rounds[0][1].get('build')})")


if __name__ == "__main__":
    main()
