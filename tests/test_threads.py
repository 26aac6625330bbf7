"""Threads: pyggml objects shared by threads (cffi releases the GIL in every C call, so two
threads can be inside ggml at once). Calls that use an object take turns; ``close()`` and
``reset()`` wait for other threads' calls; a close from inside a call on the same thread (a
callback) is refused, and an object collected there is closed when the call ends
(:mod:`pyggml.raw.threads`). References: NumPy."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from pyggml import ClosedError, Context, CPUBackend, GraphAllocator, GraphCache, ffi, lib

rng = np.random.default_rng(11)


def _mlp_graph(ctx, n, m):
    """y = tanh(w @ x) in NumPy order: x (m, n), w (n, n)."""
    x = ctx.new_tensor("f32", [n, m]).set_input()
    w = ctx.new_tensor("f32", [n, n]).set_input()
    y = ctx.tanh(ctx.mul_mat(w, x)).set_output()
    return x, w, y, ctx.new_graph(16).build_forward(y)


class _Blocked:
    """A CPU backend whose compute stops in its abort callback until ``release`` is set (the
    callback is asked after the first node)."""

    def __init__(self, backend):
        self.started, self.release = threading.Event(), threading.Event()
        backend.abort_callback = self._cb

    def _cb(self):
        self.started.set()
        assert self.release.wait(20)
        return False


def _close_during_blocked_compute(be, graph, obj, errors):
    """Start ``be``'s compute of ``graph``, held in its abort callback, then ``obj.close()`` on
    another thread; check that the close waits. Returns (blocked, computing, closing)."""
    blocked = _Blocked(be)
    computing = _run(lambda: be.graph_compute(graph), errors)
    assert blocked.started.wait(20)
    closing = _run(obj.close, errors)
    closing.join(0.3)
    assert closing.is_alive() and not obj.closed     # waits: C is still using it
    return blocked, computing, closing


def _run(fn, errors):
    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)
    t = threading.Thread(target=target)
    t.start()
    return t


@pytest.mark.parametrize("what", ["backend", "context", "graph allocator"])
def test_close_on_another_thread_waits_for_the_compute(what):
    be = CPUBackend(n_threads=1)
    ctx = Context.for_tensors(8, graph_size=16)
    x, w, y, graph = _mlp_graph(ctx, 64, 8)
    galloc = GraphAllocator(be)
    galloc.alloc_graph(graph)
    xa, wa = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    x.set(xa)
    w.set(wa)
    obj = {"backend": be, "context": ctx, "graph allocator": galloc}[what]
    errors: list[BaseException] = []
    blocked, computing, closing = _close_during_blocked_compute(be, graph, obj, errors)
    result = {}
    reading = _run(lambda: result.setdefault("y", y.numpy()), errors)   # waits too (the context)
    blocked.release.set()
    for t in (computing, closing, reading):
        t.join(20)
    assert obj.closed
    if isinstance(errors[0] if errors else None, ClosedError):   # the read came after the close
        errors.pop(0)
    else:
        np.testing.assert_allclose(result["y"], np.tanh(xa @ wa.T), rtol=1e-4, atol=1e-5)
    assert errors == []
    with pytest.raises(ClosedError):
        be.graph_compute(graph)
    for o in (galloc, ctx, be):
        o.close()


def test_an_object_collected_inside_a_call_is_closed_when_the_call_ends():
    """A finalizer never waits: a context whose last reference goes inside a compute's callback
    (the gate held by this thread) is closed when the compute returns, and nothing waits for
    the gate afterwards."""
    import gc
    import weakref

    from pyggml.raw import threads

    with CPUBackend(n_threads=1) as be, Context.for_tensors(8, graph_size=16) as ctx, \
            GraphAllocator(be) as galloc:
        x, w, y, graph = _mlp_graph(ctx, 16, 4)
        galloc.alloc_graph(graph)
        x.set(np.ones((4, 16), np.float32))
        w.set(np.eye(16, dtype=np.float32))
        held = [Context(1 << 12)]
        ref, key = weakref.ref(held[0]), id(held[0])
        seen: list[bool] = []

        def drop() -> bool:
            if held:
                held.clear()
                gc.collect()  # (other garbage of the process may be deferred with it)
                seen.append(any(id(o) == key for o in threads._deferred))  # collected, close deferred
            return False
        be.abort_callback = drop
        be.graph_compute(graph)
        gc.collect()
        assert seen == [True] and ref() is None and threads._deferred == [] and threads._readers == []
        np.testing.assert_allclose(y.numpy(), np.tanh(np.ones((4, 16))), rtol=1e-5)


def test_a_callback_that_closes_what_its_compute_uses_is_refused():
    with CPUBackend(n_threads=1) as be, Context.for_tensors(8, graph_size=16) as ctx, \
            GraphAllocator(be) as galloc:
        x, w, y, graph = _mlp_graph(ctx, 16, 4)
        galloc.alloc_graph(graph)
        xa, wa = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
        x.set(xa)
        w.set(wa)
        be.abort_callback = lambda: ctx.close()
        with pytest.raises(RuntimeError, match="from inside a pyggml call on the same thread"):
            be.graph_compute(graph)
        assert not ctx.closed                           # nothing was changed
        be.abort_callback = None
        be.graph_compute(graph)
        np.testing.assert_allclose(y.numpy(), np.tanh(xa @ wa.T), rtol=1e-4, atol=1e-5)


_WORKER_CALLBACK = """
    import threading
    import numpy as np
    from pyggml import Context, CPUBackend, Scheduler
    be = CPUBackend(n_threads=2)
    ctx = Context(1 << 20)
    wa = np.arange(64, dtype=np.float32)
    w = ctx.from_numpy(wa)
    main, seen = threading.get_ident(), {}

    def op(dst, src, ith, nth):
        # on the CPU worker thread (ith 1) too: what the compute holds is this callback's
        seen[ith] = (threading.get_ident() != main, be.name)
        if ACTION == "read":
            dst.numpy(copy=False)[:] = src.numpy() + w.numpy()
        elif ith == 1:
            {"close": ctx.close, "reset": ctx.reset, "close backend": be.close}[ACTION]()

    y = ctx.map_custom(op, w)
    g = ctx.new_graph().build_forward(y)
    def compute():
        if PATH == "backend":
            be.graph_compute(g)
        elif PATH == "plan":
            with be.graph_plan(g) as plan:
                plan.compute()
        else:
            with Scheduler([be]) as sched:
                sched.compute(g)
    if ACTION == "read":
        compute()
        assert sorted(seen) == [0, 1] and seen[1][0] and not seen[0][0], seen
        np.testing.assert_array_equal(y.numpy(), 2 * wa)
    else:
        try:
            compute()
        except RuntimeError as e:
            assert "from inside a pyggml call on the same thread" in str(e), e
        else:
            raise AssertionError("not refused")
        assert not ctx.closed and not be.closed     # nothing was changed
        np.testing.assert_array_equal(w.numpy(), wa)
    print("ok")
