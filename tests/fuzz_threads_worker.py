"""Threads fuzzer: THREADS threads share pyggml objects (a CPU backend, the NumPy backend, a
no_alloc context that they all build graphs in, an allocating context, a graph allocator, a graph
cache) and call them at random for SECONDS: build a graph, place it (the allocator, or the
thread's own scheduler over the shared backend), set its inputs, compute, read the output; the
same with a scheduler over the NumPy backend and the CPU backend; compute through the cache (also
asynchronously, reading the result later); build on weights made in the allocating context
(which other threads reset); compute a custom op on ggml's worker threads that reads the
graph's context and tries to reset it; make tensors from NumPy and read them back; reset the
contexts; close an object and make a new one in its place (the others holding it see it closed).

pyggml promises (docs/concepts/errors.rst, "Threads"): no crash, no read of freed memory, and
every value read is the one computed from that thread's own inputs, or the call raises
ClosedError (an object it used was closed or reset, or the memory now holds another graph),
MemoryError (a full context) or ValueError (a graph placed anew but not computed since). So a
result that differs from NumPy is WRONG_RESULT; any other exception is UNEXPECTED_EXCEPTION; a
thread still running 60 s past the end is HANG (stacks printed). Run under valgrind by
``scripts/memcheck.sh`` (WORKER=threads) to see reads of freed memory that happened to hold
the right values.

    python tests/fuzz_threads_worker.py SEED [SECONDS (10)] [THREADS (4)]
    env FUZZ_ACTIONS=own_graph,renew: only those actions (to narrow a finding down)

Prints one line per failure (``FAILURE KIND thread action: detail``), then
``calls=N actions=N refused=N failures=N``; exit status 1 when something failed, 3 on a hang.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

from pyggml import ClosedError, Context, CPUBackend, GraphAllocator, GraphCache, Scheduler
from pyggml.backends.graph_cache import GraphParts
from pyggml.impl import numpy as numpy_backend
from pyggml.core.ops import host_array

_REFUSALS = (ClosedError, MemoryError, ValueError)


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = self.actions = self.refused = 0
        self.failures: list[str] = []

    def add_calls(self, n: int) -> None:
        with self.lock:
            self.calls += n

    def fail(self, kind: str, who: str, detail: str) -> None:
        with self.lock:
            self.failures.append(f"FAILURE {kind} {who}: {detail}")
            print(self.failures[-1], flush=True)


def _build(g: GraphParts, n: int, m: int) -> dict[str, Any]:
    """The cache's graphs: y = tanh(w @ x) in NumPy order, x (m, n), w (n, n)."""
    x = g.input("f32", [n, m], "x")
    w = g.input("f32", [n, n], "w")
    return {"y": g.ctx.tanh(g.ctx.mul_mat(w, x))}


