"""The CPU kernel table (pyggml.backends.cpu._cpu_kernel_supports_raw) against ggml's CPU kernels.

For the checked op constructors, sources of several types and layouts (contiguous, transposed,
permuted without being transposed, row-padded views, one-column transposes whose rows count as
contiguous) make nodes; each graph is computed in a forked child. The table must accept exactly
what the kernels compute: a node CPUBackend accepts never kills the process, and a node that
ggml's own supports_op accepts but the table refuses does (except the few refusals listed in
STRICTER, each with its reason).

The nodes the table accepts are computed one after the other by a forked child that reports
each index before computing it (a new child goes on after a death); each refused node gets a
child of its own, since some of those kernels corrupt memory instead of dying at once.
"""
from __future__ import annotations

import faulthandler
import itertools
import os
import re
import select
import signal
import time
from typing import Any, Callable

import numpy as np
import pytest

from pyggml import Context, CPUBackend, GGMLType, lib
from pyggml.backends.cpu import _cpu_kernel_supports_raw
from pyggml.core.tensor import EMPTY_OPS

F32, F16, BF16, I32, I64, Q8 = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32,
                                GGMLType.I64, GGMLType.Q8_0)
FLOATS = (F32, F16, BF16)
LAYOUTS = ("cont", "transposed", "permuted", "padded")

#: case id pattern -> reason: refusals where ggml's kernel runs without killing the process,
#: kept on purpose because it computes garbage or writes where it should not
STRICTER = {
    r"flash_attn q=(f16|bf16)": "the CPU kernel reads q as F32 whatever its type (wrong results, "
                                "reads past the rows)",
    r"pool_[12]d a=f(32|16)/(transposed|permuted)": "the pool kernels read rows as unit-stride "
                                                    "and step over rows (1d) / planes (2d) by "
                                                    "nb[1] / nb[2]: wrong results, and pool_2d "
                                                    "writes past its destination",
    r"pool_[12]d a=(bf16|i32)": "the pool kernels read every type but F32 as F16",
    r"(relu|neg|exp|gelu|silu|tanh|floor|scale|swiglu) a=bf16": (
        "BF16 kernels that ggml 0.25 has and 0.20.2 (which pyggml also builds) lacks for gelu, "
        "silu, scale and the GLU ops; the table keeps UNARY, SCALE and GLU to F32/F16 for both"),
    r"(sum|mean|argmax|leaky_relu) a=\w+/(transposed|permuted)": (
        "their kernels check unit-stride rows with a plain assert (compiled out) and then read "
        "rows as unit-stride arrays: wrong results, no abort (tests/test_cpu.py checks the values)"),
}


