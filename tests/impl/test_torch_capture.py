"""pyggml.impl.torch on a GPU: the CUDA graph policy of plans (capture.py), row checks on the
device (checks.py), streams, async copies and events (stream.py).

The policy is run here on torch's ``cpu`` device with a fake capturer (the backend's ``capture``
and ``checks`` set as a CUDA backend sets them): when plans are captured, replayed, dropped and
captured again, which plans never are, and that the results stay those of ggml's CPU. The tests
marked ``cuda`` run on a ``TorchCudaBackend`` when torch sees a GPU and this process has a TORCH
device on ``cuda`` (``PYGGML_TORCH_DEVICE=cuda:0,cpu``, as ``scripts/gpu_check.sh`` runs this
file): graphs under pyggml's Scheduler beside the CPU against the CPU alone, a decode-like graph
captured (and the same outputs with ``PYGGML_TORCH_CUDA_GRAPHS=0``), events, async copies.
"""
from __future__ import annotations

import gc
import logging
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pyggml  # noqa: E402
from pyggml import Context, CPUBackend, Event, GGMLType, GraphAllocator, Scheduler, lib  # noqa: E402
from pyggml.backends.device import device_by_name  # noqa: E402
from pyggml.impl import _vtable  # noqa: E402
from pyggml.impl import torch as torch_backend  # noqa: E402
from pyggml.impl.torch import capture  # noqa: E402
from pyggml.impl.torch.checks import DeviceChecks  # noqa: E402

from test_torch_backend import _chain, _chain_ref, failing_add  # noqa: E402  (same folder)

os.environ.setdefault("PYGGML_TORCH_DEVICE", "cpu")

F32, F16, I32, I64, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64, GGMLType.Q8_0


def _device_named(kind: str):
    """The name of this process's first TORCH device on torch device type ``kind``, or None."""
    for d in torch_backend.register().devices:
        if d.torch_device.type == kind:
            return d.get_name()
    return None


def py_backend(be):
    """The TorchBackend object behind a pyggml Backend."""
    return _vtable.LIVE[_vtable.addr(be.ptr)]


CUDA = _device_named("cuda") if torch.cuda.is_available() else None
cuda = pytest.mark.skipif(CUDA is None, reason="needs torch with CUDA and a TORCH device on cuda "
                                              "(PYGGML_TORCH_DEVICE=cuda:0,cpu)")


class FakeCapturer:
    """Stands in for torch's CUDA graphs: records each capture; the "graph" replays by running
    the captured steps. ``fail``: an exception every capture raises. ``caches``: weights caches
    whose tensors a real graph would have baked in: a replay asserts they are still the cached
    ones (a graph replayed after a write into the weights would read freed memory)."""

    def __init__(self, fail: Exception | None = None, caches=()):
        self.captures = 0
        self.replays = 0
        self.fail = fail
        self.caches = list(caches)

    def _baked(self):
        return [id(t) for c in self.caches for v in c.values() for t in v if t is not None]

    def __call__(self, run):
        self.captures += 1
        if self.fail is not None:
            raise self.fail
        baked = self._baked()

        def replay():
            assert self._baked() == baked, "a graph replayed over weights that changed"
            self.replays += 1
            run()
        return replay


@pytest.fixture
def cpu_torch():
    """A new torch backend on ``cpu`` configured as a CUDA one is (a capturer, row checks on
    the device): (pyggml Backend, its TorchBackend, the FakeCapturer)."""
    name = _device_named("cpu")
    if name is None:
        pytest.skip("no TORCH device on cpu in this process")
    gc.collect()        # earlier tests' buffers freed now, not amid a test (a free drops plans)
    be = device_by_name(name).init()
    tb = py_backend(be)
    tb.capture = fake = FakeCapturer()
    tb.checks = DeviceChecks(torch.device("cpu"))
    yield be, tb, fake
    be.close()


def _counts(tb):
    return tb.n_builds, tb.n_replays, tb.n_graph_replays, tb.n_captures, tb.n_capture_failures


