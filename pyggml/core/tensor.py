"""ggml tensors (``struct ggml_tensor``) as Python objects, and their NumPy interop.

**Shapes.** ggml's ``ne[0]`` is the fastest-varying dimension, so a NumPy shape is ``ne``
reversed: NumPy ``(rows, cols)`` is ggml ``ne = [cols, rows, 1, 1]``. :attr:`Tensor.ne` and
:attr:`Tensor.nb` are always the four ggml values; :attr:`Tensor.shape` is the NumPy order with
ggml's trailing 1s dropped (``ggml_n_dims``), so it has 1 to 4 entries.

**Lifetime.** A :class:`Tensor` is borrowed from the :class:`~pyggml.core.context.Context` whose
memory holds its struct, and keeps that context alive. It is valid while the context is open and
has not been ``reset()`` since the tensor was made (the context's *generation*); after that every
use raises :class:`~pyggml.errors.ClosedError`. Its data lives in the context (an allocating
context) or in a backend buffer; reading or writing it checks that the buffer is alive
(:mod:`pyggml.memory.buffer`) and, for buffers a graph allocator or scheduler manages, that the memory
still belongs to this tensor's graph and, for a node, that the graph was computed since it was
placed.

A tensor's ``ne`` and type never change, so they are read once and kept in Python: reading them
costs what a Python attribute costs.
"""
from __future__ import annotations

import bisect
import weakref
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar

import numpy as np

from .. import _cobject, dlpack, types
from ..memory import buffer
from ..raw import threads
from ..enums import GGMLType, Op, TensorFlag
from ..errors import ClosedError
from ..raw import ffi, lib, requires
from ..raw.boundary import call, calling

_BF16 = GGMLType.BF16

__all__ = ["Tensor", "Arena", "op_name", "can_repeat", "EMPTY_OPS", "BorrowScope", "context_of",
           "register_arena", "decode_op_params", "tensor_arg", "GGML_INTERNAL", "name_bytes",
           "lookup_name_bytes", "name_str"]

#: ops that compute nothing (ggml_op_is_empty): views and leafs
EMPTY_OPS = frozenset({Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})

_TYPE_OF = {int(m): m for m in GGMLType}
_OP_OF = {int(m): m for m in Op}

#: counts the set_input / set_output calls: a graph's cached flags (Graph.io_flags) are
#: recomputed when it changed
_io_epoch = 0


def _io_flag_set() -> None:
    global _io_epoch
    _io_epoch += 1


def name_bytes(name: object) -> bytes:
    """Tensor name ``name`` as ggml's C string: UTF-8 with ``surrogateescape``, so that a name
    read from C that is not valid UTF-8 (a GGUF file's, ggml's truncation of a long view name)
    comes back to the same bytes (as :func:`os.fsencode` does for file names). TypeError unless a
    str; ValueError for a NUL or more than ``GGML_MAX_NAME - 1`` (63) bytes."""
    if not isinstance(name, str):
        raise TypeError(f"a tensor name is a str, not {type(name).__name__}")
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) >= lib.GGML_MAX_NAME or b"\0" in raw:
        raise ValueError(f"tensor name is {len(raw)} bytes, ggml keeps at most "
                         f"{lib.GGML_MAX_NAME - 1} (no NUL)")
    return raw


def lookup_name_bytes(name: object) -> bytes | None:
    """:func:`name_bytes` for a lookup by name: None where no tensor can have that name."""
    try:
        return name_bytes(name)
    except ValueError:
        return None


def name_str(p: Any) -> str:
    """The name of tensor struct ``p`` (``ggml_get_name``), decoded as :func:`name_bytes`
    encodes."""
    return ffi.string(p.name).decode("utf-8", "surrogateescape")


def op_name(op: int) -> str:
    """``ggml_op_name``: ``"ADD"``, ``"MUL_MAT"``...; raises ValueError for an unknown op."""
    if not 0 <= op < lib.GGML_OP_COUNT:
        raise ValueError(f"unknown ggml op {op}")
    return ffi.string(lib.ggml_op_name(op)).decode()


def can_repeat(small: Sequence[int], big: Sequence[int]) -> bool:
    """``ggml_can_repeat`` on two ``ne``: ``small`` tiles ``big`` (each ``big[i]`` a multiple of
    ``small[i]``; an empty ``small`` only tiles an empty ``big``)."""
    if 0 in small:
        return 0 in big
    return big[0] % small[0] == 0 and big[1] % small[1] == 0 and big[2] % small[2] == 0 and big[3] % small[3] == 0


