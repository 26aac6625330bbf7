"""pyggml.raw.boundary: an exception a callback raised reaches the call that entered C, and no
other: chained to C's failure, raised where C reported none, attributed across threads by
owner, never left pending."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from pyggml import GGMLError, callbacks, lib
from pyggml.raw.boundary import calling, check_status, record


class Boom(Exception):
    pass


def _raising_abort_callback():
    return callbacks.Callback("ggml_abort_callback", lambda data: (_ for _ in ()).throw(Boom("abort cb")))


def test_raised_when_the_c_call_returns_and_not_later():
    cb = _raising_abort_callback()
    with pytest.raises(Boom), calling():
        assert lib.pyggml_cb_ggml_abort_callback(cb.user_data) is True  # C got the error value
    with calling():  # nothing is left for the next call
        pass


def test_chained_to_the_failure_c_reported():
    cb = _raising_abort_callback()
    with pytest.raises(Boom) as e, calling():
        lib.pyggml_cb_ggml_abort_callback(cb.user_data)
        check_status(lib.GGML_STATUS_ABORTED, "ggml_backend_graph_compute")
    assert isinstance(e.value.__cause__, GGMLError) and e.value.__cause__.status == lib.GGML_STATUS_ABORTED


def test_innermost_block_gets_it():
    cb = _raising_abort_callback()
    with calling():
        with pytest.raises(Boom), calling():
            lib.pyggml_cb_ggml_abort_callback(cb.user_data)
    # the outer block saw nothing


def test_other_threads_are_attributed_by_owner():
    owner = object()
    started, release = threading.Event(), threading.Event()

    def worker():
        started.wait()
        record(Boom("from a ggml thread"), owner)  # as a trampoline on a CPU worker thread does
        release.set()

    t = threading.Thread(target=worker)
    t.start()
    with pytest.raises(Boom, match="ggml thread"), calling(owner):
        started.set()
        release.wait(10)
    t.join()


def test_without_a_caller_it_goes_to_the_unraisable_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    cb = _raising_abort_callback()
    assert lib.pyggml_cb_ggml_abort_callback(cb.user_data) is True  # a raw call, no boundary
    assert len(seen) == 1 and isinstance(seen[0].exc_value, Boom)


def test_without_a_caller_pythons_own_hook_reports_it(run_isolated):
    """Python's builtin hook (``sys.__unraisablehook__``, what a program gets that sets none)
    takes only an ``UnraisableHookArgs``: pyggml handed it an object of its own, and the report
    itself failed with TypeError (seen in a C program, upstream's test-backend-ops, running a
    Python backend: pytest sets a hook of its own, so the tests did not see it)."""
    r = run_isolated("""
        import sys
        from pyggml.raw import boundary
        assert sys.unraisablehook is sys.__unraisablehook__
        boundary.record(ValueError("raised by a callback"))
        print("alive")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "alive", r.stderr
    assert "a pyggml callback raised outside any pyggml call into C" in r.stderr
    assert "ValueError: raised by a callback" in r.stderr and "TypeError" not in r.stderr, r.stderr


def test_custom_op_exception_from_a_worker_thread_reaches_compute():
    import pyggml

    x = np.ones(256, dtype=np.float32)
    with pyggml.Context(1 << 20) as ctx:
        a = ctx.from_numpy(x)

        def fail_on_worker(dst, src, ith, nth):
            if ith == nth - 1:
                raise Boom(f"thread {ith}")

        y = ctx.map_custom(fail_on_worker, a, n_tasks=2)
        graph = ctx.new_graph().build_forward(y)
        with pyggml.CPUBackend(n_threads=2) as cpu:
            with pytest.raises(Boom):
                cpu.graph_compute(graph)
