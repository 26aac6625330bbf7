"""pyggml.core.ops: op constructors against NumPy, and the checks that replace ggml's asserts."""
from __future__ import annotations

import numpy as np
import pytest

import pyggml
from pyggml import Context, GGMLType, ffi, lib
from pyggml.backends.cpu import graph_compute

rng = np.random.default_rng(1)


def compute(ctx, out, backend=None):
    g = ctx.new_graph().build_forward(out)
    if backend is None:
        graph_compute(g, n_threads=2)
    else:
        g.compute(backend)
    return out.numpy()


def test_ops_match_numpy():
    a = rng.standard_normal((3, 4, 8)).astype(np.float32)
    b = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    with Context(16 << 20) as ctx:
        ta, tb, tw = ctx.from_numpy(a), ctx.from_numpy(b), ctx.from_numpy(w)
        np.testing.assert_allclose(compute(ctx, ta + tb), a + b, rtol=1e-6)          # tiled
        np.testing.assert_allclose(compute(ctx, ta * tb - tb), a * b - b, rtol=1e-6)
        np.testing.assert_allclose(compute(ctx, ctx.mul_mat(tw, ta)), a @ w.T, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compute(ctx, ctx.soft_max(ta, scale=0.5)),
                                   np.exp(a / 2) / np.exp(a / 2).sum(-1, keepdims=True), rtol=1e-5)
        mean, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
        np.testing.assert_allclose(compute(ctx, ctx.norm(ta, 1e-5)), (a - mean) / np.sqrt(var + 1e-5),
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(compute(ctx, ctx.sum_rows(ta)), a.sum(-1, keepdims=True), rtol=1e-5)
        np.testing.assert_allclose(compute(ctx, ctx.cont(ctx.permute(ta, 1, 0, 2))),
                                   a.transpose(0, 2, 1), rtol=0)
        np.testing.assert_allclose(compute(ctx, ctx.unary("relu", ta)), np.maximum(a, 0))
        np.testing.assert_allclose(compute(ctx, ctx.silu(ta)), a / (1 + np.exp(-a)), rtol=1e-5)
        idx = ctx.from_numpy(np.array([2, 0], dtype=np.int32))
        np.testing.assert_array_equal(compute(ctx, ctx.get_rows(tw, idx)), w[[2, 0]])
        np.testing.assert_array_equal(compute(ctx, ctx.concat(tb, tb, 1)), np.concatenate([b, b], 0))
        np.testing.assert_allclose(compute(ctx, ctx.reshape(tb, 32)), b.reshape(32))


def test_view_of_a_row():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with Context(1 << 20) as ctx:
        t = ctx.from_numpy(x)
        row1 = ctx.view(t, [4], offset=t.nb[1])
        np.testing.assert_array_equal(row1.numpy(), x[1])
        with pytest.raises(ValueError, match="outside"):
            ctx.view(t, [4, 3], offset=t.nb[1])


def test_ggml_asserts_become_exceptions():
    with Context(1 << 20) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4, 3])
        b = ctx.new_tensor(GGMLType.F32, [3, 4])
        with pytest.raises(ValueError, match="tile"):
            ctx.add(a, b)
        with pytest.raises(ValueError, match="mul_mat"):
            ctx.mul_mat(a, b)
        with pytest.raises(ValueError, match="reshape"):
            ctx.reshape(a, 5)
        with pytest.raises(ValueError, match="permutation"):
            ctx.permute(a, 0, 0, 1, 2)
        with pytest.raises(TypeError, match="I32"):
            ctx.get_rows(a, b)
        with pytest.raises(ValueError, match="block size"):
            ctx.new_tensor(GGMLType.Q4_0, [33])
        with pytest.raises(ValueError, match="dims"):
            ctx.new_tensor(GGMLType.F32, [1, 2, 3, 4, 5])
        with pytest.raises(ValueError):
            ctx.new_tensor(999, [4])
        with pytest.raises(TypeError):
            ctx.add(a, np.ones(3))
        with pytest.raises(ValueError, match="63"):
            a.name = "x" * 64
        with pytest.raises(ValueError, match="no data"):
            Context.for_tensors(4).new_tensor(GGMLType.F32, [4]).numpy()


