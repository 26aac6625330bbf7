#!/usr/bin/env python3
"""Cost of a ggml backend written in Python (pyggml.impl.numpy), printed side by side.

    python benchmarks/bench_pybackend.py [--repeat 5]

(a) Per-node dispatch: a graph of 1000 tiny ADD nodes (16 floats each) computed by the NumPy
    backend, against the same graph on ggml's CPU backend (1 thread). Reported per node.
(b) MUL_MAT of the NumPy backend against NumPy's own ``b @ a.T`` on the same arrays (what its
    kernel calls, plus ggml's dispatch), for a few sizes. Ratio > 1: the backend is slower.
Nothing here is asserted.
"""
from __future__ import annotations

import argparse

import numpy as np

from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
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
    a = p.parse_args()
    npb, cpu = numpy_backend.init(), CPUBackend(n_threads=1)

    n = 1000
    per_node = {}
    for name, be in (("numpy backend", npb), ("CPU backend", cpu)):
        ctx, g = chain_graph(be, n)
        per_node[name] = median_seconds(lambda: g.compute(be), a.repeat) / n
        ctx.close()
    print(f"(a) dispatch, graph of {n} ADD nodes of 16 floats, median of {a.repeat}")
    print(f"    numpy backend {per_node['numpy backend'] * 1e6:8.1f} us/node   "
          f"CPU backend {per_node['CPU backend'] * 1e6:6.2f} us/node   "
          f"ratio {per_node['numpy backend'] / per_node['CPU backend']:.0f}x")

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
    npb.close()
    cpu.close()


if __name__ == "__main__":
    main()
