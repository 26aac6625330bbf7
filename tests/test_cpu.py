"""pyggml.backends.cpu: the CPU backend (Ctrl-C)."""
from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import numpy as np
import pytest

import pyggml
from pyggml import Context, CPUBackend, GGMLType
from pyggml.backends.cpu import cpu_kernel_supports
from pyggml.enums import Op


def test_ctrl_c_interrupts_a_cpu_compute(default_sigint):
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


def test_closing_a_threadpool_a_backend_uses_gives_the_backend_its_own_threads_back():
    with CPUBackend() as be, Context.for_tensors(8, graph_size=8) as ctx:
        pool = pyggml.Threadpool(2)
        be.set_threadpool(pool)
        a = ctx.new_tensor(GGMLType.F32, [64]).set_input()
        y = ctx.sqr(a)
        g = ctx.new_graph(8).build_forward(y)
        with pyggml.GraphAllocator(be) as galloc:
            galloc.alloc_graph(g)
            a.set(np.ones(64, np.float32))
            pool.close()                         # would be a use after free at the next compute
            g.compute(be)
            np.testing.assert_array_equal(y.numpy(), np.ones(64))


def test_cpu_kernel_check_of_cross_entropy_loss():
    """The CPU's further check for CROSS_ENTROPY_LOSS reads its two sources (a cffi array of
    pointers is sliced with an explicit start: ``src[:2]`` raised IndexError for every node)."""
    with CPUBackend(n_threads=1) as be, Context.for_tensors(8) as ctx:
        logits = ctx.new_tensor(GGMLType.F32, [10, 4])
        labels = ctx.new_tensor(GGMLType.F32, [10, 4])
        loss = ctx.cross_entropy_loss(logits, labels)
        assert cpu_kernel_supports(loss)
        assert be.supports_op(loss)
        half = ctx.new_tensor(GGMLType.F16, [10, 4])
        assert not cpu_kernel_supports(ctx.cross_entropy_loss(half, labels))  # the kernel is F32 only


