"""Step 4, declarations: generate cffi declarations from the pinned headers and compile the
``pyggml._ggml`` extension, plus the Python files (modules and the extension's stub) that come
from the same declarations.

Nothing here is hand-kept per function: the headers are the source of truth.

1. :func:`preprocess`: the C preprocessor expands the headers with empty stand-ins for the libc
   headers (cffi knows ``size_t``, ``int64_t``, ``FILE``... itself) and attributes removed.
2. :func:`cdef_source`: the textual fix-ups cffi's parser needs (:data:`FIXUPS`), the integer
   ``#define`` constants, and one ``extern "Python"`` trampoline for every C callback type
   (:func:`callback_table`).
3. :func:`compile_extension`: cffi API (out-of-line) mode. The C compiler sees the real headers,
   so every struct layout and vtable is checked against them. It also writes
   (:func:`write_python_files`) ``pyggml/raw/_callback_table.py`` (every callback type and how
   it is dispatched), ``pyggml/_enums.py`` (:func:`enums_source`: real ``IntEnum`` classes for
   ggml's enums, so type checkers and editors see ``GGMLType.F32``), and from
   :mod:`pyggml_build.stubs` ``pyggml/_ggml.pyi`` (the extension's stub: ``lib`` with every C
   function's signature) and ``pyggml/core/_unchecked_ops.py`` (a method for every op constructor
   without a checked one). :func:`generate` writes only these, from a finished build.

Builds with more backends add their headers (``ggml-rpc.h``, ``ggml-cuda.h``, ``ggml-vulkan.h``,
``ggml-blas.h``). In a ``GGML_BACKEND_DL`` build those backends, the CPU one included, are modules
that ggml loads at run time and that nothing can link against: every function of their headers is
then compiled as a trampoline that calls through a pointer, which ``pyggml_dl_bind()`` fills with
``dlsym`` from the module ggml loaded (:func:`dl_trampolines`).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shlex
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import cffi
import pycparser
from pycparser import c_ast, c_generator

from . import stubs
from .pins import BACKEND_HEADERS

__all__ = ["preprocess", "functions_by_header", "macro_constants", "callback_table", "cdef_source",
           "dl_trampolines", "enums_source", "function_info", "make_ffibuilder", "write_python_files",
           "generate", "compile_extension", "FIXUPS",
           "ENUMS", "EXTERN_PREFIX", "DL_CDEF"]

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


def _cpp(include_dir: Path, extra: list[str], headers: list[str], markers: bool = False) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for name in _LIBC_STUBS:
            Path(tmp, name).write_text("")
        tu = Path(tmp, "all.h")
        tu.write_text("".join(f'#include "{h}"\n' for h in headers))
        cc = os.environ.get("CC", "cc").split()
        cmd = cc + ["-E", *([] if markers else ["-P"]), "-nostdinc", "-I", tmp, "-I", str(include_dir),
                    "-D__attribute__(x)=", "-Drestrict=", "-D__restrict__=", *extra, str(tu)]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def preprocess(include_dir: Path, headers: list[str]) -> str:
    """The headers, macro-expanded, without comments and ``#`` lines."""
    return _cpp(include_dir, [], headers)


def functions_by_header(include_dir: Path, headers: list[str]) -> dict[str, tuple[str, c_ast.FuncDecl]]:
    """{function name: (header file name, declaration)} for every function the headers declare."""
    text = _cpp(include_dir, [], headers, markers=True)
    # keep the '# <line> "<file>"' markers pycparser understands; drop gcc's flags after them
    text = re.sub(r'^# (\d+) "([^"]*)".*$', r'# \1 "\2"', text, flags=re.M)
    out = {}
    for ext in _parse(text).ext:
        if isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl):
            out[ext.name] = (os.path.basename(ext.coord.file), ext.type)
    return out


def function_info(include_dir: Path, headers: list[str]) -> dict[str, "stubs.Function"]:
    """{function name: :class:`~pyggml_build.stubs.Function`} for every function of the headers and
    of pyggml's own helpers (:data:`DL_CDEF`, header ``"pyggml"``): parameter names, the
    prototype, and the header's own declaration text with the ``//`` comment lines above it."""
    text = _cpp(include_dir, [], headers, markers=True)
    text = re.sub(r'^# (\d+) "([^"]*)".*$', r'# \1 "\2"', text, flags=re.M)
    text += '\n# 1 "pyggml"\n' + DL_CDEF
    sources: dict[str, list[str]] = {}
    out = {}
    for ext in _parse(text).ext:
        if not (isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl)):
            continue
        header = os.path.basename(ext.coord.file)
        if header not in sources:
            path = include_dir / header
            sources[header] = path.read_text(errors="replace").splitlines() if path.is_file() else []
        source, comment = _declaration_text(sources[header], ext.name)
        params = [p for p in (ext.type.args.params if ext.type.args else [])
                  if not isinstance(p, c_ast.EllipsisParam)]
        names = [p.name for p in params
                 if not (isinstance(p, c_ast.Typename) and c_generator.CGenerator().visit(p.type) == "void")]
        out[ext.name] = stubs.Function(header, names,
                                       _declaration(ext.type, ext.name), source, comment)
    return out