class Builder:
    """Makes source tensors of a type, ne and layout in one allocating context, with data."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.rng = np.random.default_rng(0)

    def _filled(self, t: Any, ne: list[int], high: int | None = None) -> Any:
        x = self.ctx.new_tensor(t, ne)
        n = x.nelements
        if t in (I32, I64):
            data = self.rng.integers(0, high or 3, n)
        else:
            data = self.rng.standard_normal(n).astype(np.float32)
        x.set(data, reshape=True)
        return x

    def make(self, t: Any, ne: tuple[int, ...], layout: str, high: int | None = None) -> Any:
        """A tensor of logical ``ne`` (4 sizes) and ``layout``; raises what the constructors
        raise for combinations that cannot be made."""
        n0, n1, n2, n3 = ne
        c = self.ctx
        if layout == "cont":
            return self._filled(t, [n0, n1, n2, n3], high)
        if layout == "transposed":  # nb[0] > nb[1]
            return c.transpose(self._filled(t, [n1, n0, n2, n3], high))
        if layout == "permuted":    # nb[0] < nb[1] but nb[0] is not the element size
            return c.permute(self._filled(t, [n2, n0, n1, n3], high), 2, 0, 1, 3)
        if layout == "padded":      # unit stride, rows padded
            base = self._filled(t, [n0 + 32, n1, n2, n3], high)
            return c.view(base, [n0, n1, n2, n3], list(base.nb[1:]))
        raise AssertionError(layout)


def _cases(c: Context) -> list[tuple[str, Any]]:
    """(id, output tensor) for every combination the constructors accept."""
    b = Builder(c)
    out: list[tuple[str, Any]] = []

    def add(name: str, fn: Callable[[], Any]) -> None:
        try:
            out.append((name, fn()))
        except (ValueError, TypeError):
            pass  # the constructor refuses it: its own checks' business

    shapes = {"wide": (32, 3, 2, 1), "one-col": (1, 4, 2, 1)}
    one_src = {
        "relu": lambda a: c.relu(a), "neg": lambda a: c.neg(a), "exp": lambda a: c.exp(a),
        "gelu": lambda a: c.gelu(a), "silu": lambda a: c.silu(a), "tanh": lambda a: c.tanh(a),
        "sqr": lambda a: c.sqr(a), "sqrt": lambda a: c.sqrt(a), "log": lambda a: c.log(a),
        "sin": lambda a: c.sin(a), "cos": lambda a: c.cos(a), "floor": lambda a: c.floor(a),
        "scale": lambda a: c.scale(a, 2.0), "clamp": lambda a: c.clamp(a, -1, 1),
        "leaky_relu": lambda a: c.leaky_relu(a, 0.1), "norm": lambda a: c.norm(a),
        "rms_norm": lambda a: c.rms_norm(a), "l2_norm": lambda a: c.l2_norm(a),
        "sum": lambda a: c.sum(a), "sum_rows": lambda a: c.sum_rows(a), "mean": lambda a: c.mean(a),
        "cumsum": lambda a: c.cumsum(a), "soft_max": lambda a: c.soft_max(a),
        "cont": lambda a: c.cont(a), "diag_mask_inf": lambda a: c.diag_mask_inf(a, 1),
        "argsort": lambda a: c.argsort(a), "top_k": lambda a: c.top_k(a, 1),
        "cast-f16": lambda a: c.cast(a, F16), "cast-f32": lambda a: c.cast(a, F32),
        "cast-q8_0": lambda a: c.cast(a, Q8),
        "repeat": lambda a: c.repeat(a, c.new_tensor(F32, [2 * n for n in a.ne])),
        "pad": lambda a: c.pad(a, 1, 1), "interpolate": lambda a: c.interpolate(a, [2 * n for n in a.ne]),
        "pool_1d": lambda a: c.pool_1d(a, "max", 1, 1), "pool_2d": lambda a: c.pool_2d(a, "avg", 1, 1, 1, 1),
        "swiglu": lambda a: c.swiglu(a), "argmax": lambda a: c.argmax(c.view(a, list(a.ne[:2]), [a.nb[1]])),
    }
    # other types only where a kernel may take them (each refusal that dies costs a fork)
    more_types = {"cont": (I32, Q8), "cast-f32": (I32, Q8), "cast-f16": (I32,), "repeat": (I32,),
                  "sum": (I32,), "clamp": (I32,), "argsort": (I32,), "pool_1d": (I32,),
                  "pool_2d": (I32,)}
    for (op, fn), (sname, ne) in itertools.product(one_src.items(), shapes.items()):
        # a one-column tensor differs from a wide one only where nb[0] is not the element size
        layouts = LAYOUTS if sname == "wide" else ("transposed", "permuted")
        for t, layout in itertools.product((*FLOATS, *more_types.get(op, ())), layouts):
            add(f"{op} a={t.name.lower()}/{layout}/{sname}", lambda: fn(b.make(t, ne, layout)))

    ne = (32, 3, 2, 1)
    for op, (ta, tb), la, lb in itertools.product(
            ("add", "mul"), [(F32, F32), (F16, F16), (F16, F32), (BF16, F32), (F32, F16)], LAYOUTS, LAYOUTS):
        add(f"{op} a={ta.name.lower()}/{la} b={tb.name.lower()}/{lb}",
            lambda: getattr(c, op)(b.make(ta, ne, la), b.make(tb, ne, lb)))
    for (ta, tb), la, lb in itertools.product([(F32, F32), (F16, F32), (Q8, F32), (F16, F16), (F32, BF16)],
                                              LAYOUTS, LAYOUTS):
        add(f"mul_mat a={ta.name.lower()}/{la} b={tb.name.lower()}/{lb}",
            lambda: c.mul_mat(b.make(ta, (32, 3, 2, 1), la), b.make(tb, (32, 5, 2, 1), lb)))
        add(f"out_prod a={ta.name.lower()}/{la} b={tb.name.lower()}/{lb}",
            lambda: c.out_prod(b.make(ta, (32, 3, 2, 1), la), b.make(tb, (5, 3, 2, 1), lb)))
    for ta, tb in [(F32, F16), (F32, Q8), (Q8, F32), (F16, F32), (I32, F32), (F32, I32), (F32, F32), (Q8, Q8)]:
        for la, lb in itertools.product(LAYOUTS, LAYOUTS):
            add(f"cpy a={ta.name.lower()}/{la} b={tb.name.lower()}/{lb}",
                lambda: c.cpy(b.make(ta, (32, 4, 2, 1), la), b.make(tb, (32, 4, 2, 1), lb)))
    for t, la, lr in itertools.product((*FLOATS, I32, Q8), LAYOUTS, ("cont", "transposed")):
        add(f"get_rows a={t.name.lower()}/{la} rows={lr}",
            lambda: c.get_rows(b.make(t, (32, 3, 2, 1), la), b.make(I32, (2, 2, 1, 1), lr)))
    for t, la, lb in itertools.product((F32, F16), ("cont", "padded"), LAYOUTS):
        add(f"set_rows a={t.name.lower()}/{la} b={lb}",
            lambda: c.set_rows(b.make(t, (32, 3, 2, 1), la), b.make(F32, (32, 2, 2, 1), lb),
                               b.make(I64, (2, 2, 1, 1), "cont")))
    for t, la, lb, dim in itertools.product((F32, F16, I32), LAYOUTS, LAYOUTS, (0, 1)):
        add(f"concat{dim} a={t.name.lower()}/{la} b={lb}",
            lambda: c.concat(b.make(t, (32, 3, 2, 1), la), b.make(t, (32, 3, 2, 1), lb), dim))
    for t, la, mode in itertools.product((*FLOATS,), LAYOUTS, (0, 2)):
        add(f"rope{mode} a={t.name.lower()}/{la}",
            lambda: c.rope(b.make(t, (32, 3, 2, 1), la), b.make(I32, (2, 1, 1, 1), "cont"), 8, mode=mode))
    for lb, lk in itertools.product(LAYOUTS, ("cont",)):
        add(f"conv_1d x={lb}", lambda: c.conv_1d(b.make(F16, (3, 2, 4, 1), lk), b.make(F32, (8, 2, 1, 1), lb)))
        add(f"im2col x={lb}", lambda: c.im2col(b.make(F16, (3, 2, 4, 1), lk), b.make(F32, (8, 2, 1, 1), lb),
                                               1, 0, 0, 0, 1, 0, False))
    for la, lb in itertools.product(LAYOUTS, LAYOUTS):
        add(f"cross_entropy_loss a={la} b={lb}",
            lambda: c.cross_entropy_loss(b.make(F32, (32, 3, 1, 1), la), b.make(F32, (32, 3, 1, 1), lb)))
        add(f"acc b={lb}", lambda: c.acc(b.make(F32, (32, 3, 2, 1), "cont"), b.make(F32, (32, 3, 1, 1), lb),
                                         128, 384, 384, 0))
        add(f"swiglu a={la} b={lb}", lambda: c.swiglu(b.make(F32, ne, la), b.make(F32, ne, lb)))
    # norms made by Context.op (no checked constructor): the table still judges them
    for t, la in itertools.product(FLOATS, LAYOUTS):
        add(f"group_norm a={t.name.lower()}/{la}", lambda: c.op("group_norm", b.make(t, (32, 3, 4, 1), la), 2, 1e-5))
        for lb in LAYOUTS:
            add(f"rms_norm_back a={t.name.lower()}/{la} b={lb}",
                lambda: c.op("rms_norm_back", b.make(t, ne, la), b.make(F32, ne, lb), 1e-6))
    add("timestep_embedding padded", lambda: c.timestep_embedding(
        c.view(b.make(F32, (8, 1, 1, 1), "cont"), [4], []), 8))
    for tq, tk, tv in [(F32, F16, F16), (F32, F32, F32), (F32, Q8, Q8), (F32, Q8, F16), (F32, F16, F32),
                       (F32, I32, I32), (F32, F16, I32), (F32, I32, F16), (F16, F16, F16), (BF16, F16, F16)]:
        for lq, lk, lv in [("cont", "cont", "cont"), ("permuted", "cont", "cont"), ("cont", "padded", "cont"),
                           ("cont", "cont", "padded"), ("cont", "transposed", "cont"), ("cont", "cont", "permuted")]:
            add(f"flash_attn q={tq.name.lower()}/{lq} k={tk.name.lower()}/{lk} v={tv.name.lower()}/{lv}",
                lambda: c.flash_attn(b.make(tq, (32, 2, 2, 1), lq), b.make(tk, (32, 4, 2, 1), lk),
                                     b.make(tv, (32, 4, 2, 1), lv)))
        for prec in (lib.GGML_PREC_DEFAULT, lib.GGML_PREC_F32, lib.GGML_PREC_F16):
            add(f"flash_attn q={tq.name.lower()} k={tk.name.lower()} v={tv.name.lower()} prec={prec}",
                lambda: c.flash_attn(b.make(tq, (32, 2, 2, 1), "cont"), b.make(tk, (32, 4, 2, 1), "cont"),
                                     b.make(tv, (32, 4, 2, 1), "cont")).set_prec(acc=prec))
    return out


def _deaths(graphs: list[Any], timeout: float = 120.0) -> set[int]:
    """Indices of the graphs whose CPU compute kills the process (abort, segfault), computed in
    order by forked children, one thread each."""
    dead: set[int] = set()
    start = 0
    while start < len(graphs):
        start = _run_from(graphs, start, dead, timeout)
    return dead


def _run_from(graphs: list[Any], start: int, dead: set[int], timeout: float) -> int:
    """Compute graphs[start:] in one child; record the one it died in; return where to go on."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            faulthandler.disable()
            os.close(r)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            be = lib.ggml_backend_cpu_init()
            lib.ggml_backend_cpu_set_n_threads(be, 1)
            for i in range(start, len(graphs)):
                os.write(w, b"%d\n" % i)
                lib.ggml_backend_graph_compute(be, graphs[i])
            os.write(w, b"done\n")
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            break
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    last = data.split()[-1] if data.split() else b"done"
    if last == b"done":
        return len(graphs)
    dead.add(int(last))
    return int(last) + 1


