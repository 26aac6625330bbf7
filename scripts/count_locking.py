#!/usr/bin/env python3
"""Count the code lines (comments and docstrings left out) of pyggml's Pythonic layer that deal
with locking: the measure the concurrency contract is kept small by (:mod:`pyggml.raw.threads`
holds the machinery; the concept modules only name what a call uses).

    python scripts/count_locking.py [ROOT] [MODULE...]   # ROOT: a checkout (default .);
                                                         # MODULEs counted apart as machinery
"""
import ast, io, re, sys, tokenize
from pathlib import Path
P = re.compile(r"_lock\b|_lock\.|_locks\b|\busing\b|\busing\(|arenas|_cobject\.holding|@holding|_holding|guarded|_closing|\bclosing\(|\bcloses\b|"
               r"threads\.changes|_cobject\.changes|\bchanges\s*[+=]|threads\.changed|_cobject\.changed|boundary\.lent|\blent\(\)|on_behalf|_closers|lifecycle|LIFECYCLE|"
               r"_compute_lock|held=|in_call|_dependents|_DEPENDENTS|_readers|_writer|\b_gate|_enter_gate|_leave_gate|"
               r"threading\.|RLock|acquire\(|lock\.release\(|held\.release\(|\b_take\(|_give_back|\.hold\(|\bthreads\.")
def code_lines(path):
    src = path.read_text()
    doc = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            b = node.body[0]
            if isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant) and isinstance(b.value.value, str):
                doc.update(range(b.lineno, b.end_lineno + 1))
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.start[0] in doc:
            continue
        out.setdefault(tok.start[0], []).append(tok.string)
    return ["".join(v) for _, v in sorted(out.items())]
root = Path(sys.argv[1] if len(sys.argv) > 1 else "."); machinery = sys.argv[2:]
tot = {}
for p in sorted((root / "pyggml").rglob("*.py")):
    rel = str(p.relative_to(root))
    if "/raw/" in rel or rel.endswith(("_unchecked_ops.py", "_enums.py")):
        continue
    n = sum(1 for l in code_lines(p) if P.search(l))
    if n: tot[rel] = n
m = sum(v for k, v in tot.items() if k in machinery)
print(f"{root}: all={sum(tot.values())} machinery={m} concepts={sum(tot.values()) - m}")
print("  ", {k: v for k, v in sorted(tot.items(), key=lambda kv: -kv[1])})