def _declaration_text(lines: list[str], name: str) -> tuple[str, list[str]]:
    """The declaration of ``name`` in a header's ``lines`` (from the line that starts it to the
    ``;``, comments kept, dedented) and the ``//`` lines just above it; ("", []) if not found."""
    call = re.compile(rf"\b{re.escape(name)}\s*\(")
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("//", "#", "*", "/*")) or not call.search(line.split("//")[0]):
            continue
        start = i
        while start > 0 and i - start < 2 and not re.search(r"\b(GGML\w*_API|GGML_DEPRECATED)\b", lines[start]) \
                and lines[start - 1].strip() and not lines[start - 1].rstrip().endswith((";", "}", "{")) \
                and not lines[start - 1].lstrip().startswith("//"):
            start -= 1
        end = i
        while end < len(lines) - 1 and not lines[end].split("//")[0].rstrip().endswith(";"):
            end += 1
        top = start
        while top > 0 and lines[top - 1].lstrip().startswith("//"):
            top -= 1
        block = lines[top:end + 1]
        indent = min(len(ln) - len(ln.lstrip()) for ln in block if ln.strip())
        block = [ln[indent:].rstrip() for ln in block]
        return "\n".join(block[start - top:]), block[:start - top]
    return "", []


def macro_constants(include_dir: Path, headers: list[str]) -> list[str]:
    """cffi declarations for the object-like ``GGML_*``/``GGUF_*``/``RPC_*`` macros with a
    constant value (``RPC_PROTO_MAJOR_VERSION``... of ggml-rpc.h in builds with the RPC backend):
    integers as ``#define NAME ...``, string literals as ``static const char *const NAME;``
    (the compiler supplies both values)."""
    text = _cpp(include_dir, ["-dM"], headers)
    decls = []
    for line in sorted(text.splitlines()):
        m = re.match(r"#define ((?:GGML|GGUF|RPC)_[A-Z0-9_]+) (.+)$", line)
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


def _payload_index(func: c_ast.FuncDecl, names: set[str] = USERDATA_NAMES) -> int | None:
    """Position of the ``void *`` payload parameter (named one of ``names``), or None."""
    ud = [i for i, (n, t) in enumerate(_params(func)) if n in names and t == "void *"]
    return ud[0] if ud else None


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
            ud = _payload_index(func)
            table.append(dict(
                name=EXTERN_PREFIX + ext.name, ctype=ext.name, kind="global" if ud is None else "userdata",
                index=ud, decl=_declaration(func, EXTERN_PREFIX + ext.name)))
        struct = getattr(ext, "type", None)
        if isinstance(ext, c_ast.Decl) and isinstance(struct, c_ast.Struct) and struct.decls:
            for member in struct.decls:
                if _is_funcptr(member.type):
                    name = f"{EXTERN_PREFIX}{struct.name}__{member.name}"
                    # a vtable slot's first parameter is its owner; a member whose first
                    # parameter is a user_data payload is a callback ggml hands out (e.g.
                    # ggml_backend_graph_optimize_params.add_alloc_dep)
                    ud = _payload_index(member.type.type, {"user_data", "userdata"})
                    ud = ud if ud == 0 else None
                    table.append(dict(
                        name=name, ctype=f"struct {struct.name}.{member.name}",
                        kind="slot" if ud is None else "userdata",
                        index=OWNER_ARG.get((struct.name, member.name), 0) if ud is None else ud,
                        decl=_declaration(member.type.type, name)))
    return table


