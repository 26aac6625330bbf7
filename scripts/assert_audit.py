"""Audit of ggml's GGML_ASSERT / GGML_ABORT sites against the Pythonic layer (issue 12, point 3).

Every ``GGML_ASSERT`` / ``GGML_ABORT`` of ggml calls ``abort()`` and kills the interpreter. This
script lists them in the ggml sources pyggml builds (``vendor/ggml-<version>/src``), finds the C
function each one is in, joins them with the hand-written classification in
``docs/asserts/classification.toml`` (per function, per site where a function's sites differ)
and writes ``docs/asserts.md``::

    python scripts/assert_audit.py            # write docs/asserts.md
    python scripts/assert_audit.py --check    # exit 1 if a site is unclassified or the report is stale
    python scripts/assert_audit.py --list     # every site: file:line function condition

The C parser is deliberately light (see :func:`parse`): comments and literals are masked,
preprocessor lines are taken out (``#if``/``#else`` branches are followed so that braces stay
balanced, and each site records the ``#if`` conditions it sits under), and a ``{`` at file,
namespace or ``extern "C"`` level whose header ends in a parameter list opens a function. What
it cannot see is written into the report (:data:`BLIND_SPOTS`).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
CLASSIFICATION = ROOT / "docs" / "asserts" / "classification.toml"
REPORT = ROOT / "docs" / "asserts.md"

#: the files audited, relative to ``src/``: (path, tier). Tier 1: what every pyggml build
#: compiles and the Pythonic layer drives; tier 2: GGUF and the optimizer.
FILES = [
    ("ggml.c", 1),
    ("ggml-impl.h", 1),
    ("ggml-alloc.c", 1),
    ("ggml-backend.cpp", 1),
    ("ggml-cpu/ggml-cpu.c", 1),
    ("ggml-cpu/ggml-cpu.cpp", 1),
    ("ggml-cpu/ops.cpp", 1),
    ("gguf.cpp", 2),
    ("ggml-opt.cpp", 2),
]

CLASSES = {
    "checked": "pyggml checks the condition and raises a Python exception before calling C",
    "fork-trialed": "reached only through Context.op (ops without a checked method) or the CPU "
                    "kernels of such ops: pyggml runs the call first in a forked child "
                    "(pyggml._trial), whose abort becomes ValueError",
    "kernel table": "a CPU kernel's type/layout assert: pyggml.backends.cpu._cpu_kernel_supports_raw "
                    "refuses the node before compute (ValueError)",
    "unreachable": "the Pythonic layer cannot reach the condition (raw lib API only, an internal "
                   "caller guarantees it, a debug-only or not-built path)",
    "upstream": "cannot be made safe from Python",
    "gap": "the Pythonic layer reaches the assert without a check (a bug in pyggml)",
}

#: what the parser cannot see; printed in the report
BLIND_SPOTS = [
    "Asserts inside `#define` macros are listed once, under `macro NAME`, at the line of the "
    "definition: the places where the macro is used are not expanded (e.g. `GGML_ASSERT_ALIGNED` "
    "in ggml.c is listed at its two uses because the parser counts it as an assert call).",
    "Inline functions of headers other than `src/ggml-impl.h` (`ggml-cpu/vec.h`, "
    "`ggml-cpu/simd-mappings.h`, `ggml-cpu/common.h`, `ggml-cpu/ggml-cpu-impl.h`, "
    "`include/ggml.h`) are not parsed; they hold no GGML_ASSERT/GGML_ABORT in this ggml "
    "(checked by `grep`, see the test).",
    "Other compiled sources are not listed site by site: `ggml-cpu/binary-ops.cpp`, "
    "`ggml-cpu/unary-ops.cpp` (type dispatch of the kernels, covered by the kernel table like "
    "ops.cpp), `ggml-cpu/repack.cpp` and `ggml-cpu/amx`, `kleidiai` (the extra CPU buffer "
    "types: pyggml uses one only after a forked trial of its products, writes a tensor there only "
    "whole and only where the type has a layout for it, never reads one back, and its CPU "
    "backend lets only the products `supports_op` takes read it: `pyggml.backends.extra_bufts`, "
    "`pyggml.memory.buffer.check_layout`), `ggml-quants.c` (quantization of rows, reached through "
    "`ggml_quantize_chunk` whose asserts are listed), `ggml-backend-reg.cpp`, "
    "`ggml-backend-meta.cpp` (the meta device, not exposed by the Pythonic layer), and the "
    "GPU/RPC backends.",
    "`#if` conditions are recorded but not evaluated: a site under `#ifndef NDEBUG` or an "
    "architecture macro is listed like any other (its condition is shown).",
    "Function-like macros that expand to a function definition would be missed; none of the "
    "audited files defines functions that way.",
    "Plain C `assert()` (compiled out in pyggml's Release build, `NDEBUG`) and C++ `throw` "
    "(gguf.cpp's writer catches its own) are not GGML asserts and are not listed.",
    "The enclosing function is where the assert is written; who calls that function "
    "(static helpers, kernels) is the classification's business, not the parser's.",
    "Parameter asserts (`op_parameters`) are found by name: a parameter of an op constructor that "
    "is not a tensor, and the locals assigned from expressions that read one. A value that reaches "
    "a condition through a helper's own parameters (`ggml_new_tensor_impl` called with sizes an op "
    "computed) counts in the helper, where that helper's parameters are its op parameters.",
]

ASSERT_RE = re.compile(r"\bGGML_(ASSERT|ABORT|ASSERT_ALIGNED)\s*\(")
_CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "defined", "else", "do"}


@dataclasses.dataclass
class Site:
    file: str
    line: int
    function: str          # "ggml_mul_mat", "macro NAME", "<file scope>"
    kind: str              # ASSERT | ABORT | ASSERT_ALIGNED
    condition: str         # the macro's argument text, whitespace collapsed
    pp: tuple[str, ...]    # #if conditions it sits under
    fn_line: int = 0       # line of the enclosing function's header
    #: the op parameters the condition reads (see :func:`op_parameters`); empty for an assert that
    #: reads only tensors, or one outside an op constructor
    params: tuple[str, ...] = ()


@dataclasses.dataclass
class Function:
    name: str
    start: int  # line of the opening brace
    end: int
    params: frozenset[str] = frozenset()  # op_parameters(header, body)


# ------------------------------------------------------------------------------------------------
# the parser

def _mask(text: str, strings: bool = True) -> str:
    """``text`` with comments blanked and (``strings``) string/char literal contents replaced by
    spaces (newlines kept, so offsets and lines are unchanged)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            if strings:
                for k in range(i + 2, j - 1):
                    if out[k] != "\n":
                        out[k] = " "
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()) and i + 1 < n and text[i + 1].isalnum():
                i += 1  # C++14 digit separator 1'000
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            if strings:
                for k in range(i + 1, min(j, n)):
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _preprocess(masked: str) -> tuple[str, list[tuple[int, int, str]], list[tuple[int, tuple[str, ...]]]]:
    """Blank the preprocessor lines out of ``masked``.

    Returns (code, macros, pp): ``code`` without directives (continuation lines included);
    ``macros``: (start offset, end offset, name) of each ``#define``; ``pp``: (offset, the #if
    conditions active after the directive, directive word) for each directive, which
    :func:`parse` uses to keep braces balanced across #if/#else branches and to label sites."""
    lines = masked.split("\n")
    out, macros, pp = [], [], []
    stack: list[str] = []
    offset = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("#"):
            start = offset
            full = [line]
            while full[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                full.append(lines[i])
            directive = " ".join(x.rstrip().rstrip("\\") for x in full).strip()
            d = re.match(r"#\s*(\w+)\s*(.*)", directive)
            word, arg = (d.group(1), d.group(2).strip()) if d else ("", "")
            if word in ("if", "ifdef", "ifndef"):
                cond = arg if word == "if" else (f"defined({arg})" if word == "ifdef" else f"!defined({arg})")
                stack.append(cond)
            elif word == "elif":
                if stack:
                    stack[-1] = f"elif {arg} (after {stack[-1]})"
            elif word == "else":
                if stack:
                    stack[-1] = f"else of {stack[-1]}"
            elif word == "endif":
                if stack:
                    stack.pop()
            end = offset + sum(len(x) + 1 for x in full)
            if word == "define":
                name = re.match(r"\w+", arg)
                macros.append((start, end, name.group(0) if name else "?"))
            pp.append((start, tuple(stack), word))  # type: ignore[arg-type]
            out.extend(" " * len(x) for x in full)
            offset = end
        else:
            out.append(line)
            offset += len(line) + 1
        i += 1
    return "\n".join(out), macros, pp  # type: ignore[return-value]


def _function_name(header: str) -> str | None:
    """The name of the function whose definition ``header`` (the text before a ``{``) ends, or
    None if it is not a function definition (struct/enum/namespace body, initializer...)."""
    h = header.strip()
    if not h or "=" in re.sub(r"operator\s*\S+|\(.*\)", "", h, flags=re.S):
        return None
    # a constructor's initializer list: cut after the parameter list, the first top-level ")"
    # followed by a single ":"
    depth = 0
    for k, ch in enumerate(h):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and re.match(r"\s*:(?!:)", h[k + 1:]):
                h = h[:k + 1]
                break
    # trailing qualifiers after the parameter list
    h = re.sub(r"(\s*\b(const|noexcept|override|final|volatile)\b|\s*->\s*[\w:<>*&\s]+)+$", "", h)
    if not h.endswith(")"):
        return None
    depth = 0
    for k in range(len(h) - 1, -1, -1):
        if h[k] == ")":
            depth += 1
        elif h[k] == "(":
            depth -= 1
            if depth == 0:
                before = h[:k].rstrip()
                m = re.search(r"([A-Za-z_~][\w:]*)$", before)
                if not m or m.group(1) in _CONTROL:
                    return None
                name = m.group(1)
                if re.search(r"\b(struct|class|union|enum)\s*$", before[:m.start()]) and "(" not in before:
                    return None
                return name
    return None


#: an identifier that is not a member (``a->type``, ``p.x``)
_IDENT = re.compile(r"(?<![\w.])(?<!->)([A-Za-z_]\w*)")
_OP_CONSTRUCTOR = re.compile(r"\bstruct\s+ggml_tensor\s*\*\s*\w+\s*\((.*)\)\s*$", re.S)


def op_parameters(header: str, body: str) -> frozenset[str]:
    """The op parameters of a function: empty unless it is an op constructor (it returns
    ``struct ggml_tensor *`` and takes a ``struct ggml_context *``); else its parameters that are
    not tensors or the context (offsets, strides, sizes, modes, counts: what ggml stores in
    ``op_params``), and the locals assigned from expressions that read them, in the order of
    the body (``OW = ggml_calc_conv_output_size(b->ne[0], a->ne[0], s0, p0, d0)``). An assert
    whose condition reads one of these is a *parameter assert*: it must be mapped one by one
    (:func:`problems`). Light, like the parser: a value that reaches a condition through a call
    or a pointer is not followed."""
    m = _OP_CONSTRUCTOR.search(header)
    if not m or "ggml_context" not in m.group(1):
        return frozenset()
    names: set[str] = set()
    for p in m.group(1).split(","):
        if "ggml_tensor" in p or "ggml_context" in p:
            continue
        nm = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", p.strip())
        if nm and nm.group(1) != "void":
            names.add(nm.group(1))
    for a in re.finditer(r"(?<![\w.>])(\w+)\s*(?:\[[^\]]*\])?\s*=(?!=)([^;]*);", body):
        if names & set(_IDENT.findall(a.group(2))):
            names.add(a.group(1))
    return frozenset(names)


def parse(path: Path, rel: str) -> tuple[list[Site], list[Function]]:
    """Every GGML_ASSERT/GGML_ABORT of one source file, with its enclosing function."""
    text = path.read_text(encoding="utf-8", errors="replace")
    masked = _mask(text)
    no_comments = _mask(text, strings=False)
    code, macros, pp = _preprocess(masked)
    line_starts = [0]
    for m in re.finditer("\n", text):
        line_starts.append(m.end())

    def line_of(off: int) -> int:
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= off:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    # brace scan. Preprocessor branches: the depth at #if is remembered; each #elif/#else
    # branch starts from it again, and after #endif the depth of the first branch is kept.
    functions: list[Function] = []
    fn_spans: list[tuple[int, int, str]] = []  # (start offset, end offset, name)
    headers: dict[int, str] = {}  # start offset -> the function's header
    params: dict[int, frozenset[str]] = {}  # start offset -> op_parameters of the function
    stack: list[tuple[str, str | None, int]] = []  # (kind, name, start offset)
    pp_events = sorted((off, word) for off, _conds, word in pp)
    ev = 0
    branch: list[list[Any]] = []  # per open #if: [stack copy at #if, stack copy at end of first branch]
    last_boundary = 0
    i, n = 0, len(code)
    while i < n:
        while ev < len(pp_events) and pp_events[ev][0] <= i:
            word = pp_events[ev][1]
            if word in ("if", "ifdef", "ifndef"):
                branch.append([list(stack), None])
            elif word in ("elif", "else") and branch:
                if branch[-1][1] is None:
                    branch[-1][1] = list(stack)
                stack = list(branch[-1][0])
            elif word == "endif" and branch:
                b = branch.pop()
                if b[1] is not None:
                    stack = b[1]
            ev += 1
        c = code[i]
        if c == "{":
            header = code[last_boundary:i]
            in_fn = any(k == "function" for k, _, _ in stack)
            if in_fn:
                stack.append(("block", None, i))
            else:
                name = _function_name(header)
                if name is not None:
                    stack.append(("function", name, i))
                    headers[i] = header
                elif re.search(r"\b(namespace|extern)\b", header) or re.search(r"\b(struct|class|union)\b[^=]*$", header):
                    stack.append(("container", None, i))
                else:
                    stack.append(("data", None, i))
            last_boundary = i + 1
        elif c == "}":
            if stack:
                kind, name, start = stack.pop()
                if kind == "function":
                    fn_spans.append((start, i, name))  # type: ignore[arg-type]
                    params[start] = op_parameters(headers[start], code[start + 1:i])
                    functions.append(Function(name, line_of(start), line_of(i), params[start]))  # type: ignore[arg-type]
            last_boundary = i + 1
        elif c == ";":
            last_boundary = i + 1
        i += 1

    def header_line(start: int) -> int:
        # the line of the function name: walk back from the brace to the last boundary
        k = max(code.rfind(";", 0, start), code.rfind("}", 0, start), code.rfind("{", 0, start))
        seg = code[k + 1:start]
        m = re.search(r"[A-Za-z_~][\w:]*\s*\(", seg)
        return line_of(k + 1 + (m.start() if m else 0))

    sites: list[Site] = []
    for m in ASSERT_RE.finditer(masked):
        off = m.start()
        # arguments from the original text, balanced parentheses (masked text decides nesting)
        depth, j = 0, m.end() - 1
        while j < len(masked):
            if masked[j] == "(":
                depth += 1
            elif masked[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        cond = " ".join(no_comments[m.end():j].split())
        if m.group(1) == "ASSERT_ALIGNED" and code[off:off + 1] == " ":
            continue  # the #define of GGML_ASSERT_ALIGNED itself: listed as a macro below
        macro = next((name for s, e, name in macros if s <= off < e), None)
        conds = ()
        for p_off, p_conds, _w in pp:
            if p_off <= off:
                conds = p_conds
            else:
                break
        if macro is not None:
            sites.append(Site(rel, line_of(off), f"macro {macro}", m.group(1), cond, conds))
            continue
        inner = [(s, e, nm) for s, e, nm in fn_spans if s <= off <= e]
        if inner:
            s, e, nm = max(inner, key=lambda x: x[0])
            read = tuple(sorted(params[s] & set(_IDENT.findall(cond))))
            sites.append(Site(rel, line_of(off), nm, m.group(1), cond, conds, header_line(s), read))
        else:
            sites.append(Site(rel, line_of(off), "<file scope>", m.group(1), cond, conds))
    return sites, functions


def ggml_src(version: str | None = None) -> Path:
    """``vendor/ggml-<version>/src`` of the ggml pyggml was built with (or ``version``)."""
    if version is None:
        try:
            import pyggml
            version = pyggml.GGML_VERSION
        except Exception:  # noqa: BLE001 - not built: take the only vendored tree
            trees = sorted((ROOT / "vendor").glob("ggml-*"))
            if not trees:
                raise FileNotFoundError("no vendor/ggml-<version>: run python build_ggml.py") from None
            return trees[-1] / "src"
    return ROOT / "vendor" / f"ggml-{version}" / "src"


def collect(src: Path) -> list[Site]:
    sites: list[Site] = []
    for rel, _tier in FILES:
        s, _ = parse(src / rel, rel)
        sites.extend(s)
    return sites


# ------------------------------------------------------------------------------------------------
# the classification

@dataclasses.dataclass
class Verdict:
    cls: str
    by: list[str]     # pyggml functions that raise first (checked, kernel table, fork-trialed)
    why: str
    source: str       # where in the classification file it came from


def load_classification(path: Path = CLASSIFICATION) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _norm(cond: str) -> str:
    return re.sub(r"\s+", "", cond)


class Classifier:
    """The classification file, indexed: ``(file, function)`` -> Verdict, plus per-site
    overrides ``(file, function, condition)`` -> Verdict."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.by_fn: dict[tuple[str, str], Verdict] = {}
        self.by_site: dict[tuple[str, str, str], Verdict] = {}
        self.site_entry: dict[tuple[str, str, str], int] = {}
        self.probes: dict[tuple[str, str, str], str] = {}  # site -> Python that reaches it
        self.errors: list[str] = []
        for gi, g in enumerate(data.get("group", [])):
            v = self._verdict(g, f"group {gi + 1} ({g.get('file')})")
            for fn in g.get("functions", []):
                key = (g["file"], fn)
                if key in self.by_fn:
                    self.errors.append(f"{g['file']}:{fn} is classified twice")
                self.by_fn[key] = v
        for si, s in enumerate(data.get("site", [])):
            fns = s.get("functions") or [s.get("function", "")]
            v = self._verdict(s, f"site {si + 1} ({s.get('file')}:{fns[0]})")
            conds = s.get("conditions") or [s.get("condition", "")]
            probes = s.get("probes")
            if probes is not None and (len(probes) != len(conds) or len(fns) != 1):
                self.errors.append(f"{v.source}: 'probes' needs one function and one probe per condition")
                probes = None
            for fn in fns:
                for k, c in enumerate(conds):
                    key = (s["file"], fn, _norm(c))
                    if key in self.by_site:
                        self.errors.append(f"site {s['file']}:{fn} {c!r} is classified twice")
                    self.by_site[key] = v
                    self.site_entry[key] = si
                    if probes is not None:
                        self.probes[key] = probes[k]
        self.used_sites: set[tuple[str, str, str]] = set()
        self.gaps: dict[str, dict[str, Any]] = {}
        for g in data.get("gap", []):
            gid = g.get("id", "")
            if not re.fullmatch(r"G\d+", gid) or gid in self.gaps:
                self.errors.append(f"[[gap]] {gid!r}: ids are G<n>, each once")
            for field in ("title", "fix", "test"):
                if not g.get(field):
                    self.errors.append(f"[[gap]] {gid}: no {field!r}")
            if g.get("status", "open") not in ("open", "fixed"):
                self.errors.append(f"[[gap]] {gid}: status is 'open' or 'fixed'")
            self.gaps[gid] = g
        for v in list(self.by_fn.values()) + list(self.by_site.values()):
            if v.cls == "gap":
                ids = re.findall(r"\bG\d+\b", v.why)
                if not ids:
                    self.errors.append(f"{v.source}: a gap verdict must name its gap (G<n>)")
                for gid in ids:
                    if gid not in self.gaps:
                        self.errors.append(f"{v.source}: names {gid}, which has no [[gap]] entry")
                    elif self.is_fixed(gid):
                        self.errors.append(f"{v.source}: names {gid}, which is fixed: reclassify the site")

    def is_fixed(self, gid: str) -> bool:
        """Whether gap ``gid`` is fixed (its sites are classified otherwise now)."""
        return self.gaps.get(gid, {}).get("status", "open") == "fixed"

    def _verdict(self, entry: dict[str, Any], source: str) -> Verdict:
        cls = entry.get("class")
        if cls not in CLASSES:
            self.errors.append(f"{source}: unknown class {cls!r}")
        by = entry.get("by", [])
        if isinstance(by, str):
            by = [by]
        if cls in ("checked", "kernel table") and not by:
            self.errors.append(f"{source}: class {cls!r} needs 'by' (the pyggml function that raises)")
        if not entry.get("why"):
            self.errors.append(f"{source}: no 'why'")
        return Verdict(cls, list(by), entry.get("why", "").strip(), source)

    def classify(self, site: Site) -> Verdict | None:
        key = (site.file, site.function, _norm(site.condition))
        v = self.by_site.get(key)
        if v is not None:
            self.used_sites.add(key)
            return v
        return self.by_fn.get((site.file, site.function))


    def probe(self, site: Site) -> str | None:
        """The Python body the classification gives to reach ``site`` through the Pythonic
        layer (the names of tests/test_assert_checks.py's prelude: ``ctx``, ``T``...), or None."""
        return self.probes.get((site.file, site.function, _norm(site.condition)))


def resolve(dotted: str) -> Any:
    """The object a ``by`` entry names (``pyggml.core.ops.Ops.mul_mat``)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def problems(sites: list[Site], clf: Classifier, check_refs: bool = True) -> list[str]:
    """What the audit test fails on: unclassified sites, stale or duplicate entries, ``by``
    references that do not resolve."""
    out = list(clf.errors)
    seen_fns = {(s.file, s.function) for s in sites}
    for s in sites:
        v = clf.classify(s)
        if v is None:
            out.append(f"unclassified: {s.file}:{s.line} in {s.function}: GGML_{s.kind}({s.condition})")
        elif s.params and not v.source.startswith("site"):
            out.append(f"unmapped parameter assert: {s.file}:{s.line} in {s.function}: "
                       f"GGML_{s.kind}({s.condition}) reads {', '.join(s.params)}: give it a [[site]] "
                       "entry with a probe")
        elif s.params and v.cls != "unreachable" and clf.probe(s) is None:
            out.append(f"parameter assert without a probe: {s.file}:{s.line} in {s.function}: "
                       f"GGML_{s.kind}({s.condition})")
    for key in clf.by_fn:
        if key not in seen_fns:
            out.append(f"stale: {key[0]}:{key[1]} is classified but has no assert (any more)")
    used_entries = {clf.site_entry[k] for k in clf.used_sites}
    for si, entry in enumerate(clf.data.get("site", [])):
        if si not in used_entries:
            out.append(f"stale: [[site]] entry {si + 1} ({entry.get('file')}: "
                       f"{entry.get('function') or entry.get('functions')}) matches no assert")
    if check_refs:
        refs = {b for v in list(clf.by_fn.values()) + list(clf.by_site.values()) for b in v.by}
        for ref in sorted(refs):
            try:
                resolve(ref)
            except (ImportError, AttributeError) as e:
                out.append(f"'by' names {ref}, which does not exist ({type(e).__name__})")
    return out


# ------------------------------------------------------------------------------------------------
# the report

def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _cond_cell(s: Site) -> str:
    c = s.condition if s.kind != "ABORT" else f"ABORT {s.condition}"
    if len(c) > 110:
        c = c[:107] + "..."
    pp = ""
    if s.pp:
        pp = " <sub>#if " + _md("; ".join(s.pp))[:80] + "</sub>"
    return f"`{_md(c)}`{pp}"


def _by_cell(v: Verdict) -> str:
    return ", ".join(f"`{b}`" for b in v.by)


def report(sites: list[Site], clf: Classifier, version: str) -> str:
    verdicts = [(s, clf.classify(s)) for s in sites]
    per_file: dict[str, list[tuple[Site, Verdict | None]]] = defaultdict(list)
    for s, v in verdicts:
        per_file[s.file].append((s, v))
    out: list[str] = []
    w = out.append
    w("# GGML_ASSERT / GGML_ABORT sites and how pyggml keeps them from killing Python\n")
    w(f"Generated by `python scripts/assert_audit.py` from ggml {version} "
      f"(`vendor/ggml-{version}/src`) and `docs/asserts/classification.toml`; "
      "`tests/test_assert_audit.py` fails when this file is stale or a site is unclassified. "
      "Do not edit by hand.\n")
    w("Every `GGML_ASSERT` and `GGML_ABORT` ends in `abort()`: the Python process dies. The "
      "Pythonic layer therefore checks what ggml would assert on before it calls C. Each site "
      "below is classified:\n")
    for k, d in CLASSES.items():
        w(f"- **{k}**: {d}")
    w("")
    # summary
    cls_names = list(CLASSES)
    w("## Summary\n")
    w("Sites (functions) per file and classification:\n")
    w("| file | " + " | ".join(cls_names) + " | unclassified | total |")
    w("|---|" + "---|" * (len(cls_names) + 2))
    tot: Counter[str] = Counter()
    tot_fn: dict[str, set[Any]] = defaultdict(set)
    for rel, tier in FILES:
        rows = per_file.get(rel, [])
        c: Counter[str] = Counter()
        fns: dict[str, set[str]] = defaultdict(set)
        for s, v in rows:
            k = v.cls if v else "unclassified"
            c[k] += 1
            fns[k].add(s.function)
            tot_fn[k].add((rel, s.function))
        tot.update(c)
        cells = [f"{c[k]} ({len(fns[k])})" if c[k] else "" for k in cls_names + ["unclassified"]]
        n_fn = len({s.function for s, _ in rows})
        w(f"| `{rel}`{' (tier 2)' if tier == 2 else ''} | " + " | ".join(cells) + f" | {len(rows)} ({n_fn}) |")
    cells = [f"{tot[k]} ({len(tot_fn[k])})" if tot[k] else "" for k in cls_names + ["unclassified"]]
    n_fn = len({(s.file, s.function) for s in sites})
    w("| **all** | " + " | ".join(cells) + f" | {len(sites)} ({n_fn}) |")
    w("\nA function whose sites are classified differently counts once in each of its classes.\n")
    open_gaps = {gid: g for gid, g in clf.gaps.items() if not clf.is_fixed(gid)}
    fixed_gaps = {gid: g for gid, g in clf.gaps.items() if clf.is_fixed(gid)}
    if open_gaps:
        w("### Gaps\n")
        w("Each gap has a strict-xfail test in `tests/test_assert_checks.py` that runs the input in a "
          "subprocess and aborts today; the fix makes it pass (and the xfail marker goes).\n")
        for gid, g in sorted(open_gaps.items(), key=lambda kv: int(kv[0][1:])):
            where: dict[tuple[str, str], list[int]] = defaultdict(list)
            for s, v in verdicts:
                if v and v.cls == "gap" and re.search(rf"\b{gid}\b", v.why):
                    where[(s.file, s.function)].append(s.line)
            w(f"**{gid}. {_md(g['title'])}.**")
            w(f"Fix: {_md(g['fix'])} Test: `{g['test']}`.")
            sites_txt = "; ".join(f"`{f}:{','.join(map(str, lines))}` `{fn}`" for (f, fn), lines in where.items())
            if g.get("applies_to"):
                sites_txt = _md(g["applies_to"]) + (f"; {sites_txt}" if sites_txt else "")
            w(f"Sites: {sites_txt or '-'}.\n")
    if fixed_gaps:
        w("### Fixed gaps\n")
        w("Gaps the audit found and pyggml has since closed; the sites are classified by what checks "
          "them now, and each gap's test in `tests/test_assert_checks.py` (a subprocess that aborted "
          "before the fix) is a plain test that must raise.\n")
        for gid, g in sorted(fixed_gaps.items(), key=lambda kv: int(kv[0][1:])):
            w(f"**{gid}. {_md(g['title'])}.**")
            w(f"Fixed: {_md(g['fix'])} Test: `{g['test']}`.\n")
    params = [(s, v) for s, v in verdicts if s.params]
    if params:
        w("### Parameter asserts\n")
        w("Asserts of op constructors that read a parameter which is not a tensor (offsets, strides, "
          "sizes, modes, counts: what ggml stores in `op_params`), or a local computed from one. Each "
          "is mapped on its own, with a probe (`probes` in the classification) that "
          "`tests/test_assert_checks.py` runs in a subprocess: it must raise a Python exception.\n")
        w("| site | function | condition | reads | class |")
        w("|---|---|---|---|---|")
        for s, v in params:
            w(f"| `{s.file}:{s.line}` | `{s.function}` | {_cond_cell(s)} | {', '.join(s.params)} | "
              + (f"{v.cls}" + (f" by {_by_cell(v)}" if v.by else "") if v else "**unclassified**") + " |")
        w("")
    w("### What the parser cannot see\n")
    for b in BLIND_SPOTS:
        w(f"- {b}")
    w("")
    # per file
    for rel, tier in FILES:
        rows = per_file.get(rel, [])
        w(f"## `src/{rel}`{' (tier 2)' if tier == 2 else ''}\n")
        if not rows:
            w("No GGML_ASSERT / GGML_ABORT.\n")
            continue
        by_fn: dict[str, list[tuple[Site, Verdict | None]]] = defaultdict(list)
        for s, v in rows:
            by_fn[s.function].append((s, v))
        # one block per group of functions with the same verdict, in source order
        blocks: list[tuple[Verdict | None, list[str]]] = []
        index: dict[int, int] = {}
        order = sorted(by_fn, key=lambda f: by_fn[f][0][0].line)
        for fn in order:
            fv = clf.by_fn.get((rel, fn))
            key = id(fv) if fv is not None else -1
            if key in index and fv is not None:
                blocks[index[key]][1].append(fn)
            else:
                index[key] = len(blocks)
                blocks.append((fv, [fn]))
        for fv, fns in blocks:
            if fv is None:
                head = "**unclassified**"
            else:
                head = f"**{fv.cls}**" + (f" by {_by_cell(fv)}" if fv.by else "")
            w(f"### {', '.join(f'`{f}`' for f in fns[:6])}{' and %d more' % (len(fns) - 6) if len(fns) > 6 else ''}\n")
            w(f"{head}. {_md(fv.why) if fv else ''}\n")
            w("| line | function | condition | class (where it differs) |")
            w("|---|---|---|---|")
            for fn in fns:
                for s, v in by_fn[fn]:
                    diff = ""
                    if v is not fv:
                        diff = "**unclassified**" if v is None else f"**{v.cls}**" + (f" by {_by_cell(v)}" if v.by else "") + f": {_md(v.why)}"
                    w(f"| {s.line} | `{fn}` | {_cond_cell(s)} | {diff} |")
            w("")
    return "\n".join(out) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail on unclassified sites or a stale report")
    ap.add_argument("--list", action="store_true", help="print every site")
    ap.add_argument("--unclassified", action="store_true", help="print the unclassified functions")
    ap.add_argument("--version", help="ggml version (default: the one pyggml was built with)")
    a = ap.parse_args(list(argv) if argv is not None else None)
    src = ggml_src(a.version)
    version = src.parent.name.removeprefix("ggml-")
    sites = collect(src)
    if a.list:
        for s in sites:
            print(f"{s.file}:{s.line}\t{s.function}\tGGML_{s.kind}({s.condition})")
        return 0
    clf = Classifier(load_classification())
    if a.unclassified:
        seen = set()
        for s in sites:
            if clf.classify(s) is None and (s.file, s.function) not in seen:
                seen.add((s.file, s.function))
                n = sum(1 for t in sites if (t.file, t.function) == (s.file, s.function))
                print(f"{s.file}\t{s.function}\t{s.line}\t{n}")
        return 0
    text = report(sites, clf, version)
    if a.check:
        bad = problems(sites, clf)
        if REPORT.read_text() != text if REPORT.exists() else True:
            bad.append("docs/asserts.md is stale: run python scripts/assert_audit.py")
        for b in bad:
            print(b)
        return 1 if bad else 0
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)
    bad = problems(sites, clf, check_refs=False)
    print(f"wrote {REPORT.relative_to(ROOT)}: {len(sites)} sites, {len(bad)} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