# ------------------------------------------------------------------------- a chain graph

def _run_chain(be, x, y, g, k):
    v = np.linspace(-1, 1, 16, dtype=np.float32) * (k + 1) / 4
    x.set(v)
    g.compute(be)
    np.testing.assert_allclose(y.numpy(), _chain_ref(v), rtol=1e-5)


def test_an_unchanged_graph_is_captured_at_its_second_compute_then_replayed(cpu_torch):
    """Computes 1 and 2 run the steps; right after compute 2's run the plan is captured (once);
    computes 3.. replay the graph, which reads the new inputs (the results stay right)."""
    be, tb, fake = cpu_torch
    ctx, x, y, g = _chain(be)
    with ctx:
        seen = []
        for k in range(6):
            _run_chain(be, x, y, g, k)
            seen.append(_counts(tb))
        assert seen[0] == (1, 0, 0, 0, 0)
        assert seen[1] == (1, 1, 0, 1, 0)
        assert seen[-1] == (1, 5, 4, 1, 0)
        assert (fake.captures, fake.replays) == (1, 4)
        assert capture.WARMUP == 2


def test_a_changed_graph_gets_a_new_plan_captured_anew(cpu_torch):
    be, tb, fake = cpu_torch
    ctx, x, y, g = _chain(be)
    with ctx:
        for k in range(3):
            _run_chain(be, x, y, g, k)
        GraphAllocator(be).alloc_graph(g)           # new addresses: a new plan
        _run_chain(be, x, y, g, 3)
        assert _counts(tb) == (2, 2, 1, 1, 0)       # its first compute runs the steps
        _run_chain(be, x, y, g, 4)
        _run_chain(be, x, y, g, 5)
        assert _counts(tb) == (2, 4, 2, 2, 0)
        assert fake.captures == 2


def test_freeing_a_buffer_drops_the_captured_plans_that_see_it(cpu_torch):
    """A buffer another graph used, freed: the plan of this graph stays captured. This graph's
    own buffer freed (its allocator placing it again): its plan is dropped, and the storage the
    plan's views held is let go."""
    be, tb, fake = cpu_torch
    ctx, x, y, g = _chain(be)
    with ctx:
        for k in range(3):
            _run_chain(be, x, y, g, k)
        assert tb.plans and next(iter(tb.plans.values())).graph.replay is not None
        with Context.for_tensors(1) as other:        # a TorchBuffer allocated and freed
            other.new_tensor(F32, [4])
            other.alloc_tensors(be)
        _run_chain(be, x, y, g, 3)
        assert _counts(tb) == (1, 3, 2, 1, 0)        # still the captured graph
        (plan,) = tb.plans.values()
        (old,) = plan.views.buffers.values()
        ctx2, x2, y2, g2 = _chain(be)                # a second graph, then the first placed anew
        with ctx2:
            _run_chain(be, x2, y2, g2, 0)
            galloc = GraphAllocator(be)
            galloc.reserve(g2)                       # a larger buffer than the first allocator's
            galloc.alloc_graph(g)
            gc.collect()                             # the first allocator and its buffer
            assert old.freed
            _run_chain(be, x, y, g, 4)
            assert all(not b.freed for p in tb.plans.values() for b in p.views.buffers.values())
            assert _counts(tb)[:3] == (3, 3, 2)      # rebuilt, run eagerly
            _run_chain(be, x, y, g, 5)
            assert fake.captures == 2


def test_a_capture_that_raises_leaves_the_plan_eager_for_good(cpu_torch, caplog):
    be, tb, fake = cpu_torch
    fake.fail = RuntimeError("operation not permitted when stream is capturing")
    ctx, x, y, g = _chain(be)
    with ctx, caplog.at_level(logging.WARNING, logger="pyggml.torch"):
        for k in range(6):
            _run_chain(be, x, y, g, k)
        assert fake.captures == 1                    # tried once, never again
        assert _counts(tb) == (1, 5, 0, 0, 1)
        plan = next(iter(tb.plans.values()))
        assert plan.graph.error is fake.fail and plan.graph.replay is None
    assert "could not be captured" in caplog.text and "not permitted" in caplog.text