def cdef_source(include_dir: Path, headers: list[str], undefined: Iterable[str] = ()) -> tuple[str, list[dict]]:
    """The full cdef text and the callback table."""
    expanded = preprocess(include_dir, headers)
    for pattern, repl, _why in FIXUPS:
        expanded, n = re.subn(pattern, repl, expanded)
        if n != 1:
            raise RuntimeError(f"fix-up {pattern!r} matched {n} times, expected once: headers changed?")
    for name in undefined:
        expanded, n = re.subn(rf"^[^;{{}}]*\b{name}\s*\([^;]*\);", "", expanded, flags=re.M)
        declared = any(re.search(rf"\b{name}\b", (include_dir / h).read_text()) for h in headers)
        if n != (1 if declared else 0):  # none where its header (ggml-cuda.h...) is not built
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


#: pyggml's own C: declarations (also the cdef) and definitions, in real files
CSRC = Path(__file__).resolve().parent / "csrc"


def _own_cdef() -> str:
    """``csrc/pyggml.h`` without its comments (pycparser, which reads it too, knows none)."""
    return re.sub(r"/\*.*?\*/", "", (CSRC / "pyggml.h").read_text(), flags=re.S)


#: the declarations of pyggml's own C helpers (``csrc/pyggml.h``)
DL_CDEF = _own_cdef()


def _named_prototype(func: c_ast.FuncDecl, name: str) -> tuple[str, list[str]]:
    """``func`` as a C prototype named ``name`` with parameters named a0, a1...; and those names."""
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


def dl_trampolines(include_dir: Path, headers: list[str], modules: dict[str, str],
                   undefined: Iterable[str] = ()) -> str:
    """C source defining every function of the module headers (``modules``: header -> module name)
    as a call through a pointer, plus ``pyggml_dl_table``."""
    parts, rows = [], []
    for name, (header, func) in sorted(functions_by_header(include_dir, headers).items()):
        module = modules.get(header)
        if module is None or name in undefined:
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
    table = "struct pyggml_dl_entry pyggml_dl_table[] = {\n" + "\n".join(rows + ["    {NULL, NULL, NULL}"]) + "\n};\n"
    return "".join(parts) + table


def write_table(table: list[dict], path: Path) -> None:
    rows = ",\n".join(
        f"    ({e['name']!r}, {e['ctype']!r}, {e['kind']!r}, {e['index']!r})" for e in table)
    path.write_text(
        '"""Generated by pyggml_build/declarations.py from the pinned headers: do not edit.\n\n'
        "(extern name, C callback type, dispatch kind, payload/owner argument index)\n"
        '"""\n'
        f"CALLBACKS = [\n{rows},\n]\n")


#: The enums of the headers that become Python classes in ``pyggml/_enums.py``:
#: C enum (or ``#define`` group) -> (class name, prefix stripped from member names, base).
#: An enum a future ggml adds is reachable through ``lib`` until a row is added here.
ENUMS = {
    "enum ggml_type": ("GGMLType", "GGML_TYPE_", "IntEnum"),
    "enum ggml_op": ("Op", "GGML_OP_", "IntEnum"),
    "enum ggml_unary_op": ("UnaryOp", "GGML_UNARY_OP_", "IntEnum"),
    "enum ggml_glu_op": ("GLUOp", "GGML_GLU_OP_", "IntEnum"),
    "enum ggml_status": ("Status", "GGML_STATUS_", "IntEnum"),
    "enum ggml_log_level": ("LogLevel", "GGML_LOG_LEVEL_", "IntEnum"),
    "enum ggml_tensor_flag": ("TensorFlag", "GGML_TENSOR_FLAG_", "IntFlag"),
    "enum ggml_prec": ("Prec", "GGML_PREC_", "IntEnum"),
    "enum ggml_sort_order": ("SortOrder", "GGML_SORT_ORDER_", "IntEnum"),
    "enum ggml_op_pool": ("PoolOp", "GGML_OP_POOL_", "IntEnum"),
    "enum ggml_scale_mode": ("ScaleMode", "GGML_SCALE_MODE_", "IntEnum"),
    "enum ggml_tri_type": ("TriType", "GGML_TRI_TYPE_", "IntEnum"),
    "enum ggml_ftype": ("FType", "GGML_FTYPE_", "IntEnum"),
    "enum ggml_sched_priority": ("SchedPriority", "GGML_SCHED_PRIO_", "IntEnum"),
    "enum ggml_backend_buffer_usage": ("BufferUsage", "GGML_BACKEND_BUFFER_USAGE_", "IntEnum"),
    "enum ggml_backend_dev_type": ("DeviceType", "GGML_BACKEND_DEVICE_TYPE_", "IntEnum"),
    "enum ggml_numa_strategy": ("NumaStrategy", "GGML_NUMA_STRATEGY_", "IntEnum"),
    "enum gguf_type": ("GGUFValueType", "GGUF_TYPE_", "IntEnum"),
    "enum ggml_opt_loss_type": ("OptLossType", "GGML_OPT_LOSS_TYPE_", "IntEnum"),
    "enum ggml_opt_build_type": ("OptBuildType", "GGML_OPT_BUILD_TYPE_", "IntEnum"),
    "enum ggml_opt_optimizer_type": ("OptimizerType", "GGML_OPT_OPTIMIZER_TYPE_", "IntEnum"),
    "#define GGML_ROPE_TYPE_": ("RopeType", "GGML_ROPE_TYPE_", "IntEnum"),
}


