"""pyggml.impl: backends written in Python — registration, scheduling beside the CPU, errors, events, threads."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import pyggml
from arith import ArithBackend, ArithDevice, HostBufferType, arith, arith_expected, arith_graph, registered  # noqa: F401 - arith: a fixture
from pyggml import ClosedError, Context, CPUBackend, GGMLType, Scheduler
from pyggml.backends.device import device_by_name
from pyggml.enums import DeviceType
from pyggml.impl import HostBuffer, PyBufferType, PyRegistry, register, unregister
from pyggml.impl._vtable import slot_arity
from pyggml.raw import lib
from pyggml.impl.numpy import NumpyDevice


def test_registered_device_appears_in_ggml_enumeration(arith):
    assert "ARITH" in [d.name for d in pyggml.devices()]
    dev = device_by_name("arith")
    assert dev.type == DeviceType.ACCEL and dev.description.startswith("element-wise")
    assert pyggml.Registry.of(dev).name == "ARITH"
    with dev.init() as be:
        assert be.name == "ARITH" and len(be.guid) == 16


def test_scheduler_splits_between_python_backend_and_cpu(arith):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = x + 1
    be, cpu = device_by_name("ARITH").init(), CPUBackend()
    sched = Scheduler([be, cpu])
    with Context.for_tensors(16, graph_size=32) as ctx:
        a, b, out, g = arith_graph(ctx)
        sched.alloc_graph(g)
        a.set(x)
        b.set(y)
        sched.compute(g)
        np.testing.assert_array_equal(out.numpy(), arith_expected(x, y))
        assert sched.n_splits == 3     # ARITH (ADD, MUL) | CPU (SQR) | ARITH (ADD)
        assert arith.seen == ["ADD", "MUL", "ADD"]
        assert sched.get_tensor_backend(out) is be
    sched.close()
    be.close()
    cpu.close()


def test_exception_in_graph_compute_is_reraised_not_success(arith):
    arith.fail = True
    be, cpu = device_by_name("ARITH").init(), CPUBackend()
    sched = Scheduler([be, cpu])
    with Context.for_tensors(16, graph_size=32) as ctx:
        a, b, out, g = arith_graph(ctx)
        sched.alloc_graph(g)
        with pytest.raises(RuntimeError, match="backend failure"):
            sched.compute(g)
    sched.close()
    be.close()
    cpu.close()


def test_own_buffer_type_and_compute_from_another_thread():
    dev = ArithDevice("ARITH_OWN", own_buffers=True)
    with registered("ARITH_OWN", dev):
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        be = device_by_name("ARITH_OWN").init()
        buft = be.default_buffer_type
        assert buft.name == "ARITH_HOST" and buft.is_host and pyggml.Device.of(buft).name == "ARITH_OWN"
        with Context.for_tensors(16, graph_size=32) as ctx:
            a = ctx.new_tensor(GGMLType.F32, [4, 2])
            b = ctx.new_tensor(GGMLType.F32, [4, 2])
            out = (a + b) * a
            buf = ctx.alloc_tensors(be)        # one HostBuffer, data in NumPy memory
            assert buf.name == "ARITH_HOST" and HostBufferType.allocated
            a.set(x)
            b.set(x)
            np.testing.assert_array_equal(a.numpy(), x)   # get_tensor of the Python buffer
            g = ctx.new_graph(32).build_forward(out)
            pyggml.GraphAllocator(be).alloc_graph(g)
            errors = []

            def work():
                try:
                    g.compute(be)
                except BaseException as e:  # pragma: no cover - reported below
                    errors.append(e)

            t = threading.Thread(target=work)
            t.start()
            t.join()
            assert not errors
            np.testing.assert_array_equal(out.numpy(), (x + x) * x)
        be.close()


class OwnBuffersNumpyDevice(NumpyDevice):
    """The NumPy device with its own buffer type, reading no other (as a GPU): a scheduler
    copies the inputs it reads from the CPU's buffers into its splits."""

    def __init__(self):
        self.own = HostBufferType()
        super().__init__()

    def get_name(self):
        return "NUMPY_COPY"

    def get_buffer_type(self):
        return self.own

    def supports_buft(self, buft):
        return buft.name == "ARITH_HOST"


