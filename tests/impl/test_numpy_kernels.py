"""The NumPy backend's kernels (pyggml.impl.numpy) against ggml's own CPU backend.

Every case builds the same graph twice from the same input values: once computed by the CPU
backend, once node by node with ``numpy_ops.compute`` (after checking ``numpy_ops.supports`` and
poisoning every freshly allocated node with NaN bytes, so unwritten output shows up). Float
results are compared with test-backend-ops' NMSE criterion (1e-7; 5e-4 for matrix products,
1e-6 for soft_max, as test-backend-ops), integer and copied results exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import pyggml
from pyggml import ffi, lib, types
from pyggml.impl import numpy as numpy_ops
from pyggml.core.ops import host_array
from pyggml.backends.cpu import graph_compute

F32, F16, BF16 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, lib.GGML_TYPE_BF16
I32, I64 = lib.GGML_TYPE_I32, lib.GGML_TYPE_I64
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = (lib.GGML_TYPE_Q4_0, lib.GGML_TYPE_Q4_1, lib.GGML_TYPE_Q5_0,
                                lib.GGML_TYPE_Q5_1, lib.GGML_TYPE_Q8_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (lib.GGML_TYPE_Q2_K, lib.GGML_TYPE_Q3_K, lib.GGML_TYPE_Q4_K,
                                lib.GGML_TYPE_Q5_K, lib.GGML_TYPE_Q6_K)
IQ4_NL = lib.GGML_TYPE_IQ4_NL
MEM = 64 * 1024 * 1024
TN = {F32: "f32", F16: "f16", BF16: "bf16", I32: "i32", I64: "i64"}


def tname(t: int) -> str:
    return types.type_name(t)


# ------------------------------------------------------------------------------------ harness

def rand(ne, lo=-1.0, hi=1.0, seed=0):
    """Uniform values of ggml shape ne (returned in NumPy order)."""
    return np.random.default_rng(seed).uniform(lo, hi, size=tuple(ne)[::-1]).astype(np.float32)


def make(ctx, values, t):
    """A tensor of type t holding values (NumPy order; F16/BF16/quantized are rounded by ggml)."""
    values = np.asarray(values)
    dt = types.numpy_dtype(t)
    if dt is not None and t != BF16:
        return ctx.from_numpy(values.astype(dt))
    x = ctx.new_tensor(t, values.shape[::-1])
    x.set(values.astype(np.float32))
    return x


def read(t):
    """The data of tensor t: ('f', float64 array) or ('i', int array) or ('q', bytes, floats)."""
    p = t.ptr
    if types.numpy_dtype(p.type) is not None:
        a = np.array(host_array(t))
        if p.type == BF16:
            return "f", (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if a.dtype.kind in "iu":
            return "i", a
        return "f", a.astype(np.float64)
    raw = np.frombuffer(ffi.buffer(p.data, t.nbytes), np.uint8).copy()
    return "q", raw, types.to_float32(raw, p.type).astype(np.float64)


def nmse(ref, got):
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    assert ref.shape == got.shape
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(fin, np.isfinite(got), err_msg="non-finite values differ")
    np.testing.assert_array_equal(ref[~fin], got[~fin], err_msg="non-finite values differ")
    r, g = ref[fin], got[fin]
    den = float(np.sum(r * r))
    num = float(np.sum((r - g) ** 2))
    return num / den if den > 0 else num


def poison(node):
    """Fill a freshly allocated node with 0xFF bytes (NaN for floats) before computing it."""
    p = node.ptr
    if p.view_src == ffi.NULL and p.data != ffi.NULL and node.nbytes:
        np.frombuffer(ffi.buffer(p.data, node.nbytes), np.uint8)[:] = 0xFF


def compute_numpy(graph):
    nodes = graph.nodes
    for n in nodes:
        assert numpy_ops.supports(n), f"numpy_ops does not support {n!r} srcs {[s.type_name for s in n.src]}"
    for n in nodes:
        poison(n)
    # as a backend's graph_compute sees them: raw struct ggml_tensor * from ggml_graph_node
    for i in range(lib.ggml_graph_n_nodes(graph.ptr)):
        numpy_ops.compute(lib.ggml_graph_node(graph.ptr, i))


def run_both(build, inputs, raw_cpu=False):
    """(CPU result, numpy_ops result) of build(ctx, *tensors) for inputs [(values, type), ...].

    raw_cpu: skip pyggml's conservative CPU kernel check (pyggml.backends.cpu.cpu_kernel_supports) for
    type combinations the CPU kernels do handle (BF16 in unary-ops.cpp)."""
    out = []
    for cpu in (True, False):
        with pyggml.Context(MEM) as ctx:
            ts = [make(ctx, v, t) for v, t in inputs]
            res = build(ctx, *ts)
            g = ctx.new_graph().build_forward(res)
            if cpu and raw_cpu:
                with pyggml.CPUBackend(n_threads=2) as be:
                    assert lib.ggml_backend_graph_compute(be.ptr, g.ptr) == lib.GGML_STATUS_SUCCESS
            elif cpu:
                graph_compute(g, n_threads=2)
            else:
                compute_numpy(g)
            out.append(read(res))
    return out


def check(build, inputs, tol=1e-7, raw_cpu=False):
    ref, got = run_both(build, inputs, raw_cpu)
    assert ref[0] == got[0]
    if ref[0] == "i":
        np.testing.assert_array_equal(ref[1], got[1])
        return 0.0
    if ref[0] == "q":
        np.testing.assert_array_equal(ref[1], got[1], err_msg="quantized bytes differ")
        return 0.0
    err = nmse(ref[1], got[1])
    assert err <= tol, f"NMSE {err:.3g} > {tol:g}"
    return err


def wrap(ctx, ptr, *inputs):
    """A node made with a raw ggml call (ops pyggml has no checked method for) as a Tensor."""
    return pyggml.Tensor(ptr, ctx)


# ------------------------------------------------------------------------------------ binary

BIN = {"add": lib.ggml_add, "sub": lib.ggml_sub, "mul": lib.ggml_mul, "div": lib.ggml_div}
BIN_SHAPES = [
    ([16, 5, 4, 3], [16, 5, 4, 3]),
    ([16, 5, 4, 3], [16, 1, 1, 1]),
    ([16, 5, 4, 3], [1, 5, 1, 3]),
    ([16, 6, 4, 3], [8, 3, 2, 1]),     # real tiling, not NumPy's size-1 broadcasting
    ([10, 5, 4, 3], [10, 5, 4, 3]),
]


@pytest.mark.parametrize("op", sorted(BIN))
@pytest.mark.parametrize("shapes", BIN_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_binary_f32(op, shapes):
    a_ne, b_ne = shapes
    check(lambda c, a, b: wrap(c, BIN[op](c.ptr, a.ptr, b.ptr), a, b),
          [(rand(a_ne, seed=1), F32), (rand(b_ne, 0.5, 2.0, seed=2), F32)])


@pytest.mark.parametrize("op", sorted(BIN))
@pytest.mark.parametrize("ta,tb", [(F16, F16), (F16, F32), (BF16, BF16), (BF16, F32)],
                         ids=lambda t: TN[t])
def test_binary_types(op, ta, tb):
    check(lambda c, a, b: wrap(c, BIN[op](c.ptr, a.ptr, b.ptr), a, b),
          [(rand([16, 6, 4, 3], seed=3), ta), (rand([8, 3, 2, 1], 0.5, 2.0, seed=4), tb)])


@pytest.mark.parametrize("op", sorted(BIN))
def test_binary_noncontiguous(op):
    # src0 permuted (rows stay packed), src1 transposed (strided rows)
    def build(c, a, b):
        ap = c.permute(a, 0, 2, 1, 3)                 # [12, 4, 5, 2]
        bt = c.transpose(b)                           # [12, 4, 1, 1]
        return wrap(c, BIN[op](c.ptr, ap.ptr, bt.ptr), ap, bt)
    check(build, [(rand([12, 5, 4, 2], seed=5), F32), (rand([4, 12], 0.5, 2.0, seed=6), F32)])


def test_binary_into_inplace_view():
    def build(c, a, b):
        return wrap(c, lib.ggml_add_inplace(c.ptr, a.ptr, b.ptr), a, b)
    check(build, [(rand([16, 6, 3], seed=7), F32), (rand([16, 1, 3], seed=8), F32)])


def test_add1_acc_set():
    check(lambda c, a, b: wrap(c, lib.ggml_add1(c.ptr, a.ptr, b.ptr), a, b),
          [(rand([7, 5, 3], seed=1), F32), (rand([1], seed=2), F32)])
    check(lambda c, a, b: wrap(c, lib.ggml_add1(c.ptr, a.ptr, b.ptr), a, b),
          [(rand([7, 5, 3], seed=1), F16), (rand([1], seed=2), F32)])
    # acc/set: b written at byte offset into a viewed with a's row strides
    for fn in (lib.ggml_acc, lib.ggml_set):
        def build(c, a, b, fn=fn):
            return wrap(c, fn(c.ptr, a.ptr, b.ptr, a.nb[1], a.nb[2], a.nb[3], 2 * 4 + a.nb[1]), a, b)
        check(build, [(rand([10, 6, 3], seed=3), F32), (rand([4, 3, 2], seed=4), F32)])

    def build_i32(c, a, b):
        return wrap(c, lib.ggml_set(c.ptr, a.ptr, b.ptr, a.nb[1], a.nb[2], a.nb[3], 4), a, b)
    ints = np.arange(60, dtype=np.int32).reshape(5, 12)
    check(build_i32, [(ints, I32), (np.full((2, 3), -7, np.int32), I32)])


# ------------------------------------------------------------------------------------ unary

UNARY_NAMES = ["abs", "sgn", "neg", "step", "tanh", "elu", "relu", "sigmoid", "gelu", "gelu_erf",
               "gelu_quick", "silu", "hardswish", "hardsigmoid", "exp", "expm1", "softplus",
               "floor", "ceil", "round", "trunc"]


def unary_input(seed=0):
    x = rand([37, 5, 3], -12.0, 12.0, seed=seed)
    x.reshape(-1)[:8] = [-10.0, 10.0, -0.5, 0.5, 2.5, -2.5, 0.0, 1.5]   # cut-offs and round ties
    return x


@pytest.mark.parametrize("name", UNARY_NAMES)
@pytest.mark.parametrize("t", [F32, F16], ids=TN.get)
def test_unary(name, t):
    check(lambda c, a: c.unary(name, a), [(unary_input(1), t)])


@pytest.mark.parametrize("name", ["abs", "neg", "tanh", "sigmoid", "exp", "relu", "round"])
def test_unary_bf16(name):
    # these go through ggml-cpu/unary-ops.cpp, which has BF16 kernels
    check(lambda c, a: c.unary(name, a), [(unary_input(2), BF16)], raw_cpu=True)


@pytest.mark.parametrize("name", ["gelu", "silu", "neg", "exp"])
def test_unary_on_permuted_view(name):
    check(lambda c, a: c.unary(name, c.permute(a, 0, 2, 1, 3)), [(rand([16, 5, 4, 2], -4, 4, seed=3), F32)])


def test_unary_xielu():
    check(lambda c, a: wrap(c, lib.ggml_xielu(c.ptr, a.ptr, 0.8, 0.8, 0.5, -1e-6), a),
          [(unary_input(4), F32)])


@pytest.mark.parametrize("name", ["sqr", "sqrt", "log", "sin", "cos"])
@pytest.mark.parametrize("t", [F32, F16], ids=TN.get)
def test_math_ops(name, t):
    check(lambda c, a: c.unary(name, a), [(rand([33, 4, 3], 0.01, 6.0, seed=5), t)])


def test_gelu_matches_cpu_table_not_exact_formula():
    """The CPU's F32 GELU goes through an F16 table: document how far that is from the exact
    tanh formula (numpy_ops reproduces the CPU, see test_unary)."""
    x = np.linspace(-9.5, 9.5, 4001, dtype=np.float32)
    (_, ref), (_, got) = run_both(lambda c, a: c.gelu(a), [(x, F32)])
    np.testing.assert_array_equal(ref, got)  # numpy_ops reproduces the table bit for bit
    exact = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x.astype(np.float64) ** 2)))
    assert 1e-3 < np.abs(ref - exact).max() < 5e-3   # x rounded to F16: ~4e-3 off near x = 8
    assert 1e-8 < nmse(exact, ref) < 1e-7            # ... yet within test-backend-ops' tolerance


def test_clamp_leaky_scale():
    x = unary_input(6)
    for t in (F32, F16):
        check(lambda c, a: c.clamp(a, -2.5, 3.0), [(x, t)])
        check(lambda c, a: c.leaky_relu(a, 0.1), [(x, t)])
    check(lambda c, a: c.scale(a, 0.37), [(x, F32)])
    check(lambda c, a: wrap(c, lib.ggml_scale_bias(c.ptr, a.ptr, 0.37, -1.25), a), [(x, F32)])


# ------------------------------------------------------------------------------------ glu

GLU_OPS = {"reglu": lib.GGML_GLU_OP_REGLU, "geglu": lib.GGML_GLU_OP_GEGLU,
           "swiglu": lib.GGML_GLU_OP_SWIGLU, "geglu_erf": lib.GGML_GLU_OP_GEGLU_ERF,
           "geglu_quick": lib.GGML_GLU_OP_GEGLU_QUICK, "swiglu_clamp": lib.GGML_GLU_OP_SWIGLU_CLAMP}


@pytest.mark.parametrize("name", sorted(GLU_OPS))
@pytest.mark.parametrize("t", [F32, F16], ids=TN.get)
@pytest.mark.parametrize("variant", ["fused", "swapped", "split"])
def test_glu(name, t, variant):
    op = GLU_OPS[name]
    x = rand([32, 5, 3], -11, 11, seed=7)
    if variant == "split":
        check(lambda c, a, b: wrap(c, lib.ggml_glu_split(c.ptr, a.ptr, b.ptr, op), a, b),
              [(x, t), (rand([32, 5, 3], seed=8), t)])
    else:
        check(lambda c, a: wrap(c, lib.ggml_glu(c.ptr, a.ptr, op, variant == "swapped"), a), [(x, t)])


def test_swiglu_oai():
    check(lambda c, a, b: wrap(c, lib.ggml_swiglu_oai(c.ptr, a.ptr, b.ptr, 1.702, 7.0), a, b),
          [(rand([32, 5, 3], -9, 9, seed=9), F32), (rand([32, 5, 3], -9, 9, seed=10), F32)])


@pytest.mark.parametrize("t", [F32, F16], ids=TN.get)
def test_swiglu_clamp_limit(t):
    """The clamp of SWIGLU_CLAMP bites: inputs well beyond the limit on both sides."""
    check(lambda c, a, b: wrap(c, lib.ggml_swiglu_clamp(c.ptr, a.ptr, b.ptr, 2.5), a, b),
          [(rand([32, 5, 3], -9, 9, seed=11), t), (rand([32, 5, 3], -9, 9, seed=12), t)])


def _with_variant(node, index: int, value: int):
    """``node`` with op_params[index] set to ``value`` (the sub-op of UNARY, GLU, ARGSORT...)."""
    ffi.cast("int32_t *", node.ptr.op_params)[index] = value
    return node


def test_sub_op_claims_are_explicit():
    """UNARY, GLU, ARGSORT, TRI and ROPE claim exactly the sub-ops (modes) their kernels
    compute: every GLU op of this ggml is claimed (and checked against the CPU in test_glu), and a
    sub-op a newer ggml would add (the enum's COUNT) is not supported, whatever the rest of the
    node says."""
    glu = numpy_ops.OPS[lib.GGML_OP_GLU]
    tested = set(GLU_OPS.values()) | {lib.GGML_GLU_OP_SWIGLU_OAI}  # test_glu, test_swiglu_oai
    assert glu.variants == frozenset(range(lib.GGML_GLU_OP_COUNT)) == tested
    assert numpy_ops.OPS[lib.GGML_OP_UNARY].variants == frozenset(range(lib.GGML_UNARY_OP_COUNT))
    with pyggml.Context(MEM) as c:
        a = c.from_numpy(rand([16, 4, 6]))
        pos = c.from_numpy(np.arange(6, dtype=np.int32))
        nodes = {
            "unary": (c.unary("silu", a), 0, lib.GGML_UNARY_OP_COUNT),
            "glu": (wrap(c, lib.ggml_glu(c.ptr, a.ptr, lib.GGML_GLU_OP_SWIGLU, False), a), 0,
                    lib.GGML_GLU_OP_COUNT),
            "argsort": (wrap(c, lib.ggml_argsort(c.ptr, a.ptr, lib.GGML_SORT_ORDER_ASC), a), 0, 2),
            "tri": (wrap(c, lib.ggml_tri(c.ptr, c.from_numpy(rand([6, 6])).ptr, lib.GGML_TRI_TYPE_LOWER)),
                    0, 4),
            "rope": (c.rope(a, pos, 16, mode=0), 2, 1),
        }
        for what, (node, index, new) in nodes.items():
            assert numpy_ops.supports(node), what
            assert not numpy_ops.supports(_with_variant(node, index, new)), what
            with pytest.raises(ValueError, match="cannot compute"):
                numpy_ops.compute(node)


# ------------------------------------------------------------------------------------ reductions

@pytest.mark.parametrize("t", [F32, F16], ids=TN.get)
def test_sum_and_rows(t):
    x = rand([33, 5, 4, 2], seed=11)
    check(lambda c, a: c.sum(a), [(x, t)])
    if t == F32:
        check(lambda c, a: c.sum_rows(a), [(x, t)])
        check(lambda c, a: c.mean(a), [(x, t)])
        check(lambda c, a: c.sum_rows(c.permute(a, 0, 2, 1, 3)), [(x, t)])
        check(lambda c, a: wrap(c, lib.ggml_cumsum(c.ptr, a.ptr), a), [(x, t)])


def test_argmax_argsort_topk():
    x = rand([50, 7], seed=12)
    x[3, [5, 40]] = 2.0                       # tie: the CPU returns the last index
    x[4, :] = -np.inf
    check(lambda c, a: c.argmax(a), [(x, F32)])
    y = rand([40, 6, 3], seed=13)              # distinct values: std::sort ties are unspecified
    check(lambda c, a: c.argsort(a), [(y, F32)])
    check(lambda c, a: c.argsort(a, descending=True), [(y, F32)])
    check(lambda c, a: wrap(c, lib.ggml_top_k(c.ptr, a.ptr, 5), a), [(y, F32)])


def test_count_equal():
    rng = np.random.default_rng(14)
    a, b = rng.integers(0, 3, (6, 40)).astype(np.int32), rng.integers(0, 3, (6, 40)).astype(np.int32)
    check(lambda c, x, y: wrap(c, lib.ggml_count_equal(c.ptr, x.ptr, y.ptr), x, y), [(a, I32), (b, I32)])
    # 3-d: the CPU kernel's row index arithmetic is wrong when ne2/ne3 > 1 (it over-counts), so
    # numpy_ops is checked against NumPy itself
    a, b = rng.integers(0, 3, (2, 3, 40)).astype(np.int32), rng.integers(0, 3, (2, 3, 40)).astype(np.int32)
    with pyggml.Context(MEM) as c:
        x, y = c.from_numpy(a), c.from_numpy(b)
        n = wrap(c, lib.ggml_count_equal(c.ptr, x.ptr, y.ptr), x, y)
        numpy_ops.compute(n)
        assert n.numpy()[0] == np.count_nonzero(a == b)


# ------------------------------------------------------------------------------------ shape ops

@pytest.mark.parametrize("t", [F32, F16, I32], ids=TN.get)
def test_repeat_concat(t):
    x = (rand([6, 4, 2], -50, 50, seed=15)).astype(np.int32) if t == I32 else rand([6, 4, 2], seed=15)
    y = (rand([6, 4, 2], -50, 50, seed=16)).astype(np.int32) if t == I32 else rand([6, 4, 2], seed=16)
    check(lambda c, a, like: c.repeat(a, like), [(x, t), (np.zeros((3, 4, 8, 12), np.float32), F32)])
    for dim in range(4):
        check(lambda c, a, b: c.concat(a, b, dim), [(x, t), (y, t)])


def test_concat_noncontiguous():
    check(lambda c, a, b: c.concat(c.permute(a, 1, 0, 2, 3), b, 1),
          [(rand([5, 6, 3], seed=65), F32), (rand([6, 2, 3], seed=66), F32)])


def test_repeat_back():
    check(lambda c, a, like: wrap(c, lib.ggml_repeat_back(c.ptr, a.ptr, like.ptr), a, like),
          [(rand([12, 8, 6, 2], seed=17), F32), (np.zeros((1, 3, 4, 6), np.float32), F32)])


CPY_TYPES = [(F32, F16), (F16, F32), (F32, BF16), (BF16, F32), (F16, BF16), (BF16, F16),
             (F32, F32), (F16, F16), (F32, I32), (I32, F32)]


@pytest.mark.parametrize("ts,td", CPY_TYPES, ids=lambda t: TN[t])
def test_cpy_types(ts, td):
    x = rand([17, 6, 3], -300, 300, seed=18)
    if ts == I32:
        x = x.astype(np.int32)

    def build(c, a, b):
        return c.cpy(c.transpose(a), b)       # strided source
    check(build, [(x, ts), (np.zeros((3, 17, 6)), td)])


def test_cont_dup_and_view_destination():
    x = rand([8, 6, 5, 2], seed=19)
    check(lambda c, a: c.cont(c.permute(a, 2, 0, 3, 1)), [(x, F32)])
    check(lambda c, a: wrap(c, lib.ggml_dup(c.ptr, c.permute(a, 1, 0, 2, 3).ptr), a), [(x, F16)])

    def into_view(c, a, big):                  # dst is a strided view of a bigger tensor
        v = c.view(big, [8, 6, 5], [big.nb[1], big.nb[2]], offset=2 * big.nb[0])
        return c.cpy(c.view(a, [8, 6, 5], [a.nb[1], a.nb[2]]), v)
    check(into_view, [(x, F32), (np.ones((5, 7, 12), np.float32), F32)])
    check(into_view, [(x, F32), (np.ones((5, 7, 12), np.float32), F16)])


@pytest.mark.parametrize("tq", [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K], ids=tname)
def test_cpy_quantized(tq):
    n0 = 256 if types.block_size(tq) == 256 else 64
    x = rand([n0, 6, 2], -3, 3, seed=20)
    # to quantized: byte-identical to the CPU's quantizer; from quantized: exact dequantization
    check(lambda c, a, b: c.cpy(a, b), [(x, F32), (np.zeros((2, 6, n0)), tq)])
    check(lambda c, a, b: c.cpy(a, b), [(x, tq), (np.zeros((2, 6, n0)), F32)])


# ------------------------------------------------------------------------------------ norms

@pytest.mark.parametrize("name", ["norm", "rms_norm", "l2_norm"])
def test_norms(name):
    x = rand([64, 7, 3, 2], -2, 3, seed=21)
    fn = getattr(pyggml.Context, name)
    check(lambda c, a: fn(c, a, 1e-5), [(x, F32)])
    check(lambda c, a: fn(c, c.permute(a, 0, 2, 1, 3), 1e-5), [(x, F32)])


def test_group_norm_and_fused_rms_norm_mul():
    check(lambda c, a: wrap(c, lib.ggml_group_norm(c.ptr, a.ptr, 3, 1e-6), a),
          [(rand([8, 5, 7, 2], seed=22), F32)])
    # the CPU fuses RMS_NORM + MUL; numpy_ops computes the two nodes
    check(lambda c, a, w: c.rms_norm(a, 1e-6) * w, [(rand([64, 9], seed=23), F32), (rand([64], seed=24), F32)])


# ------------------------------------------------------------------------------------ mul_mat

MM_SHAPES = [
    ([32, 16, 1, 1], [32, 8, 1, 1]),
    ([32, 16, 1, 1], [32, 1, 1, 1]),
    ([32, 16, 2, 3], [32, 8, 4, 3]),      # src0 batches broadcast over src1's (i02 = i12 / 2)
    ([32, 16, 1, 1], [32, 8, 3, 2]),
    ([64, 10, 2, 1], [64, 7, 6, 1]),
    ([32, 16, 2, 2], [32, 3, 4, 6]),      # broadcast in dims 2 and 3
]


@pytest.mark.parametrize("shapes", MM_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ta", [F32, F16, BF16], ids=TN.get)
def test_mul_mat(shapes, ta):
    a_ne, b_ne = shapes
    err = check(lambda c, a, b: c.mul_mat(a, b), [(rand(a_ne, seed=25), ta), (rand(b_ne, seed=26), F32)],
                tol=5e-4)
    if ta == F32:
        assert err < 1e-10


@pytest.mark.parametrize("tq", [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL],
                         ids=tname)
def test_mul_mat_quantized(tq):
    k = 256
    check(lambda c, a, b: c.mul_mat(a, b), [(rand([k, 12, 2, 1], seed=27), tq), (rand([k, 5, 2, 1], seed=28), F32)],
          tol=5e-4)


def test_mul_mat_noncontiguous():
    # attention: kq = mul_mat(k, q) with k, q permuted views; kqv with a transposed-then-cont v
    def build(c, k, q):
        kp = c.permute(k, 0, 2, 1, 3)      # [16, 6, 4, 1]
        qp = c.permute(q, 0, 2, 1, 3)      # [16, 5, 4, 1]
        return c.mul_mat(kp, qp)
    check(build, [(rand([16, 4, 6], seed=29), F32), (rand([16, 4, 5], seed=30), F32)], tol=5e-4)
    check(build, [(rand([16, 4, 6], seed=29), F16), (rand([16, 4, 5], seed=30), F32)], tol=5e-4)


def test_out_prod():
    check(lambda c, a, b: c.out_prod(a, b), [(rand([9, 12, 2, 1], seed=31), F32), (rand([7, 12, 4, 1], seed=32), F32)],
          tol=5e-4)
    for ta in (F16, Q8_0):     # the CPU takes F16/quantized src0 only without batch broadcasting
        check(lambda c, a, b: c.out_prod(a, b), [(rand([32, 12, 2, 1], seed=31), ta), (rand([7, 12, 2, 1], seed=32), F32)],
              tol=5e-4)


# ------------------------------------------------------------------------------------ rows

@pytest.mark.parametrize("t", [F32, F16, BF16, I32, Q4_0, Q8_0, Q4_K], ids=tname)
def test_get_rows(t):
    n0 = 256 if t == Q4_K else 32
    vals = rand([n0, 10, 3, 2], -40, 40, seed=33)
    if t == I32:
        vals = vals.astype(np.int32)
    rows = np.random.default_rng(34).integers(0, 10, size=(2, 3, 7)).astype(np.int32)
    check(lambda c, a, r: c.get_rows(a, r), [(vals, t), (rows, I32)])


def test_get_rows_embedding_vector():
    rows = np.array([3, 0, 9, 3], np.int32)
    check(lambda c, a, r: c.get_rows(a, r), [(rand([24, 10], seed=35), F32), (rows, I32)])


@pytest.mark.parametrize("td", [F32, F16, BF16, Q8_0, Q4_0, Q4_K], ids=tname)
@pytest.mark.parametrize("ti", [I32, I64], ids=TN.get)
def test_set_rows(td, ti):
    n0 = 256 if td == Q4_K else 64
    rows = np.array([[[5, 1, 7]], [[2, 0, 6]]], dtype=np.int32 if ti == I32 else np.int64)  # ne [3, 1, 2]
    check(lambda c, a, b, r: c.set_rows(a, b, r),
          [(np.zeros((2, 4, 8, n0)), td), (rand([n0, 3, 4, 2], -3, 3, seed=36), F32), (rows, ti)])


def test_set_rows_f16_source():
    rows = np.array([4, 2], np.int32)
    check(lambda c, a, b, r: c.set_rows(a, b, r),
          [(rand([16, 6], seed=37), F16), (rand([16, 2], seed=38), F16), (rows, I32)])


# ------------------------------------------------------------------------------------ attention pieces

def test_diag_mask():
    x = rand([10, 6, 3], seed=39)
    check(lambda c, a: c.diag_mask_inf(a, 2), [(x, F32)])
    check(lambda c, a: wrap(c, lib.ggml_diag_mask_zero(c.ptr, a.ptr, 3), a), [(x, F32)])
    check(lambda c, a: wrap(c, lib.ggml_diag_mask_inf_inplace(c.ptr, a.ptr, 0), a), [(x, F32)])


SOFTMAX_CASES = {
    "plain": (None, 1.0, 0.0),
    "mask_f32": (([20, 8, 1, 1], F32), 0.125, 0.0),
    "mask_f16": (([20, 8, 1, 1], F16), 0.125, 0.0),
    "mask_padded_rows_bcast": (([20, 11, 2, 1], F32), 0.5, 0.0),   # ne1 > a.ne1, ne2 tiled
    "alibi": (([20, 8, 1, 1], F16), 1.0, 8.0),
}


@pytest.mark.parametrize("case", sorted(SOFTMAX_CASES))
def test_soft_max(case):
    mask_spec, scale, max_bias = SOFTMAX_CASES[case]
    x = rand([20, 8, 4, 2], -5, 5, seed=40)
    if mask_spec is None:
        check(lambda c, a: c.soft_max(a, None, scale), [(x, F32)], tol=1e-6)
        return
    ne, t = mask_spec
    m = rand(ne, -2, 2, seed=41)
    m[..., 0, 15:] = -np.inf                       # masked positions
    check(lambda c, a, mk: c.soft_max(a, mk, scale, max_bias), [(x, F32), (m, t)], tol=1e-6)


def test_soft_max_sinks():
    def build(c, a, m, s):
        out = c.soft_max(a, m, 0.3)
        lib.ggml_soft_max_add_sinks(out.ptr, s.ptr)
        return wrap(c, out.ptr, a, m, s)
    check(build, [(rand([20, 8, 4], -5, 5, seed=42), F32), (rand([20, 8], seed=43), F32),
                  (rand([4], -1, 3, seed=44), F32)], tol=1e-6)


ROPE_CASES = {
    "normal": dict(mode=0),
    "neox": dict(mode=2),
    "normal_partial": dict(mode=0, n_dims=16),
    "neox_partial": dict(mode=2, n_dims=24),
    "neox_freq_factors": dict(mode=2, freq_factors=True),
    "normal_scaled": dict(mode=0, freq_scale=0.25, freq_base=500000.0),
    "neox_yarn": dict(mode=2, ext_factor=1.0, freq_scale=0.25, n_ctx_orig=512, attn_factor=0.9),
    "normal_yarn": dict(mode=0, ext_factor=0.5, freq_scale=0.5, n_ctx_orig=256),
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
@pytest.mark.parametrize("t", [F32, F16], ids=TN.get)
def test_rope(case, t):
    kw = dict(ROPE_CASES[case])
    n_dims = kw.pop("n_dims", 32)
    ff = kw.pop("freq_factors", False)
    pos = np.array([0, 1, 5, 17, 100, 2047, 4000], np.int32)
    inputs = [(rand([32, 4, 7, 2], -2, 2, seed=45), t), (pos, I32)]
    if ff:
        inputs.append((rand([16], 1.0, 8.0, seed=46), F32))

    def build(c, a, p, f=None):
        return c.rope(a, p, n_dims, freq_factors=f, **kw)
    check(build, inputs)


def test_rope_noncontiguous_and_back():
    def view_of_qkv(c, qkv, p):               # q = a strided view of a fused qkv projection
        q = c.view(qkv, [16, 3, 5], [qkv.nb[1], qkv.nb[2]], offset=16 * 4)
        return c.rope(q, p, 16, mode=2)
    pos = np.arange(5, dtype=np.int32) * 3
    check(view_of_qkv, [(rand([48, 3, 5], seed=47), F32), (pos, I32)])

    def back(c, a, p):
        return wrap(c, lib.ggml_rope_ext_back(c.ptr, a.ptr, p.ptr, ffi.NULL, 16, 0, 0, 10000.0, 1.0,
                                              0.0, 1.0, 32.0, 1.0), a, p)
    check(back, [(rand([16, 3, 5], seed=48), F32), (pos, I32)])


# ------------------------------------------------------------------------------------ generators etc.

def test_pad_arange_timestep_fill_tri():
    x = rand([5, 4, 3, 2], seed=49)
    check(lambda c, a: wrap(c, lib.ggml_pad_ext(c.ptr, a.ptr, 1, 2, 0, 3, 2, 0, 0, 1), a), [(x, F32)])
    check(lambda c, a: wrap(c, lib.ggml_pad(c.ptr, a.ptr, 3, 1, 0, 0), a), [(x, F32)])
    check(lambda c, a: wrap(c, lib.ggml_pad_ext_circular(c.ptr, a.ptr, 2, 1, 1, 0, 0, 1, 0, 0), a), [(x, F32)])
    check(lambda c: c.arange(-3.0, 7.5, 0.75), [])
    t = np.array([0.0, 1.0, 10.0, 250.0, 999.0], np.float32)
    for dim in (16, 15):
        check(lambda c, a: wrap(c, lib.ggml_timestep_embedding(c.ptr, a.ptr, dim, 10000), a), [(t, F32)])
    for tt in (F32, F16):
        check(lambda c, a: wrap(c, lib.ggml_fill(c.ptr, a.ptr, -2.75), a), [(x, tt)])
    sq = rand([6, 6, 2], seed=50)
    for kind in (lib.GGML_TRI_TYPE_LOWER, lib.GGML_TRI_TYPE_LOWER_DIAG, lib.GGML_TRI_TYPE_UPPER,
                 lib.GGML_TRI_TYPE_UPPER_DIAG):
        check(lambda c, a: wrap(c, lib.ggml_tri(c.ptr, a.ptr, kind), a), [(sq, F32)])


# ------------------------------------------------------------------------------------ graphs

def test_llama_block_graph():
    """A LLaMA-style block (RMS norm, rope, GQA attention with a causal mask, SwiGLU FFN)
    computed node by node by numpy_ops, against the CPU."""
    H, nh, nkv, hd, T, F = 64, 4, 2, 16, 6, 96

    def build(c, x, wq, wk, wv, wo, w1, w3, w2, g, pos, mask):
        h = c.rms_norm(x, 1e-5) * g
        q = c.reshape(c.mul_mat(wq, h), hd, nh, T)
        k = c.reshape(c.mul_mat(wk, h), hd, nkv, T)
        v = c.reshape(c.mul_mat(wv, h), hd, nkv, T)
        q = c.rope(q, pos, hd, mode=2, freq_base=10000.0)
        k = c.rope(k, pos, hd, mode=2, freq_base=10000.0)
        qp, kp = c.permute(q, 0, 2, 1, 3), c.permute(k, 0, 2, 1, 3)      # [hd, T, heads]
        kq = c.soft_max(c.mul_mat(kp, qp), mask, 1.0 / math.sqrt(hd))      # [T, T, nh]
        vt = c.cont(c.permute(v, 1, 2, 0, 3))                              # [T, hd, nkv]
        o = c.cont(c.permute(c.mul_mat(vt, kq), 0, 2, 1, 3))              # [hd, nh, T]
        x = x + c.mul_mat(wo, c.reshape(o, H, T))
        h = c.rms_norm(x, 1e-5) * g
        ff = c.swiglu(c.mul_mat(w1, h), c.mul_mat(w3, h))
        return x + c.mul_mat(w2, ff)

    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    inputs = [(rand([H, T], seed=51), F32), (rand([H, H], -0.2, 0.2, seed=52), F16),
              (rand([H, nkv * hd], -0.2, 0.2, seed=53), F16), (rand([H, nkv * hd], -0.2, 0.2, seed=54), F16),
              (rand([H, H], -0.2, 0.2, seed=55), F16), (rand([H, F], -0.2, 0.2, seed=56), Q8_0),
              (rand([H, F], -0.2, 0.2, seed=57), Q8_0), (rand([F, H], -0.2, 0.2, seed=58), Q8_0),
              (rand([H], 0.5, 1.5, seed=59), F32), (np.arange(T, dtype=np.int32), I32), (mask, F32)]
    check(build, inputs, tol=5e-4)


def test_bert_layer_graph():
    """MiniLM/BERT pieces: embeddings by get_rows, layer norm, GELU(erf) FFN, pooling, l2_norm."""
    H, T, V = 32, 5, 20

    def build(c, emb, ids, w, b, w1, w2, pool):
        x = c.get_rows(emb, ids)
        x = c.norm(x, 1e-12) * w + b
        h = c.gelu_erf(c.mul_mat(w1, x))
        x = c.norm(x + c.mul_mat(w2, h), 1e-12)
        xt = c.cont(c.transpose(x))
        return c.l2_norm(c.mul_mat(xt, pool), 1e-12)

    inputs = [(rand([H, V], seed=60), F32), (np.array([1, 7, 3, 19, 0], np.int32), I32),
              (rand([H], seed=61), F32), (rand([H], seed=62), F32), (rand([H, 4 * H], -0.3, 0.3, seed=63), F32),
              (rand([4 * H, H], -0.3, 0.3, seed=64), F32), (np.full((1, T), 1.0 / T, np.float32), F32)]
    check(build, inputs, tol=1e-6)


# ------------------------------------------------------------------------------------ honesty

def test_supports_false_for_what_is_not_implemented():
    with pyggml.Context(MEM) as c:
        a = c.from_numpy(rand([16, 4, 6]))
        a16 = c.from_numpy(rand([16, 4, 6]).astype(np.float16))
        abf = make(c, rand([16, 4, 6]), BF16)
        pos = c.from_numpy(np.arange(6, dtype=np.int32))
        pos4 = c.from_numpy(np.arange(24, dtype=np.int32))
        img = c.from_numpy(rand([8, 8, 3, 1]))
        ker = c.from_numpy(rand([3, 3, 3, 2]).astype(np.float16))
        sections = ffi.new("int[4]", [2, 2, 2, 2])
        unsupported = {
            "im2col (op without a kernel)": wrap(c, lib.ggml_im2col(c.ptr, ker.ptr, img.ptr, 1, 1, 1, 1, 1, 1, True, F16), ker, img),
            "flash_attn_ext": wrap(c, lib.ggml_flash_attn_ext(c.ptr, a.ptr, a.ptr, a.ptr, ffi.NULL, 1.0, 0.0, 0.0), a),
            "rope mrope": wrap(c, lib.ggml_rope_multi(c.ptr, a.ptr, pos4.ptr, ffi.NULL, 16, sections,
                                                      lib.GGML_ROPE_TYPE_MROPE, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0), a, pos4),
            "rope vision": wrap(c, lib.ggml_rope_multi(c.ptr, a.ptr, pos4.ptr, ffi.NULL, 8, sections,
                                                       lib.GGML_ROPE_TYPE_VISION, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0), a, pos4),
            "rope bf16": wrap(c, lib.ggml_rope_ext(c.ptr, abf.ptr, pos.ptr, ffi.NULL, 16, 0, 0, 10000.0, 1.0,
                                                   0.0, 1.0, 32.0, 1.0), abf, pos),
            "gelu bf16": wrap(c, lib.ggml_gelu(c.ptr, abf.ptr), abf),
            "soft_max f16": wrap(c, lib.ggml_soft_max(c.ptr, a16.ptr), a16),
            "norm f16": wrap(c, lib.ggml_norm(c.ptr, a16.ptr, 1e-5), a16),
            "cpy to iq2_xxs": wrap(c, lib.ggml_cpy(c.ptr, c.from_numpy(rand([256, 2])).ptr,
                                                    c.new_tensor(lib.GGML_TYPE_IQ2_XXS, [256, 2]).ptr)),
            # the CPU's IQ4_NL from_float picks other scales than ggml_quantize_chunk
            "cpy to iq4_nl": wrap(c, lib.ggml_cpy(c.ptr, c.from_numpy(rand([64, 2])).ptr,
                                                   c.new_tensor(IQ4_NL, [64, 2]).ptr)),
            # F16/BF16 -> quantized: the CPU's SIMD quantizer and the reference one may round
            # exact ties differently (test-backend-ops CPY bf16->q8_0 failed)
            "cpy f16 to q8_0": wrap(c, lib.ggml_cpy(c.ptr, a16.ptr, c.new_tensor(Q8_0, [16 * 4 * 6]).ptr)),
            # the CPU sums rows as contiguous even when nb[0] says otherwise
            "sum of a permuted tensor": wrap(c, lib.ggml_sum(c.ptr, c.permute(a, 1, 0, 2, 3).ptr), a),
            "add to q4_0": wrap(c, lib.ggml_add(c.ptr, make(c, rand([32, 4]), Q4_0).ptr, c.from_numpy(rand([32, 4])).ptr)),
            "ssm_conv": wrap(c, lib.ggml_ssm_conv(c.ptr, c.from_numpy(rand([7, 4, 2])).ptr,
                                                  c.from_numpy(rand([4, 4])).ptr)),
        }
        for what, node in unsupported.items():
            assert not numpy_ops.supports(node), what
            with pytest.raises(ValueError):
                numpy_ops.compute(node)
        # and what it does support, for contrast
        assert numpy_ops.supports(c.rope(a, pos, 16, mode=2))
        assert numpy_ops.supports(c.permute(a, 1, 0, 2, 3))


def test_op_table_and_argument_errors():
    assert len(numpy_ops.OPS) >= 40
    names = set(numpy_ops.supported_op_names())
    for must in ("MUL_MAT", "ADD", "SUB", "MUL", "DIV", "SCALE", "NORM", "RMS_NORM", "L2_NORM",
                 "SOFT_MAX", "ROPE", "GET_ROWS", "SET_ROWS", "CPY", "DUP", "CONT", "GLU", "UNARY",
                 "SUM", "SUM_ROWS", "MEAN", "ARGMAX", "REPEAT", "CONCAT", "SQR", "SQRT", "LOG",
                 "SIN", "COS", "CLAMP", "LEAKY_RELU", "DIAG_MASK_INF", "ARGSORT", "NONE", "VIEW",
                 "RESHAPE", "PERMUTE", "TRANSPOSE", "ARANGE", "PAD"):
        assert must in names, must
    for op, impl in numpy_ops.OPS.items():
        assert ffi.string(lib.ggml_op_name(op)).decode() == impl.name and impl.notes
    with pytest.raises(TypeError):
        numpy_ops.supports("not a tensor")
    with pytest.raises(TypeError):
        numpy_ops.compute(ffi.NULL)
    with pyggml.Context(MEM) as c:
        a = c.from_numpy(rand([4, 3]))
        rows = c.from_numpy(np.array([0, 5], np.int32))
        g = c.get_rows(a, rows)
        assert numpy_ops.supports(g.ptr)                  # raw pointers work too
        with pytest.raises(ValueError, match="out of range"):
            numpy_ops.compute(g)
    with pyggml.Context.for_tensors(4) as c:              # metadata only: supports, but no data
        a = c.new_tensor(F32, [4, 3])
        s = c.sqr(a)
        assert numpy_ops.supports(s)
        with pytest.raises(ValueError, match="no data"):
            numpy_ops.compute(s)
