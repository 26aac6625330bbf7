"""The torch backend's kernels: binary element-wise ops (``src1`` tiled over ``src0``), ADD1,
ACC/SET, the unary ops with an op of their own, CLAMP, LEAKY_RELU, SCALE, UNARY and GLU."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ...raw import lib
from ..numpy.cpu_math import _UNARY_SAME_TYPE
from ..numpy.memory import _F32, _fparams, _iparams, _ne, _src
from .table import Step, _add, numpy_rule

_SQRT_2_OVER_PI = 0.79788456080286535587989211986876
_SQRT_2_INV = 0.70710678118654752440084436210484


def tile_reps(small: tuple[int, ...], big: tuple[int, ...]) -> tuple[int, ...] | None:
    """None when torch broadcasting gives ggml's tiling of ``small`` to ``big`` (torch shapes),
    else the repeat counts."""
    if all(s == b or s == 1 for s, b in zip(small, big)):
        return None
    return tuple(b // s for s, b in zip(small, big))


# --- binary element-wise ----------------------------------------------------------------------

def _binary(fn: Callable[..., torch.Tensor]) -> Callable[[Any, Any], Step | None]:
    def build(p: Any, v: Any) -> Step | None:
        a, b = _src(p, 0), _src(p, 1)
        A, B, D = v.tensor(a), v.tensor(b), v.tensor(p)
        if D.numel() == 0:
            return None
        reps = tile_reps(tuple(B.shape), tuple(A.shape))
        if reps is None and A.dtype == B.dtype == D.dtype:
            return lambda: fn(A, B, out=D)      # one torch call: computes in float, rounds once
        if reps is None:
            return lambda: D.copy_(fn(A.float(), B.float()))
        return lambda: D.copy_(fn(A.float(), B.float().repeat(reps)))
    return build


_BIN_NOTES = "src0, src1, dst F32/F16/BF16 (any mix); src1 tiled over src0 (ggml_can_repeat)"
_add("ADD", numpy_rule("ADD"), _binary(torch.add), _BIN_NOTES)
_add("SUB", numpy_rule("SUB"), _binary(torch.sub), _BIN_NOTES)
_add("MUL", numpy_rule("MUL"), _binary(torch.mul), _BIN_NOTES)
_add("DIV", numpy_rule("DIV"), _binary(torch.div), _BIN_NOTES)


def _b_add1(p: Any, v: Any) -> Step | None:
    A, B, D = v.tensor(_src(p, 0)), v.tensor(_src(p, 1)), v.tensor(p)
    if D.numel() == 0:
        return None
    return lambda: D.copy_(A.float() + B.float().reshape(-1)[0])


_add("ADD1", numpy_rule("ADD1"), _b_add1, "src0/dst F32/F16/BF16 + scalar src1 F32/F16/BF16")


def _sup_acc_set(name: str) -> Callable[[Any], bool]:
    rule = numpy_rule(name)

    def sup(p: Any) -> bool:
        a = _src(p, 0)
        es = int(lib.ggml_type_size(a.type)) if a is not None else 1
        return rule(p) and all(int(x) % es == 0 for x in _iparams(p)[:4])
    return sup


def _acc_set(accumulate: bool) -> Callable[[Any, Any], Step | None]:
    def build(p: Any, v: Any) -> Step | None:
        a, b = _src(p, 0), _src(p, 1)
        A, B, D = v.tensor(a), v.tensor(b), v.tensor(p)
        ip = _iparams(p)
        es = int(lib.ggml_type_size(a.type))
        nb1, nb2, nb3, offset = (int(x) // es for x in ip[:4])
        shape, stride = tuple(B.shape), (nb3, nb2, nb1, 1)

        def step() -> None:
            res = A.clone(memory_format=torch.contiguous_format).reshape(-1)
            if B.numel():
                sub = torch.as_strided(res, shape, stride, offset)
                if accumulate:
                    sub.add_(B)
                else:
                    sub.copy_(B)
            D.copy_(res.reshape(D.shape))
        return step
    return build


_add("ACC", _sup_acc_set("ACC"), _acc_set(True),
     "F32, contiguous src0; op_params [nb1, nb2, nb3, offset, inplace] (multiples of 4)")
_add("SET", _sup_acc_set("SET"), _acc_set(False),
     "F32 or I32, contiguous src0; op_params [nb1, nb2, nb3, offset, inplace] (multiples of 4)")


# --- unary element-wise ----------------------------------------------------------------------

def _map(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Any, Any], Step | None]:
    """A kernel computing ``fn`` of src0 (as float32) into the node."""
    def build(p: Any, v: Any) -> Step | None:
        A, D = v.tensor(_src(p, 0)), v.tensor(p)
        if D.numel() == 0:
            return None
        return lambda: D.copy_(fn(A.float()))
    return build


_EW_NOTES = "src/dst F32/F16/BF16 (computed in float32)"
_add("SQR", numpy_rule("SQR"), _map(lambda x: x * x), _EW_NOTES)
_add("SQRT", numpy_rule("SQRT"), _map(torch.sqrt), _EW_NOTES)
_add("LOG", numpy_rule("LOG"), _map(torch.log), _EW_NOTES)
_add("SIN", numpy_rule("SIN"), _map(torch.sin), _EW_NOTES)
_add("COS", numpy_rule("COS"), _map(torch.cos), _EW_NOTES)


def _with_params(make: Callable[[Any], Callable[[torch.Tensor], torch.Tensor]]) -> Callable[[Any, Any], Step | None]:
    def build(p: Any, v: Any) -> Step | None:
        return _map(make(p))(p, v)
    return build


def _clamp(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    lo, hi = float(_fparams(p)[0]), float(_fparams(p)[1])

    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.where(x < hi, x, hi)       # MIN(x, max) then MAX(., min), as the CPU's
        return torch.where(y > lo, y, lo)    # macros (NaN -> max)
    return f


def _leaky(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    ns = float(_fparams(p)[0])
    return lambda x: torch.where(x > 0, x, 0.0) + ns * torch.where(x < 0, x, 0.0)


def _scale(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    s, b = float(_fparams(p)[0]), float(_fparams(p)[1])
    return (lambda x: x * s) if b == 0 else (lambda x: x * s + b)


_add("CLAMP", numpy_rule("CLAMP"), _with_params(_clamp), "F32 or F16 (same type); op_params [min, max]")
_add("LEAKY_RELU", numpy_rule("LEAKY_RELU"), _with_params(_leaky),
     "F32 or F16 (same type); op_params [negative_slope]")
_add("SCALE", numpy_rule("SCALE"), _with_params(_scale), "F32; op_params [s, b]: x*s + b")


def _f16r(x: torch.Tensor) -> torch.Tensor:
    """Rounded to F16 and back (what ggml's F16 lookup tables do to inputs and results)."""
    return x.half().float()


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)))


