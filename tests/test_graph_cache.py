"""pyggml.backends.graph_cache: graphs built once per key, computed again with new inputs."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml.backends.graph_run import run_of
from pyggml import ClosedError, CPUBackend, GGMLType, GraphCache, Scheduler

rng = np.random.default_rng(5)


def build(g, n, m):
    x = g.input("f32", [n, m], "x")
    w = g.input("f32", [n, 3], "w")
    y = g.ctx.soft_max(g.ctx.mul_mat(w, x))      # NumPy (m, 3)
    return {"y": y, "xx": g.ctx.sqr(x)}


def reference(x, w):
    z = x @ w.T
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("use_sched", [False, True])
def test_a_graph_per_key_reused_with_new_inputs(use_sched):
    with CPUBackend(n_threads=2) as cpu:
        sched = Scheduler([cpu]) if use_sched else None
        cache = GraphCache(build, backend=None if use_sched else cpu, scheduler=sched, max_graphs=2)
        for round in range(3):
            for n, m in ((4, 2), (8, 5)):
                x = rng.standard_normal((m, n)).astype(np.float32)
                w = rng.standard_normal((3, n)).astype(np.float32)
                out = cache.compute((n, m), x=x, w=w)
                np.testing.assert_allclose(out["y"], reference(x, w), rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(out["xx"], x * x, rtol=1e-6)
        assert cache.builds == 2 and len(cache) == 2
        cache.compute((2, 2), x=np.ones((2, 2), np.float32), w=np.ones((3, 2), np.float32))
        assert cache.builds == 3 and len(cache) == 2     # the least recently used went
        cache.compute((8, 5), outputs=["xx"], x=np.ones((5, 8), np.float32), w=np.ones((3, 8), np.float32))
        assert cache.builds == 3
        cache.close()
        if sched is not None:
            sched.close()


def test_wrong_inputs_are_refused():
    with CPUBackend() as cpu, GraphCache(build, backend=cpu) as cache:
        with pytest.raises(ValueError, match="missing"):
            cache.compute((4, 2), x=np.ones((2, 4), np.float32))
        with pytest.raises(ValueError, match="unknown"):
            cache.compute((4, 2), x=np.ones((2, 4), np.float32), w=np.ones((3, 4), np.float32), z=1)
        with pytest.raises(ValueError, match="shape"):
            cache.compute((4, 2), x=np.ones((4, 2), np.float32), w=np.ones((3, 4), np.float32))
        with pytest.raises(ValueError):
            GraphCache(build)


def test_outputs_of_a_graph_the_cache_dropped_are_closed():
    with CPUBackend() as cpu, GraphCache(build, backend=cpu, max_graphs=1) as cache:
        cache.compute((4, 2), x=np.ones((2, 4), np.float32), w=np.ones((3, 4), np.float32))
        old = cache.get((4, 2)).outputs["y"]
        cache.compute((4, 3), x=np.ones((3, 4), np.float32), w=np.ones((3, 4), np.float32))
        with pytest.raises(ClosedError):
            old.numpy()


def test_compute_async_then_result():
    with CPUBackend() as cpu, GraphCache(build, backend=cpu) as cache:
        x = rng.standard_normal((2, 4)).astype(np.float32)
        w = rng.standard_normal((3, 4)).astype(np.float32)
        pending = cache.compute_async((4, 2), x=x, w=w)
        np.testing.assert_allclose(pending.result()["y"], reference(x, w), rtol=1e-5, atol=1e-6)


def test_a_pending_result_overwritten_by_a_later_compute_of_its_key_is_refused():
    """Two computes of one key share the graph's outputs: the first result, read after the
    second compute, used to be the second one's values (a thread's result handed to another)."""
    with CPUBackend() as cpu, GraphCache(build, backend=cpu, own_buffers=0) as cache:
        x1, x2 = (rng.standard_normal((2, 4)).astype(np.float32) for _ in range(2))
        w = rng.standard_normal((3, 4)).astype(np.float32)
        first = cache.compute_async((4, 2), x=x1, w=w)
        second = cache.compute_async((4, 2), x=x2, w=w)
        with pytest.raises(ClosedError, match="overwritten by a later compute"):
            first.result()
        np.testing.assert_allclose(second.result()["y"], reference(x2, w), rtol=1e-5, atol=1e-6)
        third = cache.compute_async((4, 2), x=x1, w=w)
        cache.compute((4, 3), x=np.ones((3, 4), np.float32), w=w)  # another key: the shared
        with pytest.raises(ClosedError):                           # allocator holds that graph now
            third.result()


def test_graphs_with_buffers_of_their_own_keep_their_placement():
    """With ``backend``, small graphs get an allocator each: computing another key places
    nothing again, and a pending result of the first key stays readable; once their buffers
    would pass ``own_buffers``, the next graphs share one allocator (placed at each switch)."""
    x1, x3 = (rng.standard_normal((n, 4)).astype(np.float32) for n in (2, 3))
    w = rng.standard_normal((3, 4)).astype(np.float32)
    with CPUBackend() as cpu, GraphCache(build, backend=cpu) as cache:
        first = cache.compute_async((4, 2), x=x1, w=w)
        cache.compute((4, 3), x=x3, w=w)
        np.testing.assert_allclose(first.result()["y"], reference(x1, w), rtol=1e-5, atol=1e-6)
        a, b = cache.get((4, 2)), cache.get((4, 3))
        assert a._galloc is not b._galloc and a._galloc is not cache._galloc
        assert a._galloc._graph is a.graph and b._galloc._graph is b.graph   # both stay placed
        assert cache._own_total == a._own_bytes + b._own_bytes > 0
        cache.reserve((4, 2))   # its own allocator is reserved already: its placement stays
        np.testing.assert_allclose(cache.compute((4, 2), x=x1, w=w)["y"], reference(x1, w), rtol=1e-5, atol=1e-6)
        cache.clear()   # their allocators closed with them
        assert cache._own_total == 0 and a._galloc is None
    with CPUBackend() as cpu, GraphCache(build, backend=cpu) as cache:
        cache.compute((4, 2), x=x1, w=w)
        size = cache.get((4, 2))._own_bytes
        cache.own_buffers = size   # room for that one only: the next shares
        np.testing.assert_allclose(cache.compute((4, 3), x=x3, w=w)["y"], reference(x3, w), rtol=1e-5, atol=1e-6)
        assert cache.get((4, 3))._galloc is cache._galloc and cache._own_total == size
        np.testing.assert_allclose(cache.compute((4, 2), x=x1, w=w)["y"], reference(x1, w), rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="own_buffers"):
            GraphCache(build, backend=cpu, own_buffers=-1)


@pytest.mark.parametrize("use_sched", [False, True])
def test_a_closed_cache_refuses_to_compute(use_sched):
    """A GraphCache over a scheduler, closed, still built and computed a new graph on the next
    compute (scripts/fuzz.sh seed 203: 'GraphCache.compute: ClosedError was due, but it
    returned {...}'); over a backend its closed allocator raised. Both raise ClosedError."""
    x, w = np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)
    with CPUBackend() as cpu:
        sched = Scheduler([cpu]) if use_sched else None
        cache = GraphCache(build, backend=None if use_sched else cpu, scheduler=sched)
        cache.compute((4, 2), x=x, w=w)
        cache.close()
        for call in (lambda: cache.compute((4, 2), x=x, w=w), lambda: cache.compute_async((4, 2), x=x, w=w),
                     lambda: cache.get((4, 2))):
            with pytest.raises(ClosedError, match="closed"):
                call()
        if sched is not None:
            sched.close()


