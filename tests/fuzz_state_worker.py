"""Hypothesis state machine over pyggml's Pythonic objects, for tests/test_fuzz.py and
scripts/fuzz.sh (run in a subprocess: a GGML_ASSERT or a crash kills the interpreter).

    python tests/fuzz_state_worker.py SEED N_EXAMPLES [STEPS_PER_EXAMPLE]

The machine creates, uses and closes, in any order: contexts (allocating and ``no_alloc``,
reset, closed), tensors (zero-element ones; sizes ggml cannot hold, which must be refused),
checked op constructors on tensors of any context (closed and reset ones too), graphs (across
contexts), graph allocators and schedulers (reused for other and bigger graphs), CPU backends
and threadpools, backend buffers (``Context.alloc_tensors``, ``alloc_buffer``), graph caches,
the NumPy backend, and a subclass of it whose methods raise on request (``supports_op``,
``graph_compute``, ``synchronize``, ``graph_optimize``, its buffer type's ``alloc_buffer``, its
buffers' ``set_tensor``/``get_tensor``/``clear``/``memset_tensor``).

It keeps its own model: the values it set, where each tensor's memory is (context arena, a
buffer, a graph allocator or scheduler, freed), and computes every checked op with NumPy. After
each pyggml call (each counted in ``calls``) it checks:

* **results**: values read back (``Tensor.numpy``) equal the model's (graph results: the NumPy
  reference of the op chain, from the values the machine set);
* **exceptions**: the call raised nothing but ValueError/TypeError/MemoryError/KeyError/
  GGMLError (ClosedError is a ValueError) or an exception a callback raised; an exception a
  flaky callback raised during the call is what the call raised (the rule of
  :mod:`pyggml.raw.boundary`), and nothing is left pending after it returns (no open
  ``calling()`` frame, nothing sent to ``sys.unraisablehook``);
* **refusals**: what the model knows to be invalid (a closed or reset context, a freed buffer,
  memory an allocator has given to another graph, a tensor without data, a size ggml cannot
  hold) is refused with ClosedError/ValueError/MemoryError, never computed or read.

Each step is printed (flushed) before it runs, so the last line of a killed worker names the step
that killed it; hypothesis prints the whole falsifying step sequence for an invariant failure.
The last line is ``calls=N examples=M`` on success, ``FAILURE <kind>: ...`` after a failure
(kinds: WRONG_RESULT, MISPLACED_EXCEPTION, NOT_REFUSED, UNEXPECTED_EXCEPTION, MODEL).
Environment: ``FUZZ_NO_SHRINK=1`` skips shrinking (long runs: report faster).
"""
from __future__ import annotations

import gc
import itertools
import math
import os
import sys
from typing import Any, Callable, Iterable

import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    multiple,
    rule,
    run_state_machine_as_test,
)

import pyggml
from pyggml import (
    ClosedError,
    Context,
    CPUBackend,
    GGMLError,
    GGMLType,
    GraphAllocator,
    GraphCache,
    Scheduler,
    Threadpool,
)
from pyggml.memory import buffer as _buffer
from pyggml.backends.graph_cache import GraphParts
from pyggml.backends.cpu import cpu_buffer_type, graph_compute
from pyggml.backends.device import device_by_name
from pyggml.impl import HostBuffer, PyBufferType, PyRegistry, register
from pyggml.impl import numpy as numpy_backend
from pyggml.raw import boundary, ffi, lib, threads as _threads

EXPECTED = (ValueError, TypeError, MemoryError, KeyError, GGMLError)
F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
DTYPE = {F32: np.dtype(np.float32), F16: np.dtype(np.float16), I32: np.dtype(np.int32)}


# ------------------------------------------------------------------------------------------
# failures

class Invariant(AssertionError):
    """An invariant of the machine failed; ``kind`` says which class of defect it is."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def fail(kind: str, message: str) -> None:
    raise Invariant(kind, message)


# ------------------------------------------------------------------------------------------
# Python backends: the NumPy backend, and a subclass whose methods raise when told to

class Boom(Exception):
    """Raised on purpose by a flaky Python backend method (see :data:`FAIL`)."""


#: why the model expects the refusal it expects (for failure messages)
WHY: list[str] = []
#: names of the flaky methods that raise now (the machine changes it between steps)
FAIL: set[str] = set()
#: the Booms raised during the current call, in order
RAISED: list[Boom] = []
FLAKY_METHODS = ["supports_op", "graph_compute", "synchronize", "graph_optimize", "alloc_buffer",
                 "set_tensor", "get_tensor", "clear", "memset_tensor"]


def _maybe_fail(name: str) -> None:
    if name in FAIL:
        exc = Boom(name)
        RAISED.append(exc)
        raise exc


class FlakyHostBuffer(HostBuffer):
    def set_tensor(self, tensor: Any, data: memoryview, offset: int) -> None:
        _maybe_fail("set_tensor")
        super().set_tensor(tensor, data, offset)

    def get_tensor(self, tensor: Any, out: memoryview, offset: int) -> None:
        _maybe_fail("get_tensor")
        super().get_tensor(tensor, out, offset)

    def clear(self, value: int) -> None:
        _maybe_fail("clear")
        super().clear(value)

    def memset_tensor(self, tensor: Any, value: int, offset: int, size: int) -> None:
        _maybe_fail("memset_tensor")
        super().memset_tensor(tensor, value, offset, size)


class FlakyBufferType(PyBufferType):
    def get_name(self) -> str:
        return "FLAKY_HOST"

    def alloc_buffer(self, size: int) -> FlakyHostBuffer:
        _maybe_fail("alloc_buffer")
        return FlakyHostBuffer(size)

    def is_host(self) -> bool:
        return True


class FlakyBackend(numpy_backend.NumpyBackend):
    def graph_compute(self, graph: Any) -> None:
        _maybe_fail("graph_compute")
        super().graph_compute(graph)

    def synchronize(self) -> None:
        _maybe_fail("synchronize")

    def graph_optimize(self, graph: Any, params: Any) -> None:
        _maybe_fail("graph_optimize")


class FlakyDevice(numpy_backend.NumpyDevice):
    def __init__(self) -> None:
        self._flaky_buft = FlakyBufferType()
        super().__init__()

    def get_name(self) -> str:
        return "FLAKYNP"

    def get_description(self) -> str:
        return "the NumPy backend, failing on request"

    def init_backend(self, params: str | None) -> FlakyBackend:
        return FlakyBackend(self)

    def get_buffer_type(self) -> FlakyBufferType:
        return self._flaky_buft

    def supports_op(self, op: Any) -> bool:
        _maybe_fail("supports_op")
        return super().supports_op(op)


class OwnBuffersDevice(FlakyDevice):
    """The flaky NumPy device reading only its own buffer type, as a GPU does: a scheduler
    copies what it reads from other buffers (inputs on the CPU backend, weights elsewhere) into
    its split, rewriting the nodes' sources to the copies."""

    def get_name(self) -> str:
        return "OWNNP"

    def supports_buft(self, buft: Any) -> bool:
        return bool(ffi.cast("uintptr_t", buft.ptr) == ffi.cast("uintptr_t", self._buft_ptr))


numpy_backend.register()
_FLAKY_DEVICE = FlakyDevice()
register(PyRegistry("FLAKYNP", [_FLAKY_DEVICE]))
register(PyRegistry("OWNNP", [OwnBuffersDevice()]))
FLAKY_BUFT = _FLAKY_DEVICE._flaky_buft.as_buffer_type()


# ------------------------------------------------------------------------------------------
# the call wrapper: counts calls and checks the exception rules after each

calls = 0
#: what the run exercised: values compared, graphs computed, refusals checked...
STATS: dict[str, int] = {}
UNRAISABLE: list[Any] = []


def count(what: str) -> None:
    STATS[what] = STATS.get(what, 0) + 1


def _unraisable(args: Any) -> None:
    UNRAISABLE.append(args)


sys.unraisablehook = _unraisable


def call(what: str, fn: Callable[..., Any], *args: Any, must: str | None = None, **kw: Any) -> tuple[BaseException | None, Any]:
    """Run one Pythonic call and check the rules every call obeys; returns (exception, result).

    ``must``: ``"closed"`` (ClosedError is due), ``"refuse"`` (ValueError/MemoryError is due),
    ``"value"`` (a ValueError is due), ``"ok"`` (must succeed); None: it may raise an expected
    exception."""
    global calls
    calls += 1
    RAISED.clear()
    UNRAISABLE.clear()
    try:
        result, exc = fn(*args, **kw), None
    except Invariant:
        raise
    except BaseException as e:  # noqa: BLE001 - judged below
        result, exc = None, e
    raised = list(RAISED)
    RAISED.clear()
    if boundary._local.frames or _threads._owned or _threads._readers:
        frames = len(boundary._local.frames)
        boundary._local.frames.clear()
        fail("MISPLACED_EXCEPTION", f"{what}: {frames} calling() frame(s) still open after the call returned "
                                    f"(or the gate still held: {_threads._readers})")
    if UNRAISABLE:
        lost = [getattr(u, "exc_value", u) for u in UNRAISABLE]
        UNRAISABLE.clear()
        fail("MISPLACED_EXCEPTION", f"{what}: exception(s) sent to sys.unraisablehook instead of "
                                    f"being raised by a call: {lost!r}")
    if raised and exc is not raised[0]:
        fail("MISPLACED_EXCEPTION", f"{what}: a callback raised {raised[0]!r} during the call, but the "
                                    f"call {'raised ' + repr(exc) if exc else 'returned ' + repr(result)}")
    if not raised and isinstance(exc, Boom):
        fail("MISPLACED_EXCEPTION", f"{what}: raised {exc!r}, which no callback raised during this call")
    if exc is not None and not isinstance(exc, EXPECTED + (Boom,)):
        import traceback
        fail("UNEXPECTED_EXCEPTION", f"{what}: {''.join(traceback.format_exception(exc))}")
    if must in ("closed", "value", "refuse"):
        count("refusals checked")
    if raised:
        count("callback exceptions checked")
    if must is not None and not raised:
        if must == "ok" and exc is not None:
            import traceback
            fail("MODEL", f"{what}: expected to succeed, raised {''.join(traceback.format_exception(exc))}")
        if must == "closed" and not isinstance(exc, ClosedError):
            why = f"; {WHY[0]}" if WHY else ""
            fail("NOT_REFUSED", f"{what}: ClosedError was due, got {exc!r}{why}" if exc else
                 f"{what}: ClosedError was due, but it returned {result!r}{why}")
        if must == "value" and not isinstance(exc, ValueError):
            fail("NOT_REFUSED", f"{what}: ValueError was due, got {exc!r}{'; ' + WHY[0] if WHY else ''}")
        # a refusal: also a TypeError for an argument checked before the context's state
        if must == "refuse" and not isinstance(exc, (ValueError, MemoryError, TypeError)):
            fail("NOT_REFUSED", f"{what}: ValueError/MemoryError was due, got {exc!r} / {result!r}")
    return exc, result