"""


@pytest.mark.parametrize("path", ["backend", "plan", "scheduler"])
@pytest.mark.parametrize("action", ["read", "close", "reset", "close backend"])
def test_a_custom_op_on_a_cpu_worker_thread_uses_what_its_compute_holds(run_isolated, path, action):
    """A custom op runs on ggml's CPU worker threads while the thread that called the compute
    holds the locks of the context and backend and waits for them. A callback there that read
    a tensor of the context or the backend's name waited for those locks forever (a hang), as
    did one closing the context (a RuntimeError on the calling thread). Now the worker's
    callback counts them as its own: it reads, and a close or reset is refused as on the
    calling thread. In a child process: a regression hangs (the timeout fails the test)."""
    r = run_isolated(f"\n    ACTION, PATH = {action!r}, {path!r}" + _WORKER_CALLBACK, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_threads_computing_on_one_backend_get_their_own_results():
    """Graphs of different sizes need CPU work buffers of different sizes: ggml's CPU backend
    grows its one work buffer between computes, so two computes at once would share it."""
    be = CPUBackend(n_threads=1)
    errors: list[BaseException] = []

    def worker(n):
        with Context.for_tensors(8, graph_size=16) as ctx, GraphAllocator(be) as galloc:
            x, w, y, graph = _mlp_graph(ctx, n, 3)
            galloc.alloc_graph(graph)
            r = np.random.default_rng(n)
            for _ in range(40):
                xa = r.standard_normal((3, n)).astype(np.float32)
                wa = r.standard_normal((n, n)).astype(np.float32)
                x.set(xa)
                w.set(wa)
                be.graph_compute(graph)
                np.testing.assert_allclose(y.numpy(), np.tanh(xa @ wa.T), rtol=1e-4, atol=1e-5)

    threads = [_run(lambda n=n: worker(n), errors) for n in (8, 32, 96, 160)]
    for t in threads:
        t.join(120)
    be.close()
    assert errors == []


def test_threads_computing_one_graph_on_one_backend_leave_the_gate():
    """The locks of a graph's compute are cached with its check and shared by the threads that
    compute it: what a thread holds must not be kept there (the second thread's entry
    overwrote the first's, so the first left the gate as the second: every later close
    waited forever, or a close of another thread raised as if inside a call). The closes run
    on a daemon thread: a regression fails the test instead of hanging it."""
    from pyggml.raw import threads

    be = CPUBackend(n_threads=1)
    ctx = Context.for_tensors(8, graph_size=16)
    galloc = GraphAllocator(be)
    x, w, y, graph = _mlp_graph(ctx, 64, 4)
    galloc.alloc_graph(graph)
    x.set(np.ones((4, 64), np.float32))
    w.set(np.eye(64, dtype=np.float32))
    errors: list[BaseException] = []

    def worker():
        for _ in range(200):
            be.graph_compute(graph)

    workers = [_run(worker, errors) for _ in range(3)]
    for t in workers:
        t.join(120)
    assert errors == [] and threads._readers == []
    np.testing.assert_allclose(y.numpy(), np.tanh(np.ones((4, 64))), rtol=1e-5)

    def close_all():
        try:
            for obj in (galloc, ctx, be):
                obj.close()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)
    closing = threading.Thread(target=close_all, daemon=True)
    closing.start()
    closing.join(20)
    assert not closing.is_alive() and errors == [] and be.closed


def test_threads_sharing_a_graph_cache_get_their_own_results():
    """GraphCache.compute sets the inputs, computes and reads the outputs as one step: threads
    take turns (else one thread's inputs would be computed for another)."""
    def build(g, n, m):
        x = g.input("f32", [n, m], "x")
        w = g.input("f32", [n, n], "w")
        return {"y": g.ctx.tanh(g.ctx.mul_mat(w, x))}

    errors: list[BaseException] = []
    with CPUBackend(n_threads=1) as be, GraphCache(build, backend=be) as cache:
        def worker(seed):
            r = np.random.default_rng(seed)
            for _ in range(40):
                n = int(r.choice([16, 48]))
                xa = r.standard_normal((4, n)).astype(np.float32)
                wa = r.standard_normal((n, n)).astype(np.float32)
                out = cache.compute((n, 4), x=xa, w=wa)["y"]
                np.testing.assert_allclose(out, np.tanh(xa @ wa.T), rtol=1e-4, atol=1e-5)

        threads = [_run(lambda s=s: worker(s), errors) for s in range(4)]
        for t in threads:
            t.join(120)
    assert errors == []


def test_threads_building_nodes_in_one_context_lose_none():
    """ggml's arena is not thread-safe (two ggml_new_object at once place two tensors at the
    same address): the op constructors of one context take turns."""
    n = 20000
    with Context.for_tensors(2 * n + 8) as ctx:
        base = ctx.new_tensor("f32", [64, 64])
        errors: list[BaseException] = []

        def worker():
            for _ in range(n):
                ctx.add(base, base)

        threads = [_run(worker, errors) for _ in range(2)]
        for t in threads:
            t.join(120)
        assert errors == []
        count, p = 0, lib.ggml_get_first_tensor(ctx.ptr)
        while p != ffi.NULL:
            count += 1
            p = lib.ggml_get_next_tensor(ctx.ptr, p)
        assert count == 2 * n + 1


def test_threads_fuzzer_short_run():
    """A short run of the threads fuzzer (tests/fuzz_threads_worker.py; scripts/fuzz_threads.sh
    runs long campaigns): 4 threads sharing a backend, a context they all build in, an
    allocating context, a graph allocator and a graph cache, computing, reading, resetting and
    closing at random. In its own interpreter, so that a GGML_ASSERT or a crash is a death;
    every value read must match NumPy. Before contexts had locks it died within seconds
    (GGML_ASSERT in ggml_mul_mat, ggml_new_object, ggml_set_input; a segfault in the sweep of
    a freed buffer's tensors). Seed 1 hung on two lock orders of the one-module design before
    they were fixed (a placement took the buffer record's lock after its contexts'; the sweep
    of a freed buffer took every context's lock inside a placement): the timeout fails it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pyggml

    worker = Path(__file__).with_name("fuzz_threads_worker.py")
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent), GGML_NO_BACKTRACE="1")
    for seed in (1, 2):
        r = subprocess.run([sys.executable, "-X", "faulthandler", str(worker), str(seed), "4", "4"],
                           env=env, capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"seed {seed}: exit {r.returncode}\n{out[-4000:]}"
        calls = int(out.split("calls=")[1].split()[0])
        assert calls > 1000 and "failures=0" in out, out[-4000:]


def test_a_graph_checked_by_a_closed_backend_is_checked_again_by_a_new_one_at_its_address():
    """Graphs cache a backend's check by the backend's pointer. malloc gives a closed backend's
    address to the next one: the cached check (and the locks computing takes, the old backend's)
    was used for the new backend, so closing the new one did not wait for its compute."""
    ctx = Context.for_tensors(8, graph_size=16)
    x, w, y, graph = _mlp_graph(ctx, 32, 4)
    old = CPUBackend(n_threads=1)
    galloc = GraphAllocator(old)
    galloc.alloc_graph(graph)
    x.set(np.ones((4, 32), np.float32))
    w.set(np.ones((32, 32), np.float32))
    old.graph_compute(graph)
    address = int(ffi.cast("uintptr_t", old.ptr))
    old.close()
    new = CPUBackend(n_threads=1)
    if int(ffi.cast("uintptr_t", new.ptr)) != address:
        pytest.skip("malloc did not give the closed backend's address to the new one")
    errors: list[BaseException] = []
    blocked, computing, closing = _close_during_blocked_compute(new, graph, new, errors)
    blocked.release.set()
    for t in (computing, closing):
        t.join(20)
    assert errors == [] and new.closed
    galloc.close()
    ctx.close()


def test_a_compute_that_waited_for_a_placement_checks_its_graph_again():
    """A compute on thread A that checked its graph while thread B was placing another graph
    with the same allocator (B holds the allocator; A waits for it) must check again once it
    holds the allocator: the memory holds B's graph now, so ClosedError, not a compute that
    writes into B's tensors (or into a buffer ggml-alloc freed to make a bigger one). Found by
    the threads fuzzer at 8 threads (wrong results, a heap corruption): ``threads.changes`` was
    counted at the start of a placement only, so A's check during it looked current."""
    with Context.for_tensors(32, graph_size=16) as ctx, CPUBackend(n_threads=1) as be, \
            GraphAllocator(be) as galloc:
        x1, w1, y1, g1 = _mlp_graph(ctx, 8, 2)
        x2, w2, y2, g2 = _mlp_graph(ctx, 16, 3)
        galloc.alloc_graph(g1)
        x1.set(rng.standard_normal((2, 8)).astype(np.float32))
        w1.set(rng.standard_normal((8, 8)).astype(np.float32))
        be.graph_compute(g1)  # checked once: later computes look at the check only
        placing, release = threading.Event(), threading.Event()
        original = galloc._check_outputs_memory

        def slow_check(graph):  # inside B's placement, holding the allocator
            placing.set()
            assert release.wait(20)
            return original(graph)

        galloc._check_outputs_memory = slow_check
        b = threading.Thread(target=galloc.alloc_graph, args=(g2,))
        b.start()
        assert placing.wait(20)
        errors: list[BaseException] = []

        def compute():
            try:
                be.graph_compute(g1)
            except BaseException as e:  # noqa: BLE001 - checked below
                errors.append(e)

        a = threading.Thread(target=compute)
        a.start()
        a.join(0.5)  # A checks g1 (still placed) and waits for the allocator
        release.set()
        b.join(20)
        a.join(20)
        assert not a.is_alive() and not b.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], ClosedError), errors
        assert galloc._graph is g2


