"""pyggml.memory.buffer: buffers over NumPy memory."""
from __future__ import annotations

import numpy as np
import pytest

import pyggml
from pyggml import Context, CPUBackend, GraphAllocator, Scheduler
from pyggml.backends.device import device_by_type


def test_backend_buffer_from_numpy_without_copy():
    arr = pyggml.backends.cpu.aligned_zeros(64, np.float32)
    buf = pyggml.backends.cpu.cpu_buffer_from_array(arr)
    assert buf.base == arr.__array_interface__["data"][0] and buf.size == arr.nbytes
    buf.clear(0)
    buf.numpy()[:4] = 1
    assert arr.view(np.uint8)[:4].tolist() == [1, 1, 1, 1]
    dev_buf = device_by_type("cpu").buffer_from_host_ptr(arr)
    assert dev_buf.size == arr.nbytes
    with pytest.raises(ValueError, match="aligned"):
        pyggml.backends.cpu.cpu_buffer_from_array(np.zeros(65, dtype=np.uint8)[1:])


# --- row indices in data (buffer.IndexCheck): checked before every compute

_RECOMPUTE = """
import numpy as np
from pyggml import Context, CPUBackend, GGMLType, Scheduler
cpu = CPUBackend(n_threads=1)
wctx = Context.for_tensors(1)
w = wctx.new_tensor(GGMLType.F32, [64, 8])
wctx.alloc_tensors(cpu)
w.set(np.arange(512, dtype=np.float32).reshape(8, 64))
ctx = Context.for_tensors(64, graph_size=64)
idx = ctx.new_tensor(GGMLType.I32, [4]).set_input()
x = ctx.get_rows(w, idx)
for _ in range(6):
    x = ctx.scale(ctx.add(x, x), 0.5)   # nodes the allocator may place in idx's memory
y = ctx.sum(x).set_output()
g = ctx.new_graph(64).build_forward(y)
s = Scheduler([cpu])
s.alloc_graph(g)
idx.set(np.array([0, 1, 2, 3], np.int32))
s.compute(g)
print("FIRST", float(y.numpy()[0]), flush=True)
reused = not np.array_equal(idx.numpy(), [0, 1, 2, 3])
print("REUSED", reused, flush=True)
try:
    s.compute(g)                         # the inputs were not set again
    print("SECOND", float(y.numpy()[0]), flush=True)
except ValueError as e:
    print("RAISED", e, flush=True)
idx.set(np.array([7, 6, 5, 4], np.int32))
s.compute(g)
print("THIRD", float(y.numpy()[0]), flush=True)
"""


def test_a_scheduler_graph_recomputed_without_its_inputs_set_again(run_isolated):
    """ggml's allocator reuses an input's memory for later nodes, so recomputing without
    setting the inputs again read garbage row indices and get_rows aborted the interpreter."""
    r = run_isolated(_RECOMPUTE)
    assert r.returncode == 0, r.stderr[-600:]
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    rows = np.arange(512, dtype=np.float32).reshape(8, 64)
    assert float(out["FIRST"]) == pytest.approx(rows[[0, 1, 2, 3]].sum())
    assert float(out["THIRD"]) == pytest.approx(rows[[7, 6, 5, 4]].sum())
    if out["REUSED"] == "True":  # the allocator did reuse it: the garbage is refused
        assert "RAISED" in out and "outside [0, 8)" in out["RAISED"] and "set every input" in out["RAISED"]


