"""Generate cffi declarations from the pinned ggml headers and compile the ``pyggml._ggml`` module.

Used at build time by ``build_ggml.py`` (and by anything else that needs the same declarations,
e.g. a cffi embedding module). Nothing here is hand-kept per function: the headers are the source
of truth.

1. ``preprocess()``: the C preprocessor expands the seven headers with empty stand-ins for the
   libc headers (cffi knows ``size_t``, ``int64_t``, ``FILE``... itself) and attributes removed.
2. ``cdef_source()``: three textual fix-ups cffi's parser needs (listed in ``FIXUPS``), the
   integer ``#define`` constants, and one ``extern "Python"`` trampoline for every C callback type
   (``callback_table()``).
3. ``compile_extension()``: cffi API (out-of-line) mode. The C compiler sees the real headers, so
   every struct layout and vtable is checked against them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pycparser
from pycparser import c_generator
from pycparser import c_ast

HEADERS = ["ggml.h", "ggml-alloc.h", "ggml-backend.h", "ggml-cpu.h", "gguf.h", "ggml-opt.h",
           "ggml-backend-impl.h"]

#: Declared in the headers but defined in no ggml library: referencing them from an API-mode
#: module makes its import fail with "undefined symbol".
UNDEFINED_FUNCTIONS = {
    "ggml_threadpool_get_n_threads": "declared in ggml-cpu.h but defined nowhere in ggml v0.20.2",
}

#: (pattern, replacement, why) applied to the preprocessed text.
FIXUPS = [
    (r"static const size_t GGML_TENSOR_SIZE = sizeof\(struct ggml_tensor\);",
     "static const size_t GGML_TENSOR_SIZE;",
     "cffi takes the value of a 'static const' from the compiler, it cannot evaluate sizeof"),
    (r"\[64 / sizeof\(int32_t\)\]",
     "[...]",
     "op_params' length: cffi cannot evaluate sizeof, the compiler fills in '...'"),
]

#: Names of the ``void *`` parameter that carries the caller's payload in a callback type.
USERDATA_NAMES = {"user_data", "userdata", "data", "comm_ctx"}

#: vtable slots whose owning object is not the first argument. ggml-backend.cpp calls
#: ``backend_dst->iface.cpy_tensor_async(backend_src, backend_dst, src, dst)``.
OWNER_ARG = {("ggml_backend_i", "cpy_tensor_async"): 1}

EXTERN_PREFIX = "pyggml_cb_"

_LIBC_STUBS = ["stdbool.h", "stddef.h", "stdint.h", "stdio.h", "stdlib.h", "string.h"]
# typedefs pycparser needs to parse the expanded headers (cffi knows these names natively)
_PYCPARSER_PRELUDE = "".join(
    f"typedef int {n};\n" for n in
    ["size_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
     "uint64_t", "bool", "FILE", "intptr_t", "uintptr_t"])


def _cpp(include_dir: Path, extra: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for name in _LIBC_STUBS:
            Path(tmp, name).write_text("")
        tu = Path(tmp, "all.h")
        tu.write_text("".join(f'#include "{h}"\n' for h in HEADERS))
        cc = os.environ.get("CC", "cc").split()
        cmd = cc + ["-E", "-P", "-nostdinc", "-I", tmp, "-I", str(include_dir),
                    "-D__attribute__(x)=", "-Drestrict=", "-D__restrict__=", *extra, str(tu)]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def preprocess(include_dir: Path) -> str:
    """The seven headers, macro-expanded, without comments and ``#`` lines."""
    return _cpp(include_dir, [])


def macro_constants(include_dir: Path) -> list[str]:
    """cffi declarations for the object-like ``GGML_*``/``GGUF_*`` macros with a constant value:
    integers as ``#define NAME ...``, string literals as ``static const char *const NAME;``
    (the compiler supplies both values)."""
    text = _cpp(include_dir, ["-dM"])
    decls = []
    for line in sorted(text.splitlines()):
        m = re.match(r"#define ((?:GGML|GGUF)_[A-Z0-9_]+) (.+)$", line)
        if not m:
            continue
        if re.fullmatch(r"[()\s\d*+\-<>xXa-fA-FuUlL]+", m.group(2)):
            decls.append(f"#define {m.group(1)} ...")
        elif re.fullmatch(r'"[^"\\]*"', m.group(2)):
            decls.append(f"static const char *const {m.group(1)};")
    return decls


def _parse(expanded: str) -> c_ast.FileAST:
    # pycparser has no cffi '...' array length
    return pycparser.CParser().parse(_PYCPARSER_PRELUDE + expanded.replace("[...]", "[1]"), "ggml-headers")


def _innermost(node):
    while not isinstance(node, c_ast.TypeDecl):
        node = node.type
    return node


def _declaration(func: c_ast.FuncDecl, name: str) -> str:
    """``func`` (a FuncDecl) as a C prototype named ``name``."""
    import copy
    func = copy.deepcopy(func)
    _innermost(func).declname = name
    return c_generator.CGenerator().visit(c_ast.Decl(name, [], [], [], [], func, None, None)) + ";"


def _params(func: c_ast.FuncDecl) -> list[tuple[str | None, str]]:
    """(name, C type text) of each parameter; ``[]`` for ``(void)``."""
    gen = c_generator.CGenerator()
    out = []
    for p in (func.args.params if func.args else []):
        if isinstance(p, c_ast.Typename) and gen.visit(p.type) == "void":
            continue
        out.append((p.name, gen.visit(p.type)))
    return out


