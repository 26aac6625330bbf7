#!/usr/bin/env python3
"""Write docs/torch_ops.rst, the table of the ATen overloads pyggml.torch_lowering lowers and
the ggml ops each becomes (their ``notes``), from the lowering table itself.

    python scripts/torch_lowering_table.py          # write it
    python scripts/torch_lowering_table.py --check  # exit 1 if it is stale (tests/torch_lowering)
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "torch_ops.rst"


def render() -> str:
    from pyggml.torch_lowering import TABLE
    from pyggml.torch_lowering.table import Lowering
    by_module: dict[str, list[Lowering]] = {}
    for low in TABLE.values():
        family = low.lower.__module__.rsplit(".", 1)[-1].removeprefix("ops_")
        by_module.setdefault(family, []).append(low)
    n_aten = sum(low.name.startswith("aten.") for low in TABLE.values())
    others = sorted("operator.getitem" if low.name.startswith("<built-in") else low.name
                    for low in TABLE.values() if not low.name.startswith("aten."))
    lines = ["ATen overloads lowered to ggml", "==============================", "",
             (f"The {n_aten} ATen overloads (and {', '.join(f'``{o}``' for o in others)}) "
              ":mod:`pyggml.torch_lowering` lowers, by family, with the ggml ops"),
             "each becomes (written by ``scripts/torch_lowering_table.py`` from the lowering table; each",
             "is tested against eager torch in ``tests/torch_lowering/test_aten_lowerings.py``). Tensors are float32;",
             "index tensors (int64 or int32) are given to ggml as I32. Anything else stays in torch.", ""]
    for family in sorted(by_module):
        title = family.capitalize()
        lines += [title, "-" * len(title), "", ".. list-table::", "   :header-rows: 1", "",
                  "   * - overload", "     - ggml"]
        for low in sorted(by_module[family], key=lambda x: x.name):
            name = "operator.getitem" if low.name.startswith("<built-in") else low.name
            lines += [f"   * - ``{name}``", f"     - {low.notes}"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/torch_lowering_table.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
