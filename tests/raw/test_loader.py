"""pyggml loads its own bundled libraries: one file each, $ORIGIN rpath, never a system libggml."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from conftest import compiler

import pyggml


def _mapped_ggml_libraries() -> set[str]:
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if "libggml" in line}


def _expected_mapped() -> set[str]:
    """libggml + libggml-base, and the CPU library; in a GGML_BACKEND_DL build instead the module
    ggml loaded for each backend that loaded."""
    if not pyggml.dl.is_dl():
        return {"libggml.so", "libggml-base.so", "libggml-cpu.so"}
    return {"libggml.so", "libggml-base.so"} | {
        os.path.basename(s.module) for s in pyggml.dl.status().values() if s.loaded}


def test_loaded_libraries_are_the_bundled_ones():
    mapped = _mapped_ggml_libraries()
    assert _expected_mapped() <= {os.path.basename(p) for p in mapped}
    # every mapped file named like one of pyggml's libraries is pyggml's own (other tests map
    # modules of their own, e.g. Python backends, and ggml maps the CPU variants it scores)
    bundled = set(os.listdir(pyggml.LIB_DIR))
    assert all(os.path.dirname(p) == str(pyggml.LIB_DIR) for p in mapped if os.path.basename(p) in bundled), mapped


def test_one_file_per_library_with_origin_rpath():
    files = sorted(os.listdir(pyggml.LIB_DIR))
    if pyggml.dl.is_dl():  # every built backend is a module (the CPU's: one, or 14 variants)
        assert files == sorted(pyggml.dl.build_info()["libraries"])
        assert {"libggml-base.so", "libggml.so"} <= set(files)
        for b in pyggml.dl.built_backends():
            assert any(f == f"libggml-{b}.so" or f.startswith(f"libggml-{b}-") for f in files), b
    else:
        assert files == ["libggml-base.so", "libggml-cpu.so", "libggml.so"]
    for name in files:
        path = pyggml.LIB_DIR / name
        assert not path.is_symlink()
        dyn = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
        module = pyggml.dl.is_dl() and name not in ("libggml.so", "libggml-base.so")
        if not module:  # modules are dlopen()ed by path: they have no soname
            assert f"Library soname: [{name}]" in dyn
        if name != "libggml-base.so":  # base needs no other ggml library
            assert re.search(r"R(UN)?PATH.*\[\$ORIGIN[]:;]", dyn), dyn


def test_a_foreign_libggml_on_LD_LIBRARY_PATH_is_ignored(tmp_path):
    """A decoy libggml*.so without any symbols: if the loader picked it, import would fail."""
    for name in ("libggml.so", "libggml-base.so", "libggml-cpu.so"):
        src = tmp_path / "empty.c"
        src.write_text("int decoy_symbol = 1;\n")
        subprocess.run([compiler("gcc"), "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(tmp_path / name),
                        str(src)], check=True)
    code = textwrap.dedent("""
        from pyggml import ffi, lib
        print(ffi.string(lib.ggml_version()).decode())
        print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libggml' in l}))
    """)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True,
                         text=True).stdout
    assert out.splitlines()[0] == pyggml.GGML_VERSION
    assert str(tmp_path) not in out and str(pyggml.LIB_DIR) in out


def test_no_backtrace_is_set_before_ggml_loads():
    assert os.environ["GGML_NO_BACKTRACE"] == "1"
