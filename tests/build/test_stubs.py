"""pyggml_build.stubs: the extension's stub and the unchecked op methods, generated from cffi's
parsed declarations (tests/test_typing.py runs mypy on what the build wrote)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cffi
import pytest

from pyggml_build import declarations, stubs

CDEF = """
struct ggml_context;
struct ggml_tensor { int64_t ne[4]; };
struct params { size_t size; void *buf; };
typedef struct params *params_t;
enum ggml_colour { GGML_RED, GGML_GREEN = 5 };
#define GGML_MAX_THINGS ...
int64_t ggml_count(const char *name, void *data, float *xs, struct params p, params_t pp,
                   enum ggml_colour c, bool flag, double d, size_t n);
void ggml_log(const char *fmt, ...);
struct params ggml_default_params(void);
struct ggml_tensor *ggml_myop(struct ggml_context *ctx, struct ggml_tensor *a, int lambda, float f);
struct ggml_tensor *ggml_checked(struct ggml_context *ctx, struct ggml_tensor *a);
struct ggml_tensor *ggml_new_thing(struct ggml_context *ctx, int n);
"""

NAMES = {
    "ggml_count": ["name", "data", "xs", "p", "pp", "c", "flag", "d", "n"],
    "ggml_log": ["fmt"],
    "ggml_default_params": [],
    "ggml_myop": ["ctx", "a", "lambda", "f"],
    "ggml_checked": ["ctx", "a"],
    "ggml_new_thing": ["ctx", "n"],
}


def _builder() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi


def _functions() -> dict[str, stubs.Function]:
    return {n: stubs.Function("test.h", list(p), f"/* {n} */") for n, p in NAMES.items()}


def test_lib_stub_maps_c_types_to_what_cffi_takes_and_gives():
    text = stubs.lib_stub_source(_builder(), _functions(), "test")
    compile(text, "_ggml.pyi", "exec")  # valid Python
    assert ("    def ggml_count(self, name: CData | bytes, data: CData | bytes, xs: CData | Sequence[float], "
            "p: CData | Mapping[str, Any] | Sequence[Any], pp: CData, c: int, flag: bool, d: float, n: int, /)"
            " -> int:") in text
    assert "    def ggml_log(self, fmt: CData | bytes, /, *args: Any) -> None:" in text
    assert "    def ggml_default_params(self, /) -> CData:" in text
    for line in ("    GGML_MAX_THINGS: int", "    GGML_RED: int  # ggml_colour = 0",
                 "    GGML_GREEN: int  # ggml_colour = 5", "ffi: FFI", "lib: Lib"):
        assert line in text
    assert "/* ggml_count */" in text  # the declaration is the docstring


def test_op_methods_for_the_constructors_without_a_checked_one():
    ffi = _builder()
    assert stubs.op_constructor_names(ffi) == ["checked", "myop"]  # not ggml_new_*
    text = stubs.ops_source(ffi, _functions(), {"checked"}, "test")
    assert "    def myop(self, a: Tensor, lambda_: int, f: float) -> Tensor:" in text
    assert "def checked" not in text
    ns: dict[str, Any] = {}
    exec(compile(text, "_unchecked_ops.py", "exec"), ns)
    assert ns["UNCHECKED_OPS"] == {"myop"}

    class Ctx(ns["UncheckedOps"]):
        def op(self, name: str, *args: Any) -> Any:
            return name, args
    assert Ctx().myop("A", f=2.0, lambda_=1) == ("myop", ("A", 1, 2.0))


def test_hand_written_ops_are_read_from_ops_py():
    names = stubs.hand_written_ops(declarations.OPS_PY)
    assert {"add", "mul_mat", "unary", "op", "reshape", "flash_attn"} <= names
    assert "conv_transpose_1d" not in names and "_install_unchecked_ops" not in names


def test_parameter_names_and_header_text_come_from_the_headers(built_package):
    info = json.loads((built_package / "_build_info.json").read_text())
    fns = declarations.function_info(built_package / "include", info["headers"])
    f = fns["ggml_conv_transpose_1d"]
    assert f.header == "ggml.h" and f.params == ["ctx", "a", "b", "s0", "p0", "d0"]
    assert "int                   s0,  // stride" in f.source
    assert fns["pyggml_graph_check_memory"].header == "pyggml"


def test_generate_writes_what_the_build_wrote(built_package, tmp_path):
    """`build_ggml.py --generate-only` (and the build, through write_python_files) writes the
    four generated files; they are the package's own, so the package's stub is current."""
    pkg = tmp_path / "pyggml"
    (pkg / "raw").mkdir(parents=True)
    shutil.copytree(built_package / "include", pkg / "include")
    shutil.copy2(built_package / "_build_info.json", pkg)
    written = declarations.generate(pkg)
    names = sorted(str(p.relative_to(pkg.resolve())) for p in written)
    assert names == ["_enums.py", "_ggml.pyi", "_unchecked_ops.py", "raw/_callback_table.py"]
    for name in names:
        assert (pkg / name).read_text() == (built_package / name).read_text(), (
            f"{built_package / name} is not what the generator writes now: "
            "`python build_ggml.py --generate-only` (or rebuild)")


@pytest.fixture
def built_package() -> Path:
    pyggml = pytest.importorskip("pyggml")
    pkg = Path(pyggml.PACKAGE_DIR)
    if not (pkg / "_build_info.json").is_file() or not (pkg / "include").is_dir():
        pytest.skip("needs a built pyggml")
    return pkg
