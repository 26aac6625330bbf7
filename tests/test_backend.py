"""pyggml.backends.backend: compute checks, async copies, graph plans."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import compiler

import pyggml
from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
from pyggml.backends.cpu import graph_compute

rng = np.random.default_rng(1)


def test_unsupported_type_is_refused_before_compute():
    with Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.ones(4, dtype=np.int8))
        with pytest.raises(ValueError, match="cannot compute"):
            graph_compute(ctx.new_graph().build_forward(ctx.unary("gelu", a)))


def test_async_copies_plans_multi_buffers_and_backend_loading(tmp_path):
    import subprocess

    from pyggml.backends.registry import load_backend

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

    bufs = [pyggml.backends.cpu.cpu_buffer_type().alloc_buffer(n) for n in (64, 128)]
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


def test_a_view_made_before_its_source_had_data_is_refused_until_placed(run_isolated):
    """Fuzz seed 7017: a view (in an allocating context) of a tensor of a no_alloc context made
    before that tensor had data keeps data NULL; alloc_tensors then gave the source a buffer,
    and computing the graph directly read the view's NULL data (a crash in the SUB kernel): the
    memory check let a view without data pass when its source had data. Now it is refused
    (nothing inits the view but an allocator); a GraphAllocator places it and it computes."""
    r = run_isolated("""
        import numpy as np
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
        be = CPUBackend(n_threads=1)
        actx, nctx = Context(1 << 20), Context(1 << 20, no_alloc=True)
        src = nctx.new_tensor(GGMLType.F32, [4, 8])
        v = actx.view(src, [3, 3], [src.nb[1]])
        y = actx.add(v, v)
        g = actx.new_graph(16).build_forward(y)
        nctx.alloc_tensors(be)
        src.set(np.arange(32, dtype=np.float32).reshape(8, 4))
        try:
            g.compute(be)
            print("computed")
        except ValueError as e:
            print("ValueError", "has no data" in str(e))
        GraphAllocator(be).alloc_graph(g)
        g.compute(be)
        print(y.numpy().tolist())
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    want = (2 * np.arange(32, dtype=np.float32).reshape(8, 4)[:3, :3]).tolist()
    assert r.stdout.splitlines() == ["ValueError True", str(want)], r.stdout


@pytest.mark.parametrize("by", ["backend", "scheduler"])
def test_compute_time_is_summed_in_c(by):
    """``lib.pyggml_compute_ns()``, what the benchmarks subtract from a step's wall time to get
    its Python time, grows by the time ggml spends computing (a 512^3 mul_mat on one thread:
    milliseconds, against microseconds of Python around it), and not by a refused compute."""
    from pyggml import Scheduler
    from pyggml.raw import lib
    import time

    with CPUBackend(n_threads=1) as cpu, Context.for_tensors(8, graph_size=8) as ctx:
        a, b = ctx.new_tensor("f32", [512, 512]), ctx.new_tensor("f32", [512, 512])
        idx = ctx.new_tensor("i32", [1]).set_input()
        out = ctx.get_rows(ctx.mul_mat(a, b), idx).set_output()                # ne [512, 1]
        graph = ctx.new_graph(8).build_forward(out)
        with (GraphAllocator(cpu) if by == "backend" else Scheduler([cpu])) as placer:
            placer.alloc_graph(graph)

            def compute(row: int = 3) -> None:  # inputs set again: later nodes reuse their memory
                a.set(np.ones((512, 512), np.float32))
                b.set(np.ones((512, 512), np.float32))
                idx.set(np.array([row], np.int32))
                n0, t0 = lib.pyggml_compute_ns(), time.perf_counter()
                try:
                    graph.compute(cpu) if by == "backend" else placer.compute(graph)
                finally:
                    times.append((time.perf_counter() - t0, (lib.pyggml_compute_ns() - n0) * 1e-9))

            times: list[tuple[float, float]] = []
            compute()
            compute()
            wall, inside = times[-1]
            assert 0.5 * wall < inside <= wall
            np.testing.assert_array_equal(out.numpy().reshape(-1), np.full(512, 512, np.float32))
            with pytest.raises(ValueError, match="row index 512"):
                compute(512)
            assert times[-1][1] == 0
