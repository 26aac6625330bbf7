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


def _chain(ctx, x, n):
    y = x
    for _ in range(n):
        y = ctx.sqr(y) + x
    return y


def test_growing_for_a_bigger_graph_invalidates_the_first_graphs_tensors():
    with CPUBackend() as be, Context.for_tensors(256, graph_size=256) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [64]).set_input()
        small = _chain(ctx, x, 2).set_output()
        g1 = ctx.new_graph(256).build_forward(small)
        x2 = ctx.new_tensor(GGMLType.F32, [4096]).set_input()
        big = _chain(ctx, x2, 8).set_output()
        g2 = ctx.new_graph(256).build_forward(big)
        with GraphAllocator(be) as galloc:
            galloc.alloc_graph(g1)
            x.set(np.ones(64, np.float32))
            g1.compute(be)
            size1 = galloc.buffer_size
            galloc.alloc_graph(g2)                   # grows: the first buffer is freed
            assert galloc.buffer_size > size1
            with pytest.raises(ClosedError):
                small.numpy()                        # would read freed memory
            with pytest.raises(ClosedError):
                g1.compute(be)
            galloc.alloc_graph(g1)                   # placed again: usable again
            x.set(np.full(64, 2, np.float32))
            g1.compute(be)
            np.testing.assert_allclose(small.numpy(), np.full(64, 38, np.float32))


def test_reading_a_node_before_its_graph_is_computed_raises():
    with CPUBackend() as be, Context.for_tensors(16, graph_size=16) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        y = ctx.sqr(a)
        g = ctx.new_graph(16).build_forward(y)
        with GraphAllocator(be) as galloc:
            galloc.alloc_graph(g)
            a.set(np.arange(8, dtype=np.float32))
            np.testing.assert_array_equal(a.numpy(), np.arange(8))   # an input: set, readable
            with pytest.raises(ValueError, match="not been computed"):
                y.numpy()                        # would be whatever the memory held
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), np.arange(8) ** 2)


def test_a_graph_with_an_empty_tensor_can_be_allocated_again():
    with CPUBackend() as be, Context.for_tensors(16, graph_size=16) as ctx:
        e = ctx.new_tensor(GGMLType.F32, [0, 4]).set_input()
        a = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        y = ctx.concat(ctx.sqr(e), ctx.reshape(a, 1, 4), 0)
        g = ctx.new_graph(16).build_forward(y)
        with GraphAllocator(be) as galloc:
            for _ in range(3):                    # the once-per-iteration call
                galloc.alloc_graph(g)
                a.set(np.arange(4, dtype=np.float32))
                g.compute(be)
                np.testing.assert_array_equal(y.numpy().ravel(), np.arange(4))


def test_an_allocator_placed_graph_can_move_to_another_allocator():
    with CPUBackend() as be, Context.for_tensors(16, graph_size=16) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        y = ctx.sqr(a)
        g = ctx.new_graph(16).build_forward(y)
        with GraphAllocator(be) as first:
            first.alloc_graph(g)
        with GraphAllocator(be) as second:           # the first one's memory is gone: placed anew
            second.alloc_graph(g)
            a.set(np.ones(8, np.float32))
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), np.ones(8))
