"""Every function, struct layout and callback type of the pinned headers is reachable from pyggml.

The lists are read from the headers shipped in ``pyggml/include`` at test time, two independent
ways that must agree (a regex over the comment-stripped text, and gcc's ``-aux-info`` prototype
dump); neither uses the generator in ``pyggml_build/declarations.py``. The header list and the
functions known to be undefined are what the build recorded (``pyggml.raw.BUILD_INFO``).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import compiler

import pyggml
from pyggml import callbacks, ffi, lib
from pyggml.raw import BUILD_INFO

# the seven pinned headers, plus the header of each extra backend of this build (ggml-rpc.h...)
HEADERS = BUILD_INFO["headers"]
BACKEND_HEADERS = BUILD_INFO["backend_headers"]
UNDEFINED_FUNCTIONS = BUILD_INFO["undefined_functions"]
INCLUDE = pyggml.INCLUDE_DIR


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def regex_functions(header: str) -> set[str]:
    """Names declared with GGML_API / GGML_BACKEND_API in ``header``: the identifier before the
    first '(' of each declaration."""
    text = _strip_comments((INCLUDE / header).read_text())
    text = re.sub(r"#\s*define(?:[^\n]*\\\n)*[^\n]*", " ", text)  # macro bodies mention GGML_API
    names = set()
    for m in re.finditer(r"\bGGML_(?:BACKEND_)?API\b([^;(]*)\(", text):
        names.add(re.findall(r"\w+", m.group(1))[-1])
    return names


@pytest.fixture(scope="module")
def aux_info(tmp_path_factory) -> dict[str, set[str]]:
    """gcc -aux-info: every prototype the compiler saw, grouped by the header it came from."""
    tmp = tmp_path_factory.mktemp("aux")
    tu = tmp / "all.c"
    tu.write_text("".join(f'#include "{h}"\n' for h in HEADERS))
    out = tmp / "aux.txt"
    subprocess.run([compiler("gcc"), "-fsyntax-only", f"-aux-info={out}", "-I", str(INCLUDE), str(tu)],
                   check=True)
    found: dict[str, set[str]] = {h: set() for h in HEADERS}
    for line in out.read_text().splitlines():
        m = re.match(r"/\* (\S+):\d+:\w+ \*/ (.*)", line)
        if m and Path(m.group(1)).name in found and Path(m.group(1)).parent.resolve() == INCLUDE.resolve():
            name = re.search(r"(\w+)\s*\((?!\*)", m.group(2)).group(1)
            found[Path(m.group(1)).name].add(name)
    return found


@pytest.mark.parametrize("header", HEADERS)
def test_two_readings_of_the_header_agree(header, aux_info):
    names = regex_functions(header)
    assert names, f"no functions found in {header}"
    assert names == aux_info[header]


@pytest.mark.parametrize("header", HEADERS)
def test_every_declared_function_is_in_lib(header):
    names = regex_functions(header)
    missing = sorted(n for n in names - set(UNDEFINED_FUNCTIONS) if not hasattr(lib, n))
    assert missing == []
    print(f"{header}: {len(names)} functions, all reachable")


@pytest.mark.parametrize("backend", [b for b in pyggml.dl.built_backends() if b in BACKEND_HEADERS])
def test_backend_functions_are_bound_to_the_module_ggml_loaded(backend):
    """In a GGML_BACKEND_DL build each function of a backend's header calls through a pointer
    that pyggml bound to the module ggml loaded; otherwise they are linked (not trampolines)."""
    names = regex_functions(BACKEND_HEADERS[backend]) - set(UNDEFINED_FUNCTIONS)
    bound = {n: lib.pyggml_dl_is_bound(n.encode()) for n in names}
    if not pyggml.dl.is_dl():
        assert set(bound.values()) == {-1}
    elif pyggml.dl.status()[backend].loaded:
        assert set(bound.values()) == {1}, sorted(n for n, v in bound.items() if v != 1)
    else:
        assert set(bound.values()) == {0}


def _exported(so: Path) -> set[str]:
    """Functions ``so`` exports (``nm -D``: read from the file, nothing is loaded, so a GPU
    module is read on a machine without the GPU's driver too)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(so)], check=True, capture_output=True,
                         text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if " T " in line}


