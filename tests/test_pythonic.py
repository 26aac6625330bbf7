"""The Pythonic layer: contexts, tensors, ops, graphs, buffers, backends, devices, scheduler.

Results are checked against NumPy computing the same thing.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import threading

import numpy as np
import pytest

import pyggml
from pyggml import ClosedError, Context, CPUBackend, GGMLType, GraphAllocator, Scheduler, lib
from pyggml.device import device_by_name, device_by_type, devices, registries, registry_by_name

rng = np.random.default_rng(1)


def compute(ctx, out, backend=None):
    ctx.new_graph().build_forward(out).compute(backend, n_threads=2)
    return out.numpy()


# ------------------------------------------------------------------ ne / shape
def test_ne_is_numpy_shape_reversed():
    with Context(1 << 20) as ctx:
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        t = ctx.from_numpy(x)
        assert t.ne == (4, 3, 2, 1) and t.shape == (2, 3, 4)
        assert t.nb == (4, 16, 48, 96)
        np.testing.assert_array_equal(t.numpy(), x)
        assert ctx.new_tensor(GGMLType.F32, [5, 1, 1]).shape == (5,)  # ggml_n_dims drops trailing 1s


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64])
def test_numpy_round_trip_plain_types(dtype):
    x = (rng.standard_normal((3, 5)) * 50).astype(dtype)
    with Context(1 << 20) as ctx:
        t = ctx.from_numpy(x)
        out = t.numpy()
        assert out.dtype == dtype and out.shape == (3, 5)
        np.testing.assert_array_equal(out, x)


def test_quantized_tensor_set_and_dequantize():
    x = rng.standard_normal((4, 64)).astype(np.float32)
    with Context(1 << 20) as ctx:
        t = ctx.new_tensor(GGMLType.Q8_0, [64, 4])
        t.set(x)
        out = t.numpy()
        assert out.dtype == np.float32 and out.shape == (4, 64)
        assert np.abs(out - x).max() < 0.02  # Q8_0: 8 bits per value, one scale per 32
        with pytest.raises(ValueError):
            t.numpy(copy=False)


# ------------------------------------------------------------------ ops vs NumPy
def test_ops_match_numpy():
    a = rng.standard_normal((3, 4, 8)).astype(np.float32)
    b = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    with Context(16 << 20) as ctx:
        ta, tb, tw = ctx.from_numpy(a), ctx.from_numpy(b), ctx.from_numpy(w)
        np.testing.assert_allclose(compute(ctx, ta + tb), a + b, rtol=1e-6)          # tiled
        np.testing.assert_allclose(compute(ctx, ta * tb - tb), a * b - b, rtol=1e-6)
        np.testing.assert_allclose(compute(ctx, ctx.mul_mat(tw, ta)), a @ w.T, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compute(ctx, ctx.soft_max(ta, scale=0.5)),
                                   np.exp(a / 2) / np.exp(a / 2).sum(-1, keepdims=True), rtol=1e-5)
        mean, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
        np.testing.assert_allclose(compute(ctx, ctx.norm(ta, 1e-5)), (a - mean) / np.sqrt(var + 1e-5),
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(compute(ctx, ctx.sum_rows(ta)), a.sum(-1, keepdims=True), rtol=1e-5)
        np.testing.assert_allclose(compute(ctx, ctx.cont(ctx.permute(ta, 1, 0, 2))),
                                   a.transpose(0, 2, 1), rtol=0)
        np.testing.assert_allclose(compute(ctx, ctx.unary("relu", ta)), np.maximum(a, 0))
        np.testing.assert_allclose(compute(ctx, ctx.silu(ta)), a / (1 + np.exp(-a)), rtol=1e-5)
        idx = ctx.from_numpy(np.array([2, 0], dtype=np.int32))
        np.testing.assert_array_equal(compute(ctx, ctx.get_rows(tw, idx)), w[[2, 0]])
        np.testing.assert_array_equal(compute(ctx, ctx.concat(tb, tb, 1)), np.concatenate([b, b], 0))
        np.testing.assert_allclose(compute(ctx, ctx.reshape(tb, 32)), b.reshape(32))


def test_view_of_a_row():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with Context(1 << 20) as ctx:
        t = ctx.from_numpy(x)
        row1 = ctx.view(t, [4], offset=t.nb[1])
        np.testing.assert_array_equal(row1.numpy(), x[1])
        with pytest.raises(ValueError, match="outside"):
            ctx.view(t, [4, 3], offset=t.nb[1])


# ------------------------------------------------------------------ bad input: exceptions, not aborts
def test_ggml_asserts_become_exceptions():
    with Context(1 << 20) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4, 3])
        b = ctx.new_tensor(GGMLType.F32, [3, 4])
        with pytest.raises(ValueError, match="tile"):
            ctx.add(a, b)
        with pytest.raises(ValueError, match="mul_mat"):
            ctx.mul_mat(a, b)
        with pytest.raises(ValueError, match="reshape"):
            ctx.reshape(a, 5)
        with pytest.raises(ValueError, match="permutation"):
            ctx.permute(a, 0, 0, 1, 2)
        with pytest.raises(TypeError, match="I32"):
            ctx.get_rows(a, b)
        with pytest.raises(ValueError, match="block size"):
            ctx.new_tensor(GGMLType.Q4_0, [33])
        with pytest.raises(ValueError, match="dims"):
            ctx.new_tensor(GGMLType.F32, [1, 2, 3, 4, 5])
        with pytest.raises(ValueError):
            ctx.new_tensor(999, [4])
        with pytest.raises(TypeError):
            ctx.add(a, np.ones(3))
        with pytest.raises(ValueError, match="63"):
            a.name = "x" * 64
        with pytest.raises(ValueError, match="no data"):
            Context.for_tensors(4).new_tensor(GGMLType.F32, [4]).numpy()


def test_full_context_raises_memory_error():
    with Context(4096) as ctx:
        with pytest.raises(MemoryError, match="context full"):
            ctx.new_tensor(GGMLType.F32, [10_000])
        small = [ctx.new_tensor(GGMLType.F32, [1]) for _ in range(5)]
        with pytest.raises(MemoryError):
            for _ in range(100):
                small.append(ctx.add(small[0], small[0]))


def test_graph_too_small_raises():
    with Context(1 << 20) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4])
        for _ in range(10):
            x = x + x
        with pytest.raises(ValueError, match="too small"):
            ctx.new_graph(size=5).build_forward(x)


def test_unsupported_type_is_refused_before_compute():
    with Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.ones(4, dtype=np.int8))
        with pytest.raises(ValueError, match="cannot compute"):
            ctx.new_graph().build_forward(ctx.unary("gelu", a)).compute()


# ------------------------------------------------------------------ lifetimes
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


def test_zero_copy_view_keeps_memory_alive_and_writes_through():
    ctx = Context(1 << 20)
    t = ctx.from_numpy(np.zeros((2, 3), dtype=np.float32))
    view = t.numpy(copy=False)
    view[1, 2] = 7.0
    assert t.numpy()[1, 2] == 7.0
    out = ctx.scale(t, 2.0)
    ctx.new_graph().build_forward(out).compute()
    assert out.numpy()[1, 2] == 14.0
    del t, out
    ctx.close()  # the view still points into the arena: it is freed with the view
    gc.collect()
    assert view[1, 2] == 7.0
    del view
    gc.collect()


def test_backend_buffer_from_numpy_without_copy():
    arr = pyggml.cpu.aligned_zeros(64, np.float32)
    buf = pyggml.cpu.cpu_buffer_from_array(arr)
    assert buf.base == arr.__array_interface__["data"][0] and buf.size == arr.nbytes
    buf.clear(0)
    buf.numpy()[:4] = 1
    assert arr.view(np.uint8)[:4].tolist() == [1, 1, 1, 1]
    dev_buf = device_by_type("cpu").buffer_from_host_ptr(arr)
    assert dev_buf.size == arr.nbytes
    with pytest.raises(ValueError, match="aligned"):
        pyggml.cpu.cpu_buffer_from_array(np.zeros(65, dtype=np.uint8)[1:])


# ------------------------------------------------------------------ backends, devices, registry
def test_registry_devices_and_backend_properties():
    assert "CPU" in [r.name for r in registries()]
    cpu_dev = device_by_name("cpu")  # case-insensitive, as ggml
    assert cpu_dev in devices() and cpu_dev.type == "cpu"
    assert cpu_dev.registry == registry_by_name("CPU")
    props = cpu_dev.props
    assert props.name == "CPU" and props.memory_total > 0
    with pytest.raises(KeyError):
        device_by_name("no-such-device")
    with device_by_type("cpu").init() as be:
        assert isinstance(be, CPUBackend) and be.name == "CPU" and len(be.guid) == 16
        buft = be.default_buffer_type
        assert buft.is_host and buft.alignment >= 32
        assert buft.device is None  # ggml leaves the CPU buffer type without a device (ggml-backend.cpp)
        with buft.alloc_buffer(1024) as buf:
            assert buf.size == 1024 and buf.is_host and buf.usage == "any"
            buf.usage = "weights"
            assert buf.usage == "weights"
        with pytest.raises(ValueError):
            be.alloc_buffer(-1)
        assert be.device.registry.get_proc_address("ggml_backend_set_n_threads") is not None
        with pytest.raises(ValueError, match="events"):
            pyggml.Event(be.device)


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


def test_ctrl_c_interrupts_a_cpu_compute():
    """SIGINT during compute: the abort callback stops it and KeyboardInterrupt is raised."""
    with CPUBackend(n_threads=1) as be, Context(256 << 20) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [512, 512])
        x.set(np.ones((512, 512), dtype=np.float32) * 1e-3)
        y = x
        for _ in range(200):
            y = ctx.mul_mat(x, y)
        g = ctx.new_graph(512).build_forward(y)
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                g.compute(be)
        finally:
            timer.cancel()


# ------------------------------------------------------------------ logging
def test_ggml_log_goes_to_named_loggers(caplog, tmp_path):
    pyggml.log.install()  # idempotent; installed at import
    with caplog.at_level(logging.DEBUG, logger="pyggml.ggml"):
        missing = str(tmp_path / "missing.gguf").encode()
        assert lib.gguf_init_from_file(missing, {"no_alloc": True, "ctx": pyggml.ffi.NULL}) == pyggml.ffi.NULL
    recs = [r for r in caplog.records if "missing.gguf" in r.getMessage()]
    assert recs and recs[0].name == "pyggml.ggml.gguf" and recs[0].levelno == logging.ERROR


# ------------------------------------------------------------------ utilities
def test_graph_copy_and_compare_graph_backend():
    from pyggml.utils import compare_graph_backend, graph_copy

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
    from pyggml.utils import tensor_alloc, tensor_from_numpy, view_init

    with Context(1 << 16) as host_ctx, CPUBackend() as be:  # context memory is not a buffer
        h = host_ctx.from_numpy(np.ones(4, dtype=np.float32))
        g = host_ctx.new_graph(4).build_forward(host_ctx.sqr(h))
        with pytest.raises(ValueError, match="not in a backend buffer"):
            pyggml.utils.graph_copy(be, g)

    arr = pyggml.cpu.aligned_zeros((2, 8), np.float32)
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


def test_objects_left_open_at_interpreter_exit_are_harmless(tmp_path):
    """Finalizers at interpreter exit never crash: leave everything open and exit."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np, pyggml
        be = pyggml.CPUBackend()
        ctx = pyggml.Context.for_tensors(8, graph_size=8)
        t = ctx.from_numpy(np.ones(4, dtype=np.float32))
        buf = ctx.alloc_tensors(be)
        t.set(np.ones(4, dtype=np.float32))
        view = t.numpy(copy=False)
        sched = pyggml.Scheduler([be])
        cycle = [ctx, be, sched]; cycle.append(cycle)
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_python_function_as_a_ggml_op():
    from pyggml.ops import host_array

    x = rng.standard_normal((6, 10)).astype(np.float32)
    y = rng.standard_normal((6, 10)).astype(np.float32)
    threads = set()

    def hypot(dst, a, b, ith, nth):
        threads.add((ith, nth))
        rows = slice(ith * 6 // nth, (ith + 1) * 6 // nth)   # NumPy rows = ne[1]
        host_array(dst)[rows] = np.hypot(host_array(a)[rows], host_array(b)[rows])

    with Context(1 << 20) as ctx:
        ta, tb = ctx.from_numpy(x), ctx.from_numpy(y)
        out = ctx.map_custom(hypot, ta, tb) * 2.0
        ctx.new_graph().build_forward(out).compute(n_threads=2)
        np.testing.assert_allclose(out.numpy(), 2 * np.hypot(x, y), rtol=1e-6)
        assert threads == {(0, 2), (1, 2)}

        def broken(dst, a, ith, nth):
            raise ZeroDivisionError("inside a ggml worker")

        bad = ctx.map_custom(broken, ta)
        with pytest.raises(ZeroDivisionError, match="worker"):
            ctx.new_graph().build_forward(bad).compute(n_threads=2)
        with pytest.raises(ValueError):
            ctx.map_custom(broken)


def test_async_copies_plans_multi_buffers_and_backend_loading(tmp_path):
    import subprocess

    from pyggml.device import load_backend

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
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libggml-empty.so"), str(src)], check=True)
    with pytest.raises(pyggml.GGMLError, match="could not load"):
        load_backend(tmp_path / "libggml-empty.so")
    with pytest.raises(FileNotFoundError):
        load_backend(tmp_path / "missing.so")


def test_allocators_stay_alive_with_their_tensors_and_closing_them_invalidates_data():
    x = np.ones((2, 4), dtype=np.float32)
    with CPUBackend() as be, Context.for_tensors(8, graph_size=8) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
        y = ctx.sqr(a)
        g = ctx.new_graph(8).build_forward(y)
        GraphAllocator(be).alloc_graph(g)   # no reference kept: the context keeps it alive
        gc.collect()
        a.set(x)
        g.compute(be)
        np.testing.assert_array_equal(y.numpy(), x)
        galloc = ctx._allocators[0]
        galloc.close()
        with pytest.raises(ClosedError):
            y.numpy()
        with pytest.raises(ClosedError):
            g.compute(be)


# ------------------------------------------------------------------ backward graphs
def test_backward_graph_gradients_match_numpy():
    X = rng.standard_normal((8, 3)).astype(np.float32)
    W = rng.standard_normal((2, 3)).astype(np.float32)
    Y = rng.standard_normal((8, 2)).astype(np.float32)
    with Context(16 << 20) as ctx:
        x, y = ctx.from_numpy(X), ctx.from_numpy(Y)
        w = ctx.from_numpy(W).set_param()
        loss = ctx.sum(ctx.sqr(ctx.mul_mat(w, x) - y)).set_loss()     # ‖X Wᵀ − Y‖²
        g = ctx.new_graph(256, grads=True).build_forward(loss).build_backward(ctx)
        g.reset()
        g.compute(n_threads=2)
        np.testing.assert_allclose(loss.numpy(), [((X @ W.T - Y) ** 2).sum()], rtol=1e-5)
        np.testing.assert_allclose(g.grad(w).numpy(), 2 * (X @ W.T - Y).T @ X, rtol=1e-5, atol=1e-5)
        assert g.grad(x) is None


def test_backward_refuses_what_ggml_aborts_on():
    with Context(16 << 20) as ctx:
        a = ctx.from_numpy(np.ones((2, 4), dtype=np.float32)).set_param()
        loss = ctx.sum(ctx.unary("gelu", a)).set_loss()               # GELU has no backward
        with pytest.raises(ValueError, match="no backward pass for UNARY"):
            ctx.new_graph(256, grads=True).build_forward(loss).build_backward(ctx)
        with pytest.raises(ValueError, match="grads=True"):
            ctx.new_graph(256).build_forward(loss).build_backward(ctx)
        b = ctx.from_numpy(np.ones((2, 4), dtype=np.float32))
        no_param = ctx.sum(ctx.sqr(b)).set_loss()
        with pytest.raises(ValueError, match="parameter"):
            ctx.new_graph(256, grads=True).build_forward(no_param).build_backward(ctx)
        ok = ctx.sum(ctx.sqr(a)).set_loss()
        with pytest.raises(ValueError, match="too small"):
            ctx.new_graph(8, grads=True).build_forward(ok).build_backward(ctx)
        with pytest.raises(ValueError, match="scalar"):
            a.set_loss()


def test_convolution_pooling_padding_and_flash_attention_match_numpy():
    X = rng.standard_normal((3, 10, 12)).astype(np.float32)           # C, H, W
    K = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)          # OC, IC, KH, KW
    Q = rng.standard_normal((2, 5, 8)).astype(np.float32)             # heads, queries, dim
    Kc = rng.standard_normal((2, 7, 8)).astype(np.float16)
    V = rng.standard_normal((2, 7, 8)).astype(np.float16)
    with Context(64 << 20) as ctx:
        x, k = ctx.from_numpy(X), ctx.from_numpy(K)
        conv = ctx.conv_2d(k, x, 1, 1, 1, 1)
        pool = ctx.pool_2d(x, "max", 2, 2, 2, 2)
        padded = ctx.pad(x, 1, 2)
        fa = ctx.flash_attn(ctx.from_numpy(Q), ctx.from_numpy(Kc), ctx.from_numpy(V), scale=0.3)
        g = ctx.new_graph(64)
        for t in (conv, pool, padded, fa):
            g.build_forward(t)
        g.compute(n_threads=2)
        Xp = np.pad(X, ((0, 0), (1, 1), (1, 1)))
        ref = np.einsum("chwij,ocij->ohw", np.lib.stride_tricks.sliding_window_view(Xp, (3, 3), axis=(1, 2)),
                        K.astype(np.float32))
        np.testing.assert_allclose(conv.numpy(), ref, atol=0.01)      # im2col rounds to F16
        np.testing.assert_array_equal(pool.numpy(), X.reshape(3, 5, 2, 6, 2).max(axis=(2, 4)))
        np.testing.assert_array_equal(padded.numpy(), np.pad(X, ((0, 0), (0, 2), (0, 1))))
        s = 0.3 * Q @ Kc.astype(np.float32).transpose(0, 2, 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        att = (p / p.sum(-1, keepdims=True)) @ V.astype(np.float32)    # heads, queries, dim
        np.testing.assert_allclose(fa.numpy().transpose(1, 0, 2), att, atol=2e-3)
        with pytest.raises(ValueError, match="strides"):
            ctx.conv_2d(k, x, 0, 1)
        with pytest.raises(ValueError, match="channels"):
            ctx.conv_2d(ctx.from_numpy(K[:, :2]), x)
        with pytest.raises(ValueError, match="no output"):
            ctx.pool_2d(x, "max", 20, 20, 1, 1)
        with pytest.raises(TypeError, match="F16"):
            ctx.flash_attn(ctx.from_numpy(Q), ctx.from_numpy(Kc), ctx.from_numpy(V), mask=ctx.from_numpy(Q))


def test_op_params_are_decoded_per_op():
    with Context(1 << 20) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [64, 4, 6])
        pos = ctx.new_tensor(GGMLType.I32, [6])
        r = ctx.rope(a, pos, 32, mode=lib.GGML_ROPE_TYPE_NEOX, freq_base=1e5, freq_scale=0.5)
        assert (r.params["n_dims"], r.params["mode"], r.params["freq_base"], r.params["freq_scale"]) == (32, 2, 1e5, 0.5)
        assert ctx.soft_max(a, scale=0.125, max_bias=0.0).params == {"scale": 0.125, "max_bias": 0.0}
        assert ctx.norm(a, 0.25).params == {"eps": 0.25}
        assert ctx.unary("gelu_erf", a).params == {"unary_op": "GELU_ERF"}
        assert ctx.swiglu(a).params == {"glu_op": "SWIGLU", "swapped": False}
        assert ctx.view(a, [8], offset=16).params == {"offset": 16}
        assert ctx.permute(a, 1, 0, 2).params == {"axis0": 1, "axis1": 0, "axis2": 2, "axis3": 3}
        assert ctx.concat(a, a, 2).params == {"dim": 2}
        assert "raw" in ctx.add(a, a).params


