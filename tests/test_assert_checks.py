"""Evidence for docs/asserts.md (issue 12, point 3).

Part 1, checked: for each op constructor family and each backend / allocator / scheduler entry
point, an input that violates a GGML_ASSERT the audit classifies as "checked", "fork-trialed" or
"kernel table" goes through the Pythonic API and comes back as a Python exception.

Part 2, gaps: each gap of docs/asserts/classification.toml (G1...G17) has a test that runs the
violating input in a subprocess (the abort must not kill pytest) and asserts what the fix must
achieve: the process survives and a Python exception was raised. They abort today, so they are
strict xfails; when a fix lands they XPASS, which fails, and the marker goes with the fix.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import assert_audit, ggml_tree

import pyggml
from pyggml import ClosedError, Context, CPUBackend
from pyggml.backends.alloc import GraphAllocator
from pyggml.backends.backend import Backend
from pyggml.memory.buffer import Buffer
from pyggml.backends.cpu import cpu_buffer_from_array
from pyggml.core.gguf import GGUFWriter
from pyggml.backends.sched import Scheduler
from pyggml.backends.utils import compare_graph_backend, tensor_alloc, view_init


@pytest.fixture
def ctx():
    with Context(16 << 20) as c:
        yield c


@pytest.fixture
def cpu():
    with CPUBackend(1) as b:
        yield b


def f32(ctx, *shape):
    """An F32 tensor of NumPy shape ``shape`` holding 0, 1, 2..."""
    return ctx.from_numpy(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))


# ==============================================================================================
# Part 1: checked (one violating input per family / entry point)
# ==============================================================================================

class TestOpConstructors:
    """ggml.c op constructors: the checked method raises before ggml_<op> asserts."""

    def test_elementwise_unary_needs_contiguous_rows(self, ctx):  # ggml_unary_impl
        with pytest.raises(ValueError, match="contiguous rows"):
            ctx.relu(ctx.transpose(f32(ctx, 3, 4)))

    def test_binary_needs_tiling(self, ctx):  # ggml_add_impl ... ggml_div_impl
        for op in (ctx.add, ctx.sub, ctx.mul, ctx.div):
            with pytest.raises(ValueError, match="does not tile"):
                op(f32(ctx, 2, 4), f32(ctx, 3, 4))

    def test_scale_needs_packed_rows(self, ctx):  # ggml_scale_impl
        with pytest.raises(ValueError, match="packed"):
            ctx.scale(ctx.transpose(f32(ctx, 3, 4)), 2.0)

    def test_reductions(self, ctx):  # ggml_argmax, ggml_cumsum
        with pytest.raises(ValueError, match="matrix"):
            ctx.argmax(f32(ctx, 2, 3, 4))
        with pytest.raises(TypeError, match="F32"):
            ctx.cumsum(ctx.from_numpy(np.zeros(4, np.float16)))

    def test_repeat(self, ctx):  # ggml_repeat
        with pytest.raises(ValueError, match="does not tile"):
            ctx.repeat(f32(ctx, 3), f32(ctx, 4))

    def test_soft_max(self, ctx):  # ggml_soft_max_impl
        a = f32(ctx, 2, 4)
        with pytest.raises(ValueError, match="contiguous"):
            ctx.soft_max(ctx.transpose(a))
        with pytest.raises(ValueError, match="does not fit"):
            ctx.soft_max(a, mask=f32(ctx, 2, 5))
        with pytest.raises(TypeError, match="F32 or F16"):
            ctx.soft_max(a, mask=ctx.from_numpy(np.zeros((2, 4), np.int32)))
        with pytest.raises(ValueError, match="mask"):
            ctx.soft_max(a, max_bias=1.0)

    def test_matrix(self, ctx):  # ggml_mul_mat, ggml_out_prod
        with pytest.raises(ValueError, match="cannot mul_mat"):
            ctx.mul_mat(f32(ctx, 3, 4), f32(ctx, 3, 5))
        with pytest.raises(ValueError, match="transposed"):
            ctx.mul_mat(ctx.transpose(f32(ctx, 4, 4)), f32(ctx, 3, 4))
        with pytest.raises(ValueError, match="cannot out_prod"):
            ctx.out_prod(f32(ctx, 3, 4), f32(ctx, 2, 4))

    def test_copies_and_views(self, ctx):  # ggml_cpy_impl, ggml_reshape_Nd, ggml_new_tensor_impl (views)
        a = f32(ctx, 3, 4)
        with pytest.raises(ValueError, match="elements"):
            ctx.cpy(a, f32(ctx, 5))
        with pytest.raises(ValueError, match="contiguous"):
            ctx.reshape(ctx.transpose(a), 12)
        with pytest.raises(ValueError, match="cannot reshape"):
            ctx.reshape(a, 5, 2)
        with pytest.raises(ValueError, match="outside"):
            ctx.view(a, [4, 4])
        with pytest.raises(ValueError, match="block size"):
            ctx.cast(f32(ctx, 1, 3), "q8_0")

    def test_permute_and_concat(self, ctx):  # ggml_permute, ggml_concat
        a = f32(ctx, 2, 3)
        with pytest.raises(ValueError, match="permutation"):
            ctx.permute(a, 0, 0, 1, 2)
        with pytest.raises(ValueError, match="dim"):
            ctx.concat(a, a, 4)
        with pytest.raises(ValueError, match="differ"):
            ctx.concat(a, f32(ctx, 3, 3), 0)

    def test_rows(self, ctx):  # ggml_get_rows, ggml_set_rows
        a = f32(ctx, 3, 4)
        with pytest.raises(TypeError, match="I32"):
            ctx.get_rows(a, ctx.from_numpy(np.zeros(2, np.int64)))
        with pytest.raises(TypeError, match="F32 or F16"):
            ctx.set_rows(a, ctx.from_numpy(np.zeros((2, 4), np.int32)), ctx.from_numpy(np.zeros(2, np.int64)))
        with pytest.raises(ValueError, match="do not fit"):
            ctx.set_rows(a, f32(ctx, 2, 5), ctx.from_numpy(np.zeros(2, np.int64)))

    def test_rope(self, ctx):  # ggml_rope_impl
        a, pos = f32(ctx, 3, 2, 4), ctx.from_numpy(np.arange(3, dtype=np.int32))
        with pytest.raises(ValueError, match="mode & 1"):
            ctx.rope(a, pos, 4, mode=1)
        with pytest.raises(ValueError, match="positions"):
            ctx.rope(a, ctx.from_numpy(np.arange(2, dtype=np.int32)), 4)
        with pytest.raises(ValueError, match="freq_factors"):
            ctx.rope(a, pos, 4, freq_factors=f32(ctx, 1))

    def test_glu(self, ctx):  # ggml_glu_impl
        with pytest.raises(ValueError, match="same ne and type"):
            ctx.swiglu(f32(ctx, 2, 4), f32(ctx, 2, 6))
        with pytest.raises(ValueError, match="contiguous"):
            ctx.geglu(ctx.transpose(f32(ctx, 4, 4)))

    def test_sorting(self, ctx):  # ggml_top_k (argsort has only the INT32_MAX row limit)
        with pytest.raises(ValueError, match="top_k"):
            ctx.top_k(f32(ctx, 2, 4), 5)

    def test_resampling(self, ctx):  # ggml_interpolate_impl, pad
        with pytest.raises(TypeError, match="F32"):
            ctx.interpolate(ctx.from_numpy(np.zeros((2, 2), np.float16)), [4, 4, 1, 1])
        with pytest.raises(ValueError, match="mode"):
            ctx.interpolate(f32(ctx, 2, 2), [4, 4, 1, 1], mode=0x7F)
        with pytest.raises(ValueError, match=">= 0"):
            ctx.pad(f32(ctx, 2, 2), -1)

    def test_convolution_and_pooling(self, ctx):  # ggml_im2col, ggml_pool_1d, ggml_pool_2d
        x = f32(ctx, 1, 2, 8)                                       # ne [8, 2, 1]
        kernel = ctx.from_numpy(np.zeros((4, 3, 3), np.float16))   # ne [3, 3, 4]: 3 channels
        with pytest.raises(ValueError, match="channels"):
            ctx.conv_1d(kernel, x)
        with pytest.raises(ValueError, match="strides"):
            ctx.im2col(ctx.from_numpy(np.zeros((4, 2, 3), np.float16)), x, 0, 0, 0, 0, 1, 1, False)
        with pytest.raises(ValueError, match="no output"):
            ctx.pool_1d(f32(ctx, 2, 3), "max", 5, 1)
        with pytest.raises(ValueError, match="no output"):
            ctx.pool_2d(f32(ctx, 2, 3), "avg", 3, 3, 1, 1)

    def test_attention(self, ctx):  # ggml_flash_attn_ext, ggml_dsv4_hc_pre_impl
        q, k, v = f32(ctx, 1, 1, 2, 4), f32(ctx, 1, 1, 3, 4), f32(ctx, 1, 1, 3, 4)
        with pytest.raises(TypeError, match="F16"):
            ctx.flash_attn(q, k, v, mask=f32(ctx, 1, 1, 2, 3))
        with pytest.raises(ValueError, match="does not fit"):
            ctx.flash_attn(q, f32(ctx, 1, 1, 3, 5), v)
        with pytest.raises(ValueError, match="same"):
            ctx.dsv4_hc_pre_gated(f32(ctx, 2, 3, 4), f32(ctx, 2, 3, 5))

    def test_losses_and_accumulation(self, ctx):  # ggml_cross_entropy_loss, ggml_acc_impl
        with pytest.raises(ValueError, match="same shape"):
            ctx.cross_entropy_loss(f32(ctx, 2, 4), f32(ctx, 2, 5))
        with pytest.raises(ValueError, match="outside"):
            ctx.acc(f32(ctx, 2, 4), f32(ctx, 2, 4), 16, 32, 32, 16)
        with pytest.raises(ValueError, match="timestep"):
            ctx.timestep_embedding(f32(ctx, 2, 2), 4)

    def test_python_ops_and_arange(self, ctx):  # ggml_map_custom{1,2,3}_impl, ggml_arange
        with pytest.raises(ValueError, match="n_tasks"):
            ctx.map_custom(lambda *a: None, f32(ctx, 4), n_tasks=0)
        with pytest.raises(ValueError, match="range"):
            ctx.arange(0.0, 1.0, 0.0)

    def test_context_op_is_fork_trialed(self, ctx):  # fork-trialed constructors (ggml_ssm_conv...)
        with pytest.raises(ValueError, match="would abort the process"):
            ctx.op("win_part", ctx.from_numpy(np.zeros((2, 2, 2), np.float16)), 2)  # F32 only
        with pytest.raises(ValueError, match="would abort the process"):
            ctx.conv_transpose_1d(f32(ctx, 1, 3, 4), f32(ctx, 5, 2), 1, 1, 1)  # p0 must be 0


class TestContextTensorGraph:
    def test_context(self):  # ggml_new_tensor_impl, ggml_new_object
        with Context(4096, no_alloc=True) as c:
            with pytest.raises(ValueError, match="dims"):
                c.new_tensor("f32", [1, 1, 1, 1, 1])
            with pytest.raises(ValueError, match="block size"):
                c.new_tensor("q4_0", [7])
            with pytest.raises(MemoryError, match="context full"):
                for _ in range(1000):
                    c.new_tensor("f32", [1])
        with pytest.raises(ValueError, match="type"):
            Context(4096).new_tensor(999, [1])

    def test_tensor_settings(self, ctx):  # ggml_set_param/loss, rope_set_offset, prec_set_src...
        a = f32(ctx, 2, 4)
        node = ctx.add(a, a)
        with pytest.raises(ValueError, match="leaf"):
            node.set_param()
        with pytest.raises(ValueError, match="scalar F32"):
            a.set_loss()
        rope = ctx.rope(f32(ctx, 3, 2, 4), ctx.from_numpy(np.arange(3, dtype=np.int32)), 2)
        with pytest.raises(ValueError, match="rope offset"):
            rope.set_rope_offset(1)
        with pytest.raises(ValueError, match="FLASH_ATTN_EXT"):
            node.set_flash_attn_n_kv_max(3)
        mm = ctx.mul_mat(a, a)
        with pytest.raises(ValueError, match="source index"):
            mm.set_prec(src={11: 0})

    def test_graph_building(self, ctx):  # ggml_visit_parents_graph, ggml_build_backward_expand, ggml_graph_reset
        a = f32(ctx, 4)
        with pytest.raises(ValueError, match="too small"):
            ctx.new_graph(1).build_forward(ctx.add(ctx.add(a, a), a))
        g = ctx.new_graph(64, grads=True).build_forward(ctx.sum(ctx.sqr(a)))
        with pytest.raises(ValueError, match="parameter"):
            g.build_backward(ctx)
        with pytest.raises(ValueError, match="backward"):
            g.reset()
        with pytest.raises(ValueError, match="grads=True"):
            ctx.new_graph(64).build_forward(a).build_backward(ctx)

    def test_backward_refuses_ops_without_gradients(self, ctx):  # ggml_compute_backward defaults
        p = f32(ctx, 4).set_param()
        loss = ctx.sum(ctx.sin(ctx.tanh(p))).set_loss()
        with pytest.raises(ValueError, match="no backward pass"):
            ctx.new_graph(64, grads=True).build_forward(loss).build_backward(ctx)

    def test_closed_objects(self, cpu):  # the NULL-handle asserts of ggml-backend.cpp
        b = CPUBackend(1)
        b.close()
        with pytest.raises(ClosedError):
            b.synchronize()
        with pytest.raises(pyggml.GGMLError, match="NULL"):
            Buffer(pyggml.ffi.NULL, owned=False)


class TestBackendAllocSched:
    def _allocated(self, c, backend):
        a = c.new_tensor("f32", [4])
        out = c.add(a, a)
        g = c.new_graph(8).build_forward(out)
        return a, out, g

    def test_backend_tensor_io(self, cpu):  # ggml_backend_tensor_set/get(_async), _memset, _copy
        with Context.for_tensors(4) as c:
            a, b = c.new_tensor("f32", [4]), c.new_tensor("f32", [5])
            c.alloc_tensors(cpu)
            with pytest.raises(ValueError, match="outside"):
                cpu.tensor_set_async(a, np.zeros(5, np.float32))
            with pytest.raises(ValueError, match="outside"):
                Backend.tensor_memset(a, 0, offset=8, size=16)
            with pytest.raises(ValueError, match="same type, ne and nb"):
                Backend.tensor_copy(a, b)
            with pytest.raises(ValueError, match="shape"):
                a.set(np.zeros(5, np.float32))

    def test_backend_compute(self, cpu):  # ggml_backend_graph_compute: unallocated graph
        with Context.for_tensors(8, graph_size=8) as c:
            _, _, g = self._allocated(c, cpu)
            with pytest.raises(ValueError, match="no data"):
                cpu.graph_compute(g)

    def test_kernel_table(self, cpu):  # ops.cpp type dispatch ("fatal error")
        with Context(1 << 20) as c:
            out = c.sum_rows(c.from_numpy(np.zeros((2, 8), np.float16)))
            g = c.new_graph().build_forward(out)
            with pytest.raises(ValueError, match="cannot compute"):
                cpu.graph_compute(g)

    def test_trial_compute(self, cpu):  # kernels of Context.op nodes (roll is F32 only, no table rule)
        with Context(1 << 20) as c:
            out = c.op("roll", c.from_numpy(np.zeros((4, 2, 8), np.float16)), 1, 0, 0, 0)
            g = c.new_graph().build_forward(out)
            with pytest.raises(ValueError, match="would abort the process"):
                cpu.graph_compute(g)

    def test_trial_compute_once_per_graph_version(self, cpu, monkeypatch):
        # placing the graph anew makes the CPU check it again, but not fork again: what the
        # trial proves (the kernels of these ops, types and shapes) does not depend on where
        # the tensors are; a node built into the graph does
        forks = []
        trial = pyggml._trial.trial
        monkeypatch.setattr(pyggml._trial, "trial", lambda *a, **k: forks.append(1) or trial(*a, **k))
        x = np.arange(64, dtype=np.float32).reshape(4, 2, 8)
        with Context.for_tensors(16, graph_size=8) as c:
            a = c.new_tensor("f32", [8, 2, 4])
            out = c.op("roll", a, 1, 0, 0, 0)         # (a fork of its own: the constructor's trial)
            g = c.new_graph(8).build_forward(out)
            for placings in range(3):
                ga = GraphAllocator(cpu)
                ga.alloc_graph(g)
                a.set(x)
                cpu.graph_compute(g)
                np.testing.assert_array_equal(out.numpy(), np.roll(x, 1, axis=-1))
                ga.close()
            assert len(forks) == 2
            g.build_forward(c.op("roll", out, 1, 0, 0, 0))
            ga = GraphAllocator(cpu)
            ga.alloc_graph(g)
            a.set(x)
            cpu.graph_compute(g)
            ga.close()
            assert len(forks) == 4

    def test_alloc_ctx_tensors(self, cpu):  # ggml_backend_alloc_ctx_tensors_from_buft_impl
        with Context(1 << 20) as c:
            c.new_tensor("f32", [4])
            with pytest.raises(ValueError, match="no_alloc"):
                c.alloc_tensors(cpu)
        with Context.for_tensors(2) as c:
            with pytest.raises(ValueError, match="needs allocation"):
                c.alloc_tensors(cpu)

    def test_graph_allocator_memory_is_checked(self, cpu):  # gallocr-placed tensors after re-placement
        with Context.for_tensors(16, graph_size=8) as c:
            ga = GraphAllocator(cpu)
            a, out, g = self._allocated(c, cpu)
            ga.alloc_graph(g)
            with pytest.raises(ValueError, match="not been computed"):
                out.numpy()
            ga.close()
            with pytest.raises(ClosedError):
                cpu.graph_compute(g)

    def test_scheduler(self, cpu):  # ggml_backend_sched_new, _reserve/_alloc_graph, _set_tensor_backend
        with pytest.raises(ValueError, match="twice"):
            Scheduler([cpu, cpu])
        with pytest.raises(ValueError, match="one buffer type per backend"):
            Scheduler([cpu], bufts=[])
        with Context.for_tensors(16, graph_size=8) as c, CPUBackend(1) as other:
            sched = Scheduler([cpu], graph_size=1)
            _, out, g = self._allocated(c, cpu)
            with pytest.raises(ValueError, match="graph_size"):
                sched.alloc_graph(g)
            with pytest.raises(ValueError, match="not one of this scheduler's"):
                sched.set_tensor_backend(out, other)
            sched.close()

    def test_utils(self, cpu):  # ggml_backend_tensor_alloc, _view_init, _compare_graph_backend, cpu_buffer_from_ptr
        with Context.for_tensors(8, graph_size=8) as c:
            a = c.new_tensor("f32", [4])
            buf = cpu.alloc_buffer(256)
            with pytest.raises(ValueError, match="do not fit"):
                tensor_alloc(buf, a, offset=1)
            with pytest.raises(ValueError, match="unplaced view"):
                view_init(a)
            tensor_alloc(buf, a)
            out = c.add(a, a)
            g = c.new_graph(8).build_forward(out)
            GraphAllocator(cpu).alloc_graph(g)
            with pytest.raises(ValueError, match="not a node"):
                compare_graph_backend(cpu, cpu, g, lambda *x: True, test_nodes=[a])
        raw = np.zeros(100, np.uint8)
        with pytest.raises(ValueError, match="aligned"):
            cpu_buffer_from_array(raw[1:65])

    def test_events(self, cpu):  # ggml_backend_event_* (the CPU device has no events)
        from pyggml.backends.event import Event

        with pytest.raises(ValueError, match="events"):
            Event(pyggml.Device.of(cpu))


class TestGGUF:
    def test_writer(self, tmp_path):  # gguf_add_tensor, gguf_check_reserved_keys, gguf_kv
        with GGUFWriter() as w:
            w.add_tensor("t", np.zeros(4, np.float32))
            with pytest.raises(ValueError, match="duplicate"):
                w.add_tensor("t", np.zeros(4, np.float32))
            with pytest.raises(ValueError, match="alignment"):
                w.add_value("general.alignment", 64)
            with pytest.raises(ValueError, match="empty"):
                w.add_value("", 1)

    def test_reader(self, tmp_path):  # gguf_get_val_* typed getters, key ids
        from pyggml.core.gguf import GGUFFile, GGUFValueType, write_gguf

        path = tmp_path / "x.gguf"
        write_gguf(path, {"a.b": 3}, {"t": np.zeros(4, np.float32)})
        with GGUFFile(path) as f:
            with pytest.raises(TypeError):
                f.metadata.get_typed("a.b", GGUFValueType.STRING)
            with pytest.raises(KeyError):
                f.metadata["missing"]


# ==============================================================================================
# Part 2: gaps (strict xfail, in a subprocess)
# ==============================================================================================

PRELUDE = """
import numpy as np, pyggml
from pyggml import Context, CPUBackend
ctx = Context(16 << 20)
def T(*ne, t="f32"):
    x = ctx.new_tensor(t, list(ne))
    x.set(np.zeros(x.shape, np.int32 if t in ("i32", "i64") else np.float32))
    return x
