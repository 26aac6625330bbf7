#!/usr/bin/env python3
"""Read every import of pyggml's modules (and the build package's), also those inside functions,
and report import cycles, imports of a higher layer (:data:`LAYERS`) and imports made inside
functions.

    python scripts/check_imports.py            # exit 1 if there is a cycle, an upward import or
                                               # an unexplained import inside a function

Imports under ``if TYPE_CHECKING:`` count like any other: a module that names a higher one even
for a type checker is a knot waiting to be tied. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (its
``__init__``). Imports inside functions are allowed only where :data:`ALLOWED_LOCAL` says why.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["pyggml", "pyggml_build"]

#: (module, imported module) -> why the import sits inside a function
ALLOWED_LOCAL: dict[tuple[str, str], str] = {
    ("pyggml_build.cmake", "cmake"): "the PyPI cmake package is only needed when cmake is not on PATH",
    ("pyggml.opt.loop", "tqdm"): "an optional progress bar, imported only when a bar is shown on a terminal",
    # the models' optional dependencies (extras pyggml[bert], [llama], [whisper]): imported when a
    # model needs them, so that a missing one is an ImportError naming the extra
    ("pyggml.models.bert.model", "safetensors.numpy"): "optional: pyggml[bert]",
    ("pyggml.models.bert.model", "tokenizers"): "optional: pyggml[bert]",
    ("pyggml.models.llama.tokenizer", "tokenizers"): "optional: pyggml[llama]",
    ("pyggml.models.llama.tokenizer", "jinja2"): "optional: pyggml[llama], only for chat templates",
    ("pyggml.models.llama.tokenizer", "jinja2.ext"): "optional: pyggml[llama], only for chat templates",
    ("pyggml.models.llama.tokenizer", "jinja2.sandbox"): "optional: pyggml[llama], only for chat templates",
    ("pyggml.models.whisper.audio", "soundfile"): "optional: pyggml[whisper], only for audio files",
    ("pyggml.models.whisper.audio", "soxr"): "optional: pyggml[whisper], only for audio files",
    ("pyggml.models.whisper.audio", "threadpoolctl"):
        "optional: pyggml[whisper], only to keep the log-mel's BLAS product on one thread",
    ("pyggml.models.whisper.convert", "safetensors.numpy"): "optional: only for Hugging Face conversions",
    ("pyggml.models.whisper.tokenizer", "tiktoken"): "optional: pyggml[whisper], only for text prompts",
    ("pyggml.models.whisper.vad", "onnx"): "optional: pyggml[whisper], only to read Silero VAD's weights",
    ("pyggml.models.whisper.transcribe", "tqdm"): "optional: pyggml[whisper], only for a progress bar",
}


#: pyggml's layers, lowest first: a module may import its own layer (without a cycle) and lower
#: ones, never a higher one. Each entry: (name, the modules and packages in it).
LAYERS: list[tuple[str, list[str]]] = [
    ("errors", ["pyggml.errors"]),
    ("raw", ["pyggml.raw"]),                     # ffi/lib, loader, call boundary, threads
    ("base", ["pyggml.enums", "pyggml._enums", "pyggml.types", "pyggml._cobject", "pyggml._trial",
              "pyggml.dlpack"]),
    ("memory", ["pyggml.memory"]),               # buffers and buffer types
    ("core", ["pyggml.core"]),                   # tensors, ops, graphs, contexts, GGUF
    ("backends", ["pyggml.backends"]),           # backends, devices, allocators, schedulers
    ("top", ["pyggml", "pyggml.__main__", "pyggml.rpc", "pyggml.runtime", "pyggml.opt", "pyggml.impl",
             "pyggml.torch_lowering"]),
    ("models", ["pyggml.models"]),               # models people import: BERT, llama, Whisper
]


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (the longest entry that names it or a package
    above it), or None for a module outside pyggml."""
    best, found = -1, None
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, found = len(n), i
    return found


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported module, whether the import is inside a function) for each import of ``name``."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                for a in child.names:
                    sub = f"{mod}.{a.name}"
                    out.append((sub if sub in known else mod, in_function))
            visit(child, local)

    visit(ast.parse(path.read_text()), False)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            strong(v)
    return found


def main() -> int:
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    local_problems = []
    upward = []
    n_edges = 0
    for name, path in mods.items():
        for target, in_function in imports(name, path, known):
            if target in known and target != name and target not in graph[name]:
                graph[name].add(target)
                n_edges += 1
                lo, hi = layer_of(name), layer_of(target)
                if name.startswith("pyggml.") or name == "pyggml":
                    if lo is None:
                        upward.append(f"{name}: in no layer (scripts/check_imports.py LAYERS)")
                    elif hi is not None and hi > lo:
                        upward.append(f"{name} ({LAYERS[lo][0]}) imports {target} ({LAYERS[hi][0]}), a higher layer")
            if in_function and (name, target) not in ALLOWED_LOCAL and not target.startswith("__future__"):
                local_problems.append(f"{name}: imports {target} inside a function")
    found = cycles(graph)
    for comp in found:
        print("import cycle among: " + ", ".join(comp))
    for p in [*upward, *local_problems]:
        print(p)
    print(f"{len(mods)} modules, {n_edges} imports among them, {len(found)} cycle(s), "
          f"{len(upward)} upward import(s), {len(local_problems)} unexplained import(s) inside functions")
    return 1 if found or upward or local_problems else 0


if __name__ == "__main__":
    sys.exit(main())
