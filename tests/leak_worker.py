"""Leak worker for tests/test_leaks.py: create/use/close cycles of one object kind, and the
growth of this process's resident memory (RSS) over them.

    python tests/leak_worker.py KIND [CYCLES]

Runs CYCLES // 10 warm-up cycles (allocator pools, caches and lazily made module state settle),
then CYCLES cycles, collecting garbage before each RSS reading. Prints
``KIND cycles=N growth_kib=G``. Each cycle creates the object, uses it the way a program does
(a graph placed, a tensor written), and closes it; objects that outlive the cycles (a long-lived
context or backend that every cycle's objects touch) are made once, so what they accumulate
per cycle (references held for closed objects) is counted too.
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Any, Callable

import numpy as np

import pyggml
from pyggml import (
    Context,
    CPUBackend,
    GGMLType,
    GraphAllocator,
    GraphCache,
    Scheduler,
    Threadpool,
)
from pyggml.backends.graph_cache import GraphParts
from pyggml.backends.cpu import cpu_buffer_type
from pyggml.backends.device import device_by_name
from pyggml.impl import numpy as numpy_backend
from pyggml.backends.cpu import graph_compute

F32 = GGMLType.F32
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes of this process now (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def kinds() -> dict[str, Callable[[], Callable[[], None]]]:
    """KIND -> a setup returning one cycle (setups make the long-lived objects)."""

    def context() -> Callable[[], None]:
        def cycle() -> None:
            with Context(1 << 14) as ctx:
                a = ctx.new_tensor(F32, [16])
                ctx.add(a, a)
        return cycle

    def graph() -> Callable[[], None]:
        x = np.arange(8, dtype=np.float32)

        def cycle() -> None:
            with Context(1 << 16) as ctx:
                t = ctx.from_numpy(x)
                g = ctx.new_graph(8).build_forward(ctx.sqr(t))
                graph_compute(g)
        return cycle

    def cross_context() -> Callable[[], None]:
        weights = Context(1 << 16)
        w = weights.from_numpy(np.ones(8, np.float32))

        def cycle() -> None:  # a compute context per step reading a long-lived one
            with Context.for_tensors(8, graph_size=8) as ctx:
                ctx.new_graph(8).build_forward(ctx.mul(w, w))
        return cycle

    def buffer() -> Callable[[], None]:
        buft = cpu_buffer_type()

        def cycle() -> None:
            with buft.alloc_buffer(4096) as b:
                b.clear(0)
        return cycle

    def alloc_tensors() -> Callable[[], None]:
        backend = CPUBackend()
        x = np.ones(16, np.float32)

        def cycle() -> None:
            with Context.for_tensors(4) as ctx:
                t = ctx.new_tensor(F32, [16])
                with ctx.alloc_tensors(backend):
                    t.set(x)
        return cycle

    def graph_allocator() -> Callable[[], None]:
        backend = CPUBackend()
        ctx = Context.for_tensors(8, graph_size=8)  # one context, many allocators
        a = ctx.new_tensor(F32, [16]).set_input()
        g = ctx.new_graph(8).build_forward(ctx.sqr(a))
        x = np.ones(16, np.float32)

        def cycle() -> None:
            with GraphAllocator(backend) as ga:
                ga.alloc_graph(g)
                a.set(x)
                backend.graph_compute(g)
        return cycle

    def scheduler() -> Callable[[], None]:
        backend = CPUBackend()
        ctx = Context.for_tensors(8, graph_size=8)
        a = ctx.new_tensor(F32, [16]).set_input()
        g = ctx.new_graph(8).build_forward(ctx.sqr(a))
        x = np.ones(16, np.float32)

        def cycle() -> None:
            with Scheduler([backend], graph_size=8) as s:
                s.alloc_graph(g)
                a.set(x)
                s.compute(g)
        return cycle

    def cpu_backend() -> Callable[[], None]:
        def cycle() -> None:
            with CPUBackend(1) as be:
                be.synchronize()
        return cycle

    def threadpool() -> Callable[[], None]:
        backend = CPUBackend(1)

        def cycle() -> None:
            with Threadpool(1) as pool:
                backend.set_threadpool(pool)
                backend.set_threadpool(None)
        return cycle

    def numpy_backend_() -> Callable[[], None]:
        numpy_backend.register()
        dev = device_by_name("NUMPY")

        def cycle() -> None:
            with dev.init() as be:
                be.synchronize()
        return cycle

    def graph_cache() -> Callable[[], None]:
        backend = CPUBackend()

        def build(g: GraphParts, n: int) -> dict[str, Any]:
            x = g.input(F32, [4 * n], "x")
            return {"y": g.ctx.sqr(x)}

        x = np.ones(4, np.float32)

        def cycle() -> None:
            with GraphCache(build, backend=backend, graph_size=8, n_tensors=4) as cache:
                cache.compute(1, x=x)
        return cycle

    kept: list[Any] = []

    def leaky() -> Callable[[], None]:
        """A deliberate leak of ~250 bytes a cycle (2.5 MB over 10,000): the measurement must
        see it (tests/test_leaks.py checks that it does)."""
        def cycle() -> None:
            with Context(1 << 10):
                pass
            kept.append(bytearray(200))
        return cycle

    return {"leaky": leaky, "context": context, "graph": graph, "cross_context": cross_context, "buffer": buffer,
            "alloc_tensors": alloc_tensors, "graph_allocator": graph_allocator,
            "scheduler": scheduler, "cpu_backend": cpu_backend, "threadpool": threadpool,
            "numpy_backend": numpy_backend_, "graph_cache": graph_cache}


def main(argv: list[str]) -> int:
    kind = argv[1]
    cycles = int(argv[2]) if len(argv) > 2 else 10_000
    pyggml.raw.log.uninstall()
    cycle = kinds()[kind]()
    for _ in range(max(cycles // 10, 100)):
        cycle()
    gc.collect()
    before = rss()
    for _ in range(cycles):
        cycle()
    gc.collect()
    growth = rss() - before
    print(f"{kind} cycles={cycles} growth_kib={growth // 1024}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