def compute(out):
    ctx.new_graph(256).build_forward(out).compute(CPUBackend(1))
"""

EPILOGUE = """
try:
    run()
except (ValueError, TypeError, MemoryError, KeyError, pyggml.GGMLError) as e:
    print("RAISED", type(e).__name__, e)
else:
    print("NO ERROR")
"""


def _run_case(body: str, prelude: str = PRELUDE) -> subprocess.CompletedProcess:
    code = prelude + "\ndef run():\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n" + EPILOGUE
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent), GGML_NO_BACKTRACE="1")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


ABORTED = (-6, 134)  # SIGABRT (ggml_abort -> abort())


def assert_raised(body: str, prelude: str = PRELUDE, *, where: str) -> None:
    """What the fix of a gap must achieve: the process survives and pyggml raised. Today the
    process aborts in ggml source file ``where`` (AssertionError: the expected failure). Any
    other way of dying, or an abort elsewhere, is a bug of the test itself and raises
    RuntimeError, which the xfail markers do not accept."""
    r = _run_case(body, prelude)
    if r.returncode not in (0, *ABORTED):
        raise RuntimeError(f"the case failed in another way ({r.returncode}): {r.stderr.strip()[-800:]}")
    if r.returncode in ABORTED and f"/{where}" not in r.stderr:
        raise RuntimeError(f"aborted outside {where}: {r.stderr.strip()[-400:]}")
    assert r.returncode == 0, f"the interpreter died ({r.returncode}): {r.stderr.strip()[-400:]}"
    assert "RAISED" in r.stdout, f"no exception: {r.stdout.strip()[-400:]}"


def gap(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"gap: {reason}")


def test_gap_g1_tensor_copy_unplaced_view():  # G1 (fixed): ggml-backend.cpp:205 ggml_backend_buffer_get_type
    assert_raised("""
        from pyggml.backends.backend import Backend
        c = Context(1 << 20, no_alloc=True)
        a, b = c.new_tensor("f32", [8]), c.new_tensor("f32", [4])
        c.alloc_tensors(CPUBackend(1))
        Backend.tensor_copy(c.view(a, [4]), b)
    """, where='ggml-backend.cpp')


def test_gap_g2_scheduler_kernel_table():  # G2 (fixed): ops.cpp:1506 (sum_rows of F16)
    assert_raised("""
        c = Context(1 << 20, no_alloc=True)
        out = c.sum_rows(c.new_tensor("f16", [8, 2]))
        pyggml.Scheduler([CPUBackend(1)]).compute(c.new_graph().build_forward(out))
    """, where='ggml-cpu/ops.cpp')


@pytest.mark.parametrize("case", [
    # by the scheduler
    """
    c = Context(1 << 20, no_alloc=True)
    out = c.op("roll", c.new_tensor("f16", [8, 2, 4]), 1, 0, 0, 0)
    pyggml.Scheduler([CPUBackend(1)]).compute(c.new_graph().build_forward(out))
    """,
    # for a graph held by another context than the node's
    """
    c2 = Context(1 << 20)
    out = c2.op("roll", c2.new_tensor("f16", [8, 2, 4]), 1, 0, 0, 0)
    compute(out)
    """,
], ids=["scheduler", "graph-in-other-context"])
def test_gap_g3_trial_compute_skipped(case):  # G3 (fixed): ops.cpp:8608 (roll of F16)
    assert_raised(case, where='ggml-cpu/ops.cpp')


@pytest.mark.parametrize("case", ["ctx.add(a, a).set_input()", "ctx.view(a, [2]).set_input()"],
                         ids=["node", "view"])
def test_gap_g4_set_input_on_node(case):  # G4 (fixed): ggml.c:8004 ggml_set_input
    assert_raised("a = T(4)\n" + case, where='ggml.c')


@pytest.mark.parametrize("case", [
    "ctx.arange(5.0, 0.0, -1.0)",
    "ctx.arange(1.0, 1.00000001)",       # stop > start in float64, equal in ggml's float32
    "ctx.arange(0.0, 1.0, float('nan'))",
    "ctx.arange(0.0, 1e30, 1e-30)",       # more elements than int64 holds
], ids=["negative-step", "float32-equal", "nan-step", "huge-count"])
def test_gap_g5_arange_negative_step(case):  # G5 (fixed): ggml.c:5489 GGML_ASSERT(stop > start)
    assert_raised(case, where='ggml.c')


G6_CASES = {  # each aborted in ggml.c:1787 ggml_new_tensor_impl before the fix
    "new_tensor-quantized": 'c.new_tensor("iq1_s", [2**40, 2**23])',
    "new_tensor-zero-size": 'c.new_tensor("f32", [2**40, 0, 2**40])',
    "mul_mat-result": 'c.mul_mat(c.new_tensor("f32", [1, 2**32]), c.new_tensor("f32", [1, 2**32]))',
    "get_rows-result": 'c.get_rows(c.new_tensor("f32", [2**40, 2]), c.new_tensor("i32", [2**40]))',
    "transpose-order": 'c.transpose(c.new_tensor("i8", [2**62, 1]))',   # INT64_MAX / 2**62 == 1
    "permute-zero": 'c.permute(c.new_tensor("f32", [0, 2**40, 2**40]), 2, 1, 0, 3)',
    "reshape-order": 'c.reshape(c.new_tensor("i8", [2**62]), 1, 2**62)',
    "view-order": 'c.view(c.new_tensor("i8", [2**62]), [1, 2**62], [1])',
    "concat-result": 'c.concat(c.new_tensor("i8", [2**31, 2**31]), c.new_tensor("i8", [2**31, 2**31]), 1)',
    "conv_1d-im2col": 'c.conv_1d(c.new_tensor("f16", [2**20, 2**10, 2]), c.new_tensor("f32", [2**40, 2**10]), p0=2**20)',
}


@pytest.mark.parametrize("case", list(G6_CASES.values()), ids=list(G6_CASES))
def test_gap_g6_element_count_overflow(case):  # G6 (fixed): ggml.c:1787 ggml_new_tensor_impl
    assert_raised("c = Context(1 << 20, no_alloc=True)\n" + case, where="ggml.c")


def test_g6_element_count_check_is_ggmls():
    """_check_nelements refuses exactly what ggml_new_tensor_impl's loop asserts, on both sides
    of its order-dependent edge: ggml itself makes each tensor (in a forked child, where it may
    abort) and _check_nelements must agree. new_tensor refuses a quantized ne[0] whose
    ggml_nbytes (ne[0] * type_size in size_t) would wrap; mul_mat's shortcut still lets a large
    result through."""
    from pyggml import ffi, lib
    from pyggml._trial import trial
    from pyggml.core.ops import _check_nelements
    shapes = [[2**62, 1], [2**61, 3], [1, 2**62 - 1], [1, 2**62], [3, (2**63 - 1) // 3 - 1],
              [3, (2**63 - 1) // 3], [0, 2**40, 2**40], [2**40, 0, 2**40], [2**20, 0, 2**20, 2**20],
              [2**21, 2**21, 2**21], [2**21, 2**21, 2**20]]
    raw = lib.ggml_init({"mem_size": 1 << 20, "mem_buffer": ffi.NULL, "no_alloc": True})
    try:
        for ne in shapes:
            died = trial(lambda: lib.ggml_new_tensor(raw, lib.GGML_TYPE_I8, len(ne), ffi.new("int64_t[]", ne)))
            try:
                _check_nelements(ne, "t")
                refused = False
            except ValueError:
                refused = True
            assert refused == (died is not None), (ne, died)
    finally:
        lib.ggml_free(raw)
    c = Context(1 << 20, no_alloc=True)
    with pytest.raises(ValueError, match="ggml_nbytes would overflow"):
        c.new_tensor("iq1_s", [2**60])
    assert c.mul_mat(c.new_tensor("f32", [2**20, 2**22]), c.new_tensor("f32", [2**20, 2**30])).ne == (2**22, 2**30, 1, 1)



BACKWARD_CASES = {
    "swiglu-unsplit": "a = T(8, 2).set_param(); out = ctx.swiglu(a)",                   # ggml.c:7219
    "soft_max-mask-param": "a = T(4, 2).set_param(); out = ctx.soft_max(a, T(4, 2).set_param())",  # 7102
    "cross_entropy-labels-param": "out = ctx.cross_entropy_loss(T(4, 2).set_param(), T(4, 2).set_param())",  # 7213
    "mul_mat-broadcast": "out = ctx.mul_mat(T(4, 3, 1, 1).set_param(), T(4, 5, 1, 2))",     # 6934
    "get_rows-3d": 'out = ctx.get_rows(T(4, 3, 2).set_param(), T(2, 2, t="i32"))',          # 3993
    "rope-freq_factors-param":
        'out = ctx.rope(T(4, 2, 3).set_param(), T(3, t="i32"), 4, freq_factors=T(2).set_param())',  # 7129
    "win_part": 'out = ctx.op("win_part", T(4, 6, 6).set_param(), 2)',                     # 1942
    "view-of-f16": 'out = ctx.cast(ctx.view(T(4, 2, t="f16").set_param(), [4]), "f32")',    # 2197
    "view-of-permuted": "out = ctx.cont(ctx.view(ctx.permute(T(4, 2).set_param(), 1, 0), [2]))",  # 3463
    "cont-of-transposed-gradient": "out = ctx.cont(ctx.transpose(ctx.cont(T(4, 2).set_param())))",  # 7011
}


@pytest.mark.parametrize("case", list(BACKWARD_CASES.values()), ids=list(BACKWARD_CASES))
def test_gap_g7_build_backward(case):  # G7 (fixed): ggml.c ggml_compute_backward and its constructors
    assert_raised(case + "\nloss = ctx.sum(out).set_loss()\n"
                  "ctx.new_graph(2048, grads=True).build_forward(loss).build_backward(ctx)", where="ggml.c")


PYBUFT_PRELUDE = PRELUDE + """
from pyggml.impl import HostBuffer, PyBufferType
from pyggml.backends.alloc import GraphAllocator
class Padded(PyBufferType):
    def get_name(self): return "PADDED"
    def alloc_buffer(self, size): return HostBuffer(size)
    def is_host(self): return True
    def get_alloc_size(self, t): return int(pyggml.lib.ggml_nbytes(t.ptr)) + 64