def _enum_members(ffibuilder, include_dir: Path, headers: list[str], cname: str,
                  prefix: str) -> list[tuple[str, int]] | None:
    if cname.startswith("#define "):
        text = _cpp(include_dir, ["-dM"], headers)
        found = re.findall(rf"^#define ({re.escape(prefix)}\w+) (\d+)\s*$", text, flags=re.M)
        members = [(n, int(v)) for n, v in found]
    else:
        try:
            members = list(ffibuilder.typeof(cname).relements.items())
        except Exception:  # an enum this version of the headers does not have (cffi: CDefError)
            return None
    out = []
    for name, value in sorted(members, key=lambda nv: (nv[1], nv[0])):
        short = name[len(prefix):] if name.startswith(prefix) else None
        if short and short != "COUNT":
            out.append((short if short[0].isalpha() else "_" + short, value))
    return out


def enums_source(ffibuilder, include_dir: Path, headers: list[str], version: str) -> str:
    """Python source of ``pyggml/_enums.py``: one class per row of :data:`ENUMS` that the
    headers have, members named as in C without the prefix (``GGMLType.Q4_K``), in value order
    (the first name of a value wins; later names are aliases)."""
    lines = [f'"""Generated by pyggml_build/declarations.py from the headers of ggml {version}: do not edit.',
             "", "Documented in :mod:`pyggml.enums`, which re-exports these classes.", '"""',
             "from enum import IntEnum, IntFlag", "", "__all__ = ["]
    classes = []
    for cname, (cls, prefix, base) in ENUMS.items():
        members = _enum_members(ffibuilder, include_dir, headers, cname, prefix)
        if not members:
            continue
        body = [f"class {cls}({base}):", f'    """``{cname.replace("#define ", "")}*`` of the ggml headers."""']
        body += [f"    {name} = {value}" for name, value in members]
        classes.append("\n".join(body))
        lines.append(f'    "{cls}",')
    lines.append("]")
    return "\n".join(lines) + "\n\n\n" + "\n\n\n".join(classes) + "\n"


def make_ffibuilder(include_dir: Path, lib_dir: Path, headers: list[str], module: str = "pyggml._ggml", *,
                    backends: list[str] = ["cpu"], dl: bool = False, undefined: Iterable[str] = ()):
    """(the cffi builder, the callback table) for ``headers`` (file names in ``include_dir``).
    With ``dl`` (a ``GGML_BACKEND_DL`` build) the backends' own functions are trampolines (see
    the module docstring) and only libggml and libggml-base are linked."""
    undefined = list(undefined)
    cdef, table = cdef_source(include_dir, headers, undefined)
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(cdef)
    includes = "".join(f'#include "{h}"\n' for h in headers)
    own_c = (CSRC / "pyggml.c").read_text()
    if dl:
        by_header = {Path(BACKEND_HEADERS[b]).name: b for b in backends if b in BACKEND_HEADERS}
        body = own_c + dl_trampolines(include_dir, headers, by_header, undefined)
        libraries = ["ggml", "ggml-base"]
    else:
        body = own_c + "struct pyggml_dl_entry pyggml_dl_table[] = {{NULL, NULL, NULL}};\n"
        libraries = ["ggml", "ggml-base", "ggml-cpu"]
    ffibuilder.set_source(
        module,
        includes + body,
        include_dirs=[str(include_dir)],
        library_dirs=[str(lib_dir)],
        libraries=libraries + ["dl"],
        # the bundled libraries come first: DT_RPATH ($ORIGIN) is searched before LD_LIBRARY_PATH
        extra_link_args=["-Wl,-rpath,$ORIGIN/lib", "-Wl,--disable-new-dtags"],
        # the deprecated functions are bound too; ggml-impl.h's static helpers go unused; the
        # trampolines stay private
        extra_compile_args=["-Wno-deprecated-declarations", "-Wno-unused-function", "-fvisibility=hidden"],
    )
    return ffibuilder, table


