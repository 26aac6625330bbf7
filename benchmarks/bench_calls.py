#!/usr/bin/env python3
"""Per-call cost of the raw bindings: pyggml (cffi, API mode) against ggml-python (ctypes).

    python benchmarks/bench_calls.py [--repeat 5]

Measured (median of ``--repeat`` runs, each timing many calls):
  - ``ggml_nelements(t)``: the cheapest possible call, i.e. the binding's own overhead;
  - ``ggml_add(ctx, a, b)``: node creation in a no_alloc context;
  - building a graph of 1000 chained ``ggml_add`` nodes (context, nodes, ``ggml_build_forward_expand``).
ggml-python is the reference when it is installed (``pip install ggml-python``); the ratio column is
ggml-python's time divided by pyggml's (> 1: pyggml is faster). Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import statistics
import time


def _timeit(fn, n: int, repeat: int) -> float:
    """Median seconds per call of fn() over ``repeat`` runs of ``n`` calls."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs)


class PyGGML:
    name = "pyggml (cffi)"

    def __init__(self):
        from pyggml import ffi, lib
        self.ffi, self.lib = ffi, lib

    def ctx(self, mem: int):
        return self.lib.ggml_init({"mem_size": mem, "mem_buffer": self.ffi.NULL, "no_alloc": True})

    def free(self, ctx):
        self.lib.ggml_free(ctx)


class GGMLPython:
    name = "ggml-python (ctypes)"

    def __init__(self):
        import ggml
        self.lib = ggml

    def ctx(self, mem: int):
        g = self.lib
        return g.ggml_init(g.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))

    def free(self, ctx):
        self.lib.ggml_free(ctx)


def bench(b, repeat: int) -> dict[str, float]:
    lib = b.lib
    ctx = b.ctx(64 * 1024 * 1024)
    t = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, 64, 64)

    def nelements(n):
        f = lib.ggml_nelements
        for _ in range(n):
            f(t)

    n_add = 100_000

    def add(n):
        lib.ggml_reset(ctx)
        a = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 16)
        f = lib.ggml_add
        for _ in range(n):
            f(ctx, a, a)

    overhead = lib.ggml_tensor_overhead() * 1100 + lib.ggml_graph_overhead_custom(2048, False)

    def graph(n):
        for _ in range(n):
            c = b.ctx(overhead)
            x = lib.ggml_new_tensor_1d(c, lib.GGML_TYPE_F32, 16)
            for _ in range(1000):
                x = lib.ggml_add(c, x, x)
            gf = lib.ggml_new_graph_custom(c, 2048, False)
            lib.ggml_build_forward_expand(gf, x)
            assert lib.ggml_graph_n_nodes(gf) == 1000
            b.free(c)

    out = {
        "ggml_nelements": _timeit(nelements, 200_000, repeat),
        "ggml_add (node)": _timeit(add, n_add, repeat),
        "1000-node graph": _timeit(graph, 20, repeat),
    }
    b.free(ctx)
    return out


def fmt(s: float) -> str:
    return f"{s * 1e9:.0f} ns" if s < 1e-6 else f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    ours = bench(PyGGML(), a.repeat)
    try:
        ref = bench(GGMLPython(), a.repeat)
    except ImportError:
        ref = None
        print("ggml-python is not installed: pip install ggml-python for the side-by-side run")
    print(f"{'per call':<18} {'pyggml (cffi)':>15} {'ggml-python (ctypes)':>22} {'ratio':>8}")
    for k, v in ours.items():
        r = ref[k] if ref else None
        print(f"{k:<18} {fmt(v):>15} {fmt(r) if r else '-':>22} {f'{r / v:.2f}x' if r else '-':>8}")


if __name__ == "__main__":
    main()