def _is_funcptr(t) -> bool:
    return isinstance(t, c_ast.PtrDecl) and isinstance(t.type, c_ast.FuncDecl)


def callback_table(expanded: str) -> list[dict]:
    """One entry per C callback type in the headers.

    - every ``typedef R (*name)(...)``: kind ``"userdata"`` (the payload argument is at ``index``)
      or ``"global"`` (no payload argument: one Python callable per process);
    - every function-pointer member of a struct (the vtables of ggml-backend-impl.h): kind
      ``"slot"``, dispatched to ``ffi.from_handle(args[index].context)``.
    """
    table = []
    for ext in _parse(expanded).ext:
        if isinstance(ext, c_ast.Typedef) and _is_funcptr(ext.type):
            func = ext.type.type
            params = _params(func)
            ud = [i for i, (n, t) in enumerate(params) if n in USERDATA_NAMES and t == "void *"]
            table.append(dict(
                name=EXTERN_PREFIX + ext.name, ctype=ext.name, kind="userdata" if ud else "global",
                index=ud[0] if ud else None, decl=_declaration(func, EXTERN_PREFIX + ext.name)))
        struct = getattr(ext, "type", None)
        if isinstance(ext, c_ast.Decl) and isinstance(struct, c_ast.Struct) and struct.decls:
            for member in struct.decls:
                if _is_funcptr(member.type):
                    name = f"{EXTERN_PREFIX}{struct.name}__{member.name}"
                    table.append(dict(
                        name=name, ctype=f"struct {struct.name}.{member.name}", kind="slot",
                        index=OWNER_ARG.get((struct.name, member.name), 0),
                        decl=_declaration(member.type.type, name)))
    return table


def cdef_source(include_dir: Path) -> tuple[str, list[dict]]:
    """The full cdef text and the callback table."""
    expanded = preprocess(include_dir)
    for pattern, repl, _why in FIXUPS:
        expanded, n = re.subn(pattern, repl, expanded)
        if n != 1:
            raise RuntimeError(f"fix-up {pattern!r} matched {n} times, expected once: headers changed?")
    for name in UNDEFINED_FUNCTIONS:
        expanded, n = re.subn(rf"^[^;{{}}]*\b{name}\s*\([^;]*\);", "", expanded, flags=re.M)
        if n != 1:
            raise RuntimeError(f"declaration of {name} not found exactly once")
    # ggml-alloc.h and ggml-backend.h both typedef the same opaque pointers: keep the first.
    seen: set[str] = set()
    lines = []
    for line in expanded.splitlines():
        stmt = " ".join(line.split())
        if stmt.startswith("typedef") and stmt.endswith(";") and "(" not in stmt:
            if stmt in seen:
                continue
            seen.add(stmt)
        lines.append(line)
    expanded = "\n".join(lines)
    table = callback_table(expanded)
    macros = macro_constants(include_dir)
    externs = [f'extern "Python" {e["decl"]}' for e in table]
    return "\n".join([expanded, *macros, *externs]) + "\n", table


def write_table(table: list[dict], path: Path) -> None:
    rows = ",\n".join(
        f"    ({e['name']!r}, {e['ctype']!r}, {e['kind']!r}, {e['index']!r})" for e in table)
    path.write_text(
        '"""Generated by pyggml/_ffi_build.py from the pinned headers: do not edit.\n\n'
        "(extern name, C callback type, dispatch kind, payload/owner argument index)\n"
        '"""\n'
        f"CALLBACKS = [\n{rows},\n]\n")


def make_ffibuilder(include_dir: Path, lib_dir: Path, module: str = "pyggml._ggml"):
    import cffi
    cdef, table = cdef_source(include_dir)
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(cdef)
    ffibuilder.set_source(
        module,
        "".join(f'#include "{h}"\n' for h in HEADERS),
        include_dirs=[str(include_dir)],
        library_dirs=[str(lib_dir)],
        libraries=["ggml", "ggml-base", "ggml-cpu"],
        # the bundled libraries come first: DT_RPATH ($ORIGIN) is searched before LD_LIBRARY_PATH
        extra_link_args=["-Wl,-rpath,$ORIGIN/lib", "-Wl,--disable-new-dtags"],
        # the six GGML_DEPRECATED functions are bound too
        extra_compile_args=["-Wno-deprecated-declarations"],
    )
    return ffibuilder, table


def compile_extension(pkg_dir: Path, tmp_dir: Path) -> Path:
    """Compile ``pyggml._ggml`` into ``pkg_dir`` from ``pkg_dir/include`` and ``pkg_dir/lib``."""
    pkg_dir, tmp_dir = pkg_dir.resolve(), tmp_dir.resolve()  # cffi compiles from tmp_dir
    ffibuilder, table = make_ffibuilder(pkg_dir / "include", pkg_dir / "lib")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    write_table(table, pkg_dir / "_callback_table.py")
    so = Path(ffibuilder.compile(tmpdir=str(tmp_dir), verbose=False))
    target = pkg_dir / so.name
    os.replace(so, target)
    return target


if __name__ == "__main__":  # python pyggml/_ffi_build.py INCLUDE_DIR: print the cdef
    print(cdef_source(Path(sys.argv[1]))[0])
