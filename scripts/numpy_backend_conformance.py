#!/usr/bin/env python3
"""Run upstream's unmodified test-backend-ops on pyggml's NumPy backend and count the results:
``scripts/pybackend_conformance.py --backend numpy`` (same options).

    python scripts/numpy_backend_conformance.py              # the whole suite (~21,000 cases)
    python scripts/numpy_backend_conformance.py -o ADD,MUL_MAT --mode support
    python scripts/numpy_backend_conformance.py --module other.so --expect-refused -o ADD
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.argv[1:1] = ["--backend", "numpy"]
    runpy.run_path(str(Path(__file__).with_name("pybackend_conformance.py")), run_name="__main__")
