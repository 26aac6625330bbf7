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

Builds with more backends add their headers (``ggml-rpc.h``, ``ggml-cuda.h``, ``ggml-vulkan.h``,
``ggml-blas.h``). In a ``GGML_BACKEND_DL`` build those backends, the CPU one included, are modules
that ggml loads at run time and that nothing can link against: every function of their headers is
then compiled as a trampoline that calls through a pointer, which ``pyggml_dl_bind()`` fills with
``dlsym`` from the module ggml loaded (``dl_trampolines()``).
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

#: the header of each backend with a public C API of its own (the CPU's is in ``HEADERS``)
BACKEND_HEADERS = {"cpu": "ggml-cpu.h", "cuda": "ggml-cuda.h", "vulkan": "ggml-vulkan.h",
                   "rpc": "ggml-rpc.h", "blas": "ggml-blas.h"}


def headers_for(backends: list[str]) -> list[str]:
    """``HEADERS`` plus the headers of ``backends`` (in that order)."""
    return HEADERS + [BACKEND_HEADERS[b] for b in backends
                      if b in BACKEND_HEADERS and BACKEND_HEADERS[b] not in HEADERS]

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


def _cpp(include_dir: Path, extra: list[str], headers: list[str] = HEADERS, markers: bool = False) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for name in _LIBC_STUBS:
            Path(tmp, name).write_text("")
        tu = Path(tmp, "all.h")
        tu.write_text("".join(f'#include "{h}"\n' for h in headers))
        cc = os.environ.get("CC", "cc").split()
        cmd = cc + ["-E", *([] if markers else ["-P"]), "-nostdinc", "-I", tmp, "-I", str(include_dir),
                    "-D__attribute__(x)=", "-Drestrict=", "-D__restrict__=", *extra, str(tu)]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def preprocess(include_dir: Path, headers: list[str] = HEADERS) -> str:
    """The headers, macro-expanded, without comments and ``#`` lines."""
    return _cpp(include_dir, [], headers)


def functions_by_header(include_dir: Path, headers: list[str] = HEADERS) -> dict[str, tuple[str, c_ast.FuncDecl]]:
    """{function name: (header file name, declaration)} for every function the headers declare."""
    text = _cpp(include_dir, [], headers, markers=True)
    # keep the '# <line> "<file>"' markers pycparser understands; drop gcc's flags after them
    text = re.sub(r'^# (\d+) "([^"]*)".*$', r'# \1 "\2"', text, flags=re.M)
    out = {}
    for ext in _parse(text).ext:
        if isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl):
            out[ext.name] = (os.path.basename(ext.coord.file), ext.type)
    return out


def macro_constants(include_dir: Path, headers: list[str] = HEADERS) -> list[str]:
    """cffi declarations for the object-like ``GGML_*``/``GGUF_*`` macros with a constant value:
    integers as ``#define NAME ...``, string literals as ``static const char *const NAME;``
    (the compiler supplies both values)."""
    text = _cpp(include_dir, ["-dM"], headers)
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


def cdef_source(include_dir: Path, headers: list[str] = HEADERS) -> tuple[str, list[dict]]:
    """The full cdef text and the callback table."""
    expanded = preprocess(include_dir, headers)
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
    macros = macro_constants(include_dir, headers)
    externs = [f'extern "Python" {e["decl"]}' for e in table]
    return "\n".join([expanded, *macros, *externs, DL_CDEF]) + "\n", table


#: pyggml's own helpers for backend modules, in every build (a build without modules binds none)
DL_CDEF = """
int pyggml_dl_bind(const char *module, const char *path);
void pyggml_dl_unbind(const char *module);
int pyggml_dl_is_bound(const char *name);
const char *pyggml_dl_open_error(const char *path);
"""

_DL_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pyggml_dl_entry { const char *name; const char *module; void **slot; };

__attribute__((unused)) static void pyggml_dl_missing(const char *name, const char *module) {
    fprintf(stderr, "pyggml: %s() called, but ggml has not loaded the %s backend module\n", name, module);
    abort();
}
"""

_DL_C_TAIL = r"""
/* Fill the pointers of `module`'s functions from `path`, if ggml has loaded that file
   (RTLD_NOLOAD: nothing new is loaded). Returns the number bound, or -1 if it is not loaded. */
int pyggml_dl_bind(const char *module, const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) return -1;
    int n = 0;
    for (struct pyggml_dl_entry *e = pyggml_dl_table; e->name; e++) {
        if (strcmp(e->module, module) != 0) continue;
        void *f = dlsym(h, e->name);
        if (f) { *e->slot = f; n++; }
    }
    dlclose(h); /* drops only the reference taken above: ggml's handle keeps it loaded */
    return n;
}

void pyggml_dl_unbind(const char *module) {
    for (struct pyggml_dl_entry *e = pyggml_dl_table; e->name; e++)
        if (strcmp(e->module, module) == 0) *e->slot = NULL;
}

int pyggml_dl_is_bound(const char *name) {
    for (struct pyggml_dl_entry *e = pyggml_dl_table; e->name; e++)
        if (strcmp(e->name, name) == 0) return *e->slot != NULL;
    return -1;
}