@pytest.fixture
def copying():
    """(the NUMPY_COPY backend, a CPU backend, weights(array) -> a tensor in a buffer of the
    device marked "weights", so that the nodes reading it run there)."""
    with registered("NUMPY_COPY", OwnBuffersNumpyDevice()):
        with device_by_name("NUMPY_COPY").init() as be, CPUBackend(1) as cpu, \
                Context.for_tensors(4) as wctx:
            bufs = []

            def weights(array):
                t = wctx.from_numpy(array)
                bufs.append(wctx.alloc_tensors(be))
                bufs[-1].usage = "weights"
                t.set(array)
                return t

            yield be, cpu, weights
            for b in bufs:
                b.close()


def test_inputs_read_only_through_a_splits_copies_can_be_set_after_alloc_graph(copying):
    """The split rewrites the nodes to read its copies of the inputs (which stay on the CPU
    backend): no node reads an input itself then, and the input's buffer must still be known
    as live (found by MiniLM's packed batches on Vulkan and RPC: ClosedError from Tensor.set
    right after alloc_graph)."""
    be, cpu, weights = copying
    x, y = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 0.5, np.float32)
    w = weights(np.ones((2, 4), np.float32))
    with Context.for_tensors(16, graph_size=32) as ctx, Scheduler([be, cpu], graph_size=64) as sched:
        a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
        b = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
        out = ((w + a) * b).set_output()
        g = ctx.new_graph(32).build_forward(out)
        for k in range(2):
            sched.alloc_graph(g)
            assert sched.get_tensor_backend(out) is be and sched.get_tensor_backend(a) is cpu
            assert a._ptr not in {out._ptr.src[0].src[1], out._ptr.src[1]}  # nodes read the copies
            a.set(x + k)
            b.set(y)
            sched.compute(g)
            np.testing.assert_array_equal(out.numpy(), (1 + x + k) * y)


def test_closing_the_buffer_of_a_tensor_read_through_a_splits_copy_refuses_the_compute(copying):
    """After the split, a node reads the split's copy of ``a`` (in a CPU buffer the device
    cannot use); each compute copies ``a`` again. Once ``a``'s buffer is closed, computing must
    raise ClosedError (it read the freed memory: the check looked only at the rewritten nodes)."""
    be, cpu, weights = copying
    w = weights(np.ones((2, 4), np.float32))
    with Context.for_tensors(4) as actx, Context.for_tensors(16, graph_size=32) as ctx, \
            Scheduler([be, cpu], graph_size=64) as sched:
        a = actx.new_tensor(GGMLType.F32, [4, 2])
        abuf = actx.alloc_tensors(cpu)
        a.set(np.full((2, 4), 2, np.float32))
        b = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
        out = ((w + a) * b).set_output()
        g = ctx.new_graph(32).build_forward(out)
        sched.alloc_graph(g)
        assert out._ptr.src[0].src[1] != a._ptr  # the node reads the split's copy
        b.set(np.full((2, 4), 3, np.float32))
        sched.compute(g)
        np.testing.assert_array_equal(out.numpy(), np.full((2, 4), 9, np.float32))
        abuf.close()
        with pytest.raises(ClosedError, match="freed or replaced"):
            sched.compute(g)


def test_row_indices_read_through_a_splits_copy_are_checked_in_the_original(copying):
    """get_rows on a device that reads only its own buffers: the split copies the index input
    into the device at compute time. The index check reads the input the user set, not the
    device's copy, which holds the previous compute's indices (a check made again while the
    graph is split read the copy: an index out of range went on to the device's kernel, an
    out-of-bounds read on a GPU)."""
    be, cpu, weights = copying
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    wt = weights(w)
    with Context.for_tensors(16, graph_size=32) as ctx, Scheduler([be, cpu], graph_size=64) as sched:
        idx = ctx.new_tensor(GGMLType.I32, [2]).set_input()
        rows = ctx.get_rows(wt, idx).set_output()
        g = ctx.new_graph(32).build_forward(rows)
        sched.alloc_graph(g)
        assert sched.get_tensor_backend(rows) is be and rows._ptr.src[1] != idx._ptr
        idx.set(np.array([3, 1], np.int32))
        sched.compute(g)
        np.testing.assert_array_equal(rows.numpy(), w[[3, 1]])
        idx.set(np.array([0, 4], np.int32))          # row 4 of 4 rows
        with pytest.raises(ValueError, match="reads row index 4"):
            sched.compute(g)