@pytest.mark.parametrize("op", ["mean", "sum", "sum_rows", "argmax", "leaky_relu"])
def test_reductions_of_a_transposed_tensor_are_refused_not_computed_wrong(op):
    """MEAN, SUM, ARGMAX and LEAKY_RELU read source rows as unit-stride arrays (their checks are
    plain asserts, compiled out in release builds): a transposed source gave wrong values with no
    error (scripts/fuzz.sh, seed 6: mean of transpose(norm(x)) read back 0.29, NumPy 0.10).
    CPUBackend now refuses them, naming cont() as the fix; the contiguous copy computes right."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3) ** 1.5  # ggml ne [3, 4]
    make = {"mean": lambda c, t: c.mean(t), "sum": lambda c, t: c.sum(t),
            "sum_rows": lambda c, t: c.sum_rows(t), "argmax": lambda c, t: c.argmax(t),
            "leaky_relu": lambda c, t: c.leaky_relu(t, 0.1)}[op]
    ref = {"mean": lambda a: a.mean(-1, keepdims=True), "sum": lambda a: a.sum().reshape(1),
           "sum_rows": lambda a: a.sum(-1, keepdims=True), "argmax": lambda a: a.argmax(-1),
           "leaky_relu": lambda a: np.where(a > 0, a, 0.1 * a)}[op]
    with Context(1 << 20) as ctx, CPUBackend(1) as cpu:
        a = ctx.new_tensor(GGMLType.F32, [3, 4])
        a.set(x)
        t = ctx.transpose(a)  # ne [4, 3], nb[0] = 12
        out = make(ctx, t)
        assert not cpu_kernel_supports(out)
        g = ctx.new_graph().build_forward(out)
        with pytest.raises(ValueError, match="cont"):
            cpu.graph_compute(g)
        fixed = make(ctx, ctx.cont(t))
        assert cpu_kernel_supports(fixed)
        cpu.graph_compute(ctx.new_graph().build_forward(fixed))
        np.testing.assert_allclose(fixed.numpy().reshape(-1), ref(x.T.astype(np.float64)).reshape(-1), rtol=1e-5)


def test_the_abort_callback_is_asked_at_the_first_node_then_at_most_every_interval():
    """ggml asks the CPU backend's abort callback after every node; pyggml's C throttle passes
    the question to Python after the first node of each compute and then at most once per
    ``ABORT_INTERVAL_US`` (a GIL round trip per node was a few % of a small model's compute)."""
    from pyggml.backends.cpu import ABORT_INTERVAL_US
    with CPUBackend(n_threads=1) as be, Context.for_tensors(1100, graph_size=2048) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        y = x
        for _ in range(1000):
            y = ctx.add(y, x)
        g = ctx.new_graph(2048).build_forward(y)
        pyggml.GraphAllocator(be).alloc_graph(g)
        x.set(np.ones(4, np.float32))
        asked = []
        be.abort_callback = lambda: asked.append(1) and False
        t0 = time.perf_counter()
        for _ in range(3):
            g.compute(be)
        took_us = (time.perf_counter() - t0) * 1e6
        assert 3 <= len(asked) <= 3 + took_us / ABORT_INTERVAL_US + 3   # not 3,000
        np.testing.assert_array_equal(y.numpy(), np.full(4, 1001, np.float32))
        be.abort_callback = lambda: True          # asked at the first node of the next compute
        with pytest.raises(pyggml.GGMLError, match="abort"):
            g.compute(be)
        be.abort_callback = None
        g.compute(be)
        np.testing.assert_array_equal(y.numpy(), np.full(4, 1001, np.float32))


def test_a_threadpool_smaller_than_the_backends_thread_count(run_isolated):
    """Fuzz seed 6031: a CPU backend of 2 threads with a threadpool of 1 attached: ggml built
    with OpenMP starts 2 threads that each take a worker of the pool, the second past its end
    (a crash). pyggml gives ggml the pool's number of threads then (ggml without OpenMP clamps
    the same way); n_threads still says what was asked, and detaching the pool restores it."""
    r = run_isolated("""
        import numpy as np, pyggml
        from pyggml import Context, CPUBackend, GGMLType, GraphAllocator
        be = CPUBackend(n_threads=2)
        pool = pyggml.Threadpool(1)
        be.set_threadpool(pool)
        with Context.for_tensors(16, graph_size=16) as ctx:
            a = ctx.new_tensor(GGMLType.F32, [64, 64]).set_input()
            y = ctx.mul_mat(a, a)
            g = ctx.new_graph(16).build_forward(y)
            GraphAllocator(be).alloc_graph(g)
            a.set(np.ones((64, 64), np.float32))
            for n in (2, 3):
                be.n_threads = n
                g.compute(be)
            pool.close()                      # the backend gets ggml's own threads back
            g.compute(be)
            print(be.n_threads, y.numpy()[0, :2].tolist())
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "3 [64.0, 64.0]"


def _refused_then_computed(cpu: CPUBackend, op: Op, loss_of):
    """Build ``loss_of(ctx, fixed)`` -> (loss, parameter) and its backward graph twice: with
    ``fixed=False`` the ``op`` node fails the CPU kernel table and ``graph_compute`` raises
    naming it and ``cont``; with ``fixed=True`` it is computed. Returns (ctx, the parameter's
    gradient tensor); the caller closes ctx."""
    def graph(fixed: bool):
        ctx = Context(4 << 20)
        loss, param = loss_of(ctx, fixed)
        g = ctx.new_graph(256, grads=True).build_forward(loss.set_loss()).build_backward(ctx)
        g.reset()
        return ctx, g, g.grad(param)

    ctx, g, _ = graph(False)
    with ctx:
        back = [n for n in g.nodes if n.op == op]
        assert back and not cpu_kernel_supports(back[0])
        with pytest.raises(ValueError, match=f"{op.name}.*cont"):
            cpu.graph_compute(g)
    ctx, g, grad = graph(True)
    cpu.graph_compute(g)
    return ctx, grad


def test_a_pool_gradient_that_arrives_permuted_is_refused_not_computed_wrong():
    """ggml's backward of a permute is a permuted view of the gradient, and the CPU kernel of
    POOL_2D_BACK reads its gradient as packed planes: a max pool followed by a permute (the
    flatten of ggml's MNIST CNN, mnist-common.cpp) got scrambled gradients with no error --
    found when examples/train.py's CNN learned slower than PyTorch's from the same weights.
    CPUBackend refuses the node; a reshape between pool and permute (whose backward makes the
    gradient contiguous) computes the gradient NumPy gives."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)        # NumPy (B, C, H, W): ne [6, 4, 3, 2]
    R = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)        # NumPy (B, H/2, W/2, C): ne [3, 3, 2, 2]
    # NumPy: d sum(R * permute(maxpool(X))) / dX -- R's value at each window's argmax
    win = X.reshape(2, 3, 2, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 2, 3, 4)
    hot = np.eye(4, dtype=np.float32)[win.argmax(-1)] * R.transpose(0, 3, 1, 2)[..., None]
    expect = hot.reshape(2, 3, 2, 3, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(X.shape)

    def loss_of(ctx, reshape_first: bool):
        x = ctx.from_numpy(X).set_param()
        p = ctx.pool_2d(x, "max", 2, 2, 2, 2)
        if reshape_first:
            p = ctx.reshape(p, *p.ne)
        return ctx.sum(ctx.mul(ctx.cont(ctx.permute(p, 1, 2, 0, 3)), ctx.from_numpy(R))), x

    with CPUBackend(1) as cpu:
        ctx, gx = _refused_then_computed(cpu, Op.POOL_2D_BACK, loss_of)
        with ctx:
            np.testing.assert_allclose(gx.numpy(), expect, rtol=1e-6)


def _silu_grad(x):
    s = 1 / (1 + np.exp(-x))
    return s * (1 + x * (1 - s))


@pytest.mark.parametrize("where", ["input", "gradient"])
def test_a_silu_gradient_of_a_permuted_tensor_is_refused_not_computed_wrong(where):
    """The CPU kernel of SILU_BACK reads row r of the gradient and of the forward input at
    r * nb[1] as unit-stride arrays (its checks are plain asserts, compiled out). ggml's backward
    of silu(permute(x)) passes the permuted view itself ("input"), and that of permute(silu(x))
    passes a permuted view of the gradient ("gradient"): both gave wrong gradients with no error
    (or read past the tensor). CPUBackend refuses the node; with the permuted tensor made
    contiguous first (cont, or a reshape, whose backward makes the gradient contiguous) the
    gradient is NumPy's."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)         # ne [5, 4, 3, 2]
    R = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)         # permute(0, 2, 1, 3): ne [5, 3, 4, 2]
    expect = _silu_grad(X.astype(np.float64)) * R.transpose(0, 2, 1, 3)  # d sum(R * permute(silu(x))) / dx

    def loss_of(ctx, fixed: bool):
        x = ctx.from_numpy(X).set_param()
        if where == "input":
            p = ctx.permute(x, 0, 2, 1, 3)
            y = ctx.silu(ctx.cont(p) if fixed else p)
        else:
            s = ctx.silu(x)
            y = ctx.cont(ctx.permute(ctx.reshape(s, *s.ne) if fixed else s, 0, 2, 1, 3))
        return ctx.sum(ctx.mul(y, ctx.from_numpy(R))), x

    with CPUBackend(1) as cpu:
        ctx, gx = _refused_then_computed(cpu, Op.SILU_BACK, loss_of)
        with ctx:
            if where == "input":  # x's gradient is the permuted view of SILU_BACK's (permute's backward)
                gx = ctx.cont(gx)
                cpu.graph_compute(ctx.new_graph(8).build_forward(gx))
            np.testing.assert_allclose(gx.numpy(), expect, rtol=1e-5, atol=1e-6)


def test_an_im2col_gradient_that_arrives_permuted_is_refused_not_computed_wrong():
    """The CPU kernel of IM2COL_BACK reads its gradient as a packed [N, OH, OW, IC*KH*KW]
    array, with no assert; ggml's backward of a permute of im2col's output hands it a permuted
    view, which gave a wrong gradient silently. CPUBackend refuses the node; a reshape between
    im2col and permute (whose backward makes the gradient contiguous) gives NumPy's gradient."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)        # NumPy (N, IC, H, W): ne [6, 5, 2, 1]
    K = np.zeros((1, 2, 3, 3), np.float32)                          # ne [KW 3, KH 3, IC 2, OC 1]: shape only
    R = rng.standard_normal((1, 4, 3, 18)).astype(np.float32)       # permute(0, 2, 1, 3) of im2col ne [18, 4, 3, 1]
    G = R.transpose(0, 2, 1, 3)                                     # d loss / d im2col: (N, OH 3, OW 4, IC*KH*KW)
    expect = np.zeros(X.shape)
    for oh, ow, ic, kh, kw in itertools.product(range(3), range(4), range(2), range(3), range(3)):
        expect[0, ic, oh + kh, ow + kw] += G[0, oh, ow, ic * 9 + kh * 3 + kw]

    def loss_of(ctx, reshape_first: bool):
        x = ctx.from_numpy(X).set_param()
        c = ctx.im2col(ctx.from_numpy(K), x, 1, 1, 0, 0, 1, 1, True, type=GGMLType.F32)
        if reshape_first:
            c = ctx.reshape(c, *c.ne)
        return ctx.sum(ctx.mul(ctx.cont(ctx.permute(c, 0, 2, 1, 3)), ctx.from_numpy(R))), x

    with CPUBackend(1) as cpu:
        ctx, gx = _refused_then_computed(cpu, Op.IM2COL_BACK, loss_of)
        with ctx:
            np.testing.assert_allclose(gx.numpy(), expect[0], rtol=1e-5, atol=1e-6)  # numpy(): N = 1 dropped


def test_a_get_rows_gradient_with_strided_row_indices_is_refused_not_computed_wrong():
    """GET_ROWS reads its I32 row indices with their strides, but the CPU kernel of its
    backward, GET_ROWS_BACK, reads them as a packed array (no assert): get_rows with a strided
    index vector (a column of an index matrix) computed the right rows and a gradient added to
    the wrong ones, silently. CPUBackend refuses the node; contiguous indices give NumPy's."""
    rng = np.random.default_rng(6)
    A = rng.standard_normal((4, 5)).astype(np.float32)               # ne [5, 4]
    IDX = np.array([[2, 0], [0, 1], [3, 3]], np.int32)               # ne [2, 3]; its column 0: rows 2, 0, 3
    R = rng.standard_normal((3, 5)).astype(np.float32)
    expect = np.zeros_like(A)
    np.add.at(expect, IDX[:, 0], R)                                  # d sum(R * a[rows]) / da

    def loss_of(ctx, fixed: bool):
        a = ctx.from_numpy(A).set_param()
        rows = ctx.transpose(ctx.view(ctx.from_numpy(IDX), [1, 3], [8]))  # ne [3, 1], nb[0] = 8
        if fixed:
            rows = ctx.cont(rows)
        return ctx.sum(ctx.mul(ctx.get_rows(a, rows), ctx.from_numpy(R))), a

    with CPUBackend(1) as cpu:
        ctx, ga = _refused_then_computed(cpu, Op.GET_ROWS_BACK, loss_of)
        with ctx:
            np.testing.assert_allclose(ga.numpy(), expect, rtol=1e-6)


def test_a_rope_with_strided_positions_is_refused_not_computed_wrong():
    """The CPU kernel of ROPE and of its backward ROPE_BACK reads the positions (and freq
    factors) as packed arrays, with no assert: a position vector that is a strided view (a
    column of a position matrix) rotated by the wrong positions, forward and backward, silently.
    CPUBackend refuses both nodes; contiguous positions give NumPy's rotation and gradient."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((1, 3, 2, 4)).astype(np.float64)        # ne [head_dim 4, heads 2, tokens 3, 1]
    R = rng.standard_normal((1, 3, 2, 4)).astype(np.float32)
    POS = np.array([[3, 0], [1, 2], [4, 1]], np.int32)              # ne [2, 3]; its column 0: 3, 1, 4
    theta = POS[:, 0, None] * 10000.0 ** (-np.arange(0, 4, 2) / 4)   # (tokens, pairs)
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    x0, x1, r0, r1 = X[..., 0::2], X[..., 1::2], R[..., 0::2], R[..., 1::2]
    rope = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).reshape(X.shape)
    expect = np.stack([r0 * cos + r1 * sin, -r0 * sin + r1 * cos], -1).reshape(X.shape)  # d sum(R * rope(x)) / dx

    def build(fixed: bool):
        ctx = Context(4 << 20)
        x = ctx.from_numpy(X.astype(np.float32)).set_param()
        pos = ctx.transpose(ctx.view(ctx.from_numpy(POS), [1, 3], [8]))  # ne [3, 1], nb[0] = 8
        if fixed:
            pos = ctx.cont(pos)
        y = ctx.rope(x, pos, 4)
        loss = ctx.sum(ctx.mul(y, ctx.from_numpy(R))).set_loss()
        g = ctx.new_graph(256, grads=True).build_forward(loss).build_backward(ctx)
        g.reset()
        return ctx, g, y, g.grad(x)

    with CPUBackend(1) as cpu:
        ctx, g, y, _ = build(False)
        with ctx:
            nodes = [n for n in g.nodes if n.op in (Op.ROPE, Op.ROPE_BACK)]
            assert len(nodes) == 2 and not any(cpu_kernel_supports(n) for n in nodes)
            with pytest.raises(ValueError, match="ROPE.*cont"):
                cpu.graph_compute(g)
            factors = ctx.transpose(ctx.view(ctx.new_tensor(GGMLType.F32, [2, 2]), [1, 2], [8]))  # strided too
            pos = ctx.from_numpy(POS[:, 0].copy())
            assert not cpu_kernel_supports(ctx.rope(ctx.from_numpy(X.astype(np.float32)), pos, 4, freq_factors=factors))
        ctx, g, y, gx = build(True)
        with ctx:
            cpu.graph_compute(g)
            np.testing.assert_allclose(y.numpy(), rope[0], rtol=1e-5, atol=1e-6)  # numpy(): the trailing 1 dropped
            np.testing.assert_allclose(gx.numpy(), expect[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_an_optimizer_step_from_a_transposed_gradient_is_refused_not_computed_wrong(optimizer):
    """The CPU kernels of OPT_STEP_SGD / OPT_STEP_ADAMW read the gradient (and AdamW's moments)
    at the parameter's byte offsets, asserting nothing about them: ggml's gradient of a parameter
    used only through a transpose is a transposed view, and the step from it updated each
    weight with another weight's gradient, silently. CPUBackend refuses the node (opt.fit refuses
    such a model: tests/test_opt.py); from the contiguous gradient the step is NumPy's."""
    rng = np.random.default_rng(8)
    W = rng.standard_normal((3, 4)).astype(np.float32)
    G = rng.standard_normal((4, 3)).astype(np.float32)              # transposed: W's shape
    alpha, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-8, 0.0
    g = G.T.astype(np.float64)
    if optimizer == "sgd":
        hyper, expect = [alpha, wd], W - alpha * g
    else:  # first step from zero moments, bias corrections 1 / (1 - beta)
        hyper = [alpha, b1, b2, eps, wd, 1 / (1 - b1), 1 / (1 - b2)]
        m, v = (1 - b1) * g, (1 - b2) * g * g
        expect = W - alpha * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)

    def step(ctx, grad):
        w = ctx.from_numpy(W).set_param()
        h = ctx.from_numpy(np.array(hyper, np.float32))
        if optimizer == "sgd":
            return w, ctx.opt_step_sgd(w, grad, h)
        zeros = lambda: ctx.from_numpy(np.zeros_like(W))  # noqa: E731
        return w, ctx.opt_step_adamw(w, grad, zeros(), zeros(), h)

    with CPUBackend(1) as cpu:
        with Context(1 << 20) as ctx:
            _, s = step(ctx, ctx.transpose(ctx.from_numpy(G)))
            assert not cpu_kernel_supports(s)
            with pytest.raises(ValueError, match="OPT_STEP.*cont"):
                cpu.graph_compute(ctx.new_graph(8).build_forward(s))
        with Context(1 << 20) as ctx:
            w, s = step(ctx, ctx.cont(ctx.transpose(ctx.from_numpy(G))))
            cpu.graph_compute(ctx.new_graph(8).build_forward(s))
            np.testing.assert_allclose(w.numpy(), expect, rtol=1e-5, atol=1e-6)


def test_conv_transpose_2d_of_a_permuted_kernel_is_refused_not_computed_wrong():
    """The CPU kernel of CONV_TRANSPOSE_2D reads each [KH, KW] plane of its kernel as packed rows
    (src[i01 * ne00 + i00]), with no assert: a permuted kernel gave a wrong result silently.
    CPUBackend refuses the node; the contiguous kernel gives NumPy's transposed convolution."""
    rng = np.random.default_rng(9)
    K = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)        # NumPy (Cin, Cout, KH, KW): ne [3, 3, 2, 2]
    X = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)        # NumPy (N, Cin, H, W): ne [4, 4, 2, 1]
    s = 2
    expect = np.zeros((1, 2, 3 * s + 3, 3 * s + 3))
    for ic, y, x in itertools.product(range(2), range(4), range(4)):
        expect[0, :, y * s:y * s + 3, x * s:x * s + 3] += X[0, ic, y, x] * K[ic]
    with Context(1 << 20) as ctx, CPUBackend(1) as cpu:
        kernel = ctx.permute(ctx.from_numpy(K.transpose(0, 2, 1, 3).copy()), 0, 2, 1, 3)  # ne [3, 3, 2, 2], nb[1] = 24
        out = ctx.conv_transpose_2d_p0(kernel, ctx.from_numpy(X), s)
        assert not cpu_kernel_supports(out)
        with pytest.raises(ValueError, match="CONV_TRANSPOSE_2D.*cont"):
            cpu.graph_compute(ctx.new_graph(8).build_forward(out))
        fixed = ctx.conv_transpose_2d_p0(ctx.cont(kernel), ctx.from_numpy(X), s)
        cpu.graph_compute(ctx.new_graph(8).build_forward(fixed))
        np.testing.assert_allclose(fixed.numpy(), expect[0], rtol=1e-5, atol=1e-5)  # numpy(): N = 1 dropped


def test_set_n_threads_goes_through_the_registry():
    """Backend.set_n_threads calls the registry's ggml_backend_set_n_threads when it has one
    (CPU, BLAS) and says False when not (a Python backend's registry); CPUBackend keeps its own
    n_threads (and threadpool clamp) in step."""
    from pyggml.impl import numpy as numpy_backend
    from pyggml.backends.backend import Backend
    from pyggml.backends.device import device_by_name

    with CPUBackend(1) as cpu:
        assert cpu.set_n_threads(2) is True and cpu.n_threads == 2
        assert Backend.set_n_threads(cpu, 3) is True  # the generic path: the CPU registry's function
        for bad in (0, pyggml.lib.GGML_MAX_N_THREADS + 1, 1.5):
            with pytest.raises(ValueError, match="n_threads"):
                cpu.set_n_threads(bad)  # type: ignore[arg-type]
    numpy_backend.register()
    with device_by_name(numpy_backend.NAME).init() as nb:
        assert nb.set_n_threads(2) is False
