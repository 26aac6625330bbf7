"""The torch backend's kernels: FLASH_ATTN_EXT as float32 matrix products and a softmax.

ggml's semantics (``ggml_compute_forward_flash_attn_ext_f16`` in ggml-cpu's ``ops.cpp``):
q F32 ``[DK, N, H, B]``, k ``[DK, KV, Hk, Bk]``, v ``[DV, KV, Hv, Bv]`` (F32, F16 or BF16; head
``h`` of q reads head ``h / (H/Hk)`` of k, batches likewise), an optional F16 mask
``[>= KV, >= N, Hm, Bm]`` tiled over heads and batches (head ``h`` reads mask head ``h % Hm``),
optional sinks (F32, one logit per head, in the softmax's sum but with no value):

    s = q·k * scale                       (q rounded to k's type first, as ggml's vec_dot does)
    s = softcap * tanh(s)                 (logit_softcap != 0; scale divided by it first)
    s = s + slope(h) * mask               (slope 1 unless max_bias > 0: ALiBi)
    out = Σ exp(s - M) v / (Σ exp(s - M) + exp(sink - M)),   0 where the sum is 0

written to dst F32 ``[DV, H, N, B]`` (ggml's permuted layout: q row ``n`` of head ``h`` is dst
row ``h + n*H``). Computed in float32 (ggml's CPU accumulates V·softmax in F16 for F16 V; the
difference is far inside test-backend-ops' 5e-4 NMSE) as dense products and torch's softmax. On
``cpu`` the keys that the current mask hides from every query of a batch are cut off first (per
batch when the mask has a batch dimension), as ggml's CPU kernel skips masked keys: a batch of
padded sentences or a padded KV cache costs its used keys only.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ...raw import lib
from ..numpy.memory import _fparams, _ne, _src
from ..numpy.ops_softmax import _alibi_slopes
from .memory import DTYPES
from .table import Step, _add, eager

_F32, _F16, _BF16 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, lib.GGML_TYPE_BF16
_KV_TYPES = (_F32, _F16, _BF16)


def _strides_ok(p: Any) -> bool:
    k = int(lib.ggml_type_size(p.type))
    return all(int(b) % k == 0 for b in p.nb)


def _sup_flash_attn_ext(p: Any) -> bool:
    q, k, v, mask, sinks = (_src(p, i) for i in range(5))
    if q is None or k is None or v is None:
        return False
    if p.type != _F32 or q.type != _F32 or k.type not in _KV_TYPES or v.type not in _KV_TYPES:
        return False
    DK, N, H, B = _ne(q)
    dk, KV, Hk, Bk = _ne(k)
    DV, kv, Hv, Bv = _ne(v)
    if dk != DK or kv != KV or _ne(p) != (DV, H, N, B) or not lib.ggml_is_contiguous(p):
        return False
    if min(Hk, Hv, Bk, Bv) < 1 or H % Hk or H % Hv or B % Bk or B % Bv:
        return False
    if not all(_strides_ok(t) for t in (q, k, v)):
        return False
    if mask is not None:
        mk, mn, mh, mb = _ne(mask)
        if (mask.type != _F16 or not lib.ggml_is_contiguous(mask) or mk < KV or mn < N
                or min(mh, mb) < 1 or H % mh or B % mb):
            return False
    if sinks is not None and (sinks.type != _F32 or not lib.ggml_is_contiguous(sinks) or _ne(sinks)[0] < H):
        return False
    fp = _fparams(p)
    scale, max_bias, softcap = float(fp[0]), float(fp[1]), float(fp[2])
    if not all(math.isfinite(x) for x in (scale, max_bias, softcap)):
        return False
    return max_bias <= 0.0 or mask is not None


def _b_flash_attn_ext(p: Any, v: Any) -> Step | None:
    q, k, vv, mask, sinks = (_src(p, i) for i in range(5))
    D = v.tensor(p)                        # torch shape (B, N, H, DV)
    if D.numel() == 0:
        return None
    Q, Kt, Vt = v.tensor(q), v.tensor(k), v.tensor(vv)   # (B, H, N, DK), (Bk, Hk, KV, DK), (Bv, Hv, KV, DV)
    DK, N, H, B = _ne(q)
    KV, Hk, Bk = _ne(k)[1:]
    Hv, Bv = _ne(vv)[2:]
    fp = _fparams(p)
    scale, max_bias, softcap = float(fp[0]), float(fp[1]), float(fp[2])
    if softcap != 0.0:
        scale /= softcap
    # ggml converts q to k's vec_dot type (F16 -> F16, BF16 -> BF16) before the dot product
    q_round = None if k.type == _F32 else DTYPES[k.type]
    # heads in groups: q (B, G, r, N, DK) against k/v (B, G, 1, KV, D): G = Hk when k and v have
    # the same heads (no copy of k and v), else k and v repeated to H heads (G = H, r = 1)
    G = Hk if Hk == Hv else H
    r = H // G
    MM: torch.Tensor | None = None
    mask_reps: tuple[int, int, int, int] | None = None
    slope = None
    if mask is not None:
        MM = v.tensor(mask)[:, :, :N, :KV]           # (Bm, Hm, N, KV), read when the step runs
        Bm, Hm = MM.shape[0], MM.shape[1]
        # ggml tiles the mask: head h reads mask head h % Hm, batch b mask batch b % Bm
        reps = (1 if Bm in (1, B) else B // Bm, 1 if Hm in (1, H) else H // Hm)
        mask_reps = (reps[0], reps[1], 1, 1) if reps != (1, 1) else None
        if max_bias > 0.0:
            slope = torch.from_numpy(_alibi_slopes(H, max_bias).reshape(1, G, r, 1, 1)).to(D.device)
    S = v.tensor(sinks).reshape(-1)[:H].reshape(1, G, r, 1, 1) if sinks is not None else None

    def grouped(x: torch.Tensor, h: int, b: int) -> torch.Tensor:
        """k or v (b, h, KV, D) as float32 (B, G, 1, KV, D)."""
        x = x.float()
        if h != G:
            x = x.repeat_interleave(G // h, dim=1)
        if b != B:
            x = x.repeat_interleave(B // b, dim=0)
        return x.unsqueeze(2)

    def mask5() -> torch.Tensor:
        """The mask's current values as float32, broadcastable to (B, G, r, N, KV)."""
        assert MM is not None
        m: torch.Tensor = MM.float()
        if mask_reps is not None:
            m = m.repeat(mask_reps)
        return m.unsqueeze(2) if m.shape[1] == 1 else m.reshape(m.shape[0], G, r, N, KV)

    def attend(q5: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, m: "torch.Tensor | None") -> torch.Tensor:
        """Attention of q5 (b, G, r, N, DK) over kf/vf (b, G, 1, n, D) with mask m (-> (b, G, r, N, DV))."""
        dead = None
        if m is not None:
            dead = m.isneginf().all(dim=-1, keepdim=True)   # every key masked: the row is 0
            if slope is not None:
                m = m * slope
        if softcap != 0.0:
            s = torch.tanh(torch.matmul(q5, kf.transpose(-1, -2)) * scale) * softcap
        else:
            s = torch.matmul(q5 * scale, kf.transpose(-1, -2))
        if m is not None:
            s += m
        if S is None:
            o = torch.matmul(torch.softmax(s, dim=-1), vf)
            return torch.where(dead, 0.0, o) if dead is not None else o
        # the sink's logit is in the sum, with no value
        mx = torch.maximum(s.amax(dim=-1, keepdim=True) if s.shape[-1] else torch.full_like(S, -math.inf), S)
        e = torch.exp(s - mx)
        return torch.matmul(e, vf) / (e.sum(dim=-1, keepdim=True) + torch.exp(S - mx))

    # on cpu, keys masked (-inf) for every query and head are cut off before the products, per
    # batch when the mask has one per batch (ggml's CPU kernel skips them too): padded batches and
    # a padded KV cache cost only their used cells
    trim = MM is not None and D.device.type == "cpu"
    arange = torch.arange(1, KV + 1, device=D.device)

    def step() -> None:
        qf = Q.to(q_round).float() if q_round is not None else Q
        q5 = qf.reshape(B, G, r, N, DK)
        kf, vf = grouped(Kt, Hk, Bk), grouped(Vt, Hv, Bv)
        m = mask5() if MM is not None else None
        if not trim or m is None:
            o = attend(q5, kf, vf, m)
        else:
            Bm = m.shape[0]
            live = m.reshape(Bm, -1, KV).ne(-math.inf).any(dim=1)             # (Bm, KV)
            used = (live * arange).amax(dim=1).tolist() if KV else [0] * Bm    # keys used, per batch
            if Bm == 1 or len(set(used)) == 1:
                n = int(used[0])
                o = attend(q5, kf[..., :n, :], vf[..., :n, :], m[..., :n])
            else:
                o = torch.cat([attend(q5[b:b + 1], kf[b:b + 1, ..., :n, :], vf[b:b + 1, ..., :n, :],
                                      m[b:b + 1, ..., :n]) for b, n in enumerate(used)])
        D.copy_(o.reshape(B, H, N, -1).transpose(1, 2))
    return eager(step) if trim else step                 # the cut reads the mask to the host


_add("FLASH_ATTN_EXT", _sup_flash_attn_ext, _b_flash_attn_ext,
     "q F32 [DK,N,H,B], k/v F32/F16/BF16 (heads and batches broadcast: H % Hk == 0), optional F16 "
     "mask (tiled over heads and batches), scale, ALiBi max_bias, logit_softcap, optional F32 sinks; "
     "dst F32 [DV,H,N,B]")
