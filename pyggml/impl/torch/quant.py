"""Dequantization with torch ops, for the legacy block types (layouts: ``ggml-common.h``):
``Q4_0`` (f16 d, 16 bytes of nibbles), ``Q4_1`` (f16 d, f16 m, nibbles), ``Q5_0`` / ``Q5_1``
(as Q4 plus 32 high bits), ``Q8_0`` (f16 d, 32 int8). Each block holds 32 values: the low
nibbles are values 0..15, the high nibbles values 16..31, as ``dequantize_row_*`` in
``ggml-quants.c`` (exact: the products are the same float32 operations)."""
from __future__ import annotations

from typing import Callable

import torch

from ...raw import lib

__all__ = ["DEQUANT", "dequantize"]

_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes (last dim) as a float16 value, widened to float32: shape [..., 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] values 0..15 (low nibbles first)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes (a little-endian uint32) -> [..., 32] bits, bit i for value i."""
    shifts = _SHIFTS.to(qh.device)
    return ((qh.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return (_nibbles(b[..., 2:18]).float() - 8.0) * _f16(b[..., 0:2])


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _nibbles(b[..., 4:20]).float() * _f16(b[..., 0:2]) + _f16(b[..., 2:4])


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[..., 6:22]) | (_high_bits(b[..., 2:6]) << 4)
    return (q.float() - 16.0) * _f16(b[..., 0:2])


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[..., 8:24]) | (_high_bits(b[..., 4:8]) << 4)
    return q.float() * _f16(b[..., 0:2]) + _f16(b[..., 2:4])


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
