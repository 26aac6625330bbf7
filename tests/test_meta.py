"""pyggml.backends.meta: ggml's meta device (tensor parallelism) from Python, on the CPU device
twice (the default build; over RPC devices in tests/models/test_distributed.py). References
are NumPy's."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml import Context, CPUBackend, GGMLType, GraphAllocator, Scheduler
from pyggml.backends.device import device_by_name
from pyggml.backends.meta import MAX_DEVICES, MIRRORED, PARTIAL, SplitState, is_meta, meta_device

rng = np.random.default_rng(7)
CPU = device_by_name("CPU")


class Policy:
    """Split by tensor name; records what ggml asked for."""

    def __init__(self, states):
        self.states, self.asked = states, []

    def __call__(self, t):
        self.asked.append(t.name)
        state = self.states.get(t.name, SplitState.mirrored())
        return state(t) if callable(state) else state


def _matmul_graph(backend, w, K, T):  # one matmul of a row-split weight
    ctx = Context.for_tensors(8, graph_size=8)
    x = ctx.new_tensor(GGMLType.F32, [K, T], name="x").set_input()
    y = ctx.mul_mat(w, x).set_output()
    g = ctx.new_graph(8).build_forward(y)
    GraphAllocator(backend).alloc_graph(g)
    return ctx, x, y, g


@pytest.mark.parametrize("wtype", [GGMLType.F32, GGMLType.Q8_0])
@pytest.mark.parametrize("n_devices", [1, 2, 3])
def test_row_then_column_parallel_mlp_matches_numpy(wtype, n_devices):
    """An MLP as tensor parallelism splits it: w1 by rows (axis 1: each device computes some of
    h), w2 by columns (axis 0: each device a partial sum of y, all-reduced before the residual
    add reads it). The result is what the unsplit weights give."""
    K, F, T = 64, 192, 3
    W1 = rng.standard_normal((F, K)).astype(np.float32)
    W2 = rng.standard_normal((K, F)).astype(np.float32)
    X = rng.standard_normal((T, K)).astype(np.float32)
    sizes = SplitState.even(1, F, n_devices, granularity=32).segments[0][0]  # the same F split
    policy = Policy({"w1": SplitState.split(1, sizes), "w2": SplitState.split(0, sizes)})
    be = meta_device([CPU] * n_devices, policy).init()
    with be, Context.for_tensors(2) as wctx, Context.for_tensors(16, graph_size=16) as ctx:
        w1 = wctx.new_tensor(wtype, [K, F], name="w1")
        w2 = wctx.new_tensor(wtype, [F, K], name="w2")
        wctx.alloc_tensors(be)
        w1.set(W1)
        w2.set(W2)
        assert {"w1", "w2"} <= set(policy.asked)
        x = ctx.new_tensor(GGMLType.F32, [K, T], name="x").set_input()
        y = (ctx.mul_mat(w2, ctx.mul_mat(w1, x)) + x).set_output()
        g = ctx.new_graph(16).build_forward(y)
        GraphAllocator(be).alloc_graph(g)
        x.set(X)
        g.compute(be)
        if wtype == GGMLType.F32:  # set scatters, get gathers
            np.testing.assert_array_equal(w1.numpy(), W1)
            np.testing.assert_array_equal(w2.numpy(), W2)
        ref = (X @ w1.numpy().T) @ w2.numpy().T + X  # the weights as stored (Q8_0: dequantized)
        tol = 1e-4 if wtype == GGMLType.F32 else 0.1  # Q8_0: ggml quantizes the activations too
        np.testing.assert_allclose(y.numpy(), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_uneven_split_by_weights():
    s = SplitState.even(1, 100, 3, granularity=8, weights=[1, 2, 1])
    assert s.axis == 1 and s.segments == (((24, 48, 28), 1),)
    assert sum(s.segments[0][0]) == 100


@pytest.mark.parametrize("bad, match", [
    (SplitState.split(1, [10, 10]), "add up to 20, not ne\\[1\\] = 48"),
    (SplitState.split(0, [40, 24]), "block size 32"),
    (SplitState.split(2, [1, 0]), "has no axis 2"),
    (SplitState(7), "neither 0..3"),
    (SplitState(1, ()), "1 to 16 segments"),
    (SplitState.split(1, [48]), "needs 2 sizes"),
    (SplitState.split(1, [50, -2]), ">= 0"),
    ("not a state", "returns a SplitState"),
])
def test_bad_policy_is_a_clear_error_of_the_call_that_asked(bad, match):
    """ggml aborts on each of these; pyggml gives ggml a mirrored state and raises from the call
    (``alloc_tensors``) that made ggml ask."""
    be = meta_device([CPU, CPU], Policy({"w": bad})).init()
    with be, Context.for_tensors(2) as wctx:
        wctx.new_tensor(GGMLType.Q8_0, [64, 48], name="w")
        with pytest.raises((ValueError, TypeError), match=match):
            wctx.alloc_tensors(be)


def test_policy_exception_reaches_the_caller():
    def policy(t):
        raise KeyError("no rule for " + t.name)

    be = meta_device([CPU, CPU], policy).init()
    with be, Context.for_tensors(2) as wctx:
        wctx.new_tensor(GGMLType.F32, [8, 4], name="w")
        with pytest.raises(KeyError, match="no rule for w"):
            wctx.alloc_tensors(be)


def test_meta_device_arguments():
    with pytest.raises(ValueError, match="1 to 16"):
        meta_device([], lambda t: SplitState.mirrored())
    with pytest.raises(ValueError, match="1 to 16"):
        meta_device([CPU] * (MAX_DEVICES + 1), lambda t: SplitState.mirrored())
    with pytest.raises(TypeError, match="Devices"):
        meta_device(["CPU"], lambda t: SplitState.mirrored())
    with pytest.raises(TypeError, match="callable"):
        meta_device([CPU], None)
    dev = meta_device([CPU, CPU], lambda t: SplitState.mirrored())
    assert is_meta(dev) and not is_meta(CPU)
    with pytest.raises(ValueError, match="meta devices"):
        meta_device([dev, CPU], lambda t: SplitState.mirrored())
    assert MIRRORED == 10 and PARTIAL == 11  # ggml-backend.h


def test_meta_memory_is_not_host_memory_to_python():
    """A meta device of host devices says its buffer type is host memory, but its tensors'
    data are not addresses: every way pyggml would read them as such refuses (each crashed)."""
    be = meta_device([CPU, CPU], Policy({"w": SplitState.split(1, [2, 2])})).init()
    with be, CPUBackend() as cpu, Context.for_tensors(2) as wctx:
        w = wctx.new_tensor(GGMLType.F32, [8, 4], name="w")
        buf = wctx.alloc_tensors(be)
        assert buf.is_meta and be.default_buffer_type.is_host
        with pytest.raises(ValueError, match="not in host memory"):
            w.numpy(copy=False)
        with pytest.raises(ValueError, match="not in host memory"):
            buf.numpy()
        with pytest.raises(BufferError):
            np.from_dlpack(w)
        with pytest.raises(ValueError, match="cannot share a scheduler"):
            Scheduler([be, cpu])
        ctx, x, y, g = _matmul_graph(be, w, 8, 2)
        with ctx, pytest.raises(ValueError, match="cannot use tensors in a buffer of type Meta"):
            g.compute(cpu)


def test_a_graph_whose_views_ggml_dropped_is_refused():
    """ggml's meta backend keeps the views of meta tensors (a KV cache view) of the graphs placed
    since it last switched graphs; computing an older one aborted (``GGML_ASSERT(bcj.nodes[i])``).
    pyggml refuses it; graphs placed before the switch, or rebuilt, compute."""
    be = meta_device([CPU, CPU], Policy({"c": SplitState.split(0, [32, 32])})).init()
    with be, Context.for_tensors(2) as wctx:
        c = wctx.new_tensor(GGMLType.F32, [64, 8], name="c")
        wctx.alloc_tensors(be)
        C = rng.standard_normal((8, 64)).astype(np.float32)
        c.set(C)

        def graph(rows):
            ctx = Context.for_tensors(8, graph_size=8)
            y = ctx.scale(ctx.view(c, [64, rows], nb=[c.nb[1]]), 2.0).set_output()
            g = ctx.new_graph(8).build_forward(y)
            GraphAllocator(be).alloc_graph(g)
            return ctx, g, y

        (ca, a, ya), (cb, b, yb) = graph(2), graph(3)   # both placed before any compute
        a.compute(be)
        b.compute(be)                                   # views of both still kept
        cc, c3, yc = graph(4)
        c3.compute(be)                                  # placed after the switch: b's views dropped
        with pytest.raises(ValueError, match="meta backend has dropped"):
            b.compute(be)
        c3.compute(be)                                  # the last one computes again
        for y, rows in ((ya, 2), (yb, 3), (yc, 4)):
            np.testing.assert_allclose(y.numpy(), 2 * C[:rows], rtol=1e-6)
        for ctx in (ca, cb, cc):
            ctx.close()


# ---------------------------------------------------------------------- split-state checks
# Graphs whose split ggml's meta backend cannot derive abort the process in ggml (placing the
# graph, computing it, or reading a result); pyggml.backends.meta_check refuses them first.
# Each case: (policy states, code building `y` in `ctx` from the weights `w[name]`, what the
# check says, whether ggml aborts only when the result is read).
_ABORTS = {
    "mul_mat": ({"w": SplitState.split(0, [32, 32])}, {"w": [64, 16]},
                "y = ctx.mul_mat(w['w'], x)", "unsupported mul_mat split states"),
    "unequal": ({"a": SplitState.split(1, [32, 64]), "b": SplitState.split(1, [48, 48])},
                {"a": [64, 96], "b": [64, 96]}, "y = ctx.add(ctx.add(w['a'], w['b']), ctx.sum(x))",
                "sources are split differently"),
    "view_of_permuted": ({"c": SplitState.split(1, [4, 4])}, {"c": [64, 8]},
                         "p = ctx.permute(w['c'], 1, 0, 2, 3)\n"
                         "y = ctx.add(ctx.cont(ctx.view(p, [8, 32], nb=[p.nb[1] * 2])), ctx.sum(x))",
                         "view of permuted tensor not implemented"),
    "partial_output": ({"w1": SplitState.split(1, [48, 48]), "w2": SplitState.split(0, [48, 48])},
                       {"w1": [64, 96], "w2": [96, 64]}, "y = ctx.mul_mat(w['w2'], ctx.mul_mat(w['w1'], x))",
                       "partial sum"),
    "last_node_a_view": ({}, {"a": [64, 3]}, "y = ctx.cpy(ctx.add(x, w['a']), ctx.new_tensor(GGMLType.F32, [64, 3]))",
                         "last node and a view"),
    "op_not_implemented": ({}, {"a": [4, 5]}, "y = ctx.add(ctx.col2im_1d(w['a'], 1, 2, 0), ctx.sum(x))",
                           "pyggml cannot check that ggml's meta backend splits op COL2IM_1D"),
}

_CASE_CODE = '''
import numpy as np
from pyggml import Context, GGMLType, GraphAllocator
from pyggml.backends.device import device_by_name
from pyggml.backends.meta import SplitState, meta_device

def run_case(states, shapes, build, grads=False):
    CPU = device_by_name("CPU")
    be = meta_device([CPU, CPU], lambda t: states.get(t.name, SplitState.mirrored())).init()
    wctx = Context.for_tensors(len(shapes))
    w = {n: wctx.new_tensor(GGMLType.F32, ne, name=n) for n, ne in shapes.items()}
    wctx.alloc_tensors(be)
    for t in w.values():
        t.set(np.ones(t.shape, np.float32))
    ctx = Context.for_tensors(16, graph_size=16)
    x = ctx.new_tensor(GGMLType.F32, [64, 3], name="x").set_input()
    env = {"ctx": ctx, "w": w, "x": x}
    env["GGMLType"] = GGMLType
    exec(build, env)
    y = env["y"].set_output()
    g = ctx.new_graph(16, grads=grads).build_forward(y)
    GraphAllocator(be).alloc_graph(g)
    x.set(np.ones((3, 64), np.float32))
    g.compute(be)
    return y.numpy()
'''


def _run_case(states, shapes, build, grads=False):
    env: dict = {}
    exec(_CASE_CODE, env)
    return env["run_case"](states, shapes, build, grads)


@pytest.mark.parametrize("case", sorted(_ABORTS))
def test_graph_ggml_cannot_split_is_a_value_error(case):
    """Each graph below aborts the process in ggml (the next test); pyggml raises ValueError
    naming the tensor, its op and its sources' split states, and the process goes on."""
    states, shapes, build, match = _ABORTS[case]
    with pytest.raises(ValueError, match=match) as e:
        _run_case(states, shapes, build)
    assert "sources:" in str(e.value) or "op COL2IM_1D" in str(e.value)
    np.testing.assert_array_equal(_run_case({}, {"a": [64, 3]}, "y = ctx.add(x, w['a'])"), 2.0)  # alive


