"""pyggml.backends.sched: the scheduler, its eval callback and its checks."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml import ClosedError, Context, CPUBackend, GGMLType, Scheduler
from pyggml.raw import ffi

rng = np.random.default_rng(1)


def test_scheduler_eval_callback_sees_and_stops():
    x = rng.standard_normal((2, 8)).astype(np.float32)
    with CPUBackend() as be, Context.for_tensors(16, graph_size=16) as ctx:
        sched = Scheduler([be], graph_size=16)
        a = ctx.new_tensor(GGMLType.F32, [8, 2]).set_input()
        out = ctx.unary("tanh", ctx.sqr(a))
        g = ctx.new_graph(16).build_forward(out)
        seen = []

        def watch(t, ask):
            if not ask:
                seen.append((t.op_name, t.numpy().copy()))
            return True

        sched.eval_callback = watch
        sched.alloc_graph(g)
        a.set(x)
        assert sched.compute(g) is True
        assert [name for name, _ in seen] == ["SQR", "UNARY"]
        np.testing.assert_allclose(seen[0][1], x ** 2, rtol=1e-6)
        assert sched.n_splits == 1 and sched.get_tensor_backend(out) == be

        seen.clear()
        sched.eval_callback = lambda t, ask: ask or (seen.append(t.op_name) or t.op_name != "SQR")
        assert sched.compute(g) is False   # stopped after SQR
        assert seen == ["SQR"]

        def boom(t, ask):
            raise RuntimeError("from the callback")

        sched.eval_callback = boom
        with pytest.raises(RuntimeError, match="from the callback"):
            sched.compute(g)
        sched.close()


def test_scheduler_refuses_what_ggml_asserts():
    with CPUBackend() as be:
        with pytest.raises(ValueError, match="1 to 16"):
            Scheduler([])
        with pytest.raises(ValueError, match="1 to 16"):
            Scheduler([be] * 17)


def test_a_graph_that_computes_nothing_is_refused():
    with CPUBackend() as cpu, Context.for_tensors(8, graph_size=8) as ctx:
        sched = Scheduler([cpu])
        a = ctx.new_tensor(GGMLType.F32, [4, 4]).set_input()
        leafs_only = ctx.new_graph(8).build_forward(ctx.reshape(a, 16))   # a view: no computing node
        with pytest.raises(ValueError, match="no node that computes"):
            sched.alloc_graph(leafs_only)
        sched.close()


def test_a_scheduler_computes_two_graphs_in_turn():
    x = np.arange(8, dtype=np.float32)
    with CPUBackend() as cpu, Context.for_tensors(16, graph_size=16) as ctx:
        sched = Scheduler([cpu])
        a = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        g1 = ctx.new_graph(16).build_forward(y1 := ctx.sqr(a))
        g2 = ctx.new_graph(16).build_forward(y2 := ctx.scale(a, 3.0))
        for _ in range(2):
            for g, y, ref in ((g1, y1, x * x), (g2, y2, 3 * x)):
                sched.alloc_graph(g)
                a.set(x)
                sched.compute(g)
                np.testing.assert_array_equal(y.numpy(), ref)
        with pytest.raises(ClosedError):       # its memory holds the other graph's values now
            y1.numpy()
        sched.close()


def test_a_closed_scheduler_raises_closed_error_before_checking_the_graph():
    """A closed scheduler given a graph it could not split anyway raised the ValueError about
    the graph (found by the state machine fuzzer): use after close is a ClosedError first."""
    with Context.for_tensors(4, graph_size=8) as ctx, CPUBackend() as be:
        a = ctx.new_tensor(GGMLType.F32, [4])
        g = ctx.new_graph(8).build_forward(ctx.view(a, [2]))  # no node that computes
        s = Scheduler([be], graph_size=8)
        s.close()
        for fn in (s.alloc_graph, s.reserve):
            with pytest.raises(ClosedError):
                fn(g)


@pytest.mark.parametrize("n", [0, 2])
def test_a_view_of_arena_memory_is_refused_by_the_scheduler(run_isolated, n):
    """A view of a tensor in an allocating context's memory (data, no backend buffer) gets no
    backend from the scheduler: ggml-alloc asserted buffer_id >= 0 and the interpreter died
    (found by the state machine fuzzer; empty or not)."""
    r = run_isolated(f"""
        import pytest
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        with Context(1 << 20) as ctx, CPUBackend() as be:
            a = ctx.new_tensor(GGMLType.F32, [1, 3, 3, 8])
            g = ctx.new_graph(64).build_forward(ctx.rms_norm(ctx.view(a, [{n}]), 1e-5))
            with Scheduler([be], graph_size=64) as s, pytest.raises(ValueError, match="view"):
                s.alloc_graph(g)
            b = ctx.new_tensor(GGMLType.F32, [8])    # no view: still placed
            with Scheduler([be], graph_size=64) as s:
                s.alloc_graph(ctx.new_graph(64).build_forward(ctx.sqr(b)))
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, f"exit {r.returncode}\\n{r.stderr[-2000:]}"


