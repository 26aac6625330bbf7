"""pyggml.core.tensor: ne/shape, NumPy round trips, zero-copy views, op parameters."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from pyggml import ClosedError, Context, GGMLType, lib
from pyggml.backends.cpu import graph_compute

rng = np.random.default_rng(1)


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


def test_zero_copy_view_keeps_memory_alive_and_writes_through():
    ctx = Context(1 << 20)
    t = ctx.from_numpy(np.zeros((2, 3), dtype=np.float32))
    view = t.numpy(copy=False)
    view[1, 2] = 7.0
    assert t.numpy()[1, 2] == 7.0
    out = ctx.scale(t, 2.0)
    graph_compute(ctx.new_graph().build_forward(out))
    assert out.numpy()[1, 2] == 14.0
    del t, out
    ctx.close()  # the view still points into the arena: it is freed with the view
    gc.collect()
    assert view[1, 2] == 7.0
    del view
    gc.collect()


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


def test_set_input_on_a_node_raises_instead_of_aborting(run_isolated):
    """ggml 0.25 asserts that an input is a leaf: ``ctx.neg(a).set_input()`` aborted the
    interpreter (found by tests/fuzz_state_worker.py). Run in a child, so a regression is a
    failure, not a dead pytest."""
    r = run_isolated("""
        import pytest
        from pyggml import Context, GGMLType
        from pyggml.enums import TensorFlag
        with Context.for_tensors(4) as ctx:
            a = ctx.new_tensor(GGMLType.F32, [4])
            with pytest.raises(ValueError, match="leaf"):
                ctx.neg(a).set_input()
            a.set_input()
            assert TensorFlag.INPUT in a.flags
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, f"exit {r.returncode}\n{r.stderr[-2000:]}"


def test_messages_name_unnamed_tensors_by_op_and_shape():
    import pyggml

    with Context.for_tensors(8, graph_size=16) as c, pyggml.CPUBackend(1) as cpu, \
            Context.for_tensors(2) as weights:
        a = c.new_tensor("f32", [4])
        assert repr(a) == "<Tensor f32 ne=[4, 1, 1, 1] op=NONE>"
        b = c.add(a, a)
        g = c.new_graph(16).build_forward(b)
        with pytest.raises(ValueError, match=r"^node 'node_0' \(ADD ne=\[4, 1, 1, 1\]\) has no data: allocate"):
            cpu.graph_compute(g)
        # the node has data, one of its sources has none
        w = weights.new_tensor("f32", [4], name="w")
        weights.alloc_tensors(cpu)
        x = c.new_tensor("f32", [4], name="x")
        y = c.add(x, w)
        y.name = "y"
        with pyggml.GraphAllocator(cpu) as galloc:
            g2 = c.new_graph(16).build_forward(y)
            galloc.alloc_graph(g2)
            x.ptr.data = pyggml.ffi.NULL  # as if never placed
            x.ptr.buffer = pyggml.ffi.NULL
            with pytest.raises(ValueError, match=r"^tensor 'x' \(a source of node 'y'\) has no data"):
                cpu.graph_compute(g2)


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_view_of_a_tensor_of_a_context_closed_since_is_closed(how):
    """A view made in context B (cpy's result views its destination) of a tensor of allocating
    context A, A closed or reset: reading or writing the view went through to A's arena (the
    tensor gone: scripts/fuzz.sh seed 4 with zero-element chains, NOT_REFUSED). It raises
    ClosedError, like the tensor it views."""
    A = Context(1 << 16)
    B = Context.for_tensors(8)
    t = A.new_tensor(GGMLType.F16, [1, 2, 4, 3])
    v = B.cpy(t, t)
    assert v.numpy().shape == (3, 4, 2, 1)
    getattr(A, how)()
    for fn in (v.numpy, lambda: v.set(np.zeros((3, 4, 2, 1), np.float16))):
        with pytest.raises(ClosedError, match="view of a tensor whose context"):
            fn()
    B.close()
    A.close()


def test_nodes_made_by_checked_op_constructors_have_every_slot_set():
    """Context._node builds the Tensor of a new node itself (hot path, no C reads): a slot
    added to Tensor and not set there would raise AttributeError later, far from here."""
    import pyggml
    from pyggml.core.tensor import Tensor

    with pyggml.Context.for_tensors(16) as ctx:
        a = ctx.new_tensor("f32", [4, 2])
        for t in (ctx.add(a, a), ctx.reshape(a, 8), ctx.mul_mat(a, a)):
            for slot in Tensor.__slots__:
                getattr(t, slot)


def test_sources_in_a_context_reset_since_are_refused():
    """Tensor.src wrapped a source struct with its context's generation *now*: after a reset of
    that context it handed out an "open" tensor over whatever ggml had made there since. Now
    ClosedError (the node's context is stale: one it reads was reset)."""
    with Context(1 << 20) as ctx, Context(1 << 20) as weights:
        w = weights.from_numpy(np.ones((4, 4), np.float32))
        x = ctx.from_numpy(np.ones(4, np.float32))
        y = ctx.mul_mat(w, x)
        v = ctx.view(w, [4], [])
        assert [s.ne for s in y.src] == [w.ne, x.ne] and v.view_src == w
        weights.reset()
        weights.new_graph()
        weights.from_numpy(np.arange(7, dtype=np.float32))
        for read in (lambda: y.src, lambda: v.view_src):
            with pytest.raises(ClosedError, match="reset or closed since"):
                read()
