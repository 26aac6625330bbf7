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
   function's signature) and ``pyggml/_unchecked_ops.py`` (a method for every op constructor
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


#: pyggml's own C helpers, in every build: binding backend modules (a build without modules
#: binds none), and saving/restoring a graph's node sources around a scheduler's split (which
#: rewrites them; pyggml.sched)
DL_CDEF = """
int pyggml_dl_bind(const char *module, const char *path);
void pyggml_dl_unbind(const char *module);
int pyggml_dl_is_bound(const char *name);
const char *pyggml_dl_open_error(const char *path);
int pyggml_graph_save_srcs(struct ggml_cgraph *graph, struct ggml_tensor **out, int capacity);
void pyggml_graph_restore_srcs(struct ggml_cgraph *graph, struct ggml_tensor **saved, int n_nodes);
struct pyggml_live_buffer { ggml_backend_buffer_t buffer; uintptr_t base; size_t size; };
int pyggml_graph_buffers(struct ggml_cgraph *graph, ggml_backend_buffer_t *out, int capacity);
int pyggml_graph_check_memory(struct ggml_cgraph *graph, const struct pyggml_live_buffer *live, int n_live,
                              int need_data, struct ggml_tensor **bad, struct ggml_tensor **node);
int pyggml_graph_unplace(struct ggml_cgraph *graph, ggml_backend_buffer_t *buffers, int n_buffers);
ggml_backend_buffer_t pyggml_freed_buffer(int by_placer);
int pyggml_ctx_forget_buffer(struct ggml_context *ctx, ggml_backend_buffer_t buffer, ggml_backend_buffer_t freed);
int pyggml_check_indices(struct ggml_tensor **idx, const int64_t *bound, int n, int64_t *value);
struct pyggml_abort_throttle { ggml_abort_callback callback; void *data; int64_t interval_us; int64_t last_us; };
bool pyggml_abort_throttled(void *throttle);
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

/* The sources of the first n nodes of `graph` (n = ggml_graph_n_nodes), GGML_MAX_SRC per node,
   into `out`; returns n, or -1 if `capacity` pointers do not hold them. */
int pyggml_graph_save_srcs(struct ggml_cgraph *graph, struct ggml_tensor **out, int capacity) {
    int n = ggml_graph_n_nodes(graph);
    if (n * GGML_MAX_SRC > capacity) return -1;
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        for (int j = 0; j < GGML_MAX_SRC; j++) out[i * GGML_MAX_SRC + j] = node->src[j];
    }
    return n;
}

/* Write back what pyggml_graph_save_srcs saved (for at most the nodes the graph still has). */
void pyggml_graph_restore_srcs(struct ggml_cgraph *graph, struct ggml_tensor **saved, int n_nodes) {
    int n = ggml_graph_n_nodes(graph);
    if (n_nodes < n) n = n_nodes;
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        for (int j = 0; j < GGML_MAX_SRC; j++) node->src[j] = saved[i * GGML_MAX_SRC + j];
    }
}

/* --- the memory of a graph's tensors (pyggml.backend, pyggml.alloc, pyggml.sched). These
   helpers read tensor structs and compare buffer pointers; they never dereference a buffer,
   which may have been freed: that is what they find out. */
struct pyggml_live_buffer { ggml_backend_buffer_t buffer; uintptr_t base; size_t size; };

static ggml_backend_buffer_t pyggml_buffer_of(const struct ggml_tensor *t) {
    return t->view_src ? t->view_src->buffer : t->buffer;
}

/* The distinct buffers (view_src's for views) of every node and source of `graph`, into `out`;
   returns how many, or -1 if more than `capacity`. */
int pyggml_graph_buffers(struct ggml_cgraph *graph, ggml_backend_buffer_t *out, int capacity) {
    int n = 0, n_nodes = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n_nodes; i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        for (int j = -1; j < GGML_MAX_SRC; j++) {
            const struct ggml_tensor *t = j < 0 ? node : node->src[j];
            if (!t) continue;
            ggml_backend_buffer_t b = pyggml_buffer_of(t);
            if (!b) continue;
            int k = 0;
            while (k < n && out[k] != b) k++;
            if (k < n) continue;
            if (n == capacity) return -1;
            out[n++] = b;
        }
    }
    return n;
}

/* Check every node and source of `graph`: if it is in a backend buffer, that buffer must be one
   of `live` and its data inside it; with `need_data`, every tensor must also have data (a view:
   its source's). Returns 0 if all pass, else 1 (no data), 2 (a buffer that is not live) or
   3 (data outside its buffer), with the tensor in *bad and the node that reads it in *node. */
int pyggml_graph_check_memory(struct ggml_cgraph *graph, const struct pyggml_live_buffer *live, int n_live,
                              int need_data, struct ggml_tensor **bad, struct ggml_tensor **node) {
    int n_nodes = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n_nodes; i++) {
        struct ggml_tensor *nd = ggml_graph_node(graph, i);
        for (int j = -1; j < GGML_MAX_SRC; j++) {
            struct ggml_tensor *t = j < 0 ? nd : nd->src[j];
            if (!t) continue;
            *bad = t; *node = nd;
            ggml_backend_buffer_t b = pyggml_buffer_of(t);
            if (!t->data) {
                /* to compute, every tensor needs data, views too: a view made before its source
                   had data keeps NULL until an allocator inits it (ggml_backend_view_init); but
                   a source whose buffer was freed is the error to report first (2 below) */
                if (need_data && !(t->view_src && t->view_src->data && b)) return 1;
                if (!(t->view_src && t->view_src->data)) continue;
            }
            if (!b) continue;  /* context memory */
            int k = 0;
            while (k < n_live && live[k].buffer != b) k++;
            if (k == n_live) return 2;
            uintptr_t d = (uintptr_t) (t->data ? t->data : t->view_src->data);
            if (d < live[k].base || d > live[k].base + live[k].size) return 3;
            if (!t->data && need_data) return 1;  /* its source is live: the view has no data */
        }
    }
    *bad = NULL; *node = NULL;
    return 0;
}

/* Stand-ins for freed buffers (pyggml.buffer.retire): the tensors of a context that pointed at a
   buffer being freed point at one of these instead, so that a new buffer malloc puts at the same
   address (struct and data) does not make them look placed in it. pyggml never records them as
   live (using such a tensor raises ClosedError); ggml may still ask them their name, type,
   alignment or size, and their data functions do nothing. */
static const char *pyggml_freed_buft_name(ggml_backend_buffer_type_t buft) { (void) buft; return "freed"; }
static ggml_backend_buffer_t pyggml_freed_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    (void) buft; (void) size; return NULL;
}
static size_t pyggml_freed_buft_alignment(ggml_backend_buffer_type_t buft) { (void) buft; return 1; }
static void pyggml_freed_memset(ggml_backend_buffer_t b, struct ggml_tensor *t, uint8_t v, size_t o, size_t n) {
    (void) b; (void) t; (void) v; (void) o; (void) n;
}
static void pyggml_freed_set(ggml_backend_buffer_t b, struct ggml_tensor *t, const void *d, size_t o, size_t n) {
    (void) b; (void) t; (void) d; (void) o; (void) n;
}
static void pyggml_freed_get(ggml_backend_buffer_t b, const struct ggml_tensor *t, void *d, size_t o, size_t n) {
    (void) b; (void) t; (void) d; (void) o; (void) n;
}
static void pyggml_freed_clear(ggml_backend_buffer_t b, uint8_t v) { (void) b; (void) v; }
static struct ggml_backend_buffer_type pyggml_freed_buft = {
    .iface = { .get_name = pyggml_freed_buft_name, .alloc_buffer = pyggml_freed_buft_alloc,
               .get_alignment = pyggml_freed_buft_alignment },
    .device = NULL, .context = NULL,
};
#define PYGGML_FREED_BUFFER { \
    .iface = { .memset_tensor = pyggml_freed_memset, .set_tensor = pyggml_freed_set, \
               .get_tensor = pyggml_freed_get, .clear = pyggml_freed_clear }, \
    .buft = &pyggml_freed_buft, .context = NULL, .size = 0, .usage = GGML_BACKEND_BUFFER_USAGE_ANY }
/* [0]: a user's buffer; [1]: a graph allocator's or scheduler's (its tensors may be placed again) */
static struct ggml_backend_buffer pyggml_freed_buffers[2] = { PYGGML_FREED_BUFFER, PYGGML_FREED_BUFFER };

ggml_backend_buffer_t pyggml_freed_buffer(int by_placer) { return &pyggml_freed_buffers[by_placer ? 1 : 0]; }

/* Point the tensors of `ctx` that are in `buffer` (views too) at `freed`. Returns how many. */
int pyggml_ctx_forget_buffer(struct ggml_context *ctx, ggml_backend_buffer_t buffer, ggml_backend_buffer_t freed) {
    int n = 0;
    for (struct ggml_tensor *t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->buffer == buffer) { t->buffer = freed; n++; }
    }
    return n;
}

/* Forget where the tensors of `graph` that sit in one of `buffers` were placed: data and buffer
   set to NULL (for views too), so that an allocator places them again. Returns how many. */
int pyggml_graph_unplace(struct ggml_cgraph *graph, ggml_backend_buffer_t *buffers, int n_buffers) {
    int n = 0, n_nodes = ggml_graph_n_nodes(graph);
    for (int pass = 0; pass < 2; pass++) {  /* views first, while their source still says where it is */
        for (int i = 0; i < n_nodes; i++) {
            struct ggml_tensor *nd = ggml_graph_node(graph, i);
            for (int j = -1; j < GGML_MAX_SRC; j++) {
                struct ggml_tensor *t = j < 0 ? nd : nd->src[j];
                if (!t || (pass == 0) != (t->view_src != NULL)) continue;
                ggml_backend_buffer_t b = pyggml_buffer_of(t);
                if (!b) continue;
                for (int k = 0; k < n_buffers; k++) {
                    if (buffers[k] == b) {
                        t->data = NULL; t->buffer = NULL; n++;
                        break;
                    }
                }
            }
        }
    }
    return n;
}

struct pyggml_abort_throttle { ggml_abort_callback callback; void *data; int64_t interval_us; int64_t last_us; };

/* An abort callback (ggml_abort_callback; data: a struct pyggml_abort_throttle) that asks
   `callback` at most once per `interval_us` microseconds and answers false in between: the CPU
   backend asks its abort callback after every node, and a Python callback costs a GIL round
   trip each time. */
bool pyggml_abort_throttled(void *throttle) {
    struct pyggml_abort_throttle *t = (struct pyggml_abort_throttle *) throttle;
    int64_t now = ggml_time_us();
    if (now - t->last_us < t->interval_us) return false;
    t->last_us = now;
    return t->callback(t->data);
}

/* Row indices that ggml's CPU kernels read from data and only assert on (get_rows, set_rows)
   or do not check at all (get_rows_back writes, mul_mat_id reads): every element of the I32 or
   I64 tensor idx[k] must be in [0, bound[k]). A tensor without data, or whose buffer is not in
   host memory, is skipped. Returns -1 if all are in range, else the k of the first that is not,
   with the offending value in *value. */
int pyggml_check_indices(struct ggml_tensor **idx, const int64_t *bound, int n, int64_t *value) {
    for (int k = 0; k < n; k++) {
        const struct ggml_tensor *t = idx[k];
        ggml_backend_buffer_t b = pyggml_buffer_of(t);
        if (!t->data || (b && !ggml_backend_buffer_is_host(b))) continue;
        const int i64 = t->type == GGML_TYPE_I64;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
            const char *row = (const char *) t->data + i1*t->nb[1] + i2*t->nb[2] + i3*t->nb[3];
            for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                const char *e = row + i0*t->nb[0];
                int64_t v = i64 ? *(const int64_t *) e : (int64_t) *(const int32_t *) e;
                if (v < 0 || v >= bound[k]) { *value = v; return k; }
            }
        }
    }
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
    table = "static struct pyggml_dl_entry pyggml_dl_table[] = {\n" + "\n".join(rows + ["    {NULL, NULL, NULL}"]) + "\n};\n"
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
    if dl:
        by_header = {Path(BACKEND_HEADERS[b]).name: b for b in backends if b in BACKEND_HEADERS}
        body = _DL_C + dl_trampolines(include_dir, headers, by_header, undefined) + _DL_C_TAIL
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
        # the deprecated functions are bound too; the trampolines stay private
        extra_compile_args=["-Wno-deprecated-declarations", "-fvisibility=hidden"],
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
GENERATED = ("raw/_callback_table.py", "_enums.py", "_ggml.pyi", "_unchecked_ops.py")


#: the ops module the generated op methods complete (its hand-written methods are left out)
OPS_PY = Path(__file__).resolve().parent.parent / "pyggml" / "ops.py"


def write_python_files(pkg_dir: Path, ffibuilder, table: list[dict], headers: list[str], version: str,
                       ops_py: Path = OPS_PY) -> list[Path]:
    """Write the Python files generated from the declarations into ``pkg_dir``:
    ``raw/_callback_table.py``, ``_enums.py``, ``_ggml.pyi`` (the stub of the extension:
    :func:`pyggml_build.stubs.lib_stub_source`) and ``_unchecked_ops.py``
    (:func:`pyggml_build.stubs.ops_source`). Needs ``pkg_dir/include``, not the compiled
    extension. Returns the files written."""
    include_dir = pkg_dir / "include"
    functions = function_info(include_dir, headers)
    files = {
        pkg_dir / "_enums.py": enums_source(ffibuilder, include_dir, headers, version),
        pkg_dir / "_ggml.pyi": stubs.lib_stub_source(ffibuilder, functions, version),
        pkg_dir / "_unchecked_ops.py": stubs.ops_source(ffibuilder, functions, stubs.hand_written_ops(ops_py), version),
    }
    write_table(table, pkg_dir / "raw" / "_callback_table.py")
    for path, text in files.items():
        path.write_text(text)
    return [pkg_dir / "raw" / "_callback_table.py", *files]


def generate(pkg_dir: Path) -> list[Path]:
    """Only :func:`write_python_files`, for the ggml that ``pkg_dir`` was built with (read from
    its ``_build_info.json``): what ``python build_ggml.py --generate-only`` runs after a change
    to the generators or to ``pyggml/ops.py``, in seconds, without compiling anything."""
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
