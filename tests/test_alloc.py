"""pyggml.alloc: the graph allocator and the lifetime of what it places."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from pyggml import ClosedError, Context, CPUBackend, GGMLType, GraphAllocator

rng = np.random.default_rng(1)


def test_alloc_tensors_and_graph_allocator():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with CPUBackend(n_threads=2) as be, Context.for_tensors(4) as wctx, Context.for_tensors(16, graph_size=16) as ctx:
        w = wctx.from_numpy(x)
        buf = wctx.alloc_tensors(be)
        w.set(x)
        y = ctx.sqr(w)
        g = ctx.new_graph(16).build_forward(y)
        with GraphAllocator(be) as galloc:
            galloc.alloc_graph(g)
            assert galloc.buffer_size >= y.nbytes
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), x ** 2)
        assert buf.size >= x.nbytes
        be.tensor_memset(w, 0)
        assert not w.numpy().any()


def test_allocators_stay_alive_with_their_tensors_and_closing_them_invalidates_data():
    x = np.ones((2, 4), dtype=np.float32)
    with CPUBackend() as be, Context.for_tensors(8, graph_size=8) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
        y = ctx.sqr(a)
        g = ctx.new_graph(8).build_forward(y)
        GraphAllocator(be).alloc_graph(g)   # no reference kept: the graph it placed keeps it alive
        gc.collect()
        a.set(x)
        g.compute(be)
        np.testing.assert_array_equal(y.numpy(), x)
        galloc = g.placed_by
        galloc.close()
        with pytest.raises(ClosedError):
            y.numpy()
        with pytest.raises(ClosedError):
            g.compute(be)
