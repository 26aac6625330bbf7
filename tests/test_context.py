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


def test_sizes_the_machine_or_ggml_cannot_have_raise_instead_of_aborting():
    with pytest.raises(MemoryError):
        Context(2**50)                           # ggml_init would assert on its failed malloc
    with Context.for_tensors(4) as ctx:
        with pytest.raises(ValueError, match="more than ggml can address"):
            ctx.new_tensor(GGMLType.F32, [2**40, 2**30])   # nbytes would overflow size_t
        t = ctx.new_tensor(GGMLType.F32, [2**20, 2**20])    # large but representable: no data in no_alloc
        assert t.nbytes == 4 * 2**40


def test_reset_invalidates_the_tensors_it_forgets():
    with Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.ones(4, np.float32))
        ctx.reset()
        b = ctx.from_numpy(np.zeros(4, np.float32))   # reuses a's memory
        with pytest.raises(ClosedError, match="reset"):
            a.numpy()
        np.testing.assert_array_equal(b.numpy(), 0)
