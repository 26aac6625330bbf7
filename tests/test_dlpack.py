"""DLPack: ggml tensors read by NumPy (and torch when installed) without a copy, and host
memory of other libraries used by ggml without a copy. The values are checked against NumPy
and the memory against the tensor's own address, so a copy would fail the tests."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pyggml
from pyggml import dlpack
from pyggml.backends.cpu import aligned_zeros


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture()
def ctx():
    with pyggml.Context(1 << 20) as c:
        yield c


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "int16", "int32", "int64"])
def test_numpy_reads_a_tensor_without_a_copy(ctx, dtype):
    src = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    t = ctx.from_numpy(src)
    a = np.from_dlpack(t)
    assert a.dtype == src.dtype and a.shape == (2, 3, 4)
    np.testing.assert_array_equal(a, src)
    assert _addr(a) == int(pyggml.ffi.cast("uintptr_t", t.ptr.data))
    a[0, 0, 0] = 7  # the same memory
    assert t.numpy()[0, 0, 0] == 7
    assert t.__dlpack_device__() == (dlpack.DLDeviceType.CPU, 0)


def test_a_view_exports_its_strides(ctx):
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ctx.from_numpy(src)
    tt = ctx.transpose(t)  # ne [3, 4], nb swapped: NumPy order (4, 3), a strided view
    a = np.from_dlpack(tt)
    np.testing.assert_array_equal(a, src.T)


def test_the_exported_memory_outlives_the_context():
    c = pyggml.Context(1 << 16)
    t = c.from_numpy(np.arange(8, dtype=np.float32))
    a = np.from_dlpack(t)
    c.close()  # the memory stays with the consumer
    gc.collect()
    np.testing.assert_array_equal(a, np.arange(8, dtype=np.float32))
    assert t.closed
    del a
    gc.collect()
    assert dlpack.n_exported() == 0


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_an_untaken_capsule_lets_go(ctx, max_version):
    t = ctx.from_numpy(np.ones(4, np.float32))
    before = dlpack.n_exported()
    cap = t.__dlpack__(max_version=max_version)
    assert dlpack.n_exported() == before + 1
    del cap
    gc.collect()
    assert dlpack.n_exported() == before


def test_what_cannot_be_exported_says_why(ctx):
    q = ctx.new_tensor("q8_0", [32, 2])
    with pytest.raises(BufferError, match="no dtype for ggml type Q8_0"):
        q.__dlpack__()
    t = ctx.from_numpy(np.ones(4, np.float32))
    with pytest.raises(BufferError, match="without copying"):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not \\(2, 0\\)"):
        t.__dlpack__(dl_device=(2, 0))
    with pyggml.Context.for_tensors(2) as meta:
        empty = meta.new_tensor("f32", [4])
        with pytest.raises(ValueError, match="no data"):
            empty.__dlpack__()


def test_a_node_not_computed_is_not_exported():
    with pyggml.Context.for_tensors(8, graph_size=16) as c, pyggml.CPUBackend(n_threads=1) as cpu, \
            pyggml.GraphAllocator(cpu) as galloc:
        x = c.new_tensor("f32", [4]).set_input()
        y = c.add(x, x)
        g = c.new_graph(16).build_forward(y)
        galloc.alloc_graph(g)
        with pytest.raises(ValueError, match="not computed|graph allocator or scheduler reuses"):
            np.from_dlpack(y)


def test_from_dlpack_places_a_tensor_on_the_producers_memory():
    src = aligned_zeros((3, 5), np.float32)
    src[:] = np.arange(15).reshape(3, 5)
    with pyggml.Context.for_tensors(4) as c:
        t = pyggml.from_dlpack(src, c, name="x")
        assert t.ne == (5, 3, 1, 1) and t.name == "x"
        assert int(pyggml.ffi.cast("uintptr_t", t.ptr.data)) == _addr(src)
        np.testing.assert_array_equal(t.numpy(), src)
        src[1, 2] = -1
        assert t.numpy()[1, 2] == -1


def test_a_compute_over_many_imported_arrays_takes_one_lock_for_them():
    """Each imported array is a buffer of its own (``ggml_backend_cpu_buffer_from_ptr``); they
    share their context's lock, so that a compute reading a model's hundreds of weights in
    torch's memory takes one lock for them, not one each. The graph computes what NumPy does."""
    from pyggml.backends.graph_run import run_of
    srcs = [aligned_zeros((4,), np.float32) for _ in range(12)]
    for i, a in enumerate(srcs):
        a[:] = i
    with pyggml.Context.for_tensors(len(srcs)) as c, pyggml.CPUBackend() as cpu, \
            pyggml.Context.for_tensors(64, graph_size=64) as g:
        ts = [pyggml.from_dlpack(a, c) for a in srcs]
        out = ts[0]
        for t in ts[1:]:
            out = g.add(out, t)
        graph = g.new_graph(64).build_forward(out)
        with pyggml.GraphAllocator(cpu) as galloc:
            galloc.alloc_graph(graph)
            cpu.graph_compute(graph)
            np.testing.assert_array_equal(out.numpy(), sum(srcs))
            locks = next(iter(run_of(graph).checks.values())).lock.locks
        assert len(locks) < len(ts)   # the graph's, its contexts', the backend's, the placer's


def test_from_dlpack_refuses_memory_ggml_cannot_use():
    with pyggml.Context.for_tensors(4) as c:
        misaligned = aligned_zeros((9,), np.float32)[1:]
        with pytest.raises(ValueError, match="aligned"):
            pyggml.from_dlpack(misaligned, c)
        with pytest.raises(BufferError, match="cannot import"):
            pyggml.from_dlpack(object(), c)


def test_torch_shares_memory_both_ways():
    torch = pytest.importorskip("torch")
    with pyggml.Context(1 << 16) as c:
        t = c.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        tt = torch.from_dlpack(t)
        assert tt.shape == (2, 3) and tt.dtype == torch.float32
        tt[1, 1] = 42
        assert t.numpy()[1, 1] == 42
    with pyggml.Context.for_tensors(2) as c:
        src = torch.arange(16, dtype=torch.float32)
        g = pyggml.from_dlpack(src, c)
        src[3] = -3
        assert g.numpy()[3] == -3