@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_reset_waits_for_op_constructors_of_contexts_that_read_its_tensors(how):
    """An op constructor whose inputs live in a context its own context already reads (the
    weights) holds only its own context's lock (Context._node's fast path): so a reset
    or close of the weights' context waits for the op constructors of every context whose nodes
    read them, directly or through another context's nodes, and leaves those contexts refusing
    new nodes. (Held here by hand: the lock an op constructor holds around its C call.)"""
    with Context.for_tensors(8) as weights, Context.for_tensors(8) as mid, Context.for_tensors(8) as top:
        w = weights.new_tensor("f32", [4, 4])
        h = mid.add(w, w)           # mid reads weights
        y = top.add(h, h)           # top reads mid, so weights through mid
        top.mul(y, h)               # the fast path: h's context is a recorded dependency
        for dependent in (mid, top):
            errors: list[BaseException] = []
            with dependent._lock:  # an op constructor of `dependent` in its C call
                closing = _run(getattr(weights, how), errors)
                closing.join(0.3)
                assert closing.is_alive() and not w.closed  # waits for it
            closing.join(20)
            assert errors == [] and w.closed
            if how == "close":
                break
            w = weights.new_tensor("f32", [4, 4])
        with pytest.raises(ClosedError):
            mid.add(h, h)               # mid's nodes point at memory that is gone
        with pytest.raises(ClosedError):
            top.add(y, y)               # and top's, through mid's
        mid.reset()
        top.reset()
        if how == "reset":
            assert top.add(mid.add(w, w), w).ne == (4, 4, 1, 1)