def test_an_error_of_the_steps_before_the_capture_is_raised_and_nothing_is_captured(cpu_torch, monkeypatch):
    """A kernel error in compute 2's eager run (the warm-up) is raised by the compute, as without
    capture, and the capture is not attempted."""
    be, tb, fake = cpu_torch
    failing_add(monkeypatch, lambda n: n == 2)
    with Context.for_tensors(4, graph_size=8) as ctx:
        x = ctx.new_tensor(F32, [4]).set_input()
        y = ctx.add(x, x)
        g = ctx.new_graph(8).build_forward(y)
        GraphAllocator(be).alloc_graph(g)
        x.set(np.ones(4, np.float32))
        g.compute(be)
        with pytest.raises(RuntimeError, match="size of tensor a"):
            g.compute(be)
        assert fake.captures == 0 and tb.n_captures == 0
        g.compute(be)                                # the warm-up again, now captured
        np.testing.assert_array_equal(y.numpy(), 2 * np.ones(4, np.float32))
        assert fake.captures == 1


def test_plans_with_host_steps_are_never_captured(cpu_torch):
    """ARGMAX (reads rows with NaN), GET_ROWS checking its rows on the host (no ``checks``) and
    a node writing into weights (drops their float32 copies) run in Python at every compute:
    their plans are not capturable, and the capturer is never called."""
    be, tb, fake = cpu_torch

    def argmax(ctx):
        a = ctx.new_tensor(F32, [8, 3]).set_input()
        return [a], ctx.argmax(a)

    def host_rows(ctx):
        a, r = ctx.new_tensor(F32, [8, 3]).set_input(), ctx.new_tensor(I32, [2]).set_input()
        return [a, r], ctx.get_rows(a, r)

    for make, checks in ((argmax, tb.checks), (host_rows, None)):
        tb.checks = checks
        with Context.for_tensors(8, graph_size=8) as ctx:
            ins, out = make(ctx)
            g = ctx.new_graph(8).build_forward(out)
            GraphAllocator(be).alloc_graph(g)
            ins[0].set(np.arange(24, dtype=np.float32).reshape(3, 8))
            if len(ins) > 1:
                ins[1].set(np.array([2, 0], np.int32))
            for _ in range(4):
                g.compute(be)
            plan = tb.plans[_vtable.addr(g.nodes[0].ptr)]
            assert not plan.capturable
    with Context.for_tensors(2) as wctx, Context.for_tensors(4, graph_size=8) as ctx:
        w = wctx.new_tensor(F16, [16, 2])
        wbuf = wctx.alloc_tensors(be)
        wbuf.usage = "weights"
        src = ctx.new_tensor(F32, [16, 2]).set_input()
        g = ctx.new_graph(8).build_forward(ctx.cpy(src, w))
        GraphAllocator(be).alloc_graph(g)
        src.set(np.ones((2, 16), np.float32))
        for _ in range(4):
            g.compute(be)
        np.testing.assert_array_equal(w.numpy(), np.ones((2, 16), np.float16))
    assert fake.captures == 0 and tb.n_captures == 0


def test_flash_attn_is_captured_only_where_it_does_not_cut_keys_on_the_host():
    """FLASH_ATTN_EXT with a mask on ``cpu`` cuts off masked keys after reading the mask (eager);
    without a mask it has nothing to cut (capturable)."""
    views = torch_backend.memory.Views(torch.device("cpu"))
    with Context(1 << 20) as ctx:
        q, k = ctx.from_numpy(np.zeros((2, 4, 16), np.float32)), ctx.from_numpy(np.zeros((2, 8, 16), np.float16))
        m = ctx.from_numpy(np.zeros((4, 8), np.float16))
        with_mask = torch_backend.table.build(ctx.flash_attn(q, k, k, m, scale=0.25).ptr, views)
        without = torch_backend.table.build(ctx.flash_attn(q, k, k, None, scale=0.25).ptr, views)
        assert torch_backend.table.is_eager(with_mask) and not torch_backend.table.is_eager(without)


