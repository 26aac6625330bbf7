"""pyggml._cobject: the lifetime scheme, also at interpreter exit."""
from __future__ import annotations

import os


import pyggml


def test_objects_left_open_at_interpreter_exit_are_harmless(tmp_path):
    """Finalizers at interpreter exit never crash: leave everything open and exit."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np, pyggml
        be = pyggml.CPUBackend()
        ctx = pyggml.Context.for_tensors(8, graph_size=8)
        t = ctx.from_numpy(np.ones(4, dtype=np.float32))
        buf = ctx.alloc_tensors(be)
        t.set(np.ones(4, dtype=np.float32))
        view = t.numpy(copy=False)
        sched = pyggml.Scheduler([be])
        cycle = [ctx, be, sched]; cycle.append(cycle)
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
