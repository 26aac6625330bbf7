"""The ggml versions pyggml builds, and the headers its bindings are generated from.

This is the one place that names upstream versions. A ggml version is built from a
hash-pinned source archive on PyPI; ``PINS`` maps each supported version to it. Moving to a
new ggml is a new row here (see "How to move to a new ggml" in ``docs/install.rst``), then a
rebuild and the test suite.

Each row also says where the few upstream files that pyggml's tests and examples compile come
from (``extras``): ``tests/test-backend-ops.cpp`` (upstream's oracle, run against the NumPy
backend), ``examples/simple`` (ported to Python; the test compiles the C originals) and
``examples/mnist`` (the training benchmark's C anchor), and any file a standalone build needs
that the tree lacks (``ggml.pc.in``, the pkg-config template). They are unpacked into the same
``vendor/ggml-<version>/`` tree, at those paths. llama.cpp's copy of ggml has no ``tests/`` or
``examples/``: its ``test-backend-ops.cpp`` is llama.cpp's own (the same file, kept in sync by
upstream), and the examples come from ggml 0.20.2's archive (the ggml repository's own tree, no
longer a pin), whose C API they use is unchanged.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["Archive", "Pin", "PINS", "DEFAULT_VERSION", "HEADERS", "INTERNAL_HEADERS", "BACKEND_HEADERS",
           "OTHER_BACKENDS", "selected_version"]


@dataclass(frozen=True)
class Archive:
    """A source archive on the package index: ``project``'s file ``filename`` with ``sha256``."""
    project: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Pin:
    """How to get ggml ``version``: the ``ggml`` folder at ``folder`` inside ``archive`` (a path
    relative to the archive's top folder), plus ``extras``: {path in the tree: (archive,
    path inside that archive relative to its top folder)}. ``undefined_functions``: declared in
    the headers but defined in no library of this version (binding them would make the
    extension's import fail), with the reason."""
    version: str
    archive: Archive
    folder: str
    extras: dict[str, tuple[Archive, str]] = field(default_factory=dict)
    undefined_functions: dict[str, str] = field(default_factory=dict)


#: ggml v0.20.2, the upstream ggml repository's tree as packaged by ggml-python's sdist: no longer
#: built, the source of the upstream examples and ggml.pc.in that llama.cpp's ggml folder lacks.
_LIBGGML_0_20_2 = Archive("libggml-python", "libggml_python-0.20.2.post1.tar.gz",
                          "e47ff53506342959ffb3ce15380b82828fea10ec5f208f9ef6915895f1a7a176")
#: ggml 0.25.3, the ggml folder of the llama.cpp that llama-cpp-python 0.3.36 vendors.
_LLAMA_CPP_PYTHON_0_3_36 = Archive("llama-cpp-python", "llama_cpp_python-0.3.36.tar.gz",
                                   "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
#: ggml 0.26.0, the ggml folder of the llama.cpp that xllamacpp 2026.10.11549 vendors.
_XLLAMACPP_2026_10_11549 = Archive("xllamacpp", "xllamacpp-2026.10.11549.tar.gz",
                                   "c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b")

_THREADPOOL_N_THREADS = "declared in ggml-cpu.h but defined in no ggml library"
_CUDA_ALLREDUCE = ("declared in ggml-cuda.h but defined in no ggml library (the CUDA module offers "
                   "ggml_backend_comm_allreduce_tensor through ggml_backend_reg_get_proc_address)")
_UNDEFINED = {"ggml_threadpool_get_n_threads": _THREADPOOL_N_THREADS,
              "ggml_backend_cuda_allreduce_tensor": _CUDA_ALLREDUCE}

#: examples/simple and examples/mnist exist only in the ggml repository's own tree; their C API
#: (ggml.h, ggml-backend.h, ggml-opt.h) is the same in both versions.
_EXAMPLES = {f"examples/{p}": (_LIBGGML_0_20_2, f"ggml/examples/{p}") for p in (
    "simple/simple-ctx.cpp", "simple/simple-backend.cpp",
    "mnist/mnist-common.cpp", "mnist/mnist-common.h", "mnist/mnist-train.cpp", "mnist/mnist-eval.cpp")}

def _llama_cpp(version: str, archive: Archive, root: str) -> Pin:
    """ggml ``version`` as the ``ggml`` folder of the llama.cpp tree at ``root`` in ``archive``.
    llama.cpp keeps upstream's test-backend-ops.cpp in its own tests/ folder, its license is
    ggml's (MIT, "The ggml authors"), and its ggml folder lacks ggml.pc.in, which a standalone
    CMake build configures."""
    return Pin(version, archive, f"{root}/ggml",
               extras={"tests/test-backend-ops.cpp": (archive, f"{root}/tests/test-backend-ops.cpp"),
                       "ggml.pc.in": (_LIBGGML_0_20_2, "ggml/ggml.pc.in"),
                       "LICENSE": (archive, f"{root}/LICENSE"),
                       **_EXAMPLES},
               undefined_functions=_UNDEFINED)


#: Every ggml version pyggml builds: version -> its :class:`Pin`.
PINS: dict[str, Pin] = {
    "0.25.3": _llama_cpp("0.25.3", _LLAMA_CPP_PYTHON_0_3_36, "vendor/llama.cpp"),
    "0.26.0": _llama_cpp("0.26.0", _XLLAMACPP_2026_10_11549, "thirdparty/llama.cpp"),
}

#: The version a plain build gets; ``PYGGML_GGML_VERSION`` picks another row of :data:`PINS`.
DEFAULT_VERSION = "0.26.0"

#: Headers the bindings are generated from (paths in the ggml tree). The last one is internal:
#: upstream's CMake does not install it, but Python backends need its vtables.
HEADERS = ["include/ggml.h", "include/ggml-alloc.h", "include/ggml-backend.h", "include/ggml-cpu.h",
           "include/gguf.h", "include/ggml-opt.h", "src/ggml-backend-impl.h"]

#: Internal headers copied into ``pyggml/include`` but not bound: pyggml's own C
#: (``pyggml_build/csrc``) reads ``struct ggml_cgraph`` there (a graph's uid).
INTERNAL_HEADERS = ["src/ggml-impl.h"]

#: ``PYGGML_BACKENDS`` names pyggml builds, checks and binds, with each one's public header.
BACKEND_HEADERS = {"cpu": "include/ggml-cpu.h", "cuda": "include/ggml-cuda.h",
                   "vulkan": "include/ggml-vulkan.h", "rpc": "include/ggml-rpc.h",
                   "blas": "include/ggml-blas.h"}

#: Other ggml backends: accepted from ``CMAKE_ARGS`` (``-DGGML_HIP=ON``...) and built as modules,
#: but pyggml neither checks their prerequisites nor binds their headers.
OTHER_BACKENDS = ["cann", "hip", "metal", "musa", "opencl", "sycl", "webgpu", "zdnn", "zendnn",
                  "openvino", "virtgpu", "hexagon"]


def selected_version(value: str | None = None) -> Pin:
    """The :class:`Pin` for ``value`` (default: ``$PYGGML_GGML_VERSION``, else
    :data:`DEFAULT_VERSION`). Raises ValueError for a version without a row in :data:`PINS`."""
    version = value or os.environ.get("PYGGML_GGML_VERSION") or DEFAULT_VERSION
    try:
        return PINS[version]
    except KeyError:
        raise ValueError(f"ggml {version} is not one pyggml pins (known: {', '.join(sorted(PINS))}); "
                         "add a row to pyggml_build/pins.py to build it") from None