def test_row_checks_on_the_device_are_raised_by_synchronize(cpu_torch):
    """With ``checks`` (as on a CUDA device), GET_ROWS and SET_ROWS do not read their indices
    to the host: an index out of range sets a flag, the indices are clamped, and the backend's
    synchronize raises ValueError naming the op and range, once."""
    be, tb, _ = cpu_torch
    views = torch_backend.memory.Views(torch.device("cpu"), tb.checks)
    with Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
        r = ctx.from_numpy(np.array([0, 3], np.int32))
        out = ctx.get_rows(a, r)
        step = torch_backend.table.build(out.ptr, views)
        assert not torch_backend.table.is_eager(step)
        step()                                           # no error yet
        np.testing.assert_array_equal(out.numpy(), [[0, 1, 2, 3], [8, 9, 10, 11]])   # clamped to row 2
        with pytest.raises(ValueError, match=r"get_rows: row index out of range \[0, 3\)"):
            tb.synchronize()
        tb.synchronize()                                 # raised once, then cleared
        r.set(np.array([2, 1], np.int32))
        step()
        tb.synchronize()
        np.testing.assert_array_equal(out.numpy(), [[8, 9, 10, 11], [4, 5, 6, 7]])
        dst = ctx.from_numpy(np.zeros((3, 4), np.float32))
        step = torch_backend.table.build(ctx.set_rows(dst, ctx.from_numpy(np.ones((2, 4), np.float32)), r).ptr,
                                         views)
        r.set(np.array([-1, 1], np.int32))
        step()
        with pytest.raises(ValueError, match=r"set_rows: row index out of range \[0, 3\)"):
            tb.synchronize()


def test_device_checks_share_their_last_flag_when_full():
    checks = DeviceChecks(torch.device("cpu"), capacity=3)
    a, b, c = checks.flag("a"), checks.flag("b"), checks.flag("c")
    assert checks.flag("a").data_ptr() == a.data_ptr() and c.data_ptr() != b.data_ptr()
    c.logical_or_(torch.tensor(True))
    with pytest.raises(ValueError, match="more checks than flags"):
        checks.raise_pending()
    b.logical_or_(torch.tensor(True))
    with pytest.raises(ValueError, match="^b$"):
        checks.raise_pending()
    checks.raise_pending()


def test_graphs_env_var():
    old = os.environ.pop("PYGGML_TORCH_CUDA_GRAPHS", None)
    try:
        assert capture.enabled()
        os.environ["PYGGML_TORCH_CUDA_GRAPHS"] = "0"
        assert not capture.enabled()
        os.environ["PYGGML_TORCH_CUDA_GRAPHS"] = "1"
        assert capture.enabled()
    finally:
        os.environ.pop("PYGGML_TORCH_CUDA_GRAPHS", None)
        if old is not None:
            os.environ["PYGGML_TORCH_CUDA_GRAPHS"] = old


def test_a_cpu_device_has_no_events_and_no_async_copies():
    """On torch's ``cpu`` computing is synchronous: the device reports neither events nor async
    copies, and its backends fill none of those slots."""
    name = _device_named("cpu")
    if name is None:
        pytest.skip("no TORCH device on cpu in this process")
    props = device_by_name(name).props
    assert not props.events and not props.async_
    be = device_by_name(name).init()
    try:
        iface = be.ptr.iface
        for slot in ("set_tensor_async", "get_tensor_async", "cpy_tensor_async", "event_record", "event_wait"):
            assert getattr(iface, slot) == pyggml.ffi.NULL, slot
    finally:
        be.close()