def test_every_op_of_ggml_h_is_reachable_and_tried_in_a_fork_first():
    """Ops without a checked method go through Context.op: ggml aborting in a forked trial
    (construction or CPU compute) becomes ValueError with ggml's message."""
    from pyggml.ops import _op_constructors

    assert len(_op_constructors()) > 200
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with Context(1 << 22) as ctx:
        a = ctx.from_numpy(x)
        rolled = ctx.roll(a, 3, 1, 0, 0)                       # ggml_roll via __getattr__
        filled = ctx.op("fill", a, 2.5)
        g = ctx.new_graph().build_forward(rolled).build_forward(filled)
        g.compute()
        np.testing.assert_array_equal(rolled.numpy(), np.roll(np.roll(x, 3, axis=1), 1, axis=0))
        np.testing.assert_array_equal(filled.numpy(), np.full_like(x, 2.5))
        with pytest.raises(ValueError, match=r"GGML_ASSERT\(a->type == GGML_TYPE_F32\)"):
            ctx.op("win_part", ctx.from_numpy(np.ones(3, np.int8)), 2)      # construction aborts
        counted = ctx.op("count_equal", a, a)                               # the CPU kernel aborts
        with pytest.raises(ValueError, match="would abort"):
            ctx.new_graph().build_forward(counted).compute()
        with pytest.raises(AttributeError):
            ctx.op("not_an_op", a)
