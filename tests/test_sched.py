"""pyggml.sched: the scheduler, its eval callback and its checks."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml import ClosedError, Context, CPUBackend, GGMLType, Scheduler

rng = np.random.default_rng(1)


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


def test_a_graph_that_computes_nothing_is_refused():
    with CPUBackend() as cpu, Context.for_tensors(8, graph_size=8) as ctx:
        sched = Scheduler([cpu])
        a = ctx.new_tensor(GGMLType.F32, [4, 4]).set_input()
        leafs_only = ctx.new_graph(8).build_forward(ctx.reshape(a, 16))   # a view: no computing node
        with pytest.raises(ValueError, match="no node that computes"):
            sched.alloc_graph(leafs_only)
        sched.close()


def test_a_scheduler_computes_two_graphs_in_turn():
    x = np.arange(8, dtype=np.float32)
    with CPUBackend() as cpu, Context.for_tensors(16, graph_size=16) as ctx:
        sched = Scheduler([cpu])
        a = ctx.new_tensor(GGMLType.F32, [8]).set_input()
        g1 = ctx.new_graph(16).build_forward(y1 := ctx.sqr(a))
        g2 = ctx.new_graph(16).build_forward(y2 := ctx.scale(a, 3.0))
        for _ in range(2):
            for g, y, ref in ((g1, y1, x * x), (g2, y2, 3 * x)):
                sched.alloc_graph(g)
                a.set(x)
                sched.compute(g)
                np.testing.assert_array_equal(y.numpy(), ref)
        with pytest.raises(ClosedError):       # its memory holds the other graph's values now
            y1.numpy()
        sched.close()