@pytest.mark.parametrize("by", ["backend", "scheduler"])
@pytest.mark.parametrize("rows", [[0, 3], [-1], [4]])
def test_get_rows_indices_checked_before_each_compute(rows, by):
    """Checked in the compute's own call into C (pyggml_compute), before ggml runs anything:
    a refused compute leaves the output as the last one left it."""
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    with CPUBackend(n_threads=1) as cpu, Context.for_tensors(8, graph_size=8) as ctx:
        src = ctx.new_tensor("f32", [3, 4])
        idx = ctx.new_tensor("i32", [len(rows)]).set_input()
        out = ctx.get_rows(src, idx).set_output()
        graph = ctx.new_graph(8).build_forward(out)
        with (GraphAllocator(cpu) if by == "backend" else Scheduler([cpu])) as placer:
            placer.alloc_graph(graph)
            src.set(a)
            idx.set(np.array(rows, np.int32))
            compute = (lambda: graph.compute(cpu)) if by == "backend" else (lambda: placer.compute(graph))
            if all(0 <= r < 4 for r in rows):
                compute()
                np.testing.assert_array_equal(out.numpy(), a[rows])
                idx.set(np.array([0, 9], np.int32)[: len(rows)] if len(rows) == 2 else np.array([9], np.int32))
            with pytest.raises(ValueError, match=r"row index (-1|4|9) .*outside \[0, 4\)") as e:
                compute()
            assert e.value.__cause__ is None and e.value.__context__ is None
            if all(0 <= r < 4 for r in rows):
                np.testing.assert_array_equal(out.numpy(), a[rows])


def test_one_index_tensor_read_by_many_nodes_is_checked_against_each_bound():
    """A KV cache's row indices are read by every layer: the check reads them once per bound,
    so the node with the smallest table still refuses an index only it cannot take."""
    with CPUBackend(n_threads=1) as cpu, Context.for_tensors(16, graph_size=16) as ctx:
        idx = ctx.new_tensor("i32", [2]).set_input()
        big = [ctx.new_tensor("f32", [3, 8]) for _ in range(3)]
        small = ctx.new_tensor("f32", [3, 4])
        outs = [ctx.get_rows(t, idx) for t in big + [small] + big]
        graph = ctx.new_graph(16)
        for o in outs:
            graph.build_forward(o)
        with GraphAllocator(cpu) as galloc:
            galloc.alloc_graph(graph)
            for t in big + [small]:
                t.set(np.zeros(t.shape, np.float32))
            idx.set(np.array([1, 3], np.int32))
            graph.compute(cpu)
            idx.set(np.array([1, 6], np.int32))      # in range of the [3, 8] tables only
            with pytest.raises(ValueError, match=r"row index 6 .*outside \[0, 4\)"):
                graph.compute(cpu)
            idx.set(np.array([1, 8], np.int32))
            with pytest.raises(ValueError, match=r"row index 8 .*outside \[0, (4|8)\)"):
                graph.compute(cpu)


def test_indices_a_node_computes_are_not_checked_before_compute():
    """argsort's output is only known after compute (and is in range by construction): an
    index check reading it beforehand would see stale memory."""
    a = np.array([[3.0, 1.0, 2.0, 0.5]], np.float32)
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    with CPUBackend(n_threads=1) as cpu, Context.for_tensors(8, graph_size=8) as ctx:
        ta, tt = ctx.new_tensor("f32", [4, 1]), ctx.new_tensor("f32", [2, 4])
        order = ctx.argsort(ta)                      # I32 ne [4, 1]
        out = ctx.get_rows(tt, ctx.reshape(order, 4))
        graph = ctx.new_graph(8).build_forward(out)
        with GraphAllocator(cpu) as galloc:
            galloc.alloc_graph(graph)
            ta.set(a)
            tt.set(table)
            graph.compute(cpu)
            np.testing.assert_array_equal(out.numpy(), table[np.argsort(a[0], kind="stable")])


# --- a freed buffer's address given to a new buffer (fuzz seed 8002)

def _buffer_at(address, base_holds, size):
    """A new CPU buffer of ``size`` bytes whose struct is at ``address`` and whose memory holds
    ``base_holds``. malloc gives freed blocks back, but not always the first time (another
    block of that size may have been freed since): misses are kept until the end, so that
    each try takes another free block."""
    misses = []
    try:
        for _ in range(256):
            b = pyggml.backends.cpu.cpu_buffer_type().alloc_buffer(size)
            if b.ptr == address and b.base <= base_holds < b.base + b.size:
                return b
            misses.append(b)
    finally:
        for b in misses:
            b.close()
    pytest.skip("malloc did not give the freed addresses back")


