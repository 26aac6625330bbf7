"""pyggml.cpu: the CPU backend (Ctrl-C)."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import pyggml
from pyggml import Context, CPUBackend, GGMLType


def test_ctrl_c_interrupts_a_cpu_compute():
    """SIGINT during compute: the abort callback stops it and KeyboardInterrupt is raised."""
    with CPUBackend(n_threads=1) as be, Context(256 << 20) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [512, 512])
        x.set(np.ones((512, 512), dtype=np.float32) * 1e-3)
        y = x
        for _ in range(200):
            y = ctx.mul_mat(x, y)
        g = ctx.new_graph(512).build_forward(y)
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                g.compute(be)
        finally:
            timer.cancel()


def test_closing_a_threadpool_a_backend_uses_gives_the_backend_its_own_threads_back():
    with CPUBackend() as be, Context.for_tensors(8, graph_size=8) as ctx:
        pool = pyggml.Threadpool(2)
        be.set_threadpool(pool)
        a = ctx.new_tensor(GGMLType.F32, [64]).set_input()
        y = ctx.sqr(a)
        g = ctx.new_graph(8).build_forward(y)
        with pyggml.GraphAllocator(be) as galloc:
            galloc.alloc_graph(g)
            a.set(np.ones(64, np.float32))
            pool.close()                         # would be a use after free at the next compute
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), np.ones(64))
