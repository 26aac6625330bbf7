"""ggml's CPU backend: threads, threadpools, Ctrl-C, and buffers over host memory."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from numpy.typing import DTypeLike

from .. import _cobject, _trial
from ..memory import buffer
from .backend import Backend
from .graph_run import run_of
from ..memory.buffer import Buffer
from ..memory.buffer_type import BufferType
from ..errors import GGMLError
from ..raw import callbacks, dl, ffi, lib
from ..raw.boundary import calling
from ..core.tensor import Tensor, tensor_arg

if TYPE_CHECKING:
    from ..core.graph import Graph

__all__ = ["CPUBackend", "Threadpool", "graph_compute", "cpu_buffer_type", "cpu_buffer_from_array", "cpu_kernel_supports",
           "aligned_zeros", "ABORT_INTERVAL_US", "FLASH_ATTN_TILE_ROWS"]

_F32, _F16, _BF16 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, lib.GGML_TYPE_BF16

#: src0 types the CPU kernels of ggml-cpu/ops.cpp handle, for ops whose kernel aborts
#: ("fatal error") on other types although ggml_backend_cpu_device_supports_op accepts them
_CPU_SRC0_TYPES = {
    lib.GGML_OP_SUM: {_F32, _F16, _BF16},
    lib.GGML_OP_SUM_ROWS: {_F32}, lib.GGML_OP_MEAN: {_F32}, lib.GGML_OP_ARGMAX: {_F32},
    lib.GGML_OP_NORM: {_F32}, lib.GGML_OP_RMS_NORM: {_F32}, lib.GGML_OP_L2_NORM: {_F32},
    lib.GGML_OP_SCALE: {_F32}, lib.GGML_OP_SOFT_MAX: {_F32}, lib.GGML_OP_DIAG_MASK_INF: {_F32},
    lib.GGML_OP_ARGSORT: {_F32}, lib.GGML_OP_LEAKY_RELU: {_F32, _F16},
    lib.GGML_OP_CLAMP: {_F32, _F16}, lib.GGML_OP_ROPE: {_F32, _F16},  # clamp of BF16: "fatal error"
    lib.GGML_OP_ROPE_BACK: {_F32, _F16},
    lib.GGML_OP_SET_ROWS: {_F32, _F16},
    # every type with a to_float, and I32 (ggml_compute_forward_get_rows)
    lib.GGML_OP_GET_ROWS: {t for t in range(lib.GGML_TYPE_COUNT) if t not in (
        lib.GGML_TYPE_I8, lib.GGML_TYPE_I16, lib.GGML_TYPE_I64, lib.GGML_TYPE_F64)},
    lib.GGML_OP_REPEAT: {_F16, _BF16, lib.GGML_TYPE_I16, _F32, lib.GGML_TYPE_I32},  # I64: commented out upstream
    lib.GGML_OP_CONCAT: {_F16, _BF16, lib.GGML_TYPE_I16, lib.GGML_TYPE_I8, _F32, lib.GGML_TYPE_I32},
    lib.GGML_OP_UNARY: {_F32, _F16}, lib.GGML_OP_GLU: {_F32, _F16},
    lib.GGML_OP_SQR: {_F32, _F16, _BF16}, lib.GGML_OP_SQRT: {_F32, _F16, _BF16},
    lib.GGML_OP_LOG: {_F32, _F16, _BF16}, lib.GGML_OP_SIN: {_F32, _F16, _BF16},
    lib.GGML_OP_COS: {_F32, _F16, _BF16},
}
_BINARY = {lib.GGML_OP_ADD, lib.GGML_OP_SUB, lib.GGML_OP_MUL, lib.GGML_OP_DIV}
#: (src0, src1, dst) of ggml-cpu/binary-ops.cpp
_BINARY_TYPES = {(_F32, _F32, _F32), (_F16, _F16, _F16), (_BF16, _BF16, _BF16), (_BF16, _F32, _BF16),
                 (_BF16, _F32, _F32), (_F16, _F32, _F16), (_F16, _F32, _F32)}


_FLOATS = {_F32, _F16, _BF16}


def _cpu_can_convert(src: int, dst: int) -> bool:
    """Type conversions of ggml_compute_forward_dup (CPY, DUP, CONT)."""
    if src == dst:
        return True
    if src in _FLOATS:
        if dst in _FLOATS or (src == _F32 and dst == lib.GGML_TYPE_I32):
            return True
        return bool(lib.ggml_is_quantized(dst)) and lib.ggml_get_type_traits_cpu(dst).from_float != ffi.NULL
    if src == lib.GGML_TYPE_I32:
        return dst == _F32
    return bool(lib.ggml_is_quantized(src)) and dst == _F32


_CONVERT = {lib.GGML_OP_CPY, lib.GGML_OP_DUP, lib.GGML_OP_CONT}


def _unit_stride(t: Any) -> bool:
    """Elements of a row are adjacent (``nb[0] == ggml_type_size``): what most CPU kernels assert
    of their sources ("we don't support permuted src0"); a transposed or permuted view fails."""
    return bool(t.nb[0] == lib.ggml_type_size(t.type))


def _cpu_can_copy(p: Any) -> bool:
    """CPY / DUP / CONT: the type pair (:func:`_cpu_can_convert`) and the layouts the conversion
    kernels assert: to a quantized type (``ggml_compute_forward_dup_to_q``) a contiguous
    destination and a unit-stride source; from a quantized type (``dup_from_q``) a destination
    with unit-stride rows, whole blocks per row or contiguous."""
    src, dst = p.src[0].type, p.type
    if not _cpu_can_convert(src, dst):
        return False
    if src == dst:
        return True  # ggml_compute_forward_dup_bytes: any layout
    if lib.ggml_is_quantized(dst):
        return bool(lib.ggml_is_contiguous(p)) and _unit_stride(p.src[0])
    if lib.ggml_is_quantized(src):
        d = p.src[1] if p.src[1] != ffi.NULL else p  # the kernel reads the copy's target
        return _unit_stride(d) and (d.ne[0] % lib.ggml_blck_size(src) == 0 or bool(lib.ggml_is_contiguous(p)))
    return True


#: unary kinds computed by ggml-cpu/unary-ops.cpp's apply_unary_op, which asserts unit-stride
#: source rows (the others, gelu and silu of ops.cpp, do not)
_UNARY_UNIT = {getattr(lib, f"GGML_UNARY_OP_{n}") for n in (
    "ABS SGN NEG STEP TANH ELU RELU SIGMOID HARDSWISH HARDSIGMOID EXP FLOOR CEIL ROUND TRUNC "
    "EXPM1 SOFTPLUS").split() if hasattr(lib, f"GGML_UNARY_OP_{n}")}
_PRECS = (lib.GGML_PREC_DEFAULT, lib.GGML_PREC_F32)


def _flash_attn_ok(p: Any) -> bool:
    """ggml_compute_forward_flash_attn_ext: accumulator precision DEFAULT or F32 (op_params[3],
    Tensor.set_prec), unit-stride q, k and v, q read as F32, K a type with a CPU vec_dot whose
    vec_dot type converts from F32, V F32 or with a to_float. (K and V may differ: the tiled path
    that asserts equal types is taken only when they are equal.)"""
    q, k, v = p.src[0], p.src[1], p.src[2]
    if p.op_params[3] not in _PRECS or q.type != _F32:
        return False
    if not (_unit_stride(q) and _unit_stride(k) and _unit_stride(v)):
        return False
    kt = lib.ggml_get_type_traits_cpu(k.type)
    if kt.vec_dot == ffi.NULL or lib.ggml_get_type_traits_cpu(kt.vec_dot_type).from_float == ffi.NULL:
        return False
    return bool(v.type == _F32 or lib.ggml_get_type_traits(v.type).to_float != ffi.NULL)


def _src0_unit(p: Any) -> bool:
    return _unit_stride(p.src[0])


def _pool_ok(p: Any) -> bool:
    """POOL_1D / POOL_2D (F32, F16): the kernels read rows as unit-stride arrays; pool_1d reads
    row r at r * nb[1] (rows evenly spaced: ggml_is_contiguous_1), and pool_2d walks planes by
    nb[2] until the end of the source's bytes, writing one destination plane each, so the planes
    must be evenly spaced, in order, and each must hold its rows (else it writes past its
    destination). No GGML_ASSERT: wrong results or memory corruption otherwise."""
    s = p.src[0]
    if s.type not in (_F32, _F16) or not _unit_stride(s):
        return False
    ne, nb = s.ne, s.nb
    if p.op == lib.GGML_OP_POOL_1D:
        return bool(lib.ggml_is_contiguous_1(s))
    plane = ne[0] * nb[0] + (ne[1] - 1) * nb[1]
    return bool(0 < plane <= nb[2] and (ne[3] == 1 or nb[3] == ne[2] * nb[2]))


def _rope_ok(p: Any) -> bool:
    """ROPE / ROPE_BACK (ggml_compute_forward_rope_flt): unit-stride rows of src0 (asserted), and
    no assert for the positions (src1) and freq factors (src2), read as packed arrays: a strided
    position vector gave wrong rotations (forward and backward) silently."""
    pos, ff = p.src[1], p.src[2]
    return _unit_stride(p.src[0]) and bool(lib.ggml_is_contiguous(pos)) and (
        ff == ffi.NULL or bool(lib.ggml_is_contiguous(ff)))


def _opt_step_ok(p: Any) -> bool:
    """OPT_STEP_ADAMW (src: parameter, gradient, m, v, 7 hyperparameters) / OPT_STEP_SGD
    (parameter, gradient, 2 hyperparameters): the kernels assert only the parameter's unit
    stride, read the gradient (and AdamW's moments) as F32 at the parameter's byte offsets and
    the hyperparameters as a packed array. A gradient of other strides (ggml's gradient of a
    parameter used only through a transpose or permute is such a view) or type gave a scrambled
    update silently."""
    w = p.src[0]
    n = 4 if p.op == lib.GGML_OP_OPT_STEP_ADAMW else 2  # index of the hyperparameters
    like_w = all(p.src[i].type == _F32 and all(p.src[i].nb[d] == w.nb[d] for d in range(4)) for i in range(1, n))
    return w.type == _F32 and _unit_stride(w) and like_w and bool(lib.ggml_is_contiguous(p.src[n]))


#: further conditions the CPU kernels assert on (ggml-cpu/ops.cpp, binary-ops.cpp,
#: unary-ops.cpp, ggml-cpu.c), per op: types beyond _CPU_SRC0_TYPES, and layouts
_CPU_CHECKS: dict[int, Callable[[Any], bool]] = {
    lib.GGML_OP_IM2COL: lambda p: _unit_stride(p.src[1]) and (
        (p.type == _F32 and p.src[1].type == _F32) or (p.type == _F16 and p.src[1].type in (_F16, _F32))),
    lib.GGML_OP_POOL_1D: _pool_ok,
    lib.GGML_OP_POOL_2D: _pool_ok,
    # no assert: the gradient (src0) is read as packed F32 planes, the forward input (src1) with
    # the destination's strides, so a permuted gradient (ggml's backward of a permute feeding a
    # pool) gives a scrambled result silently
    lib.GGML_OP_POOL_2D_BACK: lambda p: all(s.type == _F32 and lib.ggml_is_contiguous(s) for s in (p.src[0], p.src[1])),
    # plain asserts (compiled out), then row r of the gradient (src0) and of the forward input
    # (src1) read as a unit-stride array at r * nb[1], r counting the rows of all dims: a
    # transposed or permuted source (ggml's backward of silu(permute(x)), or of a permute or
    # transpose of silu(x)) gives wrong values silently, or reads past the tensor
    lib.GGML_OP_SILU_BACK: lambda p: bool(lib.ggml_is_contiguous_1(p.src[0]) and lib.ggml_is_contiguous_1(p.src[1])),
    # no assert: the gradient (src0) is read as a packed [N, OH, OW, IC*KH*KW] array, so a
    # permuted one (ggml's backward of a permute of im2col's output) gives wrong values silently
    lib.GGML_OP_IM2COL_BACK: lambda p: p.src[0].type == _F32 and bool(lib.ggml_is_contiguous(p.src[0])),
    # the row indices (src1) are read as a packed I32 array (no assert; GET_ROWS itself reads them
    # with their strides), so ggml's backward of get_rows with a strided index vector added the
    # gradient rows to the wrong rows silently; the gradient's unit stride is a GGML_ASSERT
    lib.GGML_OP_GET_ROWS_BACK: lambda p: _unit_stride(p.src[0]) and bool(lib.ggml_is_contiguous(p.src[1])),
    lib.GGML_OP_TIMESTEP_EMBEDDING: lambda p: p.src[0].type == _F32 and _unit_stride(p.src[0]),
    lib.GGML_OP_CROSS_ENTROPY_LOSS: lambda p: all(s.type == _F32 and _unit_stride(s) for s in (p.src[0], p.src[1])),
    lib.GGML_OP_PAD: lambda p: p.src[0].type == _F32,
    lib.GGML_OP_TOP_K: lambda p: p.src[0].type == _F32,
    lib.GGML_OP_UPSCALE: lambda p: p.src[0].type == _F32,
    lib.GGML_OP_CUMSUM: lambda p: p.src[0].type == _F32 and _unit_stride(p.src[0]),
    lib.GGML_OP_ACC: lambda p: p.src[0].type == _F32 and p.src[1].type == _F32 and _unit_stride(p.src[1]),
    lib.GGML_OP_REPEAT: _src0_unit,
    lib.GGML_OP_SUM_ROWS: _src0_unit,
    lib.GGML_OP_RMS_NORM: _src0_unit,
    lib.GGML_OP_GROUP_NORM: lambda p: p.src[0].type == _F32 and _unit_stride(p.src[0]),
    lib.GGML_OP_RMS_NORM_BACK: lambda p: all(s.type == _F32 and _unit_stride(s) for s in (p.src[0], p.src[1])),
    # no GGML_ASSERT: a plain assert (compiled out), then rows read as unit-stride arrays, so a
    # strided source gives wrong values silently
    lib.GGML_OP_SUM: _src0_unit, lib.GGML_OP_MEAN: _src0_unit, lib.GGML_OP_ARGMAX: _src0_unit,
    lib.GGML_OP_LEAKY_RELU: _src0_unit,
    lib.GGML_OP_CLAMP: _src0_unit,
    lib.GGML_OP_OUT_PROD: _src0_unit,
    lib.GGML_OP_ROPE: _rope_ok,
    lib.GGML_OP_ROPE_BACK: _rope_ok,
    lib.GGML_OP_OPT_STEP_ADAMW: _opt_step_ok,
    lib.GGML_OP_OPT_STEP_SGD: _opt_step_ok,
    # the kernel (src0, unit stride asserted) is read plane by plane as packed [KH, KW] rows
    # (src[i01 * ne00 + i00]), so a permuted or row-padded kernel gave wrong values silently
    lib.GGML_OP_CONV_TRANSPOSE_2D: lambda p: _unit_stride(p.src[0]) and _unit_stride(p.src[1]) and (
        p.src[0].ne[1] == 1 or p.src[0].nb[1] == p.src[0].ne[0] * p.src[0].nb[0]),
    lib.GGML_OP_SQR: _src0_unit, lib.GGML_OP_SQRT: _src0_unit, lib.GGML_OP_LOG: _src0_unit,
    lib.GGML_OP_SIN: _src0_unit, lib.GGML_OP_COS: _src0_unit,
    lib.GGML_OP_UNARY: lambda p: lib.ggml_get_unary_op(p) not in _UNARY_UNIT or _unit_stride(p.src[0]),
    lib.GGML_OP_MUL_MAT: lambda p: _unit_stride(p.src[0]) and _unit_stride(p.src[1]),
    lib.GGML_OP_SCALE: lambda p: bool(lib.ggml_is_contiguous(p.src[0]) and lib.ggml_is_contiguous(p)),
    # in place (a view of src0) the kernel skips its copy and the contiguity assert
    lib.GGML_OP_DIAG_MASK_INF: lambda p: _unit_stride(p.src[0]) and (
        p.view_src != ffi.NULL or bool(lib.ggml_is_contiguous(p.src[0]))),
    lib.GGML_OP_FLASH_ATTN_EXT: _flash_attn_ok,
}


def cpu_kernel_supports(node: Tensor) -> bool:
    """Whether ggml's CPU kernels handle the types and layouts of ``node`` (a stricter check than
    ``ggml_backend_supports_op``, whose CPU answer is true for some type combinations and for
    transposed or permuted sources whose kernel then aborts the process; ``cont()`` the source
    first)."""
    return _cpu_kernel_supports_raw(tensor_arg(node, "node")._ptr)


def _cpu_kernel_supports_raw(p: Any) -> bool:
    op = p.op
    if op in _BINARY:  # binary-ops.cpp: unit-stride src0 (src1 may be strided)
        return (p.src[0].type, p.src[1].type, p.type) in _BINARY_TYPES and _unit_stride(p.src[0])
    if op in _CONVERT:
        return _cpu_can_copy(p)
    check = _CPU_CHECKS.get(op)
    if check is not None and not check(p):
        return False
    allowed = _CPU_SRC0_TYPES.get(op)
    return allowed is None or p.src[0].type in allowed


def _layout_hint(p: Any) -> str:
    """Why the kernel table refuses node ``p`` (for error messages): a source that is a
    transposed, permuted or strided view, else its types."""
    strided = [i for i, s in enumerate(p.src)
               if s != ffi.NULL and not (lib.ggml_is_contiguous(s) and _unit_stride(s))]
    if strided:
        return (f"ggml's CPU kernel for it needs other source layouts (source {strided[0]} is a "
                "transposed, permuted or strided view): make it contiguous with Context.cont first")
    return "ggml's CPU kernel for it does not take these types (or this precision): convert with Context.cast"


class Threadpool(_cobject.CObject):
    """A CPU threadpool (``ggml_threadpool_new`` / ``ggml_threadpool_free``), owned.

    Closing it while backends use it (:meth:`CPUBackend.set_threadpool`) first gives those
    backends ggml's own threads back, so they never use a freed pool."""

    _kind = "threadpool"
    _c_free = lib.ggml_threadpool_free

    def __init__(self, n_threads: int):
        if not 1 <= n_threads <= lib.GGML_MAX_N_THREADS:
            raise ValueError(f"n_threads must be 1..{lib.GGML_MAX_N_THREADS}")
        dl.require("cpu")  # a GGML_BACKEND_DL build whose CPU module did not load
        params = lib.ggml_threadpool_params_default(n_threads)
        super().__init__(lib.ggml_threadpool_new(ffi.new("struct ggml_threadpool_params *", params)), owned=True)
        self.n_threads = n_threads
        self._users: "weakref.WeakSet[CPUBackend]" = weakref.WeakSet()

    def pause(self) -> None:
        """``ggml_threadpool_pause``."""
        with calling():  # a call: no close meanwhile
            lib.ggml_threadpool_pause(self.ptr)

    def resume(self) -> None:
        """``ggml_threadpool_resume``."""
        with calling():  # a call: no close meanwhile
            lib.ggml_threadpool_resume(self.ptr)

    def close(self) -> None:
        """Detach from every backend using the pool, then ``ggml_threadpool_free``."""
        for backend in list(self._users):
            if not backend.closed:
                backend.set_threadpool(None)
        super().close()