def step(text: str) -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------------------
# the model

class Model:
    _ids = itertools.count()
    prefix = "obj"

    def __init__(self, obj: Any):
        self.obj = obj
        self.name = f"{self.prefix}{next(Model._ids)}"
        self.closed = False

    def __repr__(self) -> str:
        return self.name


class CtxM(Model):
    prefix = "ctx"

    def __init__(self, obj: Context, no_alloc: bool):
        super().__init__(obj)
        self.no_alloc = no_alloc
        self.gen = 0
        self.buffers: list[BufM] = []
        #: contexts whose tensors this one's nodes read -> their generation then (pyggml:
        #: Context._deps); once one of them (transitively) is reset or closed, this context may
        #: refuse new tensors, nodes and graphs with ClosedError until it is reset itself
        self.deps: dict[CtxM, int] = {}

    @property
    def cur_gen(self) -> int:
        return -1 if self.closed else self.gen

    def maybe_stale(self) -> bool:
        """Whether a context this one's nodes read (transitively) was reset or closed since."""
        seen: set[int] = set()
        todo: list[CtxM] = [self]
        while todo:
            c = todo.pop()
            for d, gen in c.deps.items():
                if d.cur_gen != gen:
                    return True
                if id(d) not in seen:
                    seen.add(id(d))
                    todo.append(d)
        return False


class BufM(Model):
    """A backend buffer: from Context.alloc_tensors (``ctx``) or alloc_buffer."""
    prefix = "buf"

    def __init__(self, obj: Any, ctx: CtxM | None):
        super().__init__(obj)
        self.ctx = ctx


class PlacerM(Model):
    """A graph allocator or a scheduler: the graph it placed last and the tensors in its memory."""
    prefix = "placer"

    def __init__(self, obj: Any, kind: str, backends: list["BackendM"]):
        super().__init__(obj)
        self.kind = kind
        self.backends = backends
        self.graph: GraphM | None = None
        self.placed: set[TM] = set()


class BackendM(Model):
    prefix = "be"

    def __init__(self, obj: Any, kind: str):
        super().__init__(obj)
        self.kind = kind


class TpM(Model):
    prefix = "pool"


class CacheM(Model):
    prefix = "cache"

    def __init__(self, obj: Any, executor: Model):
        super().__init__(obj)
        self.executor = executor


class TM(Model):
    """A tensor. Base tensors (``base`` None) own memory: ``home`` (None: no data, "arena",
    a BufM, a PlacerM, "dead") and ``known`` (the values in it, or None: unknown). Views read
    their base's memory at ``offset`` with strides ``nb``."""
    prefix = "t"

    def __init__(self, obj: Any, ctx: CtxM, type: GGMLType, ne: tuple[int, ...], op: str,
                 srcs: Iterable["TM"] = (), ref: Callable[..., Any] | None = None,
                 base: "TM | None" = None, offset: int = 0, nb: tuple[int, ...] | None = None,
                 tol: float = 1e-4, writes: bool = False):
        super().__init__(obj)
        self.ctx, self.gen, self.type, self.ne, self.op = ctx, ctx.gen, type, tuple(ne), op
        self.srcs = list(srcs)
        self.ref = ref
        self.base = base
        self.offset = offset
        self.nb = tuple(nb) if nb is not None else contiguous_nb(type, ne)
        self.tol = max([tol] + [s.tol for s in self.srcs])
        self.writes = writes       # computing it writes into its base (cpy)
        self.home: Any = None
        self.known: np.ndarray | None = None
        self.uncertain = False     # a reserve may have freed its memory
        self.output = False
        #: ``output`` when a placer last placed the graph it is in (see _after_compute)
        self.output_placed = False

    @property
    def is_closed(self) -> bool:
        return self.ctx.closed or self.ctx.gen != self.gen

    @property
    def root(self) -> "TM":
        return self.base if self.base is not None else self

    @property
    def is_node(self) -> bool:
        return self.op != "NONE"

    @property
    def nelements(self) -> int:
        return math.prod(int(n) for n in self.ne)


def contiguous_nb(type: GGMLType, ne: Iterable[int]) -> tuple[int, ...]:
    ne = list(ne)
    nb = [DTYPE[type].itemsize]
    for n in ne[:3]:
        nb.append(nb[-1] * n)
    return tuple(nb)


def read_mem(t: TM, mem: dict[TM, bytearray | None]) -> np.ndarray | None:
    """The values of ``t`` (4-d, NumPy order) in the memory image ``mem`` of its base."""
    b = t.root
    m = mem.get(b)
    if m is None:
        return None
    try:
        return np.ndarray(t.ne[::-1], DTYPE[t.type], buffer=m, offset=t.offset, strides=t.nb[::-1]).copy()
    except (ValueError, TypeError):  # the view reaches outside what the model holds
        return None


def write_mem(t: TM, mem: dict[TM, bytearray | None], values: np.ndarray | None) -> None:
    b = t.root
    if values is None:
        mem[b] = None
        return
    m = mem.get(b)
    if m is None:
        if t.base is None:
            m = mem[b] = bytearray(b.nelements * DTYPE[b.type].itemsize)
        else:
            return  # a partial write into unknown memory: still unknown
    if 0 in t.ne:
        return  # no elements: nothing to write (a NumPy reference of a reduction over an empty
        # axis may give another empty shape than ggml's ne, e.g. (0, 0, 2, 0) for (0, 0, 2, 1))
    np.ndarray(t.ne[::-1], DTYPE[t.type], buffer=m, offset=t.offset, strides=t.nb[::-1])[...] = \
        np.asarray(values).astype(DTYPE[t.type])


def mem_of(b: TM) -> bytearray | None:
    return None if b.known is None else bytearray(np.ascontiguousarray(b.known, DTYPE[b.type]).tobytes())


def value(t: TM) -> np.ndarray | None:
    b = t.root
    return read_mem(t, {b: mem_of(b)})


def as_type(x: np.ndarray, type: GGMLType) -> np.ndarray:
    if type == I32:
        return np.asarray(x).astype(np.int32)
    return np.asarray(x, dtype=np.float32).astype(DTYPE[type])


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def close_enough(out: np.ndarray, ref: np.ndarray, tol: float) -> tuple[bool, str]:
    out = np.asarray(out, dtype=np.float64).reshape(ref.shape)
    ref = np.asarray(ref, dtype=np.float64)
    ok = np.isfinite(ref) & (np.abs(ref) < 1e6)
    if not ok.any():
        return True, ""
    scale = 1.0 + np.abs(ref[ok]).max()
    err = np.abs(out[ok] - ref[ok])
    if np.isnan(err).any() or err.max() > tol * scale:
        i = int(np.nanargmax(np.where(np.isnan(err), np.inf, err)))
        return False, (f"max error {np.nanmax(err) if not np.isnan(err).all() else 'nan'} > {tol} * {scale:.3g}: "
                       f"got {out[ok].ravel()[i]!r}, expected {ref[ok].ravel()[i]!r}")
    return True, ""


def tile(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    reps = tuple(s // bs if bs else 1 for s, bs in zip(shape, b.shape))
    return np.tile(b, reps)


# --- NumPy references of the checked ops (4-d arrays, NumPy order)

def ref_binary(fn: Callable[..., Any], type: GGMLType) -> Callable[..., np.ndarray]:
    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_type(fn(f32(a), f32(tile(b, a.shape))), type)
    return ref


UNARY_REFS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "neg": (np.negative, 1e-6), "abs": (np.abs, 1e-6), "relu": (lambda x: np.maximum(x, 0), 1e-6),
    "sqr": (np.square, 1e-6), "tanh": (np.tanh, 1e-4),
    "silu": (lambda x: x / (1 + np.exp(-x.astype(np.float64))), 1e-4),
    "gelu": (lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x.astype(np.float64) ** 3))), 1e-2),
}


def ref_mul_mat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r3 = b.shape[0] // a.shape[0] if a.shape[0] else 1
    r2 = b.shape[1] // a.shape[1] if a.shape[1] else 1
    aa = np.repeat(np.repeat(f32(a), r3, axis=0), r2, axis=1)
    return f32(np.matmul(f32(b).astype(np.float64), np.swapaxes(aa, -1, -2).astype(np.float64)))


def ref_soft_max(scale: float) -> Callable[..., np.ndarray]:
    def ref(a: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        x = f32(a).astype(np.float64) * scale
        if mask is not None:
            m = f32(mask)[:, :, :a.shape[2], :].astype(np.float64)
            x = x + tile(m, x.shape)
        x = x - x.max(axis=-1, keepdims=True) if x.shape[-1] else x
        with np.errstate(all="ignore"):
            e = np.exp(x)
            return f32(e / e.sum(axis=-1, keepdims=True))
    return ref


def ref_rms_norm(eps: float) -> Callable[[np.ndarray], np.ndarray]:
    def ref(a: np.ndarray) -> np.ndarray:
        x = f32(a).astype(np.float64)
        with np.errstate(all="ignore"):
            return f32(x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))
    return ref