def test_a_closed_buffers_tensors_no_longer_point_at_its_address():
    """What makes the two tests below hold whatever malloc does: a tensor of a closed buffer
    (or of a closed placer's memory) is pointed at a stand-in (``buffer.FREED``), so no buffer
    made later at the freed address can be taken for its buffer."""
    with Context.for_tensors(4) as ctx:
        t = ctx.new_tensor("f32", [64])
        v = ctx.view(t, [16], offset=64)
        buf = ctx.alloc_tensors(pyggml.backends.cpu.cpu_buffer_type())
        address = buf.ptr
        assert t.ptr.buffer == address
        buf.close()
        assert t.ptr.buffer == pyggml.memory.buffer.FREED[0] and v.ptr.buffer in (pyggml.memory.buffer.FREED[0], pyggml.raw.ffi.NULL)
        with pytest.raises(pyggml.ClosedError, match="freed"):
            t.numpy()
    with CPUBackend(n_threads=1) as be, Context.for_tensors(8, graph_size=8) as ctx:
        a, y, g, galloc = _squares_placed(be, ctx, 64)
        address = y.buffer_ptr
        galloc.close()
        assert a.ptr.buffer == y.ptr.buffer == pyggml.memory.buffer.FREED[1] != address


def _squares_placed(be, ctx, n):
    """Input a (F32, ne [n]), y = a², their graph, and a GraphAllocator that placed it."""
    a = ctx.new_tensor("f32", [n]).set_input()
    y = ctx.sqr(a)
    g = ctx.new_graph(8).build_forward(y)
    galloc = GraphAllocator(be)
    galloc.alloc_graph(g)
    return a, y, g, galloc


def test_a_tensor_of_a_closed_buffer_stays_closed_when_its_address_is_reused():
    """A tensor keeps pointing at its buffer's struct and data after the buffer is closed; a
    new buffer at the same addresses made it look placed there, and ``numpy`` read the new
    buffer's memory (another tensor's values) where ClosedError was due. Closing a buffer
    points the tensors in it at a stand-in for freed buffers."""
    with Context.for_tensors(4) as ctx:
        t = ctx.new_tensor("f32", [4096])
        v = ctx.view(t, [16], offset=64)
        buf = ctx.alloc_tensors(pyggml.backends.cpu.cpu_buffer_type())
        t.set(np.ones(4096, np.float32))
        address, data = buf.ptr, int(pyggml.raw.ffi.cast("uintptr_t", t.ptr.data))
        buf.close()
        new = _buffer_at(address, data, 4 * 4096)
        new.clear(7)
        for x in (t, v):
            with pytest.raises(pyggml.ClosedError, match="freed"):
                x.numpy()
            with pytest.raises(pyggml.ClosedError, match="freed"):
                x.set(np.zeros(x.shape, np.float32))
        assert (new.numpy() == 7).all()


def test_a_graph_of_a_closed_allocator_is_placed_again_when_its_address_is_reused():
    """The same for a graph allocator's memory: a new user buffer at the freed address made its
    tensors look placed in the user's buffer, where computing the graph wrote."""
    with CPUBackend(n_threads=1) as be, Context.for_tensors(8, graph_size=8) as ctx:
        a, y, g, galloc = _squares_placed(be, ctx, 4096)
        address, data, size = y.buffer_ptr, int(pyggml.raw.ffi.cast("uintptr_t", y.ptr.data)), galloc.buffer_size
        galloc.close()
        new = _buffer_at(address, data, size)
        new.clear(7)
        with pytest.raises(pyggml.ClosedError):
            y.numpy()
        with GraphAllocator(be) as galloc2:
            galloc2.alloc_graph(g)
            a.set(np.full(4096, 3, np.float32))
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), np.full(4096, 9, np.float32))
        assert (new.numpy() == 7).all()