def test_registration_is_undone_at_interpreter_exit(tmp_path):
    code = textwrap.dedent('''
        import sys
        sys.path.insert(0, sys.argv[1])
        from arith import ArithDevice
        from pyggml.impl import PyRegistry, register
        from pyggml.backends.device import device_by_name
        register(PyRegistry("EXITTEST", [ArithDevice("EXITTEST")]))
        be = device_by_name("EXITTEST").init()   # left open on purpose
        print("registered")
    ''')
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], env=env,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "registered", r.stderr


def test_python_events():
    class Ev:
        def __init__(self):
            self.log = []

    class EvBackend(ArithBackend):
        def event_record(self, event):
            event.log.append("record")

        def event_wait(self, event):
            event.log.append("wait")

    class EvDevice(ArithDevice):
        def init_backend(self, params):
            return EvBackend(self)

        def event_new(self):
            self.events = getattr(self, "events", []) + [Ev()]
            return self.events[-1]

        def event_synchronize(self, event):
            event.log.append("sync")

        def event_free(self, event):
            event.log.append("free")

    dev = EvDevice("EVENTS")
    with registered("EVENTS", dev):
        d = device_by_name("EVENTS")
        assert d.props.events
        with d.init() as be:
            ev = pyggml.Event(d)
            ev.record(be)
            ev.wait(be)
            ev.synchronize()
            ev.close()
        assert dev.events[0].log == ["record", "wait", "sync", "free"]


def test_trace_backend_example_runs():
    from conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "trace_backend.py")], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "computed: {'MUL_MAT': 1" in out and "split(s)" in out


class OptimizingBackend(ArithBackend):
    def graph_optimize(self, graph, params):
        """Called by the scheduler on every split before it copies inputs; ggml >= 0.25 passes
        allocation-dependency params (None before)."""
        nodes = graph.nodes
        self.device.optimized.append((len(nodes), type(params).__name__))
        if params is not None and len(nodes) >= 2:
            params.add_alloc_dep(nodes[0], nodes[-1])  # keep the first node alive to the end


class OptimizingDevice(ArithDevice):
    def __init__(self, name):
        super().__init__(name)
        self.optimized = []

    def init_backend(self, params):
        return OptimizingBackend(self)


def test_graph_optimize_slot_gets_the_params_of_the_ggml_it_was_built_with():
    dev = OptimizingDevice("OPTIM")
    with registered("OPTIM", dev):
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        y = x + 1
        with device_by_name("OPTIM").init() as be, CPUBackend() as cpu, \
                Context.for_tensors(32, graph_size=32) as ctx:
            sched = Scheduler([be, cpu], graph_size=64)
            a, b, out, graph = arith_graph(ctx)
            sched.alloc_graph(graph)
            a.set(x)
            b.set(y)
            sched.compute(graph)
            np.testing.assert_allclose(out.numpy(), arith_expected(x, y), rtol=1e-6)
            sched.close()
    expected = "GraphOptimizeParams" if slot_arity("ggml_backend_i", "graph_optimize") == 3 else "NoneType"
    assert dev.optimized and {kind for _, kind in dev.optimized} == {expected}


class ReorderingBackend(ArithBackend):
    def graph_optimize(self, graph, params):
        """Swap the first two nodes of the split in the graph's own array when the second does
        not read the first, as Vulkan's and CUDA's graph_optimize reorder nodes."""
        nodes = lib.ggml_graph_nodes(graph.ptr)
        if lib.ggml_graph_n_nodes(graph.ptr) >= 2 and all(s != nodes[0] for s in nodes[1].src):
            nodes[0], nodes[1] = nodes[1], nodes[0]
            self.device.optimized.append(1)


class ReorderingDevice(OptimizingDevice):
    def init_backend(self, params):
        return ReorderingBackend(self)


