"""Step 2c, vector math: glibc's vector ``erff`` (libmvec) for ggml's CPU loops over ``erff``.

ggml's CPU kernel of ``GGML_UNARY_OP_GELU_ERF`` (``ggml_vec_gelu_erf_f32``, BERT's exact GELU)
calls the C library's scalar ``erff`` once per element: 17 ns per element on this project's
machine, on MiniLM's activations (data-dependent branches), where its matrix products take far
less. GCC turns such a loop into calls of glibc's vector variant (``_ZGVdN8v_erff``, 8 floats
per call with AVX2; 0.9 ns per element) when ``erff`` is declared ``simd``, as glibc's own
``<math.h>`` does only under ``-ffast-math``, which ggml cannot take (its masks are ``-inf``).
So the build force-includes a one-line header declaring just that (:data:`HEADER`, no
``#include``: a file's own ``_GNU_SOURCE`` still comes first) and links ``libmvec``. The source
stays upstream's, byte for byte; results move by at most 1 ulp of ``erf`` (glibc's vector
``erff`` is within 2 ulp of the exact value, the scalar one within 1: measured over 533,114
floats in [-10, 10]).

It is used only where a probe shows it works: the C and C++ compilers CMake will use
(``$CC``, ``$CXX``) vectorize a GELU loop into ``_ZGV..._erff`` calls with the header, and a
shared object links against ``libmvec`` (glibc >= 2.35 on x86_64). Elsewhere (clang, macOS,
musl, older glibc) nothing changes. ``PYGGML_VECTOR_MATH=0`` turns it off; a ``CMAKE_C_FLAGS``
or ``CMAKE_CXX_FLAGS`` in ``$CMAKE_ARGS`` wins over it (the build then says so). The portable
wheel (``scripts/build_wheels.sh``) is built without it: ``libmvec`` is not a library the
manylinux policy allows.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import log
from .config import cmake_value

__all__ = ["HEADER", "vector_math_args"]

#: The force-included declaration (C and C++); the C++ one repeats glibc's ``noexcept``.
HEADER = """\
/* pyggml build (pyggml_build/vecmath.py): glibc's vector erff (libmvec) for loops over erff.
   No #include here, so that a file's own feature macros (_GNU_SOURCE) still come first. */
#ifdef __cplusplus
extern "C" float erff(float) noexcept __attribute__((__simd__("notinbranch")));
#else
extern float erff(float) __attribute__((__nothrow__, __leaf__, __simd__("notinbranch")));
#endif
"""

_PROBE = """\
void pyggml_probe_gelu(int n, float * y, const float * x) {
    for (int i = 0; i < n; ++i) {
        float xi = x[i];
        y[i] = 0.5f*xi*(1.0f + erff(xi*0.70710678f));
    }
}
"""
_PROBE_CXX = "#include <cmath>\n#include <math.h>\n" + _PROBE
_PROBE_C = "#include <math.h>\n" + _PROBE


def _vectorizes(compiler: str, suffix: str, code: str, header: Path, tmp: Path) -> str | None:
    """None when ``compiler`` built a shared object whose GELU loop calls a vector erff and
    that links against libmvec; else why not."""
    exe = shlex.split(compiler)
    if not exe or shutil.which(exe[0]) is None:
        return f"no compiler {compiler!r}"
    src, out = tmp / f"probe{suffix}", tmp / f"probe{suffix}.so"
    src.write_text(code)
    cmd = exe + ["-O3", "-fPIC", "-shared", "-include", str(header), str(src), "-o", str(out), "-lmvec"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{compiler}: {e}"
    if r.returncode != 0:
        return f"{compiler} could not build the probe ({(r.stderr.strip().splitlines() or ['?'])[-1]})"
    data = out.read_bytes()
    if b"_ZGV" not in data or b"erff" not in data:
        return f"{compiler} did not vectorize erff"
    return None


def vector_math_args(cache_dir: Path, user_args: list[str]) -> list[str]:
    """CMake arguments that give ggml's CPU loops glibc's vector ``erff`` (see the module
    docstring), or [] where the probe says it would not work (logged)."""
    if os.environ.get("PYGGML_VECTOR_MATH", "1") == "0":
        log("vector math: off (PYGGML_VECTOR_MATH=0)")
        return []
    if not sys.platform.startswith("linux"):
        return []
    if cmake_value(user_args, "CMAKE_C_FLAGS") is not None or cmake_value(user_args, "CMAKE_CXX_FLAGS") is not None:
        log("vector math: not used, CMAKE_ARGS sets CMAKE_C_FLAGS or CMAKE_CXX_FLAGS")
        return []
    folder = cache_dir / "vecmath"
    folder.mkdir(parents=True, exist_ok=True)
    header = folder / "pyggml_vecmath.h"
    if not header.is_file() or header.read_text() != HEADER:
        header.write_text(HEADER)
    if any(c.isspace() for c in str(header)):
        log(f"vector math: not used, its header's path has a space ({header})")
        return []
    with tempfile.TemporaryDirectory() as tmp:
        for compiler, suffix, code in ((os.environ.get("CC", "cc"), ".c", _PROBE_C),
                                       (os.environ.get("CXX", "c++"), ".cpp", _PROBE_CXX)):
            why = _vectorizes(compiler, suffix, code, header, Path(tmp))
            if why is not None:
                log(f"vector math: not used, {why}")
                return []
    log("vector math: glibc's vector erff (libmvec) for ggml's GELU-erf loops")
    include = f"-include {header}"
    return [f"-DCMAKE_C_FLAGS={(os.environ.get('CFLAGS', '') + ' ' + include).strip()}",
            f"-DCMAKE_CXX_FLAGS={(os.environ.get('CXXFLAGS', '') + ' ' + include).strip()}",
            "-DCMAKE_C_STANDARD_LIBRARIES=-lmvec", "-DCMAKE_CXX_STANDARD_LIBRARIES=-lmvec"]
