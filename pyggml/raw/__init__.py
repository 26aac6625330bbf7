"""The raw layer: ggml's C API under its C names, as C has it.

``from pyggml.raw import ffi, lib`` (also ``from pyggml import ffi, lib``): every function, enum
value and integer/string constant of the pinned headers (:mod:`pyggml_build.pins`), unchecked:
a failed ``GGML_ASSERT`` aborts the process, as in C. Beside it: :mod:`.boundary` (calls into C
that may call back into Python), :mod:`.callbacks` (C callbacks written in Python), :mod:`.dl`
(backend modules) and :mod:`.log` (ggml's log into :mod:`logging`).

Loading: the libraries in ``pyggml/lib`` are opened by absolute path before ``pyggml._ggml`` is
imported, so the dynamic linker binds the extension to them (matched by soname) and never to
another ``libggml.so`` found through ``LD_LIBRARY_PATH`` or the system paths. The extension also
carries an ``$ORIGIN/lib`` DT_RPATH as a second line of defence.
"""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

__all__ = ["ffi", "lib", "CData", "LIB_DIR", "INCLUDE_DIR", "PACKAGE_DIR", "BUILD_INFO", "GGML_VERSION", "requires"]

PACKAGE_DIR = Path(__file__).resolve().parent.parent
LIB_DIR = PACKAGE_DIR / "lib"
INCLUDE_DIR = PACKAGE_DIR / "include"

#: what the build recorded in pyggml/_build_info.json ({} if absent), read once here
BUILD_INFO: dict[str, Any] = (json.loads((PACKAGE_DIR / "_build_info.json").read_text())
                              if (PACKAGE_DIR / "_build_info.json").is_file() else {})
_DL = bool(BUILD_INFO.get("backend_dl", False))
# dependency order: base has no ggml dependency, cpu needs base, ggml (the registry) needs both.
# In a GGML_BACKEND_DL build the CPU backend is a module that ggml loads itself (pyggml.raw.dl).
_LIBRARIES = ["libggml-base.so", "libggml.so"] if _DL else ["libggml-base.so", "libggml-cpu.so", "libggml.so"]

# ggml's abort handler forks gdb for a backtrace unless this is set; it is read when the library
# is loaded, so it must be set before the first dlopen.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")
if "blas" in BUILD_INFO.get("backends", ()):
    # ggml's BLAS and CPU backends take turns on the same cores, split after split, and each
    # side's idle threads spin on them after their turn. OpenBLAS's for 2^28 cycles (about
    # 0.1 s): MNIST FC training on [BLAS, CPU] took 7.8 s per epoch instead of 0.7 s (2 cores);
    # 2^4: they sleep at once. ggml's CPU threads (OpenMP, libgomp) for GOMP_SPINCOUNT, 300,000
    # by default: MiniLM's batch of 64 took 248 ms instead of 110 ms, FC training 1.68 s per
    # epoch instead of 0.75 s; 0 and 100 were slow too (313 / 187 ms: every split then wakes
    # sleeping threads), 1,000-10,000 alike. Each library reads its variable once, when it
    # loads: libgomp with libggml-base.so below (unless the process had it already), OpenBLAS
    # with the BLAS module. Values the user set are kept.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")


def _preload() -> list[ctypes.CDLL]:
    missing = [n for n in _LIBRARIES if not (LIB_DIR / n).is_file()]
    if missing:
        hint = "Build them with `pip install .` or, for development, `python build_ggml.py`."
        if (PACKAGE_DIR.parent / "build_ggml.py").is_file():
            hint = (f"This is the unbuilt pyggml of a source checkout ({PACKAGE_DIR}), imported "
                    "because the current directory comes first on sys.path: run from another "
                    "directory to use an installed pyggml, or build in place with "
                    "`python build_ggml.py`.")
        raise ImportError(f"pyggml's ggml libraries are missing from {LIB_DIR}: "
                          f"{', '.join(missing)}. {hint}")
    return [ctypes.CDLL(str(LIB_DIR / n)) for n in _LIBRARIES]


_handles = _preload()

from .._ggml import ffi, lib  # noqa: E402  (after the libraries it links are loaded)

# Type checkers read ffi, lib and CData from pyggml/_ggml.pyi, generated with the extension from
# the same declarations (pyggml_build/stubs.py): every function of lib with its C signature.
if TYPE_CHECKING:
    from .._ggml import CData
else:
    #: the type of every C object cffi gives (pointers, structs, arrays): ``<cdata ...>``
    CData = ffi.CData

#: The upstream ggml release the bindings were generated from (``ggml_version()``).
GGML_VERSION: str = ffi.string(lib.ggml_version()).decode()

if BUILD_INFO.get("ggml_version") and GGML_VERSION != BUILD_INFO["ggml_version"]:
    # the extension is bound to another process's ggml (a program that loaded its own ggml
    # first, e.g. one loading a module of `python -m pyggml.impl.module`): its structs and backend
    # vtables (GGML_BACKEND_API_VERSION) are not the ones pyggml was generated from
    raise ImportError(f"pyggml was generated from the headers of ggml {BUILD_INFO['ggml_version']}, "
                      f"but the ggml library this process runs is {GGML_VERSION}: their structs and "
                      "backend interfaces differ. Use a pyggml built for that ggml "
                      "(PYGGML_GGML_VERSION), or a program linked against pyggml's own libraries "
                      f"({LIB_DIR})")


def requires(function: str) -> Any:
    """``lib.<function>``, or AttributeError naming the ggml this pyggml was built with when its
    headers lack it. The one place where the Pythonic layer learns what a ggml version has: from
    the generated declarations, never from a version number. (Vtable slots whose signature
    changed are read the same way: :func:`pyggml.impl._vtable.slot_arity`.)"""
    fn = getattr(lib, function, None)
    if fn is None:
        raise AttributeError(f"{function} is not in ggml {GGML_VERSION}, which this pyggml was built "
                             "with: it came with a later ggml (rebuild pyggml with it: PYGGML_GGML_VERSION)")
    return fn