def test_a_scheduler_whose_backend_was_closed_raises_closed_error():
    """A backend closed under a scheduler: alloc_graph/reserve/compute raised a TypeError from
    cffi (None for the backend pointer), and a graph placed before the close was still computed
    (found by scripts/fuzz.sh)."""
    with Context.for_tensors(4, graph_size=8) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        g = ctx.new_graph(8).build_forward(ctx.sqr(a))
        be = CPUBackend()
        placed = Scheduler([be], graph_size=8)
        placed.alloc_graph(g)
        s = Scheduler([be], graph_size=8)
        be.close()
        for fn in (s.alloc_graph, s.reserve, s.compute, placed.compute):
            with pytest.raises(ClosedError):
                fn(g)


def test_a_leaf_output_read_by_no_node_is_placed_by_the_scheduler(run_isolated):
    """A leaf built as an output but read by no node gets no backend from the split, and
    ggml-alloc aborted (GGML_ASSERT(buffer_id >= 0), ggml-alloc.c; found while triaging
    scripts/fuzz.sh seed 104). The scheduler pins such leafs to its CPU backend, places and
    tracks them like the other tensors."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        be = CPUBackend(1)
        ctx = Context(1 << 20, no_alloc=True)
        a = ctx.new_tensor(GGMLType.F32, [2, 3]).set_input()
        out = ctx.sqr(a).set_output()
        leaf = ctx.new_tensor(GGMLType.F32, [5, 2])
        g = ctx.new_graph(64).build_forward(out).build_forward(leaf)
        s = Scheduler([be], graph_size=64)
        s.reserve(g)
        for _ in range(2):
            s.alloc_graph(g)
            a.set(np.ones((3, 2), np.float32)); leaf.set(np.ones((2, 5), np.float32))
            s.compute(g)
            print(out.numpy().sum(), leaf.numpy().sum())
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["6.0", "10.0", "6.0", "10.0"], r.stdout


def test_a_leaf_read_only_through_a_view_is_placed_by_the_scheduler(run_isolated):
    """A leaf without data whose only reader is a view node: ggml's split gives the leaf the
    view's backend before the view has one, so the leaf kept none and ggml-alloc aborted
    (GGML_ASSERT(buffer_id >= 0), ggml-alloc.c; scripts/fuzz.sh seed 201, a permute of a leaf).
    The scheduler pins such leafs to its CPU backend."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        be = CPUBackend(1)
        ctx = Context(1 << 20, no_alloc=True)
        x = ctx.new_tensor(GGMLType.F32, [6])
        y = ctx.sqr(ctx.view(x, [3], [], 8)).set_output()
        g = ctx.new_graph(64).build_forward(y)
        s = Scheduler([be], graph_size=64)
        for _ in range(2):
            s.alloc_graph(g)
            x.set(np.arange(6, dtype=np.float32))
            s.compute(g)
            print(*y.numpy().tolist())
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["4.0", "9.0", "16.0"] * 2, r.stdout