def test_building_a_graph_holds_the_contexts_its_nodes_read():
    """ggml_build_forward_expand (and a check or placement) walks the tensor structs of every
    context the graph's nodes read: a reset of one of them waits (before, the weights' context
    was not held when the graph's own context made the nodes, and a reset that reused the
    weights' memory meanwhile crashed ggml_visit_parents_graph: threads fuzzer, dep_graph)."""
    with Context(1 << 12) as weights, Context.for_tensors(16, graph_size=8) as ctx:
        w = weights.from_numpy(np.ones((4, 4), np.float32))
        x = ctx.new_tensor("f32", [4, 2])
        y = ctx.mul_mat(w, x)
        graph = ctx.new_graph(8)
        errors: list[BaseException] = []
        with ctx._lock:  # what build_forward holds (a reset takes every context's lock)
            resetting = _run(weights.reset, errors)
            resetting.join(0.3)
            assert resetting.is_alive() and not w.closed
        resetting.join(20)
        assert errors == [] and w.closed
        with pytest.raises(ClosedError):
            graph.build_forward(y)  # its nodes read memory that is gone


def test_an_op_reading_two_other_contexts_lets_go_of_every_lock():
    """An op constructor whose inputs come from two other contexts takes all their locks at
    once; afterwards another thread can use the three contexts (before, the op kept its own
    context's arena lock: the next thread to use it waited forever)."""
    with Context.for_tensors(4) as a_ctx, Context.for_tensors(4) as b_ctx, Context.for_tensors(8) as ctx:
        a, b = a_ctx.new_tensor("f32", [4]), b_ctx.new_tensor("f32", [4])
        ctx.add(a, b)
        errors: list[BaseException] = []
        for fn in (lambda: ctx.add(a, b), a_ctx.reset, ctx.reset):
            done = _run(fn, errors)
            done.join(20)
            assert not done.is_alive() and errors == []


