"""pyggml.backends.utils: graph copies, backend comparison, tensors over NumPy memory."""
from __future__ import annotations

import numpy as np
import pytest

import pyggml
from pyggml import Context, CPUBackend, GGMLType

rng = np.random.default_rng(1)


def test_graph_copy_and_compare_graph_backend():
    from pyggml.backends.utils import compare_graph_backend, graph_copy

    x = rng.standard_normal((3, 16)).astype(np.float32)
    with CPUBackend() as be1, CPUBackend() as be2, Context.for_tensors(16, graph_size=16) as ctx:
        a = ctx.from_numpy(x)
        out = ctx.unary("gelu", ctx.sqr(a))
        g = ctx.new_graph(16).build_forward(out)
        with pytest.raises(ValueError, match="no data"):
            graph_copy(be2, g)
        ctx.alloc_tensors(be1)
        a.set(x)
        with graph_copy(be2, g) as copy:
            assert [t.op_name for t in copy.graph.nodes] == ["SQR", "UNARY"]
            copy.graph.compute(be2)
            ref = copy.graph.nodes[-1].numpy()
        seen = []

        def cmp(i, t1, t2):
            seen.append(i)
            np.testing.assert_allclose(t1.numpy(), t2.numpy(), rtol=1e-6)
            return True

        assert compare_graph_backend(be1, be2, g, cmp)
        assert seen == [0, 1]
        g.compute(be1)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)

        def stop(i, t1, t2):
            raise AssertionError("stop here")

        with pytest.raises(AssertionError, match="stop here"):
            compare_graph_backend(be1, be2, g, stop)


def test_tensor_from_numpy_shares_memory_and_tensor_alloc():
    from pyggml.backends.utils import tensor_alloc, tensor_from_numpy, view_init

    with Context(1 << 16) as host_ctx, CPUBackend() as be:  # context memory is not a buffer
        h = host_ctx.from_numpy(np.ones(4, dtype=np.float32))
        g = host_ctx.new_graph(4).build_forward(host_ctx.sqr(h))
        with pytest.raises(ValueError, match="not in a backend buffer"):
            pyggml.backends.utils.graph_copy(be, g)

    arr = pyggml.backends.cpu.aligned_zeros((2, 8), np.float32)
    with Context.for_tensors(8) as ctx, CPUBackend() as be:
        t = tensor_from_numpy(ctx, arr)
        arr[1, 3] = 5.0
        assert t.numpy()[1, 3] == 5.0
        t.set(np.ones((2, 8), dtype=np.float32))
        assert arr.sum() == 16
        with pytest.raises(ValueError, match="aligned"):
            tensor_from_numpy(ctx, np.zeros(9, dtype=np.float32)[1:])
        u = ctx.new_tensor(GGMLType.F32, [4])
        buf = be.alloc_buffer(64)
        with pytest.raises(ValueError, match="do not fit"):
            tensor_alloc(buf, u, offset=60)
        tensor_alloc(buf, u, offset=32)
        assert int(pyggml.ffi.cast("uintptr_t", u.ptr.data)) == buf.base + 32
        v = ctx.view(u, [2], offset=8)
        view_init(v)
        u.set(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(v.numpy(), [2, 3])
        with pytest.raises(ValueError):
            tensor_alloc(buf, u)