def ref_norm(eps: float) -> Callable[[np.ndarray], np.ndarray]:
    def ref(a: np.ndarray) -> np.ndarray:
        x = f32(a).astype(np.float64)
        with np.errstate(all="ignore"):
            x = x - x.mean(axis=-1, keepdims=True)
            return f32(x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))
    return ref


def ref_get_rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    n1 = a.shape[2]
    if rows.size and (rows.min() < 0 or rows.max() >= n1):
        return None  # out of range: refused (or an error), never a value
    out = np.empty((a.shape[0], a.shape[1], rows.shape[3], a.shape[3]), dtype=a.dtype)
    for i3 in range(a.shape[0]):
        for i2 in range(a.shape[1]):
            out[i3, i2] = a[i3, i2][rows[0, i3, i2]]
    return out if a.dtype == np.int32 else f32(out)


def ref_rope(n_dims: int, mode: int) -> Callable[..., np.ndarray]:
    def ref(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = f32(a).astype(np.float64).copy()
        out = x.copy()
        p = pos.reshape(-1).astype(np.float64)  # one position per a.ne[2]
        half = n_dims // 2
        for i in range(half):
            theta = p[None, :, None] * 10000.0 ** (-2.0 * i / n_dims)  # (1, ne2, 1)
            c, s = np.cos(theta), np.sin(theta)
            j0, j1 = (2 * i, 2 * i + 1) if mode == 0 else (i, i + half)
            x0, x1 = x[..., j0], x[..., j1]
            out[..., j0] = x0 * c - x1 * s
            out[..., j1] = x0 * s + x1 * c
        return as_type(out, GGMLType.F32 if a.dtype == np.float32 else GGMLType.F16)
    return ref


# ------------------------------------------------------------------------------------------
# strategies

small_dim = st.sampled_from([1, 1, 2, 3, 4, 8])
ne4 = st.lists(small_dim, min_size=1, max_size=4).map(lambda l: tuple(l + [1] * (4 - len(l))))
any_ne = st.one_of(ne4, st.lists(st.sampled_from([0, 1, 2, 5]), min_size=1, max_size=4).map(
    lambda l: tuple(l + [1] * (4 - len(l)))))
#: chain shapes, one in four with a zero (a graph of zero-byte tensors: placers place them
#: themselves, pyggml.backends.alloc)
chain_ne = st.one_of(ne4, ne4, ne4, st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=4).filter(
    lambda l: 0 in l).map(lambda l: tuple(l + [1] * (4 - len(l)))))
HUGE_NE = [(2**40, 2**30, 1, 1), (2**62, 1, 1, 1), (1 << 20, 1 << 20, 1 << 20, 1), (2**63 - 1, 2, 1, 1),
           (-1, 4, 1, 1), (4, 2**31, 2**31, 2)]
MEM_SIZES = [0, 2048, 1 << 16, 1 << 20]
OP_NAMES = ["add", "sub", "mul", "div", "unary", "scale", "mul_mat", "reshape", "view", "permute",
            "transpose", "cont", "cpy", "soft_max", "norm", "reduce", "get_rows", "rope", "concat",
            "repeat", "other"]
CHAIN_OPS = ["add", "sub", "mul", "mul", "unary", "unary", "scale", "mul_mat", "reshape", "permute",
             "transpose", "cont", "soft_max", "norm", "reduce", "rope", "concat", "repeat", "view", "cpy"]
OTHER_OPS = ["argsort", "top_k", "pad", "concat", "acc", "diag_mask_inf", "sum", "argmax", "cast", "swiglu",
             "leaky_relu", "im2col", "pool_1d", "set_rows", "out_prod", "cumsum", "l2_norm", "clamp",
             "flash_attn"]
HUGE_MEM = [2**62, 2**70, 1 << 48, -5]