class World:
    """The shared objects. ``lock`` guards only which object is current (a close-and-renew
    swaps one in); the objects themselves are used without it, as users would."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.backend = CPUBackend(n_threads=1)
        self.ctx = Context.for_tensors(96, graph_size=32)
        self.data = Context(1 << 16)
        self.galloc = GraphAllocator(self.backend)
        self.cache = GraphCache(_build, backend=self.backend, max_graphs=2)
        self.numpy = numpy_backend.init()  # a backend written in Python, shared too

    def renew(self, what: str) -> None:
        """Close ``what`` and put a new one in its place (a new backend brings a new allocator
        and cache: they hold it). The old objects are closed while other threads may use them."""
        with self.lock:
            if what == "backend":
                old = [self.backend, self.galloc, self.cache]
                self.backend = CPUBackend(n_threads=1)
                self.galloc = GraphAllocator(self.backend)
                self.cache = GraphCache(_build, backend=self.backend, max_graphs=2)
            elif what == "ctx":
                old, self.ctx = [self.ctx], Context.for_tensors(96, graph_size=32)
            elif what == "data":
                old, self.data = [self.data], Context(1 << 16)
            elif what == "numpy":
                old, self.numpy = [self.numpy], numpy_backend.init()
            elif what == "galloc":
                old, self.galloc = [self.galloc], GraphAllocator(self.backend)
            else:
                old, self.cache = [self.cache], GraphCache(_build, backend=self.backend, max_graphs=2)
        for o in reversed(old):
            o.close()

    def close(self) -> None:
        for o in (self.cache, self.galloc, self.data, self.ctx, self.backend, self.numpy):
            o.close()


_local = threading.local()


def _own_scheduler(*backends: Any) -> Scheduler:
    """This thread's scheduler over the shared backends given (a new one once one of them is
    renewed; the old one closed)."""
    key = "sched" if len(backends) == 1 else "pysched"
    sched = getattr(_local, key, None)
    if sched is None or any(a is not b for a, b in zip(sched._backends, backends)):
        if sched is not None:
            sched.close()
        sched = Scheduler(list(backends), graph_size=64)
        setattr(_local, key, sched)
    return sched


def own_graph(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    """Build y = tanh(w @ x) (+ x chain) in the shared context, place it with the shared
    allocator (or this thread's scheduler over the shared backend), set, compute, read."""
    with w.lock:
        ctx, galloc, backend = w.ctx, w.galloc, w.backend
    sched = _own_scheduler(backend) if r.random() < float(os.environ.get("FUZZ_SCHED", 0.3)) else None
    n, m = int(r.choice([8, 16, 40])), int(r.integers(1, 5))
    x = ctx.new_tensor("f32", [n, m]).set_input()
    wt = ctx.new_tensor("f32", [n, n]).set_input()
    y = ctx.tanh(ctx.mul_mat(wt, x))
    chain = r.random() < 0.5
    if chain:
        y = ctx.add(y, x)
    y.set_output()
    graph = ctx.new_graph(16).build_forward(y)
    (sched or galloc).alloc_graph(graph)
    xa = r.standard_normal((m, n)).astype(np.float32)
    wa = r.standard_normal((n, n)).astype(np.float32)
    x.set(xa)
    wt.set(wa)
    if sched is not None:
        sched.compute(graph)
    else:
        backend.graph_compute(graph)
    count.add_calls(11)
    expected = np.tanh(xa @ wa.T)
    return y.numpy(), expected + xa if chain else expected, f"{'scheduler' if sched else 'allocator'} n={n} m={m}"



def dep_graph(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    """y = tanh(wt @ x) + b built in the shared context from weights made in the shared
    allocating context, which other threads reset and renew meanwhile (the graph's context then
    refuses nodes until it is reset: done here), placed with the shared allocator, computed."""
    with w.lock:
        ctx, data, galloc, backend = w.ctx, w.data, w.galloc, w.backend
    n, m = int(r.choice([8, 16])), int(r.integers(1, 4))
    wa = r.standard_normal((n, n)).astype(np.float32)
    ba = r.standard_normal(n).astype(np.float32)
    xa = r.standard_normal((m, n)).astype(np.float32)
    wt, bt = data.from_numpy(wa), data.from_numpy(ba)
    x = ctx.new_tensor("f32", [n, m]).set_input()
    try:
        y = ctx.add(ctx.tanh(ctx.mul_mat(wt, x)), bt)
    except ClosedError as e:
        if "reset this context too" in str(e):
            try:
                ctx.reset()
            except ClosedError:
                pass
        raise
    y.set_output()
    graph = ctx.new_graph(16).build_forward(y)
    galloc.alloc_graph(graph)
    x.set(xa)
    backend.graph_compute(graph)
    count.add_calls(12)
    return y.numpy(), np.tanh(xa @ wa.T) + ba


def _own_cpu2() -> CPUBackend:
    """This thread's own CPU backend on 2 threads (ggml's worker threads run custom ops)."""
    be = getattr(_local, "cpu2", None)
    if be is None:
        be = _local.cpu2 = CPUBackend(n_threads=2)
    return be


def custom_graph(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    """y = 2 x + b by a custom op in the shared context, placed by this thread's own 2-thread
    CPU backend's scheduler: its callback, on ggml's worker thread too, reads ``b`` through the
    context's wrapper and asks the backend its name (the locks its compute holds are lent to
    it), and sometimes resets the shared context, which must be refused (RuntimeError) on every
    thread: another thread's reset meanwhile makes the read raise ClosedError."""
    with w.lock:
        ctx = w.ctx
    be = _own_cpu2()
    sched = _own_scheduler(be)
    n, m = int(r.choice([4, 16])), int(r.integers(1, 4))
    try_reset = r.random() < 0.3
    x = ctx.new_tensor("f32", [n, m]).set_input()
    b = ctx.new_tensor("f32", [n, m]).set_input()
    not_refused: list[int] = []

    def op(dst: Any, xs: Any, bs: Any, ith: int, nth: int) -> None:
        be.name
        if ith == 0:
            host_array(dst)[...] = 2 * host_array(xs) + b.numpy()
        if try_reset:
            try:
                ctx.reset()
            except RuntimeError:
                return
            not_refused.append(ith)

    y = ctx.map_custom(op, x, b).set_output()
    graph = ctx.new_graph(8).build_forward(y)
    sched.alloc_graph(graph)
    xa = r.standard_normal((m, n)).astype(np.float32)
    ba = r.standard_normal((m, n)).astype(np.float32)
    x.set(xa)
    b.set(ba)
    sched.compute(graph)
    if not_refused:
        count.fail("NOT_REFUSED", "custom_graph", f"ctx.reset() from the custom op on ith {not_refused}")
    count.add_calls(10)
    return y.numpy(), 2 * xa + ba


def cache_compute(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    with w.lock:
        cache = w.cache
    n, m = int(r.choice([8, 24])), int(r.integers(1, 4))
    xa = r.standard_normal((m, n)).astype(np.float32)
    wa = r.standard_normal((n, n)).astype(np.float32)
    count.add_calls(1)
    return cache.compute((n, m), x=xa, w=wa)["y"], np.tanh(xa @ wa.T)


def numpy_graph(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    """y = (x * x + x) summed by rows, scheduled on the shared NumPy backend (a backend written
    in Python: its callbacks run under the scheduler's compute) before the shared CPU backend."""
    with w.lock:
        ctx, backend, nb = w.ctx, w.backend, w.numpy
    sched = _own_scheduler(nb, backend)
    n, m = int(r.choice([4, 16])), int(r.integers(1, 4))
    x = ctx.new_tensor("f32", [n, m]).set_input()
    y = ctx.sum_rows(ctx.add(ctx.mul(x, x), x)).set_output()
    graph = ctx.new_graph(16).build_forward(y)
    sched.alloc_graph(graph)
    xa = r.standard_normal((m, n)).astype(np.float32)
    x.set(xa)
    sched.compute(graph)
    count.add_calls(9)
    return y.numpy(), (xa * xa + xa).sum(axis=1, keepdims=True)


def cache_async(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    """compute_async, then result(): another thread's compute of the same key in between
    must make result() raise ClosedError, not return that compute's values."""
    with w.lock:
        cache = w.cache
    n, m = int(r.choice([8, 24])), int(r.integers(1, 4))
    xa = r.standard_normal((m, n)).astype(np.float32)
    wa = r.standard_normal((n, n)).astype(np.float32)
    pending = cache.compute_async((n, m), x=xa, w=wa)
    time.sleep(float(r.choice([0.0, 0.001])))
    count.add_calls(2)
    return pending.result()["y"], np.tanh(xa @ wa.T)


def data_roundtrip(w: World, r: np.random.Generator, count: Counter) -> tuple[Any, Any]:
    with w.lock:
        data = w.data
    a = r.standard_normal(int(r.integers(1, 64))).astype(np.float32)
    t = data.from_numpy(a)
    b = r.standard_normal(a.shape).astype(np.float32)
    t.set(b)
    count.add_calls(3)
    return t.numpy(), b


def reset(w: World, r: np.random.Generator, count: Counter) -> None:
    with w.lock:
        obj = w.ctx if r.random() < 0.7 else w.data
    obj.reset()
    count.add_calls(1)


def renew(w: World, r: np.random.Generator, count: Counter) -> None:
    w.renew(str(r.choice(os.environ.get("FUZZ_RENEW", "backend,ctx,data,galloc,cache,numpy").split(","))))
    count.add_calls(2)


ACTIONS: list[tuple[Callable[..., Any], float]] = [
    (own_graph, 0.3), (dep_graph, 0.15), (custom_graph, 0.1), (numpy_graph, 0.1), (cache_compute, 0.15),
    (cache_async, 0.1), (data_roundtrip, 0.2), (reset, 0.1), (renew, 0.05)]


def worker(i: int, seed: int, w: World, deadline: float, count: Counter) -> None:
    r = np.random.default_rng([seed, i])
    names = [a.__name__ for a, _ in ACTIONS]
    only = os.environ.get("FUZZ_ACTIONS")  # e.g. own_graph,renew: narrow a finding down
    p = np.array([q if only is None or n in only.split(",") else 0.0 for n, (_, q) in zip(names, ACTIONS)])
    while time.monotonic() < deadline:
        k = int(r.choice(len(ACTIONS), p=p / p.sum()))
        who = f"thread {i} {names[k]}"
        try:
            out = ACTIONS[k][0](w, r, count)
        except _REFUSALS as e:
            if not isinstance(e, (ClosedError, MemoryError)) and "not been computed" not in str(e):
                count.fail("UNEXPECTED_EXCEPTION", who, f"{type(e).__name__}: {e}")
            with count.lock:
                count.refused += 1
            if isinstance(e, MemoryError):
                with w.lock:
                    ctx = w.ctx
                try:
                    ctx.reset()
                except ClosedError:
                    pass
            continue
        except BaseException as e:  # noqa: BLE001 - every other exception is a finding
            count.fail("UNEXPECTED_EXCEPTION", who, "".join(traceback.format_exception(e)).strip())
            continue
        with count.lock:
            count.actions += 1
        if out is not None:
            got, expected, *what = out
            if got.size != expected.size:
                count.fail("WRONG_RESULT", who, f"shape {got.shape}, expected {expected.shape} {what}")
            elif not np.allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5):
                count.fail("WRONG_RESULT", who, f"max |diff| {np.max(np.abs(got.reshape(expected.shape) - expected))} {what}")


def main() -> int:
    seed = int(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    n_threads = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    world, count = World(), Counter()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=worker, args=(i, seed, world, deadline, count), daemon=True)
               for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0) + 60)
    if any(t.is_alive() for t in threads):
        print("FAILURE HANG: threads still running 60 s past the end; their stacks:", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        print(f"calls={count.calls} actions={count.actions} refused={count.refused} "
              f"failures={len(count.failures) + 1}", flush=True)
        return 3
    world.close()
    print(f"calls={count.calls} actions={count.actions} refused={count.refused} "
          f"failures={len(count.failures)}", flush=True)
    return 1 if count.failures else 0


if __name__ == "__main__":
    sys.exit(main())