def test_the_functions_left_unbound_are_exactly_those_no_library_defines():
    """The exclusions (pins.py: declared in a header, defined in no library) are checked both
    ways against every library of this build: each one is exported by none, and every other
    declared function is exported by one (or is a GGML_BACKEND_DL trampoline target), so a
    new ggml that drops or adds such a function fails here instead of at import."""
    exported: set[str] = set()
    for so in sorted(pyggml.LIB_DIR.glob("*.so*")):
        exported |= _exported(so)
    declared = set().union(*(regex_functions(h) for h in HEADERS))
    assert set(UNDEFINED_FUNCTIONS) & exported == set()
    shipped = set(UNDEFINED_FUNCTIONS) & declared  # ggml-cuda.h's is shipped by CUDA builds only
    assert "ggml_threadpool_get_n_threads" in shipped
    assert sorted(declared - exported - set(UNDEFINED_FUNCTIONS)) == []


def test_functions_are_callable():
    assert ffi.string(lib.ggml_version()).decode() == pyggml.GGML_VERSION
    assert lib.ggml_type_size(lib.GGML_TYPE_F32) == 4
    assert ffi.string(lib.ggml_op_name(lib.GGML_OP_ADD)) == b"ADD"


# --------------------------------------------------------------------------------------------
# struct layouts: ffi against the C compiler

LAYOUT_STRUCTS = [
    "ggml_backend_buffer_type_i", "ggml_backend_buffer_type", "ggml_backend_buffer_i",
    "ggml_backend_buffer", "ggml_backend_i", "ggml_backend", "ggml_backend_event",
    "ggml_backend_device_i", "ggml_backend_device", "ggml_backend_reg_i", "ggml_backend_reg",
    "ggml_tensor", "ggml_init_params", "ggml_backend_dev_props", "ggml_type_traits",
    "ggml_cplan", "ggml_threadpool_params", "gguf_init_params", "ggml_opt_params",
]


def test_struct_sizes_and_offsets_match_the_compiler(tmp_path):
    lines = []
    for s in LAYOUT_STRUCTS:
        lines.append(f'printf("{s} %zu\\n", sizeof(struct {s}));')
        for field, _ in ffi.typeof(f"struct {s}").fields:
            lines.append(f'printf("{s}.{field} %zu\\n", offsetof(struct {s}, {field}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n"
                   + "".join(f'#include "{h}"\n' for h in HEADERS)
                   + "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([compiler("gcc"), "-I", str(INCLUDE), str(src), "-o", str(exe)], check=True)
    theirs = dict(line.rsplit(" ", 1) for line in
                  subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    ours = {}
    for s in LAYOUT_STRUCTS:
        ours[s] = str(ffi.sizeof(f"struct {s}"))
        for field, f in ffi.typeof(f"struct {s}").fields:
            ours[f"{s}.{field}"] = str(f.offset)
    assert ours == theirs


# --------------------------------------------------------------------------------------------
# callback types: every one has an extern "Python" trampoline

def regex_callback_types() -> set[str]:
    found = set()
    for h in HEADERS:
        text = _strip_comments((INCLUDE / h).read_text())
        found |= set(re.findall(r"typedef[^;{}]*?\(\s*\*\s*(\w+)\s*\)\s*\(", text))
        for struct, body in re.findall(r"struct (\w+)\s*\{(.*?)\};", text, flags=re.S):
            for member in re.findall(r"\(\s*\*\s*(\w+)\s*\)\s*\(", body):
                found.add(f"struct {struct}.{member}")
    return found


def test_every_callback_type_has_a_trampoline():
    declared = regex_callback_types()
    assert len(declared) > 60
    assert declared == set(callbacks.SPECS)
    for spec in callbacks.SPECS.values():
        assert hasattr(lib, spec.name)