def _layouts() -> dict[int, list[tuple[str, str]]]:
    """op -> [(name, "i" int32 | "f" float32)] per op_params slot, from the op constructors of
    ggml.c (ggml_set_op_params calls)."""
    f, i = "f", "i"
    L = {
        "NORM": [("eps", f)], "RMS_NORM": [("eps", f)], "L2_NORM": [("eps", f)],
        "GROUP_NORM": [("n_groups", i), ("eps", f)],
        "SOFT_MAX": [("scale", f), ("max_bias", f)], "SOFT_MAX_BACK": [("scale", f), ("max_bias", f)],
        "SCALE": [("s", f), ("b", f)], "LEAKY_RELU": [("negative_slope", f)],
        "CLAMP": [("min", f), ("max", f)],
        "ROPE": [("n_past", i), ("n_dims", i), ("mode", i), ("n_ctx", i), ("n_ctx_orig", i),
                 ("freq_base", f), ("freq_scale", f), ("ext_factor", f), ("attn_factor", f),
                 ("beta_fast", f), ("beta_slow", f)],
        "CONCAT": [("dim", i)], "PERMUTE": [("axis0", i), ("axis1", i), ("axis2", i), ("axis3", i)],
        "ARGSORT": [("order", i)], "TOP_K": [("k", i)], "DIAG_MASK_INF": [("n_past", i)],
        "DIAG_MASK_ZERO": [("n_past", i)],
        "PAD": [("lp0", i), ("rp0", i), ("lp1", i), ("rp1", i), ("lp2", i), ("rp2", i),
                ("lp3", i), ("rp3", i), ("circular", i)],
        "IM2COL": [("s0", i), ("s1", i), ("p0", i), ("p1", i), ("d0", i), ("d1", i), ("is_2D", i)],
        "POOL_1D": [("op", i), ("k0", i), ("s0", i), ("p0", i)],
        "POOL_2D": [("op", i), ("k0", i), ("k1", i), ("s0", i), ("s1", i), ("p0", f), ("p1", f)],
        "FLASH_ATTN_EXT": [("scale", f), ("max_bias", f), ("logit_softcap", f), ("prec", i)],
        "ACC": [("nb1", i), ("nb2", i), ("nb3", i), ("offset", i), ("inplace", i)],
        "SET": [("nb1", i), ("nb2", i), ("nb3", i), ("offset", i), ("inplace", i)],
        "ARANGE": [("start", f), ("stop", f), ("step", f)],
        "TIMESTEP_EMBEDDING": [("dim", i), ("max_period", i)],
        "UPSCALE": [("mode", i)], "MUL_MAT": [("prec", i)],
        "VIEW": [("offset_lo", i), ("offset_hi", i)],
    }
    return {int(Op[k]): v for k, v in L.items() if k in Op.__members__}


_PARAM_LAYOUTS = _layouts()


def decode_op_params(p: Any) -> dict[str, Any]:
    """The op parameters of tensor struct ``p`` decoded for its op (see :attr:`Tensor.params`)."""
    raw = np.frombuffer(ffi.buffer(p.op_params), dtype=np.int32).copy()
    if p.op == lib.GGML_OP_UNARY:
        return {"unary_op": ffi.string(lib.ggml_unary_op_name(lib.ggml_get_unary_op(p))).decode()}
    if p.op == lib.GGML_OP_GLU:
        return {"glu_op": ffi.string(lib.ggml_glu_op_name(lib.ggml_get_glu_op(p))).decode(),
                "swapped": bool(raw[1])}
    layout = _PARAM_LAYOUTS.get(p.op)
    if layout is None:
        return {"raw": raw}
    out: dict[str, Any] = {}
    for k, (name, kind) in enumerate(layout):
        out[name] = float(raw[k:k + 1].view(np.float32)[0]) if kind == "f" else int(raw[k])
    if p.op == lib.GGML_OP_VIEW:
        out = {"offset": int(raw[:2].view(np.int64)[0])}
    if p.op == lib.GGML_OP_ROPE:
        out["sections"] = raw[11:15].tolist()
        out["n_offs"] = int(raw[15])  # ggml_rope_set_offset (ggml >= 0.25; 0 before)
    return out


# --------------------------------------------------------------------------------------------
# which context holds a tensor struct

class Arena(Protocol):
    """What a tensor is borrowed from, as this module sees it: a
    :class:`~pyggml.core.context.Context` (the context module is built on tensors, so they name it
    through this) or a :class:`BorrowScope`. ``_gen`` changes when it is reset or closed."""

    _gen: int

    @property
    def closed(self) -> bool: ...


class _Ops(Protocol):
    """The op constructors the operators call (:class:`pyggml.core.ops.Ops`, which a context has)."""

    def add(self, a: "Tensor", b: "Tensor") -> "Tensor": ...
    def sub(self, a: "Tensor", b: "Tensor") -> "Tensor": ...
    def mul(self, a: "Tensor", b: "Tensor") -> "Tensor": ...
    def div(self, a: "Tensor", b: "Tensor") -> "Tensor": ...
    def scale(self, a: "Tensor", s: float) -> "Tensor": ...
    def neg(self, a: "Tensor") -> "Tensor": ...
    def transpose(self, a: "Tensor") -> "Tensor": ...


class BorrowScope:
    """What tensors are borrowed from when no open pyggml context holds their struct: tensors
    ggml hands to a Python callback (valid until the callback returns, when the scope closes)
    or ggml's own internal tensors. Same protocol as a context: ``_gen`` and ``closed``."""

    __slots__ = ("_gen", "name")
    _lock = None  # nothing to take turns on (pyggml.raw.threads skips it)

    def __init__(self, name: str):
        self._gen = 0
        self.name = name

    @property
    def closed(self) -> bool:
        return self._gen < 0

    def close(self) -> None:
        self._gen = -1


#: (arena start, arena end, weak reference to the context) of every context object alive,
#: sorted by start (a closed context's arena stays mapped as long as its Python object lives)
_ARENAS: list[tuple[int, int, "weakref.ref[Any]"]] = []


def register_arena(ctx: Any, start: int, size: int) -> None:
    """Record that tensor structs in ``[start, start + size)`` belong to ``ctx``."""
    _ARENAS[:] = [a for a in _ARENAS if a[2]() is not None]  # drop collected contexts
    bisect.insort(_ARENAS, (start, start + size, weakref.ref(ctx)), key=lambda a: a[0])


