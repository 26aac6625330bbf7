"""pyggml.backend: compute checks, async copies, graph plans."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import compiler

import pyggml
from pyggml import Context, CPUBackend, GGMLType, GraphAllocator

rng = np.random.default_rng(1)


def test_unsupported_type_is_refused_before_compute():
    with Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.ones(4, dtype=np.int8))
        with pytest.raises(ValueError, match="cannot compute"):
            ctx.new_graph().build_forward(ctx.unary("gelu", a)).compute()


def test_async_copies_plans_multi_buffers_and_backend_loading(tmp_path):
    import subprocess

    from pyggml.registry import load_backend

    x = rng.standard_normal((2, 8)).astype(np.float32)
    with CPUBackend() as be, Context.for_tensors(8, graph_size=8) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [8, 2])
        b = ctx.new_tensor(GGMLType.F32, [8, 2])
        ctx.alloc_tensors(be)
        be.tensor_set_async(a, x)
        out = np.empty_like(x)
        be.tensor_get_async(a, out)
        be.synchronize()
        np.testing.assert_array_equal(out, x)
        with pytest.raises(ValueError, match="outside"):
            be.tensor_set_async(a, x, offset=4)
        CPUBackend.tensor_copy(a, b)
        np.testing.assert_array_equal(b.numpy(), x)

        y = ctx.sqr(a)
        g = ctx.new_graph(8).build_forward(y)
        GraphAllocator(be).alloc_graph(g)
        with be.graph_plan(g) as plan:   # the CPU backend implements graph plans
            plan.compute()
        np.testing.assert_array_equal(y.numpy(), x ** 2)

    bufs = [pyggml.cpu.cpu_buffer_type().alloc_buffer(n) for n in (64, 128)]
    with pyggml.Buffer.multi(bufs) as multi:
        assert multi.is_multi_buffer and multi.size == 192
        multi.clear(7)
        assert bufs[1].numpy()[0] == 7

    src = tmp_path / "empty.c"
    src.write_text("int not_a_backend = 1;\n")
    subprocess.run([compiler("gcc"), "-shared", "-fPIC", "-o", str(tmp_path / "libggml-empty.so"), str(src)],
                   check=True)
    with pytest.raises(pyggml.GGMLError, match="could not load"):
        load_backend(tmp_path / "libggml-empty.so")
    with pytest.raises(FileNotFoundError):
        load_backend(tmp_path / "missing.so")


def test_a_custom_op_that_raises_under_a_graph_plan_is_raised_by_the_plan():
    with Context(1 << 20) as ctx, CPUBackend(n_threads=2) as cpu:
        a = ctx.from_numpy(np.ones(64, np.float32))

        def fail(dst, src, ith, nth):
            raise KeyError("custom op")

        g = ctx.new_graph().build_forward(ctx.map_custom(fail, a))
        plan = cpu.graph_plan(g)
        with pytest.raises(KeyError, match="custom op"):
            plan.compute()
        plan.close()