@contextlib.contextmanager
def _no_host_rpath() -> Iterator[None]:
    """Link the extension without the ``-Wl,-rpath,<python prefix>/lib`` that a Python built with
    ``--enable-shared`` (pyenv, conda) puts in its ``LDSHARED``: a path of the building machine,
    useless in an installed package, where only ``$ORIGIN/lib`` belongs. setuptools takes
    ``LDSHARED`` from the environment when it is set."""
    ldshared = os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED") or ""
    kept = [a for a in shlex.split(ldshared) if not (a.startswith("-Wl,-rpath,") or a.startswith("-Wl,-R"))]
    old = os.environ.get("LDSHARED")
    os.environ["LDSHARED"] = shlex.join(kept)
    try:
        yield
    finally:
        if old is None:
            del os.environ["LDSHARED"]
        else:
            os.environ["LDSHARED"] = old


#: the Python files :func:`compile_extension` generates, relative to the package folder
GENERATED = ("raw/_callback_table.py", "_enums.py", "_ggml.pyi", "core/_unchecked_ops.py")


#: the ops module the generated op methods complete (its hand-written methods are left out)
OPS_PY = Path(__file__).resolve().parent.parent / "pyggml" / "core" / "ops.py"


def write_python_files(pkg_dir: Path, ffibuilder, table: list[dict], headers: list[str], version: str,
                       ops_py: Path = OPS_PY) -> list[Path]:
    """Write the Python files generated from the declarations into ``pkg_dir``:
    ``raw/_callback_table.py``, ``_enums.py``, ``_ggml.pyi`` (the stub of the extension:
    :func:`pyggml_build.stubs.lib_stub_source`) and ``core/_unchecked_ops.py``
    (:func:`pyggml_build.stubs.ops_source`). Needs ``pkg_dir/include``, not the compiled
    extension. Returns the files written."""
    include_dir = pkg_dir / "include"
    functions = function_info(include_dir, headers)
    files = {
        pkg_dir / "_enums.py": enums_source(ffibuilder, include_dir, headers, version),
        pkg_dir / "_ggml.pyi": stubs.lib_stub_source(ffibuilder, functions, version),
        pkg_dir / "core" / "_unchecked_ops.py": stubs.ops_source(ffibuilder, functions, stubs.hand_written_ops(ops_py), version),
    }
    write_table(table, pkg_dir / "raw" / "_callback_table.py")
    for path, text in files.items():
        path.write_text(text)
    return [pkg_dir / "raw" / "_callback_table.py", *files]


def generate(pkg_dir: Path) -> list[Path]:
    """Only :func:`write_python_files`, for the ggml that ``pkg_dir`` was built with (read from
    its ``_build_info.json``): what ``python build_ggml.py --generate-only`` runs after a change
    to the generators or to ``pyggml/core/ops.py``, in seconds, without compiling anything."""
    info_path = pkg_dir / "_build_info.json"
    if not info_path.is_file():
        raise RuntimeError(f"{pkg_dir} has no _build_info.json: build it first")
    info = json.loads(info_path.read_text())
    pkg_dir = pkg_dir.resolve()
    ffibuilder, table = make_ffibuilder(pkg_dir / "include", pkg_dir / "lib", info["headers"],
                                        backends=info.get("backends", ["cpu"]), dl=bool(info.get("backend_dl")),
                                        undefined=list(info.get("undefined_functions", {})))
    return write_python_files(pkg_dir, ffibuilder, table, info["headers"], info["ggml_version"])


def compile_extension(pkg_dir: Path, tmp_dir: Path, headers: list[str], version: str, *,
                      backends: list[str] = ["cpu"], dl: bool = False, undefined: Iterable[str] = ()) -> Path:
    """Compile ``pyggml._ggml`` into ``pkg_dir`` from ``pkg_dir/include`` and ``pkg_dir/lib``, and
    write the Python files generated from the same declarations (:func:`write_python_files`)."""
    pkg_dir, tmp_dir = pkg_dir.resolve(), tmp_dir.resolve()  # cffi compiles from tmp_dir
    ffibuilder, table = make_ffibuilder(pkg_dir / "include", pkg_dir / "lib", headers,
                                        backends=backends, dl=dl, undefined=undefined)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    write_python_files(pkg_dir, ffibuilder, table, headers, version)
    with _no_host_rpath():
        so = Path(ffibuilder.compile(tmpdir=str(tmp_dir), verbose=False))
    target = pkg_dir / so.name
    os.replace(so, target)
    return target