def test_building_a_graph_does_not_wait_for_a_compute_that_reads_the_same_weights():
    """An op constructor and build_forward hold their own context's lock only, not those of
    the contexts their nodes read: a thread builds the next graph on shared weights while
    another computes one (a reset of the weights still waits for both)."""
    be = CPUBackend(n_threads=1)
    with Context(1 << 16) as weights, Context.for_tensors(8, graph_size=8) as c1, \
            Context.for_tensors(8, graph_size=8) as c2, GraphAllocator(be) as galloc:
        wa = rng.standard_normal((32, 32)).astype(np.float32)
        w = weights.from_numpy(wa)
        x1 = c1.new_tensor("f32", [32, 4]).set_input()
        y1 = c1.tanh(c1.mul_mat(w, x1)).set_output()
        g1 = c1.new_graph(8).build_forward(y1)
        galloc.alloc_graph(g1)
        xa = rng.standard_normal((4, 32)).astype(np.float32)
        x1.set(xa)
        blocked, errors = _Blocked(be), []
        computing = _run(lambda: be.graph_compute(g1), errors)
        assert blocked.started.wait(20)
        x2 = c2.new_tensor("f32", [32, 2])
        g2 = c2.new_graph(8).build_forward(c2.mul_mat(w, x2))  # while g1's compute holds the weights
        assert g2.n_nodes == 1 and computing.is_alive()
        blocked.release.set()
        computing.join(20)
        assert errors == []
        np.testing.assert_allclose(y1.numpy(), np.tanh(xa @ wa.T), rtol=1e-4, atol=1e-5)
    be.close()


