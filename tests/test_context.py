"""pyggml.context: full contexts, closed contexts."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml import ClosedError, Context, CPUBackend, GGMLType


def test_full_context_raises_memory_error():
    with Context(4096) as ctx:
        with pytest.raises(MemoryError, match="context full"):
            ctx.new_tensor(GGMLType.F32, [10_000])
        small = [ctx.new_tensor(GGMLType.F32, [1]) for _ in range(5)]
        with pytest.raises(MemoryError):
            for _ in range(100):
                small.append(ctx.add(small[0], small[0]))


def test_closed_objects_raise_instead_of_crashing():
    ctx = Context(1 << 20)
    t = ctx.from_numpy(np.ones(4, dtype=np.float32))
    ctx.close()
    ctx.close()  # idempotent
    with pytest.raises(ClosedError):
        t.numpy()
    with pytest.raises(ClosedError):
        ctx.new_tensor(GGMLType.F32, [1])
    be = CPUBackend()
    be.close()
    with pytest.raises(ClosedError):
        be.name
