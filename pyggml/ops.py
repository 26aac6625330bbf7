"""ggml op constructors as :class:`~pyggml.context.Context` methods, each checked first.

``ctx.op(a, ...)`` calls ``ggml_op(ctx, a, ...)`` and returns the result node as a
:class:`~pyggml.tensor.Tensor` living in ``ctx``. Before calling C, every method checks what
ggml would ``GGML_ASSERT`` on (shapes, types, contiguity, axes, free context memory) and raises
ValueError/TypeError/MemoryError instead of letting the process abort. Whether a backend can
*compute* a node (types it has kernels for) is checked when the graph is computed
(:meth:`pyggml.graph.Graph.compute`), with the backend's own ``supports_op``.

Every other op constructor of ggml.h is reachable as ``ctx.<name>(...)`` / :meth:`Ops.op`,
tried first in a forked copy of the process (see :mod:`pyggml._fork`). Shapes in docstrings are
ggml ``ne`` order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ._loader import ffi, lib

if TYPE_CHECKING:
    from .tensor import Tensor

__all__ = ["Ops", "UNARY_OPS", "host_array"]


def host_array(t: "Tensor") -> Any:
    """A NumPy view of a plain-type tensor's host memory, NumPy order (shape ``ne`` reversed,
    strides ``nb`` reversed), writable. No ownership checks: for code ggml calls while it owns
    the data (:meth:`Ops.map_custom` functions, Python backends). ValueError for quantized
    tensors or tensors without data."""
    from . import types
    from .tensor import _host_view

    p = t.ptr
    dtype = types.numpy_dtype(p.type)
    if dtype is None or p.data == ffi.NULL:
        raise ValueError(f"no NumPy view of a {t.type_name} tensor without data")
    return _host_view(t, dtype, t)

#: element-wise ops of one tensor, name -> ggml function (``ggml_unary`` family and friends)
UNARY_OPS = {name: getattr(lib, f"ggml_{name}") for name in (
    "neg", "abs", "sgn", "step", "tanh", "elu", "relu", "sigmoid", "gelu", "gelu_erf",
    "gelu_quick", "silu", "hardswish", "hardsigmoid", "exp", "sqr", "sqrt", "log", "sin", "cos",
    "floor", "ceil", "round", "trunc", "softplus", "expm1",
) if hasattr(lib, f"ggml_{name}")}

# unary ops implemented with ggml_unary (assert contiguous rows); the others have no assert
_UNARY_NEEDS_ROWS = {"neg", "abs", "sgn", "step", "tanh", "elu", "relu", "sigmoid", "gelu",
                     "gelu_erf", "gelu_quick", "silu", "hardswish", "hardsigmoid", "exp",
                     "floor", "ceil", "round", "trunc", "softplus", "expm1"}


def _tensor(x: Any, what: str) -> "Tensor":
    from .tensor import Tensor

    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a pyggml Tensor, not {type(x).__name__}")
    x.ptr  # raises ClosedError if its context is closed
    return x


_CONSTRUCTORS: set[str] = set()


def _op_constructors() -> set[str]:
    """Names (without ``ggml_``) of ggml.h functions ``struct ggml_tensor * f(struct
    ggml_context *, ...)`` that make a node."""
    if not _CONSTRUCTORS:
        for n in dir(lib):
            if not n.startswith("ggml_") or n.startswith(("ggml_new_", "ggml_get_", "ggml_graph_")):
                continue
            t = ffi.typeof(getattr(lib, n))
            if (t.kind == "function" and t.result.cname == "struct ggml_tensor *" and t.args
                    and t.args[0].cname == "struct ggml_context *"):
                _CONSTRUCTORS.add(n[5:])
    return _CONSTRUCTORS


def _divides(d: int, n: int) -> bool:
    """``n % d == 0`` as ggml writes it, without its division by zero (SIGFPE) for d == 0."""
    return d > 0 and n % d == 0


def _can_repeat(small: "Tensor", big: "Tensor") -> bool:
    """ggml_can_repeat: ``small`` tiles ``big`` (each big.ne[i] a multiple of small.ne[i])."""
    if lib.ggml_is_empty(small.ptr):
        return lib.ggml_is_empty(big.ptr)
    return all(b % s == 0 for s, b in zip(small.ne, big.ne))


class Ops:
    """Mixin of op constructors; ``self`` is a Context."""

    _trial_ops: set[int]

    def _op(self, fn: Any, inputs: Sequence["Tensor"], *args: Any, n_objects: int = 1) -> "Tensor":
        """Call ``fn(ctx, *args)`` with the context's free space checked first.

        The node is made with allocation switched off, so its data size is known before any
        data is taken from the arena; an allocating context then gets ``ggml_new_buffer``.
        """
        self._reserve(0, n_objects=n_objects)  # type: ignore[attr-defined]
        ctx = self.ptr  # type: ignore[attr-defined]
        alloc = not lib.ggml_get_no_alloc(ctx)
        if alloc:
            lib.ggml_set_no_alloc(ctx, True)
        try:
            ptr = fn(ctx, *args)
        finally:
            if alloc:
                lib.ggml_set_no_alloc(ctx, False)
        if alloc:
            # the new node and any intermediate node the C function made (conv_2d makes im2col,
            # reshapes, a mul_mat...): all reachable from the result without data yet
            todo, seen = [ptr], set()
            while todo:
                p = todo.pop()
                key = int(ffi.cast("uintptr_t", p))
                if p == ffi.NULL or key in seen or p.data != ffi.NULL:
                    continue
                seen.add(key)
                todo.extend(p.src)
                if p.view_src != ffi.NULL:
                    todo.append(p.view_src)
            for p in _by_creation(seen):
                if p.data == ffi.NULL and p.view_src == ffi.NULL:
                    nbytes = lib.ggml_nbytes(p)
                    self._reserve(nbytes, n_objects=1)  # type: ignore[attr-defined]
                    p.data = lib.ggml_new_buffer(ctx, nbytes)
                elif p.data == ffi.NULL and p.view_src.data != ffi.NULL:
                    p.data = ffi.cast("char *", p.view_src.data) + p.view_offs
        return self._wrap(ptr, inputs)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ element-wise
    def unary(self, name: str, a: "Tensor") -> "Tensor":
        """Element-wise op ``name`` (a key of :data:`UNARY_OPS`, e.g. ``"gelu_erf"``)."""
        a = _tensor(a, "a")
        if name not in UNARY_OPS:
            raise ValueError(f"unknown unary op {name!r}; known: {sorted(UNARY_OPS)}")
        if name in _UNARY_NEEDS_ROWS and not lib.ggml_is_contiguous_rows(a.ptr):
            raise ValueError(f"{name} needs a tensor with contiguous rows: use cont() first")
        return self._op(UNARY_OPS[name], [a], a.ptr)

    def __getattr__(self, name: str) -> Any:
        if name in UNARY_OPS:
            return lambda a: self.unary(name, a)
        if not name.startswith("_") and name in _op_constructors():
            return lambda *args: self.op(name, *args)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def op(self, name: str, *args: Any) -> "Tensor":
        """Any op constructor of ggml.h, ``ggml_<name>(ctx, *args)``, e.g.
        ``ctx.op("conv_transpose_1d", a, b, 1, 0, 1)``; Tensors are passed as their pointers.

        Ops with a method of their own are checked by it. For the others pyggml knows no
        conditions: the call is first tried in a forked copy of the process, and if ggml aborts
        there, ValueError carries its message (graphs holding such nodes get the same trial
        before their first CPU compute). Raises AttributeError for a name that is not an op.
        """
        from ._fork import trial
        from .tensor import Tensor

        if name in _CHECKED or name in UNARY_OPS:
            return getattr(self, name)(*args)
        if name not in _op_constructors():
            raise AttributeError(f"ggml_{name} is not an op constructor of ggml.h")
        fn = getattr(lib, f"ggml_{name}")
        inputs = [a for a in args if isinstance(a, Tensor)]
        c_args = [_tensor(a, "argument").ptr if isinstance(a, Tensor) else a for a in args]
        self._reserve(0, n_objects=8)  # type: ignore[attr-defined]
        ctx = self.ptr  # type: ignore[attr-defined]
        failure = trial(lambda: fn(ctx, *c_args))
        if failure is not None:
            raise ValueError(f"ggml_{name} would abort the process: {failure}")
        out = self._op(fn, inputs, *c_args, n_objects=8)
        self._trial_ops.add(out.ptr.op)  # type: ignore[attr-defined]
        return out

    def _binary(self, fn: Any, a: "Tensor", b: "Tensor") -> "Tensor":
        a, b = _tensor(a, "a"), _tensor(b, "b")
        if not _can_repeat(b, a):
            raise ValueError(f"b (ne={list(b.ne)}) does not tile a (ne={list(a.ne)}): ggml "
                             "broadcasts by repeating b, so each a.ne[i] must be a multiple of b.ne[i]")
        return self._op(fn, [a, b], a.ptr, b.ptr)

    def add(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_add``: a + b, b tiled over a (ggml broadcasting). Result has a's ne and type."""
        return self._binary(lib.ggml_add, a, b)

    def sub(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_sub``: a - b, b tiled over a."""
        return self._binary(lib.ggml_sub, a, b)

    def mul(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_mul``: a * b element-wise, b tiled over a."""
        return self._binary(lib.ggml_mul, a, b)

    def div(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_div``: a / b element-wise, b tiled over a."""
        return self._binary(lib.ggml_div, a, b)

    def scale(self, a: "Tensor", s: float) -> "Tensor":
        """``ggml_scale``: a * s. a must be padded-1d (contiguous rows packed)."""
        a = _tensor(a, "a")
        ne, nb = a.ne, a.nb
        # ggml_is_padded_1d (static in ggml.c)
        if not (nb[0] == lib.ggml_type_size(a.type) and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]):
            raise ValueError("scale needs a tensor whose rows are packed: use cont() first")
        return self._op(lib.ggml_scale, [a], a.ptr, float(s))

    def clamp(self, a: "Tensor", min: float, max: float) -> "Tensor":
        """``ggml_clamp``: a clipped to [min, max] (a view computed in place)."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_clamp, [a], a.ptr, float(min), float(max))

    def leaky_relu(self, a: "Tensor", negative_slope: float) -> "Tensor":
        """``ggml_leaky_relu``."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_leaky_relu, [a], a.ptr, float(negative_slope), False)

    # ------------------------------------------------------------------ reductions
    def sum(self, a: "Tensor") -> "Tensor":
        """``ggml_sum``: sum of all elements, ne [1, 1, 1, 1]."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_sum, [a], a.ptr)

    def sum_rows(self, a: "Tensor") -> "Tensor":
        """``ggml_sum_rows``: ne [n0, n1, n2, n3] -> [1, n1, n2, n3]."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_sum_rows, [a], a.ptr)

    def mean(self, a: "Tensor") -> "Tensor":
        """``ggml_mean``: mean along ne[0]: [n0, n1, n2, n3] -> [1, n1, n2, n3]."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_mean, [a], a.ptr)

    def argmax(self, a: "Tensor") -> "Tensor":
        """``ggml_argmax``: index of the largest value of each row, I32 [n1]. a must be a matrix."""
        a = _tensor(a, "a")
        if a.ne[2] != 1 or a.ne[3] != 1 or a.ne[0] > 2**31 - 1:
            raise ValueError("argmax needs a matrix (ne[2] == ne[3] == 1)")
        return self._op(lib.ggml_argmax, [a], a.ptr)

    def repeat(self, a: "Tensor", like: "Tensor") -> "Tensor":
        """``ggml_repeat``: a tiled to ``like``'s ne."""
        a, like = _tensor(a, "a"), _tensor(like, "like")
        if not _can_repeat(a, like):
            raise ValueError(f"a (ne={list(a.ne)}) does not tile ne={list(like.ne)}")
        return self._op(lib.ggml_repeat, [a, like], a.ptr, like.ptr)

    # ------------------------------------------------------------------ normalisation
    def norm(self, a: "Tensor", eps: float = 1e-5) -> "Tensor":
        """``ggml_norm``: (a - mean) / sqrt(var + eps) along ne[0]."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_norm, [a], a.ptr, float(eps))

    def rms_norm(self, a: "Tensor", eps: float = 1e-6) -> "Tensor":
        """``ggml_rms_norm``: a / sqrt(mean(a²) + eps) along ne[0]."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_rms_norm, [a], a.ptr, float(eps))

    def l2_norm(self, a: "Tensor", eps: float = 1e-12) -> "Tensor":
        """``ggml_l2_norm``: a / max(‖a‖₂, eps) along ne[0]."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_l2_norm, [a], a.ptr, float(eps))

    def soft_max(self, a: "Tensor", mask: "Tensor | None" = None, scale: float = 1.0,
                 max_bias: float = 0.0) -> "Tensor":
        """``ggml_soft_max_ext``: softmax(a * scale + mask) along ne[0].

        a must be contiguous; mask (F32 or F16, contiguous) has ne [a.ne0, >= a.ne1, d2, d3]
        with a.ne2 % d2 == 0 and a.ne3 % d3 == 0. ``max_bias`` > 0 (ALiBi) needs a mask.
        """
        a = _tensor(a, "a")
        if not a.is_contiguous():
            raise ValueError("soft_max needs a contiguous tensor: use cont() first")
        if mask is not None:
            mask = _tensor(mask, "mask")
            if mask.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16):
                raise TypeError("soft_max mask must be F32 or F16")
            if not mask.is_contiguous():
                raise ValueError("soft_max mask must be contiguous")
            m, n = mask.ne, a.ne
            if m[0] != n[0] or m[1] < n[1] or not _divides(m[2], n[2]) or not _divides(m[3], n[3]):
                raise ValueError(f"mask ne={list(m)} does not fit a ne={list(n)}")
        elif max_bias > 0:
            raise ValueError("max_bias > 0 needs a mask")
        return self._op(lib.ggml_soft_max_ext, [a] + ([mask] if mask is not None else []), a.ptr,
                        mask.ptr if mask is not None else ffi.NULL, float(scale), float(max_bias))

    # ------------------------------------------------------------------ matrix
    def mul_mat(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_mul_mat``: ne [K, M, d2, d3] x [K, N, e2, e3] -> F32 [M, N, e2, e3], i.e.
        result[n, m] = Σ_k a[m, k]·b[n, k] in NumPy order (``b @ a.T``); a's batch dims are
        broadcast (e2 % d2 == 0, e3 % d3 == 0). a must not be transposed.
        """
        a, b = _tensor(a, "a"), _tensor(b, "b")
        if a.ne[0] != b.ne[0] or not _divides(a.ne[2], b.ne[2]) or not _divides(a.ne[3], b.ne[3]):
            raise ValueError(f"cannot mul_mat a ne={list(a.ne)} with b ne={list(b.ne)}: needs "
                             "a.ne0 == b.ne0 and b.ne2/ne3 multiples of a.ne2/ne3")
        if a.is_transposed():
            raise ValueError("mul_mat: a must not be transposed (use cont())")
        return self._op(lib.ggml_mul_mat, [a, b], a.ptr, b.ptr)

    def out_prod(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_out_prod``: ne [M, K] x [N, K] -> [M, N] (Σ_k a[k, m]·b[k, n] in ggml order)."""
        a, b = _tensor(a, "a"), _tensor(b, "b")
        if a.ne[1] != b.ne[1] or not _divides(a.ne[2], b.ne[2]) or not _divides(a.ne[3], b.ne[3]) or a.is_transposed():
            raise ValueError(f"cannot out_prod a ne={list(a.ne)} with b ne={list(b.ne)}")
        return self._op(lib.ggml_out_prod, [a, b], a.ptr, b.ptr)

    # ------------------------------------------------------------------ shape ops (views)
    def cont(self, a: "Tensor") -> "Tensor":
        """``ggml_cont``: a contiguous copy of a."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_cont, [a], a.ptr)

    def cpy(self, a: "Tensor", b: "Tensor") -> "Tensor":
        """``ggml_cpy``: copy a into b (converting the type); returns a view of b."""
        a, b = _tensor(a, "a"), _tensor(b, "b")
        if a.nelements != b.nelements:
            raise ValueError(f"cpy: {a.nelements} elements into {b.nelements}")
        return self._op(lib.ggml_cpy, [a, b], a.ptr, b.ptr)

    def cast(self, a: "Tensor", type: int) -> "Tensor":
        """``ggml_cast``: a converted to ggml ``type``."""
        from . import types

        a = _tensor(a, "a")
        if a.ne[0] % types.block_size(type):
            raise ValueError("ne[0] is not a multiple of the target type's block size")
        return self._op(lib.ggml_cast, [a], a.ptr, type, n_objects=2)

    def reshape(self, a: "Tensor", *ne: int) -> "Tensor":
        """``ggml_reshape_{1..4}d``: a view of contiguous ``a`` with ``ne`` (ggml order)."""
        a = _tensor(a, "a")
        ne = tuple(int(n) for n in ne)
        if not 1 <= len(ne) <= 4:
            raise ValueError("reshape takes 1 to 4 sizes")
        if not a.is_contiguous():
            raise ValueError("reshape needs a contiguous tensor: use cont() first")
        if any(n < 0 for n in ne) or _prod(ne) != a.nelements:
            raise ValueError(f"cannot reshape {a.nelements} elements to ne={list(ne)}")
        fn = (lib.ggml_reshape_1d, lib.ggml_reshape_2d, lib.ggml_reshape_3d, lib.ggml_reshape_4d)[len(ne) - 1]
        return self._op(fn, [a], a.ptr, *ne)

    def view(self, a: "Tensor", ne: Sequence[int], nb: Sequence[int] | None = None,
             offset: int = 0) -> "Tensor":
        """``ggml_view_{1..4}d``: a view of ``a`` with ``ne`` (ggml order), byte strides ``nb``
        for dims 1.. (default: a's row strides) starting ``offset`` bytes into a's data.
        Raises ValueError if the view reaches outside a."""
        from . import types

        a = _tensor(a, "a")
        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= 4 or any(n < 0 for n in ne) or offset < 0:
            raise ValueError("view takes 1 to 4 non-negative sizes and offset >= 0")
        if ne[0] % types.block_size(a.type):
            raise ValueError("view: ne[0] is not a multiple of the block size")
        if nb is None:
            nb = a.nb[1:len(ne)]
        nb = [int(x) for x in nb]
        if len(nb) != len(ne) - 1 or any(x < 0 for x in nb):
            raise ValueError(f"view of {len(ne)} dims takes {len(ne) - 1} strides")
        # as ggml_new_tensor_impl: the view's contiguous size, whatever its strides
        size = types.row_size(a.type, ne[0]) * _prod(ne[1:])
        if size and offset + size > a.nbytes:
            raise ValueError(f"view of {size} bytes at offset {offset} reaches outside a ({a.nbytes} bytes)")
        if len(ne) == 1:
            return self._op(lib.ggml_view_1d, [a], a.ptr, ne[0], offset)
        fn = (lib.ggml_view_2d, lib.ggml_view_3d, lib.ggml_view_4d)[len(ne) - 2]
        return self._op(fn, [a], a.ptr, *ne, *nb, offset)

    def permute(self, a: "Tensor", *axes: int) -> "Tensor":
        """``ggml_permute``: dim i of a becomes dim ``axes[i]`` (ggml order); 2 to 4 axes
        (missing ones stay in place)."""
        a = _tensor(a, "a")
        axes = tuple(int(x) for x in axes) + tuple(range(len(axes), 4))
        if sorted(axes) != [0, 1, 2, 3]:
            raise ValueError(f"permute axes {axes[:4]} are not a permutation of 0..3")
        return self._op(lib.ggml_permute, [a], a.ptr, *axes)

    def transpose(self, a: "Tensor") -> "Tensor":
        """``ggml_transpose``: swap ne[0] and ne[1] (a view)."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_transpose, [a], a.ptr)

    def concat(self, a: "Tensor", b: "Tensor", dim: int) -> "Tensor":
        """``ggml_concat``: a and b joined along ggml dim ``dim``; other dims and types must match."""
        a, b = _tensor(a, "a"), _tensor(b, "b")
        if not 0 <= dim < 4:
            raise ValueError("concat dim must be 0..3")
        if a.type != b.type:
            raise TypeError("concat: a and b must have the same type")
        if any(a.ne[d] != b.ne[d] for d in range(4) if d != dim):
            raise ValueError(f"concat along {dim}: ne {list(a.ne)} and {list(b.ne)} differ elsewhere")
        return self._op(lib.ggml_concat, [a, b], a.ptr, b.ptr, dim)

    # ------------------------------------------------------------------ indexing
    def get_rows(self, a: "Tensor", rows: "Tensor") -> "Tensor":
        """``ggml_get_rows``: rows of a (ne [n0, n1, n2, n3]) picked by I32 ``rows``
        (ne [k, n2, n3]) -> ne [n0, k, n2, n3], F32 for quantized a."""
        a, rows = _tensor(a, "a"), _tensor(rows, "rows")
        if rows.type != lib.GGML_TYPE_I32:
            raise TypeError("get_rows: the row indices must be I32")
        if a.ne[2] != rows.ne[1] or a.ne[3] != rows.ne[2] or rows.ne[3] != 1:
            raise ValueError(f"get_rows: rows ne={list(rows.ne)} do not fit a ne={list(a.ne)}")
        return self._op(lib.ggml_get_rows, [a, rows], a.ptr, rows.ptr)

    def set_rows(self, a: "Tensor", b: "Tensor", rows: "Tensor") -> "Tensor":
        """``ggml_set_rows``: write the rows of b (F32/F16) into a at I32/I64 indices ``rows``;
        returns a view of a."""
        a, b, rows = _tensor(a, "a"), _tensor(b, "b"), _tensor(rows, "rows")
        if b.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16):
            raise TypeError("set_rows: b must be F32 or F16")
        if rows.type not in (lib.GGML_TYPE_I32, lib.GGML_TYPE_I64):
            raise TypeError("set_rows: the row indices must be I32 or I64")
        ok = (a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3]
              and b.ne[1] == rows.ne[0] and _divides(rows.ne[1], b.ne[2]) and _divides(rows.ne[2], b.ne[3])
              and rows.ne[3] == 1)
        if not ok:
            raise ValueError(f"set_rows: a ne={list(a.ne)}, b ne={list(b.ne)}, rows ne={list(rows.ne)} do not fit")
        if not (lib.ggml_is_contiguous_rows(a.ptr) and lib.ggml_is_contiguous_rows(b.ptr)):
            raise ValueError("set_rows: a and b need contiguous rows")
        return self._op(lib.ggml_set_rows, [a, b, rows], a.ptr, b.ptr, rows.ptr)

    def diag_mask_inf(self, a: "Tensor", n_past: int) -> "Tensor":
        """``ggml_diag_mask_inf``: -inf above the diagonal shifted by ``n_past`` (causal mask)."""
        a = _tensor(a, "a")
        return self._op(lib.ggml_diag_mask_inf, [a], a.ptr, int(n_past))

    # ------------------------------------------------------------------ transformer pieces
    def rope(self, a: "Tensor", pos: "Tensor", n_dims: int, mode: int = 0, n_ctx_orig: int = 0,
             freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
             attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
             freq_factors: "Tensor | None" = None) -> "Tensor":
        """``ggml_rope_ext``: rotary embedding of a (ne [head_dim, n_head, n_tokens, ...]) at
        I32 positions ``pos`` (ne [n_tokens]). ``mode`` 0 (normal) or ``GGML_ROPE_TYPE_NEOX``."""
        a, pos = _tensor(a, "a"), _tensor(pos, "pos")
        if mode & 1:
            raise ValueError("rope mode & 1 is no longer supported by ggml")
        if mode & lib.GGML_ROPE_TYPE_MROPE:
            raise ValueError("multi-section rope: use pyggml.lib.ggml_rope_multi")
        if pos.type != lib.GGML_TYPE_I32 or pos.n_dims != 1 or pos.ne[0] != a.ne[2]:
            raise ValueError(f"rope: pos must be an I32 vector of a.ne[2]={a.ne[2]} positions")
        if not 0 < n_dims <= a.ne[0] or n_dims % 2:
            raise ValueError("rope: n_dims must be even and in 1..a.ne[0]")
        c = ffi.NULL
        inputs = [a, pos]
        if freq_factors is not None:
            freq_factors = _tensor(freq_factors, "freq_factors")
            if freq_factors.type != lib.GGML_TYPE_F32 or freq_factors.ne[0] < n_dims // 2:
                raise ValueError("rope: freq_factors must be F32 with >= n_dims/2 entries")
            c = freq_factors.ptr
            inputs.append(freq_factors)
        return self._op(lib.ggml_rope_ext, inputs, a.ptr, pos.ptr, c, n_dims, mode, n_ctx_orig,
                        freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)

    def _glu(self, fn: Any, fn_split: Any, a: "Tensor", b: "Tensor | None") -> "Tensor":
        a = _tensor(a, "a")
        if not lib.ggml_is_contiguous_1(a.ptr):
            raise ValueError("glu ops need a contiguous tensor")
        if b is None:
            if a.ne[0] % 2:
                raise ValueError("glu on one tensor needs an even ne[0] (it is split in halves)")
            return self._op(fn, [a], a.ptr)
        b = _tensor(b, "b")
        if not lib.ggml_is_contiguous_1(b.ptr) or a.ne != b.ne or a.type != b.type:
            raise ValueError("glu on two tensors needs contiguous tensors of the same ne and type")
        return self._op(fn_split, [a, b], a.ptr, b.ptr)

    def swiglu(self, a: "Tensor", b: "Tensor | None" = None) -> "Tensor":
        """``ggml_swiglu`` (a split in halves: silu(x)·g) or ``ggml_swiglu_split`` (silu(a)·b)."""
        return self._glu(lib.ggml_swiglu, lib.ggml_swiglu_split, a, b)

    def geglu(self, a: "Tensor", b: "Tensor | None" = None) -> "Tensor":
        """``ggml_geglu`` / ``ggml_geglu_split``: gelu(x)·g."""
        return self._glu(lib.ggml_geglu, lib.ggml_geglu_split, a, b)

    def argsort(self, a: "Tensor", descending: bool = False) -> "Tensor":
        """``ggml_argsort``: I32 indices sorting each row of a."""
        a = _tensor(a, "a")
        if a.ne[0] > 2**31 - 1:
            raise ValueError("argsort rows are limited to 2**31-1 elements")
        order = lib.GGML_SORT_ORDER_DESC if descending else lib.GGML_SORT_ORDER_ASC
        return self._op(lib.ggml_argsort, [a], a.ptr, order)

    # ------------------------------------------------------------------ more model ops
    def pad(self, a: "Tensor", p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0,
            *, left: Sequence[int] = (0, 0, 0, 0)) -> "Tensor":
        """``ggml_pad_ext``: zero padding, ``p<i>`` elements after and ``left[i]`` before dim i."""
        a = _tensor(a, "a")
        right, left = [int(p0), int(p1), int(p2), int(p3)], [int(x) for x in left]
        if len(left) != 4 or min(right + left) < 0:
            raise ValueError("pad sizes must be >= 0 (and left has 4 entries)")
        args = [x for pair in zip(left, right) for x in pair]
        return self._op(lib.ggml_pad_ext, [a], a.ptr, *args)

    def interpolate(self, a: "Tensor", ne: Sequence[int], mode: int = 0) -> "Tensor":
        """``ggml_interpolate``: resize F32 ``a`` to ``ne`` (4 sizes, ggml order);
        ``mode`` ``GGML_SCALE_MODE_NEAREST`` / ``_BILINEAR`` / ``_BICUBIC`` (+ flags)."""
        a = _tensor(a, "a")
        ne = [int(n) for n in ne]
        if a.type != lib.GGML_TYPE_F32:
            raise TypeError("interpolate needs an F32 tensor")
        if len(ne) != 4 or min(ne) < 1:
            raise ValueError("interpolate takes 4 sizes >= 1")
        if (mode & 0xFF) >= lib.GGML_SCALE_MODE_COUNT or (
                mode & lib.GGML_SCALE_FLAG_ANTIALIAS and (mode & 0xFF) != lib.GGML_SCALE_MODE_BILINEAR):
            raise ValueError(f"bad interpolate mode {mode:#x}")
        return self._op(lib.ggml_interpolate, [a], a.ptr, *ne, mode)

    def im2col(self, kernel: "Tensor", x: "Tensor", s0: int, s1: int, p0: int, p1: int,
               d0: int, d1: int, is_2d: bool, type: int = lib.GGML_TYPE_F16) -> "Tensor":
        """``ggml_im2col``: the patches of ``x`` a convolution with ``kernel`` multiplies."""
        kernel, x = _tensor(kernel, "kernel"), _tensor(x, "x")
        _conv_sizes(kernel, x, s0, s1, p0, p1, d0, d1, is_2d)
        if type not in (lib.GGML_TYPE_F16, lib.GGML_TYPE_F32):
            raise TypeError("im2col output must be F16 or F32")
        return self._op(lib.ggml_im2col, [kernel, x], kernel.ptr, x.ptr, s0, s1, p0, p1, d0, d1, is_2d, type)

    def conv_1d(self, kernel: "Tensor", x: "Tensor", s0: int = 1, p0: int = 0, d0: int = 1) -> "Tensor":
        """``ggml_conv_1d``: kernel ne [K, IC, OC] over x ne [L, IC, N] -> [OL, OC, N]."""
        kernel, x = _tensor(kernel, "kernel"), _tensor(x, "x")
        _conv_sizes(kernel, x, s0, 0, p0, 0, d0, 0, False)
        if not kernel.is_contiguous():
            raise ValueError("conv kernel must be contiguous")
        return self._op(lib.ggml_conv_1d, [kernel, x], kernel.ptr, x.ptr, s0, p0, d0, n_objects=6)

    def conv_2d(self, kernel: "Tensor", x: "Tensor", s0: int = 1, s1: int = 1, p0: int = 0,
                p1: int = 0, d0: int = 1, d1: int = 1) -> "Tensor":
        """``ggml_conv_2d``: kernel ne [KW, KH, IC, OC] over x ne [W, H, IC, N] -> [OW, OH, OC, N]."""
        kernel, x = _tensor(kernel, "kernel"), _tensor(x, "x")
        _conv_sizes(kernel, x, s0, s1, p0, p1, d0, d1, True)
        if not kernel.is_contiguous():
            raise ValueError("conv kernel must be contiguous")
        return self._op(lib.ggml_conv_2d, [kernel, x], kernel.ptr, x.ptr, s0, s1, p0, p1, d0, d1, n_objects=8)

    def pool_1d(self, a: "Tensor", op: str, k0: int, s0: int, p0: int = 0) -> "Tensor":
        """``ggml_pool_1d``: ``op`` "max" or "avg" over windows of ``k0`` along ne[0]."""
        a = _tensor(a, "a")
        if s0 < 1 or k0 < 1 or p0 < 0 or (a.ne[0] + 2 * p0 - k0) // s0 + 1 < 1:
            raise ValueError("pool_1d: kernel, stride and padding leave no output")
        return self._op(lib.ggml_pool_1d, [a], a.ptr, _pool_op(op), k0, s0, p0)

    def pool_2d(self, a: "Tensor", op: str, k0: int, k1: int, s0: int, s1: int,
                p0: float = 0.0, p1: float = 0.0) -> "Tensor":
        """``ggml_pool_2d``: ``op`` "max" or "avg" over k0 x k1 windows of dims 0 and 1."""
        a = _tensor(a, "a")
        ok = min(s0, s1, k0, k1) >= 1 and min(p0, p1) >= 0
        if not ok or (a.ne[0] + 2 * p0 - k0) // s0 + 1 < 1 or (a.ne[1] + 2 * p1 - k1) // s1 + 1 < 1:
            raise ValueError("pool_2d: kernel, stride and padding leave no output")
        return self._op(lib.ggml_pool_2d, [a], a.ptr, _pool_op(op), k0, k1, s0, s1, float(p0), float(p1))

    def flash_attn(self, q: "Tensor", k: "Tensor", v: "Tensor", mask: "Tensor | None" = None,
                   scale: float = 1.0, max_bias: float = 0.0, logit_softcap: float = 0.0) -> "Tensor":
        """``ggml_flash_attn_ext``: softmax(scale·K Qᵀ + mask) V fused. q ne [D, n_q, H, B],
        k ne [D, n_kv, H_kv, B], v ne [Dv, n_kv, H_kv, B] (H % H_kv == 0), mask F16
        [n_kv, >= n_q, ...] -> F32 ne [Dv, H, n_q, B]."""
        q, k, v = _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v")
        if k.ne[0] != q.ne[0] or not _divides(k.ne[2], q.ne[2]) or not _divides(k.ne[3], q.ne[3]):
            raise ValueError(f"flash_attn: k ne={list(k.ne)} does not fit q ne={list(q.ne)}")
        if not q.ne[3] == k.ne[3] == v.ne[3] or v.ne[1] != k.ne[1] or v.ne[2] != k.ne[2]:
            raise ValueError("flash_attn: q, k and v batch/kv sizes differ")
        inputs = [q, k, v]
        if mask is not None:
            mask = _tensor(mask, "mask")
            if mask.type != lib.GGML_TYPE_F16 or not mask.is_contiguous():
                raise TypeError("flash_attn mask must be a contiguous F16 tensor")
            if mask.ne[0] != k.ne[1] or mask.ne[1] < q.ne[1] or not _divides(mask.ne[2], q.ne[2]) or not _divides(mask.ne[3], q.ne[3]):
                raise ValueError(f"flash_attn: mask ne={list(mask.ne)} does not fit")
            inputs.append(mask)
        elif max_bias > 0:
            raise ValueError("max_bias > 0 needs a mask")
        return self._op(lib.ggml_flash_attn_ext, inputs, q.ptr, k.ptr, v.ptr,
                        mask.ptr if mask is not None else ffi.NULL, float(scale), float(max_bias), float(logit_softcap))

    def top_k(self, a: "Tensor", k: int) -> "Tensor":
        """``ggml_top_k``: I32 indices of the ``k`` largest values of each row."""
        a = _tensor(a, "a")
        if not 1 <= k <= a.ne[0]:
            raise ValueError(f"top_k: k must be in 1..{a.ne[0]}")
        return self._op(lib.ggml_top_k, [a], a.ptr, int(k), n_objects=2)

    def cumsum(self, a: "Tensor") -> "Tensor":
        """``ggml_cumsum``: running sum along ne[0] (F32)."""
        a = _tensor(a, "a")
        if a.type != lib.GGML_TYPE_F32:
            raise TypeError("cumsum needs an F32 tensor")
        return self._op(lib.ggml_cumsum, [a], a.ptr)

    def timestep_embedding(self, timesteps: "Tensor", dim: int, max_period: int = 10000) -> "Tensor":
        """``ggml_timestep_embedding``: sinusoidal embeddings [dim, n] of F32 timesteps [n]."""
        t = _tensor(timesteps, "timesteps")
        if dim < 1 or max_period < 1 or t.n_dims != 1:
            raise ValueError("timestep_embedding: dim, max_period >= 1 and a vector of timesteps")
        return self._op(lib.ggml_timestep_embedding, [t], t.ptr, int(dim), int(max_period))

    def cross_entropy_loss(self, logits: "Tensor", labels: "Tensor") -> "Tensor":
        """``ggml_cross_entropy_loss``: mean over rows of -Σ labels·log softmax(logits)
        (same shape, F32) -> scalar F32."""
        a, b = _tensor(logits, "logits"), _tensor(labels, "labels")
        if a.ne != b.ne:
            raise ValueError("cross_entropy_loss: logits and labels must have the same shape")
        return self._op(lib.ggml_cross_entropy_loss, [a, b], a.ptr, b.ptr)

    def acc(self, a: "Tensor", b: "Tensor", nb1: int, nb2: int, nb3: int, offset: int) -> "Tensor":
        """``ggml_acc``: a copy of a with b added into the view (strides nb1..nb3, byte offset)."""
        a, b = _tensor(a, "a"), _tensor(b, "b")
        if a.type != lib.GGML_TYPE_F32 or b.type != lib.GGML_TYPE_F32:
            raise TypeError("acc needs F32 tensors")
        if not a.is_contiguous() or b.nelements > a.nelements:
            raise ValueError("acc needs a contiguous a at least as large as b")
        ne = b.ne
        last = offset + 4 * (ne[0] - 1) + (ne[1] - 1) * nb1 + (ne[2] - 1) * nb2 + (ne[3] - 1) * nb3
        if b.nelements and (offset < 0 or min(nb1, nb2, nb3) < 0 or last + 4 > a.nbytes):
            raise ValueError("acc: the view of b reaches outside a")
        return self._op(lib.ggml_acc, [a, b], a.ptr, b.ptr, nb1, nb2, nb3, offset)

    # ------------------------------------------------------------------ Python ops
    def map_custom(self, fn: Any, *args: "Tensor", n_tasks: int = -1) -> "Tensor":
        """``ggml_map_custom{1,2,3}``: a node computed by the Python function
        ``fn(dst, *args, ith, nth)`` (all Tensors; NumPy views via ``.numpy(copy=False)`` or
        :func:`pyggml.ops.host_array`). The result has ``args[0]``'s type and ne.

        ggml calls ``fn`` from ``nth`` CPU worker threads at once (``n_tasks``, -1 = all;
        the GIL serialises them): thread ``ith`` should do its share. An exception inside
        ``fn`` is re-raised by :meth:`pyggml.graph.Graph.compute`. CPU backend only.
        """
        from . import callbacks

        if not 1 <= len(args) <= 3:
            raise ValueError("map_custom takes 1 to 3 source tensors")
        ts = [_tensor(t, f"args[{i}]") for i, t in enumerate(args)]
        if n_tasks != lib.GGML_N_TASKS_MAX and n_tasks < 1:
            raise ValueError("n_tasks must be -1 (all threads) or >= 1")
        ctx = self

        def trampoline(dst: Any, *rest: Any) -> None:
            *srcs, ith, nth, _ud = rest
            try:
                fn(ctx._wrap(dst), *(ctx._wrap(s) for s in srcs), ith, nth)
            except BaseException as e:
                ctx._custom_errors.append(e)  # worker threads: re-raised by Graph.compute
                raise

        cb = callbacks.Callback(f"ggml_custom{len(ts)}_op_t", trampoline)
        self._callbacks.append(cb)  # type: ignore[attr-defined]  # lives as long as the node
        c_fn = (lib.ggml_map_custom1, lib.ggml_map_custom2, lib.ggml_map_custom3)[len(ts) - 1]
        return self._op(c_fn, ts, *(t.ptr for t in ts), cb.fn, n_tasks, cb.user_data)

    def arange(self, start: float, stop: float, step: float = 1.0) -> "Tensor":
        """``ggml_arange``: F32 [ceil((stop - start) / step)]."""
        if step == 0 or (stop - start) / step <= 0:
            raise ValueError("arange: empty or infinite range")
        n = -(-(stop - start) // step)
        self._reserve(int(n) * 4)  # type: ignore[attr-defined]
        return self._op(lib.ggml_arange, [], float(start), float(stop), float(step))


def _by_creation(addresses: set[int]) -> list[Any]:
    """Tensors (by address) in the order ggml made them: arena addresses grow."""
    return [ffi.cast("struct ggml_tensor *", a) for a in sorted(addresses)]


def _pool_op(op: str) -> int:
    ops = {"max": lib.GGML_OP_POOL_MAX, "avg": lib.GGML_OP_POOL_AVG}
    if op not in ops:
        raise ValueError(f"pool op must be 'max' or 'avg', not {op!r}")
    return ops[op]


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size, without its division by zero for s == 0."""
    if s < 1 or d < 1 or p < 0:
        raise ValueError("convolution strides and dilations must be >= 1, paddings >= 0")
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_sizes(kernel: "Tensor", x: "Tensor", s0: int, s1: int, p0: int, p1: int, d0: int,
                d1: int, is_2d: bool) -> None:
    if kernel.nelements == 0 or x.nelements == 0:
        raise ValueError("convolution of an empty tensor")
    if kernel.type not in (lib.GGML_TYPE_F16, lib.GGML_TYPE_F32) or x.type != lib.GGML_TYPE_F32:
        raise TypeError("convolutions take an F16/F32 kernel and an F32 input")
    if is_2d:
        if kernel.ne[2] != x.ne[2]:
            raise ValueError(f"kernel ne={list(kernel.ne)} and input ne={list(x.ne)}: channels (ne[2]) differ")
        if _conv_out(x.ne[1], kernel.ne[1], s1, p1, d1) < 1:
            raise ValueError("input too small for the kernel (dim 1)")
    else:
        if kernel.ne[1] != x.ne[1] or x.ne[3] != 1:
            raise ValueError(f"kernel ne={list(kernel.ne)} and input ne={list(x.ne)}: channels (ne[1]) differ")
    if _conv_out(x.ne[0], kernel.ne[0], s0, p0, d0) < 1:
        raise ValueError("input too small for the kernel (dim 0)")


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


#: op names with a checked method of their own
_CHECKED = {n for n in dir(Ops) if not n.startswith("_") and n not in ("op", "unary")}