def _forget_buffer(buf: Any, freed: Any) -> None:
    """:data:`pyggml.memory.buffer.forgetters`: the tensors of every open context in ``buf`` point at
    ``freed`` instead. Inside the gate (no context freed or reset meanwhile), without the
    contexts' locks: it runs inside placements, which hold some of them (waiting for the others
    could deadlock), so it may run beside an op constructor that has linked a new tensor into
    its context's list and not yet filled its struct (a known, narrow race: such a struct could
    be marked as in freed memory)."""
    with threads.using():
        for _, _, ref in list(_ARENAS):
            ctx = ref()
            if ctx is not None and ctx._ptr is not None:
                lib.pyggml_ctx_forget_buffer(ctx._ptr, buf, freed)


buffer.forgetters.append(_forget_buffer)


def context_of(p: Any) -> Any:
    """The context (open or closed) whose arena holds tensor struct ``p``, or None."""
    addr = int(ffi.cast("uintptr_t", p))
    i = bisect.bisect_right(_ARENAS, addr, key=lambda a: a[0]) - 1
    if i >= 0 and _ARENAS[i][0] <= addr < _ARENAS[i][1]:
        return _ARENAS[i][2]()
    return None


#: ggml's own tensors (a scheduler's input copies, a graph copy's tensors): borrowed from here,
#: they are described but their data is never read through pyggml's checks
GGML_INTERNAL = BorrowScope("ggml")


def tensor_arg(x: Any, what: str) -> "Tensor":
    """``x`` if it is an open :class:`Tensor`; TypeError for anything else, ClosedError if its
    context is closed or reset. The check every op constructor makes of its tensor arguments."""
    if x.__class__ is not Tensor and not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a pyggml Tensor, not {type(x).__name__}")
    if x._owner._gen != x._gen:
        raise ClosedError(f"{what}: {_closed_message(x)}")
    return x


_R = TypeVar("_R")


def context_lock(t: "Tensor") -> Any:
    """The lock of ``t``'s context (none for tensors ggml lends): held around a check of
    ``t``'s struct and the C call that relies on it, so that no reset puts another tensor's
    struct there in between (:mod:`pyggml.raw.threads`)."""
    return threads.using(t._owner, gate=False)


def c_read(t: "Tensor", fn: Callable[[Any], _R]) -> _R:
    """``fn(t's struct)`` (a C getter such as ``ggml_nbytes``) under the lock of ``t``'s
    context, after checking ``t`` open there: ClosedError if its context was reset or closed
    (another thread may have made other objects where ``t``'s struct was, and ggml would read
    them as a tensor). Checks read tensors' structs through this."""
    owner = t._owner
    lock = owner._lock
    if lock is None:  # a tensor ggml lends: valid while it is lent (BorrowScope)
        return fn(t._ptr)
    if lock.acquire(False):  # else held elsewhere, or lent to this callback
        try:
            if owner._gen != t._gen:
                raise ClosedError(_closed_message(t))
            return fn(t._ptr)
        finally:
            lock.release()
    with threads.using(owner, gate=False):
        if owner._gen != t._gen:
            raise ClosedError(_closed_message(t))
        return fn(t._ptr)


def is_contiguous(t: "Tensor") -> bool:
    """``ggml_is_contiguous`` of open tensor ``t``, cached on the object (op constructors mark
    the results they know to be contiguous, saving the C call)."""
    c = t._contig
    if c is None:
        c = t._contig = bool(c_read(t, lib.ggml_is_contiguous))
    return c


def row_strides(t: "Tensor") -> tuple[int, ...]:
    """``nb`` of open tensor ``t`` (its 4 strides in bytes, ggml order), read from C once and
    cached on the object."""
    nb = t._nb
    if nb is None:
        nb = t._nb = c_read(t, lambda p: tuple(p.nb))
    return nb


def _closed_message(t: "Tensor") -> str:
    owner = t._owner
    if isinstance(owner, BorrowScope):
        return "this tensor was lent to a callback that has returned"
    if owner.closed:
        return "the context holding this tensor is closed"
    return "the context holding this tensor was reset since it was made"


# --------------------------------------------------------------------------------------------

