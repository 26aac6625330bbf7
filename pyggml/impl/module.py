"""Turn a Python backend into a ggml backend module that any ggml program can load.

    python -m pyggml.impl.module build my_backend.py -o libggml-mine.so
    python -m pyggml.impl.module build pyggml.impl.numpy:make_registry -o libggml-numpy.so
    GGML_BACKEND_PATH=$PWD/libggml-mine.so test-backend-ops -b MINE

``my_backend.py`` defines ``registry``: a :class:`pyggml.impl.PyRegistry` (not registered: the
loading program registers it); or name an importable ``module:attr``. The result is a shared library exporting ``ggml_backend_init``
(ggml's dynamic-backend entry point, ``ggml_backend_load`` / ``GGML_BACKEND_PATH``), made with
cffi's embedding mode: on the first call it starts Python, imports pyggml (the installation that
built the module) and runs the script.

Requirements: Python built as a shared library (``Py_ENABLE_SHARED``), a C compiler, and a
host program linked against pyggml's own ``libggml*.so`` (``pyggml/lib``): one process must
hold one copy of ggml, or the module's registry and the program's are two different ones.
ggml opens modules with ``RTLD_LOCAL``; a constructor in the module re-opens libpython with
``RTLD_GLOBAL`` so that Python's extension modules can find its symbols.
"""
from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import cffi

from ..raw import PACKAGE_DIR

__all__ = ["build_module"]

_SOURCE = r"""
#include <dlfcn.h>
#include <stdio.h>
__attribute__((constructor)) static void pyggml_promote_libpython(void) {
    /* ggml dlopen()s backend modules RTLD_LOCAL; Python extension modules need libpython's
       symbols in the global scope */
    if (!dlopen("%(soname)s", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) {
        fprintf(stderr, "pyggml module: could not promote %(soname)s: %%s\n", dlerror());
    }
}
"""

_INIT = """
import sys
sys.path.insert(0, {pkg_parent!r})
import importlib
import runpy
import pyggml
from pyggml.impl import PyRegistry
from {module} import ffi

_source, _attr = {source!r}, {attr!r}
if _source.endswith(".py"):
    _registry = runpy.run_path(_source, run_name="pyggml_backend_module").get(_attr)
else:
    _registry = getattr(importlib.import_module(_source), _attr, None)
if callable(_registry) and not isinstance(_registry, PyRegistry):
    _registry = _registry()
if not isinstance(_registry, PyRegistry):
    raise TypeError(_source + " must define `" + _attr + "`: a pyggml.impl.PyRegistry or a function returning one")

@ffi.def_extern()  # an exception returns NULL: ggml then refuses the module
def ggml_backend_init():
    return ffi.cast("void *", int(pyggml.ffi.cast("uintptr_t", _registry.ptr)))
"""


def build_module(source: str | os.PathLike[str], output: str | os.PathLike[str], *, verbose: bool = False) -> Path:
    """Compile a backend module into the shared library ``output``.

    ``source`` is a Python file defining ``registry``, or ``package.module[:attr]`` naming an
    importable module and its attribute (default ``registry``): a
    :class:`~pyggml.impl.PyRegistry` or a function returning one, e.g.
    ``pyggml.impl.numpy:make_registry``.

    Raises RuntimeError if this Python is not a shared build, FileNotFoundError for a missing
    script; compiler errors propagate from cffi.
    """
    source, _, attr = str(source).partition(":")
    attr = attr or "registry"
    if source.endswith(".py"):
        if not Path(source).is_file():
            raise FileNotFoundError(source)
        source = str(Path(source).resolve())
    output = Path(output).resolve()
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise RuntimeError("a backend module embeds Python: this interpreter is not built as a "
                           "shared library (Py_ENABLE_SHARED)")
    soname = sysconfig.get_config_var("INSTSONAME")
    module = "_pyggml_module_" + "".join(c if c.isalnum() else "_" for c in output.stem)
    ffibuilder = cffi.FFI()
    ffibuilder.embedding_api("void * ggml_backend_init(void);")
    ffibuilder.set_source(module, _SOURCE % {"soname": soname}, libraries=["dl"],
                          extra_link_args=[f"-L{sysconfig.get_config_var('LIBDIR')}",
                                           f"-Wl,-rpath,{sysconfig.get_config_var('LIBDIR')}"])
    ffibuilder.embedding_init_code(_INIT.format(pkg_parent=str(PACKAGE_DIR.parent), module=module,
                                                source=source, attr=attr))
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(ffibuilder.compile(tmpdir=tmp, target=module + ".*", verbose=verbose))
        output.parent.mkdir(parents=True, exist_ok=True)
        os.replace(built, output)
    return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyggml.impl.module", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a backend module from a Python script")
    b.add_argument("source", help="a Python file defining `registry` (a pyggml.impl.PyRegistry), "
                                  "or package.module[:attr], e.g. pyggml.impl.numpy:make_registry")
    b.add_argument("-o", "--output", required=True, help="shared library to write, e.g. libggml-mine.so")
    b.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    out = build_module(a.source, a.output, verbose=a.verbose)
    print(f"wrote {out}: load it with GGML_BACKEND_PATH={out} or ggml_backend_load()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