def test_kernel_table_matches_the_cpu_kernels():
    with Context(256 << 20) as c, CPUBackend(1) as cpu:
        cases = _cases(c)
        assert len(cases) > 800
        graphs, verdicts = [], []
        for name, out in cases:
            g = c.new_graph(64).build_forward(out)
            nodes = [p for p in g.raw_nodes() if p.op not in EMPTY_OPS]
            ggml_ok = all(lib.ggml_backend_supports_op(cpu.ptr, p) for p in nodes)
            table_ok = all(_cpu_kernel_supports_raw(p) for p in nodes)
            graphs.append(g.ptr)
            verdicts.append((name, ggml_ok, table_ok))
        accepted = [i for i, v in enumerate(verdicts) if v[2]]
        refused = [i for i, v in enumerate(verdicts) if v[1] and not v[2]]
        dead = {accepted[i] for i in _deaths([graphs[i] for i in accepted])}
        dead |= {i for i in refused if _deaths([graphs[i]])}
    accepted_but_dies = [v[0] for i, v in enumerate(verdicts) if v[1] and v[2] and i in dead]
    refused_but_runs = [v[0] for i, v in enumerate(verdicts) if v[1] and not v[2] and i not in dead
                        and not any(re.match(k, v[0]) for k in STRICTER)]
    print(f"{len(cases)} cases, {len(dead)} kill the process, "
          f"{sum(1 for v in verdicts if v[1] and not v[2])} refused by the table")
    assert not accepted_but_dies, f"the table accepts nodes whose kernel kills the process: {accepted_but_dies}"
    assert not refused_but_runs, f"the table refuses nodes ggml computes: {refused_but_runs}"