"""


def test_gap_g8_python_buffer_type_alloc_size():  # G8 (fixed): ggml-backend.cpp:71 ggml_backend_buft_get_alloc_size
    assert_raised("""
        c = Context(1 << 20, no_alloc=True)
        a = c.new_tensor("f32", [4])
        g = c.new_graph().build_forward(c.add(a, a))
        GraphAllocator(Padded().as_buffer_type()).alloc_graph(g)
    """, PYBUFT_PRELUDE, where='ggml-backend.cpp')


@pytest.mark.parametrize("case", [
    "compute(ctx.get_rows(ctx.from_numpy(np.zeros((3, 4), np.float32)), ctx.from_numpy(np.array([0, 7], np.int32))))",
    ("compute(ctx.set_rows(ctx.from_numpy(np.zeros((3, 4), np.float32)), ctx.from_numpy(np.ones((2, 4), np.float32)), "
     "ctx.from_numpy(np.array([0, 9], np.int64))))"),
], ids=["get_rows", "set_rows"])
def test_gap_g9_row_indices_out_of_range(case):  # G9 (fixed): ops.cpp:5363 get_rows, 5488 set_rows
    assert_raised(case, where='ggml-cpu/ops.cpp')


def test_gap_g10_diag_mask_negative_n_past():  # G10 (fixed): ops.cpp:5738
    assert_raised("compute(ctx.diag_mask_inf(T(4, 3), -1))", where='ggml-cpu/ops.cpp')


@pytest.mark.parametrize("case", [
    "compute(ctx.norm(T(4, 3), -1.0))",
    "compute(ctx.rms_norm(T(4, 3), -1.0))",
    "compute(ctx.l2_norm(T(4, 3), float('nan')))",
], ids=["norm", "rms_norm", "l2_norm-nan"])
def test_gap_g11_negative_eps(case):  # G11 (fixed): ops.cpp:4026, 4132, 4502
    assert_raised(case, where="ggml-cpu/ops.cpp")


LAYOUT_CASES = {
    "repeat": "compute(ctx.repeat(Tt, T(12, 8)))",                 # ops.cpp:1720
    "sum_rows": "compute(ctx.sum_rows(Tt))",                        # ops.cpp:1470
    "cumsum": "compute(ctx.cumsum(Tt))",                            # ops.cpp:1416
    "rms_norm": "compute(ctx.rms_norm(Tt))",                        # ops.cpp:4123
    "clamp": "compute(ctx.clamp(Tt, 0, 1))",                        # ops.cpp:6074
    "diag_mask_inf": "compute(ctx.diag_mask_inf(Tt, 0))",          # ops.cpp:5745
    "acc": "compute(ctx.acc(T(6, 4), Tt, 24, 96, 96, 0))",         # ops.cpp:1206
    "scale-row-padded": "compute(ctx.scale(ctx.view(T(8, 4), [4, 4], [32]), 2.0))",  # ops.cpp:4886
    "rope": 'compute(ctx.rope(ctx.permute(T(4, 2, 3), 1, 0, 2), T(3, t="i32"), 2))',  # ops.cpp:6347
    "flash_attn-q": 'compute(ctx.flash_attn(ctx.permute(T(2, 4, 1, 1), 1, 0, 2, 3), T(4, 3, 1, 1, t="f16"), '
                    'T(4, 3, 1, 1, t="f16")))',                    # ops.cpp:9467
    "cpy-from-quantized": 'compute(ctx.cpy(T(32, 2, t="q8_0"), ctx.transpose(T(2, 32))))',  # ops.cpp:491
    "cpy-to-quantized-view": 'compute(ctx.cpy(T(32, 2), ctx.view(T(64, 2, t="q8_0"), [32, 2], [68])))',  # ops.cpp:321
    "mul_mat-src1": "compute(ctx.mul_mat(T(6, 3), Tt))",            # ggml-cpu.c:1289
    "add": "compute(ctx.add(Tt, Tt))",                              # binary-ops.cpp:59
    "sqr": "compute(ctx.sqr(Tt))",                                  # unary-ops.cpp:114
    # found with the fix (tests/test_cpu_kernel_table.py): ggml_is_contiguous_rows holds for a
    # one-column transpose (ne0 == 1), whose nb[0] is still not the element size
    "relu-one-column": "compute(ctx.relu(ctx.transpose(T(4, 1))))",  # unary-ops.cpp:119
    "mul_mat-src0-permuted": "compute(ctx.mul_mat(ctx.permute(T(2, 6, 3), 2, 0, 1), T(6, 5, 2)))",  # ggml-cpu.c:1288
    # and a type the table let through: clamp has no BF16 kernel
    "clamp-bf16": 'compute(ctx.clamp(T(4, 2, t="bf16"), 0, 1))',   # ops.cpp:6173
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES.values()), ids=list(LAYOUT_CASES))
def test_gap_g12_kernel_layouts(case):  # G12 (fixed)
    assert_raised("Tt = ctx.transpose(T(4, 6))\n" + case, where='ggml-cpu/')


@pytest.mark.parametrize("mode", [4, 16, 32, 24, 40, 6])
def test_gap_g13_rope_mode(mode):  # G13 (fixed): ops.cpp:6447
    assert_raised(f'compute(ctx.rope(T(4, 2, 3), T(3, t="i32"), 4, mode={mode}))', where='ggml-cpu/ops.cpp')


@pytest.mark.parametrize("types", ["i32 i32", "f16 i32"], ids=["k-and-v", "v"])
def test_gap_g14_flash_attn_kv_types(types):  # G14 (fixed): ops.cpp:8923
    k, v = types.split()
    assert_raised(f'compute(ctx.flash_attn(T(4, 2, 1, 1), T(4, 3, 1, 1, t="{k}"), T(4, 3, 1, 1, t="{v}")))',
                  where="ggml-cpu/ops.cpp")


def test_flash_attn_k_without_vec_dot_is_refused():
    """K of a type without a CPU vec_dot (I32) with a valid V: the kernel's K check passes (the
    F32 vec_dot type converts) and it calls a NULL vec_dot (SIGSEGV without the rule)."""
    r = _run_case('compute(ctx.flash_attn(T(4, 2, 1, 1), T(4, 3, 1, 1, t="i32"), T(4, 3, 1, 1, t="f16")))')
    assert r.returncode == 0 and "RAISED ValueError" in r.stdout, (r.returncode, r.stdout, r.stderr[-400:])


PYBACKEND_PRELUDE = PRELUDE + """
from pyggml import GGMLType, Scheduler
from pyggml.backends.cpu import cpu_buffer_type
from pyggml.backends.device import device_by_name
from pyggml.impl import HostBuffer, PyBackend, PyBufferType, PyDevice, PyRegistry, register
from pyggml.core.ops import host_array
from pyggml.backends.alloc import GraphAllocator
from pyggml.backends.utils import graph_copy
MODE = None