def _gelu_quick(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 / (1.0 + torch.exp(-1.702 * x)))


def _gelu_cpu(x: torch.Tensor, t: int) -> torch.Tensor:
    """ggml_vec_gelu_f32/_f16: the F16 table, with the F32 cut-offs at ±10."""
    y = _f16r(_gelu_tanh(_f16r(x)))
    if t == _F32:
        y = torch.where(x <= -10.0, 0.0, torch.where(x >= 10.0, x, y))
    return y


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * torch.erfc(-x * _SQRT_2_INV)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def _hardsigmoid(x: torch.Tensor) -> torch.Tensor:
    zero, one = torch.zeros((), device=x.device), torch.ones((), device=x.device)
    return torch.fmin(one, torch.fmax(zero, (x + 3.0) / 6.0))


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C roundf: halfway cases away from zero."""
    t = torch.trunc(x)
    return torch.where((x - t).abs() >= 0.5, t + torch.sign(x), t)


def _xielu(x: torch.Tensor, fp: Any) -> torch.Tensor:
    alpha_n, alpha_p, beta, eps = (float(v) for v in fp[1:5])
    pos = alpha_p * x * x + beta * x
    neg = (torch.expm1(torch.clamp(x, max=eps)) - x) * alpha_n + beta * x
    return torch.where(x > 0, pos, neg)


_U = lib
#: GGML_UNARY_OP_* -> f(x float32, src type, float op_params) -> float32
_UNARY: dict[int, Callable[[torch.Tensor, int, Any], torch.Tensor]] = {
    _U.GGML_UNARY_OP_ABS: lambda x, t, fp: x.abs(),
    _U.GGML_UNARY_OP_SGN: lambda x, t, fp: torch.where(x > 0, 1.0, torch.where(x < 0, -1.0, 0.0)),
    _U.GGML_UNARY_OP_NEG: lambda x, t, fp: -x,
    _U.GGML_UNARY_OP_STEP: lambda x, t, fp: torch.where(x > 0, 1.0, 0.0),
    _U.GGML_UNARY_OP_TANH: lambda x, t, fp: torch.tanh(x),
    _U.GGML_UNARY_OP_ELU: lambda x, t, fp: torch.where(x > 0, x, torch.expm1(x)),
    _U.GGML_UNARY_OP_RELU: lambda x, t, fp: torch.where(x > 0, x, 0.0),
    _U.GGML_UNARY_OP_SIGMOID: lambda x, t, fp: 1.0 / (1.0 + torch.exp(-x)),
    _U.GGML_UNARY_OP_GELU: lambda x, t, fp: _gelu_cpu(x, t),
    _U.GGML_UNARY_OP_GELU_QUICK: lambda x, t, fp: _f16r(_gelu_quick(_f16r(x))),
    _U.GGML_UNARY_OP_SILU: lambda x, t, fp: _silu(x),
    _U.GGML_UNARY_OP_HARDSWISH: lambda x, t, fp: x * _hardsigmoid(x),
    _U.GGML_UNARY_OP_HARDSIGMOID: lambda x, t, fp: _hardsigmoid(x),
    _U.GGML_UNARY_OP_EXP: lambda x, t, fp: torch.exp(x),
    _U.GGML_UNARY_OP_EXPM1: lambda x, t, fp: torch.exp(x) - 1.0,
    _U.GGML_UNARY_OP_SOFTPLUS: lambda x, t, fp: torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x))),
    _U.GGML_UNARY_OP_GELU_ERF: lambda x, t, fp: _gelu_erf(x),
    _U.GGML_UNARY_OP_XIELU: lambda x, t, fp: _xielu(x, fp),
    _U.GGML_UNARY_OP_FLOOR: lambda x, t, fp: torch.floor(x),
    _U.GGML_UNARY_OP_CEIL: lambda x, t, fp: torch.ceil(x),
    _U.GGML_UNARY_OP_ROUND: lambda x, t, fp: _roundf(x),
    _U.GGML_UNARY_OP_TRUNC: lambda x, t, fp: torch.trunc(x),
}


def _b_unary(p: Any, v: Any) -> Step | None:
    fn, t, fp = _UNARY[int(lib.ggml_get_unary_op(p))], _src(p, 0).type, _fparams(p)
    return _map(lambda x: fn(x, t, fp))(p, v)


assert _UNARY_SAME_TYPE <= set(_UNARY)
_add("UNARY", numpy_rule("UNARY"), _b_unary,
     "all 22 ggml_unary_op; GELU/GELU_QUICK/GELU_ERF/SILU: F32->F32 or F16->F16 (GELU, "
     "GELU_QUICK rounded through F16 as ggml's tables); the others F32/F16/BF16 -> F32/F16/BF16",
     variant=lib.ggml_get_unary_op, variants=_UNARY)


# --- GLU -----------------------------------------------------------------------------------

def _geglu(x: torch.Tensor, g: torch.Tensor, t: int, fp: Any) -> torch.Tensor:
    y = _f16r(_gelu_tanh(_f16r(x)))
    if t == _F32:   # ggml_vec_geglu_f32 cut-offs
        return torch.where(x <= -10.0, 0.0, torch.where(x >= 10.0, x * g, y * g))
    return y * g


def _swiglu_oai(x: torch.Tensor, g: torch.Tensor, t: int, fp: Any) -> torch.Tensor:
    alpha, limit = float(fp[2]), float(fp[3])
    xc = torch.clamp(x, max=limit)
    yc = torch.clamp(g, -limit, limit)
    return xc / (1.0 + torch.exp(alpha * (-xc))) * (yc + 1.0)


def _swiglu_clamp(x: torch.Tensor, g: torch.Tensor, t: int, fp: Any) -> torch.Tensor:
    limit = float(fp[3])
    return _silu(torch.clamp(x, max=limit)) * torch.clamp(g, -limit, limit)


_GLU: dict[int, Callable[[torch.Tensor, torch.Tensor, int, Any], torch.Tensor]] = {
    lib.GGML_GLU_OP_REGLU: lambda x, g, t, fp: torch.where(x > 0, x * g, 0.0),
    lib.GGML_GLU_OP_GEGLU: _geglu,
    lib.GGML_GLU_OP_SWIGLU: lambda x, g, t, fp: _silu(x) * g,
    lib.GGML_GLU_OP_SWIGLU_OAI: _swiglu_oai,
    lib.GGML_GLU_OP_GEGLU_ERF: lambda x, g, t, fp: _gelu_erf(x) * g,
    lib.GGML_GLU_OP_GEGLU_QUICK: lambda x, g, t, fp: _f16r(_gelu_quick(_f16r(x))) * g,
    lib.GGML_GLU_OP_SWIGLU_CLAMP: _swiglu_clamp,
}


def _b_glu(p: Any, v: Any) -> Step | None:
    a, b = _src(p, 0), _src(p, 1)
    ip, fp = _iparams(p), _fparams(p)
    fn, t = _GLU[int(ip[0])], a.type
    A, D = v.tensor(a), v.tensor(p)
    if D.numel() == 0:
        return None
    if b is None:
        nc = _ne(p)[0]
        X, G = A[..., :nc], A[..., nc:2 * nc]
        if ip[1]:  # swapped
            X, G = G, X
    else:
        X, G = A, v.tensor(b)
    return lambda: D.copy_(fn(X.float(), G.float(), t, fp))


_add("GLU", numpy_rule("GLU"), _b_glu,
     "REGLU, GEGLU, SWIGLU, SWIGLU_OAI (F32), GEGLU_ERF, GEGLU_QUICK, SWIGLU_CLAMP; F32 or F16 "
     "(one type); fused (halves of src0, swapped flag) or split (src1)",
     variant=lib.ggml_get_glu_op, variants=_GLU)
