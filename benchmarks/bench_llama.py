#!/usr/bin/env python3
"""LLM speed: pyggml.models.llama (examples/llama.py) against llama.cpp's own ``llama-bench`` on the same GGUF
file and thread count, side by side.

    scripts/build_llama_bench.sh                      # once: build/llama.cpp/build/bin/llama-bench
    python benchmarks/bench_llama.py [--threads 2] [--repeat 5] [--rounds 3] [--model X.gguf]
    python benchmarks/bench_llama.py --pyggml-only    # without llama-bench, even where it is built
    python benchmarks/bench_llama.py --type q4_0      # matrices requantized to Q4_0 (CPU_REPACK)
    python benchmarks/bench_llama.py --backend CUDA0 --context 8 1000   # a GPU; decode at two contexts

Tests, as llama-bench names them: ``pp64`` processes a 64-token prompt in one batch (tokens/s);
``tg64`` generates 64 tokens one at a time from an empty cache, without sampling (tokens/s).
Random token ids, F16 KV cache, with and without flash attention (``-fa off`` / ``-fa on``).
pyggml's figure is the median of ``repeat`` timed runs after a warm-up; llama-bench is asked for
``-r repeat`` and the median of its samples is used. The two alternate for ``rounds`` rounds;
the table shows the median of the rounds for each, and the median of the per-round ratios (on a
busy machine the rounds move a lot, and a ratio of two runs made one after the other moves less:
still, run it when nothing else runs).

Also printed, for decode steps after a prompt of each ``--context`` length (1 token generated
at a time, in the KV bucket of that context): the step's time and its Python time, i.e. the
step's wall time minus the time inside ggml's ``ggml_backend_sched_graph_compute`` call itself
(timed in C around the call, ``pyggml_compute_ns``): setting the four inputs, reading the
logits, the example's bookkeeping and pyggml's own work in :meth:`pyggml.Scheduler.compute`;
the same for the command line's own loop (``Llama.generate`` with its sampler and text
streaming, 160 tokens after a 900-token prompt, graph builds included), greedy and sampled;
and the cost of pyggml's Ctrl-C check in the CPU backend (``interruptible=True``, a C throttle
that asks Python at most every 10 ms). ``--backend`` names the device that holds the weights (CUDA0...: then llama-bench is asked
for ``-ngl 99``); set ``GGML_CUDA_DISABLE_GRAPHS=1`` to see ggml-cuda without its CUDA graphs.

Weights: both sides put the CPU's matrices where llama.cpp's rule does (``llama-bench --repack
1``, its default; pyggml's ``repack=True``, :meth:`pyggml.Device.weight_buffer_type`): in an
extra buffer type of the CPU where its products take them (``CPU_REPACK`` for Q4_0/Q4_K/IQ4_NL
on x86), else the CPU's default memory. ``--no-repack`` turns that off on both sides. The table
is preceded by the buffer types that hold the weights on each side (pyggml's
``LlamaModel.weight_buffers``; llama.cpp's "model buffer size" lines, from ``llama-bench -v``),
so that a ratio compares the same layouts.
Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from _timing import median_seconds
from bench_minilm import compute_seconds

ROOT = Path(__file__).resolve().parents[1]
from pyggml.models.llama import Llama, Sampler, TextStream, default_model_path, requantize  # noqa: E402

DEFAULT_LLAMA_BENCH = ROOT / "build" / "llama.cpp" / "build" / "bin" / "llama-bench"
N = 64


def decode_steps(m: object, n: int) -> list[tuple[float, float]]:
    """(wall seconds, seconds inside ggml's compute call) of ``n`` single-token evals."""
    out = []
    for i in range(n):
        c0, t0 = compute_seconds(), time.perf_counter()
        m.eval([i + 1])  # type: ignore[attr-defined]
        out.append((time.perf_counter() - t0, compute_seconds() - c0))
    return out


def bench_pyggml(model: Path, threads: int, repeat: int, flash_attn: bool, backend: str,
                 contexts: list[int], repack: bool) -> dict[str, float]:
    """pp64 and tg64 tokens/s; per context c of ``contexts``: the median decode step after a
    c-token prompt (``step@c``) and its Python time (``python@c``), seconds."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    n_ctx = max(256, max(contexts) + 2 * N)
    for interruptible in (False, True):
        with Llama(model, backend=backend, n_threads=threads, n_ctx=n_ctx, flash_attn=flash_attn,
                   interruptible=interruptible, repack=repack) as llm:
            m = llm.model
            tokens = rng.integers(0, m.hp.n_vocab, N).tolist()

            def pp() -> None:
                m.reset()
                m.eval(tokens)

            def tg() -> None:
                m.reset()
                for t in tokens:
                    m.eval([t])

            if interruptible:
                out["tg_interruptible"] = N / median_seconds(tg, repeat)
                continue
            out["pp"] = N / median_seconds(pp, repeat)
            out["tg"] = N / median_seconds(tg, repeat)
            for c in contexts:
                m.reset()
                m.eval(rng.integers(0, m.hp.n_vocab, c).tolist())
                steps = decode_steps(m, 8)[2:]   # the first ones build and capture
                for _ in range(repeat - 1):
                    m.n_past -= 8
                    steps += decode_steps(m, 8)[2:]
                out[f"step@{c}"] = statistics.median(s for s, _ in steps)
                out[f"python@{c}"] = statistics.median(s - g for s, g in steps)
    return out


def cli_steps(model: Path, threads: int, repeat: int, flash_attn: bool, backend: str,
              repack: bool, n_prompt: int = 900, n_gen: int = 160) -> dict[str, float]:
    """The CLI's own Python per decode step, seconds: its loop (``Llama.generate`` with the
    CLI's sampler and text streaming, graph builds included) after an ``n_prompt``-token
    prompt, for ``n_gen`` tokens, minus the time inside ggml's compute calls (C-timed), per
    step; ``greedy`` and ``sampled`` (the CLI's defaults: temperature 0.8, top-k 40, top-p
    0.95). Median of ``repeat`` runs."""
    rng = np.random.default_rng(1)
    out: dict[str, list[float]] = {"greedy": [], "sampled": []}
    with Llama(model, backend=backend, n_threads=threads, n_ctx=n_prompt + n_gen + 8, flash_attn=flash_attn,
               repack=repack) as llm:
        ids = rng.integers(0, llm.model.hp.n_vocab, n_prompt).tolist()
        for r in range(repeat):
            for kind in out:
                stream, sink = TextStream(llm.tokenizer), []
                mark: list[float] = []

                def emit(tok: int) -> None:
                    if not mark:   # the loop's first token: the prompt is done
                        mark.extend((time.perf_counter(), compute_seconds()))
                    piece = stream.push(tok)
                    if piece:
                        sink.append(piece)

                sampler = Sampler(greedy=kind == "greedy", seed=r)
                gen = llm.generate(ids, n_gen, sampler, on_token=emit)
                t, c = time.perf_counter() - mark[0], compute_seconds() - mark[1]
                out[kind].append((t - c) / max(gen.decode_steps, 1))
    return {k: statistics.median(v) for k, v in out.items()}


def pyggml_weight_buffers(model: Path, backend: str, repack: bool) -> dict[str, float]:
    """Buffer type name -> MiB of the weights pyggml puts in it."""
    with Llama(model, backend=backend, n_threads=1, n_ctx=256, repack=repack) as llm:
        return {k: size / 2**20 for k, (_, size) in llm.model.weight_buffers.items()}


def llama_cpp_weight_buffers(exe: Path, model: Path, gpu: bool, repack: bool) -> dict[str, float]:
    """Buffer type name -> MiB of the weights llama.cpp puts in it (its "model buffer size"
    log lines: a one-token run with ``-v``)."""
    cmd = [str(exe), "-m", str(model), "-t", "1", "-p", "0", "-n", "1", "-r", "1", "-v",
           "--repack", "1" if repack else "0", "-ngl", "99" if gpu else "0", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    found = re.findall(r"(\S+) model buffer size\s*=\s*([\d.]+) MiB", r.stderr)
    return {name: float(mib) for name, mib in found}


def bench_llama_cpp(exe: Path, model: Path, threads: int, repeat: int, flash_attn: bool,
                    gpu: bool, repack: bool) -> dict[str, float]:
    """pp64 and tg64 tokens/s from ``llama-bench -o json`` (median of its samples)."""
    cmd = [str(exe), "-m", str(model), "-t", str(threads), "-p", str(N), "-n", str(N), "-r", str(repeat),
           "-fa", "on" if flash_attn else "off", "-ngl", "99" if gpu else "0", "-o", "json",
           "--repack", "1" if repack else "0"]
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
    p.add_argument("--backend", default="cpu", help="cpu (default) or the device holding the weights, e.g. CUDA0")
    p.add_argument("--type", default=None,
                   help="the model's matrices requantized to this type first (e.g. q4_0, which "
                        "CPU_REPACK takes on x86; written once to build/), both sides read that file")
    p.add_argument("--no-repack", action="store_true",
                   help="weights in the CPU's default memory on both sides (llama-bench --repack 0)")
    p.add_argument("--context", type=int, nargs="+", default=[8, 1000],
                   help="prompt lengths after which decode steps are timed (default 8 1000)")
    a = p.parse_args()
    model = a.model or default_model_path()
    if a.type:
        out = ROOT / "build" / f"{model.stem}-{a.type}.gguf"
        if not out.is_file():
            out.parent.mkdir(exist_ok=True)
            requantize(model, out, a.type)
        model = out
    found = shutil.which("llama-bench")
    exe: Path = a.llama_bench if a.llama_bench.is_file() or found is None else Path(found)
    have_cpp = exe.is_file() and not a.pyggml_only
    if a.pyggml_only:
        print("--pyggml-only: pyggml only\n")
    elif not have_cpp:
        print(f"no llama-bench at {a.llama_bench} (scripts/build_llama_bench.sh builds it): pyggml only\n")

    repack, gpu = not a.no_repack, a.backend.lower() != "cpu"
    print(f"{model.name} on {a.backend}, {a.threads} CPU threads, median of {a.repeat} runs, "
          f"median of {a.rounds} rounds, repack {'on' if repack else 'off'}\n")

    def places(mib: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.1f} MiB" for k, v in mib.items()) or "?"
    print(f"weights, pyggml:      {places(pyggml_weight_buffers(model, a.backend, repack))}")
    if have_cpp:
        print(f"weights, llama-bench: {places(llama_cpp_weight_buffers(exe, model, gpu, repack))}")
    print()
    print("| attention | test | pyggml t/s | llama-bench t/s | ratio | median ratio of the rounds |")
    print("|---|---|---|---|---|---|")
    notes = []
    for fa in (False, True):
        rounds = []
        for _ in range(a.rounds):
            ours = bench_pyggml(model, a.threads, a.repeat, fa, a.backend, a.context, repack)
            ours.update({f"cli_{k}": v for k, v in
                         cli_steps(model, a.threads, a.repeat, fa, a.backend, repack).items()})
            cpp = bench_llama_cpp(exe, model, a.threads, a.repeat, fa, gpu, repack) if have_cpp else {}
            rounds.append((ours, cpp))
        ours = {k: statistics.median(r[0][k] for r in rounds) for k in rounds[0][0]}
        cpp = {k: statistics.median(r[1][k] for r in rounds) for k in ("pp", "tg")} if have_cpp else {}
        name = "flash-attn" if fa else "mul_mat + soft_max"
        for test in ("pp", "tg"):
            theirs = f"{cpp[test]:.1f}" if cpp else "-"
            ratio = f"{ours[test] / cpp[test]:.2f}x" if cpp else "-"
            per_round = f"{statistics.median(o[test] / c[test] for o, c in rounds):.2f}x" if cpp else "-"
            print(f"| {name} | {test}{N} | {ours[test]:.1f} | {theirs} | {ratio} | {per_round} |")
        for c in a.context:
            step, py = ours[f"step@{c}"], ours[f"python@{c}"]
            notes.append(f"{name}, decode after {c} tokens: step {step * 1e3:.3f} ms ({1 / step:.0f} tok/s), "
                         f"Python outside ggml's compute call {py * 1e3:.3f} ms ({100 * py / step:.1f} %)")
        notes.append(f"{name}, the CLI's loop after 900 tokens (sampling, text streaming, graph builds): "
                     f"Python per step {ours['cli_greedy'] * 1e3:.3f} ms greedy, "
                     f"{ours['cli_sampled'] * 1e3:.3f} ms sampled (top-k 40, top-p 0.95)")
        notes.append(f"{name}: tg{N} with pyggml's Ctrl-C check (interruptible=True, throttled): "
                     f"{ours['tg_interruptible']:.1f} t/s ({100 * (ours['tg'] / ours['tg_interruptible'] - 1):+.1f} % "
                     "time per token)")
    print()
    for n in notes:
        print(n)
    if have_cpp:
        print(f"\nllama-bench: {exe} (build {rounds[0][1].get('build')})")


if __name__ == "__main__":
    main()