class AddBackend(PyBackend):
    def graph_compute(self, graph):
        for node in graph.nodes:
            if not node.is_empty_op():
                host_array(node)[...] = host_array(node.src[0]) + host_array(node.src[1])
    def graph_optimize(self, graph, params):
        if params is not None and MODE == "dep":
            params.add_alloc_dep(graph.nodes[0], graph.leafs[0])   # `until` is a leaf

class NoViews(HostBuffer):
    def init_tensor(self, t):
        if t.view_src is not None:
            raise RuntimeError("no views here")

class NoViewsType(PyBufferType):
    def get_name(self): return "NOVIEWS"
    def alloc_buffer(self, size): return NoViews(size)
    def is_host(self): return True

class AddDevice(PyDevice):
    def get_name(self): return "PYADD"
    def get_description(self): return "ADD in NumPy"
    def init_backend(self, params): return AddBackend(self)
    def get_buffer_type(self): return NoViewsType() if MODE == "copy" else cpu_buffer_type()
    def supports_op(self, op):
        return op.is_empty_op() or (op.op_name == "ADD" and op.type == GGMLType.F32
                                    and op.src[0].ne == op.src[1].ne)
    def offload_op(self, op): return True

def setup(mode):
    global MODE
    MODE = mode
    register(PyRegistry("PYADD", [AddDevice()]))
    be, cpu = device_by_name("PYADD").init(), CPUBackend(1)
    c = Context.for_tensors(16, graph_size=32)
    a = c.new_tensor("f32", [4, 2]).set_input()
    b = c.new_tensor("f32", [4, 2]).set_input()
    return be, cpu, c, a, b