def test_graphs_sharing_a_scheduler_whose_backend_reorders_nodes():
    """A backend's graph_optimize reorders a split's nodes in the graph's own array. Placing
    another graph puts the first one's node order and sources back (by node, not by index:
    sources put back by index went to the other node, and a source of MUL_MAT became the
    node itself, a crash in Vulkan's supports_op), and the first graph computes right when
    it is placed again."""
    dev = ReorderingDevice("REORDER")
    with registered("REORDER", dev):
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        y = x + 3
        with device_by_name("REORDER").init() as be, CPUBackend() as cpu, \
                Context.for_tensors(32, graph_size=32) as ctx:
            sched = Scheduler([be, cpu], graph_size=64)
            a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
            b = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
            out1 = (a + b) * (b * b)   # ADD, MUL independent: swapped
            g1 = ctx.new_graph(32).build_forward(out1)
            out2 = (b + a) * a
            g2 = ctx.new_graph(32).build_forward(out2)
            order = [n.name for n in g1.nodes]
            srcs = [[s.name for s in n.src if s is not None] for n in g1.nodes]
            for _ in range(2):
                for g, out, want in ((g1, out1, (x + y) * (y * y)), (g2, out2, (y + x) * x)):
                    sched.alloc_graph(g)
                    a.set(x)
                    b.set(y)
                    sched.compute(g)
                    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
            sched.reset()
            assert [n.name for n in g1.nodes] == order
            assert [[s.name for s in n.src if s is not None] for n in g1.nodes] == srcs
            sched.close()
    assert dev.optimized


class Boom(Exception):
    pass


class FlakyBuffer(HostBuffer):
    """A host buffer whose slots raise when told to."""
    fail: set = set()

    def get_tensor(self, tensor, out, offset):
        if "get_tensor" in self.fail:
            raise Boom("get_tensor")
        super().get_tensor(tensor, out, offset)

    def clear(self, value):
        if "clear" in self.fail:
            raise Boom("clear")
        super().clear(value)

    def memset_tensor(self, tensor, value, offset, size):
        if "memset_tensor" in self.fail:
            raise Boom("memset_tensor")
        super().memset_tensor(tensor, value, offset, size)


class FlakyBufferType(PyBufferType):
    def get_name(self):
        return "FLAKY"

    def alloc_buffer(self, size):
        if "alloc_buffer" in FlakyBuffer.fail:
            raise Boom("alloc_buffer")
        return FlakyBuffer(size)

    def get_alignment(self):
        if "get_alignment" in FlakyBuffer.fail:
            raise Boom("get_alignment")
        return 32


@pytest.fixture
def flaky():
    FlakyBuffer.fail = set()
    yield FlakyBuffer.fail
    FlakyBuffer.fail = set()


