"""pyggml.backends.alloc: the graph allocator and the lifetime of what it places."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from pyggml.backends.graph_run import run_of
from pyggml import ClosedError, Context, CPUBackend, GGMLType, GraphAllocator, Scheduler

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
        galloc = run_of(g).placed_by
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


def test_placing_a_graph_that_reads_a_closed_buffer_raises_closed_error(run_isolated):
    """A graph with a view of a tensor whose buffer (Context.alloc_tensors) was closed:
    GraphAllocator.alloc_graph returned normally after ggml_backend_view_init called
    init_tensor through the freed buffer (use after free), and reserve sized for it
    (scripts/fuzz.sh seed 102: 'galloc.reserve: ClosedError was due, but it returned None').
    Both raise ClosedError now, as Scheduler does; the graph built again on live memory works."""
    r = run_isolated("""
        from pyggml import ClosedError, Context, GGMLType, GraphAllocator
        from pyggml.backends.cpu import cpu_buffer_type
        plan, work = Context(1 << 20, no_alloc=True), Context(1 << 20, no_alloc=True)
        t = plan.new_tensor(GGMLType.F32, [8, 8])
        buf = plan.alloc_tensors(cpu_buffer_type())
        out = work.cont(work.view(t, [4, 2], [t.nb[1]], 0))
        g = work.new_graph(64).build_forward(out)
        buf.close()
        for name in ("reserve", "alloc_graph"):
            try:
                getattr(GraphAllocator(cpu_buffer_type()), name)(g)
                print(name, "returned")
            except ClosedError as e:
                print(name, "ClosedError", "freed" in str(e))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["reserve ClosedError True", "alloc_graph ClosedError True"], r.stdout


def test_an_empty_tensor_after_a_placement_that_allocated_nothing(run_isolated):
    """A GraphAllocator whose first graph had every tensor allocated already (its buffer has no
    chunk), then the same graph with a zero-element tensor added: ggml-alloc needed no bigger
    buffer, allocated none, and aborted placing the 0-byte tensor in the missing chunk
    (GGML_ASSERT(buffer), ggml-backend.cpp; scripts/fuzz.sh seed 104). Zero-byte tensors are
    placed by pyggml before ggml places the rest (pyggml.backends.alloc); the graph computes."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
        be = CPUBackend(1)
        ctx = Context(1 << 20, no_alloc=True)
        a = ctx.new_tensor(GGMLType.F32, [2, 3])
        b = ctx.new_tensor(GGMLType.F32, [2, 3])
        out = ctx.concat(a, b, 0).set_output()
        g = ctx.new_graph(64).build_forward(out)
        ctx.alloc_tensors(be)
        ga = GraphAllocator(be)
        ga.alloc_graph(g)
        g.build_forward(ctx.new_tensor(GGMLType.F32, [5, 0]))
        for _ in range(2):
            ga.alloc_graph(g)
            a.set(np.ones((3, 2), np.float32)); b.set(np.zeros((3, 2), np.float32))
            g.compute(be)
            print(out.numpy().sum())
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["6.0", "6.0"], r.stdout


ZERO_BYTE_GRAPH = """
    import numpy as np
    from pyggml import Context, CPUBackend, GGMLType, GraphAllocator, Scheduler
    be = CPUBackend(1)
    ctx = Context.for_tensors(32, graph_size=32)
    z = ctx.new_tensor(GGMLType.F32, [0, 4])
    zz = ctx.add(z, z).set_output()
    g = ctx.new_graph(32).build_forward(zz)
