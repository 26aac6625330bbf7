"""pyggml_build.vecmath: glibc's vector erff for ggml's GELU-erf loops, where it works."""
from __future__ import annotations

import math
import platform
from pathlib import Path

import numpy as np
import pytest

from pyggml_build import vecmath

GLIBC = platform.libc_ver()
#: glibc >= 2.35 on x86_64 has the vector erff; GCC vectorizes with a simd declaration
OFFERED = (platform.machine() == "x86_64" and GLIBC[0] == "glibc"
           and tuple(int(p) for p in GLIBC[1].split(".")[:2]) >= (2, 35))


def test_the_probe_turns_it_on_where_glibc_offers_it(tmp_path, monkeypatch):
    monkeypatch.delenv("PYGGML_VECTOR_MATH", raising=False)
    monkeypatch.delenv("CFLAGS", raising=False)
    args = vecmath.vector_math_args(tmp_path, [])
    header = tmp_path / "vecmath" / "pyggml_vecmath.h"
    if not OFFERED:
        assert args == []
        return
    assert header.read_text() == vecmath.HEADER
    assert args == [f"-DCMAKE_C_FLAGS=-include {header}", f"-DCMAKE_CXX_FLAGS=-include {header}",
                    "-DCMAKE_C_STANDARD_LIBRARIES=-lmvec", "-DCMAKE_CXX_STANDARD_LIBRARIES=-lmvec"]


def test_it_is_off_when_asked_or_when_the_user_sets_the_flags_or_no_compiler_vectorizes(tmp_path, monkeypatch):
    monkeypatch.setenv("PYGGML_VECTOR_MATH", "0")
    assert vecmath.vector_math_args(tmp_path, []) == []
    monkeypatch.delenv("PYGGML_VECTOR_MATH")
    assert vecmath.vector_math_args(tmp_path, ["-DCMAKE_C_FLAGS=-O2"]) == []
    assert vecmath.vector_math_args(tmp_path, ["-DCMAKE_CXX_FLAGS:STRING=-O2"]) == []
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert vecmath.vector_math_args(tmp_path, []) == []


def test_user_cflags_are_kept_before_the_include(tmp_path, monkeypatch):
    if not OFFERED:
        pytest.skip(f"no vector erff in this C library ({GLIBC})")
    monkeypatch.delenv("PYGGML_VECTOR_MATH", raising=False)
    monkeypatch.setenv("CFLAGS", "-g1")
    args = vecmath.vector_math_args(tmp_path, [])
    assert args[0] == f"-DCMAKE_C_FLAGS=-g1 -include {tmp_path / 'vecmath' / 'pyggml_vecmath.h'}"


def _built_with_vector_math() -> bool:
    from pyggml.raw import dl
    return any("pyggml_vecmath.h" in a for a in dl.build_info().get("cmake_args", []))


def test_the_built_cpu_library_calls_the_vector_erff_and_gelu_erf_stays_exact():
    """The installed build: when its CMake arguments name the header, ggml's CPU library calls
    glibc's vector erff; either way GELU-erf matches 0.5 x (1 + erf(x / sqrt 2)) in double
    precision (Python's math.erf) over [-10, 10] and the ranges where erf saturates."""
    import pyggml
    from pyggml import Context, GGMLType
    from pyggml.backends.cpu import graph_compute

    libdir = Path(pyggml.__file__).parent / "lib"
    cpu = [p for p in libdir.glob("libggml-cpu*.so")]
    if _built_with_vector_math():
        assert cpu and all(b"_ZGV" in p.read_bytes() for p in cpu), cpu
    x = np.concatenate([np.linspace(-10, 10, 200_001), [0.0, -0.0, 1e-30, -1e-30, 5e-39, 30.0, -30.0,
                                                        1e30, -1e30]]).astype(np.float32)
    ref = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    with Context(16 << 20) as ctx:
        t = ctx.from_numpy(x)
        out = ctx.gelu_erf(t)
        graph_compute(ctx.new_graph().build_forward(out), n_threads=2)
        got = out.numpy()
    err = np.abs(got.astype(np.float64) - ref)
    # 7e-7: glibc's AVX-512 erff (_ZGVeN16v_erff, which GCC calls on AVX-512 machines) is -1.0
    # already from x/sqrt(2) = -3.65, where 1 + erf is 2.4e-7: gelu_erf(-5.17) gives 0 for
    # -6.2e-7 (the scalar erff and the AVX2 variant stay within 1e-7 there)
    assert np.all(err <= 7e-7 * np.maximum(1.0, np.abs(ref))), (x[np.argmax(err)], err.max())