def test_a_cuda_device_reports_async_copies_and_events(monkeypatch):
    """``TorchCudaDevice``'s properties, read without a GPU (its memory query stubbed): ggml's
    ``caps.async`` and ``caps.events``, so a scheduler or llama.cpp may use them."""
    dev = torch_backend.TorchCudaDevice(9, torch.device("cuda", 0))
    monkeypatch.setattr(dev, "get_memory", lambda: (0, 0))
    dev._freeze()
    props = pyggml.ffi.new("struct ggml_backend_dev_props *")
    dev._c_get_props(pyggml.ffi.NULL, props)
    assert getattr(props.caps, "async") and props.caps.events
    assert props.type == lib.GGML_BACKEND_DEVICE_TYPE_GPU


# ------------------------------------------------------------------------- a decode-like graph

H, NH, HD, V, FF, NCTX = 32, 2, 16, 24, 64, 8


class Decoder:
    """A one-token decode step of a tiny llama-like model on ``be`` (the weights, F16 and Q8_0, in
    a WEIGHTS buffer and an F16 KV cache of NCTX cells in buffers of ``be``): GET_ROWS of the
    token, RMS_NORM, MUL_MAT, ROPE, SET_ROWS into the cache, attention over the cache
    (SOFT_MAX or FLASH_ATTN_EXT), SwiGLU FFN, logits. The same graph is computed at every step
    with new inputs (token, position, cache row, mask), as a decoder's is. ``sched``: compute
    under this Scheduler instead of ``be`` alone."""

    def __init__(self, be, flash_attn=False, sched=None, seed=0):
        rng = np.random.default_rng(seed)
        self.be, self.sched = be, sched
        self.wctx, self.cctx = Context.for_tensors(12), Context.for_tensors(2)
        ws = {"emb": (F16, [H, V]), "wq": (F16, [H, H]), "wk": (F16, [H, H]), "wv": (F16, [H, H]),
              "wo": (F16, [H, H]), "w1": (Q8_0, [H, FF]), "w3": (Q8_0, [H, FF]), "w2": (Q8_0, [FF, H]),
              "g": (F32, [H])}
        self.w = {n: self.wctx.new_tensor(t, ne, name=n) for n, (t, ne) in ws.items()}
        buf = self.wctx.alloc_tensors(be)
        buf.usage = "weights"
        for n, (t, ne) in ws.items():
            self.w[n].set(rng.uniform(-0.3, 0.3, ne[::-1]).astype(np.float32) + (1.0 if n == "g" else 0.0))
        kc, vc = self.cctx.new_tensor(F16, [H, NCTX]), self.cctx.new_tensor(F16, [H, NCTX])
        self.cctx.alloc_tensors(be).clear(0)
        self.ctx = c = Context.for_tensors(96, graph_size=128)
        w = self.w
        self.tok, self.pos = c.new_tensor(I32, [1]).set_input(), c.new_tensor(I32, [1]).set_input()
        self.row = c.new_tensor(I64, [1]).set_input()
        self.mask = c.new_tensor(F16 if flash_attn else F32, [NCTX, 1]).set_input()
        x = c.get_rows(w["emb"], self.tok)
        h = c.rms_norm(x, 1e-5) * w["g"]
        q = c.rope(c.reshape(c.mul_mat(w["wq"], h), HD, NH, 1), self.pos, HD, mode=2, freq_base=10000.0)
        k = c.rope(c.reshape(c.mul_mat(w["wk"], h), HD, NH, 1), self.pos, HD, mode=2, freq_base=10000.0)
        kc2 = c.set_rows(kc, c.reshape(k, H, 1), self.row)
        vc2 = c.set_rows(vc, c.mul_mat(w["wv"], h), self.row)
        K = c.permute(c.view(kc2, [HD, NH, NCTX], [HD * 2, H * 2]), 0, 2, 1, 3)   # [HD, NCTX, NH]
        Vv = c.view(vc2, [HD, NH, NCTX], [HD * 2, H * 2])
        qp = c.permute(q, 0, 2, 1, 3)                                              # [HD, 1, NH]
        if flash_attn:
            o = c.flash_attn(qp, K, c.permute(Vv, 0, 2, 1, 3), self.mask, scale=1 / math.sqrt(HD))
            o = c.reshape(o, H, 1)                                                  # [HD, NH, 1]
        else:
            kq = c.soft_max(c.mul_mat(K, qp), self.mask, 1 / math.sqrt(HD))         # [NCTX, 1, NH]
            o = c.mul_mat(c.cont(c.permute(Vv, 1, 2, 0, 3)), kq)                    # [HD, 1, NH]
            o = c.reshape(c.cont(c.permute(o, 0, 2, 1, 3)), H, 1)
        x = x + c.mul_mat(w["wo"], o)
        h = c.rms_norm(x, 1e-5) * w["g"]
        x = x + c.mul_mat(w["w2"], c.swiglu(c.mul_mat(w["w1"], h), c.mul_mat(w["w3"], h)))
        self.logits = c.mul_mat(w["emb"], c.rms_norm(x, 1e-5) * w["g"])
        self.graph = c.new_graph(128).build_forward(self.logits)
        if sched is not None:
            sched.alloc_graph(self.graph)
        else:
            GraphAllocator(be).alloc_graph(self.graph)
        self.mask_dtype = np.float16 if flash_attn else np.float32

    def step(self, t, token):
        self.tok.set(np.array([token], np.int32))
        self.pos.set(np.array([t], np.int32))
        self.row.set(np.array([t], np.int64))
        m = np.where(np.arange(NCTX) <= t, 0.0, -np.inf).astype(self.mask_dtype)
        self.mask.set(m.reshape(1, NCTX))
        if self.sched is not None:
            self.sched.compute(self.graph)
        else:
            self.graph.compute(self.be)
        return self.logits.numpy().reshape(-1).copy()

    def close(self):
        for c in (self.ctx, self.cctx, self.wctx):
            c.close()


