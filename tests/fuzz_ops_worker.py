"""Hypothesis worker for tests/test_no_crash.py: random op / shape / type combinations thrown at
pyggml's Pythonic layer. Each call either works or raises a Python exception; a GGML_ASSERT
would abort this process, which the parent test counts.

    python tests/fuzz_ops_worker.py SEED N_EXAMPLES
"""
from __future__ import annotations

import sys

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import pyggml
from pyggml import Context, GGMLError, GGMLType, ffi
from pyggml.core.ops import UNARY_OPS, op_constructors
from pyggml.backends.cpu import graph_compute

EXPECTED = (ValueError, TypeError, MemoryError, KeyError, GGMLError)
TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I8, GGMLType.I64,
         GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_K, 999, -1]
OPS = ["add", "sub", "mul", "div", "mul_mat", "out_prod", "scale", "norm", "rms_norm", "l2_norm",
       "soft_max", "get_rows", "set_rows", "reshape", "view", "permute", "transpose", "cont",
       "concat", "sum", "sum_rows", "mean", "argmax", "repeat", "cpy", "cast", "rope", "argsort",
       "clamp", "diag_mask_inf", "swiglu", "geglu", "leaky_relu", "unary", "pad", "interpolate",
       "im2col", "conv_1d", "conv_2d", "pool_1d", "pool_2d", "flash_attn", "top_k", "cumsum",
       "timestep_embedding", "cross_entropy_loss", "acc", "map_custom", "generic"]
GENERIC = sorted(op_constructors())


def generic_args(name, ts, ints, floats):
    """Arguments for ggml_<name> after the context, from its C signature."""
    args, k = [], 0
    for t in pyggml.ffi.typeof(getattr(pyggml.lib, "ggml_" + name)).args[1:]:
        k += 1
        if t.cname == "struct ggml_tensor *":
            args.append(ts[k % len(ts)])
        elif t.kind == "pointer":
            args.append(ffi.NULL)
        elif t.cname in ("float", "double"):
            args.append(floats[k % 2])
        elif t.cname == "_Bool":
            args.append(ints[k % 4] > 30)
        else:
            args.append(ints[k % 4])
    return args


calls = 0

dims = st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 8, 32, 64]), min_size=1, max_size=5)
tensor_spec = st.tuples(st.sampled_from(TYPES), dims)


def make(ctx, spec):
    global calls
    calls += 1
    t = ctx.new_tensor(spec[0], spec[1])
    if ctx.no_alloc or t.nelements == 0:
        return t
    calls += 1
    t.set(np.random.default_rng(calls).standard_normal(t.nelements).astype(np.float32)
          if t.type not in (GGMLType.I32, GGMLType.I8, GGMLType.I64)
          else np.arange(t.nelements) % 3)
    return t


@given(op=st.sampled_from(OPS), specs=st.lists(tensor_spec, min_size=1, max_size=4),
       ints=st.lists(st.integers(-2, 70), min_size=4, max_size=4),
       floats=st.lists(st.floats(-4, 4) | st.just(float("nan")), min_size=2, max_size=2),
       unary=st.sampled_from(sorted(UNARY_OPS)), mem=st.sampled_from([2048, 1 << 16, 1 << 22]),
       no_alloc=st.booleans(), compute=st.booleans())
