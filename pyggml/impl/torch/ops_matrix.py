"""The torch backend's kernels: MUL_MAT and OUT_PROD (weights dequantized with torch ops,
float32 products; a weight's float32 values kept in its buffer's ``weights_cache``, see
:mod:`pyggml.impl.torch.memory`).

MUL_MAT computes what ggml's CPU backend computes: src1 is first rounded to the weights'
``vec_dot_type`` (:func:`~pyggml.impl.torch.quant.round_activations`: F16/BF16 weights -> that
type, Q4_0/Q5_0/Q8_0 -> Q8_0 blocks, Q4_1/Q5_1 -> Q8_1 blocks with their F16 sums), then
multiplied with the exactly dequantized weights in float32, so the products are the CPU's up to
the order of the float additions. OUT_PROD reads src1 as it is (the CPU's does too)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..numpy.memory import _is_quant, _ne, _src
from .._vtable import addr
from .memory import Weight, weights_buffer
from .quant import DEQUANT, Q8_1_MINS, VEC_DOT, dequantize, dequantize_split, round_activations
from .stream import current_stream
from .table import Step, _add, numpy_rule


def _reader(p: Any, v: Any, split: bool = False) -> Callable[[], Weight]:
    """A function giving tensor ``p``'s current values as float32 (torch shape ``ne``
    reversed), dequantized when ``p`` is quantized, with None; with ``split``, a Q4_1/Q5_1
    tensor as (q·d, minima [..., ne0/32]) instead (``quant.dequantize_split``). Converted once
    (then cached) when ``p`` is a weight (``memory.weights_buffer``) that is not F32."""
    convert: Callable[[], Weight]
    if _is_quant(p.type):
        rows, t, n = v.rows(p), p.type, _ne(p)[0]

        def convert() -> Weight:
            return dequantize_split(rows, t, n) if split else (dequantize(rows, t, n), None)
    else:
        x: torch.Tensor = v.tensor(p)
        if x.dtype == torch.float32:
            w: Weight = (x, None)
            return lambda: w

        def convert() -> Weight:
            return x.float(), None
    wb = weights_buffer(p)
    if wb is None:
        return convert
    cache = wb.weights_cache
    key = (addr(p.data), int(p.type), tuple(p.ne), tuple(p.nb), split)
    stream = current_stream(v.device)   # the backend's: steps are built and run on it

    def cached() -> Weight:
        return cache.fetch(key, convert, stream)
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
    vdt = VEC_DOT[int(a.type)]
    read_a, B = _reader(a, v, split=int(a.type) in Q8_1_MINS), v.tensor(b)
    K, M, d2, d3 = _ne(a)
    _, N, e2, e3 = _ne(b)
    if d2 == d3 == e2 == e3 == 1:
        out = D[0, 0]

        def step2d() -> None:
            w, mins = read_a()
            x, sums = round_activations(B[0, 0].float(), vdt)
            out.copy_(x @ w[0, 0].t())
            if mins is not None and sums is not None:   # Σ_b m_b·s_b (ggml_vec_dot_q4_1_q8_1)
                out.addmm_(sums, mins[0, 0].t())
        return step2d
    r2, r3 = e2 // d2, e3 // d3

    def step() -> None:
        # ggml broadcasts src0 by repetition: src1 batch i12 uses src0 batch i12 // r2
        w, mins = read_a()
        x, sums = round_activations(B.float(), vdt)
        y = torch.matmul(x.reshape(d3, r3, d2, r2, N, K), w.transpose(-1, -2)[:, None, :, None])
        if mins is not None and sums is not None:
            y += torch.matmul(sums.reshape(d3, r3, d2, r2, N, K // 32), mins.transpose(-1, -2)[:, None, :, None])
        D.copy_(y.reshape(e3, e2, N, M))
    return step


_add("MUL_MAT", _weights_rule("MUL_MAT"), _b_mul_mat,
     "src0 F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, src1 F32/F16/BF16 (rounded to src0's vec_dot_type "
     "as ggml's CPU does), dst F32; src0 batches broadcast over src1's (i02 = i12 / (ne12/ne02))")


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
                                        read_a()[0][:, None, :, None]).reshape(e3, e2, N, M))


_add("OUT_PROD", _weights_rule("OUT_PROD"), _b_out_prod,
     "src0 F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, src1 F32, dst F32: dst[m,n] = Σ_k src0[m,k]·src1[n,k]")
