"""Dequantization with torch ops, for the legacy block types (layouts: ``ggml-common.h``):
``Q4_0`` (f16 d, 16 bytes of nibbles), ``Q4_1`` (f16 d, f16 m, nibbles), ``Q5_0`` / ``Q5_1``
(as Q4 plus 32 high bits), ``Q8_0`` (f16 d, 32 int8). Each block holds 32 values: the low
nibbles are values 0..15, the high nibbles values 16..31, as ``dequantize_row_*`` in
``ggml-quants.c`` (exact: the products are the same float32 operations).

And MUL_MAT's src1 rounded to the weights' ``vec_dot_type`` as ggml's CPU backend rounds it
(:func:`round_activations`: F16, BF16, Q8_0 or Q8_1 blocks), so that a product with the
dequantized weights is the CPU's up to float summation order."""
from __future__ import annotations

from typing import Callable

import torch

from ...raw import lib

__all__ = ["DEQUANT", "dequantize", "dequantize_split", "VEC_DOT", "round_activations", "Q8_1_MINS"]

def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes (last dim) as a float16 value, widened to float32: shape [..., 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] values 0..15 (low nibbles first)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes (a little-endian uint32) -> [..., 32] bits, bit i for value i. The shifts
    are made on qh's device (a kernel, not a copy of host data: capturable in a CUDA graph)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return (_nibbles(b[..., 2:18]).float() - 8.0) * _f16(b[..., 0:2])


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _nibbles(b[..., 4:20]).float() * _f16(b[..., 0:2]) + _f16(b[..., 2:4])


def _q4_1_scaled(b: torch.Tensor) -> torch.Tensor:
    return _nibbles(b[..., 4:20]).float() * _f16(b[..., 0:2])


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[..., 6:22]) | (_high_bits(b[..., 2:6]) << 4)
    return (q.float() - 16.0) * _f16(b[..., 0:2])


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _q5_1_scaled(b) + _f16(b[..., 2:4])


def _q5_1_scaled(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[..., 8:24]) | (_high_bits(b[..., 4:8]) << 4)
    return q.float() * _f16(b[..., 0:2])


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[..., 2:34].contiguous().view(torch.int8).float() * _f16(b[..., 0:2])


