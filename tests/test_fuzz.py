"""A short run of the state machine fuzzer (tests/fuzz_state_worker.py): random sequences of
pyggml calls (contexts, tensors, ops, graphs across contexts, graph allocators and schedulers
reused, backends and threadpools, buffers, graph caches, Python backends whose methods raise;
closes, resets and uses after close in any order), each seed in its own interpreter so that a
GGML_ASSERT or a crash is seen as a death. Every result is checked against NumPy, and every
exception a callback raised must come out of the call that ran it.

This budget is a smoke test (a few seconds); scripts/fuzz.sh runs long campaigns."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyggml

pytest.importorskip("hypothesis")

WORKER = Path(__file__).with_name("fuzz_state_worker.py")
SEEDS = [1, 2]
EXAMPLES = 20
STEPS = 40


def run_seed(seed: int) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent), GGML_NO_BACKTRACE="1",
               FUZZ_NO_SHRINK="1")
    r = subprocess.run([sys.executable, str(WORKER), str(seed), str(EXAMPLES), str(STEPS)], env=env,
                       capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + "\n" + r.stderr


def test_state_machine_short_campaign():
    calls, problems = 0, []
    for seed in SEEDS:
        rc, out = run_seed(seed)
        m = re.findall(r"^calls=(\d+)", out, re.M)
        calls += int(m[-1]) if m else 0
        lines = [ln for ln in out.splitlines() if ln.strip()]
        if rc < 0 or rc in (134, 139):
            steps = [ln for ln in out.splitlines() if ln and not ln.startswith((" ", "Fatal", "Current"))]
            problems.append(f"seed {seed}: interpreter died ({rc}) in step: "
                            f"{steps[-1] if steps else '?'}\n{out[-3000:]}")
        elif rc != 0:
            failure = next((ln for ln in reversed(lines) if ln.startswith("FAILURE")), "FAILURE ?")
            problems.append(f"seed {seed}: {failure}\n{out[-6000:]}")
    print(f"{len(SEEDS)} seeds, {calls} pyggml calls, {len(problems)} failures")
    assert not problems, "\n\n".join(problems)
    assert calls > 200, "the machine made almost no calls: it is not exercising pyggml"