class PyggmlMachine(RuleBasedStateMachine):
    """See the module docstring."""

    contexts = Bundle("contexts")
    tensors = Bundle("tensors")
    graphs = Bundle("graphs")
    backends = Bundle("backends")
    placers = Bundle("placers")
    buffers = Bundle("buffers")
    pools = Bundle("pools")
    caches = Bundle("caches")

    examples = 0

    def __init__(self) -> None:
        super().__init__()
        PyggmlMachine.examples += 1
        step(f"--- example {PyggmlMachine.examples}")
        self.all: list[Model] = []
        self.all_tensors: list[TM] = []
        FAIL.clear()

    # ------------------------------------------------------------------ helpers
    def _track(self, m: Model) -> Model:
        self.all.append(m)
        if isinstance(m, TM):
            self.all_tensors.append(m)
        return m

    def _home(self, t: TM) -> Any:
        return t.root.home

    def _placer_ok(self, b: TM) -> bool:
        """Whether base tensor ``b``, homed in a placer, is in the memory that placer holds now."""
        p = b.home
        return isinstance(p, PlacerM) and not p.closed and b in p.placed

    def _access_state(self, t: TM) -> str:
        """What reading/writing ``t``'s data must do: "closed" (ClosedError), "nodata"
        (ValueError), "uncertain" (ClosedError or ok), "ok"."""
        if t.is_closed:
            return "closed"
        b = t.root
        if b.is_closed:
            return "closed"
        home = b.home
        if home is None:
            return "nodata"
        if home in ("dead", "dead_user") or (isinstance(home, (BufM, PlacerM)) and home.closed):
            return "closed"
        if isinstance(home, PlacerM):
            if b.uncertain:
                return "uncertain"
            if b not in home.placed:
                return "closed"
        return "ok"

    @staticmethod
    def _replaceable(b: TM) -> bool:
        """Whether a placer places ``b`` again (its memory was a placer's)."""
        return b.home == "dead" or isinstance(b.home, PlacerM)

    def _graph_state(self, g: "GraphM") -> str | None:
        """"closed" if computing ``g`` must raise ClosedError whoever computes it."""
        if g.ctx.closed or g.ctx.gen != g.gen:
            return "closed"
        for t in g.tensors:
            if t.is_closed or t.root.is_closed:
                return "closed"
        return None

    def _invalidate_placer(self, p: PlacerM) -> None:
        for t in self.all_tensors:
            if t.base is None and t.home is p:
                t.known = None

    def _introspect_home(self, b: TM) -> Any:
        """Where ggml put ``b`` (a placer re-places tensors whose buffer a placer freed)."""
        ptr = b.obj._ptr
        buf = ptr.buffer
        if buf == ffi.NULL:
            return "arena" if ptr.data != ffi.NULL else None
        rec = _buffer.lookup(buf)
        if rec is None:
            return "dead_user"
        owner = rec.owner
        for m in self.all:
            if m.obj is owner and isinstance(m, (PlacerM, BufM)):
                return m
        return "foreign"

    def _placed(self, p: PlacerM, g: "GraphM") -> None:
        """After ``p`` placed ``g``: where its tensors are now (checked against what ggml and
        pyggml promise: tensors with data stay where they are, unless the buffer they are in
        was freed by a placer or belongs to a placer: then ``p`` places them)."""
        for t in self.all_tensors:  # what it placed before is gone unless placed again
            if t.base is None and t.home is p:
                t.known = None
        p.placed = set()
        p.graph = g
        g.placed_by = p
        for t in g.tensors:
            t.output_placed = t.output
        g.computed = False
        for b in {t.root for t in g.tensors}:
            before = b.home
            now = self._introspect_home(b)
            if before is None or before == "dead" or isinstance(before, PlacerM):
                # a placer places again what sits in any placer's memory (pyggml.backends.alloc)
                allowed: tuple[Any, ...] = (p,)
            elif b.nelements == 0 and (before == "arena" or isinstance(before, BufM)):
                # zero bytes in an allocating context or at the NULL base of an empty buffer:
                # data NULL, placeable (pyggml.backends.alloc places zero-byte tensors without data)
                allowed = (before, p)
            else:
                allowed = (before,)
            if not any(now is a or now == a for a in allowed):
                fail("MODEL", f"{b} ({b.op}, ne {b.ne}) was in {before}; after {p} placed {g} it is in {now}, "
                              f"not in {allowed}")
            b.home = now
            if now is p:
                b.known = None
                b.uncertain = False
                p.placed.add(b)

    # ------------------------------------------------------------------ contexts
    def new_context(self, size: int, no_alloc: bool) -> CtxM:
        step(f"new_context({size}, no_alloc={no_alloc})")
        exc, ctx = call("Context", Context, size, no_alloc=no_alloc, must="ok")
        return self._track(CtxM(ctx, no_alloc))  # type: ignore[return-value]

    def new_context_huge(self, size: int) -> None:
        step(f"new_context_huge({size})")
        call("Context(huge)", Context, size, must="refuse")

    def close_context(self, ctx: CtxM) -> None:
        step(f"close_context({ctx})")
        call("Context.close", ctx.obj.close, must="ok")
        ctx.closed = True
        for b in ctx.buffers:
            b.closed = True
        self._forget_dead()

    def reset_context(self, ctx: CtxM) -> None:
        step(f"reset_context({ctx})")
        exc, _ = call("Context.reset", ctx.obj.reset, must="closed" if ctx.closed else "ok")
        if exc is None:
            ctx.gen += 1
            ctx.deps.clear()

    def _forget_dead(self) -> None:
        """Tensors in memory freed by closing a buffer ("dead_user": refused from then on) or a
        placer ("dead": a placer places such tensors again)."""
        for t in self.all_tensors:
            if t.base is None and isinstance(t.home, (BufM, PlacerM)) and t.home.closed:
                t.home = "dead_user" if isinstance(t.home, BufM) else "dead"
                t.known = None

    # ------------------------------------------------------------------ tensors
    def new_tensor(self, ctx: CtxM, type: GGMLType, ne: tuple[int, ...]) -> Any:
        step(f"new_tensor({ctx}, {type.name}, {list(ne)})")
        if ctx.closed:
            call("new_tensor", ctx.obj.new_tensor, type, list(ne), must="closed")
            return multiple()
        exc, t = call("new_tensor", ctx.obj.new_tensor, type, list(ne))
        if exc is not None:
            if not isinstance(exc, MemoryError) and not (isinstance(exc, ClosedError) and ctx.maybe_stale()):
                fail("MODEL", f"new_tensor raised {exc!r}")
            return multiple()
        m = TM(t, ctx, type, ne, "NONE")
        if not ctx.no_alloc:
            m.home = "arena"
        self._check_shape(m)
        return self._track(m)

    def new_tensor_huge(self, ctx: CtxM, type: GGMLType, ne: tuple[int, ...]) -> Any:
        """Sizes no memory holds: refused, except as a ``no_alloc`` tensor ggml can describe
        (then allocating it must fail cleanly)."""
        step(f"new_tensor_huge({ctx}, {type.name}, {list(ne)})")
        nbytes = DTYPE[type].itemsize * int(np.prod([max(n, 0) for n in ne], dtype=object))
        describable = ctx.no_alloc and min(ne) >= 0 and nbytes <= 2**62
        exc, t = call("new_tensor(huge)", ctx.obj.new_tensor, type, list(ne),
                      must=None if describable and not ctx.closed else "refuse")
        if exc is not None:
            return multiple()
        return self._track(TM(t, ctx, type, ne, "NONE"))

    def _check_shape(self, m: TM) -> None:
        t = m.obj
        if tuple(t.ne) != m.ne or t.type != m.type:
            fail("WRONG_RESULT", f"{m}: ne {t.ne} type {t.type!r}, model says {m.ne} {m.type!r}")
        if tuple(t._ptr.nb) != m.nb:
            fail("WRONG_RESULT", f"{m}: nb {tuple(t._ptr.nb)}, model says {m.nb}")

    def set_tensor(self, t: TM, seed: int, bad_rows: bool) -> None:
        """Tensor.set with values of the model's choosing."""
        step(f"set_tensor({t}, {seed}, bad_rows={bad_rows})")
        if t.base is not None or t.type not in DTYPE:
            return
        if t.nelements > 1 << 22:  # a no_alloc tensor no memory holds: it has no data
            call(f"{t}.set", t.obj.set, np.zeros(1, DTYPE[t.type]),
                 must="closed" if self._access_state(t) == "closed" else "value")
            return
        vals = self._values(t, seed, bad_rows)
        self._set(t, vals)

    def _values(self, t: TM, seed: int, bad_rows: bool = False) -> np.ndarray:
        rng = np.random.default_rng(seed)
        shape = t.ne[::-1]
        if t.type == I32:
            hi = 3 if not bad_rows else 9
            return rng.integers(-1 if bad_rows else 0, hi, size=shape).astype(np.int32)
        x = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        return x.astype(DTYPE[t.type])

    def _set(self, t: TM, vals: np.ndarray) -> bool:
        state = self._access_state(t)
        must = {"closed": "closed", "nodata": "value"}.get(state)
        WHY[:] = [f"{t} is {state} in the model (home {t.root.home})"]
        exc, _ = call(f"{t}.set", t.obj.set, vals.reshape(t.obj.shape) if not t.is_closed else vals, must=must)
        b = t.root
        if exc is None:
            if isinstance(b.home, PlacerM):  # other tensors of its graph may share this memory
                for o in self.all_tensors:
                    if o.base is None and o.home is b.home and o is not b:
                        o.known = None
            b.known = np.asarray(vals).astype(DTYPE[t.type]).copy()
            return True
        if isinstance(exc, Boom):
            b.known = None  # partly written, perhaps
        return False

    def read_tensor(self, t: TM) -> None:
        step(f"read_tensor({t})")
        self._read(t)

    def _read(self, t: TM) -> None:
        state = self._access_state(t)
        must = {"closed": "closed", "nodata": "value"}.get(state)
        exc, out = call(f"{t}.numpy", t.obj.numpy, must=must)
        if exc is not None:
            return
        if state == "closed":
            fail("NOT_REFUSED", f"{t}.numpy() returned data of freed/reused memory")
        ref = value(t)
        if ref is None:
            return
        ok, why = close_enough(out, ref, t.tol)
        count("values compared")
        if not ok:
            fail("WRONG_RESULT", f"{t}.numpy() ({t.op}): {why}")

    def mark_output(self, t: TM) -> None:
        step(f"mark_output({t})")
        exc, _ = call("set_output", t.obj.set_output, must="closed" if t.is_closed else "ok")
        if exc is None:
            t.output = True

    def mark_input(self, t: TM) -> None:
        step(f"mark_input({t})")
        call("set_input", t.obj.set_input, must="closed" if t.is_closed else "value" if t.is_node else "ok")

    # ------------------------------------------------------------------ ops
    def _op(self, ctx: CtxM, name: str, fn: Callable[..., Any], args: tuple[Any, ...], srcs: list[TM],
            make: Callable[[Any], TM | None]) -> Any:
        """Call the op constructor; on success, the model tensor ``make(result)`` (None: not
        modelled, kept with an unknown value)."""
        closed = (ctx.closed or any(s.is_closed for s in srcs) or ctx.maybe_stale()
                  or any(s.ctx.maybe_stale() for s in srcs))
        must = "closed" if any(s.is_closed for s in srcs) else "refuse" if ctx.closed else None
        exc, t = call(name, fn, *args, must=must)
        if exc is not None:
            if not closed and isinstance(exc, ClosedError):
                fail("MODEL", f"{name}: unexpected ClosedError {exc}")
            return multiple()
        for s in srcs:
            if s.ctx is not ctx:
                ctx.deps.setdefault(s.ctx, s.ctx.gen)
        m = make(t)
        if m is None:
            m = TM(t, ctx, GGMLType(t.type), tuple(t.ne), t.op_name, srcs, None,
                   nb=tuple(t._ptr.nb), tol=1.0)
            v = t.view_src
            if v is not None:  # an op writing into a view of its source: not modelled
                root = next((s.root for s in self.all_tensors if s.obj._ptr == v._ptr and not s.is_closed), None)
                if root is None:
                    return multiple()
                m.base, m.offset, m.writes = root, int(t._ptr.view_offs), True
        else:
            self._check_shape(m)
        if m.base is None and not ctx.no_alloc:
            m.home = "arena"
        return self._track(m)

    def _new(self, ctx: CtxM, t: Any, op: str, srcs: list[TM], ref: Any, type: GGMLType | None = None,
             ne: tuple[int, ...] | None = None, tol: float = 1e-4) -> TM:
        return TM(t, ctx, srcs[0].type if type is None else type, srcs[0].ne if ne is None else ne, op, srcs, ref, tol=tol)

    # Each op: (ctx, a, b, c, p) -> model tensor; p holds 4 small ints for the op's parameters.
    def _binary(self, op: str) -> Callable[..., Any]:
        np_fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]

        def make(ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
            tol = 1e-5 if a.type == b.type == F32 else 5e-3
            if op == "div" and b.op != "NONE":
                tol = 1.0  # division by a computed value: only the flow is checked
            return self._op(ctx, op, getattr(ctx.obj, op), (a.obj, b.obj), [a, b],
                            lambda t: self._new(ctx, t, op.upper(), [a, b], ref_binary(np_fn, a.type), tol=tol))
        return make

    def _unary(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        name = sorted(UNARY_REFS)[p[0] % len(UNARY_REFS)]
        fn, tol = UNARY_REFS[name]

        def ref(x: np.ndarray, fn: Any = fn, type: GGMLType = a.type) -> np.ndarray:
            with np.errstate(all="ignore"):
                return as_type(fn(f32(x)), type)
        return self._op(ctx, name, getattr(ctx.obj, name), (a.obj,), [a],
                        lambda t: self._new(ctx, t, name.upper(), [a], ref, tol=tol if a.type == F32 else max(tol, 5e-3)))

    def _scale(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        s = [-2.0, 0.5, 3.0][p[0] % 3]
        return self._op(ctx, "scale", ctx.obj.scale, (a.obj, s), [a],
                        lambda t: self._new(ctx, t, "SCALE", [a], lambda x: as_type(f32(x) * np.float32(s), a.type)))

    def _mul_mat(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        tol = 1e-4 if a.type == b.type == F32 else 2e-2
        return self._op(ctx, "mul_mat", ctx.obj.mul_mat, (a.obj, b.obj), [a, b],
                        lambda t: self._new(ctx, t, "MUL_MAT", [a, b], ref_mul_mat, F32,
                                            (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), tol=tol))

    def _reshape(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        sizes = [1, 2, 3, 4, 6, 8, 12, 16]
        ne = [sizes[x % len(sizes)] for x in p[:1 + p[3] % 4]]
        if p[2] % 3 == 0 and a.nelements:  # often the one that fits
            ne = [a.nelements] if p[1] % 2 else [a.ne[1], a.ne[0] * a.ne[2] * a.ne[3]]
        full = tuple(ne + [1] * (4 - len(ne)))
        return self._op(ctx, "reshape", ctx.obj.reshape, (a.obj, *ne), [a],
                        lambda t: TM(t, ctx, a.type, full, "RESHAPE", [a], base=a.root, offset=a.offset,
                                     nb=contiguous_nb(a.type, full)))

    def _view(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        n0, n1, off, stride = p[0] % 5, 1 + p[1] % 3, p[2] % 4, p[3] % 2
        size = DTYPE[a.type].itemsize if a.type in DTYPE else 1
        offset = off * size
        nb1 = a.nb[1] if not stride else size * max(n0, 1)
        return self._op(ctx, "view", ctx.obj.view, (a.obj, [n0, n1], [nb1], offset), [a],
                        lambda t: TM(t, ctx, a.type, (n0, n1, 1, 1), "VIEW", [a], base=a.root,
                                     # ggml_view_2d: nb[0] is the element size, whatever a's
                                     offset=a.offset + offset, nb=(int(lib.ggml_type_size(a.type)), nb1,
                                                                   nb1 * n1, nb1 * n1)))

    def _permute(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        axes = list(itertools.permutations(range(4)))[p[0] % 24]
        ne, nb = [0] * 4, [0] * 4
        for i, d in enumerate(axes):
            ne[d], nb[d] = a.ne[i], a.nb[i]
        return self._op(ctx, "permute", ctx.obj.permute, (a.obj, *axes), [a],
                        lambda t: TM(t, ctx, a.type, tuple(ne), "PERMUTE", [a], base=a.root, offset=a.offset,
                                     nb=tuple(nb)))

    def _transpose(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        return self._op(ctx, "transpose", ctx.obj.transpose, (a.obj,), [a],
                        lambda t: TM(t, ctx, a.type, ne, "TRANSPOSE", [a], base=a.root, offset=a.offset, nb=nb))

    def _cont(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        return self._op(ctx, "cont", ctx.obj.cont, (a.obj,), [a],
                        lambda t: self._new(ctx, t, "CONT", [a], lambda x: x.copy()))

    def _cpy(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        return self._op(ctx, "cpy", ctx.obj.cpy, (a.obj, b.obj), [a, b],
                        lambda t: TM(t, ctx, b.type, b.ne, "CPY", [a, b],
                                     lambda x, y: as_type(f32(x).reshape(y.shape), b.type),
                                     base=b.root, offset=b.offset, nb=b.nb,
                                     tol=1e-6 if b.type != F16 else 5e-3, writes=True))

    def _soft_max(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        mask = b if p[0] % 2 else None
        scale = [1.0, 0.5][p[1] % 2]
        srcs = [a] + ([mask] if mask is not None else [])
        return self._op(ctx, "soft_max", ctx.obj.soft_max, (a.obj, mask.obj if mask else None, scale), srcs,
                        lambda t: self._new(ctx, t, "SOFT_MAX", srcs, ref_soft_max(scale), tol=1e-4 if all(
                            s.type == F32 for s in srcs) else 5e-3))

    def _norm(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        which = ["rms_norm", "norm"][p[0] % 2]
        eps = 1e-6 if which == "rms_norm" else 1e-5
        ref = ref_rms_norm(eps) if which == "rms_norm" else ref_norm(eps)
        return self._op(ctx, which, getattr(ctx.obj, which), (a.obj, eps), [a],
                        lambda t: self._new(ctx, t, which.upper(), [a], ref, tol=1e-4 if a.type == F32 else 5e-3))

    def _reduce(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        which = ["sum_rows", "mean"][p[0] % 2]
        fn = np.sum if which == "sum_rows" else np.mean

        type = a.type if which == "sum_rows" else F32  # ggml_mean is F32

        def ref(x: np.ndarray) -> np.ndarray:
            with np.errstate(all="ignore"):
                return as_type(fn(f32(x).astype(np.float64), axis=-1, keepdims=True), type)
        return self._op(ctx, which, getattr(ctx.obj, which), (a.obj,), [a],
                        lambda t: self._new(ctx, t, which.upper(), [a], ref, type, ne=(1,) + a.ne[1:], tol=1e-4))

    def _get_rows(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        type = I32 if a.type == I32 else F32
        return self._op(ctx, "get_rows", ctx.obj.get_rows, (a.obj, b.obj), [a, b],
                        lambda t: self._new(ctx, t, "GET_ROWS", [a, b], ref_get_rows, type,
                                            (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), tol=1e-6))

    def _rope(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        n_dims, mode = [2, 4][p[0] % 2], [0, 2][p[1] % 2]
        return self._op(ctx, "rope", ctx.obj.rope, (a.obj, b.obj, n_dims, mode), [a, b],
                        lambda t: self._new(ctx, t, "ROPE", [a, b], ref_rope(n_dims, mode),
                                            tol=1e-3 if a.type == F32 else 1e-2))

    def _concat(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        dim = p[0] % 6 - 1
        ne = tuple(a.ne[i] + (b.ne[i] if i == dim else 0) for i in range(4))
        return self._op(ctx, "concat", ctx.obj.concat, (a.obj, b.obj, dim), [a, b],
                        lambda t: self._new(ctx, t, "CONCAT", [a, b],
                                            lambda x, y: np.concatenate([x, y], axis=3 - dim), ne=ne, tol=1e-6))

    def _repeat(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        shape = tuple(b.ne[::-1])  # ggml_repeat reads only b's shape: b is no source of the node
        return self._op(ctx, "repeat", ctx.obj.repeat, (a.obj, b.obj), [a, b],
                        lambda t: self._new(ctx, t, "REPEAT", [a], lambda x: tile(x, shape),
                                            ne=b.ne, tol=1e-6))

    def _other(self, ctx: CtxM, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        """Checked ops the model does not compute: random arguments, results of unknown value."""
        o = ctx.obj
        i0, i1, i2, i3 = p
        op = OTHER_OPS[(i0 * 7 + i3) % len(OTHER_OPS)]
        calls_ = {
            "argsort": lambda: o.argsort(a.obj, i1 > 30), "top_k": lambda: o.top_k(a.obj, i1),
            "pad": lambda: o.pad(a.obj, *p), "concat": lambda: o.concat(a.obj, b.obj, i1 % 5),
            "acc": lambda: o.acc(a.obj, b.obj, i0 * 4, i1 * 4, i2 * 4, i3 * 4),
            "diag_mask_inf": lambda: o.diag_mask_inf(a.obj, i1), "sum": lambda: o.sum(a.obj),
            "argmax": lambda: o.argmax(a.obj), "cast": lambda: o.cast(a.obj, b.type),
            "swiglu": lambda: o.swiglu(a.obj, b.obj if i1 > 30 else None),
            "leaky_relu": lambda: o.leaky_relu(a.obj, i1 / 10),
            "im2col": lambda: o.im2col(a.obj, b.obj, i0 % 3, i1 % 3, i2 % 3, i3 % 3, 1, 1, i1 > 30, F32),
            "pool_1d": lambda: o.pool_1d(a.obj, "max" if i1 > 30 else "avg", i1 % 4, i2 % 4, i3 % 3),
            "set_rows": lambda: o.set_rows(a.obj, b.obj, c.obj), "out_prod": lambda: o.out_prod(a.obj, b.obj),
            "cumsum": lambda: o.cumsum(a.obj), "l2_norm": lambda: o.l2_norm(a.obj),
            "clamp": lambda: o.clamp(a.obj, -1.0, 1.0),
            "flash_attn": lambda: o.flash_attn(a.obj, b.obj, c.obj, None, 0.5, 0.0),
        }
        one_src = op in ("argsort", "top_k", "pad", "diag_mask_inf", "sum", "argmax", "cast",
                         "leaky_relu", "pool_1d", "cumsum", "l2_norm", "clamp")
        srcs = [a] + ([] if one_src or (op == "swiglu" and i1 <= 30) else [b])  # swiglu(a): b unused
        if op in ("set_rows", "flash_attn"):
            srcs.append(c)
        return self._op(ctx, op, calls_[op], (), srcs, lambda t: None)

    @rule(target=tensors, ctx=contexts, op=st.sampled_from(OP_NAMES), a=tensors, b=tensors, c=tensors,
          p=st.lists(st.integers(-3, 70), min_size=4, max_size=4))
    def op(self, ctx: CtxM, op: str, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        """One op constructor, on tensors of any context (closed and reset ones too)."""
        step(f"op({ctx}, {op}, {a}, {b}, {c}, {p})")
        make = self._binary(op) if op in ("add", "sub", "mul", "div") else getattr(self, "_" + op)
        return make(ctx, a, b, c, p)

    @rule(target=tensors, ctx=contexts, op=st.sampled_from(OP_NAMES), a=tensors, b=tensors, c=tensors,
          p=st.lists(st.integers(-3, 70), min_size=4, max_size=4))
    def op_again(self, ctx: CtxM, op: str, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        """The same rule, to make ops as frequent as they are in real use."""
        return self.op(ctx, op, a, b, c, p)

    # ------------------------------------------------------------------ graphs
    @rule(target=graphs, ctx=contexts, outs=st.lists(tensors, min_size=1, max_size=3),
          size=st.sampled_from([2, 8, 64]), mark=st.booleans())
    def new_graph(self, ctx: CtxM, outs: list[TM], size: int, mark: bool) -> Any:
        step(f"new_graph({ctx}, {outs}, {size}, mark_outputs={mark})")
        if mark:
            for t in outs:
                exc, _ = call("set_output", t.obj.set_output, must="closed" if t.is_closed else "ok")
                if exc is None:
                    t.output = True
        exc, g = call("new_graph", ctx.obj.new_graph, size, must="closed" if ctx.closed else None)
        if exc is not None:
            return multiple()
        gm = GraphM(g, ctx)
        self._track(gm)
        self._build(gm, outs)
        return gm

    @rule(target=graphs, ctx=contexts, ne=ne4, types=st.lists(st.sampled_from([F32, F32, F16]), min_size=1, max_size=3),
          ops=st.lists(st.tuples(st.sampled_from(CHAIN_OPS), st.integers(0, 9), st.integers(0, 9),
                                 st.lists(st.integers(0, 70), min_size=4, max_size=4)), min_size=1, max_size=5),
          executor=st.none() | placers | backends, seed=st.integers(0, 2**16))
    def chain(self, ctx: CtxM, ne: tuple[int, ...], types: list[GGMLType], ops: list[Any], executor: Any,
              seed: int) -> Any:
        """A small graph as models build them: leafs of one shape, a few ops, the last one the
        output; then (with an executor) the usual flow."""
        step(f"chain({ctx}, {list(ne)}, {[t.name for t in types]}, {ops}, {executor}, {seed})")
        ts: list[TM] = []
        for type in types:
            got = self.new_tensor(ctx, type, ne)
            if isinstance(got, TM):
                ts.append(got)
        if not ts:
            return multiple()
        for op, i, j, p in ops:
            a, b = ts[-1 - i % len(ts)], ts[j % len(ts)]
            make = self._binary(op) if op in ("add", "sub", "mul", "div") else getattr(self, "_" + op)
            got = make(ctx, a, b, ts[0], p)
            if isinstance(got, TM):
                ts.append(got)
        g = self.new_graph(ctx, [ts[-1]], 64, True)
        if not isinstance(g, GraphM):
            return multiple()
        if executor is not None:
            self.flow(executor, g, seed)
        return g

    @rule(target=tensors, g=graphs, i=st.integers(0, 20))
    def graph_tensor(self, g: "GraphM", i: int) -> Any:
        """A tensor of a graph, for the other rules."""
        step(f"graph_tensor({g}, {i})")
        return g.tensors[i % len(g.tensors)] if g.tensors else multiple()

    @rule(g=graphs, outs=st.lists(tensors, min_size=1, max_size=2))
    def build_more(self, g: "GraphM", outs: list[TM]) -> None:
        step(f"build_more({g}, {outs})")
        self._build(g, outs)

    def _build(self, g: "GraphM", outs: list[TM]) -> None:
        closed = g.ctx.closed or g.ctx.gen != g.gen or any(t.is_closed for t in outs)
        # a node whose sources are in a context reset since: its sources are gone
        stale = any(t.is_closed for t in self._closure(outs))
        exc, _ = call("build_forward", g.obj.build_forward, *(t.obj for t in outs),
                      must="closed" if (closed or stale) else None)
        if exc is None:
            for t in self._closure(outs):
                if t not in g.tensor_set:
                    g.tensor_set.add(t)
                    g.tensors.append(t)
            g.computed = False

    def _closure(self, outs: list[TM]) -> list[TM]:
        seen: dict[TM, None] = {}
        todo = list(outs)
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen[t] = None
            todo.extend(t.srcs)
            if t.base is not None:
                todo.append(t.base)
        return list(seen)

    # ------------------------------------------------------------------ backends
    @rule(target=backends, kind=st.sampled_from(["cpu", "cpu", "numpy", "flaky", "own"]), n_threads=st.integers(1, 2))
    def new_backend(self, kind: str, n_threads: int) -> Any:
        step(f"new_backend({kind}, {n_threads})")
        if kind == "cpu":
            exc, be = call("CPUBackend", CPUBackend, n_threads, must="ok")
        else:
            name = {"numpy": "NUMPY", "flaky": "FLAKYNP", "own": "OWNNP"}[kind]
            exc, be = call("Device.init", device_by_name(name).init)
        if exc is not None:
            return multiple()
        return self._track(BackendM(be, kind))

    def close_backend(self, be: BackendM) -> None:
        step(f"close_backend({be})")
        call("Backend.close", be.obj.close, must="ok")
        be.closed = True

    def synchronize(self, be: BackendM) -> None:
        step(f"synchronize({be})")
        call("Backend.synchronize", be.obj.synchronize, must="closed" if be.closed else None)

    @rule(target=pools, n=st.integers(0, 2))
    def new_threadpool(self, n: int) -> Any:
        step(f"new_threadpool({n})")
        exc, pool = call("Threadpool", Threadpool, n, must="refuse" if n < 1 else "ok")
        return multiple() if exc else self._track(TpM(pool))

    def set_threadpool(self, be: BackendM, pool: TpM | None) -> None:
        step(f"set_threadpool({be}, {pool})")
        if be.kind != "cpu":
            return
        must = "closed" if be.closed or (pool is not None and pool.closed) else "ok"
        call("set_threadpool", be.obj.set_threadpool, pool.obj if pool else None, must=must)

    def close_threadpool(self, pool: TpM) -> None:
        step(f"close_threadpool({pool})")
        call("Threadpool.close", pool.obj.close, must="ok")
        pool.closed = True

    def pause_threadpool(self, pool: TpM, pause: bool) -> None:
        step(f"pause_threadpool({pool}, {pause})")
        call("pause/resume", pool.obj.pause if pause else pool.obj.resume, must="closed" if pool.closed else "ok")

    @rule(methods=st.sets(st.sampled_from(FLAKY_METHODS), max_size=2))
    def set_failing(self, methods: set[str]) -> None:
        step(f"set_failing({sorted(methods)})")
        FAIL.clear()
        FAIL.update(methods)

    # ------------------------------------------------------------------ buffers
    @rule(target=buffers, ctx=contexts, where=st.sampled_from(["cpu", "flaky"]) | backends)
    def alloc_tensors(self, ctx: CtxM, where: Any) -> Any:
        step(f"alloc_tensors({ctx}, {where})")
        target = cpu_buffer_type() if where == "cpu" else FLAKY_BUFT if where == "flaky" else where.obj
        closed = ctx.closed or (isinstance(where, BackendM) and where.closed)
        # a closed backend: ClosedError, or ValueError first when no tensor needs allocation
        must = "closed" if ctx.closed else "value" if not ctx.no_alloc or closed else None
        exc, buf = call("alloc_tensors", ctx.obj.alloc_tensors, target, must=must)
        if exc is not None:
            return multiple()
        bm = BufM(buf, ctx)
        ctx.buffers.append(bm)
        tracked = self._track(bm)
        for t in self.all_tensors:
            if t.base is None and t.ctx is ctx and not t.is_closed and (
                    t.home is None or (t.uncertain and self._introspect_home(t) is bm)):
                # (uncertain: a reserve forgot its place in a placer's memory; then it has none)
                t.home = bm
                t.known = None
                t.uncertain = False
        return tracked

    @rule(target=buffers, where=st.sampled_from(["cpu", "flaky"]) | backends, size=st.sampled_from([0, 64, 4096, 2**62]))
    def alloc_buffer(self, where: Any, size: int) -> Any:
        step(f"alloc_buffer({where}, {size})")
        target = cpu_buffer_type() if where == "cpu" else FLAKY_BUFT if where == "flaky" else where.obj
        closed = isinstance(where, BackendM) and where.closed
        exc, buf = call("alloc_buffer", target.alloc_buffer, size,
                        must="closed" if closed else ("refuse" if size > 2**50 else None))
        return multiple() if exc else self._track(BufM(buf, None))

    def close_buffer(self, buf: BufM) -> None:
        step(f"close_buffer({buf})")
        call("Buffer.close", buf.obj.close, must="ok")
        buf.closed = True
        self._forget_dead()

    def clear_buffer(self, buf: BufM, v: int) -> None:
        step(f"clear_buffer({buf}, {v})")
        exc, _ = call("Buffer.clear", buf.obj.clear, v, must="closed" if buf.closed else None)
        for t in self.all_tensors:
            if t.base is None and t.home is buf:
                t.known = None if exc else np.frombuffer(bytes([v]) * (t.nelements * DTYPE[t.type].itemsize),
                                                         DTYPE[t.type]).reshape(t.ne[::-1]).copy()

    def memset_tensor(self, t: TM, v: int) -> None:
        step(f"memset_tensor({t}, {v})")
        state = self._access_state(t)
        if state == "ok" and (t.root.home == "arena"):
            must: str | None = "value"  # not in a backend buffer
        else:
            must = {"closed": "closed", "nodata": "value"}.get(state)
        exc, _ = call("tensor_memset", pyggml.Backend.tensor_memset, t.obj, v, must=must)
        b = t.root
        if exc is None:
            if t.base is not None:
                b.known = None
            else:
                b.known = np.frombuffer(bytes([v]) * (t.nelements * DTYPE[t.type].itemsize),
                                        DTYPE[t.type]).reshape(t.ne[::-1]).copy()
            if isinstance(b.home, PlacerM):
                for o in self.all_tensors:
                    if o.base is None and o.home is b.home and o is not b:
                        o.known = None
        elif isinstance(exc, Boom):
            b.known = None

    # ------------------------------------------------------------------ allocators, schedulers
    @rule(target=placers, where=st.sampled_from(["cpu", "flaky"]) | backends)
    def new_graph_allocator(self, where: Any) -> Any:
        step(f"new_graph_allocator({where})")
        target = cpu_buffer_type() if where == "cpu" else FLAKY_BUFT if where == "flaky" else where.obj
        closed = isinstance(where, BackendM) and where.closed
        exc, ga = call("GraphAllocator", GraphAllocator, target, must="closed" if closed else None)
        return multiple() if exc else self._track(PlacerM(ga, "galloc", []))

    @rule(target=placers, first=st.none() | backends, cpu=backends, size=st.sampled_from([4, 64, 512]))
    def new_scheduler(self, first: BackendM | None, cpu: BackendM, size: int) -> Any:
        step(f"new_scheduler({first}, {cpu}, {size})")
        bes = ([first] if first is not None else []) + [cpu]
        if cpu.kind != "cpu" or (first is not None and first is cpu):
            must = None
        else:
            must = "closed" if any(b.closed for b in bes) else None
        exc, s = call("Scheduler", Scheduler, [b.obj for b in bes], graph_size=size, must=must)
        return multiple() if exc else self._track(PlacerM(s, "sched", bes))

    def close_placer(self, p: PlacerM) -> None:
        step(f"close_placer({p})")
        call("close", p.obj.close, must="ok")
        p.closed = True
        self._forget_dead()

    @rule(p=placers, g=graphs, reserve=st.booleans())
    def place(self, p: PlacerM, g: "GraphM", reserve: bool) -> None:
        step(f"place({p}, {g}, reserve={reserve})")
        self._place(p, g, reserve)

    def _place(self, p: PlacerM, g: "GraphM", reserve: bool = False) -> bool:
        must = "closed" if p.closed or self._graph_state(g) == "closed" or any(b.closed for b in p.backends) else None
        if must is None and any(self._access_state(t) == "closed" and not self._replaceable(t.root)
                                for t in g.tensors):
            must = "closed"  # in a buffer of the user's that was closed
        fn = p.obj.reserve if reserve else p.obj.alloc_graph
        exc, _ = call(f"{p.kind}.{'reserve' if reserve else 'alloc_graph'}", fn, g.obj, must=must)
        early = p.closed or self._graph_state(g) == "closed" or any(b.closed for b in p.backends)
        if not early and (reserve or exc is not None):
            # pyggml forgot the places of g's tensors in placers' memory before placing (kept
            # only by a placement that succeeds): a reserve, or a placement refused later
            for b in {t.root for t in g.tensors}:
                if b.home == "dead" or isinstance(b.home, PlacerM):
                    b.home, b.known, b.uncertain = None, None, False
        if reserve:
            for t in self.all_tensors:
                if t.base is None and t.home is p:
                    t.uncertain = True
            if p.kind == "sched":  # ggml_backend_sched_reserve resets the scheduler
                if p.graph is g:
                    p.graph = None
            return exc is None
        if exc is None:
            self._placed(p, g)
            return True
        if p.kind == "sched" and not isinstance(exc, ClosedError) or isinstance(exc, Boom):
            # the scheduler reset its previous allocation before failing
            for t in self.all_tensors:
                if t.base is None and t.home is p:
                    t.uncertain = True
        return False

    def sched_reset(self, p: PlacerM) -> None:
        step(f"sched_reset({p})")
        if p.kind != "sched":
            return
        exc, _ = call("Scheduler.reset", p.obj.reset, must="closed" if p.closed else None)
        if exc is None:
            p.placed = set()
            p.graph = None

    # ------------------------------------------------------------------ compute
    def _compute_expect(self, g: "GraphM", placer: PlacerM | None) -> str | None:
        """What computing ``g`` must raise (None: it may work)."""
        if self._graph_state(g) == "closed":
            return "closed"
        if placer is not None:  # a scheduler places the graph first
            if placer.closed or any(b.closed for b in placer.backends):
                return "closed"
            for t in g.tensors:
                if self._access_state(t) == "closed" and not self._replaceable(t.root):
                    return "closed"
            return None
        must = None
        WHY.clear()
        # a leaf that no node reads (built as an output) is not computed: it may have no data
        read = {s for t in g.tensors if t.is_node for s in t.srcs}
        for t in g.tensors:
            st_ = self._access_state(t)
            if st_ == "closed" and (t.is_node or t in read or t.is_closed or t.root.is_closed):
                WHY[:] = [f"{t} ({t.op}) is in freed memory in the model (home {t.root.home})"]
                return "closed"
            if st_ == "nodata" and (t.is_node or t in read):
                must = "value"
                WHY[:] = [f"{t} ({t.op}, is_node={t.is_node}) has no data in the model"]
        p = g.placed_by
        if p is not None and must is None:
            # a closed placer: what it held is "dead" above; a graph it placed nothing of
            # (every tensor had data already) does not need it
            if not p.closed and p.graph is not g and not (p.graph is not None and g.tensor_set <= p.graph.tensor_set):
                return "closed"
        return must

    def _simulate(self, g: "GraphM") -> dict[TM, bytearray | None]:
        """The memory of every base tensor of ``g`` after computing it, as the model sees it."""
        mem: dict[TM, bytearray | None] = {}
        for b in {t.root for t in g.tensors}:
            mem[b] = mem_of(b)
        written: set[TM] = set()
        by_ptr = {t.obj._ptr: t for t in g.tensors}
        order = [by_ptr.get(p) for p in g.obj.raw_nodes()]
        for t in order:
            if t is None:
                for b in list(mem):  # a node the model does not know: nothing is known
                    mem[b] = None
                continue
            if t.op in ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"):
                continue
            vals = None
            if t.ref is not None:
                srcs = [read_mem(s, mem) for s in t.srcs]
                if all(s is not None for s in srcs):
                    try:
                        vals = t.ref(*srcs)
                    except (ValueError, IndexError):
                        vals = None
            if t.base is not None and vals is not None and t.op == "CPY":
                pass
            write_mem(t, mem, vals)
            written.add(t.root)
        self._written = written
        return mem

    def _after_compute(self, g: "GraphM", mem: dict[TM, bytearray | None]) -> None:
        """Update the model's memory after ``g`` was computed."""
        consumers: dict[TM, int] = {t: 0 for t in g.tensors}
        for t in g.tensors:
            for s in t.srcs:
                if s in consumers:
                    consumers[s] += 1
        protected: set[TM] = set()
        for t in g.tensors:
            # ggml-alloc decides what may be overwritten when it places the graph: a node may
            # take its source's memory (in place: NEG over a leaf read once, seed 2535) unless
            # the source is an output then. A set_output() after the placement changes nothing
            # until the graph is placed again (computing it on a backend keeps the places, and
            # the leaf's memory holds the node's value): the flag at placement counts
            if t.output_placed or consumers[t] == 0:
                protected.add(t.root)
        for b, m in mem.items():
            home = b.home
            if isinstance(home, PlacerM) and b not in protected:
                b.known = None
            elif b in self._written or isinstance(home, PlacerM):
                b.known = None if m is None else np.ndarray(b.ne[::-1], DTYPE[b.type], buffer=m).copy()
        g.computed = True

    def compute(self, be: BackendM, g: "GraphM") -> None:
        step(f"compute({be}, {g})")
        self._compute_on(be, g)

    def _compute_on(self, be: BackendM, g: "GraphM") -> bool:
        must = "closed" if be.closed else self._compute_expect(g, None)
        mem = self._simulate(g) if must is None else {}
        exc, _ = call(f"{be}.graph_compute", be.obj.graph_compute, g.obj, must=must)
        if exc is None:
            if must is not None:
                fail("NOT_REFUSED", f"computing {g} on {be} should have been refused ({must})")
            count(f"graphs computed ({be.kind})")
            self._after_compute(g, mem)
            return True
        if isinstance(exc, Boom) or (exc is not None and must is None):
            self._unknown_after_failed(g)
        return False

    def _unknown_after_failed(self, g: "GraphM") -> None:
        """A failed computation may have written part of the graph."""
        for t in g.tensors:
            if t.is_node and t.op not in ("RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"):
                t.root.known = None

    def compute_default(self, g: "GraphM") -> None:
        step(f"compute_default({g})")
        must = self._compute_expect(g, None)
        mem = self._simulate(g) if must is None else {}
        exc, _ = call("cpu.graph_compute", graph_compute, g.obj, n_threads=1, must=must)
        if exc is None:
            self._after_compute(g, mem)
        elif must is None:
            self._unknown_after_failed(g)

    def sched_compute(self, p: PlacerM, g: "GraphM") -> None:
        step(f"sched_compute({p}, {g})")
        if p.kind != "sched":
            return
        self._sched_compute(p, g)

    def _sched_compute(self, p: PlacerM, g: "GraphM") -> bool:
        must = self._compute_expect(g, p)
        held = p.graph is g and g.placed_by is p and all(
            self._access_state(t) == "ok" for t in g.tensors)
        if must is None and not held:
            # compute places it first: whatever it placed before is gone
            before = {t: t.known for t in self.all_tensors if t.base is None and t.home is p}
        exc, _ = call("Scheduler.compute", p.obj.compute, g.obj, must=must)
        if exc is None:
            count("graphs computed (scheduler)")
            if not held:
                self._placed(p, g)
            mem = self._simulate(g)
            self._after_compute(g, mem)
            return True
        if must is None:
            if not held:
                if p.obj._is_alloc and p.obj._graph is g.obj:
                    self._placed(p, g)  # placed, then the computation failed
                else:
                    # refused while placing (as in _place): pyggml forgot the places of g's
                    # tensors in placers' memory first, and a refused split keeps none of them
                    for b in {t.root for t in g.tensors}:
                        if b.home == "dead" or isinstance(b.home, PlacerM):
                            b.home, b.known, b.uncertain = None, None, False
            self._unknown_after_failed(g)
            for t in self.all_tensors:
                if t.base is None and t.home is p:
                    t.uncertain = True
        return False

    @rule(executor=placers | backends, g=graphs, seed=st.integers(0, 2**16))
    def flow(self, executor: Any, g: "GraphM", seed: int) -> None:
        """The usual sequence: place, set every leaf, compute, read every output."""
        step(f"flow({executor}, {g}, {seed})")
        if isinstance(executor, PlacerM) and executor.kind == "galloc":
            if not self._place(executor, g):
                return
            be = next((m for m in reversed(self.all) if isinstance(m, BackendM) and not m.closed
                       and m.kind == "cpu"), None)
            if be is None:
                return
        elif isinstance(executor, PlacerM):
            if not self._place(executor, g):
                return
        else:  # tensors of no_alloc contexts go to a buffer of the backend
            for ctx in {t.root.ctx for t in g.tensors if t.root.home is None and t.root.ctx.no_alloc}:
                self.alloc_tensors(ctx, executor)
        for i, t in enumerate(g.tensors):
            if not t.is_node and t.base is None and t.type in DTYPE and t.nelements <= 1 << 22:
                self._set(t, self._values(t, seed + i))
        if isinstance(executor, PlacerM) and executor.kind == "sched":
            ok = self._sched_compute(executor, g)
        elif isinstance(executor, PlacerM):
            ok = self._compute_on(be, g)
        else:
            ok = self._compute_on(executor, g)
        if ok:
            for t in g.tensors:
                if t.output or t is g.tensors[0]:
                    self._read(t)

    # ------------------------------------------------------------------ graph caches
    @rule(target=caches, executor=placers | backends, max_graphs=st.integers(1, 2))
    def new_cache(self, executor: Any, max_graphs: int) -> Any:
        step(f"new_cache({executor}, {max_graphs})")
        if isinstance(executor, PlacerM):
            if executor.kind != "sched":
                return multiple()
            kw = {"scheduler": executor.obj}
        else:
            kw = {"backend": executor.obj}
        closed = executor.closed or (isinstance(executor, PlacerM) and any(b.closed for b in executor.backends))
        exc, cache = call("GraphCache", GraphCache, _cache_build, graph_size=32, n_tensors=16,
                          max_graphs=max_graphs, must="closed" if closed and isinstance(executor, BackendM) else None,
                          **kw)
        if exc is not None:
            return multiple()
        return self._track(CacheM(cache, executor))

    @rule(cache=caches, key=st.integers(1, 3), seed=st.integers(0, 2**16))
    def cache_compute(self, cache: CacheM, key: int, seed: int) -> None:
        step(f"cache_compute({cache}, {key}, {seed})")
        ex = cache.executor
        closed = cache.closed or ex.closed or (isinstance(ex, PlacerM) and any(b.closed for b in ex.backends))
        rng = np.random.default_rng(seed)
        x = rng.uniform(-2, 2, size=(2, 4 * key)).astype(np.float32)
        w = rng.uniform(-2, 2, size=(4 * key,)).astype(np.float32)
        exc, out = call("GraphCache.compute", cache.obj.compute, key, x=x, w=w,
                        must="closed" if closed else None)
        if isinstance(ex, PlacerM) and not closed:
            if exc is None:  # the cache's graph has the scheduler's memory now
                self._invalidate_placer(ex)
                ex.placed = set()
                ex.graph = None
            else:
                for t in self.all_tensors:
                    if t.base is None and t.home is ex:
                        t.uncertain = True
        if exc is None:
            ref_y = f32(np.tanh(f32(x * w)) + x)
            ref_s = f32((ref_y.astype(np.float64) ** 2).sum(axis=-1, keepdims=True))
            count("graph cache computes")
            for name, ref, tol in (("y", ref_y, 1e-4), ("s", ref_s, 1e-4)):
                ok, why = close_enough(out[name], ref, tol)
                if not ok:
                    fail("WRONG_RESULT", f"GraphCache output {name}: {why}")

    def close_cache(self, cache: CacheM) -> None:
        step(f"close_cache({cache})")
        call("GraphCache.close", cache.obj.close)
        cache.closed = True

    # ------------------------------------------------------------------ misc
    def collect(self) -> None:
        step("collect()")
        calls_before = calls
        gc.collect()
        if UNRAISABLE:
            fail("MISPLACED_EXCEPTION", f"garbage collection sent exceptions to sys.unraisablehook: {UNRAISABLE!r}")
        del calls_before

    # ------------------------------------------------------------------ rules grouping the small actions
    @initialize(target=contexts)
    def init_contexts(self) -> Any:
        return multiple(self.new_context(1 << 20, False), self.new_context(1 << 20, True))

    @initialize(target=backends)
    def init_backend(self) -> Any:
        return self.new_backend("cpu", 1)

    @rule(target=contexts, size=st.sampled_from(MEM_SIZES), no_alloc=st.booleans(),
          huge=st.none() | st.sampled_from(HUGE_MEM))
    def context_new(self, size: int, no_alloc: bool, huge: int | None) -> Any:
        if huge is not None:
            self.new_context_huge(huge)
            return multiple()
        return self.new_context(size, no_alloc)

    @rule(ctx=contexts, action=st.sampled_from(["close", "reset", "reset", "collect"]))
    def context_action(self, ctx: CtxM, action: str) -> None:
        {"close": self.close_context, "reset": self.reset_context,
         "collect": lambda c: self.collect()}[action](ctx)

    @rule(target=tensors, ctx=contexts, type=st.sampled_from([F32, F32, F32, F16, I32]), ne=any_ne,
          huge=st.none() | st.none() | st.sampled_from(HUGE_NE))
    def tensor_new(self, ctx: CtxM, type: GGMLType, ne: tuple[int, ...], huge: tuple[int, ...] | None) -> Any:
        if huge is not None:
            return self.new_tensor_huge(ctx, type, huge)
        return self.new_tensor(ctx, type, ne)

    @rule(t=tensors, action=st.sampled_from(["set", "read", "read", "output", "input", "memset"]),
          seed=st.integers(0, 2**16), flag=st.booleans())
    def tensor_action(self, t: TM, action: str, seed: int, flag: bool) -> None:
        if action == "set":
            self.set_tensor(t, seed, flag)
        elif action == "read":
            self.read_tensor(t)
        elif action == "output":
            self.mark_output(t)
        elif action == "input":
            self.mark_input(t)
        else:
            self.memset_tensor(t, 255 if flag else 0)

    @rule(t=tensors, action=st.sampled_from(["set", "read"]), seed=st.integers(0, 2**16))
    def tensor_action_again(self, t: TM, action: str, seed: int) -> None:
        self.tensor_action(t, action, seed, False)

    @rule(be=backends, action=st.sampled_from(["close", "synchronize", "threadpool"]), pool=st.none() | pools)
    def backend_action(self, be: BackendM, action: str, pool: TpM | None) -> None:
        if action == "close":
            self.close_backend(be)
        elif action == "synchronize":
            self.synchronize(be)
        else:
            self.set_threadpool(be, pool)

    @rule(pool=pools, action=st.sampled_from(["close", "pause", "resume"]))
    def pool_action(self, pool: TpM, action: str) -> None:
        if action == "close":
            self.close_threadpool(pool)
        else:
            self.pause_threadpool(pool, action == "pause")

    @rule(buf=buffers, action=st.sampled_from(["close", "clear", "weights"]), v=st.sampled_from([0, 0x3C, 255]))
    def buffer_action(self, buf: BufM, action: str, v: int) -> None:
        if action == "close":
            self.close_buffer(buf)
        elif action == "clear":
            self.clear_buffer(buf, v)
        else:
            self.mark_weights(buf)

    def mark_weights(self, buf: BufM) -> None:
        """Usage "weights": a scheduler runs the nodes that read the buffer's tensors on a
        backend that can use it, and copies the inputs they read there (an OWNNP device)."""
        step(f"mark_weights({buf})")
        call("Buffer.usage", setattr, buf.obj, "usage", "weights", must="closed" if buf.closed else "ok")

    @rule(p=placers, action=st.sampled_from(["close", "reset"]))
    def placer_action(self, p: PlacerM, action: str) -> None:
        if action == "close":
            self.close_placer(p)
        else:
            self.sched_reset(p)

    @rule(executor=st.none() | backends | placers, g=graphs)
    def compute_graph(self, executor: Any, g: "GraphM") -> None:
        """Compute ``g`` alone: on a backend, with a scheduler, on a new CPU backend (None); a
        graph allocator places it."""
        if executor is None:
            self.compute_default(g)
        elif isinstance(executor, BackendM):
            self.compute(executor, g)
        elif executor.kind == "sched":
            self.sched_compute(executor, g)
        else:
            self.place(executor, g, False)

    @rule(executor=placers | backends, g=graphs, seed=st.integers(0, 2**16))
    def flow_again(self, executor: Any, g: "GraphM", seed: int) -> None:
        self.flow(executor, g, seed)

    @rule(target=graphs, ctx=contexts, ne=chain_ne, types=st.lists(st.sampled_from([F32, F32, F16]), min_size=1, max_size=3),
          ops=st.lists(st.tuples(st.sampled_from(CHAIN_OPS), st.integers(0, 9), st.integers(0, 9),
                                 st.lists(st.integers(0, 70), min_size=4, max_size=4)), min_size=1, max_size=5),
          executor=st.none() | placers | backends, seed=st.integers(0, 2**16))
    def chain_again(self, ctx: CtxM, ne: tuple[int, ...], types: list[GGMLType], ops: list[Any], executor: Any,
                    seed: int) -> Any:
        return self.chain(ctx, ne, types, ops, executor, seed)

    @rule(target=tensors, ctx=contexts, op=st.sampled_from(OP_NAMES), a=tensors, b=tensors, c=tensors,
          p=st.lists(st.integers(-3, 70), min_size=4, max_size=4))
    def op_third(self, ctx: CtxM, op: str, a: TM, b: TM, c: TM, p: list[int]) -> Any:
        return self.op(ctx, op, a, b, c, p)

    @rule(cache=caches)
    def cache_close(self, cache: CacheM) -> None:
        self.close_cache(cache)

    def teardown(self) -> None:
        step("teardown()")
        FAIL.clear()
        order = list(self.all)
        for m in reversed(order) if len(order) % 2 else order:
            if isinstance(m, TM) or m.closed:
                continue
            close = getattr(m.obj, "close", None)
            if close is not None:
                exc, _ = call(f"{m}.close", close)
                if exc is not None and not isinstance(exc, Boom):
                    fail("UNEXPECTED_EXCEPTION", f"closing {m}: {exc!r}")
        self.all.clear()
        self.all_tensors.clear()
        gc.collect()
        if UNRAISABLE:
            fail("MISPLACED_EXCEPTION", f"exceptions sent to sys.unraisablehook at teardown: {UNRAISABLE!r}")


class GraphM(Model):
    prefix = "graph"

    def __init__(self, obj: Any, ctx: CtxM):
        super().__init__(obj)
        self.ctx = ctx
        self.gen = ctx.gen
        self.tensors: list[TM] = []
        self.tensor_set: set[TM] = set()
        self.placed_by: PlacerM | None = None
        self.computed = False


def _cache_build(g: GraphParts, n: int) -> dict[str, Any]:
    ctx = g.ctx
    x = g.input(F32, [4 * n, 2], "x")
    w = g.input(F32, [4 * n], "w")
    y = ctx.tanh(ctx.mul(x, w)) + x
    s = ctx.sum_rows(ctx.sqr(y))
    return {"y": y, "s": s}


def main(argv: list[str]) -> int:
    from hypothesis import seed
    seed_value, n = int(argv[1]), int(argv[2])
    steps = int(argv[3]) if len(argv) > 3 else 40
    pyggml.raw.log.uninstall()
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if not os.environ.get("FUZZ_NO_SHRINK"):
        phases.append(Phase.shrink)
    s = settings(max_examples=n, stateful_step_count=steps, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck), phases=phases, print_blob=False)
    try:
        run_state_machine_as_test(seed(seed_value)(PyggmlMachine), settings=s)
    except Invariant as e:
        print(f"calls={calls} examples={PyggmlMachine.examples}", flush=True)
        print(f"FAILURE {e}".splitlines()[0], flush=True)
        return 1
    except BaseException as e:  # noqa: BLE001 - an error of the machine itself
        import traceback
        traceback.print_exc()
        print(f"calls={calls} examples={PyggmlMachine.examples}", flush=True)
        print(f"FAILURE MODEL: {type(e).__name__}: {e}".splitlines()[0], flush=True)
        return 1
    print("stats: " + ", ".join(f"{k}={v}" for k, v in sorted(STATS.items())), flush=True)
    print(f"calls={calls} examples={PyggmlMachine.examples}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
