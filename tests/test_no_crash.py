"""Bad input never kills the interpreter: hypothesis throws random op/shape/type combinations at
the Pythonic layer in subprocesses (tests/fuzz_ops_worker.py) and the interpreter deaths
(a GGML_ASSERT -> abort()) are counted. The count must be 0."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyggml

pytest.importorskip("hypothesis")

WORKER = Path(__file__).with_name("fuzz_ops_worker.py")
SEEDS = [1, 2, 3, 4]
EXAMPLES = 300


def test_random_ops_never_abort():
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent), GGML_NO_BACKTRACE="1")
    deaths, calls, last = 0, 0, []
    for seed in SEEDS:
        r = subprocess.run([sys.executable, str(WORKER), str(seed), str(EXAMPLES)], env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode < 0 or r.returncode == 134:
            deaths += 1
            last.append(f"seed {seed}: died ({r.returncode}) in: {r.stdout.strip().splitlines()[-1]}\n"
                        f"{r.stderr.strip()[-500:]}")
            continue
        assert r.returncode == 0, r.stderr[-3000:]
        calls += int(re.search(r"calls=(\d+)", r.stdout).group(1))
    print(f"{len(SEEDS) * EXAMPLES} random examples, {calls} pyggml calls, {deaths} interpreter deaths")
    assert deaths == 0, "\n".join(last)