def test_graph_with_gradients_on_a_meta_backend_is_refused():
    with pytest.raises(ValueError, match="gradients"):
        _run_case({}, {"a": [64, 3]}, "y = ctx.add(x, w['a'])", grads=True)


@pytest.mark.parametrize("case", sorted(_ABORTS) + ["grads"])
def test_without_the_check_ggml_aborts(case):
    """What the check prevents: the same graphs with pyggml's check switched off abort the
    process in ggml (SIGABRT; a partial-sum output aborts when it is read back)."""
    import signal
    import subprocess
    import sys
    states, shapes, build, _ = _ABORTS.get(case, ({}, {"a": [64, 3]}, "y = ctx.add(x, w['a'])", ""))
    code = (_CASE_CODE + "\nimport pyggml.backends.meta_check as mc\n"
            "mc._run = lambda *a, **k: None\nmc.check_compute = lambda *a, **k: None\n"
            "from pyggml.backends import backend\nbackend.meta_check = mc\n"
            f"run_case({states!r}, {shapes!r}, {build!r}, grads={case == 'grads'})\nprint('survived')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "survived" not in r.stdout


def _llama_graph(ctx, w, kc, vc, T, K, hp, ln):
    """pyggml.models.llama.model.LlamaModel._layer with flash attention (as tensor split runs it), the
    embedding before and the output after, plus scale/soft_max/silu/cont/cpy on the logits."""
    import math
    D, H, Hkv, E = hp.head_dim, hp.n_head, hp.n_head_kv, hp.n_embd
    inp = {"tokens": ctx.new_tensor(GGMLType.I32, [T], name="inp_tokens").set_input(),
           "pos": ctx.new_tensor(GGMLType.I32, [T], name="inp_pos").set_input(),
           "kq_mask": ctx.new_tensor(GGMLType.F16, [K, T], name="kq_mask").set_input(),
           "k_idx": ctx.new_tensor(GGMLType.I64, [T], name="k_idx").set_input()}
    graph = ctx.new_graph(256)
    p = "blk.0."
    x = ctx.get_rows(w["token_embd.weight"], inp["tokens"])
    cur = ctx.mul(ctx.rms_norm(x, 1e-5), w[p + "attn_norm.weight"])
    q = ctx.reshape(ctx.mul_mat(w[p + "attn_q.weight"], cur), D, H, T)
    k = ctx.reshape(ctx.mul_mat(w[p + "attn_k.weight"], cur), D, Hkv, T)
    v = ctx.mul_mat(w[p + "attn_v.weight"], cur)
    q, k = (ctx.rope(a, inp["pos"], D, mode=0, n_ctx_orig=64) for a in (q, k))
    es = kc.nb[0]
    graph.build_forward(ctx.set_rows(kc, ctx.reshape(k, Hkv * D, T), inp["k_idx"]))
    graph.build_forward(ctx.set_rows(vc, v, inp["k_idx"]))
    k_view = ctx.permute(ctx.view(kc, [D, Hkv, K], nb=[D * es, kc.nb[1]]), 0, 2, 1, 3)
    v_view = ctx.permute(ctx.view(vc, [D, Hkv, K], nb=[D * es, vc.nb[1]]), 0, 2, 1, 3)
    o = ctx.flash_attn(ctx.permute(q, 0, 2, 1, 3), k_view, v_view, inp["kq_mask"], 1.0 / math.sqrt(D))
    cur = ctx.mul_mat(w[p + "attn_output.weight"], ctx.reshape(o, H * D, T))
    if ln:  # the last block: the FFN of the last token only
        cur = ctx.view(cur, [E, 1], offset=(T - 1) * cur.nb[1])
        x = ctx.view(x, [E, 1], offset=(T - 1) * x.nb[1])
    x = ctx.add(cur, x)
    cur = ctx.mul(ctx.rms_norm(x, 1e-5), w[p + "ffn_norm.weight"])
    h = ctx.swiglu(ctx.mul_mat(w[p + "ffn_gate.weight"], cur), ctx.mul_mat(w[p + "ffn_up.weight"], cur))
    x = ctx.add(ctx.mul_mat(w[p + "ffn_down.weight"], h), x)
    x = ctx.mul(ctx.rms_norm(x, 1e-5), w["output_norm.weight"])
    logits = ctx.mul_mat(w["output.weight"], x)
    probs = ctx.soft_max(ctx.scale(logits, 0.5))
    t = ctx.cont(ctx.permute(ctx.silu(probs), 1, 0, 2, 3))
    out = ctx.scale(ctx.cpy(t, ctx.new_tensor(GGMLType.F32, list(t.ne)[:2])), 1.0)  # not last: a view
    logits.set_output()
    out.set_output()
    graph.build_forward(out)
    graph.build_forward(logits)
    return graph, inp, logits, out


@pytest.mark.parametrize("weights", [None, [3, 1]])
@pytest.mark.parametrize("last_only", [False, True])
def test_llama_block_in_tensor_split_passes_the_check_and_matches_the_cpu(weights, last_only):
    """A llama block as pyggml.models.llama builds it in tensor-split mode (flash attention,
    pyggml.models.llama.split's TensorSplit policy) on the CPU twice: the check passes and
    the logits, the block's output and the KV cache are the CPU backend's."""
    import types

    from pyggml.models.llama.split import TensorSplit
    hp = types.SimpleNamespace(head_dim=16, n_head=4, n_head_kv=2, n_ff=256, n_embd=64)
    E, F, D, H, Hkv, V, C, T, K = 64, 256, 16, 4, 2, 48, 32, 5, 32
    shapes = {"token_embd.weight": [E, V], "blk.0.attn_norm.weight": [E],
              "blk.0.attn_q.weight": [E, H * D], "blk.0.attn_k.weight": [E, Hkv * D],
              "blk.0.attn_v.weight": [E, Hkv * D], "blk.0.attn_output.weight": [H * D, E],
              "blk.0.ffn_norm.weight": [E], "blk.0.ffn_gate.weight": [E, F],
              "blk.0.ffn_up.weight": [E, F], "blk.0.ffn_down.weight": [F, E],
              "output_norm.weight": [E], "output.weight": [E, V]}
    arrays = {n: (rng.standard_normal(ne[::-1]) * 0.3).astype(np.float32) for n, ne in shapes.items()}
    feed = {"inp_tokens": np.array([3, 1, 4, 1, 5], np.int32), "inp_pos": np.arange(T, dtype=np.int32),
            "k_idx": np.arange(T, dtype=np.int64)}
    mask = np.full((T, K), -np.inf, np.float32)
    for t in range(T):
        mask[t, :t + 1] = 0
    feed["kq_mask"] = mask.astype(np.float16)
    policy = TensorSplit(hp, 2, weights)
    results = []
    for backend in (CPUBackend(), meta_device([CPU, CPU], policy).init()):
        with backend, Context.for_tensors(16) as wctx, Context.for_tensors(256, graph_size=256) as ctx:
            w = {n: wctx.new_tensor(GGMLType.F32, ne, name=n) for n, ne in shapes.items()}
            kc = wctx.new_tensor(GGMLType.F16, [Hkv * D, C], name="cache_k_l0")
            vc = wctx.new_tensor(GGMLType.F16, [Hkv * D, C], name="cache_v_l0")
            wctx.alloc_tensors(backend).clear(0)
            for n, a in arrays.items():
                w[n].set(a)
            graph, inp, logits, out = _llama_graph(ctx, w, kc, vc, T, K, hp, last_only)
            GraphAllocator(backend).alloc_graph(graph)
            for _ in range(2):  # the second time with the cached check
                for t in inp.values():
                    t.set(feed[t.name])
                graph.compute(backend)
            results.append((logits.numpy(), out.numpy(), kc.numpy(), vc.numpy()))
    for ref, got in zip(*results):
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_row_indices_in_meta_memory_are_checked():
    """An input of a graph on a meta backend lives in the meta device's memory (its data are no
    addresses): pyggml reads the indices with ggml_backend_tensor_get and refuses one out of
    range, where ggml's get_rows kernel aborted; in range, the rows come out as NumPy's."""
    be = meta_device([CPU, CPU], Policy({})).init()
    E = rng.standard_normal((10, 8)).astype(np.float32)
    with be, Context.for_tensors(2) as wctx, Context.for_tensors(8, graph_size=8) as ctx:
        emb = wctx.new_tensor(GGMLType.F32, [8, 10], name="emb")
        wctx.alloc_tensors(be)
        emb.set(E)
        ids = ctx.new_tensor(GGMLType.I32, [3], name="ids").set_input()
        y = ctx.scale(ctx.get_rows(emb, ids), 1.0).set_output()
        g = ctx.new_graph(8).build_forward(y)
        GraphAllocator(be).alloc_graph(g)
        ids.set(np.array([1, 10, 2], dtype=np.int32))
        with pytest.raises(ValueError, match="row index 10 .* outside \\[0, 10\\)"):
            g.compute(be)
        ids.set(np.array([1, 9, 2], dtype=np.int32))
        g.compute(be)
        np.testing.assert_array_equal(y.numpy(), E[[1, 9, 2]])
