"""The torch backend's kernels: MUL_MAT and OUT_PROD (weights dequantized with torch ops,
float32 products; a weight's float32 values kept in its buffer's ``weights_cache``, see
:mod:`pyggml.impl.torch.memory`)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..numpy.memory import _is_quant, _ne, _src
from .._vtable import addr
from .memory import weights_buffer
from .quant import DEQUANT, dequantize
from .table import Step, _add, numpy_rule


def _reader(p: Any, v: Any) -> Callable[[], torch.Tensor]:
    """A function giving tensor ``p``'s current values as float32 (torch shape ``ne``
    reversed), dequantized when ``p`` is quantized; converted once (then cached) when ``p`` is a
    weight (``memory.weights_buffer``) that is not F32."""
    if _is_quant(p.type):
        rows, t, n = v.rows(p), p.type, _ne(p)[0]

        def convert() -> torch.Tensor:
            return dequantize(rows, t, n)
    else:
        x: torch.Tensor = v.tensor(p)
        if x.dtype == torch.float32:
            return lambda: x
        convert = x.float
    wb = weights_buffer(p)
    if wb is None:
        return convert
    cache = wb.weights_cache
    key = (addr(p.data), int(p.type), tuple(p.ne), tuple(p.nb))

    def cached() -> torch.Tensor:
        t = cache.get(key)
        if t is None:
            t = cache[key] = convert()
        return t
    return cached


def _weights_rule(name: str) -> Callable[[Any], bool]:
    rule = numpy_rule(name)

    def sup(p: Any) -> bool:
        a = _src(p, 0)
        return rule(p) and (not _is_quant(a.type) or a.type in DEQUANT)
    return sup


def _b_mul_mat(p: Any, v: Any) -> Step | None:
    a, b = _src(p, 0), _src(p, 1)
    D = v.tensor(p)
    if D.numel() == 0:
        return None
    read_a, B = _reader(a, v), v.tensor(b)
    K, M, d2, d3 = _ne(a)
    _, N, e2, e3 = _ne(b)
    if d2 == d3 == e2 == e3 == 1:
        out = D[0, 0]
        return lambda: out.copy_(B[0, 0].float() @ read_a()[0, 0].t())
    r2, r3 = e2 // d2, e3 // d3
    # ggml broadcasts src0 by repetition: src1 batch i12 uses src0 batch i12 // r2
    return lambda: D.copy_(torch.matmul(B.float().reshape(d3, r3, d2, r2, N, K),
                                        read_a().transpose(-1, -2)[:, None, :, None]).reshape(e3, e2, N, M))


_add("MUL_MAT", _weights_rule("MUL_MAT"), _b_mul_mat,
     "src0 F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, src1 F32/F16/BF16, dst F32; src0 batches "
     "broadcast over src1's (i02 = i12 / (ne12/ne02))")


def _b_out_prod(p: Any, v: Any) -> Step | None:
    a, b = _src(p, 0), _src(p, 1)
    D = v.tensor(p)
    if D.numel() == 0:
        return None
    read_a, B = _reader(a, v), v.tensor(b)
    M, K, d2, d3 = _ne(a)
    N, _, e2, e3 = _ne(b)
    r2, r3 = e2 // d2, e3 // d3
    return lambda: D.copy_(torch.matmul(B.float().transpose(-1, -2).reshape(d3, r3, d2, r2, N, K),
                                        read_a()[:, None, :, None]).reshape(e3, e2, N, M))


_add("OUT_PROD", _weights_rule("OUT_PROD"), _b_out_prod,
     "src0 F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, src1 F32, dst F32: dst[m,n] = Σ_k src0[m,k]·src1[n,k]")