def test_convolution_pooling_padding_and_flash_attention_match_numpy():
    X = rng.standard_normal((3, 10, 12)).astype(np.float32)           # C, H, W
    K = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)          # OC, IC, KH, KW
    Q = rng.standard_normal((2, 5, 8)).astype(np.float32)             # heads, queries, dim
    Kc = rng.standard_normal((2, 7, 8)).astype(np.float16)
    V = rng.standard_normal((2, 7, 8)).astype(np.float16)
    with Context(64 << 20) as ctx:
        x, k = ctx.from_numpy(X), ctx.from_numpy(K)
        conv = ctx.conv_2d(k, x, 1, 1, 1, 1)
        pool = ctx.pool_2d(x, "max", 2, 2, 2, 2)
        padded = ctx.pad(x, 1, 2)
        fa = ctx.flash_attn(ctx.from_numpy(Q), ctx.from_numpy(Kc), ctx.from_numpy(V), scale=0.3)
        g = ctx.new_graph(64)
        for t in (conv, pool, padded, fa):
            g.build_forward(t)
        graph_compute(g, n_threads=2)
        Xp = np.pad(X, ((0, 0), (1, 1), (1, 1)))
        ref = np.einsum("chwij,ocij->ohw", np.lib.stride_tricks.sliding_window_view(Xp, (3, 3), axis=(1, 2)),
                        K.astype(np.float32))
        np.testing.assert_allclose(conv.numpy(), ref, atol=0.01)      # im2col rounds to F16
        np.testing.assert_array_equal(pool.numpy(), X.reshape(3, 5, 2, 6, 2).max(axis=(2, 4)))
        np.testing.assert_array_equal(padded.numpy(), np.pad(X, ((0, 0), (0, 2), (0, 1))))
        s = 0.3 * Q @ Kc.astype(np.float32).transpose(0, 2, 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        att = (p / p.sum(-1, keepdims=True)) @ V.astype(np.float32)    # heads, queries, dim
        np.testing.assert_allclose(fa.numpy().transpose(1, 0, 2), att, atol=2e-3)
        with pytest.raises(ValueError, match="strides"):
            ctx.conv_2d(k, x, 0, 1)
        with pytest.raises(ValueError, match="channels"):
            ctx.conv_2d(ctx.from_numpy(K[:, :2]), x)
        with pytest.raises(ValueError, match="no output"):
            ctx.pool_2d(x, "max", 20, 20, 1, 1)
        with pytest.raises(TypeError, match="F16"):
            ctx.flash_attn(ctx.from_numpy(Q), ctx.from_numpy(Kc), ctx.from_numpy(V), mask=ctx.from_numpy(Q))


def test_python_function_as_a_ggml_op():
    from pyggml.core.ops import host_array

    x = rng.standard_normal((6, 10)).astype(np.float32)
    y = rng.standard_normal((6, 10)).astype(np.float32)
    threads = set()

    def hypot(dst, a, b, ith, nth):
        threads.add((ith, nth))
        rows = slice(ith * 6 // nth, (ith + 1) * 6 // nth)   # NumPy rows = ne[1]
        host_array(dst)[rows] = np.hypot(host_array(a)[rows], host_array(b)[rows])

    with Context(1 << 20) as ctx:
        ta, tb = ctx.from_numpy(x), ctx.from_numpy(y)
        out = ctx.map_custom(hypot, ta, tb) * 2.0
        graph_compute(ctx.new_graph().build_forward(out), n_threads=2)
        np.testing.assert_allclose(out.numpy(), 2 * np.hypot(x, y), rtol=1e-6)
        assert threads == {(0, 2), (1, 2)}

        def broken(dst, a, ith, nth):
            raise ZeroDivisionError("inside a ggml worker")

        bad = ctx.map_custom(broken, ta)
        with pytest.raises(ZeroDivisionError, match="worker"):
            graph_compute(ctx.new_graph().build_forward(bad), n_threads=2)
        with pytest.raises(ValueError):
            ctx.map_custom(broken)


def test_every_op_of_ggml_h_is_reachable_and_tried_in_a_fork_first():
    """Ops without a checked method go through Context.op: ggml aborting in a forked trial
    (construction or CPU compute) becomes ValueError with ggml's message."""
    from pyggml.core.ops import op_constructors

    assert len(op_constructors()) > 200
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with Context(1 << 22) as ctx:
        a = ctx.from_numpy(x)
        rolled = ctx.roll(a, 3, 1, 0, 0)                       # ggml_roll via __getattr__
        filled = ctx.op("fill", a, 2.5)
        g = ctx.new_graph().build_forward(rolled).build_forward(filled)
        graph_compute(g)
        np.testing.assert_array_equal(rolled.numpy(), np.roll(np.roll(x, 3, axis=1), 1, axis=0))
        np.testing.assert_array_equal(filled.numpy(), np.full_like(x, 2.5))
        with pytest.raises(ValueError, match=r"GGML_ASSERT\(a->type == GGML_TYPE_F32\)"):
            ctx.op("win_part", ctx.from_numpy(np.ones(3, np.int8)), 2)      # construction aborts
        counted = ctx.op("count_equal", a, a)                               # the CPU kernel aborts
        with pytest.raises(ValueError, match="would abort"):
            graph_compute(ctx.new_graph().build_forward(counted))
        with pytest.raises(AttributeError):
            ctx.op("not_an_op", a)



def test_get_rel_pos_matches_segment_anythings_indexing():
    """ggml_get_rel_pos, an op of ggml.h whose name starts like the context's look-ups: a checked
    method. The reference is Segment Anything's ``get_rel_pos`` (image_encoder.py) for equal
    sizes: ``rel_pos[(q - k) + (k_size - 1)]``, NumPy (q, k, C)."""
    size, C = 5, 3
    table = rng.standard_normal((2 * size - 1, C)).astype(np.float16)   # NumPy (2*size-1, C)
    q = np.arange(size)[:, None]
    k = np.arange(size)[None, :]
    want = table[(q - k) + (size - 1)]                                  # (q, k, C)
    with Context(1 << 20) as ctx:
        t = ctx.from_numpy(table)
        out = ctx.get_rel_pos(t, size, size)
        assert out.ne == (C, size, size, 1) and out.type_name == "f16"
        np.testing.assert_array_equal(compute(ctx, out), want)
        assert ctx.op("get_rel_pos", t, size, size).ne == out.ne        # Context.op routes to the method
        with pytest.raises(ValueError, match="must be equal"):
            ctx.get_rel_pos(t, size, size - 1)
        with pytest.raises(ValueError, match="2\\*qh - 1"):
            ctx.get_rel_pos(t, size - 1, size - 1)
        with pytest.raises(TypeError, match="F16"):
            ctx.get_rel_pos(ctx.from_numpy(table.astype(np.float32)), size, size)
        with pytest.raises(ValueError, match="contiguous"):
            ctx.get_rel_pos(ctx.transpose(ctx.from_numpy(np.zeros((C, 2 * size - 1), np.float16))), size, size)


# ------------------------------------------------------------------ new in ggml 0.25
new_in_025 = pytest.mark.skipif(not hasattr(lib, "ggml_swiglu_clamp"), reason="built with ggml < 0.25")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@new_in_025
def test_ops_new_in_ggml_025_match_numpy():
    a = (rng.standard_normal((3, 8)) * 4).astype(np.float32)
    b = (rng.standard_normal((3, 8)) * 4).astype(np.float32)
    x = rng.standard_normal((5, 3, 8)).astype(np.float32)   # NumPy (n_tokens, hc, n_embd)
    gate = rng.standard_normal((5, 3, 8)).astype(np.float32)
    with Context(16 << 20) as ctx:
        ta, tb, tx, tg = ctx.from_numpy(a), ctx.from_numpy(b), ctx.from_numpy(x), ctx.from_numpy(gate)
        g, u = np.minimum(a, 2.5), np.clip(b, -2.5, 2.5)
        np.testing.assert_allclose(compute(ctx, ctx.swiglu_clamp(ta, tb, 2.5)), g * _sigmoid(g) * u, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compute(ctx, ctx.dsv4_hc_pre_gated(tx, tg, 0.5)),
                                   0.5 * (x * _sigmoid(gate)).sum(axis=1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compute(ctx, ctx.clamp_inplace(ta, -1.0, 1.0)), np.clip(a, -1, 1))
        with pytest.raises(ValueError, match="same"):
            ctx.swiglu_clamp(ta, tx, 1.0)
        with pytest.raises(ValueError, match="n_embd, hc, n_tokens"):
            ctx.dsv4_hc_pre_gated(tx, ta, 1.0)


@new_in_025
def test_rope_offset_rotates_a_block_of_each_row():
    x = rng.standard_normal((1, 4, 2, 16)).astype(np.float32)   # ne [16, 2, 4, 1]
    pos = np.arange(4, dtype=np.int32)
    with Context(16 << 20) as ctx:
        tx, tp = ctx.from_numpy(x), ctx.from_numpy(pos)
        shifted = ctx.rope(tx, tp, 8, mode=2).set_rope_offset(4)
        assert shifted.params["n_offs"] == 4
        block = ctx.rope(ctx.cont(ctx.view(tx, [8, 2, 4], offset=4 * 4)), tp, 8, mode=2)
        out, ref = compute(ctx, shifted), compute(ctx, block)
        np.testing.assert_array_equal(out[..., 4:12], ref.reshape(out[..., 4:12].shape))
        np.testing.assert_array_equal(out[..., :4], x[0, ..., :4])
        np.testing.assert_array_equal(out[..., 12:], x[0, ..., 12:])
        for bad in (3, -2, 10):
            with pytest.raises(ValueError, match="offset"):
                ctx.rope(tx, tp, 8, mode=2).set_rope_offset(bad)
        with pytest.raises(ValueError, match="ROPE"):
            tx.set_rope_offset(2)


@new_in_025
def test_precision_and_sparse_kv_settings_are_written_to_the_node():
    from pyggml.enums import Prec

    with Context.for_tensors(16) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [8, 4])
        mm = ctx.mul_mat(a, a).set_prec(acc=Prec.F32, src={1: Prec.F16})
        assert mm.op_params[0] == Prec.F32 and mm.op_params[3] == Prec.F16
        with pytest.raises(ValueError, match="source 0"):
            mm.set_prec(src={0: Prec.F16})
        with pytest.raises(ValueError, match="accumulator"):
            ctx.add(a, a).set_prec(acc=Prec.F32)
        q = ctx.new_tensor(GGMLType.F32, [8, 2, 2, 1])
        fa = ctx.flash_attn(q, q, q).set_flash_attn_n_kv_max(3)
        assert fa.op_params[4] == 3
        with pytest.raises(ValueError, match="FLASH_ATTN_EXT"):
            mm.set_flash_attn_n_kv_max(3)


def test_functions_of_a_later_ggml_say_so():
    """What a ggml lacks is learnt from the generated declarations (pyggml.raw.requires, which
    the Pythonic layer uses for what not every pinned ggml has): the error names the ggml that
    was built."""
    from pyggml.raw import requires
    assert requires("ggml_swiglu_clamp") is lib.ggml_swiglu_clamp
    with pytest.raises(AttributeError, match=f"ggml_fly is not in ggml {pyggml.GGML_VERSION}"):
        requires("ggml_fly")


def test_ne_and_type_known_to_the_constructors_are_the_ones_ggml_wrote():
    """The op constructors compute a node's ne and type as ggml.c does instead of reading them
    back (``Context._node``), and some mark their results contiguous (``Tensor._contig``, which
    later contiguity checks read instead of calling ``ggml_is_contiguous``); every such
    constructor, over shapes that tile, is checked here against the C struct."""
    ctx = pyggml.Context.for_tensors(256)
    a = ctx.new_tensor("f32", [8, 6, 4, 2])
    b = ctx.new_tensor("f32", [8, 3, 2, 1])
    h = ctx.new_tensor("f16", [8, 6, 4, 2])
    w = ctx.new_tensor("q8_0", [32, 5])
    x = ctx.new_tensor("f32", [32, 7, 3])
    rows = ctx.new_tensor("i32", [5, 4, 2])
    ids = ctx.new_tensor("i32", [3])
    tab = ctx.new_tensor("i32", [8, 6])
    pos = ctx.new_tensor("i32", [4])
    mask = ctx.new_tensor("f16", [8, 6])
    made = [
        ctx.add(a, b), ctx.sub(h, h), ctx.mul(a, a), ctx.div(a, b), ctx.scale(h, 2.0),
        ctx.norm(a), ctx.rms_norm(h), ctx.l2_norm(a), ctx.soft_max(a, mask, 0.5),
        ctx.mul_mat(w, x), ctx.mul_mat(b, a),
        ctx.cont(ctx.transpose(a)), ctx.transpose(h), ctx.permute(a, 2, 0, 3, 1), ctx.permute(a, 1, 0),
        ctx.reshape(a, 48, 8), ctx.reshape(a, 384), ctx.reshape(h, 8, 6, 8),
        ctx.view(a, [8, 3], offset=0), ctx.view(a, [4]), ctx.view(h, [8, 2, 2], [16, 96]),
        ctx.get_rows(a, rows), ctx.get_rows(w, ids), ctx.get_rows(tab, ids),
        ctx.rope(a, pos, 4), ctx.rope(h, pos, 8, mode=lib.GGML_ROPE_TYPE_NEOX),
        *(ctx.unary(name, a) for name in pyggml.core.ops.UNARY_OPS),
    ]
    for t in made:
        assert t.ne == tuple(t.ptr.ne), t
        assert t.type == t.ptr.type, t
        assert t._contig in (None, bool(lib.ggml_is_contiguous(t.ptr))), t
    assert sum(t._contig is True for t in made) >= 15


def test_a_node_of_an_allocating_context_gives_no_data_to_another_contexts_tensors():
    """A node made in an allocating context from a view of another context's tensor that has no
    data yet gave that tensor memory in the node's context's arena (Context._give_data walked every
    source without data): Tensor.set then wrote into a context that is not the tensor's, and
    after that context was closed the tensor read its freed arena with no error
    (scripts/fuzz.sh seed 102: t294.set was to raise ValueError, returned None)."""
    with Context(1 << 20, no_alloc=True) as plan, Context(1 << 20) as work:
        t = plan.new_tensor(GGMLType.I32, [5, 5, 5, 2])
        out = work.neg(work.cast(work.permute(t, 1, 0, 2, 3), GGMLType.F32))
        assert out._ptr.data != ffi.NULL  # the new nodes of `work` get data
        assert t._ptr.data == ffi.NULL    # `plan`'s tensor does not
        with pytest.raises(ValueError, match="no data"):
            t.set(np.zeros(250, np.int32), reshape=True)


def test_a_closed_tensor_argument_is_reported_before_a_layout_or_shape_error():
    """Fuzz seed 6020: soft_max of a non-contiguous a with a mask from a closed context raised
    "needs a contiguous tensor" (checked first) instead of ClosedError. Every op constructor
    checks all its tensor arguments before anything else (soft_max, rope's freq_factors, the
    glu ops, flash_attn's mask)."""
    from pyggml import ClosedError
    ctx = pyggml.Context.for_tensors(64)
    gone = pyggml.Context.for_tensors(8)
    mask = gone.new_tensor("f32", [4, 4])
    ff = gone.new_tensor("f32", [2])
    b = gone.new_tensor("f32", [4, 4])
    mask16 = gone.new_tensor("f16", [4, 4])
    gone.close()
    a = ctx.new_tensor("f32", [4, 4])
    pos = ctx.new_tensor("i32", [4])
    with pytest.raises(ClosedError):
        ctx.soft_max(ctx.transpose(a), mask)
    with pytest.raises(ClosedError):
        ctx.rope(a, pos, 3, freq_factors=ff)              # odd n_dims checked after the tensors
    with pytest.raises(ClosedError):
        ctx.swiglu(ctx.transpose(a), b)
    with pytest.raises(ClosedError):
        ctx.flash_attn(a, ctx.new_tensor("f32", [5, 4]), a, mask16)


def test_cpy_and_set_rows_refuse_overlapping_views():
    """Fuzz seed 17026: cpy(transpose(x), x) copied x's elements over each other (ggml copies in
    place, element by element) and read back neither x nor its transpose, silently. A copy
    that reads the memory it writes in another layout is refused; disjoint views of one tensor,
    and the identical view (a no-op), still copy."""
    x = rng.standard_normal((4, 6)).astype(np.float32)
    with Context(1 << 20) as ctx:
        tx = ctx.from_numpy(x)
        with pytest.raises(ValueError, match="cpy"):
            ctx.cpy(ctx.transpose(ctx.view(tx, (4, 4), offset=0)), ctx.view(tx, (4, 4), offset=0))
        row = 6 * 4
        with pytest.raises(ValueError, match="cpy"):  # rows 0..1 into rows 1..2: overlapping
            ctx.cpy(ctx.view(tx, (6, 2), offset=0), ctx.view(tx, (6, 2), offset=row))
        same = ctx.cpy(tx, tx)
        np.testing.assert_array_equal(compute(ctx, same), x)
        moved = ctx.cpy(ctx.view(tx, (6, 2), offset=0), ctx.view(tx, (6, 2), offset=2 * row))
        want = x.copy()
        want[2:4] = x[0:2]
        np.testing.assert_array_equal(compute(ctx, moved), x[0:2])
        np.testing.assert_array_equal(tx.numpy(), want)
        idx = ctx.from_numpy(np.array([1, 0], dtype=np.int32))
        with pytest.raises(ValueError, match="set_rows"):
            ctx.set_rows(tx, ctx.view(tx, (6, 2), offset=0), idx)


def test_dim_0_of_a_block_quantized_tensor_cannot_move():
    """A Q4_0 row is whole blocks of 32 along ne[0]: a transpose, or a permute moving dim 0, has
    no meaning, and ggml's kernels read such a view as packed (wrong values or NaN on the CPU
    and in ggml-blas; for rows of one block its strides even equal a contiguous tensor's).
    Permutes that keep dim 0 stay allowed (llama.cpp permutes quantized KV caches so)."""
    with Context.for_tensors(8) as ctx:
        q = ctx.new_tensor(GGMLType.Q4_0, [32, 32, 2])
        with pytest.raises(ValueError, match="transpose: q4_0 is block-quantized"):
            ctx.transpose(q)
        for axes in ((1, 0), (2, 1, 0), (1, 2, 0, 3)):
            with pytest.raises(ValueError, match="permute: q4_0 is block-quantized"):
                ctx.permute(q, *axes)
        assert ctx.permute(q, 0, 2, 1).ne == (32, 2, 32, 1)
        f = ctx.new_tensor(GGMLType.F16, [32, 32])
        assert ctx.transpose(f).ne == (32, 32, 1, 1)


def test_blas_kernel_table_refuses_what_ggml_blas_computes_wrong():
    """pyggml.backends.blas.blas_kernel_supports (pure ne/nb conditions, checked in any build):
    ggml-blas's OUT_PROD reads a transposed src1 as the transpose of a packed matrix (a padded
    one gave wrong values), and its MUL_MAT asserts an ordered result (an empty batch aborted)."""
    from pyggml.backends.blas import blas_kernel_supports

    with Context.for_tensors(16) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [64, 40])
        packed = ctx.new_tensor(GGMLType.F32, [40, 48])
        padded = ctx.view(ctx.new_tensor(GGMLType.F32, [48, 48]), [40, 48], [48 * 4], 0)
        assert blas_kernel_supports(ctx.out_prod(a, ctx.transpose(packed)))
        assert not blas_kernel_supports(ctx.out_prod(a, ctx.transpose(padded)))
        assert blas_kernel_supports(ctx.out_prod(a, ctx.new_tensor(GGMLType.F32, [48, 40])))
        w = ctx.new_tensor(GGMLType.F32, [64, 48, 2])
        assert blas_kernel_supports(ctx.mul_mat(w, ctx.new_tensor(GGMLType.F32, [64, 40, 2])))
        assert not blas_kernel_supports(ctx.mul_mat(w, ctx.new_tensor(GGMLType.F32, [64, 40, 0, 1])))