class Tensor(_cobject.CBorrowed):
    """A ggml tensor, borrowed from its context (see the module docstring).

    Made by a :class:`~pyggml.core.context.Context` (``new_tensor``, op constructors), by a graph
    (``nodes``, ``leafs``) or given to a Python callback. ``Tensor(ptr, ctx)`` wraps a raw
    ``struct ggml_tensor *`` of ``ctx``.
    """

    __slots__ = ("_ptr", "_owner", "_gen", "_ne", "_type", "_contig", "_nb")
    _kind = "tensor"
    _owner: Any  # its context (an Arena); the operators call its op constructors
    _ne: tuple[int, ...]  # always 4 sizes
    _contig: bool | None  # ggml_is_contiguous, once known (ne and nb never change)
    _nb: tuple[int, ...] | None  # nb (the 4 strides in bytes), once read (row_strides)

    def __init__(self, ptr: Any, ctx: Arena):
        if ptr == ffi.NULL:
            raise ValueError("NULL is not a tensor")
        self._ptr = ptr
        self._owner = ctx
        self._gen = ctx._gen
        self._ne = tuple(ptr.ne)
        self._type = _TYPE_OF[ptr.type]
        self._contig = None
        self._nb = None

    @classmethod
    def _of(cls, ptr: Any, default: Any = GGML_INTERNAL) -> "Tensor":
        """Wrap ``ptr`` with the context that holds it (``default`` when no open context does)."""
        return cls(ptr, context_of(ptr) or default)

    # ------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        """True once the context is closed or reset (or, for a tensor lent to a callback, once
        the callback has returned)."""
        return bool(self._owner._gen != self._gen)

    @property
    def ptr(self) -> Any:
        """The ``struct ggml_tensor *``. Raises ClosedError once :attr:`closed`."""
        if self._owner._gen != self._gen:
            raise ClosedError(_closed_message(self))
        return self._ptr

    @property
    def owned(self) -> bool:
        return False

    def close(self) -> None:
        """Tensors are freed with their context: this does nothing."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and self._ptr == other._ptr

    def __hash__(self) -> int:
        return hash(self._ptr)

    def _ops(self) -> "_Ops":
        """The context whose op constructors the operators call (``Context.of``)."""
        owner: _Ops = self._owner
        if isinstance(owner, BorrowScope):
            raise ValueError(f"this tensor belongs to no pyggml context ({owner.name})")
        return owner

    # ------------------------------------------------------------------ description
    @property
    def name(self) -> str:
        """``ggml_get_name`` / ``ggml_set_name``: at most ``GGML_MAX_NAME - 1`` = 63 bytes of
        UTF-8, no NUL (else ValueError; TypeError unless a str). Bytes that are not UTF-8 (a
        GGUF file's name) read as lone surrogates (``surrogateescape``) and set back unchanged."""
        return name_str(self.ptr)

    @name.setter
    def name(self, value: str) -> None:
        raw = name_bytes(value)
        with context_lock(self):  # its context is not reset meanwhile
            lib.ggml_set_name(self.ptr, raw)

    def _label(self) -> str:
        """How messages name the tensor: its name, or its op and shape when it has none."""
        return buffer.label(self._ptr)

    @property
    def type(self) -> GGMLType:
        """The ggml type."""
        return self._type

    @property
    def type_name(self) -> str:
        """ggml's name of the type (``"f32"``, ``"q4_K"``)."""
        return ffi.string(lib.ggml_type_name(self._type)).decode()

    @property
    def ne(self) -> tuple[int, int, int, int]:
        """Number of elements per dimension, ggml order (``ne[0]`` fastest)."""
        return self._ne  # type: ignore[return-value]

    @property
    def nb(self) -> tuple[int, int, int, int]:
        """Stride in bytes per dimension, ggml order (quantized: ``nb[0]`` is the block size in bytes)."""
        return tuple(self.ptr.nb)

    @property
    def n_dims(self) -> int:
        """``ggml_n_dims``: 1 + index of the last dimension > 1 (1 for scalars)."""
        ne = self._ne
        return 4 if ne[3] != 1 else 3 if ne[2] != 1 else 2 if ne[1] != 1 else 1

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order: ``ne[:n_dims]`` reversed."""
        return self._ne[:self.n_dims][::-1]

    @property
    def nelements(self) -> int:
        """``ggml_nelements``."""
        ne = self._ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def nbytes(self) -> int:
        """``ggml_nbytes``: bytes spanned by the data (strides included)."""
        self.ptr  # ClosedError once closed
        return int(c_read(self, lib.ggml_nbytes))

    @property
    def op(self) -> Op:
        """The op that computes this tensor (``Op.NONE`` for leafs)."""
        return _OP_OF[self.ptr.op]

    @property
    def op_name(self) -> str:
        """``ggml_op_name`` of :attr:`op`."""
        return op_name(self.ptr.op)

    @property
    def op_params(self) -> np.ndarray:
        """A copy of the op parameters as int32 (float parameters are bit-cast: ``.view(np.float32)``)."""
        return np.frombuffer(ffi.buffer(self.ptr.op_params), dtype=np.int32).copy()  # type: ignore[no-any-return]

    @property
    def params(self) -> dict[str, Any]:
        """``op_params`` decoded for this node's op (names as in ggml.c), e.g. ROPE ->
        ``{"n_dims", "mode", "n_ctx_orig", "freq_base", "freq_scale", "ext_factor",
        "attn_factor", "beta_fast", "beta_slow"}``; SOFT_MAX -> ``{"scale", "max_bias"}``;
        UNARY -> ``{"unary_op": "GELU"}``. Ops without a known layout give
        ``{"raw": int32 array}``."""
        return decode_op_params(self.ptr)

    def _wrap_other(self, p: Any) -> "Tensor":
        """A tensor this one points at (a source, the view source): wrapped with its own context
        if an open one holds it, else borrowed like this one."""
        owner = self._owner
        return Tensor(p, context_of(p) or (owner if isinstance(owner, BorrowScope) else GGML_INTERNAL))

    def _others(self, read: Callable[[Any], Any]) -> list["Tensor"]:
        """The structs ``read(struct)`` lists (sources, view source; the first NULL ends them)
        wrapped, under this tensor's
        context's lock, after checking it open and no context its context reads reset since
        (ClosedError): a source in a context reset since would be wrapped with that context's
        generation *now*, calling whatever ggml made there since an open tensor. (A reset of a
        context takes every context's lock: none can happen meanwhile.)"""
        owner = self._owner
        with context_lock(self):
            p = self.ptr
            if not isinstance(owner, BorrowScope) and owner._stale:
                owner._check_deps()
            out = []
            for s in read(p):
                if s == ffi.NULL:
                    break
                out.append(self._wrap_other(s))
            return out

    @property
    def src(self) -> list["Tensor"]:
        """The source tensors of the op, in order (NULL entries end the list). ClosedError if
        this tensor's context, or one its nodes read, was reset or closed since."""
        return self._others(lambda p: p.src)

    @property
    def view_src(self) -> "Tensor | None":
        """The tensor whose data this view shares, or None. ClosedError as :attr:`src`."""
        found = self._others(lambda p: [p.view_src])
        return found[0] if found else None

    @property
    def flags(self) -> TensorFlag:
        """:class:`~pyggml.enums.TensorFlag` bits (input, output, param, loss, compute)."""
        return TensorFlag(self.ptr.flags)

    def is_contiguous(self) -> bool:
        """``ggml_is_contiguous`` (asked once: a tensor's ``ne`` and ``nb`` never change)."""
        self.ptr  # ClosedError once closed
        return is_contiguous(self)

    def is_transposed(self) -> bool:
        """``ggml_is_transposed``."""
        self.ptr  # ClosedError once closed
        return bool(c_read(self, lib.ggml_is_transposed))

    def is_empty_op(self) -> bool:
        """True for ops that compute nothing (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE)."""
        return self.ptr.op in EMPTY_OPS

    def set_input(self) -> "Tensor":
        """``ggml_set_input``: allocated first, never overwritten by the graph allocator.
        Raises ValueError for a node (ggml asserts a leaf: an input is set, not computed)."""
        with context_lock(self):  # its context is not reset meanwhile (another struct there)
            p = self.ptr
            if p.op != lib.GGML_OP_NONE:
                raise ValueError(f"only a leaf can be an input, not a {op_name(p.op)} node "
                                 "(set the data of the tensors it is computed from instead)")
            lib.ggml_set_input(p)
        _io_flag_set()
        return self

    def set_output(self) -> "Tensor":
        """``ggml_set_output``: the graph allocator keeps it until the end of the graph. Like
        ggml's other flags it counts when a graph is placed: a graph placed before keeps its
        places until it is placed again (computing it on a backend may still overwrite this
        tensor with a node that was given its memory, e.g. an in-place unary op)."""
        with context_lock(self):
            lib.ggml_set_output(self.ptr)
        _io_flag_set()
        return self

    def set_param(self) -> "Tensor":
        """``ggml_set_param``: a trainable parameter (gets a gradient in backward graphs).
        Raises ValueError for a node (ggml asserts a leaf)."""
        with context_lock(self):
            p = self.ptr
            if p.op != lib.GGML_OP_NONE:
                raise ValueError(f"only a leaf can be a parameter, not a {op_name(p.op)} node")
            lib.ggml_set_param(p)
        return self

    def set_loss(self) -> "Tensor":
        """``ggml_set_loss``: the scalar F32 loss of a backward graph. Raises ValueError otherwise."""
        if self.nelements != 1 or self._type != GGMLType.F32:
            raise ValueError("a loss must be a scalar F32 tensor")
        with context_lock(self):
            lib.ggml_set_loss(self.ptr)
        return self

    # ------------------------------------------------------------------ node settings (ggml >= 0.25)
    def set_rope_offset(self, n_offs: int) -> "Tensor":
        """``ggml_rope_set_offset`` (ggml >= 0.25): this ROPE / ROPE_BACK node rotates dims
        ``[n_offs, n_offs + n_dims)`` of ``ne[0]`` and copies the others. Raises ValueError for
        another op, a vision rope, or an offset that is odd, negative or leaves the row (ggml's
        CPU kernel asserts on those)."""
        fn = requires("ggml_rope_set_offset")
        p = self.ptr
        if p.op not in (Op.ROPE, Op.ROPE_BACK):
            raise ValueError(f"set_rope_offset needs a ROPE node, not {op_name(p.op)}")
        params = decode_op_params(p)
        n_dims, mode = params["n_dims"], params["mode"]
        if mode == lib.GGML_ROPE_TYPE_VISION:
            raise ValueError("a vision rope takes no offset")
        if n_offs < 0 or n_offs % 2 or n_offs + n_dims > self._ne[0]:
            raise ValueError(f"rope offset {n_offs}: must be even, >= 0, and n_offs + n_dims ({n_dims}) "
                             f"<= ne[0] ({self._ne[0]})")
        fn(p, int(n_offs))
        return self

    def set_flash_attn_n_kv_max(self, n_kv_max: int) -> "Tensor":
        """``ggml_flash_attn_ext_set_n_kv_max`` (ggml >= 0.25): this FLASH_ATTN_EXT node treats
        the finite entries of its mask as a sparse K/V set of at most ``n_kv_max`` per row (0:
        off). Raises ValueError for another op or a negative count."""
        fn = requires("ggml_flash_attn_ext_set_n_kv_max")
        p = self.ptr
        if p.op != Op.FLASH_ATTN_EXT or n_kv_max < 0:
            raise ValueError("set_flash_attn_n_kv_max needs a FLASH_ATTN_EXT node and a count >= 0")
        fn(p, int(n_kv_max))
        return self

    def set_prec(self, acc: int | None = None, src: dict[int, int] | None = None) -> "Tensor":
        """``ggml_prec_set_acc`` / ``ggml_prec_set_src`` (ggml >= 0.25): the least precision this
        node's kernels may accumulate in (``acc``) or convert source ``i`` to (``src={i: prec}``),
        as :class:`~pyggml.enums.Prec` values. Raises ValueError where ggml refuses (other ops:
        MUL_MAT takes both, FLASH_ATTN_EXT ``acc`` only, and ``src`` only for source 1)."""
        p = self.ptr
        if acc is not None and not requires("ggml_prec_set_acc")(p, int(acc)):
            raise ValueError(f"ggml takes no accumulator precision for {op_name(p.op)}")
        for i, prec in (src or {}).items():
            if not 0 <= i < lib.GGML_MAX_SRC:
                raise ValueError(f"source index {i} outside 0..{lib.GGML_MAX_SRC - 1}")
            if not requires("ggml_prec_set_src")(p, int(prec), int(i)):
                raise ValueError(f"ggml takes no precision for source {i} of {op_name(p.op)}")
        return self

    def __repr__(self) -> str:
        if self.closed:
            return "<Tensor (closed)>"
        name = f" {self.name!r}" if self.name else ""
        return f"<Tensor{name} {self.type_name} ne={list(self._ne)} op={self.op_name}>"

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a ggml Tensor is not iterable: use .numpy()")

    # ------------------------------------------------------------------ data
    @property
    def buffer_ptr(self) -> Any:
        """The ``ggml_backend_buffer_t`` holding the data (``view_src``'s for views), or NULL;
        once that buffer is freed, one of :data:`pyggml.memory.buffer.FREED` (stand-ins). Compare it,
        do not dereference it."""
        p = self.ptr
        return p.view_src.buffer if p.view_src != ffi.NULL else p.buffer

    def _memory(self) -> tuple[Any, "buffer.LiveBuffer | None", bool]:
        """(struct, live record of its buffer, whether the data is in a backend buffer), after
        checking that the data may be used now (see the module docstring). Tensors lent to a
        callback are trusted: ggml guarantees their memory during the call."""
        p = self.ptr
        v = p.view_src
        owner = self._owner
        if v != ffi.NULL and getattr(owner, "_stale", False) and not isinstance(owner, BorrowScope):
            # a view of a tensor of another context, closed or reset since: its struct and data
            # are gone (the arena stays mapped while the context object lives)
            src_ctx = context_of(v)
            if src_ctx is not None and src_ctx is not owner:
                gen = owner._recorded_gen(src_ctx)
                if gen is not None and gen != src_ctx._gen:
                    raise ClosedError(f"tensor {self._label()} is a view of a tensor whose context was "
                                      "closed or reset since")
        if p.data == ffi.NULL:
            if v != ffi.NULL and v.data != ffi.NULL and not isinstance(owner, BorrowScope):
                # a view no allocator has inited, of a source with data: if the source's memory
                # is gone (ClosedError), that is what the caller must learn first
                src_ctx = context_of(v)
                if src_ctx is not None and not src_ctx.closed:
                    Tensor(v, src_ctx)._memory()
            if v == ffi.NULL and 0 in self._ne and getattr(owner, "no_alloc", True) is False:
                raise ValueError(f"tensor {self._label()} has 0 elements: an allocating context "
                                 "gives it no memory (data NULL), so it cannot be read, written "
                                 "or computed (in a backend buffer it can)")
            raise ValueError(f"tensor {self._label()} has no data yet: allocate it in a buffer "
                             "(Context.alloc_tensors, a graph allocator or a scheduler)")
        if (v.buffer if v != ffi.NULL else p.buffer) == ffi.NULL:
            return p, None, False
        if isinstance(owner, BorrowScope):
            return p, None, True
        rec = buffer.check_tensor_memory(p, self._label)
        check = getattr(rec.owner, "check_placed", None) if rec is not None else None
        if check is not None:
            check(self)
        return p, rec, True

    def _is_host(self) -> bool:
        buf = self.buffer_ptr
        if buf == ffi.NULL:
            return True
        with calling():  # asks the buffer type; a meta buffer's data are not addresses
            return bool(lib.ggml_backend_buffer_is_host(buf)) and not lib.ggml_backend_buffer_is_meta(buf)

    def numpy(self, copy: bool = True, *, out: np.ndarray | None = None) -> np.ndarray:
        """The data as a NumPy array of shape :attr:`shape` (NumPy order).

        Plain types keep their dtype (F32 float32, F16 float16, F64, I8...I64); BF16 and quantized
        types are dequantized to float32 with ggml's own ``to_float``. ``copy=False`` returns a
        zero-copy, writable view of host memory instead (plain types only) that keeps the memory
        alive; writes through it are seen by ggml. ``out``: a C-contiguous, writable array of the
        tensor's plain dtype and :attr:`nbytes` bytes (any shape) to copy into, returned
        (reshaped to :attr:`shape`): a loop that reads an output at every step reuses its
        memory (a new array of some hundred kilobytes costs page faults on every write).

        Raises ValueError if the tensor has no data, is not contiguous (``copy=True``), or
        (``copy=False``) is not in host memory, not a plain type, or in memory a graph allocator
        or scheduler reuses; ClosedError if its context or buffer is closed, or its memory was
        given to another graph; ValueError if it is a node not computed since it was placed. Wraps
        ``ggml_backend_tensor_get`` for tensors in backend buffers (raising what a Python
        buffer's ``get_tensor`` raised).
        """
        if out is not None:
            if not copy:
                raise ValueError("out= copies: it cannot be given with copy=False")
            dtype = types.numpy_dtype(self._type)
            if (not isinstance(out, np.ndarray) or dtype is None or self._type == GGMLType.BF16
                    or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable
                    or out.nbytes != self.nbytes):
                raise ValueError(f"out must be a writable, C-contiguous {dtype} array of {self.nbytes} "
                                 f"bytes for tensor {self._label()} ({self.type_name})")
        held, memory = self._using_memory()
        with held:
            return self._numpy(copy, memory, out)

    def _using_memory(self) -> tuple[threads.Held, tuple[Any, "buffer.LiveBuffer | None", bool]]:
        """(a held :class:`~pyggml.raw.threads.using` of this tensor's context and of the owner
        of the buffer its data is in (a graph allocator or scheduler that may place anew), what
        :meth:`_memory` found under it): no close, reset or new placement until it is let go.
        The owner is found under the context's lock, and again under both (taken all at once:
        never one while waiting for another)."""
        owner = None
        while True:
            held = threads.using(self._owner, owner).hold()
            try:
                memory = self._memory()
            except BaseException:
                held.release()
                raise
            now = memory[1].owner if memory[1] is not None else None
            if now is owner:
                return held, memory
            held.release()
            owner = now

    def _numpy(self, copy: bool, memory: tuple[Any, "buffer.LiveBuffer | None", bool],
               out: np.ndarray | None = None) -> np.ndarray:
        p, rec, in_buffer = memory
        dtype = types.numpy_dtype(self._type)
        if not copy:
            if dtype is None or self._type == GGMLType.BF16:
                raise ValueError(f"no zero-copy NumPy view of a {self.type_name} tensor")
            if not self._is_host():
                raise ValueError(f"tensor {self._label()} is not in host memory: use copy=True")
            owners = self._lenders(rec, "use copy=True")
            ne, nb, n = self._ne, tuple(p.nb), self.n_dims
            holder = buffer.host_array_owner(int(ffi.cast("uintptr_t", p.data)), ne[:n][::-1],
                                             nb[:n][::-1], dtype, owners)
            for o in owners:
                o._export(holder)
            return np.asarray(holder)
        if not lib.ggml_is_contiguous(p):
            raise ValueError(f"tensor {self._label()} is not contiguous: copy it with Context.cont first")
        raw = np.empty(int(lib.ggml_nbytes(p)), dtype=np.uint8) if out is None else out.reshape(-1).view(np.uint8)
        if in_buffer:
            buffer.check_layout(p, read=True)
            call(lib.ggml_backend_tensor_get, p, ffi.from_buffer(raw), 0, raw.nbytes)
        else:
            ffi.memmove(ffi.from_buffer(raw), p.data, raw.nbytes)
        if dtype is not None and self._type is not _BF16:  # types.to_numpy's plain case, its
            return raw.view(dtype).reshape(self.shape)      # checks known true here
        return types.to_numpy(raw, self._type, self._ne[:self.n_dims])

    def _lenders(self, rec: "buffer.LiveBuffer | None", instead: str) -> list[Any]:
        """What must stay alive while another object uses this tensor's memory: its context and
        the buffer's owner. ValueError for memory a graph allocator or scheduler reuses (it is
        another tensor's on the next graph)."""
        owners: list[Any] = [] if isinstance(self._owner, BorrowScope) else [self._owner]
        if rec is not None:
            if not isinstance(rec.owner, _cobject.CObject) or getattr(rec.owner, "check_placed", None):
                raise ValueError(f"tensor {self._label()} lives in memory a graph allocator or "
                                 f"scheduler reuses: {instead}")
            owners.append(rec.owner)
        return owners

    # ------------------------------------------------------------------ DLPack
    def __dlpack_device__(self) -> tuple[int, int]:
        """(DLDeviceType, device index) of the memory: ``(1, 0)`` (kDLCPU) for host memory,
        ``(2, i)`` (kDLCUDA) for a buffer of ggml's CUDA device ``CUDA<i>``. Raises BufferError
        for other device memory (Vulkan, RPC, a Python backend's), ValueError if the tensor has
        no data."""
        p = self.ptr
        if p.data == ffi.NULL:
            raise ValueError(f"tensor {self._label()} has no data yet")
        if self._is_host():
            return (dlpack.DLDeviceType.CPU, 0)
        buf = self.buffer_ptr
        with calling():
            dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(buf))
            reg = lib.ggml_backend_dev_backend_reg(dev) if dev != ffi.NULL else ffi.NULL
            reg_name = ffi.string(lib.ggml_backend_reg_name(reg)).decode() if reg != ffi.NULL else ""
            dev_name = ffi.string(lib.ggml_backend_dev_name(dev)).decode() if dev != ffi.NULL else "?"
        if reg_name == "CUDA" and dev_name[4:].isdigit():
            return (dlpack.DLDeviceType.CUDA, int(dev_name[4:]))
        raise BufferError(f"tensor {self._label()} is in memory of device {dev_name}, which DLPack "
                          "consumers cannot address: copy it to the host with numpy()")

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of the tensor's memory, no copy (``np.from_dlpack(t)``,
        ``torch.from_dlpack(t)``...): NumPy-order shape (ne reversed), strides from nb, dtype of
        a plain type (F32, F16, BF16, F64, I8..I64). The consumer keeps the context and buffer
        alive until it lets go; writes on either side are seen by the other.

        The data is ready when exported (pyggml computes synchronously; the outputs of
        ``compute_async`` raise until synchronized), so ``stream`` needs no wait and is not used.
        A consumer that passes ``max_version`` >= (1, 0) gets a DLPack 1.0 capsule (writable
        memory), others the DLPack 0.8 one. ``copy=True`` or a ``dl_device`` other than the tensor's raises
        BufferError (pyggml does not copy here: use ``numpy()``). Raises BufferError for a
        quantized tensor or memory no consumer can address; ValueError if the tensor has no data,
        is a node not computed since placed, or lives in memory a graph allocator or scheduler
        reuses; ClosedError as :meth:`numpy`.
        """
        device = self.__dlpack_device__()
        if copy:
            raise BufferError("pyggml exports DLPack without copying: copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != tuple(device):
            raise BufferError(f"the tensor is on DLPack device {device}, not {tuple(dl_device)}")
        p, rec, _ = self._memory()
        owners = self._lenders(rec, "copy it with numpy() first")
        n, size = self.n_dims, lib.ggml_type_size(self._type)
        nb = tuple(p.nb)
        if any(x % size for x in nb[:n]):
            raise BufferError(f"tensor {self._label()}'s strides are not whole elements")
        lent = dlpack.Lent(owners)
        for o in owners:
            o._export(lent)  # closing the context/buffer now frees the memory once lent is gone
        return dlpack.capsule(int(ffi.cast("uintptr_t", p.data)), self._ne[:n][::-1],
                              [x // size for x in nb[:n]][::-1], self._type, device, lent,
                              versioned=max_version is not None and max_version[0] >= 1)

    def set(self, array: Any, *, reshape: bool = False) -> "Tensor":
        """Copy ``array`` into the tensor, converted to its type (quantized types are quantized
        with ggml's routines).

        ``array``'s NumPy shape must be :attr:`shape` (leading 1s aside, which ggml drops as
        trailing 1s of ``ne``); with ``reshape=True`` any array of the same number of elements is
        taken in C order. Raises ValueError on a shape mismatch or a non-contiguous/unallocated
        tensor, TypeError for a dtype that cannot be stored without changing its kind. Wraps
        ``ggml_backend_tensor_set`` for tensors in backend buffers.
        """
        held, memory = self._using_memory()
        with held:
            return self._set(array, reshape, memory)

    def _set(self, array: Any, reshape: bool, memory: tuple[Any, "buffer.LiveBuffer | None", bool]) -> "Tensor":
        p, rec, in_buffer = memory
        if not lib.ggml_is_contiguous(p):
            raise ValueError(f"tensor {self._label()} is not contiguous")
        a = np.asarray(array)
        shape = self.shape
        if reshape:
            if a.size != self.nelements:
                raise ValueError(f"array of {a.size} elements for tensor {self._label()} of shape {shape}")
        else:
            self._check_shape(a.shape)
        raw = types.from_numpy_bytes(a.reshape(shape), self._type)
        if in_buffer:
            buffer.check_layout(p, read=False)
            call(lib.ggml_backend_tensor_set, p, ffi.from_buffer(raw), 0, raw.nbytes)
        else:
            ffi.memmove(p.data, ffi.from_buffer(raw), raw.nbytes)
        return self

    def set_bytes(self, raw: Any) -> "Tensor":
        """Copy ``raw`` (bytes as ggml stores this tensor's type: a buffer of exactly
        :attr:`nbytes` bytes, e.g. a model file's tensor data) into the tensor, unconverted.
        Raises ValueError for another byte count or a non-contiguous/unallocated tensor. Wraps
        ``ggml_backend_tensor_set`` for tensors in backend buffers."""
        data = np.ascontiguousarray(raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, np.uint8))
        data = data.reshape(-1).view(np.uint8)
        held, memory = self._using_memory()
        with held:
            p, rec, in_buffer = memory
            if not lib.ggml_is_contiguous(p):
                raise ValueError(f"tensor {self._label()} is not contiguous")
            n = int(lib.ggml_nbytes(p))
            if data.nbytes != n:
                raise ValueError(f"{data.nbytes} bytes for tensor {self._label()} of {n} bytes "
                                 f"({self.type_name}, ne {list(self.ne)})")
            src = ffi.from_buffer(data)
            if in_buffer:
                buffer.check_layout(p, read=False)
                call(lib.ggml_backend_tensor_set, p, src, 0, n)
            else:
                ffi.memmove(p.data, src, n)
        return self

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        """ValueError unless an array of NumPy ``shape`` fits this tensor (leading 1s aside)."""
        if _squeeze_leading(tuple(shape)) != _squeeze_leading(self.shape):
            raise ValueError(f"array of shape {tuple(shape)} for tensor {self._label()} of shape {self.shape} "
                             "(NumPy order, ne reversed): pass reshape=True to take its elements in C order")

    # ------------------------------------------------------------------ operators
    def __add__(self, other: "Tensor") -> "Tensor":
        return self._ops().add(self, other)

    def __sub__(self, other: "Tensor") -> "Tensor":
        return self._ops().sub(self, other)

    def __mul__(self, other: "Tensor | float") -> "Tensor":
        if isinstance(other, (int, float)):
            return self._ops().scale(self, float(other))
        return self._ops().mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other: "Tensor") -> "Tensor":
        return self._ops().div(self, other)

    def __neg__(self) -> "Tensor":
        return self._ops().neg(self)

    @property
    def T(self) -> "Tensor":
        """``ggml_transpose`` (swaps ``ne[0]`` and ``ne[1]``; a view)."""
        return self._ops().transpose(self)


def _squeeze_leading(shape: tuple[int, ...]) -> tuple[int, ...]:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]
