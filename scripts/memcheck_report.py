"""Summarise valgrind memcheck logs: the errors whose stack passes through ggml or pyggml.

    python scripts/memcheck_report.py LOG [LOG ...]

Valgrind reports every error of the process, and CPython, the dynamic loader and NumPy have
known ones of their own (uninitialised bytes hashed by ``int.from_bytes``, ``strncmp`` reading
past a string in ``dl-load.c``...). An error counts here when one of its frames is in a ggml
library (``libggml*.so``), pyggml's cffi extension (``_ggml.*.so``) or a file of pyggml; each
distinct one (first line and top four frames) is printed once with its count, then the first
whole record of each.

Two kinds: **memory errors** (a read or write outside live memory, a bad free, overlapping
copies, a system call given unaddressable memory) break pyggml's guarantee; **uninitialised
values** are computations on a tensor's memory that nothing wrote yet — a backend buffer is
uninitialised memory, like ``numpy.empty``, and the fuzzer computes on tensors it never set —
so they are counted apart and do not fail. Exit status 1 when there is any memory error.
"""
from __future__ import annotations

import collections
import re
import sys

MEMORY = re.compile(r"(Invalid (read|write|free)|Syscall param .* unaddressable|"
                    r"Source and destination overlap|Mismatched free|Argument '.*' of function)")
UNINIT = re.compile(r"(Conditional jump or move depends on uninitialised|Use of uninitialised|"
                    r"Syscall param .* uninitialised)")
OURS = re.compile(r"libggml|_ggml\.cpython|/pyggml/")


def errors(text: str) -> list[list[str]]:
    """The error records of one log (records are separated by an empty ``==pid==`` line)."""
    out = []
    for rec in re.split(r"\n==\d+== *\n", text):
        lines = [re.sub(r"^==\d+== ", "", line) for line in rec.splitlines()]
        lines = [line for line in lines if line.strip()]
        if lines and (MEMORY.match(lines[0]) or UNINIT.match(lines[0])) and any(
                OURS.search(line) for line in lines):
            out.append(lines)
    return out


def main(paths: list[str]) -> int:
    count: collections.Counter[str] = collections.Counter()
    first: dict[str, list[str]] = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for lines in errors(f.read()):
                frames = [re.sub(r"0x[0-9A-Fa-f]+: ", "", line.strip()) for line in lines
                          if re.match(r"\s*(at|by) ", line)]
                key = " | ".join([lines[0]] + frames[:4])
                count[key] += 1
                first.setdefault(key, lines)
    memory = {k: n for k, n in count.items() if MEMORY.match(k)}
    print(f"{sum(memory.values())} memory errors through ggml or pyggml ({len(memory)} distinct), "
          f"{sum(count.values()) - sum(memory.values())} uses of uninitialised values, "
          f"in {len(paths)} log(s)")
    for key, n in count.most_common():
        print(f"{n:6d}  {key}")
    for key in count:
        print("-" * 72 + "\n" + "\n".join(first[key][:40]))
    return 1 if memory else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
