"""ggml op constructors as :class:`~pyggml.core.context.Context` methods, each checked first.

``ctx.op(a, ...)`` calls ``ggml_op(ctx, a, ...)`` and returns the result node as a
:class:`~pyggml.core.tensor.Tensor` living in ``ctx``. Before calling C, every method checks what
ggml would ``GGML_ASSERT`` on (shapes, types, contiguity, axes, free context memory) and raises
ValueError/TypeError/MemoryError instead of letting the process abort. Whether a backend can
*compute* a node (types it has kernels for) is checked when the graph is computed
(:meth:`pyggml.backends.backend.Backend.graph_compute`), with the backend's own ``supports_op``.

Every other op constructor of the headers is a method too, ``ctx.<name>(...)``, with its C
parameters (generated at build time into ``pyggml/core/_unchecked_ops.py``, a base class of
:class:`Ops`), or :meth:`Ops.op`; these are tried first in a forked copy of the process (see
:mod:`pyggml._trial`). Shapes in docstrings are ggml ``ne`` order.

The checks read ``ne`` and types from the Python side of the tensors (a :class:`Tensor` keeps
them), so a checked op costs a small multiple of the raw ``lib.ggml_<op>`` call
(``benchmarks/bench_calls.py`` measures it).
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .. import _trial, types
from ..raw import threads
from ._unchecked_ops import UncheckedOps
from ..memory.buffer import host_array_owner
from ..enums import GGMLType, PoolOp, SortOrder
from ..raw import callbacks, ffi, lib, requires
from .tensor import BorrowScope, Tensor, c_read, can_repeat, is_contiguous, row_strides, tensor_arg

__all__ = ["Ops", "UNARY_OPS", "host_array", "op_constructors"]

_t = tensor_arg
_OVERHEAD = int(lib.ggml_tensor_overhead())
_F32, _F16, _I32, _I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64
#: element counts below this pass ggml_new_tensor_impl's int64 overflow check whatever the
#: order of the dimensions (see :func:`_check_nelements`)
_NE_SAFE = 2**62
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
#: ggml_acc_impl and ggml_set_impl assert ``offset < (size_t)(1 << 30)``
_ACC_MAX_OFFSET = 1 << 30


_NONE = lib.GGML_OP_NONE
_new_object = object.__new__
# the C functions of the hottest op constructors, looked up once (a lib attribute costs ~25 ns)
_ggml_mul_mat, _ggml_soft_max_ext, _ggml_rms_norm, _ggml_permute = (
    lib.ggml_mul_mat, lib.ggml_soft_max_ext, lib.ggml_rms_norm, lib.ggml_permute)


def host_array(t: Tensor) -> np.ndarray:
    """A NumPy view of a plain-type tensor's host memory, NumPy order (shape ``ne`` reversed,
    strides ``nb`` reversed), writable. No ownership or placement checks: for code ggml calls
    while it owns the data (:meth:`Ops.map_custom` functions, Python backends). ValueError for
    quantized tensors or tensors without data."""
    p = t.ptr
    dtype = types.numpy_dtype(p.type)
    if dtype is None or p.data == ffi.NULL:
        raise ValueError(f"no NumPy view of a {t.type_name} tensor without data")
    n = t.n_dims
    return np.asarray(host_array_owner(int(ffi.cast("uintptr_t", p.data)), t.ne[:n][::-1],
                                       tuple(p.nb)[:n][::-1], dtype, t))


#: element-wise ops of one tensor, name -> ggml function (``ggml_unary`` family and friends)
UNARY_OPS: dict[str, Any] = {name: getattr(lib, f"ggml_{name}") for name in (
    "neg", "abs", "sgn", "step", "tanh", "elu", "relu", "sigmoid", "gelu", "gelu_erf",
    "gelu_quick", "silu", "hardswish", "hardsigmoid", "exp", "sqr", "sqrt", "log", "sin", "cos",
    "floor", "ceil", "round", "trunc", "softplus", "expm1",
) if hasattr(lib, f"ggml_{name}")}

# unary ops implemented with ggml_unary (assert contiguous rows); the others have no assert
_UNARY_NEEDS_ROWS = {"neg", "abs", "sgn", "step", "tanh", "elu", "relu", "sigmoid", "gelu",
                     "gelu_erf", "gelu_quick", "silu", "hardswish", "hardsigmoid", "exp",
                     "floor", "ceil", "round", "trunc", "softplus", "expm1"}

_CONSTRUCTORS: set[str] = set()
#: functions of the op constructors' signature that make no node (pyggml_build.stubs has the same list)
_CONTEXT_LOOKUPS = frozenset({"ggml_get_tensor", "ggml_get_first_tensor", "ggml_get_next_tensor"})


def op_constructors() -> set[str]:
    """Names (without ``ggml_``) of the ggml.h functions ``struct ggml_tensor * f(struct
    ggml_context *, ...)`` that make a node: all of them less ``ggml_new_*``, ``ggml_graph_*``
    and the context's tensor look-ups (``ggml_get_tensor``, ``ggml_get_first_tensor``,
    ``ggml_get_next_tensor``)."""
    if not _CONSTRUCTORS:
        for n in dir(lib):
            if (not n.startswith("ggml_") or n.startswith(("ggml_new_", "ggml_graph_"))
                    or n in _CONTEXT_LOOKUPS):
                continue
            t = ffi.typeof(getattr(lib, n))
            if (t.kind == "function" and t.result.cname == "struct ggml_tensor *" and t.args
                    and t.args[0].cname == "struct ggml_context *"):
                _CONSTRUCTORS.add(n[5:])
    return _CONSTRUCTORS


def _divides(d: int, n: int) -> bool:
    """``n % d == 0`` as ggml writes it, without its division by zero (SIGFPE) for d == 0."""
    return d > 0 and n % d == 0


_prod = math.prod


def _overlaps(dst: Tensor, src: Tensor, same_ok: bool = True) -> bool:
    """Whether ``src`` reads memory that a node writing into ``dst`` (a view of it: ``cpy``,
    ``set_rows``) writes, other than the very same elements in the very same layout. ggml
    copies element by element on several threads, so the result of such a node would depend on
    the order (the transpose of x copied into x gives neither x nor its transpose). Views share
    their root's memory (``view_src`` is always the root in ggml); different roots never
    overlap. ``same_ok=False``: the very same layout counts too (``set_rows`` moves rows)."""
    rd, lo_d, hi_d, layout_d = c_read(dst, _extent)
    rs, lo_s, hi_s, layout_s = c_read(src, _extent)
    if rd != rs or hi_d <= lo_s or hi_s <= lo_d:
        return False
    return not (same_ok and lo_d == lo_s and layout_d == layout_s)


def _extent(p: Any) -> tuple[Any, int, int, tuple[Any, ...]]:
    """(root struct, first byte, end byte in the root's memory, layout) of tensor struct ``p``."""
    root = p.view_src
    if root == ffi.NULL:
        root = p
    lo = int(p.view_offs)
    return root, lo, lo + int(lib.ggml_nbytes(p)), (int(p.type), tuple(p.ne), tuple(p.nb))


def _check_rows_stay(a: Tensor, op: str) -> None:
    """A view that moves dim 0 of a block-quantized tensor (Q4_0...: a row is whole blocks of
    ``ggml_blck_size`` elements) has no meaning, and ggml's kernels read it as a packed tensor
    (wrong values, or NaN, silently: when the rows are one block long its strides are even those
    of a contiguous tensor)."""
    if _BLCK[a._type] > 1:
        raise ValueError(f"{op}: {a.type_name} is block-quantized ({_BLCK[a._type]} elements per "
                         "block along ne[0]): dim 0 cannot move; dequantize first (Context.cast "
                         "to F32 or F16)")


def _check_nelements(ne: Sequence[int], what: str) -> None:
    """ggml_new_tensor_impl's own int64 check of the element count of a tensor of ``ne`` (ggml
    order), which it asserts (``INT64_MAX / ne[i] > current_nelements``, skipping sizes <= 1):
    ValueError instead of the abort. The check depends on the order of the sizes, so it is
    ggml's loop, not a bound on the product."""
    cur = ne[0]
    for n in ne[1:]:
        if n > 1:
            if _INT64_MAX // n <= cur:
                raise ValueError(f"{what}: a result of ne={list(ne)} has more elements than int64 holds")
            cur *= n


def _binary_op(fn: Any, doc: str) -> Callable[[Any, Tensor, Tensor], Tensor]:
    """An element-wise binary op constructor (``ggml_add``...): b tiles a; a's ne and type."""
    def op(self: "Ops", a: Tensor, b: Tensor) -> Tensor:
        if a.__class__ is not Tensor or a._owner._gen != a._gen:  # _t inlined (hot path)
            a = _t(a, "a")
        if b.__class__ is not Tensor or b._owner._gen != b._gen:
            b = _t(b, "b")
        an, bn = a._ne, b._ne
        if an != bn and not can_repeat(bn, an):
            raise ValueError(f"b (ne={list(bn)}) does not tile a (ne={list(an)}): ggml broadcasts "
                             "by repeating b, so each a.ne[i] must be a multiple of b.ne[i]")
        return self._node(fn, (a, b), an, a._type, True, (self._ptr, a._ptr, b._ptr))
    op.__doc__ = doc
    return op


_RESHAPE = (None, lib.ggml_reshape_1d, lib.ggml_reshape_2d, lib.ggml_reshape_3d, lib.ggml_reshape_4d)
_ONES = ((1, 1, 1, 1), (1, 1, 1), (1, 1), (1,), ())
_VIEW = (None, lib.ggml_view_1d, lib.ggml_view_2d, lib.ggml_view_3d, lib.ggml_view_4d)
# per ggml type: elements per block and bytes per block (ggml_blck_size, ggml_type_size), read once
_BLCK = tuple(int(lib.ggml_blck_size(t)) for t in range(lib.GGML_TYPE_COUNT))
_TSIZE = tuple(int(lib.ggml_type_size(t)) for t in range(lib.GGML_TYPE_COUNT))
#: a view of fewer bytes holds fewer than _NE_SAFE elements, whatever its type
_VIEW_SAFE_BYTES = min(_NE_SAFE * s // b for s, b in zip(_TSIZE, _BLCK) if s and b)
_REST = ((0, 1, 2, 3), (1, 2, 3), (2, 3), (3,), ())


def _permutations() -> dict[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every axes tuple ``ctx.permute`` takes (2 to 4 axes, the missing ones in place) ->
    (the 4 axes, their inverse: result dim j is a's dim inverse[j])."""
    table = {}
    for perm in itertools.permutations(range(4)):
        inverse = tuple(perm.index(j) for j in range(4))
        for n in (2, 3, 4):
            if perm[n:] == _REST[n]:
                table[perm[:n]] = (perm, inverse)
    return table


_PERMUTATIONS = _permutations()


def _rows_contiguous(a: Tensor) -> bool:
    return bool(c_read(a, lib.ggml_is_contiguous_rows))


def _ne(t: Tensor) -> list[int]:
    return list(t._ne)


class Ops(UncheckedOps):
    """The op constructors of a :class:`~pyggml.core.context.Context` (a mixin: ``self`` is the
    context). Methods are named as in ggml.h without ``ggml_``. Those defined here are checked;
    the other op constructors of the headers are methods of the generated base class
    :class:`~pyggml.core._unchecked_ops.UncheckedOps` (each calls :meth:`op`)."""

    if TYPE_CHECKING:
        _ptr: Any
        _gen: int
        _trial_ops: set[int]
        _callbacks: list[Any]

        def _reserve(self, data_bytes: int = 0, n_objects: int = 1, extra: int = 0) -> None: ...

        def _recount(self) -> None: ...

        def _live_ptr(self) -> Any: ...

        # the context makes the nodes (its arena, free space and dependencies): Context._node
        def _node(self, fn: Any, inputs: Sequence[Tensor], ne: tuple[int, ...] | None, type: Any,
                  contig: bool | None, args: tuple[Any, ...], need: int = ...) -> Tensor: ...

        def _node_c(self, fn: Any, inputs: Sequence[Tensor], *args: Any, n_objects: int = 1) -> Tensor: ...

        @property
        def ptr(self) -> Any: ...

    # ------------------------------------------------------------------ element-wise
    def unary(self, name: str, a: Tensor) -> Tensor:
        """Element-wise op ``name`` (a key of :data:`UNARY_OPS`, e.g. ``"gelu_erf"``): a tensor
        of ``a``'s ne and type. Raises ValueError for an unknown name or (for the ``ggml_unary``
        family) a tensor without contiguous rows."""
        a = _t(a, "a")
        fn = UNARY_OPS.get(name)
        if fn is None:
            raise ValueError(f"unknown unary op {name!r}; known: {sorted(UNARY_OPS)}")
        if name in _UNARY_NEEDS_ROWS and not _rows_contiguous(a):
            raise ValueError(f"{name} needs a tensor with contiguous rows: use cont() first")
        return self._node(fn, (a,), a._ne, a._type, None, (self._ptr, a._ptr))

    def neg(self, a: Tensor) -> Tensor:
        """``ggml_neg``: -a."""
        return self.unary("neg", a)

    def abs(self, a: Tensor) -> Tensor:
        """``ggml_abs``: ``|a|``."""
        return self.unary("abs", a)

    def sgn(self, a: Tensor) -> Tensor:
        """``ggml_sgn``: sign of a (-1, 0, 1)."""
        return self.unary("sgn", a)

    def step(self, a: Tensor) -> Tensor:
        """``ggml_step``: 1 where a > 0, else 0."""
        return self.unary("step", a)

    def tanh(self, a: Tensor) -> Tensor:
        """``ggml_tanh``."""
        return self.unary("tanh", a)

    def elu(self, a: Tensor) -> Tensor:
        """``ggml_elu``."""
        return self.unary("elu", a)

    def relu(self, a: Tensor) -> Tensor:
        """``ggml_relu``: max(a, 0)."""
        return self.unary("relu", a)

    def sigmoid(self, a: Tensor) -> Tensor:
        """``ggml_sigmoid``: 1 / (1 + exp(-a))."""
        return self.unary("sigmoid", a)

    def gelu(self, a: Tensor) -> Tensor:
        """``ggml_gelu`` (tanh approximation; the CPU reads an F16 table)."""
        return self.unary("gelu", a)

    def gelu_erf(self, a: Tensor) -> Tensor:
        """``ggml_gelu_erf``: the exact GELU, 0.5·a·(1 + erf(a/√2))."""
        return self.unary("gelu_erf", a)

    def gelu_quick(self, a: Tensor) -> Tensor:
        """``ggml_gelu_quick``: a·sigmoid(1.702·a)."""
        return self.unary("gelu_quick", a)

    def silu(self, a: Tensor) -> Tensor:
        """``ggml_silu``: a·sigmoid(a)."""
        return self.unary("silu", a)

    def hardswish(self, a: Tensor) -> Tensor:
        """``ggml_hardswish``."""
        return self.unary("hardswish", a)

    def hardsigmoid(self, a: Tensor) -> Tensor:
        """``ggml_hardsigmoid``."""
        return self.unary("hardsigmoid", a)

    def exp(self, a: Tensor) -> Tensor:
        """``ggml_exp``."""
        return self.unary("exp", a)

    def sqr(self, a: Tensor) -> Tensor:
        """``ggml_sqr``: a²."""
        return self.unary("sqr", a)

    def sqrt(self, a: Tensor) -> Tensor:
        """``ggml_sqrt``."""
        return self.unary("sqrt", a)

    def log(self, a: Tensor) -> Tensor:
        """``ggml_log`` (natural)."""
        return self.unary("log", a)

    def sin(self, a: Tensor) -> Tensor:
        """``ggml_sin``."""
        return self.unary("sin", a)

    def cos(self, a: Tensor) -> Tensor:
        """``ggml_cos``."""
        return self.unary("cos", a)

    def floor(self, a: Tensor) -> Tensor:
        """``ggml_floor``."""
        return self.unary("floor", a)

    def ceil(self, a: Tensor) -> Tensor:
        """``ggml_ceil``."""
        return self.unary("ceil", a)

    def round(self, a: Tensor) -> Tensor:
        """``ggml_round`` (half away from zero)."""
        return self.unary("round", a)

    def trunc(self, a: Tensor) -> Tensor:
        """``ggml_trunc``."""
        return self.unary("trunc", a)

    def softplus(self, a: Tensor) -> Tensor:
        """``ggml_softplus``: log(1 + exp(a))."""
        return self.unary("softplus", a)

    def expm1(self, a: Tensor) -> Tensor:
        """``ggml_expm1``: exp(a) - 1."""
        return self.unary("expm1", a)

    def op(self, name: str, *args: Any) -> Tensor:
        """Any op constructor of ggml.h, ``ggml_<name>(ctx, *args)``, e.g.
        ``ctx.op("conv_transpose_1d", a, b, 1, 0, 1)``; Tensors are passed as their pointers.

        Ops with a method of their own are checked by it. For the others pyggml knows no
        conditions: the call is first tried in a forked copy of the process, and if ggml aborts
        there, ValueError carries its message (graphs holding such nodes get the same trial
        before their first CPU compute). Raises AttributeError for a name that is not an op.
        """
        if name in _CHECKED:
            return getattr(self, name)(*args)  # type: ignore[no-any-return]
        if name not in op_constructors():
            raise AttributeError(f"ggml_{name} is not an op constructor of ggml.h")
        fn = getattr(lib, f"ggml_{name}")
        inputs = [_t(a, "argument") for a in args if isinstance(a, Tensor)]
        c_args = [a._ptr if isinstance(a, Tensor) else a for a in args]
        self._reserve(0, n_objects=8)
        ctx = self._live_ptr()
        failure = _trial.trial(lambda: fn(ctx, *c_args))
        if failure is not None:
            raise ValueError(f"ggml_{name} would abort the process: {failure}")
        out = self._node_c(fn, inputs, *c_args, n_objects=8)
        self._recount()  # 8 objects was an estimate (conv_2d makes im2col, reshapes, mul_mat...)
        self._trial_ops.add(int(out._ptr.op))
        return out

    add = _binary_op(lib.ggml_add, "``ggml_add``: a + b, b tiled over a (ggml broadcasting). Result has a's ne and type.")
    sub = _binary_op(lib.ggml_sub, "``ggml_sub``: a - b, b tiled over a.")
    mul = _binary_op(lib.ggml_mul, "``ggml_mul``: a * b element-wise, b tiled over a.")
    div = _binary_op(lib.ggml_div, "``ggml_div``: a / b element-wise, b tiled over a.")

    def scale(self, a: Tensor, s: float) -> Tensor:
        """``ggml_scale``: a * s. a must be padded-1d (contiguous rows packed)."""
        a = _t(a, "a")
        ne, nb = a._ne, row_strides(a)
        # ggml_is_padded_1d (static in ggml.c)
        if not (nb[0] == lib.ggml_type_size(a._type) and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]):
            raise ValueError("scale needs a tensor whose rows are packed: use cont() first")
        return self._node(lib.ggml_scale, (a,), ne, a._type, True, (self._ptr, a._ptr, float(s)))

    def clamp(self, a: Tensor, min: float, max: float) -> Tensor:
        """``ggml_clamp``: a clipped to [min, max] (a new tensor since ggml 0.25; a view computed
        in place before)."""
        a = _t(a, "a")
        return self._node_c(lib.ggml_clamp, (a,), a._ptr, float(min), float(max))

    def clamp_inplace(self, a: Tensor, min: float, max: float) -> Tensor:
        """``ggml_clamp_inplace`` (ggml >= 0.25): a clipped to [min, max], written over a (a view
        of a)."""
        a = _t(a, "a")
        return self._node_c(requires("ggml_clamp_inplace"), (a,), a._ptr, float(min), float(max))

    def leaky_relu(self, a: Tensor, negative_slope: float) -> Tensor:
        """``ggml_leaky_relu``: a where a > 0, else negative_slope·a."""
        a = _t(a, "a")
        return self._node_c(lib.ggml_leaky_relu, (a,), a._ptr, float(negative_slope), False)

    # ------------------------------------------------------------------ reductions
    def sum(self, a: Tensor) -> Tensor:
        """``ggml_sum``: sum of all elements, ne [1, 1, 1, 1]."""
        a = _t(a, "a")
        return self._node_c(lib.ggml_sum, (a,), a._ptr)

    def sum_rows(self, a: Tensor) -> Tensor:
        """``ggml_sum_rows``: ne [n0, n1, n2, n3] -> [1, n1, n2, n3]."""
        a = _t(a, "a")
        return self._node_c(lib.ggml_sum_rows, (a,), a._ptr)

    def mean(self, a: Tensor) -> Tensor:
        """``ggml_mean``: mean along ne[0]: [n0, n1, n2, n3] -> [1, n1, n2, n3]."""
        a = _t(a, "a")
        return self._node_c(lib.ggml_mean, (a,), a._ptr)

    def argmax(self, a: Tensor) -> Tensor:
        """``ggml_argmax``: index of the largest value of each row, I32 [n1]. a must be a matrix."""
        a = _t(a, "a")
        if a._ne[2] != 1 or a._ne[3] != 1 or a._ne[0] > 2**31 - 1:
            raise ValueError("argmax needs a matrix (ne[2] == ne[3] == 1)")
        return self._node_c(lib.ggml_argmax, (a,), a._ptr)

    def repeat(self, a: Tensor, like: Tensor) -> Tensor:
        """``ggml_repeat``: a tiled to ``like``'s ne."""
        a, like = _t(a, "a"), _t(like, "like")
        if not can_repeat(a._ne, like._ne):
            raise ValueError(f"a (ne={_ne(a)}) does not tile ne={_ne(like)}")
        return self._node_c(lib.ggml_repeat, (a, like), a._ptr, like._ptr)

    # ------------------------------------------------------------------ normalisation
    def norm(self, a: Tensor, eps: float = 1e-5) -> Tensor:
        """``ggml_norm``: (a - mean) / sqrt(var + eps) along ne[0]. Raises ValueError unless
        eps >= 0 (the CPU kernel asserts it)."""
        a = _t(a, "a")
        eps = float(eps)
        if not eps >= 0:  # NaN too
            raise ValueError(f"norm: eps must be >= 0, not {eps}")
        return self._node(lib.ggml_norm, (a,), a._ne, a._type, True, (self._ptr, a._ptr, eps))

    def rms_norm(self, a: Tensor, eps: float = 1e-6) -> Tensor:
        """``ggml_rms_norm``: a / sqrt(mean(a²) + eps) along ne[0]. Raises ValueError unless
        eps >= 0."""
        if a.__class__ is not Tensor or a._owner._gen != a._gen:  # _t inlined (hot path)
            a = _t(a, "a")
        eps = float(eps)
        if not eps >= 0:  # NaN too
            raise ValueError(f"rms_norm: eps must be >= 0, not {eps}")
        return self._node(_ggml_rms_norm, (a,), a._ne, a._type, True, (self._ptr, a._ptr, eps))

    def l2_norm(self, a: Tensor, eps: float = 1e-12) -> Tensor:
        """``ggml_l2_norm``: a / max(‖a‖₂, eps) along ne[0]. Raises ValueError unless eps >= 0."""
        a = _t(a, "a")
        eps = float(eps)
        if not eps >= 0:  # NaN too
            raise ValueError(f"l2_norm: eps must be >= 0, not {eps}")
        return self._node(lib.ggml_l2_norm, (a,), a._ne, a._type, None, (self._ptr, a._ptr, eps))

    def soft_max(self, a: Tensor, mask: Tensor | None = None, scale: float = 1.0,
                 max_bias: float = 0.0) -> Tensor:
        """``ggml_soft_max_ext``: softmax(a * scale + mask) along ne[0].

        a must be contiguous; mask (F32 or F16, contiguous) has ne [a.ne0, >= a.ne1, d2, d3]
        with a.ne2 % d2 == 0 and a.ne3 % d3 == 0. ``max_bias`` > 0 (ALiBi) needs a mask.
        """
        if a.__class__ is not Tensor or a._owner._gen != a._gen:  # _t inlined (hot path)
            a = _t(a, "a")
        if mask is not None and (mask.__class__ is not Tensor or mask._owner._gen != mask._gen):
            mask = _t(mask, "mask")  # a closed mask is reported before a's layout
        c = a._contig
        if not (c if c is not None else is_contiguous(a)):
            raise ValueError("soft_max needs a contiguous tensor: use cont() first")
        inputs: tuple[Tensor, ...] = (a,)
        m_ptr = ffi.NULL
        if mask is not None:
            if mask._type not in (_F32, _F16):
                raise TypeError("soft_max mask must be F32 or F16")
            c = mask._contig
            if not (c if c is not None else is_contiguous(mask)):
                raise ValueError("soft_max mask must be contiguous")
            m0, m1, m2, m3 = m = mask._ne
            n0, n1, n2, n3 = n = a._ne
            if (m0 != n0 or m1 < n1 or not (m2 > 0 and n2 % m2 == 0)
                    or not (m3 > 0 and n3 % m3 == 0)):  # _divides inlined
                raise ValueError(f"mask ne={list(m)} does not fit a ne={list(n)}")
            inputs, m_ptr = (a, mask), mask._ptr
        elif max_bias > 0:
            raise ValueError("max_bias > 0 needs a mask")
        return self._node(_ggml_soft_max_ext, inputs, a._ne, a._type, True,
                           (self._ptr, a._ptr, m_ptr, float(scale), float(max_bias)))

    # ------------------------------------------------------------------ matrix
    def mul_mat(self, a: Tensor, b: Tensor) -> Tensor:
        """``ggml_mul_mat``: ne [K, M, d2, d3] x [K, N, e2, e3] -> F32 [M, N, e2, e3], i.e.
        result[n, m] = Σ_k a[m, k]·b[n, k] in NumPy order (``b @ a.T``); a's batch dims are
        broadcast (e2 % d2 == 0, e3 % d3 == 0). a must not be transposed.
        """
        if a.__class__ is not Tensor or a._owner._gen != a._gen:  # _t inlined (hot path)
            a = _t(a, "a")
        if b.__class__ is not Tensor or b._owner._gen != b._gen:
            b = _t(b, "b")
        a0, a1, a2, a3 = an = a._ne
        b0, b1, b2, b3 = bn = b._ne
        if a0 != b0 or not (a2 > 0 and b2 % a2 == 0) or not (a3 > 0 and b3 % a3 == 0):  # _divides inlined
            raise ValueError(f"cannot mul_mat a ne={list(an)} with b ne={list(bn)}: needs "
                             "a.ne0 == b.ne0 and b.ne2/ne3 multiples of a.ne2/ne3")
        # ggml_is_transposed: nb[0] > nb[1], which a contiguous a is not when ne[0] is more than
        # one block and ne[1] > 1 (ggml_is_contiguous ignores the strides of dims of size 1,
        # and a transposed [2, 1] is a contiguous [1, 2])
        c = a._contig
        if (not (a0 > _BLCK[a._type] and a1 > 1 and (c if c is not None else is_contiguous(a)))
                and c_read(a, lib.ggml_is_transposed)):
            raise ValueError("mul_mat: a must not be transposed (use cont())")
        if a1 > b0:
            # else b's ne [b0, b1, b2, b3] bounds the result's [a1, b1, b2, b3] size by size
            _check_nelements((a1, b1, b2, b3), "mul_mat")
        return self._node(_ggml_mul_mat, (a, b), (a1, b1, b2, b3), _F32, True,
                           (self._ptr, a._ptr, b._ptr))

    def out_prod(self, a: Tensor, b: Tensor) -> Tensor:
        """``ggml_out_prod``: ne [M, K] x [N, K] -> [M, N] (Σ_k a[k, m]·b[k, n] in ggml order)."""
        a, b = _t(a, "a"), _t(b, "b")
        an, bn = a._ne, b._ne
        if an[1] != bn[1] or not _divides(an[2], bn[2]) or not _divides(an[3], bn[3]) or c_read(a, lib.ggml_is_transposed):
            raise ValueError(f"cannot out_prod a ne={list(an)} with b ne={list(bn)}")
        _check_nelements((an[0], bn[0], bn[2], bn[3]), "out_prod")
        return self._node_c(lib.ggml_out_prod, (a, b), a._ptr, b._ptr)

    # ------------------------------------------------------------------ shape ops (views)
    def cont(self, a: Tensor) -> Tensor:
        """``ggml_cont``: a contiguous copy of a."""
        a = _t(a, "a")
        return self._node(lib.ggml_cont, (a,), a._ne, a._type, True, (self._ptr, a._ptr))

    def cpy(self, a: Tensor, b: Tensor) -> Tensor:
        """``ggml_cpy``: copy a into b (converting the type); returns a view of b.

        Raises ValueError when the element counts differ, or when a reads b's memory in another
        layout (a view of the same tensor that overlaps b: the copy's result would depend on
        the order ggml's threads copy in; copy ``cont(a)`` instead)."""
        a, b = _t(a, "a"), _t(b, "b")
        if a.nelements != b.nelements:
            raise ValueError(f"cpy: {a.nelements} elements into {b.nelements}")
        if _overlaps(b, a):
            raise ValueError("cpy: a reads memory of b in another layout; ggml would copy the "
                             "elements over each other in an order of its threads: cont(a) first")
        return self._node_c(lib.ggml_cpy, (a, b), a._ptr, b._ptr)

    def cast(self, a: Tensor, type: types.TypeLike) -> Tensor:
        """``ggml_cast``: a converted to ggml ``type``."""
        a = _t(a, "a")
        t = types.ggml_type(type)
        if a._ne[0] % types.block_size(t):
            raise ValueError("ne[0] is not a multiple of the target type's block size")
        return self._node_c(lib.ggml_cast, (a,), a._ptr, t, n_objects=2)

    def reshape(self, a: Tensor, *ne: int) -> Tensor:
        """``ggml_reshape_{1..4}d``: a view of contiguous ``a`` with ``ne`` (ggml order)."""
        if a.__class__ is not Tensor or a._owner._gen != a._gen:  # _t inlined (hot path)
            a = _t(a, "a")
        for x in ne:  # sizes that are not ints (NumPy's, say) converted; the usual case costs a loop
            if x.__class__ is not int:
                ne = tuple(map(int, ne))
                break
        n = len(ne)
        if not 1 <= n <= 4:
            raise ValueError("reshape takes 1 to 4 sizes")
        c = a._contig
        if not (c if c is not None else is_contiguous(a)):
            raise ValueError("reshape needs a contiguous tensor: use cont() first")
        count = _prod(ne)
        if min(ne) < 0 or count != _prod(a._ne):
            raise ValueError(f"cannot reshape {a.nelements} elements to ne={list(ne)}")
        if not count or count >= _NE_SAFE:  # else any order of the sizes passes ggml's loop
            _check_nelements(ne, "reshape")
        return self._node(_RESHAPE[n], (a,), (ne + _ONES[n]), a._type, True, (self._ptr, a._ptr, *ne))

    def view(self, a: Tensor, ne: Sequence[int], nb: Sequence[int] | None = None,
             offset: int = 0) -> Tensor:
        """``ggml_view_{1..4}d``: a view of ``a`` with ``ne`` (ggml order), byte strides ``nb``
        for dims 1.. (default: a's row strides) starting ``offset`` bytes into a's data.
        Raises ValueError if the view reaches outside a."""
        if a.__class__ is not Tensor or a._owner._gen != a._gen:  # _t inlined (hot path)
            a = _t(a, "a")
        ne = list(map(int, ne))
        n = len(ne)
        if not 1 <= n <= 4 or min(ne) < 0 or offset < 0:
            raise ValueError("view takes 1 to 4 non-negative sizes and offset >= 0")
        t = a._type
        blck = _BLCK[t]
        if ne[0] % blck:
            raise ValueError("view: ne[0] is not a multiple of the block size")
        if nb is None:
            nb = a._nb
            nb = (nb if nb is not None else row_strides(a))[1:n]
        else:
            nb = list(map(int, nb))
            if len(nb) != n - 1 or (nb and min(nb) < 0):
                raise ValueError(f"view of {n} dims takes {n - 1} strides")
        # as ggml_new_tensor_impl: the view's contiguous size, whatever its strides (Python
        # integers: no size_t wrap-around)
        size = _TSIZE[t] * (ne[0] // blck) * _prod(ne[1:])
        if size:
            an = a._ne
            c = a._contig
            # ggml_nbytes of a, in Python when a is contiguous (packed rows)
            a_bytes = (_TSIZE[t] * (an[0] // blck) * an[1] * an[2] * an[3]
                       if (c if c is not None else is_contiguous(a)) else int(c_read(a, lib.ggml_nbytes)))
            if offset + size > a_bytes:
                raise ValueError(f"view of {size} bytes at offset {offset} reaches outside a "
                                 f"({a_bytes} bytes)")
        if not size or size >= _VIEW_SAFE_BYTES:  # else fewer than _NE_SAFE elements
            _check_nelements(ne, "view")
        if n == 1:
            return self._node(lib.ggml_view_1d, (a,), (ne[0], 1, 1, 1), t, None,
                               (self._ptr, a._ptr, ne[0], offset))
        return self._node(_VIEW[n], (a,), (*ne, *_ONES[n]), t, None,
                           (self._ptr, a._ptr, *ne, *nb, offset))

    def permute(self, a: Tensor, *axes: int) -> Tensor:
        """``ggml_permute``: dim i of a becomes dim ``axes[i]`` (ggml order); 2 to 4 axes
        (missing ones stay in place). A view. Raises ValueError unless the axes are a
        permutation."""
        a = _t(a, "a")
        known = _PERMUTATIONS.get(axes)
        if known is None:
            raise ValueError(f"permute axes {axes} are not a permutation of 0..3 "
                             "(2 to 4 axes, the missing ones stay in place)")
        axes, inv = known
        if axes[0] != 0:
            _check_rows_stay(a, "permute")
        n = a._ne
        ne = (n[inv[0]], n[inv[1]], n[inv[2]], n[inv[3]])  # as ggml_permute: dim i goes to axes[i]
        count = n[0] * n[1] * n[2] * n[3]
        if not count or count >= _NE_SAFE:  # else any order of the sizes passes ggml's loop
            _check_nelements(ne, "permute")
        return self._node(_ggml_permute, (a,), ne, a._type, None, (self._ptr, a._ptr, *axes))

    def transpose(self, a: Tensor) -> Tensor:
        """``ggml_transpose``: swap ne[0] and ne[1] (a view). Raises ValueError for a
        block-quantized tensor (its rows are whole blocks)."""
        a = _t(a, "a")
        _check_rows_stay(a, "transpose")
        n = a._ne
        count = n[0] * n[1] * n[2] * n[3]
        if not count or count >= _NE_SAFE:  # else any order of the sizes passes ggml's loop
            _check_nelements((n[1], n[0], n[2], n[3]), "transpose")
        return self._node(lib.ggml_transpose, (a,), (n[1], n[0], n[2], n[3]), a._type, None,
                           (self._ptr, a._ptr))

    def concat(self, a: Tensor, b: Tensor, dim: int) -> Tensor:
        """``ggml_concat``: a and b joined along ggml dim ``dim``; other dims and types must match."""
        a, b = _t(a, "a"), _t(b, "b")
        if not 0 <= dim < 4:
            raise ValueError("concat dim must be 0..3")
        if a._type != b._type:
            raise TypeError("concat: a and b must have the same type")
        if any(a._ne[d] != b._ne[d] for d in range(4) if d != dim):
            raise ValueError(f"concat along {dim}: ne {_ne(a)} and {_ne(b)} differ elsewhere")
        _check_nelements([a._ne[d] + (b._ne[d] if d == dim else 0) for d in range(4)], "concat")
        return self._node_c(lib.ggml_concat, (a, b), a._ptr, b._ptr, dim)

    # ------------------------------------------------------------------ indexing
    def get_rows(self, a: Tensor, rows: Tensor) -> Tensor:
        """``ggml_get_rows``: rows of a (ne [n0, n1, n2, n3]) picked by I32 ``rows``
        (ne [k, n2, n3]) -> ne [n0, k, n2, n3], F32 for quantized a."""
        a, rows = _t(a, "a"), _t(rows, "rows")
        if rows._type != _I32:
            raise TypeError("get_rows: the row indices must be I32")
        if a._ne[2] != rows._ne[1] or a._ne[3] != rows._ne[2] or rows._ne[3] != 1:
            raise ValueError(f"get_rows: rows ne={_ne(rows)} do not fit a ne={_ne(a)}")
        if rows._ne[0] > a._ne[1]:  # else a's ne bounds the result's ne size by size (_check_nelements)
            _check_nelements((a._ne[0], rows._ne[0], rows._ne[1], rows._ne[2]), "get_rows")
        # as ggml_get_rows: F32 unless a is I32
        return self._node(lib.ggml_get_rows, (a, rows), (a._ne[0], rows._ne[0], rows._ne[1], rows._ne[2]),
                           _I32 if a._type == _I32 else _F32, True, (self._ptr, a._ptr, rows._ptr))

    def set_rows(self, a: Tensor, b: Tensor, rows: Tensor) -> Tensor:
        """``ggml_set_rows``: write the rows of b (F32/F16) into a at I32/I64 indices ``rows``;
        returns a view of a. Raises ValueError when b or rows overlap a's memory (views of the
        same tensor)."""
        a, b, rows = _t(a, "a"), _t(b, "b"), _t(rows, "rows")
        if b._type not in (_F32, _F16):
            raise TypeError("set_rows: b must be F32 or F16")
        if rows._type not in (_I32, _I64):
            raise TypeError("set_rows: the row indices must be I32 or I64")
        an, bn, rn = a._ne, b._ne, rows._ne
        ok = (an[0] == bn[0] and an[2] == bn[2] and an[3] == bn[3]
              and bn[1] == rn[0] and _divides(rn[1], bn[2]) and _divides(rn[2], bn[3]) and rn[3] == 1)
        if not ok:
            raise ValueError(f"set_rows: a ne={list(an)}, b ne={list(bn)}, rows ne={list(rn)} do not fit")
        if not (_rows_contiguous(a) and _rows_contiguous(b)):
            raise ValueError("set_rows: a and b need contiguous rows")
        if _overlaps(a, b, False) or _overlaps(a, rows, False):
            raise ValueError("set_rows: b or rows read memory of a; ggml would write rows over "
                             "what it still reads: cont() them first")
        return self._node_c(lib.ggml_set_rows, (a, b, rows), a._ptr, b._ptr, rows._ptr)

    def diag_mask_inf(self, a: Tensor, n_past: int) -> Tensor:
        """``ggml_diag_mask_inf``: -inf above the diagonal shifted by ``n_past`` (causal mask).
        Raises ValueError for n_past < 0 (the CPU kernel asserts n_past >= 0)."""
        a = _t(a, "a")
        n_past = int(n_past)
        if not 0 <= n_past < 2**31:
            raise ValueError(f"diag_mask_inf: n_past must be in 0..2**31-1, not {n_past}")
        return self._node_c(lib.ggml_diag_mask_inf, (a,), a._ptr, n_past)

    # ------------------------------------------------------------------ transformer pieces
    def rope(self, a: Tensor, pos: Tensor, n_dims: int, mode: int = 0, n_ctx_orig: int = 0,
             freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
             attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
             freq_factors: Tensor | None = None) -> Tensor:
        """``ggml_rope_ext``: rotary embedding of a (ne [head_dim, n_head, n_tokens, ...]) at
        I32 positions ``pos`` (ne [n_tokens]). ``mode`` 0 (normal) or ``RopeType.NEOX``.
        Raises ValueError for another mode (multi-section and vision ropes take sections:
        ``ctx.op("rope_multi", ...)``), bad positions, n_dims or freq_factors."""
        a, pos = _t(a, "a"), _t(pos, "pos")
        if freq_factors is not None:
            freq_factors = _t(freq_factors, "freq_factors")  # every tensor first: ClosedError
        if mode & 1:
            raise ValueError("rope mode & 1 is no longer supported by ggml")
        if mode & lib.GGML_ROPE_TYPE_MROPE:
            raise ValueError("multi-section rope: use ctx.op(\"rope_multi\", ...)")
        if mode != 0 and mode != lib.GGML_ROPE_TYPE_NEOX:
            raise ValueError(f"rope mode {mode}: ggml's rope kernels take 0 (normal) or "
                             f"RopeType.NEOX ({lib.GGML_ROPE_TYPE_NEOX}) here")
        if pos._type != _I32 or pos.n_dims != 1 or pos._ne[0] != a._ne[2]:
            raise ValueError(f"rope: pos must be an I32 vector of a.ne[2]={a._ne[2]} positions")
        if not 0 < n_dims <= a._ne[0] or n_dims % 2:
            raise ValueError("rope: n_dims must be even and in 1..a.ne[0]")
        c = ffi.NULL
        inputs: tuple[Tensor, ...] = (a, pos)
        if freq_factors is not None:
            if freq_factors._type != _F32 or freq_factors._ne[0] < n_dims // 2:
                raise ValueError("rope: freq_factors must be F32 with >= n_dims/2 entries")
            c = freq_factors._ptr
            inputs = (a, pos, freq_factors)
        return self._node(lib.ggml_rope_ext, inputs, a._ne, a._type, None,
                           (self._ptr, a._ptr, pos._ptr, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                            ext_factor, attn_factor, beta_fast, beta_slow))

    def _glu(self, fn: Any, fn_split: Any, a: Tensor, b: Tensor | None) -> Tensor:
        a = _t(a, "a")
        if b is not None:
            b = _t(b, "b")  # every tensor first: a closed one raises ClosedError before a layout error
        if not c_read(a, lib.ggml_is_contiguous_1):
            raise ValueError("glu ops need a contiguous tensor")
        if b is None:
            if a._ne[0] % 2:
                raise ValueError("glu on one tensor needs an even ne[0] (it is split in halves)")
            return self._node_c(fn, (a,), a._ptr)
        if not c_read(b, lib.ggml_is_contiguous_1) or a._ne != b._ne or a._type != b._type:
            raise ValueError("glu on two tensors needs contiguous tensors of the same ne and type")
        return self._node_c(fn_split, (a, b), a._ptr, b._ptr)

    def swiglu(self, a: Tensor, b: Tensor | None = None) -> Tensor:
        """``ggml_swiglu`` (a split in halves: silu(x)·g) or ``ggml_swiglu_split`` (silu(a)·b)."""
        return self._glu(lib.ggml_swiglu, lib.ggml_swiglu_split, a, b)

    def swiglu_clamp(self, a: Tensor, b: Tensor, limit: float) -> Tensor:
        """``ggml_swiglu_clamp`` (ggml >= 0.25): silu(a)·b with both clamped by ``limit`` (a and
        b contiguous, of the same ne and type)."""
        fn = requires("ggml_swiglu_clamp")
        return self._glu(None, lambda c, x, y: fn(c, x, y, float(limit)), a, b)

    def geglu(self, a: Tensor, b: Tensor | None = None) -> Tensor:
        """``ggml_geglu`` / ``ggml_geglu_split``: gelu(x)·g."""
        return self._glu(lib.ggml_geglu, lib.ggml_geglu_split, a, b)

    def argsort(self, a: Tensor, descending: bool = False) -> Tensor:
        """``ggml_argsort``: I32 indices sorting each row of a."""
        a = _t(a, "a")
        if a._ne[0] > 2**31 - 1:
            raise ValueError("argsort rows are limited to 2**31-1 elements")
        order = SortOrder.DESC if descending else SortOrder.ASC
        return self._node_c(lib.ggml_argsort, (a,), a._ptr, order)

    # ------------------------------------------------------------------ more model ops
    def pad(self, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0,
            *, left: Sequence[int] = (0, 0, 0, 0)) -> Tensor:
        """``ggml_pad_ext``: zero padding, ``p<i>`` elements after and ``left[i]`` before dim i."""
        a = _t(a, "a")
        right, lft = [int(p0), int(p1), int(p2), int(p3)], [int(x) for x in left]
        if len(lft) != 4 or min(right + lft) < 0:
            raise ValueError("pad sizes must be >= 0 (and left has 4 entries)")
        _check_nelements([n + l + r for n, l, r in zip(a._ne, lft, right)], "pad")
        args = [x for pair in zip(lft, right) for x in pair]
        return self._node_c(lib.ggml_pad_ext, (a,), a._ptr, *args)

    def interpolate(self, a: Tensor, ne: Sequence[int], mode: int = 0) -> Tensor:
        """``ggml_interpolate``: resize F32 ``a`` to ``ne`` (4 sizes, ggml order);
        ``mode`` ``ScaleMode.NEAREST`` / ``BILINEAR`` / ``BICUBIC`` (+ flags)."""
        a = _t(a, "a")
        ne = [int(n) for n in ne]
        if a._type != _F32:
            raise TypeError("interpolate needs an F32 tensor")
        if len(ne) != 4 or min(ne) < 1:
            raise ValueError("interpolate takes 4 sizes >= 1")
        if (mode & 0xFF) >= lib.GGML_SCALE_MODE_COUNT or (
                mode & lib.GGML_SCALE_FLAG_ANTIALIAS and (mode & 0xFF) != lib.GGML_SCALE_MODE_BILINEAR):
            raise ValueError(f"bad interpolate mode {mode:#x}")
        _check_nelements(ne, "interpolate")
        return self._node_c(lib.ggml_interpolate, (a,), a._ptr, *ne, mode)

    def im2col(self, kernel: Tensor, x: Tensor, s0: int, s1: int, p0: int, p1: int,
               d0: int, d1: int, is_2d: bool, type: types.TypeLike = GGMLType.F16) -> Tensor:
        """``ggml_im2col``: the patches of ``x`` a convolution with ``kernel`` multiplies."""
        kernel, x = _t(kernel, "kernel"), _t(x, "x")
        _conv_sizes(kernel, x, s0, s1, p0, p1, d0, d1, is_2d)
        t = types.ggml_type(type)
        if t not in (_F16, _F32):
            raise TypeError("im2col output must be F16 or F32")
        return self._node_c(lib.ggml_im2col, (kernel, x), kernel._ptr, x._ptr, s0, s1, p0, p1, d0, d1, is_2d, t)

    def conv_1d(self, kernel: Tensor, x: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
        """``ggml_conv_1d``: kernel ne [K, IC, OC] over x ne [L, IC, N] -> [OL, OC, N]."""
        kernel, x = _t(kernel, "kernel"), _t(x, "x")
        ic = _conv_sizes(kernel, x, s0, 0, p0, 0, d0, 0, False)
        if not is_contiguous(kernel):
            raise ValueError("conv kernel must be contiguous")
        oc = kernel._ne[2]  # the nodes ggml_conv_1d makes after im2col: reshapes, mul_mat
        for ne in ((ic[0], ic[1] * ic[2]), (ic[1] * ic[2], oc), (ic[1], oc, ic[2])):
            _check_nelements(ne, "conv_1d")
        return self._node_c(lib.ggml_conv_1d, (kernel, x), kernel._ptr, x._ptr, s0, p0, d0, n_objects=6)

    def conv_2d(self, kernel: Tensor, x: Tensor, s0: int = 1, s1: int = 1, p0: int = 0,
                p1: int = 0, d0: int = 1, d1: int = 1) -> Tensor:
        """``ggml_conv_2d``: kernel ne [KW, KH, IC, OC] over x ne [W, H, IC, N] -> [OW, OH, OC, N]."""
        kernel, x = _t(kernel, "kernel"), _t(x, "x")
        ic = _conv_sizes(kernel, x, s0, s1, p0, p1, d0, d1, True)
        if not is_contiguous(kernel):
            raise ValueError("conv kernel must be contiguous")
        oc, n = kernel._ne[3], ic[1] * ic[2] * ic[3]  # the nodes ggml_conv_2d makes after im2col
        for ne in ((ic[0], n), (n, oc), (ic[1], ic[2], ic[3], oc), (ic[1], ic[2], oc, ic[3])):
            _check_nelements(ne, "conv_2d")
        return self._node_c(lib.ggml_conv_2d, (kernel, x), kernel._ptr, x._ptr, s0, s1, p0, p1, d0, d1, n_objects=8)

    def pool_1d(self, a: Tensor, op: str, k0: int, s0: int, p0: int = 0) -> Tensor:
        """``ggml_pool_1d``: ``op`` "max" or "avg" over windows of ``k0`` along ne[0]."""
        a = _t(a, "a")
        if s0 < 1 or k0 < 1 or p0 < 0 or (a._ne[0] + 2 * p0 - k0) // s0 + 1 < 1:
            raise ValueError("pool_1d: kernel, stride and padding leave no output")
        _check_nelements(((a._ne[0] + 2 * p0 - k0) // s0 + 1, *a._ne[1:]), "pool_1d")
        return self._node_c(lib.ggml_pool_1d, (a,), a._ptr, _pool_op(op), k0, s0, p0)

    def pool_2d(self, a: Tensor, op: str, k0: int, k1: int, s0: int, s1: int,
                p0: float = 0.0, p1: float = 0.0) -> Tensor:
        """``ggml_pool_2d``: ``op`` "max" or "avg" over k0 x k1 windows of dims 0 and 1."""
        a = _t(a, "a")
        ok = min(s0, s1, k0, k1) >= 1 and min(p0, p1) >= 0
        if not ok or (a._ne[0] + 2 * p0 - k0) // s0 + 1 < 1 or (a._ne[1] + 2 * p1 - k1) // s1 + 1 < 1:
            raise ValueError("pool_2d: kernel, stride and padding leave no output")
        _check_nelements((int((a._ne[0] + 2 * p0 - k0) // s0 + 1), int((a._ne[1] + 2 * p1 - k1) // s1 + 1),
                          *a._ne[2:]), "pool_2d")
        return self._node_c(lib.ggml_pool_2d, (a,), a._ptr, _pool_op(op), k0, k1, s0, s1, float(p0), float(p1))

    def flash_attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                   scale: float = 1.0, max_bias: float = 0.0, logit_softcap: float = 0.0) -> Tensor:
        """``ggml_flash_attn_ext``: softmax(scale·K Qᵀ + mask) V fused. q ne [D, n_q, H, B],
        k ne [D, n_kv, H_kv, B], v ne [Dv, n_kv, H_kv, B] (H % H_kv == 0), mask F16
        [n_kv, >= n_q, ...] -> F32 ne [Dv, H, n_q, B]."""
        q, k, v = _t(q, "q"), _t(k, "k"), _t(v, "v")
        if mask is not None:
            mask = _t(mask, "mask")  # every tensor first: ClosedError before a shape error
        qn, kn, vn = q._ne, k._ne, v._ne
        if kn[0] != qn[0] or not _divides(kn[2], qn[2]) or not _divides(kn[3], qn[3]):
            raise ValueError(f"flash_attn: k ne={list(kn)} does not fit q ne={list(qn)}")
        if not qn[3] == kn[3] == vn[3] or vn[1] != kn[1] or vn[2] != kn[2]:
            raise ValueError("flash_attn: q, k and v batch/kv sizes differ")
        inputs: tuple[Tensor, ...] = (q, k, v)
        m_ptr = ffi.NULL
        if mask is not None:
            mn = mask._ne
            if mask._type != _F16 or not is_contiguous(mask):
                raise TypeError("flash_attn mask must be a contiguous F16 tensor")
            if mn[0] != kn[1] or mn[1] < qn[1] or not _divides(mn[2], qn[2]) or not _divides(mn[3], qn[3]):
                raise ValueError(f"flash_attn: mask ne={list(mn)} does not fit")
            inputs, m_ptr = (q, k, v, mask), mask._ptr
        elif max_bias > 0:
            raise ValueError("max_bias > 0 needs a mask")
        _check_nelements((vn[0], qn[2], qn[1], qn[3]), "flash_attn")
        return self._node_c(lib.ggml_flash_attn_ext, inputs, q._ptr, k._ptr, v._ptr, m_ptr,
                     float(scale), float(max_bias), float(logit_softcap))

    def dsv4_hc_pre_gated(self, x: Tensor, gate: Tensor, scale: float = 1.0) -> Tensor:
        """``ggml_dsv4_hc_pre_gated`` (ggml >= 0.25): hyper-connection pre-mix with a per-element
        gate, ``result[i, t] = scale·Σ_h x[i, h, t]·sigmoid(gate[i, h, t])``. x and gate F32 ne
        [n_embd, hc, n_tokens] -> F32 [n_embd, n_tokens]."""
        fn = requires("ggml_dsv4_hc_pre_gated")
        x, gate = _t(x, "x"), _t(gate, "gate")
        if x._type != _F32 or gate._type != _F32:
            raise TypeError("dsv4_hc_pre_gated takes F32 tensors")
        xn, gn = x._ne, gate._ne
        if xn[1] < 1 or xn[3] != 1 or gn[:3] != xn[:3] or gn[3] != 1:
            raise ValueError(f"dsv4_hc_pre_gated: x ne={list(xn)} and gate ne={list(gn)} must be the same [n_embd, hc, n_tokens]")
        return self._node_c(fn, (x, gate), x._ptr, gate._ptr, float(scale))

    def top_k(self, a: Tensor, k: int) -> Tensor:
        """``ggml_top_k``: I32 indices of the ``k`` largest values of each row."""
        a = _t(a, "a")
        if not 1 <= k <= a._ne[0]:
            raise ValueError(f"top_k: k must be in 1..{a._ne[0]}")
        return self._node_c(lib.ggml_top_k, (a,), a._ptr, int(k), n_objects=2)

    def cumsum(self, a: Tensor) -> Tensor:
        """``ggml_cumsum``: running sum along ne[0] (F32)."""
        a = _t(a, "a")
        if a._type != _F32:
            raise TypeError("cumsum needs an F32 tensor")
        return self._node_c(lib.ggml_cumsum, (a,), a._ptr)

    def timestep_embedding(self, timesteps: Tensor, dim: int, max_period: int = 10000) -> Tensor:
        """``ggml_timestep_embedding``: sinusoidal embeddings [dim, n] of F32 timesteps [n]."""
        t = _t(timesteps, "timesteps")
        if dim < 1 or max_period < 1 or t.n_dims != 1:
            raise ValueError("timestep_embedding: dim, max_period >= 1 and a vector of timesteps")
        _check_nelements((int(dim), t._ne[0]), "timestep_embedding")
        return self._node_c(lib.ggml_timestep_embedding, (t,), t._ptr, int(dim), int(max_period))

    def cross_entropy_loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """``ggml_cross_entropy_loss``: mean over rows of -Σ labels·log softmax(logits)
        (same shape, F32) -> scalar F32."""
        a, b = _t(logits, "logits"), _t(labels, "labels")
        if a._ne != b._ne:
            raise ValueError("cross_entropy_loss: logits and labels must have the same shape")
        return self._node_c(lib.ggml_cross_entropy_loss, (a, b), a._ptr, b._ptr)

    def acc(self, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
        """``ggml_acc``: a copy of a with b added into the view of a that starts ``offset`` bytes
        into a's data with byte strides ``nb1..nb3`` (b's ne, F32 elements). a and b F32, a
        contiguous and at least as large as b. Raises TypeError for other types and ValueError
        when the view reaches outside a, ``offset`` is not in 0..2**30-1 or a stride is not in
        0..2**31-1 (ggml stores them as int32 op params and asserts the offset below 2**30)."""
        a, b = _t(a, "a"), _t(b, "b")
        _check_acc(a, b, nb1, nb2, nb3, offset)
        return self._node_c(lib.ggml_acc, (a, b), a._ptr, b._ptr, nb1, nb2, nb3, offset)

    def acc_inplace(self, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
        """``ggml_acc_inplace``: :meth:`acc` computed into a's memory (the result is a view of
        a). The same arguments, checks and errors as :meth:`acc`."""
        a, b = _t(a, "a"), _t(b, "b")
        _check_acc(a, b, nb1, nb2, nb3, offset)
        return self._node_c(lib.ggml_acc_inplace, (a, b), a._ptr, b._ptr, nb1, nb2, nb3, offset)

    def get_rel_pos(self, a: Tensor, qh: int, kh: int) -> Tensor:
        """``ggml_get_rel_pos`` (Segment Anything's relative positions): F16 ne [C, kh, qh] with
        ``result[:, k, q] = a[:, (kh - 1 - k) + q]`` from a contiguous F16 table ``a`` of ne
        [C, 2·qh - 1]. Raises TypeError unless a is F16 (ggml's result is F16; its CPU kernel
        copies BF16 bits unconverted and aborts on other types) and ValueError unless
        ``qh == kh >= 1``, ``a.ne[1] == 2·qh - 1`` (as ggml asserts), a is contiguous and a
        matrix."""
        a = _t(a, "a")
        if a._type != _F16:
            raise TypeError(f"get_rel_pos needs an F16 table, not {a.type_name}")
        qh, kh = int(qh), int(kh)
        if qh != kh or qh < 1 or qh > 2**30:
            raise ValueError(f"get_rel_pos: qh ({qh}) and kh ({kh}) must be equal and in 1..2**30")
        an = a._ne
        if an[1] != 2 * qh - 1 or an[2] != 1 or an[3] != 1 or not is_contiguous(a):
            raise ValueError(f"get_rel_pos: a (ne={list(an)}) must be a contiguous matrix of "
                             f"ne [C, 2*qh - 1 = {2 * qh - 1}]")
        _check_nelements((an[0], kh, qh, 1), "get_rel_pos")
        return self._node_c(lib.ggml_get_rel_pos, (a,), a._ptr, qh, kh)

    # ------------------------------------------------------------------ Python ops
    def map_custom(self, fn: Callable[..., None], *args: Tensor, n_tasks: int = -1) -> Tensor:
        """``ggml_map_custom{1,2,3}``: a node computed by the Python function
        ``fn(dst, *args, ith, nth)`` (all Tensors; NumPy views via :func:`host_array`). The
        result has ``args[0]``'s type and ne.

        ggml calls ``fn`` from ``nth`` CPU worker threads at once (``n_tasks``, -1 = all;
        the GIL serialises them): thread ``ith`` should do its share. On every one of those
        threads ``fn`` may use what the compute uses (read a tensor of the context, ask the
        backend), as on the thread that called the compute: the locks that call holds count as
        ``fn``'s (:class:`~pyggml.raw.threads.on_behalf`); closing or resetting the context or
        the backend from ``fn`` raises RuntimeError. An exception inside ``fn`` is re-raised by
        the compute call (:mod:`pyggml.raw.boundary`). CPU backend only.
        """
        if not 1 <= len(args) <= 3:
            raise ValueError("map_custom takes 1 to 3 source tensors")
        ts = [_t(t, f"args[{i}]") for i, t in enumerate(args)]
        if n_tasks != lib.GGML_N_TASKS_MAX and n_tasks < 1:
            raise ValueError("n_tasks must be -1 (all threads) or >= 1")

        def trampoline(dst: Any, *rest: Any) -> None:
            *srcs, ith, nth, _ud = rest
            scope = BorrowScope("a custom op")
            try:
                with threads.on_behalf(self):  # on a CPU worker thread: the locks its compute holds
                    fn(Tensor(dst, scope), *(Tensor(s, scope) for s in srcs), ith, nth)
            finally:
                scope.close()

        cb = callbacks.Callback(f"ggml_custom{len(ts)}_op_t", trampoline, owner=self)
        self._callbacks.append(cb)  # lives as long as the node, i.e. the context
        c_fn = (lib.ggml_map_custom1, lib.ggml_map_custom2, lib.ggml_map_custom3)[len(ts) - 1]
        return self._node_c(c_fn, ts, *(t._ptr for t in ts), cb.fn, n_tasks, cb.user_data)

    def arange(self, start: float, stop: float, step: float = 1.0) -> Tensor:
        """``ggml_arange``: F32 [ceil((stop - start) / step)], computed in float32 as ggml does.
        Raises ValueError unless start < stop and step > 0 (finite, in float32: ggml asserts
        stop > start whatever the step) and the count fits a tensor."""
        s0, s1, st = np.float32(start), np.float32(stop), np.float32(step)
        if not (np.isfinite(s0) and np.isfinite(s1) and np.isfinite(st) and s1 > s0 and st > 0):
            raise ValueError(f"arange({start}, {stop}, {step}): needs start < stop and step > 0 "
                             "(finite float32 values)")
        with np.errstate(over="ignore"):
            q = np.ceil(np.float32(s1 - s0) / st)  # ceilf((stop - start) / step)
        if not q <= _NE_SAFE:
            raise ValueError(f"arange({start}, {stop}, {step}) has {q} elements: too many for a tensor")
        n = int(q)
        self._reserve(n * 4)
        return self._node_c(lib.ggml_arange, (), float(s0), float(s1), float(st))


def _check_acc(a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> None:
    """ggml_acc_impl's asserts and what its int32 op params can hold, for :meth:`Ops.acc` and
    :meth:`Ops.acc_inplace`."""
    if a._type != _F32 or b._type != _F32:
        raise TypeError("acc needs F32 tensors")
    if not is_contiguous(a) or b.nelements > a.nelements:
        raise ValueError("acc needs a contiguous a at least as large as b")
    if not 0 <= offset < _ACC_MAX_OFFSET:
        raise ValueError(f"acc: offset {offset} is not in 0..2**30-1 (ggml stores it as an int32 "
                         "op param and asserts offset < 2**30)")
    if not all(0 <= nb <= _INT32_MAX for nb in (nb1, nb2, nb3)):
        raise ValueError(f"acc: strides {[nb1, nb2, nb3]} must be in 0..2**31-1 (ggml stores "
                         "them as int32 op params)")
    ne = b._ne
    last = offset + 4 * (ne[0] - 1) + (ne[1] - 1) * nb1 + (ne[2] - 1) * nb2 + (ne[3] - 1) * nb3
    if b.nelements and last + 4 > c_read(a, lib.ggml_nbytes):
        raise ValueError("acc: the view of b reaches outside a")


def _pool_op(op: str) -> int:
    ops = {"max": PoolOp.MAX, "avg": PoolOp.AVG}
    if op not in ops:
        raise ValueError(f"pool op must be 'max' or 'avg', not {op!r}")
    return ops[op]


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size, without its division by zero for s == 0."""
    if s < 1 or d < 1 or p < 0:
        raise ValueError("convolution strides and dilations must be >= 1, paddings >= 0")
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_sizes(kernel: Tensor, x: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                d1: int, is_2d: bool) -> tuple[int, int, int, int]:
    """Checks of ggml_im2col's arguments; the ne of its result (element count checked)."""
    if kernel.nelements == 0 or x.nelements == 0:
        raise ValueError("convolution of an empty tensor")
    if kernel._type not in (_F16, _F32) or x._type != _F32:
        raise TypeError("convolutions take an F16/F32 kernel and an F32 input")
    kn, xn = kernel._ne, x._ne
    if is_2d:
        if kn[2] != xn[2]:
            raise ValueError(f"kernel ne={list(kn)} and input ne={list(xn)}: channels (ne[2]) differ")
        if _conv_out(xn[1], kn[1], s1, p1, d1) < 1:
            raise ValueError("input too small for the kernel (dim 1)")
    else:
        if kn[1] != xn[1] or xn[3] != 1:
            raise ValueError(f"kernel ne={list(kn)} and input ne={list(xn)}: channels (ne[1]) differ")
    ow = _conv_out(xn[0], kn[0], s0, p0, d0)
    if ow < 1:
        raise ValueError("input too small for the kernel (dim 0)")
    if is_2d:
        ne = (kn[2] * kn[1] * kn[0], ow, _conv_out(xn[1], kn[1], s1, p1, d1), xn[3])
    else:
        ne = (kn[1] * kn[0], ow, xn[2], 1)
    _check_nelements(ne, "im2col")
    return ne


#: op names with a checked method of their own
_CHECKED = {n for n in vars(Ops) if not n.startswith("_") and n not in ("op", "unary")}