TOKENS = [3, 17, 5, 5, 22, 0, 9]


def _cpu_logits(flash_attn):
    with CPUBackend(n_threads=1) as cpu:
        d = Decoder(cpu, flash_attn)
        try:
            return [d.step(t, tok) for t, tok in enumerate(TOKENS)]
        finally:
            d.close()


def _nmse(ref, got):
    return float(((ref - got) ** 2).sum() / max((ref ** 2).sum(), 1e-30))


#: NMSE against the CPU: the products are the CPU's up to float order; ggml's CPU FLASH_ATTN_EXT
#: rounds more (F16 K/V products), as in test_torch_backend.py's FLASH_ATTN_EXT cases
TOL = {False: 1e-6, True: 5e-4}


def test_a_decode_graph_is_captured_and_follows_the_cpu(cpu_torch):
    """The decode-like graph with row checks on the device: captured after two steps, replayed
    for the others, the CPU's logits at every step; a write into the weights drops the graph,
    which is captured again two computes later."""
    be, tb, fake = cpu_torch
    ref = _cpu_logits(False)
    d = Decoder(be)
    fake.caches = [t for t in {id(c): c for c in (_vtable.LIVE[_vtable.addr(x.buffer_ptr)].weights_cache
                                                  for x in d.w.values())}.values()]
    try:
        for t, tok in enumerate(TOKENS):
            got = d.step(t, tok)
            assert _nmse(ref[t], got) < TOL[False], t
        assert (tb.n_builds, tb.n_captures, tb.n_graph_replays) == (1, 1, len(TOKENS) - 2)
        assert next(iter(tb.plans.values())).capturable
        d.w["wo"].set(np.zeros((H, H), np.float32))     # weights written: the graph is dropped
        d.step(0, 1)
        assert (tb.n_captures, tb.n_graph_replays) == (1, len(TOKENS) - 2)
        d.step(1, 2)
        d.step(2, 3)
        assert (tb.n_captures, tb.n_graph_replays) == (2, len(TOKENS) - 1)
    finally:
        d.close()