def test_a_python_buffers_failures_are_raised_by_the_call_that_caused_them(flaky):
    buft = FlakyBufferType().as_buffer_type()     # the BufferType keeps the Python object alive
    import gc
    gc.collect()
    with Context.for_tensors(4) as ctx:
        t = ctx.new_tensor(GGMLType.F32, [4])
        buf = ctx.alloc_tensors(buft)
        t.set(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(t.numpy(), np.arange(4))
        flaky.add("get_tensor")
        with pytest.raises(Boom, match="get_tensor"):
            t.numpy()                               # not uninitialised memory
        flaky.add("clear")
        with pytest.raises(Boom, match="clear"):
            buf.clear(0)
        flaky.add("memset_tensor")
        with pytest.raises(Boom, match="memset_tensor"):
            pyggml.Backend.tensor_memset(t, 0)
        flaky.add("alloc_buffer")
        with pytest.raises(Boom, match="alloc_buffer"):
            buft.alloc_buffer(64)
        flaky.clear()
        flaky.add("get_alignment")
        with pytest.raises(Boom, match="get_alignment"), CPUBackend():
            pyggml.GraphAllocator(buft)              # ggml divided by the 0 it would have got
    with CPUBackend():                                # nothing left over for an unrelated call
        pass


class RaisingSupportsDevice(ArithDevice):
    def supports_op(self, op):
        if op.op_name == "MUL":
            raise Boom("supports_op")
        return super().supports_op(op)


class SyncFailBackend(ArithBackend):
    def synchronize(self):
        raise Boom("synchronize")


class SyncFailDevice(ArithDevice):
    def init_backend(self, params):
        return SyncFailBackend(self)


def test_a_python_devices_failures_surface_from_the_call_not_later():
    dev = RaisingSupportsDevice("RAISING")
    with registered("RAISING", dev):
        with device_by_name("RAISING").init() as be, CPUBackend() as cpu, \
                Context.for_tensors(16, graph_size=32) as ctx:
            sched = Scheduler([be, cpu])
            a, b, out, g = arith_graph(ctx)
            with pytest.raises(Boom, match="supports_op"):
                sched.alloc_graph(g)                  # not from some later compute
            x = np.ones((2, 4), np.float32)
            with pytest.raises(ValueError):           # unrelated, and clean
                a.set(np.ones((3, 3), np.float32))
            sched.close()
            del x
    dev2 = SyncFailDevice("SYNCFAIL")
    reg2 = PyRegistry("SYNCFAIL", [dev2])
    register(reg2)
    try:
        with device_by_name("SYNCFAIL").init() as be:
            with pytest.raises(Boom, match="synchronize"):
                be.synchronize()
    finally:
        unregister(reg2)


@pytest.fixture
def host_weight_split(copying):
    """A graph whose node ``w + h`` runs on NUMPY_COPY (``w`` is there) and reads ``h``, a weight
    in a CPU buffer the device cannot use: each compute copies ``h`` into the split."""
    be, cpu, weights = copying
    w = weights(np.ones((2, 4), np.float32))
    hv = np.arange(8, dtype=np.float32).reshape(2, 4)
    with Context.for_tensors(4) as hctx, Context.for_tensors(16, graph_size=32) as ctx, \
            Scheduler([be, cpu], graph_size=64) as sched:
        h = hctx.from_numpy(hv, name="h")
        hbuf = hctx.alloc_tensors(cpu)
        hbuf.usage = "weights"
        h.set(hv)
        a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
        out = ((w + h) * a).set_output()
        g = ctx.new_graph(32).build_forward(out)
        sched.alloc_graph(g)
        yield sched, be, g, a, out, hv
        hbuf.close()


@pytest.mark.skipif(not hasattr(pyggml.lib, "ggml_backend_sched_set_copy_callback"), reason="ggml < 0.26")
def test_copy_callback_observes_the_weights_a_split_copies(host_weight_split):
    sched, be, g, a, out, hv = host_weight_split
    seen = []

    def observe(backend, src, dst, graph):
        seen.append((backend, src.name, src.buffer_ptr != dst.buffer_ptr, dst.ne, graph.n_nodes))
        return False                          # the scheduler copies the whole weight

    sched.copy_callback = observe
    assert sched.copy_callback is observe
    a.set(np.full((2, 4), 2, np.float32))
    sched.compute(g)
    np.testing.assert_array_equal(out.numpy(), (1 + hv) * 2)
    assert seen == [(be, "h", True, (4, 2, 1, 1), seen[0][4])] and seen[0][4] >= 1
    sched.copy_callback = None                # removed: no more calls
    sched.compute(g)
    assert len(seen) == 1


@pytest.mark.skipif(not hasattr(pyggml.lib, "ggml_backend_sched_set_copy_callback"), reason="ggml < 0.26")
def test_copy_callback_that_fills_the_copy_itself_declines_the_schedulers_copy(host_weight_split):
    """Returning True tells ggml the callback made the copy: the split computes with what the
    callback wrote (here the weight times 10), not with the weight."""
    sched, be, g, a, out, hv = host_weight_split

    def fill(backend, src, dst, graph):
        dst.set(src.numpy() * 10)
        return True

    sched.copy_callback = fill
    a.set(np.full((2, 4), 2, np.float32))
    sched.compute(g)
    np.testing.assert_array_equal(out.numpy(), (1 + 10 * hv) * 2)


@pytest.mark.skipif(not hasattr(pyggml.lib, "ggml_backend_sched_set_copy_callback"), reason="ggml < 0.26")
def test_copy_callback_exception_is_raised_by_compute_after_a_whole_copy(host_weight_split):
    sched, be, g, a, out, hv = host_weight_split

    def broken(backend, src, dst, graph):
        raise KeyError("no such expert")

    sched.copy_callback = broken
    a.set(np.full((2, 4), 3, np.float32))
    with pytest.raises(KeyError, match="no such expert"):
        sched.compute(g)
    sched.copy_callback = None
    sched.compute(g)
    np.testing.assert_array_equal(out.numpy(), (1 + hv) * 3)


class LayoutBufferType(HostBufferType):
    """Places a context's tensors last to first, 128 bytes apart (or as ``bad`` says)."""

    def __init__(self, bad=None):
        self.bad = bad
        super().__init__()

    def get_alignment(self):
        return 64

    def layout_n(self, tensors):
        if self.bad == "raise":
            raise RuntimeError("no room")
        need = [t.ptr.data == pyggml.ffi.NULL and t.ptr.view_src == pyggml.ffi.NULL for t in tensors]
        offsets, at = [None] * len(tensors), 0
        for i in reversed(range(len(tensors))):
            if need[i]:
                offsets[i] = at
                at += -(-tensors[i].nbytes // 128) * 128
        if self.bad == "overlap":
            offsets[0] = offsets[1]
        elif self.bad == "misaligned":
            offsets[0] += 8
        elif self.bad == "short":
            offsets.pop()
        elif self.bad == "view":
            offsets[-1] = 0
        return offsets


@pytest.mark.skipif(not hasattr(pyggml.lib, "ggml_backend_buft_alloc_buffer_n"), reason="ggml < 0.26")
def test_layout_n_places_a_contexts_tensors_in_one_buffer():
    """ggml_backend_alloc_ctx_tensors_from_buft (Context.alloc_tensors) and its _size twin ask
    a Python buffer type's layout_n (the alloc_buffer_n and get_alloc_size_n slots)."""
    buft = LayoutBufferType()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with Context.for_tensors(8) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4, 3])      # 48 bytes
        b = ctx.new_tensor(GGMLType.F32, [40])        # 160 bytes
        v = ctx.view(a, [4, 2], offset=16)            # a view: placed in a's buffer
        size = pyggml.lib.ggml_backend_alloc_ctx_tensors_from_buft_size(ctx.ptr, buft.ptr)
        assert size == 256 + 48                       # b at 0 (160 -> 256 bytes), a at 256
        buf = ctx.alloc_tensors(buft.as_buffer_type())
        base = int(pyggml.ffi.cast("uintptr_t", buf.base))
        addr = lambda t: int(pyggml.ffi.cast("uintptr_t", t.ptr.data)) - base  # noqa: E731
        assert (addr(b), addr(a), addr(v)) == (0, 256, 256 + 16) and buf.size == size
        a.set(x)
        b.set(np.ones(40, np.float32))
        np.testing.assert_array_equal(v.numpy(), x[1:3])
        np.testing.assert_array_equal(b.numpy(), np.ones(40, np.float32))


@pytest.mark.skipif(not hasattr(pyggml.lib, "ggml_backend_buft_alloc_buffer_n"), reason="ggml < 0.26")
@pytest.mark.parametrize("bad, match", [("overlap", "overlap"), ("misaligned", "multiple of the alignment 64"),
                                        ("short", "2 offsets for 3 tensors"), ("view", "which has data or is a view"),
                                        ("raise", "no room")])
def test_a_bad_layout_n_is_raised_by_alloc_tensors(bad, match):
    buft = LayoutBufferType(bad)
    with Context.for_tensors(8) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [4, 3])
        ctx.new_tensor(GGMLType.F32, [40])
        ctx.view(a, [4, 2], offset=16)
        with pytest.raises((ValueError, RuntimeError), match=match):
            ctx.alloc_tensors(buft.as_buffer_type())
        assert a.ptr.data == pyggml.ffi.NULL and a.ptr.buffer == pyggml.ffi.NULL  # nothing placed
        buf = ctx.alloc_tensors(LayoutBufferType().as_buffer_type())
        assert buf.size == 304