/* Why `path` cannot be loaded (dlerror's message), or NULL if it can. */
const char *pyggml_dl_open_error(const char *path) {
    static __thread char buf[1024];
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) { dlclose(h); return NULL; }
    const char *err = dlerror();
    snprintf(buf, sizeof buf, "%s", err ? err : "unknown dlopen error");
    return buf;
}
"""


def _named_prototype(func: c_ast.FuncDecl, name: str) -> tuple[str, list[str]]:
    """``func`` as a C prototype named ``name`` with parameters named a0, a1...; and those names."""
    import copy
    func = copy.deepcopy(func)  # the parameters are renamed in place
    names = []
    for i, p in enumerate(func.args.params if func.args else []):
        if isinstance(p, c_ast.EllipsisParam):
            raise RuntimeError(f"{name}: variadic functions cannot be trampolined")
        if isinstance(p, c_ast.Typename) and c_generator.CGenerator().visit(p.type) == "void":
            continue
        inner = _innermost(p.type)
        inner.declname = p.name = f"a{i}"
        if isinstance(p, c_ast.Typename):  # unnamed parameter: make it a declaration
            func.args.params[i] = c_ast.Decl(p.name, p.quals, [], [], [], p.type, None, None)
        names.append(f"a{i}")
    return _declaration(func, name).rstrip(";"), names


def dl_trampolines(include_dir: Path, headers: list[str], modules: dict[str, str]) -> str:
    """C source defining every function of the module headers (``modules``: header -> module name)
    as a call through a pointer, plus ``pyggml_dl_table``."""
    parts, rows = [], []
    for name, (header, func) in sorted(functions_by_header(include_dir, headers).items()):
        module = modules.get(header)
        if module is None or name in UNDEFINED_FUNCTIONS:
            continue
        proto, args = _named_prototype(func, name)
        ret_void = c_generator.CGenerator().visit(func.type) == "void"
        call = f"pyggml_dl_{name}({', '.join(args)})"
        parts.append(
            f"static __typeof__({name}) *pyggml_dl_{name};\n"
            f"{proto} {{\n"
            f"    if (!pyggml_dl_{name}) pyggml_dl_missing(\"{name}\", \"{module}\");\n"
            f"    {'' if ret_void else 'return '}{call};\n}}\n")
        rows.append(f'    {{"{name}", "{module}", (void **)&pyggml_dl_{name}}},')
    table = "static struct pyggml_dl_entry pyggml_dl_table[] = {\n" + "\n".join(rows + ["    {NULL, NULL, NULL}"]) + "\n};\n"
    return "".join(parts) + table


def write_table(table: list[dict], path: Path) -> None:
    rows = ",\n".join(
        f"    ({e['name']!r}, {e['ctype']!r}, {e['kind']!r}, {e['index']!r})" for e in table)
    path.write_text(
        '"""Generated by pyggml/_ffi_build.py from the pinned headers: do not edit.\n\n'
        "(extern name, C callback type, dispatch kind, payload/owner argument index)\n"
        '"""\n'
        f"CALLBACKS = [\n{rows},\n]\n")


def make_ffibuilder(include_dir: Path, lib_dir: Path, module: str = "pyggml._ggml", *,
                    backends: list[str] = ["cpu"], dl: bool = False):
    """The cffi builder for ``backends``; with ``dl`` (a ``GGML_BACKEND_DL`` build) the backends'
    own functions are trampolines (see the module docstring) and only libggml and libggml-base
    are linked."""
    import cffi
    headers = headers_for(backends)
    cdef, table = cdef_source(include_dir, headers)
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(cdef)
    includes = "".join(f'#include "{h}"\n' for h in headers)
    if dl:
        modules = {BACKEND_HEADERS[b]: b for b in backends if b in BACKEND_HEADERS}
        body = _DL_C + dl_trampolines(include_dir, headers, modules) + _DL_C_TAIL
        libraries = ["ggml", "ggml-base"]
    else:
        body = _DL_C + "static struct pyggml_dl_entry pyggml_dl_table[] = {{NULL, NULL, NULL}};\n" + _DL_C_TAIL
        libraries = ["ggml", "ggml-base", "ggml-cpu"]
    ffibuilder.set_source(
        module,
        includes + body,
        include_dirs=[str(include_dir)],
        library_dirs=[str(lib_dir)],
        libraries=libraries + ["dl"],
        # the bundled libraries come first: DT_RPATH ($ORIGIN) is searched before LD_LIBRARY_PATH
        extra_link_args=["-Wl,-rpath,$ORIGIN/lib", "-Wl,--disable-new-dtags"],
        # the six GGML_DEPRECATED functions are bound too; the trampolines stay private
        extra_compile_args=["-Wno-deprecated-declarations", "-fvisibility=hidden"],
    )
    return ffibuilder, table


def compile_extension(pkg_dir: Path, tmp_dir: Path, *, backends: list[str] = ["cpu"], dl: bool = False) -> Path:
    """Compile ``pyggml._ggml`` into ``pkg_dir`` from ``pkg_dir/include`` and ``pkg_dir/lib``."""
    pkg_dir, tmp_dir = pkg_dir.resolve(), tmp_dir.resolve()  # cffi compiles from tmp_dir
    ffibuilder, table = make_ffibuilder(pkg_dir / "include", pkg_dir / "lib", backends=backends, dl=dl)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    write_table(table, pkg_dir / "_callback_table.py")
    so = Path(ffibuilder.compile(tmpdir=str(tmp_dir), verbose=False))
    target = pkg_dir / so.name
    os.replace(so, target)
    return target


if __name__ == "__main__":  # python pyggml/_ffi_build.py INCLUDE_DIR: print the cdef
    print(cdef_source(Path(sys.argv[1]))[0])
