"""Every architecture of the zoo (tests/torch_lowering/zoo.py: small random-weight transformers
models) compiled with torch.compile(backend="pyggml"): its last hidden state within 1e-4 of eager
torch (float32 weights), no graph break, and at least as many of its ATen nodes on ggml as
docs/torch_zoo.rst (written by scripts/torch_lowering_zoo.py) says."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402
from zoo import ZOO, coverage  # noqa: E402


def _table() -> dict[str, int]:
    """architecture -> the nodes on ggml the docs' table records."""
    text = (ROOT / "docs" / "torch_zoo.rst").read_text(encoding="utf-8")
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"\* - (.+)\n     - (\d+) / \d+", text)}


@pytest.mark.parametrize("name", list(ZOO))
def test_architecture(name):
    s = coverage(name)
    assert s["max_diff"] <= 1e-4, s
    assert s["breaks"] == 0, s
    recorded = _table().get(name)
    assert recorded is not None, f"{name} is not in docs/torch_zoo.rst: run python scripts/torch_lowering_zoo.py"
    assert s["ggml"] >= recorded, f"{name}: {s['ggml']} nodes on ggml, the table says {recorded}: {s['torch']}"
