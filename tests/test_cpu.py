"""pyggml.cpu: the CPU backend (Ctrl-C)."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

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