#: Microseconds between two calls of a CPU backend's Python abort callback during a compute
#: (Ctrl-C and ``CPUBackend.abort_callback`` are noticed within about this long).
ABORT_INTERVAL_US = 10_000

#: The CPU backend's ``ggml_flash_attn_ext`` computes a head's query rows in tiles (products of
#: 64 x 64 tiles, keys in tiles too) from this many rows on (ggml-cpu's ``GGML_FA_TILE_Q``);
#: fewer rows take a path of one key at a time, several times slower per key. Models with
#: short sequences put several in one block of this many rows, a block-diagonal mask keeping
#: each to its own keys (``pyggml.models.bert``, the torch lowering's attention).
FLASH_ATTN_TILE_ROWS = 64


class CPUBackend(Backend):
    """The CPU backend (``ggml_backend_cpu_init``), owned.

    Ctrl-C during :meth:`~pyggml.core.graph.Graph.compute` stops the computation within about
    :data:`~pyggml.backends.cpu.ABORT_INTERVAL_US` (10 ms; after the node running then) and raises
    KeyboardInterrupt: the backend's abort callback (``ggml_backend_cpu_set_abort_callback``,
    which ggml asks after every node) is a small C function that calls a Python function at
    most once per interval, so Python's SIGINT handler runs inside it and its exception
    becomes "abort" (a compute shorter than that returns first; Python raises then).
    ``abort_callback`` (a callable without arguments, true to stop) adds a condition of yours,
    asked after the first node of each compute and then at most once per interval.
    ``interruptible=False`` sets no abort callback at all (``abort_callback`` is then never
    asked): Ctrl-C is noticed when the compute returns, and ggml's nodes pay no check.

    Raises :class:`~pyggml.errors.BackendNotAvailableError` in a ``GGML_BACKEND_DL`` build whose CPU
    module did not load (no variant fits the processor), GGMLError if ggml cannot create it.
    """

    def __init__(self, n_threads: int | None = None, *, interruptible: bool = True):
        dl.require("cpu")  # a GGML_BACKEND_DL build whose CPU module did not load
        ptr = lib.ggml_backend_cpu_init()
        if ptr == ffi.NULL:
            raise GGMLError("ggml_backend_cpu_init failed")
        super().__init__(ptr)
        self._setup()
        if not interruptible:
            lib.ggml_backend_cpu_set_abort_callback(self.ptr, ffi.NULL, ffi.NULL)
        if n_threads is not None:
            self.n_threads = n_threads

    @classmethod
    def _wrap(cls, ptr: Any) -> "CPUBackend":
        self = cls.__new__(cls)
        Backend.__init__(self, ptr)
        self._setup()
        return self

    def _setup(self) -> None:
        self._n_threads = lib.GGML_DEFAULT_N_THREADS
        self._threadpool: Threadpool | None = None
        self.abort_callback: Any = None
        self._abort = callbacks.Callback("ggml_abort_callback", self._should_abort, owner=self)
        # ggml asks after every node; the C throttle asks Python at most every ABORT_INTERVAL_US
        self._abort_throttle = ffi.new("struct pyggml_abort_throttle *", {
            "callback": self._abort.fn, "data": self._abort.user_data,
            "interval_us": ABORT_INTERVAL_US, "last_us": 0})
        lib.ggml_backend_cpu_set_abort_callback(self.ptr, ffi.addressof(lib, "pyggml_abort_throttled"),
                                                self._abort_throttle)

    def _should_abort(self, data: Any) -> bool:
        # a pending SIGINT is delivered here as KeyboardInterrupt -> error value True (abort)
        return bool(self.abort_callback()) if self.abort_callback is not None else False

    def _free(self, ptr: Any) -> None:
        pool = self._threadpool
        if pool is not None:
            pool._users.discard(self)
        super()._free(ptr)

    @property
    def n_threads(self) -> int:
        """Threads asked for compute (``ggml_backend_cpu_set_n_threads``); default 4. With a
        threadpool of fewer threads attached, compute uses the pool's number (see
        :meth:`set_threadpool`). Raises ValueError outside 1..GGML_MAX_N_THREADS."""
        return self._n_threads

    @n_threads.setter
    def n_threads(self, n: int) -> None:
        if not 1 <= n <= lib.GGML_MAX_N_THREADS:
            raise ValueError(f"n_threads must be 1..{lib.GGML_MAX_N_THREADS}")
        self._n_threads = n
        self._apply_n_threads()

    def set_n_threads(self, n: int) -> bool:
        """Set :attr:`n_threads` (the pool clamp applies); returns True."""
        if not isinstance(n, int):
            raise ValueError(f"n_threads must be 1..{lib.GGML_MAX_N_THREADS}, not {n!r}")
        self.n_threads = n
        return True

    def _apply_n_threads(self) -> None:
        """Give ggml min(n_threads, the attached pool's threads): ggml built with OpenMP (as
        pyggml's default build) starts n_threads threads that each take a worker of the pool,
        past its end when the pool is smaller (a crash); without OpenMP ggml clamps the same
        way."""
        n = self._n_threads
        pool = self._threadpool
        if pool is not None and pool.n_threads < n:
            n = pool.n_threads
        with calling():  # a call: no close meanwhile
            lib.ggml_backend_cpu_set_n_threads(self.ptr, n)

    def set_threadpool(self, pool: Threadpool | None) -> None:
        """``ggml_backend_cpu_set_threadpool`` (None: ggml's own disposable threads). The
        backend keeps the pool alive; closing the pool detaches it first. A pool of fewer
        threads than :attr:`n_threads` computes with its own number of threads."""
        with calling():
            lib.ggml_backend_cpu_set_threadpool(self.ptr, pool.ptr if pool else ffi.NULL)
        old = self._threadpool
        if old is not None:
            old._users.discard(self)
        self._threadpool = pool
        if pool is not None:
            pool._users.add(self)
        self._apply_n_threads()

    _has_kernel_table = True

    def _supports_raw(self, p: Any) -> bool:
        return bool(lib.ggml_backend_supports_op(self._ptr, p)) and _cpu_kernel_supports_raw(p)

    def _kernel_ok(self, p: Any) -> bool:
        return _cpu_kernel_supports_raw(p)

    def _why_not(self, p: Any) -> str:
        if lib.ggml_backend_supports_op(self._ptr, p):
            return _layout_hint(p)
        return super()._why_not(p)

    def _restart_abort_clock(self) -> None:
        """Before a compute (this backend's or a scheduler's): with a user ``abort_callback``,
        its first node asks Python, whenever the throttle last did."""
        if self.abort_callback is not None:
            self._abort_throttle.last_us = 0

    def _prepare(self, graph: "Graph", indices: bool = True) -> Any:
        if self.abort_callback is not None:  # _restart_abort_clock inlined (a compute's hot path)
            self._abort_throttle.last_us = 0
        return Backend._prepare(self, graph, indices)

    def _check_graph(self, graph: "Graph", n_nodes: int) -> Any:
        state = super()._check_graph(graph, n_nodes)
        self._trial_compute(graph, n_nodes)
        return state

    def _trial_compute(self, graph: "Graph", n_nodes: int) -> None:
        """Graphs with nodes made by ``Context.op`` (ops pyggml has no checks for) are computed
        once in a forked copy of the process first, with one thread: ggml aborting there raises
        ValueError here instead. Once per graph version: a check made again because the graph
        (or another) was placed anew does not fork again."""
        done = run_of(graph).trialed
        mark = (graph.version, n_nodes)   # (the trial runs on a CPU backend of its own)
        if mark in done:
            return
        trial_ops = graph_trial_ops(graph)
        if not trial_ops or not any(p.op in trial_ops for p in graph.raw_nodes()):
            return
        g = graph.ptr

        def run() -> None:
            be = lib.ggml_backend_cpu_init()
            # one thread: the OpenMP runtime of the parent does not survive fork()
            lib.ggml_backend_cpu_set_n_threads(be, 1)
            lib.ggml_backend_graph_compute(be, g)

        failure = _trial.trial(run, timeout=120)
        if failure is not None:
            raise ValueError(f"computing this graph would abort the process: {failure}")
        done.append(mark)

    def set_use_ref(self, use_ref: bool) -> None:
        """``ggml_backend_cpu_set_use_ref``: use the slow reference kernels (for testing)."""
        with calling():
            lib.ggml_backend_cpu_set_use_ref(self.ptr, use_ref)


