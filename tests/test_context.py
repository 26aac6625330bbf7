"""pyggml.core.context: full contexts, closed contexts."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT
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


def test_a_reset_context_makes_the_graphs_reading_its_tensors_refused(run_isolated):
    """A node of ctx2 reads a tensor of ctx1; ctx1.reset() reuses that tensor's memory. Building
    a graph walked the stale source pointer (a segfault once the memory held data), and graph
    allocators, schedulers and backends placed or computed the graph (found by the state
    machine of tests/fuzz_state_worker.py)."""
    r = run_isolated("""
        import numpy as np
        from pyggml import ClosedError, Context, CPUBackend, GGMLType, GraphAllocator, Scheduler

        c1 = Context(1 << 16)
        c2 = Context.for_tensors(16, graph_size=16)
        c1.new_tensor(GGMLType.F32, [4])
        a = c1.new_tensor(GGMLType.F32, [4, 2])      # not first: data lands on its struct later
        o = c2.sqr(a)
        built = c2.new_graph(16).build_forward(o)
        c1.reset()
        big = c1.new_tensor(GGMLType.I8, [1 << 12])
        big.set(np.full(1 << 12, 0x41, np.int8))     # over a's old struct
        refused = 0
        for what in ("build", "galloc", "sched", "compute", "op"):
            try:
                if what == "build":
                    c2.new_graph(16).build_forward(o)
                elif what == "galloc":
                    GraphAllocator(CPUBackend()).alloc_graph(built)
                elif what == "sched":
                    Scheduler([CPUBackend()]).alloc_graph(built)
                elif what == "compute":
                    CPUBackend().graph_compute(built)
                else:
                    c2.neg(o)
            except ClosedError:
                refused += 1
        c2.reset()                                   # usable again
        c2.neg(c2.new_tensor(GGMLType.F32, [2]))
        print("refused", refused)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused 5" in r.stdout


def test_a_reset_of_a_context_only_nodes_made_after_the_graph_read_leaves_the_graph_usable():
    """Fuzz seed 16027: after a graph of ctx2's tensors was built, ctx2 made a node from a
    tensor of ctx1 (not in the graph), and ctx1 was reset. Graph allocators refused the graph as
    closed (its contexts were ctx2's dependencies as they were *then*), while the backend,
    which had checked the graph before, computed it. The graph's contexts are those its
    tensors came from when they were added; a graph that does read ctx1 is still refused."""
    from pyggml import GraphAllocator

    x = np.arange(4, dtype=np.float32)
    with Context(1 << 16) as c1, Context.for_tensors(16, graph_size=16) as c2:
        be = CPUBackend()
        a = c2.new_tensor(GGMLType.F32, [4])
        g = c2.new_graph(16).build_forward(c2.sqr(a))
        galloc = GraphAllocator(be)
        galloc.alloc_graph(g)
        a.set(x)
        be.graph_compute(g)
        other = c1.new_tensor(GGMLType.F32, [4])
        late = c2.neg(other)  # c2 reads c1 from now on, but g does not
        reads_c1 = c2.new_graph(16).build_forward(late)
        c1.reset()
        galloc.alloc_graph(g)
        a.set(x)
        be.graph_compute(g)
        np.testing.assert_array_equal(g.nodes[-1].numpy(), x * x)
        with pytest.raises(ClosedError):
            galloc.alloc_graph(reads_c1)
        with pytest.raises(ClosedError):
            be.graph_compute(reads_c1)