def test_a_decode_graph_with_flash_attn_on_cpu_is_not_captured(cpu_torch):
    be, tb, fake = cpu_torch
    ref = _cpu_logits(True)
    d = Decoder(be, flash_attn=True)
    try:
        for t, tok in enumerate(TOKENS):
            assert _nmse(ref[t], d.step(t, tok)) < TOL[True], t
        assert fake.captures == 0 and not next(iter(tb.plans.values())).capturable
    finally:
        d.close()


# ------------------------------------------------------------------------- on CUDA


def _cuda_backend():
    return device_by_name(CUDA).init()


def _bert_like(ctx):
    """MiniLM's pieces: embeddings by GET_ROWS, layer norm, GELU(erf) FFN, pooling, l2_norm."""
    Hb, T, Vb = 32, 5, 20
    emb, ids = ctx.new_tensor(F32, [Hb, Vb]).set_input(), ctx.new_tensor(I32, [T]).set_input()
    w, b = ctx.new_tensor(F32, [Hb]).set_input(), ctx.new_tensor(F32, [Hb]).set_input()
    w1, w2 = ctx.new_tensor(F32, [Hb, 4 * Hb]).set_input(), ctx.new_tensor(F32, [4 * Hb, Hb]).set_input()
    pool = ctx.new_tensor(F32, [T, 1]).set_input()
    x = ctx.norm(ctx.get_rows(emb, ids), 1e-12) * w + b
    x = ctx.norm(x + ctx.mul_mat(w2, ctx.gelu_erf(ctx.mul_mat(w1, x))), 1e-12)
    out = ctx.l2_norm(ctx.mul_mat(ctx.cont(ctx.transpose(x)), pool), 1e-12)
    rng = np.random.default_rng(1)
    values = [rng.uniform(-1, 1, (Vb, Hb)), np.array([1, 7, 3, 19, 0]), rng.uniform(-1, 1, Hb),
              rng.uniform(-1, 1, Hb), rng.uniform(-0.3, 0.3, (4 * Hb, Hb)), rng.uniform(-0.3, 0.3, (Hb, 4 * Hb)),
              np.full((1, T), 1.0 / T)]
    ins = [emb, ids, w, b, w1, w2, pool]
    return ins, [v.astype(np.int32 if t.type == I32 else np.float32) for v, t in zip(values, ins)], out


def _small(ctx):
    a, b = ctx.new_tensor(F32, [64, 8]).set_input(), ctx.new_tensor(F32, [64, 8]).set_input()
    out = ctx.gelu(ctx.soft_max(ctx.mul_mat(a, b) * 0.125))
    rng = np.random.default_rng(2)
    return [a, b], [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(2)], out


@cuda
@pytest.mark.parametrize("make", [_small, _bert_like], ids=["small", "bert_like"])
def test_cuda_graphs_under_the_scheduler_match_the_cpu(make):
    """A small graph and MiniLM's pieces on [TORCH (cuda), CPU] under pyggml's Scheduler: the
    CPU alone's results, computed three times (the third replays a CUDA graph)."""
    with Context.for_tensors(32, graph_size=64) as ctx, CPUBackend(n_threads=2) as cpu:
        ins, vals, out = make(ctx)
        g = ctx.new_graph(64).build_forward(out)
        GraphAllocator(cpu).alloc_graph(g)
        for t, v in zip(ins, vals):
            t.set(v)
        g.compute(cpu)
        expected = out.numpy().copy()
    be = _cuda_backend()
    tb = py_backend(be)
    with Context.for_tensors(32, graph_size=64) as ctx, CPUBackend(n_threads=2) as cpu:
        sched = Scheduler([be, cpu])
        ins, vals, out = make(ctx)
        g = ctx.new_graph(64).build_forward(out)
        sched.alloc_graph(g)
        for _ in range(3):
            for t, v in zip(ins, vals):
                t.set(v)
            sched.compute(g)
            np.testing.assert_allclose(out.numpy(), expected, rtol=2e-4, atol=2e-5)
        assert tb.n_builds >= 1 and tb.n_replays >= 2
        sched.close()
    be.close()