@pytest.mark.parametrize("use_sched", [False, True])
def test_keys_with_zero_rows(run_isolated, use_sched):
    """A key with zero rows makes a graph whose tensors all have zero bytes: placing it aborted
    in ggml-alloc (GGML_ASSERT(tensor->buffer == NULL), ggml-backend.cpp: its empty buffer's
    base is NULL), first or after other keys. It computes to empty outputs now, and the other
    keys still compute right (NumPy reference)."""
    r = run_isolated(f"""
        import numpy as np
        from pyggml import CPUBackend, GraphCache, Scheduler

        def build(g, m):
            x = g.input("f32", [3, m], "x")
            return {{"y": g.ctx.add(g.ctx.sqr(x), x), "s": g.ctx.sum_rows(x)}}

        cpu = CPUBackend(1)
        cache = GraphCache(build, backend=None if {use_sched} else cpu,
                           scheduler=Scheduler([cpu]) if {use_sched} else None)
        for m in (0, 2, 0, 5, 0):
            x = np.arange(3 * m, dtype=np.float32).reshape(m, 3) - 2
            out = cache.compute(m, x=x)
            print(m, out["y"].shape, np.array_equal(out["y"], x * x + x),
                  np.array_equal(out["s"], x.sum(-1, keepdims=True)))
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:5] == [
        "0 (0, 3) True True", "2 (2, 3) True True", "0 (0, 3) True True", "5 (5, 3) True True",
        "0 (0, 3) True True"], r.stdout


def test_backends_share_one_scheduler_reserved_for_the_largest_graph():
    """``backends``: one scheduler of the cache's own places every graph (one compute buffer),
    sized ahead by ``reserve``; alternating keys places the graph again and stays right; the
    scheduler is closed with the cache."""
    def build(g, n):
        x = g.input(GGMLType.F32, [n], "x")
        return {"y": g.ctx.sqr(x) + x}

    with CPUBackend(n_threads=1) as cpu:
        with GraphCache(build, backends=[cpu]) as cache:
            cache.reserve(64)
            size = cache.scheduler.buffer_size(cpu)
            assert size >= 64 * 4
            for _ in range(3):
                for n in (3, 5, 64):
                    x = np.arange(n, dtype=np.float32)
                    np.testing.assert_array_equal(cache.compute(n, x=x)["y"], x * x + x)
            assert cache.scheduler.buffer_size(cpu) == size       # nothing grew
            assert cache.latest.key == 64 and run_of(cache.latest.graph).split_by is cache.scheduler
            assert cache.keys == [3, 5, 64]
            sched = cache.scheduler
        assert sched.closed
    with pytest.raises(ValueError, match="one of them"):
        GraphCache(build, backend=cpu, backends=[cpu])


def test_model_graphs_on_the_cpu_alone_and_over_several_backends():
    """pyggml.runtime.model_graphs: over the CPU alone, graph allocators of the cache's own (no
    scheduler); over a device and the CPU, one scheduler of the cache's own; the same values
    either way; no backends is refused."""
    from pyggml.runtime import BackendSet, model_graphs

    def build(g, n):
        x = g.input(GGMLType.F32, [n], "x")
        return {"y": g.ctx.sqr(x) + x}

    x = np.arange(5, dtype=np.float32)
    with BackendSet(["cpu"], n_threads=1) as alone, model_graphs(build, alone.backends) as cache:
        assert cache.scheduler is None and cache.backend is alone.cpu
        np.testing.assert_array_equal(cache.compute(5, x=x)["y"], x * x + x)
    with BackendSet(["numpy"], n_threads=1) as two, model_graphs(build, two.backends) as cache:
        assert cache.backend is None and cache.scheduler.backends == two.backends
        np.testing.assert_array_equal(cache.compute(5, x=x)["y"], x * x + x)
    with pytest.raises(ValueError, match="one or more backends"):
        model_graphs(build, [])


def test_inputs_written_in_place_and_kept_between_computes():
    """An input not given keeps its value; ``arrays`` are the inputs' own memory (a write there
    is what the next compute reads); an input never given a value is refused."""
    def build(g, n):
        x = g.input(GGMLType.F32, [n], "x")
        k = g.input(GGMLType.I32, [n], "k")
        return {"y": x + g.ctx.cast(k, GGMLType.F32)}

    with CPUBackend(n_threads=1) as cpu, GraphCache(build, backend=cpu) as cache:
        with pytest.raises(ValueError, match="missing \\['k'\\]"):
            cache.compute(4, x=np.ones(4, np.float32))
        out = cache.compute(4, x=np.ones(4, np.float32), k=np.arange(4))   # int64 into I32
        np.testing.assert_array_equal(out["y"], [1, 2, 3, 4])
        np.testing.assert_array_equal(cache.compute(4, x=np.zeros(4))["y"], [0, 1, 2, 3])  # k kept
        arrays = cache.get(4).arrays
        assert arrays["k"].dtype == np.int32 and arrays["x"].shape == (4,)
        arrays["k"][:] = 10
        np.testing.assert_array_equal(cache.compute(4)["y"], [10, 10, 10, 10])
        with pytest.raises(TypeError):
            cache.compute(4, k=np.full(4, 0.5))                       # float into I32


def test_constants_are_written_once_and_freed_with_their_graph():
    """A constant holds its value at every compute (its own buffer, not the compute buffer
    that later nodes reuse); evicting or clearing the graph closes its constants and inputs."""
    def build(g, n):
        x = g.input(GGMLType.F32, [n], "x")
        c = g.constant(np.arange(n, dtype=np.float64) * 2)               # F32
        q = g.constant(np.ones((2, 32), np.float32), type="q8_0")         # quantized by ggml
        return {"y": x * c, "s": g.ctx.sum(g.ctx.mul_mat(q, g.ctx.reshape(x, 32, 2)) if n == 64 else c)}

    with CPUBackend(n_threads=1) as cpu, GraphCache(build, backend=cpu, max_graphs=1) as cache:
        for _ in range(2):
            for n in (3, 64):
                x = np.arange(n, dtype=np.float32) + 1
                out = cache.compute(n, x=x)
                np.testing.assert_array_equal(out["y"], x * np.arange(n) * 2)
        old = cache.get(64)
        const = next(iter(old._parts._const_ctx.tensors()))
        inp = old.inputs["x"]
        cache.compute(3, x=np.ones(3, np.float32))                       # evicts 64
        for t in (const, inp):
            with pytest.raises(ClosedError):
                t.numpy()
        entry = cache.get(3)
        cache.clear()
        assert len(cache) == 0
        with pytest.raises(ClosedError):
            entry.inputs["x"].numpy()
        np.testing.assert_array_equal(cache.compute(3, x=np.ones(3, np.float32))["y"], [0, 2, 4])


def test_a_build_that_returns_no_tensors_is_refused():
    with CPUBackend(n_threads=1) as cpu, GraphCache(lambda g, n: {"y": 1}, backend=cpu) as cache:
        with pytest.raises(ValueError, match="output 'y' is int"):
            cache.get(1)
        assert len(cache) == 0


def test_outputs_read_into_arrays_of_yours():
    """``compute(into={name: array})`` copies an output into the array given (Tensor.numpy's
    ``out``) and returns it shaped; an array of another dtype or size is refused."""
    with CPUBackend(n_threads=1) as cpu, GraphCache(build, backend=cpu) as cache:
        x = rng.standard_normal((2, 4)).astype(np.float32)
        w = rng.standard_normal((3, 4)).astype(np.float32)
        mine = np.empty(6, np.float32)
        out = cache.compute((4, 2), ["y"], into={"y": mine}, x=x, w=w)
        assert np.shares_memory(out["y"], mine) and out["y"].shape == (2, 3)
        np.testing.assert_allclose(mine.reshape(2, 3), reference(x, w), rtol=1e-5, atol=1e-6)
        for bad in (np.empty(6, np.float64), np.empty(5, np.float32), np.empty((3, 4), np.float32)[:, :2]):
            with pytest.raises(ValueError, match="out must be"):
                cache.compute((4, 2), ["y"], into={"y": bad})


def test_what_a_build_keeps_in_extra_is_dropped_with_its_graph():
    """``g.extra`` holds what the build function keeps with a graph (a caller's plan of how to
    feed it: here a view of its input); the cached graph gives it back as ``extra`` and empties
    it when the cache drops the graph, so the views go with the graph's memory."""
    import weakref

    class Plan:
        def __init__(self, view):
            self.view = view

    def build(g, n):
        x = g.input(GGMLType.F32, [n], "x")
        g.extra["plan"] = Plan(g.arrays["x"])
        return {"y": x * 2.0}

    with CPUBackend(n_threads=1) as cpu, GraphCache(build, backend=cpu, max_graphs=1) as cache:
        with cache.lock:   # re-entrant: the cache's own calls take it too
            entry = cache.get(4)
            plan = entry.extra["plan"]
            assert plan.view is entry.arrays["x"]   # (reading arrays says its inputs are written there)
            plan.view[:] = [1, 2, 3, 4]
            np.testing.assert_array_equal(cache.compute(4, ["y"])["y"], [2, 4, 6, 8])
        gone = weakref.ref(plan)
        del plan
        cache.compute(2, x=np.ones(2, np.float32))      # evicts the graph of 4
        assert entry.extra == {} and gone() is None