def run(op, specs, ints, floats, unary, mem, no_alloc, compute):
    global calls
    print(op, specs, ints, floats, unary, mem, no_alloc, compute, flush=True)
    try:
        with Context(mem, no_alloc=no_alloc) as ctx:
            ts = [make(ctx, s) for s in specs]
            a, b, c = (ts + [ts[0], ts[0]])[:3]
            calls += 1
            out = {
                "add": lambda: ctx.add(a, b), "sub": lambda: ctx.sub(a, b),
                "mul": lambda: ctx.mul(a, b), "div": lambda: ctx.div(a, b),
                "mul_mat": lambda: ctx.mul_mat(a, b), "out_prod": lambda: ctx.out_prod(a, b),
                "scale": lambda: ctx.scale(a, floats[0]), "norm": lambda: ctx.norm(a, abs(floats[0])),
                "rms_norm": lambda: ctx.rms_norm(a, 1e-6), "l2_norm": lambda: ctx.l2_norm(a),
                "soft_max": lambda: ctx.soft_max(a, b if len(ts) > 1 else None, floats[0], floats[1]),
                "get_rows": lambda: ctx.get_rows(a, b), "set_rows": lambda: ctx.set_rows(a, b, c),
                "reshape": lambda: ctx.reshape(a, *ints[:1 + ints[3] % 4]),
                "view": lambda: ctx.view(a, ints[:1 + ints[3] % 4], None, ints[2]),
                "permute": lambda: ctx.permute(a, *ints),
                "transpose": lambda: ctx.transpose(a), "cont": lambda: ctx.cont(a),
                "concat": lambda: ctx.concat(a, b, ints[0]), "sum": lambda: ctx.sum(a),
                "sum_rows": lambda: ctx.sum_rows(a), "mean": lambda: ctx.mean(a),
                "argmax": lambda: ctx.argmax(a), "repeat": lambda: ctx.repeat(a, b),
                "cpy": lambda: ctx.cpy(a, b), "cast": lambda: ctx.cast(a, specs[-1][0]),
                "rope": lambda: ctx.rope(a, b, ints[0], mode=ints[1] % 3 * 4),
                "argsort": lambda: ctx.argsort(a, ints[0] > 0),
                "clamp": lambda: ctx.clamp(a, floats[0], floats[1]),
                "diag_mask_inf": lambda: ctx.diag_mask_inf(a, ints[0]),
                "swiglu": lambda: ctx.swiglu(a, b if len(ts) > 1 else None),
                "geglu": lambda: ctx.geglu(a, b if len(ts) > 1 else None),
                "leaky_relu": lambda: ctx.leaky_relu(a, floats[0]),
                "unary": lambda: ctx.unary(unary, a),
                "pad": lambda: ctx.pad(a, *ints),
                "interpolate": lambda: ctx.interpolate(a, ints, ints[0] % 4),
                "im2col": lambda: ctx.im2col(a, b, ints[0], ints[1], ints[2], ints[3], 1, 1, ints[0] > 30, specs[-1][0]),
                "conv_1d": lambda: ctx.conv_1d(a, b, ints[0] % 4, ints[1] % 3, ints[2] % 3),
                "conv_2d": lambda: ctx.conv_2d(a, b, ints[0] % 4, ints[1] % 4, ints[2] % 3, ints[3] % 3),
                "pool_1d": lambda: ctx.pool_1d(a, "max" if ints[0] > 30 else "avg", ints[1] % 5, ints[2] % 4, ints[3] % 3),
                "pool_2d": lambda: ctx.pool_2d(a, "max", ints[0] % 4, ints[1] % 4, ints[2] % 4, ints[3] % 4),
                "flash_attn": lambda: ctx.flash_attn(a, b, c, ts[3] if len(ts) > 3 else None, floats[0], abs(floats[1])),
                "top_k": lambda: ctx.top_k(a, ints[0]),
                "cumsum": lambda: ctx.cumsum(a),
                "timestep_embedding": lambda: ctx.timestep_embedding(a, ints[0], ints[1]),
                "cross_entropy_loss": lambda: ctx.cross_entropy_loss(a, b),
                "acc": lambda: ctx.acc(a, b, ints[0], ints[1], ints[2], ints[3]),
                "generic": lambda: ctx.op(GENERIC[ints[0] * 71 % len(GENERIC)], *generic_args(
                    GENERIC[ints[0] * 71 % len(GENERIC)], ts, ints, floats)),
                "map_custom": lambda: ctx.map_custom(lambda dst, *rest: None, *ts[:1 + ints[0] % 3], n_tasks=ints[1]),
            }[op]()
            if compute and not no_alloc:
                calls += 1
                graph_compute(ctx.new_graph(64).build_forward(out), n_threads=2)
                calls += 1
                out.numpy()
    except EXPECTED:
        pass


if __name__ == "__main__":
    seed_value, n = int(sys.argv[1]), int(sys.argv[2])
    pyggml.raw.log.uninstall()
    test = settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))(seed(seed_value)(run))
    test()
    print(f"calls={calls}", flush=True)