def test_a_graph_across_contexts_is_refused_once_the_outputs_context_is_closed(run_isolated):
    """The graph lives in c2, its nodes in c1: closing c1 left the graph computable (reading
    c1's freed structs)."""
    r = run_isolated("""
        import numpy as np
        from pyggml import ClosedError, Context, CPUBackend
        c1, c2 = Context(1 << 16), Context.for_tensors(4, graph_size=8)
        x = c1.from_numpy(np.ones(4, np.float32))
        g = c2.new_graph(8).build_forward(c1.sqr(x))  # the graph's nodes live in c1
        c1.close()
        with CPUBackend() as cpu:
            try:
                cpu.graph_compute(g)
            except ClosedError:
                print("refused")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused" in r.stdout


def test_a_size_that_wraps_size_t_is_refused_not_made_empty():
    with Context(1 << 16) as ctx, Context.for_tensors(4) as meta:
        for c in (ctx, meta):
            with pytest.raises(ValueError, match="more than ggml can address"):
                c.new_tensor(GGMLType.I32, [2**62])   # 2**64 bytes: ggml_row_size gives 0
        small = ctx.new_tensor(GGMLType.F32, [4])
        with pytest.raises(ValueError, match="outside"):
            ctx.view(small, [2**62])                   # a view of 2**64 bytes over 16


def test_alloc_tensors_refuses_views_of_tensors_outside_backend_buffers(run_isolated):
    """ggml_backend_alloc_ctx_tensors initialises every view of the context in the view's
    source's buffer (ggml_backend_view_init asserts it has one): a view in a no_alloc context of
    a tensor in an allocating context's memory, or of another no_alloc context's tensor not
    allocated yet, aborted the process (scripts/fuzz.sh seed 104: GGML_ASSERT(tensor->view_src->
    buffer != NULL) in alloc_tensors). ValueError now; a view of a tensor of a closed buffer is a
    ClosedError (view_init would call through the freed buffer)."""
    r = run_isolated("""
        from pyggml import ClosedError, Context, GGMLType
        from pyggml.backends.cpu import cpu_buffer_type
        F32 = GGMLType.F32
        def attempt(ctx, what):
            try:
                ctx.alloc_tensors(cpu_buffer_type())
                print(what, "allocated")
            except ClosedError:
                print(what, "ClosedError")
            except ValueError:
                print(what, "ValueError")
        host = Context(1 << 20)
        plan = Context(1 << 20, no_alloc=True)
        plan.new_tensor(F32, [4])
        plan.permute(host.new_tensor(F32, [4, 2]), 1, 0, 2, 3)
        attempt(plan, "view of arena memory")
        other = Context(1 << 20, no_alloc=True)
        plan2 = Context(1 << 20, no_alloc=True)
        plan2.new_tensor(F32, [4])
        plan2.transpose(other.new_tensor(F32, [4, 2]))
        attempt(plan2, "view of an unallocated tensor")
        buf = other.alloc_tensors(cpu_buffer_type())
        attempt(plan2, "the same, its source allocated")
        plan3 = Context(1 << 20, no_alloc=True)
        plan3.new_tensor(F32, [4])
        plan3.transpose(next(iter(other.tensors())))
        buf.close()
        attempt(plan3, "view of a closed buffer")
        plan4 = Context(1 << 20, no_alloc=True)
        plan4.view(plan4.new_tensor(F32, [8]), [4], [], 0)
        attempt(plan4, "view of its own tensor")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:5] == [
        "view of arena memory ValueError", "view of an unallocated tensor ValueError",
        "the same, its source allocated allocated", "view of a closed buffer ClosedError",
        "view of its own tensor allocated"], r.stdout


