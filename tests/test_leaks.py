"""No leaks: 10,000 create/use/close cycles of each object kind grow the resident memory (RSS)
by less than 1 MB. Each kind runs in its own interpreter (tests/leak_worker.py), after warm-up
cycles; a deliberate leak of ~2.5 MB over the same cycles shows the measurement can fail."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyggml

WORKER = Path(__file__).with_name("leak_worker.py")
CYCLES = 10_000
LIMIT_KIB = 1024
KINDS = ["context", "graph", "cross_context", "buffer", "alloc_tensors", "graph_allocator",
         "scheduler", "cpu_backend", "threadpool", "numpy_backend", "graph_cache"]


def growth_kib(kind: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent), GGML_NO_BACKTRACE="1")
    r = subprocess.run([sys.executable, str(WORKER), kind, str(CYCLES)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-1000:]}\n{r.stderr[-3000:]}"
    m = re.search(r"growth_kib=(-?\d+)", r.stdout)
    assert m, r.stdout
    return int(m.group(1))


@pytest.mark.parametrize("kind", KINDS)
def test_create_close_cycles_do_not_grow_rss(kind):
    kib = growth_kib(kind)
    print(f"{kind}: {CYCLES} cycles, RSS +{kib} KiB")
    assert kib < LIMIT_KIB, f"{CYCLES} {kind} cycles grew RSS by {kib} KiB"


def test_the_measurement_sees_a_leak():
    assert growth_kib("leaky") >= LIMIT_KIB