def test_new_objects_are_wrapped_under_the_context_lock(monkeypatch):
    """new_tensor, get_tensor, tensors() and new_graph read the new struct's ne and the context's
    generation under the context's lock: after it, another thread's reset and new tensor may lie
    there, and the wrapper would pair that tensor's ne with the new generation (threads fuzzer
    seed 702: GGML_ASSERT(ggml_can_mul_mat) in an op whose checks had passed)."""
    import pyggml.core.context
    from pyggml.core.graph import Graph
    from pyggml.core.tensor import Tensor

    seen: list[bool] = []

    class Watched(Tensor):
        __slots__ = ()

        def __init__(self, ptr, ctx):
            seen.append(ctx._lock._is_owned())
            super().__init__(ptr, ctx)

    class WatchedGraph(Graph):
        def __init__(self, ptr, ctx, *args):
            seen.append(ctx._lock._is_owned())
            super().__init__(ptr, ctx, *args)

    monkeypatch.setattr(pyggml.core.context, "Tensor", Watched)
    monkeypatch.setattr(pyggml.core.context, "Graph", WatchedGraph)
    with Context.for_tensors(4, graph_size=4) as ctx:
        ctx.new_tensor("f32", [4]).name = "t"
        ctx.get_tensor("t")
        list(ctx.tensors())
        ctx.new_graph(4)
    assert seen == [True] * 4
