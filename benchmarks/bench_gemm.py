#!/usr/bin/env python3
"""One matrix product: ggml's ``MUL_MAT`` on the CPU backend (and on [BLAS, CPU] in a BLAS
build) against NumPy's ``b @ a.T`` (the OpenBLAS NumPy ships) and, with ``--type`` other than
f32, against torch's product of the same shapes in that type (oneDNN on a CPU), same thread
count, GFLOP/s side by side.

    python benchmarks/bench_gemm.py                          # MiniLM's FFN product, 2 threads
    python benchmarks/bench_gemm.py --k 784 --m 500 --n 500  # MNIST FC's first layer
    python benchmarks/bench_gemm.py --type f32 bf16 f16      # a weight type per row (and torch's)
    build/venv-blas/bin/python benchmarks/bench_gemm.py      # + ggml's BLAS backend

``a`` is the weight (NumPy (m, k), ggml ne [k, m]) stored in ``--type`` (f32, f16, bf16,
q8_0...), ``b`` the activations (NumPy (n, k), ggml ne [k, n], float32, which ggml converts to
the weight's product type); the result is NumPy (n, m), float32. ggml's rows say which
reference they are compared with: for bf16 and f16 weights torch's ``b @ a.T`` with both in
that type (when torch is installed), as a model in that type runs in torch; for the others
(f32, quantized types) NumPy's F32 product. The subjects run in turns (``--repeat`` rounds, the order reversed every other round:
``_timing.paired_seconds``), each timed over a burst of calls of about 50 ms; times are medians
per call, the ratio is the median over rounds of the reference's time over ggml's (> 1: ggml
is faster). NumPy's and
torch's threads are set before they load. "max |diff|" is to NumPy's F32 product. Nothing is
asserted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=384, help="shared dimension (ggml ne[0])")
    p.add_argument("--m", type=int, default=1536, help="rows of a: output features")
    p.add_argument("--n", type=int, default=800, help="rows of b: tokens or images")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--type", nargs="+", default=["f32"], help="the weight's ggml types, a row each")
    args = p.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # before NumPy loads OpenBLAS
    import numpy as np

    import pyggml
    from _timing import paired_seconds
    from pyggml.backends.device import device_by_name
    from pyggml.errors import BackendNotAvailableError

    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None

    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.m, args.k), dtype=np.float32)
    b = rng.standard_normal((args.n, args.k), dtype=np.float32)
    flop = 2.0 * args.m * args.n * args.k
    expected = b @ a.T

    cpu = pyggml.CPUBackend(n_threads=args.threads)
    runners: list[tuple[str, list[pyggml.Backend]]] = [("ggml CPU", [cpu])]
    try:
        blas = device_by_name("BLAS").init()
        blas.set_n_threads(args.threads)
        runners.append(("ggml [BLAS, CPU]", [blas, cpu]))
    except BackendNotAvailableError:  # not a BLAS build
        blas = None

    print(f"product a (m={args.m}, k={args.k}) x b (n={args.n}, k={args.k}), {args.threads} threads, "
          f"medians of {args.repeat} rounds in turns")
    print(f"{'':40} {'ms':>8} {'GFLOP/s':>8} {'ref / this':>11}  max |diff|")
    for wtype in args.type:
        # the reference: NumPy's F32 product, or torch's in the weight's type
        tdtype = {"bf16": "bfloat16", "f16": "float16"}.get(wtype)
        if wtype == "f32" or torch is None or tdtype is None:
            ref_name: str = "NumPy b @ a.T (OpenBLAS, F32)"
            ref: Callable[[], Any] = lambda: b @ a.T
        else:
            ta_t, tb_t = (torch.from_numpy(x).to(getattr(torch, tdtype)) for x in (a, b))
            ref_name = f"torch b @ a.T ({tdtype})"
            ref = lambda ta_t=ta_t, tb_t=tb_t: tb_t @ ta_t.T
        fns, names, diffs, closers = [ref], [ref_name], [""], []
        for name, backends in runners:
            ctx = pyggml.Context.for_tensors(8, graph_size=8)
            ta, tb = ctx.new_tensor(wtype, [args.k, args.m]), ctx.new_tensor("f32", [args.k, args.n])
            out = ctx.mul_mat(ta, tb)
            graph = ctx.new_graph(8).build_forward(out)
            sched = pyggml.Scheduler(backends, graph_size=8)
            sched.alloc_graph(graph)
            ta.set(a)
            tb.set(b)
            sched.compute(graph)
            diffs.append(f"{float(np.abs(out.numpy() - expected).max()):.1e}")
            fns.append(lambda sched=sched, graph=graph: sched.compute(graph))
            names.append(f"{name} MUL_MAT, {wtype} weights")
            closers += [sched, ctx]
        # each timed sample is a burst of calls (about 50 ms): a single call after the pause
        # before each sample would time waking the threads up, not the product
        bursts = [_burst(fn) for fn in fns]
        rounds = paired_seconds([f for f, _ in bursts], args.repeat, settle=0.2)
        for i, (name, diff) in enumerate(zip(names, diffs)):
            sec = statistics.median(r[i] / bursts[i][1] for r in rounds)
            ratio = "" if i == 0 else f"{statistics.median(r[0] / bursts[0][1] * bursts[i][1] / r[i] for r in rounds):10.2f}x"
            print(f"{name:40} {sec * 1e3:8.2f} {flop / sec / 1e9:8.0f} {ratio:>11}  {diff}")
        for c in closers:
            c.close()
    if blas is not None:
        blas.close()
    cpu.close()


def _burst(fn: Callable[[], Any]) -> tuple[Callable[[], None], int]:
    """``fn`` called n times in a row, n such that the burst takes about 50 ms; and n."""
    fn()
    t0 = time.perf_counter()
    fn()
    n = max(1, round(0.05 / max(time.perf_counter() - t0, 1e-6)))

    def burst() -> None:
        for _ in range(n):
            fn()
    return burst, n


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