def test_a_zero_byte_tensor_after_a_placement_that_allocated_nothing(run_isolated):
    """A scheduler whose first graph had every tensor placed already (its compute buffer got
    no chunk), then the graph with a zero-element tensor added: ggml-alloc needed no bigger
    buffer, allocated none, and aborted placing the 0-byte tensor in the missing chunk
    (GGML_ASSERT(buffer), ggml-backend.cpp). Zero-byte tensors are placed by pyggml before ggml
    places the rest (pyggml.backends.alloc); the graph computes (NumPy reference)."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        be = CPUBackend(1)
        ctx = Context.for_tensors(32, graph_size=32)
        a = ctx.new_tensor(GGMLType.F32, [2, 3])
        b = ctx.new_tensor(GGMLType.F32, [2, 3])
        out = ctx.concat(a, b, 0).set_output()
        g = ctx.new_graph(64).build_forward(out)
        ctx.alloc_tensors(be)
        s = Scheduler([be])
        s.alloc_graph(g)
        print(s.buffer_size(be))
        z = ctx.new_tensor(GGMLType.F32, [5, 0])
        g.build_forward(ctx.add(z, z))
        x = np.arange(6, dtype=np.float32).reshape(3, 2)
        for _ in range(2):
            s.alloc_graph(g)
            a.set(x); b.set(-x)
            s.compute(g)
            print(np.array_equal(out.numpy(), np.concatenate([x, -x], axis=1)))
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0", "True", "True"], r.stdout


@pytest.mark.parametrize("backends", ["numpy+cpu", "cpu"])
def test_zero_byte_tensors_under_a_scheduler_of_two_backends(run_isolated, backends):
    """The NumPy backend and the CPU backend (or the CPU one alone), a graph with a zero-element branch (z + z, and
    sum_rows(z): zeros) beside a normal one, then a graph of zero-byte tensors only: zero-byte
    tensors are placed in the buffer of one backend that runs them all (no split copies one),
    everything computes (NumPy reference)."""
    r = run_isolated(f"""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        from pyggml.impl import numpy as numpy_backend
        cpu, nb = CPUBackend(1), numpy_backend.init()
        s = Scheduler([nb, cpu] if {backends!r} == "numpy+cpu" else [cpu], graph_size=128)
        ctx = Context.for_tensors(32, graph_size=32)
        z = ctx.new_tensor(GGMLType.F32, [0, 4]).set_input()
        xt = ctx.new_tensor(GGMLType.F32, [3, 4]).set_input()
        zz = ctx.add(z, z).set_output()
        sr = ctx.sum_rows(zz).set_output()
        y = ctx.add(ctx.sqr(xt), xt).set_output()
        g = ctx.new_graph(32).build_forward(zz).build_forward(sr).build_forward(y)
        x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3)
        for k in range(2):
            s.alloc_graph(g)
            xt.set(x + k)
            s.compute(g)
            print(np.allclose(y.numpy(), (x + k) ** 2 + x + k, rtol=1e-6), zz.numpy().shape,
                  np.array_equal(sr.numpy(), np.zeros((4, 1), np.float32)))
        h = ctx.new_graph(32).build_forward(ctx.add(zz, z))
        s.compute(h)
        print(h.nodes[-1].numpy().shape)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:3] == ["True (4, 0) True"] * 2 + ["(4, 0)"], r.stdout