def test_alloc_tensors_whose_sizes_wrap_size_t_is_a_memory_error():
    """Eight tensors of 2**61 bytes: ggml's size_t sum wraps to 0 and ggml_tallocr_alloc aborts
    (found by the fuzzer); pyggml sums in Python first. In a child: before the fix it aborted."""
    code = textwrap.dedent("""
        import pyggml
        with pyggml.CPUBackend(n_threads=1) as be, pyggml.Context.for_tensors(8) as ctx:
            for _ in range(8):
                ctx.new_tensor("i8", [2**61])
            try:
                ctx.alloc_tensors(be)
            except MemoryError as e:
                print("MemoryError", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MemoryError alloc_tensors: the tensors of this context need 18446744073709551616 bytes" in r.stdout


def test_alloc_tensors_checks_a_closed_backend_before_the_tensors():
    """Fuzz seed 4001: a closed backend and a tensor too large: the closed argument is what the
    call reports (ClosedError), whatever the context holds."""
    with Context.for_tensors(8) as ctx:
        be = CPUBackend(n_threads=1)
        be.close()
        ctx.new_tensor("i32", [2**20, 2**20, 2**20])
        with pytest.raises(ClosedError):
            ctx.alloc_tensors(be)
        with pytest.raises(MemoryError):
            with CPUBackend(n_threads=1) as be2:
                ctx.alloc_tensors(be2)


def test_an_op_refused_for_memory_in_an_allocating_context_leaves_no_dependency():
    """Fuzz seed 3025: an op of an allocating context on another context's tensor, refused
    because its data did not fit, left its node in the arena reading that tensor; closing the
    other context then made this one refuse every new tensor (ClosedError). The refused node is
    now an inert leaf and the dependency is dropped."""
    with Context(1 << 20) as ctx:
        other = Context(1 << 20, no_alloc=True)
        huge = other.new_tensor(GGMLType.I32, [1 << 20, 1 << 20, 1 << 20])
        with pytest.raises(MemoryError):
            ctx.norm(huge, 1e-5)
        other.close()
        t = ctx.new_tensor(GGMLType.F16, [5, 5])          # raised ClosedError
        assert tuple(t.ne) == (5, 5, 1, 1)
        assert ctx.scale(t, 2.0).op_name == "SCALE"
        for u in ctx.tensors():
            assert all(s is None or s._owner is ctx for s in u.src)


def test_an_op_refused_because_one_input_context_is_stale_records_no_dependency_on_the_others():
    with Context(1 << 16, no_alloc=True) as ctx, Context(1 << 16, no_alloc=True) as a_ctx:
        b_ctx = Context(1 << 16, no_alloc=True)
        c_ctx = Context(1 << 16, no_alloc=True)
        a = a_ctx.new_tensor(GGMLType.F32, [4])
        c = c_ctx.new_tensor(GGMLType.F32, [4])
        b = b_ctx.add(c, c)                                # b_ctx's node reads c_ctx
        c_ctx.close()                                      # b_ctx is stale now
        with pytest.raises(ClosedError):
            ctx.add(a, b)
        a_ctx.reset()                                      # ctx recorded nothing of a_ctx
        assert tuple(ctx.new_tensor(GGMLType.F32, [4]).ne) == (4, 1, 1, 1)
        b_ctx.close()


def test_raw_calls_on_ctx_ptr_leave_the_pythonic_checks_exact(run_isolated):
    # docs/raw.rst: raw calls mix in through .ptr. Nodes and tensors a raw call makes in a
    # Pythonic context use its memory too: the op constructors and new_tensor must see that
    # (MemoryError), not trust their own count and let ggml abort (ggml_new_object's assert;
    # found by benchmark work). Also when raw code switches the context to allocating.
    r = run_isolated("""
        import pytest
        from pyggml import Context, GGMLType, lib

        for make in ("new_tensor", "add", "mul_mat", "view"):
            ctx = Context.for_tensors(8)
            a = ctx.new_tensor(GGMLType.F32, [4, 4])
            c = ctx.ptr
            n_raw = 0
            while lib.ggml_get_mem_size(c) - lib.ggml_used_mem(c) >= lib.ggml_tensor_overhead():
                lib.ggml_add(c, a.ptr, a.ptr)
                n_raw += 1
            assert n_raw >= 1
            with pytest.raises(MemoryError, match="context full"):
                if make == "new_tensor":
                    ctx.new_tensor(GGMLType.F32, [4])
                elif make == "view":
                    ctx.view(a, [4])
                else:
                    getattr(ctx, make)(a, a)
            ctx.close()

        # raw code turns a no_alloc context into an allocating one: data counts from then on
        ctx = Context(64 * 1024, no_alloc=True)
        a = ctx.new_tensor(GGMLType.F32, [16])
        lib.ggml_set_no_alloc(ctx.ptr, False)
        with pytest.raises(MemoryError, match="context full"):
            ctx.new_tensor(GGMLType.F32, [1 << 20])
        for _ in range(1000):
            try:
                ctx.add(a, a)
            except MemoryError:
                break
        else:
            raise AssertionError("1000 adds of 64 bytes each fit in 64 KiB with their objects")
        print("OK")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr


def test_from_numpy_takes_either_byte_order():
    # IDX files (MNIST) and other formats store big-endian numbers: the dtype's kind decides the
    # ggml type, and the values are swapped into ggml's (the machine's) order
    with Context(1 << 16) as ctx:
        for dt, want in ((">f4", GGMLType.F32), (">i4", GGMLType.I32), (">f2", GGMLType.F16), ("<i2", GGMLType.I16)):
            a = np.arange(-2, 4).astype(dt)
            t = ctx.from_numpy(a)
            assert t.type == want
            np.testing.assert_array_equal(t.numpy(), a)
            assert t.numpy().dtype.isnative


def test_zero_element_tensors_say_what_they_lack():
    with Context(1 << 16) as ctx:       # an allocating context gives 0 bytes no memory (data NULL)
        with pytest.raises(ValueError, match="0 elements: an allocating context gives such a tensor no memory"):
            ctx.from_numpy(np.zeros((0, 3), np.float32))
        assert list(ctx.tensors()) == []                                 # refused before making it
        t = ctx.new_tensor(GGMLType.F32, [3, 0])
        with pytest.raises(ValueError, match="0 elements: an allocating context gives it no memory"):
            t.numpy()
    with Context.for_tensors(4) as ctx:
        t = ctx.from_numpy(np.zeros((0, 3), np.float32))
        with pytest.raises(ValueError, match="no data yet: allocate it"):
            t.numpy()
        with pytest.raises(ValueError, match="all have 0 elements"):   # ggml returns no buffer
            ctx.alloc_tensors(CPUBackend(n_threads=1))
        ctx.new_tensor(GGMLType.F32, [2])
        ctx.alloc_tensors(CPUBackend(n_threads=1))                     # in a buffer it has an address
        assert t.numpy().shape == (0, 3)
        t.set(np.zeros((0, 3), np.float32))
