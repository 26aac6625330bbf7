#!/usr/bin/env python3
"""One F32 matrix product: ggml's ``MUL_MAT`` on the CPU backend (and on [BLAS, CPU] in a BLAS
build) against NumPy's ``b @ a.T`` (the OpenBLAS NumPy ships), same thread count, GFLOP/s side
by side.

    python benchmarks/bench_gemm.py                          # MiniLM's FFN product, 2 threads
    python benchmarks/bench_gemm.py --k 784 --m 500 --n 500  # MNIST FC's first layer
    build/venv-blas/bin/python benchmarks/bench_gemm.py      # + ggml's BLAS backend

``a`` is the weight (NumPy (m, k), ggml ne [k, m]), ``b`` the activations (NumPy (n, k), ggml
ne [k, n]); the result is NumPy (n, m). Medians of ``--repeat`` calls after a warm-up; the
ratio is NumPy's time over ggml's (> 1: ggml is faster). NumPy's OpenBLAS threads are set with
``OPENBLAS_NUM_THREADS`` before NumPy loads. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=384, help="shared dimension (ggml ne[0])")
    p.add_argument("--m", type=int, default=1536, help="rows of a: output features")
    p.add_argument("--n", type=int, default=800, help="rows of b: tokens or images")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # before NumPy loads OpenBLAS
    import numpy as np

    import pyggml
    from _timing import median_seconds
    from pyggml.backends.device import device_by_name
    from pyggml.errors import BackendNotAvailableError

    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.m, args.k), dtype=np.float32)
    b = rng.standard_normal((args.n, args.k), dtype=np.float32)
    flop = 2.0 * args.m * args.n * args.k
    rows = [("NumPy b @ a.T (OpenBLAS)", median_seconds(lambda: b @ a.T, args.repeat))]

    cpu = pyggml.CPUBackend(n_threads=args.threads)
    runners: list[tuple[str, list[pyggml.Backend]]] = [("ggml CPU MUL_MAT", [cpu])]
    try:
        blas = device_by_name("BLAS").init()
        blas.set_n_threads(args.threads)
        runners.append(("ggml [BLAS, CPU] MUL_MAT", [blas, cpu]))
    except BackendNotAvailableError:  # not a BLAS build
        blas = None
    expected = b @ a.T
    for name, backends in runners:
        ctx = pyggml.Context.for_tensors(8, graph_size=8)
        ta, tb = ctx.new_tensor("f32", [args.k, args.m]), ctx.new_tensor("f32", [args.k, args.n])
        out = ctx.mul_mat(ta, tb)
        graph = ctx.new_graph(8).build_forward(out)
        sched = pyggml.Scheduler(backends, graph_size=8)
        sched.alloc_graph(graph)
        ta.set(a)
        tb.set(b)
        sched.compute(graph)
        err = float(np.abs(out.numpy() - expected).max())
        rows.append((f"{name} (max |diff| {err:.1e})", median_seconds(lambda: sched.compute(graph), args.repeat)))
        sched.close()
        ctx.close()
    if blas is not None:
        blas.close()
    cpu.close()

    ref = rows[0][1]
    print(f"F32 product a (m={args.m}, k={args.k}) x b (n={args.n}, k={args.k}), {args.threads} threads, "
          f"median of {args.repeat}")
    print(f"{'':44} {'ms':>8} {'GFLOP/s':>8} {'NumPy / this':>13}")
    for name, sec in rows:
        print(f"{name:44} {sec * 1e3:8.2f} {flop / sec / 1e9:8.0f} {ref / sec:12.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
