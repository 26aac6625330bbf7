"""pyggml: the ggml tensor library (pinned to ggml v0.20.2) from Python.

The raw layer mirrors C one to one::

    from pyggml import ffi, lib
    ctx = lib.ggml_init({"mem_size": 16 * 1024 * 1024, "mem_buffer": ffi.NULL, "no_alloc": False})
    a = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 4)

``lib`` holds every function, enum value and integer/string constant declared in ggml.h,
ggml-alloc.h, ggml-backend.h, ggml-cpu.h, gguf.h, ggml-opt.h and the internal ggml-backend-impl.h,
under its C name; ``ffi`` knows every struct and typedef. C callbacks are written in Python with
:mod:`pyggml.callbacks`.

Importing pyggml sets ``GGML_NO_BACKTRACE=1`` (unless already set), so a failed ``GGML_ASSERT``
aborts without forking a debugger.
"""
from __future__ import annotations

from ._loader import INCLUDE_DIR, LIB_DIR, ffi, lib

__version__ = "0.1.0"

#: The upstream ggml release the bindings are generated from.
GGML_VERSION = "0.20.2"

__all__ = ["ffi", "lib", "GGML_VERSION", "LIB_DIR", "INCLUDE_DIR", "__version__"]