"""


@pytest.mark.parametrize("placer", ["GraphAllocator(be).alloc_graph(g); g.compute(be)",
                                    "Scheduler([be]).compute(g)"])
def test_a_graph_whose_only_tensors_to_place_have_zero_bytes(run_isolated, placer):
    """add(z, z) with z of ne [0, 4]: the only tensors to place have zero bytes, so ggml-alloc
    made an empty buffer (base NULL) and z, placed at NULL as a leaf, looked unplaced when
    visited again as a source: GGML_ASSERT(tensor->buffer == NULL) in ggml_backend_tensor_alloc
    (ggml-backend.cpp), with a fresh allocator or scheduler. pyggml places zero-byte tensors in
    a small buffer of the placer's first; the graph computes to an empty result."""
    r = run_isolated(ZERO_BYTE_GRAPH + f"""
    {placer}
    print(zz.numpy().shape, zz._ptr.data != 0)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["(4,", "0)", "True"], r.stdout


def test_zero_byte_and_normal_branches_compute_and_zero_byte_tensors_move_with_their_placer():
    """A graph with a zero-element branch (z + z, sum_rows(z): ne [1, 4] of zeros, a sum over
    nothing) and a normal one: the normal branch computes right (NumPy), through two
    allocators, the first closed; the zero-byte tensors live in the placer's small buffer,
    raise ClosedError once it is closed, and are placed again by the next placer."""
    x = rng.standard_normal((4, 3)).astype(np.float32)
    with CPUBackend(1) as be, Context.for_tensors(32, graph_size=32) as ctx:
        z = ctx.new_tensor(GGMLType.F32, [0, 4]).set_input()
        xt = ctx.new_tensor(GGMLType.F32, [3, 4]).set_input()
        zz = ctx.add(z, z).set_output()
        s = ctx.sum_rows(z).set_output()
        y = ctx.add(ctx.sqr(xt), xt).set_output()
        g = ctx.new_graph(32).build_forward(zz).build_forward(s).build_forward(y)
        A = GraphAllocator(be)
        A.alloc_graph(g)
        xt.set(x)
        g.compute(be)
        np.testing.assert_array_equal(y.numpy(), x * x + x)
        np.testing.assert_array_equal(s.numpy(), np.zeros((4, 1), np.float32))
        assert zz.numpy().shape == (4, 0)
        A.close()
        with pytest.raises(ClosedError):
            zz.numpy()
        with GraphAllocator(be) as B:
            for _ in range(2):
                B.alloc_graph(g)
                xt.set(2 * x)
                g.compute(be)
                np.testing.assert_array_equal(y.numpy(), 4 * x * x + 2 * x)
                np.testing.assert_array_equal(s.numpy(), np.zeros((4, 1), np.float32))
                assert zz.numpy().shape == (4, 0)
        with pytest.raises(ClosedError):
            zz.numpy()


def test_a_leaf_output_read_by_no_node_is_placed_again_when_its_allocator_is_gone(run_isolated):
    """A leaf built as an output (read by no node): placed by allocator A, A closed, placed by
    B: it stayed in A's freed buffer (pyggml re-placed only nodes and their sources), so reading
    it raised ClosedError however often the graph was allocated again; a zero-byte one kept a
    buffer without data, which ggml_backend_tensor_alloc asserts against."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
        be = CPUBackend(1)
        ctx = Context(1 << 20, no_alloc=True)
        a = ctx.new_tensor(GGMLType.F32, [2, 3]).set_input()
        out = ctx.sqr(a).set_output()
        leaf = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        empty = ctx.new_tensor(GGMLType.F32, [5, 0])
        g = ctx.new_graph(64).build_forward(out).build_forward(leaf).build_forward(empty)
        A = GraphAllocator(be)
        A.alloc_graph(g)
        B = GraphAllocator(be)
        A.close()
        B.alloc_graph(g)
        leaf.set(np.arange(4, dtype=np.float32)); a.set(np.ones((3, 2), np.float32))
        g.compute(be)
        print(out.numpy().sum(), leaf.numpy().sum(), empty.numpy().shape)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["6.0", "6.0", "(0,", "5)"], r.stdout


def test_a_graph_placed_by_a_second_allocator_leaves_the_first_ones_memory():
    """Graph g placed by A, then by B: ggml keeps tensors that have data where they are, so
    g's tensors stayed in A's memory, which A gave to graph h next; computing g then wrote
    into h's tensors, and B.covers(g) let it through (scripts/fuzz.sh seed 108: a compute
    expected to raise ClosedError ran). The placer that places a graph now places again what
    sits in any placer's memory: g lives in B, h keeps its values."""
    with CPUBackend() as be, Context.for_tensors(32, graph_size=32) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        mid = ctx.sqr(x)
        y = ctx.add(mid, x).set_output()
        g = ctx.new_graph(32).build_forward(y)
        xh = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        yh = ctx.neg(xh).set_output()
        h = ctx.new_graph(32).build_forward(yh)
        with GraphAllocator(be) as A, GraphAllocator(be) as B:
            A.alloc_graph(g)
            A.alloc_graph(h)
            B.alloc_graph(g)
            xh.set(np.full(4, 7, np.float32))
            h.compute(be)
            x.set(np.arange(4, dtype=np.float32))
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), np.arange(4) ** 2 + np.arange(4))
            np.testing.assert_array_equal(yh.numpy(), np.full(4, -7))


