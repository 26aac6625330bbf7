#!/usr/bin/env python3
"""Build upstream ggml and the pyggml cffi extension in place (for development).

    python build_ggml.py                            # the default ggml, CPU tuned for this machine
    python build_ggml.py --ggml-version 0.20.2      # another pinned ggml (or PYGGML_GGML_VERSION)
    python build_ggml.py --ggml-src DIR             # your own ggml tree of a pinned version
    PYGGML_BACKENDS=cpu,vulkan,rpc python build_ggml.py   # more backends, each a loadable module
    CMAKE_ARGS="-DGGML_CUDA=on" python build_ggml.py       # the same, llama-cpp-python style

``pip install .`` runs the same steps through ``setup.py``. The steps live in the build-time
package ``pyggml_build/`` (not installed); its docstring lists them and the environment variables.
"""
import sys

from pyggml_build import main

if __name__ == "__main__":
    sys.exit(main())
