"""Extra buffer types (pyggml.backends.extra_bufts, Device.extra_buffer_types): the trial that
proves one before use, llama.cpp's placement rule, and what memory with a layout of its own
refuses instead of crashing.

The placement and layout tests need an extra buffer type that takes Q4_0 products (ggml's
CPU_REPACK on any x86 CPU with AVX2, on Arm with dot products); they are skipped elsewhere.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from pyggml import Context, CPUBackend, GGMLType
from pyggml.backends import extra_bufts
from pyggml.backends.device import device_by_name
from pyggml.backends.info import info

K, N = 512, 64


@pytest.fixture
def fresh_trials(monkeypatch):
    """Trials run anew in the test (and again after it, with the real trial)."""
    monkeypatch.setattr(extra_bufts, "_trials", {})
    yield
    extra_bufts._trials.clear()


@pytest.fixture(scope="module")
def cpu_dev():
    return device_by_name("CPU")


@pytest.fixture(scope="module")
def q4_buft(cpu_dev):
    buft = cpu_dev.weight_buffer_type(GGMLType.Q4_0, [K, N])
    if buft == cpu_dev.buffer_type:
        pytest.skip(f"no extra buffer type of this CPU takes Q4_0 products "
                    f"({cpu_dev.extra_buffer_type_trials})")
    return buft


def _weights(rng):
    return rng.standard_normal((N, K)).astype(np.float32)


def test_cpu_device_lists_its_extra_buffer_types_and_tries_them(cpu_dev):
    listed = extra_bufts.listed(cpu_dev.ptr)
    trials = cpu_dev.extra_buffer_type_trials
    assert [t.buffer_type for t in trials] == listed
    assert cpu_dev.extra_buffer_types == [t.buffer_type for t in trials if t.error is None]
    for t in trials:
        assert not t.buffer_type.is_host   # ggml's rule: only its own kernels read such memory
    cpu = next(d for d in info()["devices"] if d["name"] == "CPU")
    assert [x["name"] for x in cpu["extra_buffer_types"]] == [t.name for t in trials]


def test_weight_buffer_type_follows_supports_op(cpu_dev, q4_buft):
    """Q4_0 matrices go to the extra buffer type; F32, a shape whose rows it cannot group, a
    tensor of other than 2 dims and extra=False go to the default one."""
    default = cpu_dev.buffer_type
    assert q4_buft.name in [t.name for t in cpu_dev.extra_buffer_types]
    assert cpu_dev.weight_buffer_type("f32", [K, N]) == default
    assert cpu_dev.weight_buffer_type("q4_0", [K, N + 1]) == default   # rows not in groups of 4/8
    assert cpu_dev.weight_buffer_type("q4_0", [K, N, 2]) == default
    assert cpu_dev.weight_buffer_type("q4_0", [K, N], extra=False) == default
    with pytest.raises(ValueError):
        cpu_dev.weight_buffer_type("q4_0", [])
    with pytest.raises(ValueError):
        cpu_dev.weight_buffer_type("no_such_type", [K, N])


def test_a_product_on_repacked_weights_equals_the_default_one(q4_buft):
    rng = np.random.default_rng(1)
    w_values, x_values = _weights(rng), rng.standard_normal((7, K)).astype(np.float32)
    with CPUBackend(n_threads=2) as cpu, Context.for_tensors(1) as wctx, \
            Context.for_tensors(1) as rctx, Context.for_tensors(4, graph_size=8) as ctx:
        w = wctx.new_tensor(GGMLType.Q4_0, [K, N])
        ref = rctx.new_tensor(GGMLType.Q4_0, [K, N])
        wctx.alloc_tensors(q4_buft)
        rctx.alloc_tensors(cpu)
        w.set(w_values)
        ref.set(w_values)
        x = ctx.new_tensor(GGMLType.F32, [K, 7])
        y, y_ref = ctx.mul_mat(w, x), ctx.mul_mat(ref, x)
        g = ctx.new_graph(8).build_forward(y).build_forward(y_ref)
        ctx.alloc_tensors(cpu)
        x.set(x_values)
        cpu.graph_compute(g)
        np.testing.assert_allclose(y.numpy(), y_ref.numpy(), rtol=1e-4, atol=1e-3)
        # and both are the product of the Q4_0 values (ggml's own round trip as the reference)
        np.testing.assert_allclose(y_ref.numpy(), x_values @ ref.numpy().T, rtol=2e-2, atol=0.5)


def test_memory_with_a_layout_of_its_own_refuses_what_would_crash(q4_buft):
    """ggml's CPU_REPACK buffer has no get_tensor (a read would call NULL) and asserts that a
    write is whole: each is a ValueError, and the interpreter lives on."""
    rng = np.random.default_rng(2)
    with CPUBackend() as cpu, Context.for_tensors(2) as wctx, Context.for_tensors(1) as hctx:
        w = wctx.new_tensor(GGMLType.Q4_0, [K, N], name="w")
        f = wctx.new_tensor(GGMLType.F32, [K, N], name="f")   # no repacked layout for F32
        host = hctx.new_tensor(GGMLType.Q4_0, [K, N])
        wctx.alloc_tensors(q4_buft)
        hctx.alloc_tensors(cpu)
        w.set(_weights(rng))
        with pytest.raises(ValueError, match="cannot be read back"):
            w.numpy()
        with pytest.raises(ValueError, match="cannot be read back"):
            cpu.tensor_get_async(w, np.empty(w.nbytes, np.uint8))
        with pytest.raises(ValueError, match="whole or not at all"):
            cpu.tensor_set_async(w, np.zeros(w.nbytes // 2, np.uint8))
        with pytest.raises(ValueError, match="whole or not at all"):
            cpu.tensor_set_async(w, np.zeros(w.nbytes // 2, np.uint8), offset=w.nbytes // 2)
        with pytest.raises(ValueError, match="has none for a f32"):
            f.set(np.zeros((N, K), np.float32))
        with pytest.raises(ValueError, match="cannot be read back"):
            cpu.tensor_copy(w, host)
        cpu.tensor_copy(host, w)          # a whole write from host memory is what it takes
        cpu.synchronize()


def test_only_products_read_repacked_weights(q4_buft):
    """A GET_ROWS of a repacked table (supports_op says no) and a product of a view of one
    (its bytes are not the view's) are refused before compute."""
    with CPUBackend() as cpu, Context.for_tensors(1) as wctx, Context.for_tensors(8, graph_size=16) as ctx:
        w = wctx.new_tensor(GGMLType.Q4_0, [K, N], name="table")
        wctx.alloc_tensors(q4_buft)
        w.set(_weights(np.random.default_rng(3)))
        rows = ctx.new_tensor(GGMLType.I32, [3])
        got = ctx.get_rows(w, rows)
        half = ctx.view_2d(w, K, N // 2, w.nb[1], 0)
        x = ctx.new_tensor(GGMLType.F32, [K, 2])
        y = ctx.mul_mat(half, x)
        g1 = ctx.new_graph(16).build_forward(got)
        g2 = ctx.new_graph(16).build_forward(y)
        ctx.alloc_tensors(cpu)
        rows.set(np.array([0, 1, 2], np.int32))
        x.set(np.ones((2, K), np.float32))
        with pytest.raises(ValueError, match="cannot compute node"):
            cpu.graph_compute(g1)
        with pytest.raises(ValueError, match="layout of its own"):
            cpu.graph_compute(g2)


def test_an_extra_buffer_type_whose_trial_dies_is_never_used(fresh_trials, monkeypatch, cpu_dev):
    """The trial's child dies as ggml's AMX kernel did on a machine whose flags list AMX
    (SIGILL): the type is dropped with the reason, weights go to the default buffer type, and
    this process never ran the kernel."""
    if not extra_bufts.listed(cpu_dev.ptr):
        pytest.skip("this CPU device lists no extra buffer type")

    def dies(buft, kinds):
        os.kill(os.getpid(), signal.SIGILL)

    monkeypatch.setattr(extra_bufts, "_products", dies)
    trials = cpu_dev.extra_buffer_type_trials
    assert trials and all(t.error is not None for t in trials if t.types)
    assert any("signal 4" in t.error for t in trials if t.types), trials
    assert cpu_dev.extra_buffer_types == []
    assert cpu_dev.weight_buffer_type("q4_0", [K, N]) == cpu_dev.buffer_type
    cpu = next(d for d in info()["devices"] if d["name"] == "CPU")
    assert all(x["error"] for x in cpu["extra_buffer_types"])


@pytest.mark.parametrize("how", ["wrong", "raises"])
def test_a_trial_that_proves_nothing_drops_the_type(fresh_trials, monkeypatch, cpu_dev, how):
    """Products that differ from the default memory's, or a trial that could not run, prove
    nothing: the type is dropped too."""
    if not extra_bufts.listed(cpu_dev.ptr):
        pytest.skip("this CPU device lists no extra buffer type")
    if how == "wrong":
        monkeypatch.setattr(extra_bufts, "TRIAL_RTOL", -1.0)   # every result differs
    else:
        def raises(buft, kinds):
            raise RuntimeError("no backend")
        monkeypatch.setattr(extra_bufts, "_products", raises)
    trials = cpu_dev.extra_buffer_type_trials
    tried = [t for t in trials if t.types]
    if not tried:
        pytest.skip("no extra buffer type of this CPU takes any product")
    assert cpu_dev.extra_buffer_types == []
    want = "products wrong" if how == "wrong" else "raised RuntimeError"
    assert all(want in t.error for t in tried), tried


def test_a_device_without_extra_buffer_types_places_everything_in_its_own(fresh_trials, monkeypatch, cpu_dev):
    monkeypatch.setattr(extra_bufts, "listed", lambda dev: [])
    assert cpu_dev.extra_buffer_types == [] and cpu_dev.extra_buffer_type_trials == []
    assert cpu_dev.weight_buffer_type("q4_0", [K, N]) == cpu_dev.buffer_type


def test_extra_buffer_types_of_other_devices_are_not_tried(fresh_trials, monkeypatch, cpu_dev):
    """The trial computes on ggml's CPU backend: a device of another type lists its extra buffer
    types as not tried, and places every weight in its own buffer type."""
    from pyggml.impl import register_builtin
    register_builtin("numpy")
    numpy_dev = device_by_name("NUMPY")
    monkeypatch.setattr(extra_bufts, "listed", lambda dev: [cpu_dev.buffer_type])
    trials = numpy_dev.extra_buffer_type_trials
    assert len(trials) == 1 and "not tried" in (trials[0].error or "")
    assert numpy_dev.extra_buffer_types == []
    assert numpy_dev.weight_buffer_type("q4_0", [K, N]) == numpy_dev.buffer_type