def test_a_closed_allocator_leaves_the_graph_where_it_was():
    """alloc_graph (and reserve) of a closed allocator forgot the places of the graph's tensors
    in placers' memory before raising ClosedError: a tensor placed by allocator A (which has
    since placed another graph) then had no data, and reading it raised ValueError ("no data")
    instead of ClosedError (scripts/fuzz.sh seed 309, tests/fuzz_state_worker.py 309 40 50). A
    closed allocator raises before touching the graph."""
    with CPUBackend(1) as be, Context.for_tensors(32, graph_size=32) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        g = ctx.new_graph(32).build_forward(ctx.sqr(x).set_output())
        h = ctx.new_graph(32).build_forward(ctx.neg(ctx.new_tensor(GGMLType.F32, [8]).set_input()))
        with GraphAllocator(be) as A:
            A.alloc_graph(g)
            A.alloc_graph(h)
            B = GraphAllocator(be)
            B.close()
            for fn in (B.alloc_graph, B.reserve):
                with pytest.raises(ClosedError):
                    fn(g)
            assert x._ptr.data != 0
            with pytest.raises(ClosedError, match="placed another graph"):
                x.numpy()


def test_a_tensor_added_to_the_placed_graph_after_placement_keeps_no_claim_on_its_memory():
    """Fuzz seed 3011: a tensor placed with graph 1, then graph 2 placed by the same allocator
    (its memory re-used), then that tensor added to graph 2 by ``build_forward``: the tensor
    still pointed into memory graph 2's tensors use, and writing it went through (aliasing
    graph 2's values). What an allocator placed is what was in the graph *when* it was placed."""
    with CPUBackend() as be, Context.for_tensors(16, graph_size=16) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [64]).set_input()
        g1 = ctx.new_graph(16).build_forward(ctx.sqr(a).set_output())
        b = ctx.new_tensor(GGMLType.F32, [64]).set_input()
        y2 = ctx.sqr(b).set_output()
        g2 = ctx.new_graph(16).build_forward(y2)
        with GraphAllocator(be) as galloc:
            galloc.alloc_graph(g1)
            a.set(np.ones(64, np.float32))
            galloc.alloc_graph(g2)                   # same size: g1's memory now holds g2
            with pytest.raises(ClosedError):
                a.set(np.ones(64, np.float32))
            g2.build_forward(a)                      # a joins g2 but keeps its old place
            with pytest.raises(ClosedError):
                a.set(np.ones(64, np.float32))       # would write into b's or y2's memory
            with pytest.raises(ClosedError):
                a.numpy()
            with pytest.raises(ClosedError, match="added to this graph"):
                g2.compute(be)
            galloc.alloc_graph(g2)                   # placed again, with a: all usable
            a.set(np.full(64, 3, np.float32))
            b.set(np.full(64, 2, np.float32))
            g2.compute(be)
            np.testing.assert_array_equal(y2.numpy(), np.full(64, 4, np.float32))
            np.testing.assert_array_equal(a.numpy(), np.full(64, 3, np.float32))


