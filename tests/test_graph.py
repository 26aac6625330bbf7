"""pyggml.core.graph: graph size checks and backward graphs against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import pyggml
from pyggml import Context, GGMLType
from pyggml.backends.cpu import graph_compute

rng = np.random.default_rng(1)


def test_graph_too_small_raises():
    with Context(1 << 20) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4])
        for _ in range(10):
            x = x + x
        with pytest.raises(ValueError, match="too small"):
            ctx.new_graph(size=5).build_forward(x)


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
        graph_compute(g, n_threads=2)
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


def test_build_forward_checks_every_output_before_adding_any():
    """Fuzz seed 20011: build_forward(a, closed) added a's nodes, or raised that the graph was
    too small for a, before it saw that the second output was of a reset context (ClosedError).
    Every output is checked first; a call that raises leaves the graph as it was."""
    with pyggml.Context.for_tensors(16, graph_size=16) as ctx:
        gone = ctx.new_tensor("f32", [4])
        ctx.reset()
        x = ctx.new_tensor("f32", [4])
        y = ctx.neg(ctx.sqr(ctx.exp(x)))
        for size in (2, 16):  # too small for y's three nodes, and big enough
            g = ctx.new_graph(size)
            with pytest.raises(pyggml.ClosedError):
                g.build_forward(y, gone)
            with pytest.raises(TypeError):
                g.build_forward(y, "not a tensor")
            assert g.n_nodes == 0 and g.leafs == []
        g = ctx.new_graph(16).build_forward(y)
        assert g.n_nodes == 3 and len(g.leafs) == 1
        with pytest.raises(ValueError, match="too small"):
            ctx.new_graph(2).build_forward(y)


def test_wrappers_of_a_graphs_tensors_are_refused_once_a_context_they_come_from_was_reset():
    """A wrapper takes its context's generation when it is made: graph.leafs after a reset of
    the weights' context wrapped the weight's old struct as an open tensor of the new
    generation, and read what ggml had made there since as a tensor (a graph: KeyError on its
    "type", or a wrong tensor). Now the graph's tensors are wrapped only while every context
    they come from is as it was (ClosedError otherwise), under their locks."""
    with Context(1 << 20) as ctx, Context(1 << 20) as weights:
        w = weights.from_numpy(np.ones((4, 4), np.float32))
        x = ctx.from_numpy(np.ones(4, np.float32))
        y = ctx.mul_mat(w, x)
        y.name = "y"
        g = ctx.new_graph().build_forward(y)
        assert [t.ne for t in g.leafs] == [w.ne, x.ne] and g.nodes == [y]
        weights.reset()
        weights.new_graph()                                 # ggml objects where w's struct was
        weights.from_numpy(np.arange(7, dtype=np.float32))
        for read in (lambda: g.leafs, lambda: g.nodes, lambda: g.get_tensor("y")):
            with pytest.raises(pyggml.ClosedError, match="closed or reset since"):
                read()