def graph_trial_ops(graph: "Graph") -> set[int]:
    """The ops of nodes that ``Context.op`` or ``Graph.build_backward`` made (without checks of
    their own) in the contexts ``graph``'s tensors come from (:meth:`Graph.contexts`): a graph
    holding a node of one of them gets a forked trial compute before its first CPU compute."""
    trial_ops: set[int] = set()
    for ctx, _ in graph.contexts():
        trial_ops |= getattr(ctx, "_trial_ops", set())
    return trial_ops


def cpu_buffer_type() -> BufferType:
    """The CPU buffer type (``ggml_backend_cpu_buffer_type``): plain host memory."""
    return BufferType(lib.ggml_backend_cpu_buffer_type())


def graph_compute(graph: "Graph", n_threads: int | None = None) -> None:
    """Compute ``graph`` on a new CPU backend of ``n_threads`` threads (default 4), closed
    after: :meth:`CPUBackend.graph_compute` says what is checked and raised."""
    with CPUBackend(n_threads=n_threads) as cpu:
        cpu.graph_compute(graph)


def aligned_zeros(shape: int | tuple[int, ...], dtype: DTypeLike = np.float32, align: int = 64) -> np.ndarray:
    """A zero-filled C-contiguous NumPy array whose data starts at a multiple of ``align`` bytes
    (NumPy itself guarantees only 16), e.g. for :func:`cpu_buffer_from_array`."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.zeros(n + align, dtype=np.uint8)
    start = -raw.__array_interface__["data"][0] % align
    return raw[start:start + n].view(dt).reshape(shape)


def cpu_buffer_from_array(array: np.ndarray) -> Buffer:
    """A CPU buffer over ``array``'s memory without a copy (``ggml_backend_cpu_buffer_from_ptr``).

    ``array`` must be C-contiguous, writable and aligned to 32 bytes (ggml's TENSOR_ALIGNMENT,
    asserted by ggml); the buffer keeps it alive. Raises ValueError otherwise.
    """
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("the array must be writable and C-contiguous")
    addr = array.__array_interface__["data"][0]
    if addr % 32:
        raise ValueError("the array's memory must be 32-byte aligned (ggml asserts it): see aligned_zeros")
    with calling(), buffer.lifecycle:  # the gate first, as every call
        ptr = lib.ggml_backend_cpu_buffer_from_ptr(ffi.from_buffer(array), array.nbytes)
        return Buffer(ptr, owned=True, keep=array)