#: ggml type -> (block bytes, f(blocks uint8 [..., block bytes]) -> float32 [..., 32])
DEQUANT: dict[int, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {
    lib.GGML_TYPE_Q4_0: (18, _q4_0), lib.GGML_TYPE_Q4_1: (20, _q4_1),
    lib.GGML_TYPE_Q5_0: (22, _q5_0), lib.GGML_TYPE_Q5_1: (24, _q5_1),
    lib.GGML_TYPE_Q8_0: (34, _q8_0)}


def dequantize(rows: torch.Tensor, qtype: int, n: int) -> torch.Tensor:
    """Rows of blocks ``rows`` (uint8, shape [..., row bytes]) of type ``qtype`` (a key of
    ``DEQUANT``) as float32 values, shape [..., n] (``n``: values per row)."""
    size, fn = DEQUANT[qtype]
    blocks = rows.reshape(*rows.shape[:-1], n // 32, size)
    return fn(blocks).reshape(*rows.shape[:-1], n)


#: the block types with a per-block minimum ``m`` (value = q·d + m): ggml's CPU dots them with
#: Q8_1 activations as Σ_b d_b·d'_b·Σq·q' + m_b·s'_b (``ggml_vec_dot_q4_1_q8_1``), the minimum
#: multiplied by the activations' F16 block sum ``s'`` (not by the exact Σ of their values)
Q8_1_MINS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    lib.GGML_TYPE_Q4_1: _q4_1_scaled, lib.GGML_TYPE_Q5_1: _q5_1_scaled}


def dequantize_split(rows: torch.Tensor, qtype: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`dequantize`, for a type of ``Q8_1_MINS`` split in (q·d [..., n], m [..., n/32]);
    for the other types (values, None)."""
    scaled = Q8_1_MINS.get(qtype)
    if scaled is None:
        return dequantize(rows, qtype, n), None
    size = DEQUANT[qtype][0]
    blocks = rows.reshape(*rows.shape[:-1], n // 32, size)
    return scaled(blocks).reshape(*rows.shape[:-1], n), _f16(blocks[..., 2:4]).squeeze(-1)


#: weight type -> the type ggml's CPU rounds MUL_MAT's src1 to before the dot products
#: (``type_traits_cpu[type].vec_dot_type``, ggml-cpu.c): F32 none, F16/BF16 that type,
#: Q4_0/Q5_0/Q8_0 Q8_0, Q4_1/Q5_1 Q8_1
VEC_DOT: dict[int, int] = {
    lib.GGML_TYPE_F32: lib.GGML_TYPE_F32, lib.GGML_TYPE_F16: lib.GGML_TYPE_F16,
    lib.GGML_TYPE_BF16: lib.GGML_TYPE_BF16,
    lib.GGML_TYPE_Q4_0: lib.GGML_TYPE_Q8_0, lib.GGML_TYPE_Q5_0: lib.GGML_TYPE_Q8_0,
    lib.GGML_TYPE_Q8_0: lib.GGML_TYPE_Q8_0,
    lib.GGML_TYPE_Q4_1: lib.GGML_TYPE_Q8_1, lib.GGML_TYPE_Q5_1: lib.GGML_TYPE_Q8_1}


def _cpu_q8_flavour() -> tuple[bool, bool]:
    """(scale = 127/amax, round half to even) as this process's ggml CPU code quantizes a row
    to Q8_0/Q8_1 (``quantize_row_q8_0``/``_q8_1``, ggml-cpu/arch/*/quants.c): x86 with AVX
    multiplies by ``127/amax`` and rounds with ``_mm256_round_ps`` (half to even); ARM NEON
    multiplies by ``1/d`` (d = amax/127) and rounds with ``vcvtnq`` (half to even); elsewhere
    the reference ``quantize_row_q8_0_ref`` multiplies by ``1/d`` and rounds with ``roundf``
    (half away from zero)."""
    if lib.ggml_cpu_has_avx():
        return True, True
    return False, bool(lib.ggml_cpu_has_neon())


_SCALE_127_OVER_AMAX, _HALF_EVEN = _cpu_q8_flavour()


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: to nearest, halves away from zero."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _q8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (float32 [..., K], K a multiple of 32) as ggml's CPU quantizes it to Q8_0/Q8_1: per
    block of 32 along the last axis, (q [..., K/32, 32] as float32, d (float32, before its F16
    rounding) [..., K/32, 1], F16-rounded d [..., K/32, 1])."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    if _SCALE_127_OVER_AMAX:
        inv = torch.where(amax != 0, 127.0 / amax, zero)
    else:
        inv = torch.where(d != 0, 1.0 / d, zero)
    v = blocks * inv
    q = torch.round(v) if _HALF_EVEN else _round_half_away(v)
    return q, d, d.half().float()


def round_activations(x: torch.Tensor, vec_dot_type: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MUL_MAT's src1 ``x`` (float32 [..., K]) as ggml's CPU backend rounds it to the weights'
    ``vec_dot_type`` (``VEC_DOT``), widened back to float32: (values [..., K], block sums
    [..., K/32] or None). F16/BF16: rounded to that type (to nearest even); Q8_0: q·d with d
    rounded to F16; Q8_1: the same and the F16 block sums s = d·Σq that ggml's Q4_1/Q5_1 dots
    multiply the weights' minima by."""
    if vec_dot_type == lib.GGML_TYPE_F32:
        return x, None
    if vec_dot_type == lib.GGML_TYPE_F16:
        return x.half().float(), None
    if vec_dot_type == lib.GGML_TYPE_BF16:
        return x.bfloat16().float(), None
    q, d, dh = _q8_blocks(x)
    values = (q * dh).reshape(x.shape)
    if vec_dot_type == lib.GGML_TYPE_Q8_0:
        return values, None
    if vec_dot_type == lib.GGML_TYPE_Q8_1:
        return values, (d * q.sum(dim=-1, keepdim=True)).half().float().squeeze(-1)
    raise ValueError(f"no rounding to vec_dot_type {vec_dot_type}")