"""


def test_gap_g15_add_alloc_dep_until_not_a_node():  # G15 (fixed): ggml-backend.cpp:1561
    assert_raised("""
        be, cpu, c, a, b = setup("dep")
        g = c.new_graph(32).build_forward(c.add(c.add(a, b), b))
        s = Scheduler([be, cpu], graph_size=64)
        s.alloc_graph(g)
        a.set(np.ones((2, 4), np.float32)); b.set(np.ones((2, 4), np.float32))
        s.compute(g)
    """, PYBACKEND_PRELUDE, where='ggml-backend.cpp')


def test_gap_g16_graph_copy_init_tensor_failure():  # G16 (fixed): ggml-backend.cpp:2210 graph_copy_init_tensor
    assert_raised("""
        be, cpu, c, a, b = setup("copy")
        g = c.new_graph(32).build_forward(c.add(c.view(a, [4, 2]), b))
        GraphAllocator(cpu).alloc_graph(g)
        a.set(np.ones((2, 4), np.float32)); b.set(np.ones((2, 4), np.float32))
        try:
            graph_copy(be, g)
        except RuntimeError as e:   # the init_tensor's own exception, raised once ggml returns
            raise ValueError(f"init_tensor raised {e}")
    """, PYBACKEND_PRELUDE, where='ggml-backend.cpp')


def test_gap_g17_flash_attn_accumulator_precision():  # G17 (fixed): ops.cpp:9589
    assert_raised("""
        out = ctx.flash_attn(T(4, 2, 1, 1), T(4, 3, 1, 1, t="f16"), T(4, 3, 1, 1, t="f16"))
        out.set_prec(acc=pyggml.lib.GGML_PREC_F16)
        compute(out)
    """, where='ggml-cpu/ops.cpp')


def test_gap_g18_scheduler_hash_set_full():  # G18 (fixed): ggml-impl.h:330 ggml_hash_find_or_insert
    assert_raised("""
        c = Context.for_tensors(8, graph_size=8)
        a = c.new_tensor("f32", [4])
        pyggml.Scheduler([CPUBackend(1)], graph_size=2).alloc_graph(c.new_graph(8).build_forward(c.add(a, a)))
    """, where='ggml-impl.h')


@pytest.mark.parametrize("case", [
    "c.acc(a, b, 16, 16, 16, (1 << 30) + 16)",                      # the misuse campaign's reproducer
    "c.acc_inplace(a, b, 16, 16, 16, (1 << 30) + 16)",
    "c.acc(e, c.new_tensor('f32', [0]), 16, 16, 16, 1 << 30)",      # an empty a: no extent to check
    "c.acc(a, b, 2**31, 16, 16, 0)",                                 # a stride past int32
], ids=["acc", "acc_inplace", "empty", "stride"])
def test_gap_g19_acc_offset(case):  # G19 (fixed): ggml.c:2202 GGML_ASSERT(offset < (size_t)(1 << 30))
    body = ("c = Context.for_tensors(8, graph_size=8)\n"
            "a, b = c.new_tensor('f32', [1 << 29]), c.new_tensor('f32', [4])\n"
            "e = c.new_tensor('f32', [64, 0, 0])\n" + case)
    r = _run_case(body)
    assert r.returncode == 0, f"the interpreter died ({r.returncode}): {r.stderr.strip()[-400:]}"
    assert "RAISED ValueError acc:" in r.stdout, r.stdout


def test_acc_still_takes_what_ggml_takes(ctx, cpu):
    """The int32 limits of _check_acc refuse nothing in range: the largest stride and an offset
    just under 2**30 are accepted, and acc / acc_inplace add b into the view of a as NumPy does."""
    c = Context(1 << 20, no_alloc=True)
    big = c.new_tensor("f32", [1 << 29])
    assert c.acc(big, c.new_tensor("f32", [4]), 2**31 - 1, 16, 16, (1 << 30) - 16).ne == big.ne
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    y = np.ones((2, 3), np.float32)
    for inplace in (False, True):
        a, b = ctx.from_numpy(x), ctx.from_numpy(y)
        op = ctx.acc_inplace if inplace else ctx.acc
        out = op(a, b, 6 * 4, 24 * 4, 24 * 4, (1 * 6 + 2) * 4)   # rows 1..2, columns 2..4
        ctx.new_graph(16).build_forward(out).compute(cpu)
        want = x.copy()
        want[1:3, 2:5] += y
        np.testing.assert_array_equal(out.numpy(), want)


# ==============================================================================================
# Part 3: parameter asserts (docs/asserts/classification.toml, section "parameter asserts")
# ==============================================================================================

def _parameter_probes():
    """(site, verdict, probe) for every parameter assert of the classification, by the audit's
    parser; empty where the audit cannot run (no ggml source, another ggml)."""
    try:
        import pyggml_build.pins as pins
        A = assert_audit()  # needs tomllib (tomli on Python 3.10)
    except ImportError:  # an installed pyggml without the source checkout
        return []
    src = ggml_tree() / "src"
    if (pyggml.GGML_VERSION != pins.DEFAULT_VERSION or not (src / "ggml.c").is_file()
            or not A.CLASSIFICATION.is_file()):
        return []
    clf = A.Classifier(A.load_classification())
    out = []
    for site in A.collect(src):
        if site.params:
            verdict, probe = clf.classify(site), clf.probe(site)
            if probe is not None:
                out.append(pytest.param(site, verdict, probe, id=f"{site.function}:{site.line}"))
    return out


@pytest.mark.parametrize("site, verdict, probe", _parameter_probes())
def test_parameter_assert_is_refused(site, verdict, probe):
    """The probe the classification gives for a parameter assert reaches it through the
    Pythonic layer, in a subprocess: the process survives and a Python exception is raised;
    a checked site raises before any forked trial, a fork-trialed one from the trial of this
    very assert (its message names the line)."""
    r = _run_case(probe)
    assert r.returncode == 0, f"the interpreter died ({r.returncode}): {r.stderr.strip()[-400:]}"
    assert "RAISED" in r.stdout, f"no exception: {r.stdout.strip()[-400:]}"
    if verdict.cls == "fork-trialed":
        assert f"{site.file}:{site.line}: GGML_" in r.stdout, r.stdout
    else:
        assert "would abort the process" not in r.stdout, r.stdout


def test_fixed_gaps_do_not_over_refuse():
    """The checks of G1, G2 and G18 refuse only what aborts: a view given its buffer with
    view_init copies, a scheduler one slot above nodes + leafs allocates, and a scheduler
    computes a node the kernel table accepts (F32 sum_rows) against NumPy."""
    from pyggml import Scheduler
    from pyggml.backends.backend import Backend
    from pyggml.backends.utils import view_init
    with CPUBackend(1) as cpu:
        c = Context(1 << 20, no_alloc=True)
        a, b = c.new_tensor("f32", [8]), c.new_tensor("f32", [4])
        c.alloc_tensors(cpu)
        a.set(np.arange(8, dtype=np.float32))
        v = c.view(a, [4], offset=16)
        view_init(v)
        Backend.tensor_copy(v, b)
        np.testing.assert_array_equal(b.numpy(), [4, 5, 6, 7])

        c2 = Context.for_tensors(8, graph_size=8)
        x = c2.new_tensor("f32", [4])
        Scheduler([cpu], graph_size=3).alloc_graph(c2.new_graph(8).build_forward(c2.add(x, x)))

        c3 = Context(1 << 20, no_alloc=True)
        m = c3.new_tensor("f32", [8, 2])
        g = c3.new_graph().build_forward(c3.sum_rows(m))
        s = Scheduler([cpu])
        s.alloc_graph(g)
        data = np.arange(16, dtype=np.float32).reshape(2, 8)
        m.set(data)
        s.compute(g)
        np.testing.assert_array_equal(g.nodes[-1].numpy().ravel(), data.sum(axis=1))

def test_side_finding_cross_entropy_loss_computes(ctx, cpu):
    """Side finding of the audit (fixed): the CROSS_ENTROPY_LOSS rule of the kernel table sliced a
    cdata array (p.src[:2]), which cffi rejects, so cross_entropy_loss could not be computed."""
    logits = np.array([[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    labels = np.array([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], np.float32)
    out = ctx.cross_entropy_loss(ctx.from_numpy(logits), ctx.from_numpy(labels))
    ctx.new_graph().build_forward(out).compute(cpu)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), -(labels * logp).sum() / 2, rtol=1e-5)


def test_fixed_g3_g7_do_not_over_refuse(cpu):
    """G3 and G7 add forked trials, not refusals: a scheduler computes a Context.op node (roll,
    against np.roll; the trial ran: the op is a trial op and the node is on the CPU backend),
    a graph in another context than its Context.op node computes, and Graph.build_backward
    builds a gradient whose nodes (SILU_BACK...) become trial ops of the context and whose
    value matches NumPy's derivative of sum(silu(x))."""
    from pyggml import Scheduler
    from pyggml.backends.graph_run import run_of
    from pyggml.enums import Op
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    c = Context(1 << 20, no_alloc=True)
    a = c.new_tensor("f32", [8, 3])
    out = c.op("roll", a, 1, 0, 0, 0)
    g = c.new_graph().build_forward(out)
    s = Scheduler([cpu])
    s.alloc_graph(g)
    a.set(x)
    s.compute(g)
    assert run_of(g).checks[s._ptr].trialed
    np.testing.assert_array_equal(out.numpy(), np.roll(x, 1, axis=-1))

    with Context(1 << 20) as c1, Context(1 << 20) as c2:
        r = c2.op("roll", c2.from_numpy(x), 1, 0, 0, 0)
        c1.new_graph().build_forward(r).compute(cpu)
        np.testing.assert_array_equal(r.numpy(), np.roll(x, 1, axis=-1))

    with Context(16 << 20) as ctx:
        v = (x - 12) / 4
        p = ctx.from_numpy(v).set_param()
        loss = ctx.sum(ctx.silu(p)).set_loss()
        gb = ctx.new_graph(256, grads=True).build_forward(loss).build_backward(ctx)
        assert Op.SILU_BACK in ctx._trial_ops
        gb.reset()
        gb.compute(cpu)
        sig = 1 / (1 + np.exp(-v))
        np.testing.assert_allclose(gb.grad(p).numpy(), sig * (1 + v * (1 - sig)), rtol=1e-5, atol=1e-6)


