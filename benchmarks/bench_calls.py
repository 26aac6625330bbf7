#!/usr/bin/env python3
"""Per-call cost of the bindings, printed as ratios; nothing here is asserted.

    python benchmarks/bench_calls.py [--repeat 5]

1. **Pythonic vs raw** (the issue's targets: checked op constructors <= 5x the raw cffi call,
   computing an unchanged graph <= 1.05x): each checked op constructor (``ctx.add(a, b)``...)
   against the raw call it wraps (``lib.ggml_add(ctx, a, b)``) in a no_alloc context, per node;
   ``Backend.graph_compute`` and ``Scheduler.compute`` of an unchanged, allocated 1000-node graph
   of small adds against ``ggml_backend_graph_compute`` / ``ggml_backend_sched_graph_compute`` of
   the same graph.
2. **Raw bindings, pyggml (cffi, API mode) vs ggml-python (ctypes)**, when ggml-python is
   installed (``pip install ggml-python``): ``ggml_nelements(t)`` (the binding's own overhead),
   ``ggml_add`` (node creation), building a 1000-node graph; the ratio is ggml-python's time
   divided by pyggml's (> 1: pyggml is faster).

Each figure is the median of ``--repeat`` runs, each timing many calls.
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


def bench_pythonic(repeat: int) -> list[tuple[str, float, float]]:
    """(what, Pythonic seconds, raw seconds) per call."""
    import numpy as np

    import pyggml
    from pyggml import ffi, lib

    rows = []
    per_run = 2000
    # the raw calls make their nodes in a context of their own, as a C program's would: a
    # context whose pointer raw code holds (Context.ptr) asks ggml for its free space before
    # each Pythonic node, which is the cost of mixing, not of the Pythonic constructor
    with pyggml.Context.for_tensors(16) as inputs, pyggml.Context.for_tensors(per_run + 16) as ctx, \
            pyggml.Context.for_tensors(per_run + 16) as raw_ctx:
        a = inputs.new_tensor("f32", [64, 32, 4])
        b = inputs.new_tensor("f32", [64, 32, 4])
        w = inputs.new_tensor("f32", [64, 64])
        pos = inputs.new_tensor("i32", [4])
        m = inputs.new_tensor("f32", [64, 32])
        pa, pb, pw, pp, pm = a.ptr, b.ptr, w.ptr, pos.ptr, m.ptr
        c = raw_ctx.ptr
        cases = {
            "add": (lambda: ctx.add(a, b), lambda: lib.ggml_add(c, pa, pb)),
            "mul_mat": (lambda: ctx.mul_mat(w, a), lambda: lib.ggml_mul_mat(c, pw, pa)),
            "reshape": (lambda: ctx.reshape(a, 64, 128), lambda: lib.ggml_reshape_2d(c, pa, 64, 128)),
            "view": (lambda: ctx.view(a, [64, 32], offset=0), lambda: lib.ggml_view_2d(c, pa, 64, 32, pa.nb[1], 0)),
            "permute": (lambda: ctx.permute(a, 0, 2, 1, 3), lambda: lib.ggml_permute(c, pa, 0, 2, 1, 3)),
            "rope_ext": (lambda: ctx.rope(a, pos, 64, 0), lambda: lib.ggml_rope_ext(
                c, pa, pp, ffi.NULL, 64, 0, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)),
            "soft_max_ext": (lambda: ctx.soft_max(a, m, 0.125), lambda: lib.ggml_soft_max_ext(c, pa, pm, 0.125, 0.0)),
            "rms_norm": (lambda: ctx.rms_norm(a, 1e-5), lambda: lib.ggml_rms_norm(c, pa, 1e-5)),
        }
        for name, (ours, raw) in cases.items():
            times = []
            for fn, fn_ctx in ((ours, ctx), (raw, raw_ctx)):
                def run(fn=fn, fn_ctx=fn_ctx) -> None:
                    fn_ctx.reset()  # the results' context only: the inputs live in another one
                    for _ in range(per_run):
                        fn()
                times.append(_timeit_once(run, repeat) / per_run)
            rows.append((f"ctx.{name}", times[0], times[1]))

    # an unchanged, allocated 1000-node graph, computed again and again
    with pyggml.Context.for_tensors(1100, graph_size=2048) as gctx, pyggml.CPUBackend(n_threads=1) as cpu:
        x = gctx.new_tensor("f32", [16]).set_input()
        y = x
        for _ in range(1000):
            y = gctx.add(y, x)
        graph = gctx.new_graph(2048).build_forward(y)
        with pyggml.GraphAllocator(cpu) as galloc:
            galloc.alloc_graph(graph)
            x.set(np.ones(16, np.float32))
            g, be = graph.ptr, cpu.ptr
            ours = _timeit_once(lambda: cpu.graph_compute(graph), repeat * 20)
            raw = _timeit_once(lambda: lib.ggml_backend_graph_compute(be, g), repeat * 20)
            rows.append(("Backend.graph_compute (1000 nodes)", ours, raw))
        sched = pyggml.Scheduler([cpu], graph_size=4096)
        sched.alloc_graph(graph)
        x.set(np.ones(16, np.float32))
        s = sched.ptr
        ours = _timeit_once(lambda: sched.compute(graph), repeat * 20)
        raw = _timeit_once(lambda: lib.ggml_backend_sched_graph_compute(s, g), repeat * 20)
        rows.append(("Scheduler.compute (1000 nodes)", ours, raw))
        sched.close()
    return rows


def _timeit_once(fn, repeat: int) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` after one warm-up."""
    fn()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    print(f"{'Pythonic vs raw cffi':<38} {'pyggml':>10} {'raw':>10} {'ratio':>8}")
    for name, ours_t, raw_t in bench_pythonic(a.repeat):
        print(f"{name:<38} {fmt(ours_t):>10} {fmt(raw_t):>10} {ours_t / raw_t:>7.2f}x")
    print()
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