def test_a_reserve_after_a_failed_alloc_graph_starts_from_an_empty_hash_set(run_isolated):
    """Fuzz seed 8020: ``ggml_backend_sched_reserve`` splits the graph without resetting the
    scheduler first; after a failed ``alloc_graph`` (its split filled the hash set, no reset
    followed) the tensors of the failed graph were still in the set, the new graph's did not
    fit, and ggml aborted (``ggml_hash_find_or_insert``: a full hash set) on a graph well
    within ``graph_size``."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        with CPUBackend(n_threads=1) as be, Context.for_tensors(16, graph_size=16) as ctx:
            big = ctx.new_tensor(GGMLType.F32, [2**40, 2**20]).set_input()
            g = ctx.new_graph(16).build_forward(ctx.sqr(ctx.sqr(big)))
            small = ctx.new_tensor(GGMLType.F32, [8]).set_input()
            y = ctx.sqr(ctx.sqr(small))
            g2 = ctx.new_graph(16).build_forward(y)
            sched = Scheduler([be], graph_size=4)  # a hash set of 5: one graph of 3 fits
            for call in ("alloc_graph", "reserve"):
                try:
                    getattr(sched, call)(g)
                except MemoryError:
                    print(call, "MemoryError")
            sched.reserve(g2)
            sched.alloc_graph(g2)
            small.set(np.arange(8, dtype=np.float32))
            sched.compute(g2)
            print("small", y.numpy().tolist())
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:3] == ["alloc_graph MemoryError", "reserve MemoryError",
                                         f"small {[float(i ** 4) for i in range(8)]}"], r.stdout


def _two_cpu_scheduler(a, b, graph_size=16):
    """A scheduler of two CPU backends whose first keeps its tensors in a Python host buffer
    type: ggml moves a node pinned to ``b`` to ``a`` when both have one buffer type."""
    from pyggml.impl.buffer import HostBuffer, PyBufferType

    class HostType(PyBufferType):
        def get_name(self):
            return "HOST_PY"

        def alloc_buffer(self, size):
            return HostBuffer(size)

        def is_host(self):
            return True

    return Scheduler([a, b], bufts=[HostType().as_buffer_type(), b.default_buffer_type], graph_size=graph_size)


def test_a_pin_holds_for_every_split_until_reset():
    """``set_tensor_backend`` pins a node for the splits to come: the reset pyggml makes before
    each split (ggml's hash set, where the pins live, must be empty of an earlier split's
    tensors) makes the pins again; ``reset`` forgets them."""
    x = np.arange(8, dtype=np.float32)
    with CPUBackend(n_threads=1) as a, CPUBackend(n_threads=1) as b, \
            Context.for_tensors(16, graph_size=16) as ctx:
        inp = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        y = ctx.sqr(inp)
        z = ctx.sqr(y)
        g = ctx.new_graph(16).build_forward(z)
        sched = _two_cpu_scheduler(a, b)
        sched.alloc_graph(g)
        assert (sched.get_tensor_backend(y), sched.get_tensor_backend(z), sched.n_splits) == (a, a, 1)
        sched.set_tensor_backend(y, a)
        sched.set_tensor_backend(z, b)
        assert sched.get_tensor_backend(z) is a  # the held graph's split is unchanged
        for _ in range(2):
            sched.alloc_graph(g)
            assert (sched.get_tensor_backend(y), sched.get_tensor_backend(z), sched.n_splits) == (a, b, 2)
            inp.set(x)
            sched.compute(g)
            np.testing.assert_array_equal(z.numpy(), x ** 4)
        sched.reset()
        assert sched.get_tensor_backend(z) is None
        sched.alloc_graph(g)
        assert (sched.get_tensor_backend(z), sched.n_splits) == (a, 1)
        sched.close()


def test_pins_and_lookups_cannot_fill_the_hash_set(run_isolated):
    """ggml keeps pins, and inserts every tensor ``get_tensor_backend`` looks up, in the hash set
    of ``graph_size`` tensors, and aborts when it is full: pyggml refuses the pin that would
    fill it (at ``set_tensor_backend``, or at the split when the graph's own tensors leave no
    room) and looks up only the held graph's tensors."""
    r = run_isolated("""
        import pytest
        from pyggml import Context, CPUBackend, GGMLType, Scheduler
        with CPUBackend(n_threads=1) as be, Context.for_tensors(64, graph_size=16) as ctx:
            others = [ctx.new_tensor(GGMLType.F32, [4]) for _ in range(40)]
            x = ctx.new_tensor(GGMLType.F32, [4]).set_input()
            g = ctx.new_graph(16).build_forward(ctx.sqr(ctx.sqr(x)))
            sched = Scheduler([be], graph_size=8)
            sched.alloc_graph(g)
            print([sched.get_tensor_backend(t) for t in others] == [None] * 40)
            for t in others[:7]:
                sched.set_tensor_backend(t, be)
            with pytest.raises(ValueError, match="pinned already"):
                sched.set_tensor_backend(others[7], be)
            with pytest.raises(ValueError, match="set_tensor_backend"):
                sched.alloc_graph(g)   # 3 tensors of the graph + 7 pins outside it
            sched.reset()
            for t in others[:4]:
                sched.set_tensor_backend(t, be)
            sched.alloc_graph(g)
            print("placed")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["True", "placed"], r.stdout


def test_a_split_refused_for_the_cpu_kernels_leaves_nothing_placed():
    """Fuzz seed 10032: ``alloc_graph`` refused a split that put on the CPU a node whose kernel
    cannot compute it (ValueError), but the graph's tensors stayed placed in the scheduler's
    memory; ``alloc_tensors`` then skipped them (they had data) instead of giving them room."""
    with CPUBackend(n_threads=1) as be, Context.for_tensors(16, graph_size=16) as ctx:
        x = ctx.new_tensor(GGMLType.F16, [4]).set_input()
        y = ctx.rms_norm(x, 1e-6)   # ggml makes it; the CPU kernel takes F32 only
        g = ctx.new_graph(16).build_forward(y)
        with Scheduler([be], graph_size=16) as sched:
            with pytest.raises(ValueError, match="cannot compute it"):
                sched.alloc_graph(g)
        buf = ctx.alloc_tensors(be)
        assert x.buffer_ptr == buf.ptr and y.buffer_ptr == buf.ptr



def test_a_split_refused_after_another_scheduler_placed_the_graph_leaves_it_without_data():
    """Fuzz seed 3320: a graph placed and computed by one scheduler, then grown by a node the
    CPU kernel cannot compute and given to another scheduler, which refuses the split. Before
    splitting, pyggml takes the graph's tensors out of the first scheduler's memory (a scheduler
    places again what sits in a placer's memory), and the refused split keeps none of them: the
    input has no data (ValueError, not ClosedError and not a read of memory that scheduler may
    give to another graph) until it is placed again."""
    with CPUBackend(n_threads=1) as be, Context.for_tensors(16, graph_size=16) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        h = ctx.new_tensor(GGMLType.F16, [4]).set_input()
        g = ctx.new_graph(16).build_forward(ctx.scale(x, 2.0))
        with Scheduler([be], graph_size=16) as first, Scheduler([be], graph_size=16) as second:
            first.alloc_graph(g)
            x.set(np.arange(4, dtype=np.float32))
            first.compute(g)
            assert x.buffer_ptr != ffi.NULL
            g.build_forward(ctx.rms_norm(h, 1e-6))  # the CPU kernel takes F32 only
            with pytest.raises(ValueError, match="cannot compute it"):
                second.compute(g)
            assert x.buffer_ptr == ffi.NULL
            with pytest.raises(ValueError, match="no data yet"):
                x.set(np.ones(4, np.float32))
        buf = ctx.alloc_tensors(be)
        assert x.buffer_ptr == buf.ptr
        x.set(np.ones(4, np.float32))
        np.testing.assert_array_equal(x.numpy(), np.ones(4, np.float32))
