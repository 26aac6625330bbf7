"""Whisper as ggml graphs: the weights in a backend buffer, the encoder of one 30-s window, the
decoder with its self-attention KV cache, and the cross-attention K/V of the window, computed
once by the encoder graph into buffers of their own.

Shapes in comments are ggml ``ne`` order: S = n_audio_state, A = n_audio_ctx (1500), M = n_mels,
F = mel frames (3000), D = n_text_state, Dh = D / n_text_head, H = heads, T = tokens in the batch,
K = cache cells a decoder graph attends to (the tokens so far, padded up to :data:`KV_PAD`),
N = cells of the KV cache, V = n_vocab.

The KV cache is a pool of N cells per layer, not one row per position: a decoder graph reads
the cells of its sequence's history in position order (``get_rows`` of a list of cells given as
an input) and writes its tokens into the cells it is given (``set_rows``). Greedy decoding uses
cells 0, 1, 2...; beam search gives each new token of each beam a fresh cell, so beams share the
cells of their common prefix and nothing is copied when beams are reordered.

Each graph has its own :class:`pyggml.Scheduler` over the model's backend and the CPU, placed
once: the encoder graph is computed once per window, a decoder graph of a given (T, K) again at
every step with new inputs (token ids, positions, the causal mask and the cache rows written).
The cache is written inside the decoder graph (``set_rows``), the cross K/V inside the encoder
graph (``cpy``): nothing of either goes through NumPy.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

import pyggml
from pyggml import Context, CPUBackend, GGMLType, Scheduler, Tensor, ffi, lib
from pyggml.backends.device import device_by_name
from pyggml.impl import register_builtin

from .audio import FRAMES
from .loader import WhisperFile

__all__ = ["WhisperModel", "KV_PAD"]

#: decoder graphs attend to the first multiple of KV_PAD cache cells covering the tokens
KV_PAD = 32
_EPS = 1e-5


#: builds a graph: (ctx, inputs' ctx, graph) -> ({input name: (tensor, NumPy shape)}, output)
_Build = Callable[[Context, Context, pyggml.Graph], "tuple[dict[str, tuple[Tensor, tuple[int, ...]]], Tensor | None]"]


@dataclass
class _Graph:
    ctx: Context
    inputs: Context
    graph: pyggml.Graph
    sched: Scheduler
    arrays: dict[str, np.ndarray]   # zero-copy NumPy views of the input tensors (NumPy order)
    out: Tensor | None = None

    def close(self) -> None:
        self.sched.close()
        self.ctx.close()
        self.inputs.close()


class WhisperModel:
    """A Whisper model file on a ggml backend: ``backend`` ``"cpu"`` or a device name
    (``"CUDA0"``, ``"Vulkan0"``, ``"TORCH0"``, ``"numpy"``...); a :class:`~pyggml.Scheduler` runs
    on it what it supports and the rest on the CPU backend (``n_threads``). ``flash_attn``
    (default, as whisper.cpp): the attention with ``ggml_flash_attn_ext`` (on 2 CPU cores the
    encoder takes 210 ms instead of 360 for tiny.en); False: ``mul_mat`` + ``soft_max``.
    ``n_cells``: cells of the KV cache (default 3 x n_text_ctx: beam search gives each beam's
    tokens cells of their own, the prompt plus beams x tokens per window: 1,123 for 5 beams of
    224 tokens). ``repack``: on the CPU backend, each matrix that only products read goes where
    llama.cpp's rule puts it (:meth:`pyggml.Device.weight_buffer_type`: ``CPU_REPACK`` for Q4_0
    on x86, ``AMX`` for Q8_0 on Intel CPUs with AMX); :attr:`weight_buffers` says where the
    weights went. Raises :class:`pyggml.BackendNotAvailableError` for an unknown device."""

    def __init__(self, f: WhisperFile, *, backend: str = "cpu", n_threads: int | None = None,
                 flash_attn: bool = True, max_graphs: int = 16, n_cells: int | None = None,
                 repack: bool = True):
        self.hp = hp = f.hparams
        self.n_cells = n_cells or 3 * hp.n_text_ctx
        self.flash_attn = flash_attn
        self.max_graphs = max_graphs
        self.cpu = CPUBackend(n_threads=n_threads)
        self._closables: list[Context] = []
        self._owned: list[pyggml.Backend] = []
        self._graphs: OrderedDict[tuple[int, int, int], _Graph] = OrderedDict()
        self._encoder: _Graph | None = None
        try:
            if backend.lower() == "cpu":
                self.home: pyggml.Backend = self.cpu
            else:
                register_builtin(backend)
                self.home = device_by_name(backend).init()
                self._owned.append(self.home)
            self.backends = [self.home] + ([self.cpu] if self.home is not self.cpu else [])
            self.w: dict[str, Tensor] = {}
            #: buffer type name -> the number of weights in it
            self.weight_buffers: dict[str, int] = {}
            for buft, names in self._weight_places(f, repack):
                wctx, w = f.load(buft, names)
                self._closables.append(wctx)
                self.w.update(w)
                self.weight_buffers[buft.name] = self.weight_buffers.get(buft.name, 0) + len(w)
            self._init_state()
        except BaseException:
            self.close()
            raise

    def _weight_places(self, f: WhisperFile, repack: bool) -> list[tuple[pyggml.BufferType, list[str]]]:
        """The file's tensors grouped by the buffer type each goes in: with ``repack`` on the
        CPU backend, the linear layers' matrices (read by products only: not the embeddings,
        which GET_ROWS and views read, nor the convolutions' kernels) where
        :meth:`pyggml.Device.weight_buffer_type` says; the rest in the home's default one."""
        default = self.home.default_buffer_type
        dev = pyggml.Device.of(self.cpu) if repack and self.home is self.cpu else None
        places: dict[pyggml.BufferType, list[str]] = {}
        for name, info in f.tensors.items():
            linear = len(info.ne) == 2 and name.endswith(".weight") and "embedding" not in name
            buft = dev.weight_buffer_type(info.type, info.ne) if dev is not None and linear else default
            places.setdefault(buft, []).append(name)
        return list(places.items())

    def _init_state(self) -> None:
        """The self-attention KV cache (F16 [D, N] per layer, K and V) and the cross K (F16
        [D, A]) and V (F16 [A, D], transposed for ``mul_mat``; [D, A] with flash attention)."""
        hp = self.hp
        D, C, A, L = hp.n_text_state, self.n_cells, hp.n_audio_ctx, hp.n_text_layer
        ctx = Context.for_tensors(4 * L)
        self._closables.append(ctx)
        f16 = GGMLType.F16
        self.kv_k = [ctx.new_tensor(f16, [D, C], name=f"kv_k_{i}") for i in range(L)]
        self.kv_v = [ctx.new_tensor(f16, [D, C], name=f"kv_v_{i}") for i in range(L)]
        self.cross_k = [ctx.new_tensor(f16, [D, A], name=f"cross_k_{i}") for i in range(L)]
        self.cross_v = [ctx.new_tensor(f16, [D, A] if self.flash_attn else [A, D], name=f"cross_v_{i}")
                        for i in range(L)]
        ctx.alloc_tensors(self.home).clear(0)

    def close(self) -> None:
        """Free the graphs, the caches, the weights and the backends (idempotent)."""
        for g in list(self._graphs.values()) + ([self._encoder] if self._encoder else []):
            g.close()
        self._graphs.clear()
        self._encoder = None
        for c in reversed(self._closables):
            c.close()
        self._closables = []
        for b in self._owned + [self.cpu]:
            b.close()
        self._owned = []

    def __enter__(self) -> "WhisperModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ pieces
    def _ln(self, ctx: Context, x: Tensor, name: str) -> Tensor:
        return ctx.norm(x, _EPS) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _linear(self, ctx: Context, x: Tensor, name: str) -> Tensor:
        y = ctx.mul_mat(self.w[name + ".weight"], x)
        b = self.w.get(name + ".bias")
        return y + b if b is not None else y

    def _attend(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                n_head: int, v_transposed: bool) -> Tensor:
        """Attention of q [Dh, H, T, B] over k [Dh, H, N, B] and v ([Dh, H, N, B], or
        [N, Dh, H] when ``v_transposed``), B sequences of T queries (B = 1: 3-D tensors):
        [Dh*H, T*B]. ``mask`` F32 [N, T, 1, B] (F16 with flash attention) or None."""
        Dh, T, B = q.ne[0], q.ne[2], q.ne[3]
        scale = 1.0 / math.sqrt(Dh)
        qp = ctx.permute(q, 0, 2, 1, 3)                                         # [Dh, T, H, B]
        kp = ctx.permute(k, 0, 2, 1, 3)                                         # [Dh, N, H, B]
        if self.flash_attn and not v_transposed:
            vp = ctx.permute(v, 0, 2, 1, 3)
            o = ctx.flash_attn(qp, kp, vp, mask, scale)                         # [Dh, H, T, B]
            return ctx.reshape(o, Dh * n_head, T * B)
        kq = ctx.soft_max(ctx.mul_mat(kp, qp), mask, scale=scale)              # [N, T, H, B]
        vt = v if v_transposed else ctx.cont(ctx.permute(v, 1, 2, 0, 3))        # [N, Dh, H, B]
        o = ctx.mul_mat(vt, kq)                                                 # [Dh, T, H, B]
        return ctx.reshape(ctx.cont(ctx.permute(o, 0, 2, 1, 3)), Dh * n_head, T * B)

    def _mlp(self, ctx: Context, x: Tensor, p: str) -> Tensor:
        h = ctx.gelu(self._linear(ctx, self._ln(ctx, x, p + ".mlp_ln"), p + ".mlp.0"))
        return self._linear(ctx, h, p + ".mlp.2") + x

    def _new_graph(self, n: int, build: "_Build") -> _Graph:
        ictx = Context.for_tensors(8)
        ctx = Context.for_tensors(n, graph_size=n)
        sched = None
        try:
            graph = ctx.new_graph(n)
            inputs, out = build(ctx, ictx, graph)
            ictx.alloc_tensors(self.cpu).clear(0)
            sched = Scheduler(self.backends, graph_size=2 * n + 64)
            sched.alloc_graph(graph)
        except BaseException:
            if sched is not None:
                sched.close()
            ctx.close()
            ictx.close()
            raise
        arrays = {k: t.numpy(copy=False).reshape(shape) for k, (t, shape) in inputs.items()}
        return _Graph(ctx, ictx, graph, sched, arrays, out)

    # ------------------------------------------------------------------ encoder
    def _build_encoder(self, ctx: Context, ictx: Context, graph: pyggml.Graph
                       ) -> tuple[dict[str, tuple[Tensor, tuple[int, ...]]], Tensor | None]:
        hp, w = self.hp, self.w
        S, A, H = hp.n_audio_state, hp.n_audio_ctx, hp.n_audio_head
        mel = ictx.new_tensor(GGMLType.F32, [FRAMES, hp.n_mels], name="mel").set_input()  # [F, M]
        x = ctx.gelu(ctx.conv_1d(w["encoder.conv1.weight"], mel, 1, 1, 1) + w["encoder.conv1.bias"])  # [F, S]
        x = ctx.gelu(ctx.conv_1d(w["encoder.conv2.weight"], x, 2, 1, 1) + w["encoder.conv2.bias"])    # [A, S]
        x = ctx.cont(ctx.transpose(x)) + w["encoder.positional_embedding"]                           # [S, A]
        Dh = S // H
        for i in range(hp.n_audio_layer):
            p = f"encoder.blocks.{i}"
            cur = self._ln(ctx, x, p + ".attn_ln")
            q = ctx.reshape(self._linear(ctx, cur, p + ".attn.query"), Dh, H, A)
            k = ctx.reshape(self._linear(ctx, cur, p + ".attn.key"), Dh, H, A)
            v = ctx.reshape(self._linear(ctx, cur, p + ".attn.value"), Dh, H, A)
            x = self._linear(ctx, self._attend(ctx, q, k, v, None, H, False), p + ".attn.out") + x
            x = self._mlp(ctx, x, p)
        x = self._ln(ctx, x, "encoder.ln_post")                                                      # [S, A]
        for i in range(hp.n_text_layer):          # each decoder layer's cross K and V, once per window
            p = f"decoder.blocks.{i}.cross_attn"
            k = ctx.mul_mat(w[p + ".key.weight"], x)                                                 # [D, A]
            v = self._linear(ctx, x, p + ".value")
            graph.build_forward(ctx.cpy(k, self.cross_k[i]))
            graph.build_forward(ctx.cpy(v if self.flash_attn else ctx.transpose(v), self.cross_v[i]))
        return {"mel": (mel, (hp.n_mels, FRAMES))}, None

    def encode(self, mel: np.ndarray) -> None:
        """Encode one window: ``mel`` float32, NumPy shape (n_mels, 3000); the cross K/V of every
        decoder layer are left in the model for :meth:`decode`."""
        if mel.shape != (self.hp.n_mels, FRAMES):
            raise ValueError(f"mel must have NumPy shape ({self.hp.n_mels}, {FRAMES}), not {mel.shape}")
        if self._encoder is None:
            self._encoder = self._new_graph(64 * self.hp.n_audio_layer + 16 * self.hp.n_text_layer + 64,
                                            self._build_encoder)
        g = self._encoder
        g.arrays["mel"][...] = mel
        g.sched.compute(g.graph)

    # ------------------------------------------------------------------ decoder
    def _build_decoder(self, T: int, K: int, B: int) -> _Build:
        """The decoder graph of B sequences of T new tokens each (T = 1 when B > 1), attending
        to K cache cells each: the logits of each sequence's last token, F32 [V, B]."""
        def build(ctx: Context, ictx: Context, graph: pyggml.Graph
                  ) -> tuple[dict[str, tuple[Tensor, tuple[int, ...]]], Tensor | None]:
            hp, w = self.hp, self.w
            D, H, A = hp.n_text_state, hp.n_text_head, hp.n_audio_ctx
            Dh, TB = D // H, T * B
            tokens = ictx.new_tensor(GGMLType.I32, [TB], name="tokens").set_input()
            pos = ictx.new_tensor(GGMLType.I32, [TB], name="pos").set_input()
            rows = ictx.new_tensor(GGMLType.I64, [TB], name="rows").set_input()       # cells written
            cells = ictx.new_tensor(GGMLType.I32, [K * B], name="cells").set_input()  # cells read
            mask_t = GGMLType.F16 if self.flash_attn else GGMLType.F32
            mask = ictx.new_tensor(mask_t, [K, T, 1, B], name="mask").set_input()
            x = ctx.get_rows(w["decoder.token_embedding.weight"], tokens) + \
                ctx.get_rows(w["decoder.positional_embedding"], pos)                         # [D, T*B]
            es = self.cross_k[0].nb[0]
            for i in range(hp.n_text_layer):
                p = f"decoder.blocks.{i}"
                cur = self._ln(ctx, x, p + ".attn_ln")
                q = ctx.reshape(self._linear(ctx, cur, p + ".attn.query"), Dh, H, T, B)
                graph.build_forward(ctx.set_rows(self.kv_k[i], ctx.mul_mat(w[p + ".attn.key.weight"], cur), rows))
                graph.build_forward(ctx.set_rows(self.kv_v[i], self._linear(ctx, cur, p + ".attn.value"), rows))
                k = ctx.reshape(ctx.get_rows(self.kv_k[i], cells), Dh, H, K, B)              # [Dh, H, K, B] F32
                v = ctx.reshape(ctx.get_rows(self.kv_v[i], cells), Dh, H, K, B)
                x = self._linear(ctx, self._attend(ctx, q, k, v, mask, H, False), p + ".attn.out") + x
                cur = self._ln(ctx, x, p + ".cross_attn_ln")                                   # every token
                q = ctx.reshape(self._linear(ctx, cur, p + ".cross_attn.query"), Dh, H, TB)    # of every sequence
                ck = ctx.view(self.cross_k[i], [Dh, H, A], nb=[Dh * es, D * es])
                if self.flash_attn:
                    cv = ctx.view(self.cross_v[i], [Dh, H, A], nb=[Dh * es, D * es])
                else:                                                                         # [A, Dh, H]
                    cv = ctx.view(self.cross_v[i], [A, Dh, H], nb=[A * es, A * Dh * es])
                o = self._attend(ctx, q, ck, cv, None, H, not self.flash_attn)
                x = self._linear(ctx, o, p + ".cross_attn.out") + x
                x = self._mlp(ctx, x, p)
            if T > 1:                                                   # the last token's logits only
                x = ctx.view(x, [D, 1], offset=(T - 1) * x.nb[1])
            x = self._ln(ctx, x, "decoder.ln")
            logits = ctx.mul_mat(w["decoder.token_embedding.weight"], x).set_output()        # [V, B]
            graph.build_forward(logits)
            return {"tokens": (tokens, (TB,)), "pos": (pos, (TB,)), "rows": (rows, (TB,)),
                    "cells": (cells, (B, K)), "mask": (mask, (B, T, K))}, logits
        return build

    def decode(self, tokens: Sequence[int], cells: Sequence[int]) -> np.ndarray:
        """Run ``tokens`` after a history: ``cells`` are the cache cells of every position of the
        sequence, the history's and then one per token (written by this call), so the tokens
        are at positions ``len(cells) - len(tokens)``... Returns the float32 logits of the last
        token, NumPy shape (n_vocab,). Call after :meth:`encode`. Raises ValueError when the
        sequence does not fit the text context (448 positions), for an id or a cell out of range."""
        logits: np.ndarray = self.decode_batch([tokens], [cells])[0]
        return logits

    def decode_batch(self, tokens: Sequence[Sequence[int]], cells: Sequence[Sequence[int]]) -> np.ndarray:
        """:meth:`decode` of several sequences at once, in one graph (a beam search's beams):
        ``tokens[b]`` after sequence b's history, ``cells[b]`` its cells as there. The sequences
        must all be as long, and with more than one, each gets one new token. Returns float32
        logits, NumPy shape (len(tokens), n_vocab)."""
        hp = self.hp
        B = len(tokens)
        if B == 0 or len(cells) != B:
            raise ValueError("give the tokens and the cells of one or more sequences")
        T, n = len(tokens[0]), len(cells[0])
        if any(len(t) != T for t in tokens) or any(len(c) != n for c in cells) or (B > 1 and T != 1):
            raise ValueError("the sequences of a batch must be as long, and get one token each")
        p0 = n - T
        if T == 0 or p0 < 0 or n > hp.n_text_ctx:
            raise ValueError(f"{T} tokens after {p0} do not fit the decoder's {hp.n_text_ctx} positions")
        tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
        cel = np.asarray(cells, dtype=np.int64)
        if tok.min() < 0 or tok.max() >= hp.n_vocab:
            raise ValueError(f"token ids must be in 0..{hp.n_vocab - 1}")
        if cel.min() < 0 or cel.max() >= self.n_cells:
            raise ValueError(f"cells must be in 0..{self.n_cells - 1}")
        K = min(hp.n_text_ctx, -(-n // KV_PAD) * KV_PAD)
        key = (T, K, B)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = self._new_graph(64 * hp.n_text_layer + 64, self._build_decoder(T, K, B))
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)[1].close()
        else:
            self._graphs.move_to_end(key)
        a = g.arrays
        positions = np.arange(p0, n, dtype=np.int32)
        a["tokens"][:] = tok
        a["pos"][:] = np.tile(positions, B)
        a["rows"][:] = cel[:, p0:].reshape(-1)
        a["cells"][:, :n] = cel
        a["cells"][:, n:] = cel[:, :1]               # padding: masked
        a["mask"][:] = np.where(np.arange(K)[None, None, :] <= positions[None, :, None], 0.0, -np.inf)
        g.sched.compute(g.graph)
        assert g.out is not None
        logits = np.empty((B, hp.n_vocab), dtype=np.float32)
        lib.ggml_backend_tensor_get(g.out.ptr, ffi.from_buffer(logits), 0, logits.nbytes)
        return logits
