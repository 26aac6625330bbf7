#!/usr/bin/env python3
"""Write docs/torch_zoo.rst: for each architecture of the torch lowering's zoo
(``tests/torch_lowering/zoo.py``: small random-weight transformers models), the share of its
ATen nodes ggml computes under ``torch.compile(backend="pyggml")``, dynamo's graph breaks, the
largest difference to eager torch, and why the other nodes stay in torch.

    python scripts/torch_lowering_zoo.py            # needs torch and transformers (CI's torch step)

tests/torch_lowering/test_zoo.py checks every architecture against this table (no fewer nodes on
ggml than it says, differences within 1e-4)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "torch_lowering"))

OUT = ROOT / "docs" / "torch_zoo.rst"


def main() -> int:
    import torch
    import transformers

    from zoo import ZOO, coverage

    rows = []
    for name in ZOO:
        s = coverage(name)
        why = "; ".join(f"``{op.replace('aten.', '')}``: {reason}" for op, reason in sorted(s["torch"].items()))
        rows.append((name, s["ggml"], s["nodes"], s["breaks"], s["max_diff"], why or "-"))
        print(f"{name}: {s['ggml']}/{s['nodes']} on ggml, {s['breaks']} breaks, max diff {s['max_diff']:.1e}")
    lines = [
        "Architectures through ``torch.compile(backend=\"pyggml\")``",
        "=" * 58,
        "",
        "Small random-weight models of transformers' architectures (``tests/torch_lowering/zoo.py``: two",
        "layers of 32 values, float32 weights, exact attention), compiled with ``dynamic=False`` and run",
        "beside eager torch on one input: the ATen nodes of the compiled graphs that ggml computes, dynamo's",
        "graph breaks, the largest absolute difference of ``last_hidden_state`` to eager, and why the",
        "other nodes stay in torch. Written by ``scripts/torch_lowering_zoo.py`` "
        f"(torch {torch.__version__.split('+')[0]}, transformers {transformers.__version__});",
        "``tests/torch_lowering/test_zoo.py`` checks each row. It also generates 10 tokens with each",
        "decoder-only one (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3, OPT, with a",
        "language-model head and weights 8x their initial spread) through transformers' ``generate``",
        "with a ``StaticCache``, the decode steps compiled: every node of theirs on ggml, eager's",
        "greedy tokens, logits within 1e-5 of their largest.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 14 10 6 8 62",
        "",
        "   * - architecture",
        "     - on ggml",
        "     - breaks",
        "     - max diff",
        "     - stays in torch",
    ]
    for name, g, n, breaks, diff, why in rows:
        lines += [f"   * - {name}", f"     - {g} / {n} ({100 * g // max(n, 1)} %)", f"     - {breaks}",
                  f"     - {diff:.1e}", f"     - {why}"]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