def test_mul_mat_of_a_transposed_tensor_that_ggml_calls_contiguous(run_isolated):
    """Fuzz seeds 9026/9028/9031: ``ggml_is_contiguous`` ignores the strides of a dim of size 1,
    so the transpose of an ne [2, 1] tensor is a contiguous ne [1, 2] one, and transposed
    (nb[0] > nb[1]): mul_mat skipped its ``ggml_is_transposed`` check for contiguous ``a`` and
    ggml asserted."""
    r = run_isolated("""
        import pytest
        from pyggml import Context
        with Context.for_tensors(16) as ctx:
            for ne in ([2, 1, 3, 3], [2, 1], [5, 1, 2]):
                a = ctx.transpose(ctx.new_tensor("f32", ne))
                b = ctx.new_tensor("f32", [a.ne[0], 4, *a.ne[2:]])
                with pytest.raises(ValueError, match="transposed"):
                    ctx.mul_mat(a, b)
        print("refused")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "refused"


def test_an_empty_tensor_whose_reduction_ggml_would_abort_on_is_refused():
    """ne [0, 2**62] passes ggml's element-count check (it starts from ne[0] = 0), but its mean
    has ne [1, 2**62], which ggml_new_tensor_impl asserts on (ggml.c: INT64_MAX / ne[i] >
    current_nelements): the mean killed the interpreter. new_tensor refuses such a tensor."""
    assert_raised('c = Context(1 << 20, no_alloc=True)\nc.mean(c.new_tensor("f32", [0, 2**62]))', where="ggml.c")
    c = Context(1 << 20, no_alloc=True)
    with pytest.raises(ValueError, match=r"reduction of it over ne\[0\]"):
        c.new_tensor("f32", [0, 2**62])
    assert c.mean(c.new_tensor("f32", [0, 2**40])).ne == (1, 2**40, 1, 1)   # still fine