@pytest.mark.parametrize("placer", ["GraphAllocator(be)", "Scheduler([be], graph_size=64)"])
def test_a_placer_can_be_used_again_after_a_memory_error(run_isolated, placer):
    """Fuzz seed 4015: ggml's allocator, after failing to allocate its buffer, keeps the plan
    of the graph it failed for and a NULL buffer; allocating that graph again skipped the
    reservation (the plan looked current) and placed the tensors in the NULL buffer: a crash,
    for a user who catches the MemoryError and tries again. A smaller graph then works."""
    r = run_isolated(f"""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator, Scheduler
        with CPUBackend(n_threads=1) as be, Context.for_tensors(16, graph_size=16) as ctx:
            big = ctx.new_tensor(GGMLType.F32, [2**40, 2**20]).set_input()
            g = ctx.new_graph(16).build_forward(ctx.sqr(big))
            small = ctx.new_tensor(GGMLType.F32, [8]).set_input()
            y = ctx.sqr(small)
            g2 = ctx.new_graph(16).build_forward(y)
            placer = {placer}
            for call in ("reserve", "alloc_graph", "alloc_graph", "reserve", "alloc_graph"):
                try:
                    getattr(placer, call)(g)
                    print(call, "returned")
                except MemoryError:
                    print(call, "MemoryError")
            placer.alloc_graph(g2)
            small.set(np.arange(8, dtype=np.float32))
            if isinstance(placer, Scheduler):
                placer.compute(g2)
            else:
                g2.compute(be)
            print("small", y.numpy().tolist())
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:6] == ["reserve MemoryError", "alloc_graph MemoryError", "alloc_graph MemoryError",
                                         "reserve MemoryError", "alloc_graph MemoryError",
                                         f"small {[float(i * i) for i in range(8)]}"], r.stdout


def test_an_uninited_view_of_a_tensor_whose_memory_moved_on_raises_closed_error():
    """Fuzz seed 9011: a view made before its source had data keeps no data until an allocator
    inits it; reading it said "no data yet" (ValueError) even when its source's memory had
    been given to another graph since, where ClosedError is what the caller must learn."""
    with CPUBackend(n_threads=1) as be, Context.for_tensors(16, graph_size=16) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        vx = ctx.view(x, [4])
        g1 = ctx.new_graph(16).build_forward(ctx.sqr(x))
        z = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        g2 = ctx.new_graph(16).build_forward(ctx.sqr(z))
        with GraphAllocator(be) as galloc:
            galloc.alloc_graph(g1)
            with pytest.raises(ValueError, match="no data yet"):
                vx.numpy()
            galloc.alloc_graph(g2)
            with pytest.raises(ClosedError, match="placed another graph"):
                vx.numpy()


@pytest.mark.parametrize("placer", ["GraphAllocator(be)", "Scheduler([be], graph_size=16)"])
def test_a_graph_reading_a_tensor_another_placer_moved_on_from_raises_closed_error(placer):
    """Fuzz seed 12023: a graph computed on a backend that reads a tensor placed by a graph
    allocator or scheduler which has placed another graph since (or was reset): the memory is
    live, so the memory check passed and the compute read the other graph's values. The check
    is cached with the graph; the placer moving on invalidates it."""
    from pyggml import Scheduler  # noqa: F401 - for eval
    with CPUBackend(n_threads=1) as be, Context.for_tensors(32, graph_size=16) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        g1 = ctx.new_graph(16).build_forward(ctx.sqr(x))
        z = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        g2 = ctx.new_graph(16).build_forward(ctx.sqr(z))
        p = eval(placer)
        p.alloc_graph(g1)
        x.set(np.full(8, 2, np.float32))
        y3 = ctx.add(x, x)
        g3 = ctx.new_graph(16).build_forward(y3)
        buf = ctx.alloc_tensors(be)           # y3 in a buffer of the user's; x stays where p put it
        g3.compute(be)                        # p still holds x: fine
        np.testing.assert_array_equal(y3.numpy(), np.full(8, 4, np.float32))
        p.alloc_graph(g2)                     # p's memory holds g2 now
        with pytest.raises(ClosedError, match="placed another graph or was reset"):
            g3.compute(be)
        p.close()
        buf.close()


def test_a_leaf_the_last_plan_gave_no_place_is_planned_again(run_isolated):
    """Fuzz seed 16001, a crash: ggml's allocator plans again only when the node or leaf
    counts or the nodes change, never for the leafs. A graph of one leaf that had data when
    planned (a zero-byte tensor pyggml places itself), then another graph of one leaf without
    data: ggml placed that leaf through buffer -1 (SIGSEGV). pyggml reserves first now."""
    r = run_isolated('''
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
        with CPUBackend(n_threads=1) as be, Context.for_tensors(16, graph_size=16) as ctx:
            z = ctx.new_tensor(GGMLType.F32, [1, 1, 2, 0])
            g1 = ctx.new_graph(16).build_forward(z)
            x = ctx.new_tensor(GGMLType.F32, [8])
            g2 = ctx.new_graph(16).build_forward(x)
            with GraphAllocator(be) as galloc:
                galloc.alloc_graph(g1)
                galloc.alloc_graph(g2)
                x.set(np.arange(8, dtype=np.float32))
                print(x.numpy().tolist())
    ''')
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str([float(i) for i in range(8)])


def test_compute_reports_a_freed_source_before_an_uninited_view_of_it():
    """Fuzz seed 16015: a view made before its source had data keeps none; once the source's
    buffer is closed, computing a graph that reads the view said "has no data" (ValueError)
    where ClosedError (the memory is gone) is what the caller must learn."""
    with CPUBackend(n_threads=1) as be, Context.for_tensors(4) as ctx1, Context(1 << 16) as ctx2:
        x = ctx1.new_tensor(GGMLType.F32, [8])
        vx = ctx2.view(x, [4])         # x has no data yet: neither has the view
        y = ctx2.sqr(vx)
        g = ctx2.new_graph(8).build_forward(y)
        buf = ctx1.alloc_tensors(be)   # x placed; the view of another context stays without
        with pytest.raises(ValueError, match="has no data"):
            be.graph_compute(g)
        buf.close()
        with pytest.raises(ClosedError, match="freed"):
            be.graph_compute(g)


@pytest.mark.parametrize("kind", ["galloc", "sched"])
def test_a_tensor_marked_output_after_placing_is_kept_when_placed_again(kind):
    """Fuzz seed 2535: ggml-alloc planned NEG in place over the leaf it reads (a leaf read once,
    neither input nor output); after x.set_output() ggml_gallocr_alloc_graph kept that plan
    (it plans again only when counts or sizes change, whatever the flags), so x still shared
    its memory with neg(x) and read back negated. A graph allocator, and a scheduler (it
    reserves first), plan again when the input/output flags changed since their plan."""
    x0 = np.linspace(-1.5, 1.5, 8).astype(np.float16).reshape(8, 1)
    with CPUBackend(n_threads=1) as be, Context.for_tensors(8, graph_size=8) as ctx:
        x = ctx.new_tensor(GGMLType.F16, [1, 8])
        y = ctx.neg(x)
        out = ctx.cont(y).set_output()
        g = ctx.new_graph(8).build_forward(out)
        with GraphAllocator(be) if kind == "galloc" else Scheduler([be], graph_size=16) as placer:
            placer.alloc_graph(g)
            assert x._ptr.data == y._ptr.data  # ggml's in-place reuse, allowed while x is no output
            x.set_output()
            placer.alloc_graph(g)
            assert x._ptr.data != y._ptr.data
            x.set(x0)
            if kind == "galloc":
                g.compute(be)
            else:
                placer.compute(g)
            np.testing.assert_array_equal(x.numpy(), x0)
            np.testing.assert_array_equal(out.numpy(), np.negative(x0))


def test_a_graph_checked_before_its_tensors_were_unplaced_is_checked_again(run_isolated):
    """A crash (SIGSEGV) found while shrinking fuzz seed 2535: g1 and g2 hold the same tensors,
    placed with g1; a backend checked g2 (the check is cached on g2). Reserving g1 on another
    allocator forgets where those tensors were (data NULL, to place them anew), but g2's check
    still looked valid, and the backend ran the ADD kernel on NULL. Now it is checked again:
    ValueError (no data)."""
    r = run_isolated('''
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
        with CPUBackend(n_threads=1) as be, Context.for_tensors(8, graph_size=8) as ctx:
            a = ctx.new_tensor(GGMLType.F32, [4])
            b = ctx.add(a, a).set_output()
            g1 = ctx.new_graph(8).build_forward(b)
            g2 = ctx.new_graph(8).build_forward(b)
            p1, p2 = GraphAllocator(be), GraphAllocator(be)
            p1.alloc_graph(g1)
            a.set(np.arange(4, dtype=np.float32))
            be.graph_compute(g1)
            be.graph_compute(g2)
            print(b.numpy().tolist())
            p2.reserve(g1)
            try:
                be.graph_compute(g2)
            except ValueError as e:
                print("ValueError", "has no data" in str(e))
    ''')
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [str([0.0, 2.0, 4.0, 6.0]), "ValueError True"], r.stdout


def test_a_graph_placed_again_is_not_walked_again_for_support_until_it_changes(monkeypatch):
    """Two graphs taking turns on one allocator are placed again before each compute; the walk
    asking the backend whether it supports each node (what neither placement changes) is done
    once per graph, and again after a node is built into the graph: an unsupported one (a
    permuted first operand of add, which ggml's CPU kernel asserts on) then raises."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with CPUBackend(n_threads=1) as be, Context.for_tensors(4) as wctx, Context.for_tensors(32, graph_size=32) as ctx:
        w = wctx.from_numpy(x)
        wctx.alloc_tensors(be)
        w.set(x)
        g1 = ctx.new_graph(32).build_forward(ctx.sqr(w))
        g2 = ctx.new_graph(32).build_forward(ctx.relu(ctx.scale(w, 2.0)))
        asked = []
        supports = type(be)._supports_raw
        monkeypatch.setattr(type(be), "_supports_raw", lambda self, p: asked.append(p) or supports(self, p))
        with GraphAllocator(be) as galloc:
            for _ in range(3):
                for g in (g1, g2):
                    galloc.alloc_graph(g)
                    g.compute(be)
            assert len(asked) == 3   # sqr; scale, relu
            np.testing.assert_allclose(g2.nodes[-1].numpy(), np.maximum(2 * x, 0))
            g1.build_forward(ctx.add(ctx.permute(ctx.sqr(w), 1, 0, 2, 3), ctx.new_tensor(GGMLType.F32, [3, 4])))
            galloc.alloc_graph(g1)
            with pytest.raises(ValueError, match="cannot compute node"):
                g1.compute(be)


def test_row_indices_are_checked_at_every_compute_of_graphs_placed_again():
    """Which tensors hold row indices is found once per graph (its structure, which a placement
    does not change), and their values are checked before every compute: with two graphs
    taking turns on one allocator, an index past the table still raises, and a get_rows built
    into a graph afterwards is checked too."""
    table = rng.standard_normal((4, 3)).astype(np.float32)
    with CPUBackend(n_threads=1) as be, Context.for_tensors(4) as wctx, Context.for_tensors(32, graph_size=32) as ctx:
        w = wctx.from_numpy(table)
        wctx.alloc_tensors(be)
        w.set(table)
        idx = ctx.new_tensor(GGMLType.I32, [2]).set_input()
        g1 = ctx.new_graph(32).build_forward(ctx.get_rows(w, idx))
        g2 = ctx.new_graph(32).build_forward(ctx.sqr(w))
        with GraphAllocator(be) as galloc:
            for rows in ([0, 3], [1, 2], [3, 0]):
                galloc.alloc_graph(g1)
                idx.set(np.array(rows, np.int32))
                g1.compute(be)
                np.testing.assert_array_equal(g1.nodes[-1].numpy(), table[rows])
                galloc.alloc_graph(g2)
                g2.compute(be)
            galloc.alloc_graph(g1)
            idx.set(np.array([0, 4], np.int32))
            with pytest.raises(ValueError, match="row index 4"):
                g1.compute(be)
            other = ctx.new_tensor(GGMLType.I32, [1]).set_input()
            g2.build_forward(ctx.get_rows(w, other))
            galloc.alloc_graph(g2)
            other.set(np.array([7], np.int32))
            with pytest.raises(ValueError, match="row index 7"):
                g2.compute(be)
            other.set(np.array([2], np.int32))
            g2.compute(be)
            np.testing.assert_array_equal(g2.nodes[-1].numpy(), table[2])
