#!/usr/bin/env python3
"""Run upstream's unmodified test-backend-ops on a ggml backend written in Python (pyggml's
NumPy or torch backend, or any ``module:make_registry``) and count the results.

    python scripts/pybackend_conformance.py                      # NumPy backend, whole suite (~21,000 cases)
    python scripts/pybackend_conformance.py --backend torch -j 2 # torch backend (PYGGML_TORCH_DEVICE=cpu default)
    python scripts/pybackend_conformance.py -o ADD,MUL_MAT --mode support
    python scripts/pybackend_conformance.py --registry my_pkg.backend:make_registry --device MINE0
    python scripts/pybackend_conformance.py --module other.so --expect-refused -o ADD

Builds (once, into build/conformance/) test-backend-ops from the vendored ggml source against
pyggml's own libraries and the backend as a loadable module (``python -m pyggml.impl.module
build``), then runs ``GGML_BACKEND_PATH=libggml-<name>.so test-backend-ops <mode> -b DEVICE``.
Prints passed / failed / not supported per op and in total; exits 1 if any case failed.

``--module`` runs another backend module instead (one of a pyggml built for another ggml), and
``--expect-refused`` checks that this ggml refuses it with a clear message instead of crashing.
``scripts/numpy_backend_conformance.py`` is this script with ``--backend numpy``.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pyggml
from pyggml.impl.module import build_module

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "conformance"

#: --backend NAME -> (registry spec, device tested, module file name)
BACKENDS = {
    "numpy": ("pyggml.impl.numpy:make_registry", "NUMPY", "libggml-numpy.so"),
    "torch": ("pyggml.impl.torch:make_registry", "TORCH0", "libggml-torch.so"),
}


def build_test_backend_ops() -> Path:
    exe = OUT / "test-backend-ops"
    tree = ROOT / "vendor" / f"ggml-{pyggml.GGML_VERSION}"
    src = tree / "tests" / "test-backend-ops.cpp"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"compiling {src.relative_to(ROOT)} ...", flush=True)
        subprocess.run(["g++", "-O1", "-std=c++17", str(src), "-I", str(tree / "include"),
                        "-L", str(pyggml.LIB_DIR), "-lggml", "-lggml-base", "-lggml-cpu",
                        f"-Wl,-rpath,{pyggml.LIB_DIR}", "-lpthread", "-o", str(exe)], check=True)
    return exe


def count(output: str) -> dict[str, collections.Counter]:
    """Per op: OK / FAIL / not supported, from test-backend-ops' console output."""
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in output.splitlines():
        m = re.match(r"(?:\s+|\[[A-Z_0-9]+\] .*?\s{2,})([A-Z_0-9]+)\(.*\):\s+(.*)$", line)
        if not m:
            continue
        status = re.sub(r"\x1b\[[0-9;]*m", "", m.group(2))
        if status.startswith("OK"):
            per_op[m.group(1)]["passed"] += 1
        elif status.startswith("SUPPORTED"):
            per_op[m.group(1)]["supported"] += 1
        elif status.startswith("FAIL"):
            per_op[m.group(1)]["failed"] += 1
        elif status.startswith("not supported") or status.startswith("NOT SUPPORTED"):
            per_op[m.group(1)]["not supported"] += 1
    return per_op


def count_backends(output: str) -> set[str]:
    """The backends test-backend-ops tested ("Backend NAME: OK/FAIL" lines)."""
    return set(re.findall(r"Backend (\w+): ", re.sub(r"\x1b\[[0-9;]*m", "", output)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--ops", help="comma-separated ops (test-backend-ops -o)")
    p.add_argument("-p", "--params", help="a regex the cases' parameters must match (test-backend-ops -p)")
    p.add_argument("--mode", default="test", choices=["test", "support"])
    p.add_argument("-j", "--jobs", type=int, default=1)
    p.add_argument("--backend", default="numpy", choices=sorted(BACKENDS),
                   help="which of pyggml's Python backends (default numpy)")
    p.add_argument("--registry", help="another backend: MODULE:FUNCTION making its registry (with --device)")
    p.add_argument("--device", help="the device test-backend-ops tests (-b; default: the backend's first)")
    p.add_argument("--module", type=Path, help="a backend module to load instead of building one")
    p.add_argument("--expect-refused", action="store_true",
                   help="the module must be refused with a message (it was built for another ggml)")
    a = p.parse_args()
    spec, device, lib_name = BACKENDS[a.backend]
    if a.registry:
        if not a.device:
            p.error("--registry needs --device")
        spec, lib_name = a.registry, "libggml-" + re.sub(r"\W+", "-", a.registry) + ".so"
    device = a.device or device
    exe = build_test_backend_ops()
    module = a.module or build_module(spec, OUT / lib_name)
    cmd = [str(exe), a.mode, "-b", device] + (["-o", a.ops] if a.ops else []) + (["-p", a.params] if a.params else [])
    if a.jobs > 1:
        cmd += ["-j", str(a.jobs)]
    env = dict(os.environ, GGML_BACKEND_PATH=str(module))
    # the module's embedded Python starts from the base installation's sys.path: give it this
    # interpreter's (a virtual environment's site-packages, where torch may be)
    env["PYTHONPATH"] = os.pathsep.join([x for x in sys.path if x] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if a.backend == "torch":
        env.setdefault("PYGGML_TORCH_DEVICE", "cpu")
    print(f"test-backend-ops {a.mode} -b {device} ({spec if not a.module else a.module})", flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if a.expect_refused:
        said = [line for line in (r.stdout + r.stderr).splitlines()
                if any(s in line for s in ("pyggml was generated from the headers", "incompatible API version",
                                           "undefined symbol", "failed to initialize backend"))]
        print("\n".join(said) or r.stderr[-2000:])
        ok = r.returncode >= 0 and said and device not in count_backends(r.stdout)
        print(f"test-backend-ops exited with {r.returncode}: the module was "
              + ("refused with a message" if ok else "NOT refused cleanly"))
        return 0 if ok else 1
    per_op = count(r.stdout)
    total: collections.Counter = collections.Counter()
    for op in sorted(per_op):
        c = per_op[op]
        total.update(c)
        print(f"{op:<22} " + "  ".join(f"{k} {c[k]}" for k in ("passed", "failed", "supported", "not supported") if c[k]))
    print("total: " + ", ".join(f"{v} {k}" for k, v in total.items()))
    if r.returncode != 0 and not total["failed"]:
        print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
    return 1 if total["failed"] or (a.mode == "test" and r.returncode != 0) else 0


if __name__ == "__main__":
    sys.exit(main())