def _cuda_decode(flash_attn, graphs):
    os.environ["PYGGML_TORCH_CUDA_GRAPHS"] = "1" if graphs else "0"
    try:
        be = _cuda_backend()
    finally:
        os.environ.pop("PYGGML_TORCH_CUDA_GRAPHS")
    tb = py_backend(be)
    cpu = CPUBackend(n_threads=2)
    sched = Scheduler([be, cpu])
    d = Decoder(be, flash_attn, sched=sched)
    try:
        logits = [d.step(t, tok) for t, tok in enumerate(TOKENS)]
        return logits, _counts(tb)
    finally:
        d.close()
        sched.close()
        cpu.close()
        be.close()


@cuda
@pytest.mark.parametrize("flash_attn", [False, True], ids=["soft_max", "flash_attn"])
def test_cuda_decode_is_captured_and_agrees_without_graphs(flash_attn):
    """The decode-like graph on [TORCH (cuda), CPU]: its split on the GPU is captured into a CUDA
    graph and replayed (counters), the logits follow the CPU's, and equal those computed with
    ``PYGGML_TORCH_CUDA_GRAPHS=0`` (no capture)."""
    ref = _cpu_logits(flash_attn)
    on, counts_on = _cuda_decode(flash_attn, True)
    off, counts_off = _cuda_decode(flash_attn, False)
    builds, replays, graph_replays, captures, failures = counts_on
    assert failures == 0 and captures >= 1 and graph_replays >= len(TOKENS) - 2, counts_on
    assert counts_off[2:] == (0, 0, 0), counts_off
    for t in range(len(TOKENS)):
        assert _nmse(ref[t], on[t]) < 10 * TOL[flash_attn], t
        np.testing.assert_allclose(on[t], off[t], rtol=1e-5, atol=1e-6)


@cuda
def test_cuda_events_async_copies_and_device_row_checks():
    """The CUDA device reports events and async copies; an event recorded on one backend and
    waited for by another orders a copy between their streams; set/get_tensor_async round trip;
    an index out of range in device memory is raised by the compute (via synchronize)."""
    dev = device_by_name(CUDA)
    assert dev.props.events and dev.props.async_
    b1, b2 = dev.init(), dev.init()
    with Context.for_tensors(4, graph_size=8) as ctx:
        x = ctx.new_tensor(F32, [1 << 16])
        y = ctx.new_tensor(F32, [1 << 16])
        ctx.alloc_tensors(b1)
        v = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
        b1.tensor_set_async(x, v)
        ev = Event(dev)
        ev.record(b1)
        ev.wait(b2)
        b1.tensor_copy_async(b2, x, y)            # cpy_tensor_async: TORCH to TORCH on one GPU
        out = np.empty_like(v)
        b2.tensor_get_async(y, out)
        b2.synchronize()
        b1.synchronize()
        ev.synchronize()
        np.testing.assert_array_equal(out, v)
        np.testing.assert_array_equal(y.numpy(), v)
    with Context.for_tensors(4, graph_size=8) as ctx:
        a = ctx.new_tensor(F32, [4, 3])
        r = ctx.new_tensor(I32, [2])
        out = ctx.get_rows(a, r)
        g = ctx.new_graph(8).build_forward(out)
        ctx.alloc_tensors(b1)                    # the indices in GPU memory: only the step checks them
        a.set(np.arange(12, dtype=np.float32).reshape(3, 4))
        r.set(np.array([0, 3], np.int32))
        with pytest.raises(ValueError, match=r"get_rows: row index out of range \[0, 3\)"):
            g.compute(b1)
        r.set(np.array([2, 1], np.int32))
        g.compute(b1)
        np.testing.assert_array_equal(out.numpy(), [[8, 9, 10, 11], [4, 5, 6, 7]])
    b1.close()
    b2.close()
