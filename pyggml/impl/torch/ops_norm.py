"""The torch backend's kernels: NORM, RMS_NORM, L2_NORM, GROUP_NORM, DIAG_MASK_INF /
DIAG_MASK_ZERO, SOFT_MAX (mask, scale, ALiBi, sinks), ROPE / ROPE_BACK (normal and NeoX)."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from ...raw import ffi, lib
from ..numpy.memory import _fparams, _iparams, _ne, _src
from ..numpy.ops_rope import rotate
from ..numpy.ops_softmax import _alibi_slopes
from .ops_elementwise import tile_reps
from .table import Step, _add, numpy_rule


def _rowwise(make: Callable[[Any], Callable[[torch.Tensor], torch.Tensor]]) -> Callable[[Any, Any], Step | None]:
    def build(p: Any, v: Any) -> Step | None:
        X, D = v.tensor(_src(p, 0)), v.tensor(p)
        if D.numel() == 0:
            return None
        fn = make(p)
        return lambda: D.copy_(fn(X.float()))
    return build


def _norm(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    eps = float(_fparams(p)[0])

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x - x.mean(dim=-1, keepdim=True)
        return y * (1.0 / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps))
    return f


def _rms_norm(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    eps = float(_fparams(p)[0])
    return lambda x: x * (1.0 / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps))


def _l2_norm(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    eps = float(_fparams(p)[0])
    return lambda x: x * (1.0 / torch.clamp(torch.sqrt((x * x).sum(dim=-1, keepdim=True)), min=eps))


def _group_norm(p: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    n_groups, eps = int(_iparams(p)[0]), float(_fparams(p)[1])
    n_channels = _ne(p)[2]
    per = (n_channels + n_groups - 1) // n_groups
    groups = [(g * per, min(g * per + per, n_channels)) for g in range(n_groups)]
    groups = [(s, e) for s, e in groups if s < e]

    def f(x: torch.Tensor) -> torch.Tensor:        # x: (n3, C, n1, n0)
        out = torch.empty_like(x)
        for s, e in groups:
            xs = x[:, s:e]
            y = xs - xs.mean(dim=(1, 2, 3), keepdim=True)
            out[:, s:e] = y * (1.0 / torch.sqrt((y * y).mean(dim=(1, 2, 3), keepdim=True) + eps))
        return out
    return f


_add("NORM", numpy_rule("NORM"), _rowwise(_norm), "F32; op_params [eps]; (x - mean)/sqrt(var + eps) along ne[0]")
_add("RMS_NORM", numpy_rule("RMS_NORM"), _rowwise(_rms_norm), "F32; op_params [eps]; x/sqrt(mean(x²) + eps)")
_add("L2_NORM", numpy_rule("L2_NORM"), _rowwise(_l2_norm), "F32; op_params [eps]; x/max(‖x‖, eps)")
_add("GROUP_NORM", numpy_rule("GROUP_NORM"), _rowwise(_group_norm),
     "F32; op_params [n_groups, eps]; groups of channels along ne[2]")


# --- masks and softmax -------------------------------------------------------------------------

def _diag_mask(value: float) -> Callable[[Any, Any], Step | None]:
    def build(p: Any, v: Any) -> Step | None:
        X, D = v.tensor(_src(p, 0)), v.tensor(p)
        if D.numel() == 0:
            return None
        n_past = int(_iparams(p)[0])
        n1, n0 = X.shape[-2], X.shape[-1]
        mask = (torch.arange(n0)[None, :] > (n_past + torch.arange(n1)[:, None])).to(D.device)
        return lambda: D.copy_(torch.where(mask, value, X))
    return build


_add("DIAG_MASK_INF", numpy_rule("DIAG_MASK_INF"), _diag_mask(-math.inf), "F32; op_params [n_past]")
_add("DIAG_MASK_ZERO", numpy_rule("DIAG_MASK_ZERO"), _diag_mask(0.0), "F32; op_params [n_past]")


def _b_soft_max(p: Any, v: Any) -> Step | None:
    a, mask, sinks = _src(p, 0), _src(p, 1), _src(p, 2)
    X, D = v.tensor(a), v.tensor(p)
    if D.numel() == 0:
        return None
    fp = _fparams(p)
    scale, max_bias = float(fp[0]), float(fp[1])
    n3, n2, n1, n0 = X.shape
    M = reps = slope = None
    if mask is not None:
        M = v.tensor(mask)[:, :, :n1, :]
        reps = tile_reps(tuple(M.shape), (n3, n2, n1, n0))
        slope = torch.from_numpy(_alibi_slopes(n2, max_bias).reshape(1, n2, 1, 1)).to(D.device)
    S = v.tensor(sinks).reshape(-1)[:n2].reshape(1, n2, 1, 1) if sinks is not None else None

    def step() -> None:
        w = X.float() * scale
        if M is not None:
            m = M.float() if reps is None else M.float().repeat(reps)
            w = w + slope * m
        mx = w.amax(dim=-1, keepdim=True)
        if S is not None:
            sk = S.float()
            mx = torch.maximum(mx, sk)
        e = torch.exp(w - mx)
        total = e.sum(dim=-1, keepdim=True)
        if S is not None:
            total = total + torch.exp(sk - mx)
        D.copy_(e * (1.0 / total))
    return step


_add("SOFT_MAX", numpy_rule("SOFT_MAX"), _b_soft_max,
     "F32; optional mask src1 F32/F16 (ne0 == ne00, ne1 >= ne01, tiled over dims 2, 3); "
     "op_params [scale, max_bias] (ALiBi slopes per ne2 head); optional sinks src2 F32 [ne02]")


# --- rope ----------------------------------------------------------------------------------

def _rope(sin_sign: float) -> Callable[[Any, Any], Step | None]:
    def build(p: Any, v: Any) -> Step | None:
        a, pos, ff = _src(p, 0), _src(p, 1), _src(p, 2)
        X, D = v.tensor(a), v.tensor(p)
        if D.numel() == 0:
            return None
        ip, fp = _iparams(p), _fparams(p)
        n_dims, mode, n_ctx_orig, o = int(ip[1]), int(ip[2]), int(ip[4]), int(ip[15])
        freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (float(x) for x in fp[5:11])
        half = n_dims // 2
        n2 = X.shape[1]
        dev = D.device
        theta_scale = np.float32(np.power(np.float64(freq_base), np.float64(np.float32(-2.0) / np.float32(n_dims))))
        scales = torch.full((1, max(half - 1, 0)), float(theta_scale), dtype=torch.float32, device=dev)
        P = v.tensor(pos).reshape(-1)[:n2]
        F_ = v.tensor(ff).reshape(-1)[:half] if ff is not None else None
        mscale = np.float32(attn_factor)
        ramp = None
        if ext_factor != 0.0:
            dims = ffi.new("float[2]")
            lib.ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, dims)
            low, high = np.float32(dims[0]), np.float32(dims[1])
            y = (np.arange(half, dtype=np.float32) - low) / max(np.float32(0.001), high - low)
            ramp_np = (np.float32(1) - np.minimum(np.float32(1), np.maximum(np.float32(0), y))) * np.float32(ext_factor)
            ramp = torch.from_numpy(ramp_np.astype(np.float32)).to(dev)
            mscale = mscale * (np.float32(1) + np.float32(0.1) * np.float32(math.log(1.0 / freq_scale)))
        msc, fsc = float(mscale), float(np.float32(freq_scale))

        def step() -> None:
            # theta[:, k] = p * theta_scale^k as the CPU's float32 running product
            theta = torch.cumprod(torch.cat([P.float()[:, None], scales.expand(n2, -1)], dim=1), dim=1)
            if F_ is not None:
                theta = theta / F_.float()
            interp = fsc * theta
            final = interp if ramp is None else interp * (1.0 - ramp) + theta * ramp
            c = (torch.cos(final) * msc).reshape(1, n2, 1, half)
            s = (torch.sin(final) * msc * sin_sign).reshape(1, n2, 1, half)
            x = X.float()
            out = x.clone()
            rotate(x, out, c, s, mode, o, n_dims)
            D.copy_(out)
        return step
    return build


def _rope_mode(p: Any) -> int:
    return int(_iparams(p)[2])


_ROPE_MODES = (0, lib.GGML_ROPE_TYPE_NEOX)
_ROPE_NOTES = ("F32 or F16 (same type in and out); modes 0 (normal) and 2 (NeoX) only, no "
               "mrope/vision; I32 positions [ne2]; optional F32 freq_factors; YaRN ext_factor; "
               "the rotated dims' offset (op_params[15])")
_add("ROPE", numpy_rule("ROPE"), _rope(1.0), _ROPE_NOTES, variant=_rope_mode, variants=_ROPE_MODES)
_add("ROPE_BACK", numpy_rule("ROPE_BACK"), _rope(-1.0), _ROPE_NOTES + " (inverse rotation)",
     variant=_rope_mode, variants=_ROPE_MODES)
