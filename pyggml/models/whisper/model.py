"""Whisper as ggml graphs: the weights in backend buffers, the encoder of one 30-s window, the
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

The graphs (:class:`pyggml.runtime.GraphCache`: the encoder's, and the decoder's of each (T, K,
B)) share one scheduler over the model's backend and the CPU, its compute buffer reserved at
load for the encoder, the largest (on the CPU alone, each graph has a graph allocator of its
own while their buffers stay within the cache's budget, so that switching graphs places
nothing again): the encoder graph is computed once per window, a decoder
graph again at every step with new inputs (token ids, positions, the causal mask and the cache
cells, written in place). The cache is written inside the decoder graph (``set_rows``), the
cross K/V inside the encoder graph (``cpy``): nothing of either goes through NumPy.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import numpy as np

from pyggml import Context, GGMLType, Tensor
from pyggml.runtime import BackendSet, GraphParts, bf16_products_fast, load_tensors, model_graphs

from .audio import FRAMES
from .hparams import Specials
from .loader import WhisperFile

__all__ = ["WhisperNet", "KV_PAD"]

#: decoder graphs attend to the first multiple of KV_PAD cache cells covering the tokens
KV_PAD = 32
_EPS = 1e-5
_ENCODER = ("encoder",)


class WhisperNet:
    """A Whisper model file on a ggml backend: ``backend`` ``"cpu"`` or a device name
    (``"CUDA0"``, ``"Vulkan0"``, ``"TORCH0"``, ``"numpy"``...); a :class:`~pyggml.Scheduler` runs
    on it what it supports and the rest on the CPU backend (``n_threads``, default: the cores
    this process may use). ``flash_attn`` (default, as whisper.cpp): the attention with
    ``ggml_flash_attn_ext`` (on 2 CPU cores the encoder takes 210 ms instead of 360 for
    tiny.en); False: ``mul_mat`` + ``soft_max``. ``n_cells``: cells of the KV cache (default 3 x
    n_text_ctx: beam search gives each beam's tokens cells of their own, the prompt plus beams
    x tokens per window: 1,123 for 5 beams of 224 tokens). ``max_graphs``: decoder graphs kept
    (least recently used ones are freed). ``repack``: on the CPU backend, each matrix that only
    products read goes where llama.cpp's rule puts it (:meth:`pyggml.Device.weight_buffer_type`:
    ``CPU_REPACK`` for Q4_0 on x86, ``AMX`` for Q8_0 on Intel CPUs with AMX);
    :attr:`weight_buffers` says where the weights went. ``encoder_bf16``: the matrices the
    encoder graph multiplies (its layers' and the decoder's cross-attention key and value
    projections), stored F16 or F32, converted to BF16 at load; None (default): where BF16
    products are fast (``pyggml.runtime.bf16_products_fast``: the CPU backend with
    AVX512-BF16, where the 30-s encoder of tiny.en takes about 0.75x the F16 time, the tests'
    transcripts the same); :attr:`encoder_bf16` says whether they were (False for a file that
    holds them quantized). ``n_slots``: windows whose cross K/V
    and KV cells the model holds at once (:meth:`set_slots`), decoded together by
    :meth:`decode_batch`. Raises :class:`pyggml.BackendNotAvailableError` for an unknown
    device."""

    def __init__(self, f: WhisperFile, *, backend: str = "cpu", n_threads: int | None = None,
                 flash_attn: bool = True, max_graphs: int = 16, n_cells: int | None = None,
                 repack: bool = True, n_slots: int = 1, encoder_bf16: bool | None = None):
        self.hp = hp = f.hparams
        self.eot = Specials.of(hp).eot
        self.n_cells = n_cells or 3 * hp.n_text_ctx
        self.flash_attn = flash_attn
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, not {n_slots}")
        self.n_slots = n_slots
        self._state_ctx: Context | None = None
        self._stack = contextlib.ExitStack()
        try:
            bs = self._stack.enter_context(BackendSet([backend], n_threads))
            self.cpu, self.home, self.backends = bs.cpu, bs.homes[0], bs.backends

            def linear(name: str) -> bool:   # read by products only: not the embeddings (GET_ROWS,
                info = f.tensor_info(name)   # views) nor the convolutions' kernels
                return len(info.ne) == 2 and name.endswith(".weight") and "embedding" not in name

            bf16 = bf16_products_fast(backend) if encoder_bf16 is None else encoder_bf16
            converted: list[str] = []

            def type_of(name: str, t: GGMLType) -> GGMLType:
                encoder = name.startswith("encoder.blocks.") or ".cross_attn.key." in name \
                    or ".cross_attn.value." in name
                if bf16 and encoder and t in (GGMLType.F16, GGMLType.F32) and linear(name):
                    converted.append(name)
                    return GGMLType.BF16
                return t

            weights = self._stack.enter_context(load_tensors(f, self.home, type_of=type_of,
                                                             repack=linear if repack else None))
            #: whether the encoder graph's matrices were converted to BF16 (``encoder_bf16``)
            self.encoder_bf16 = bool(converted)
            self.w: dict[str, Tensor] = dict(weights)
            #: buffer type name -> the number of weights in it
            self.weight_buffers = {name: n for name, (n, _) in weights.buffers.items()}
            self._init_state()
            self._stack.callback(self._close_state)   # after the graphs that read it, before the backends
            n = 64 * hp.n_audio_layer + 16 * hp.n_text_layer + 64     # the encoder's, the largest
            # (on the CPU alone a beam step after the prompt's graph places nothing again)
            self.graphs = self._stack.enter_context(model_graphs(
                self._build, bs.backends, graph_size=n, n_tensors=n, max_graphs=max_graphs + 1))
            self.graphs.reserve(_ENCODER + (0,))
        except BaseException:
            self.close()
            raise

    def _init_state(self) -> None:
        """For each of the S slots (:attr:`n_slots`), the self-attention KV cache (F16 [D, N]
        per layer, K and V: slot s has cells s x N ... (s + 1) x N - 1) and the cross K (F16
        [D, A]) and V (F16 [A, D], transposed for ``mul_mat``; [D, A] with flash attention),
        the slots one after the other ([D, N x S], [D, A x S] or [A, D x S]). Replaces the
        state only once the new one is allocated."""
        hp = self.hp
        D, C, A, L, S = hp.n_text_state, self.n_cells, hp.n_audio_ctx, hp.n_text_layer, self.n_slots
        ctx = Context.for_tensors(4 * L)
        try:
            f16 = GGMLType.F16
            kv_k = [ctx.new_tensor(f16, [D, C * S], name=f"kv_k_{i}") for i in range(L)]
            kv_v = [ctx.new_tensor(f16, [D, C * S], name=f"kv_v_{i}") for i in range(L)]
            cross_k = [ctx.new_tensor(f16, [D, A * S], name=f"cross_k_{i}") for i in range(L)]
            cross_v = [ctx.new_tensor(f16, [D, A * S] if self.flash_attn else [A, D * S], name=f"cross_v_{i}")
                       for i in range(L)]
            ctx.alloc_tensors(self.home).clear(0)
        except BaseException:
            ctx.close()
            raise
        self._close_state()
        self.kv_k, self.kv_v, self.cross_k, self.cross_v = kv_k, kv_v, cross_k, cross_v
        self._state_ctx = ctx

    def _close_state(self) -> None:
        if self._state_ctx is not None:
            self._state_ctx.close()
            self._state_ctx = None

    def set_slots(self, n_slots: int) -> None:
        """Hold ``n_slots`` windows at once: the cache and the cross K/V made again (empty),
        the graphs that read the old ones dropped. Raises ValueError for n_slots < 1,
        MemoryError if the backend cannot hold them (the old ones are kept then)."""
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, not {n_slots}")
        if n_slots == self.n_slots:
            return
        old = self.n_slots
        self.graphs.clear()
        self.n_slots = n_slots
        try:
            self._init_state()
        except BaseException:
            self.n_slots = old
            raise

    def close(self) -> None:
        """Free the graphs, the caches, the weights and the backends (idempotent)."""
        self._stack.close()

    def __enter__(self) -> "WhisperNet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self, g: GraphParts, kind: str, *shape: Any) -> dict[str, Tensor]:
        """The encoder graph of key ``("encoder", slot)``, the decoder graph of key
        ``("decoder", T, K, B, W, slot)`` or the alignment graph of key ``("align", T, K,
        heads, slot)`` (:meth:`align`)."""
        if kind == "encoder":
            self._build_encoder(g, *shape)
        elif kind == "align":
            T, K, heads, slot = shape
            self._build_decoder(g, T, K, 1, 1, slot, heads)
        else:
            self._build_decoder(g, *shape)
        return {}

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

    # ------------------------------------------------------------------ encoder
    def _cross(self, ctx: Context, i: int, slot: int, n: int = 1) -> tuple[Tensor, Tensor]:
        """Layer i's cross K and V of slots ``slot`` .. ``slot + n - 1``: K ne [D, A, n], V ne
        [D, A, n] (flash attention) or [A, D, n] (views)."""
        hp = self.hp
        D, A = hp.n_text_state, hp.n_audio_ctx
        k, v = self.cross_k[i], self.cross_v[i]
        es = k.nb[0]
        ck = ctx.view(k, [D, A, n], nb=[D * es, D * A * es], offset=slot * D * A * es)
        cv = ctx.view(v, [D, A, n] if self.flash_attn else [A, D, n], nb=[v.ne[0] * es, D * A * es],
                      offset=slot * D * A * es)
        return ck, cv

    def _build_encoder(self, g: GraphParts, slot: int) -> None:
        hp, w, ctx = self.hp, self.w, g.ctx
        S, A, H = hp.n_audio_state, hp.n_audio_ctx, hp.n_audio_head
        mel = g.input(GGMLType.F32, [FRAMES, hp.n_mels], "mel")                                    # [F, M]
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
            ck, cv = self._cross(ctx, i, slot)
            g.graph.build_forward(ctx.cpy(k, ctx.reshape(ck, *ck.ne[:2])))
            g.graph.build_forward(ctx.cpy(v if self.flash_attn else ctx.transpose(v), ctx.reshape(cv, *cv.ne[:2])))

    def encode(self, mel: np.ndarray, slot: int = 0) -> None:
        """Encode one window: ``mel`` float32, NumPy shape (n_mels, 3000); the cross K/V of every
        decoder layer are left in the model, in slot ``slot``, for :meth:`decode`. Raises
        ValueError for another shape or a slot out of range."""
        if mel.shape != (self.hp.n_mels, FRAMES):
            raise ValueError(f"mel must have NumPy shape ({self.hp.n_mels}, {FRAMES}), not {mel.shape}")
        self._check_slots(slot, 1)
        key = _ENCODER + (slot,)
        self.graphs.get(key).arrays["mel"][...] = mel
        self.graphs.compute(key, [])

    def _check_slots(self, slot: int, n: int) -> None:
        if not (0 <= slot and slot + n <= self.n_slots):
            raise ValueError(f"slots {slot}..{slot + n - 1} are not among the model's {self.n_slots} (n_slots)")

    # ------------------------------------------------------------------ decoder
    def _build_decoder(self, g: GraphParts, T: int, K: int, B: int, W: int = 1, slot: int = 0,
                       heads: tuple[tuple[int, int], ...] | None = None) -> None:
        """The decoder graph of B sequences of T new tokens each, attending to K cache cells
        each: the logits of each sequence's last token, F32 [V, B]. The sequences are W
        windows' (B / W each, in order), window w's cross-attention reading slot ``slot + w``. With
        ``heads`` (B = 1; :meth:`align`), instead: the scaled cross-attention scores of those
        (layer, head) pairs, F32 [A, T] each (``qk{n}``), and each token's probability of the
        token after it among the text tokens, F32 [1, T] (``probs``, at the rows of input
        ``pick``: next token + t x eot)."""
        hp, w, ctx = self.hp, self.w, g.ctx
        D, H, A = hp.n_text_state, hp.n_text_head, hp.n_audio_ctx
        Dh, TB = D // H, T * B
        tokens = g.input(GGMLType.I32, [TB], "tokens")
        pos = g.input(GGMLType.I32, [TB], "pos")
        rows = g.input(GGMLType.I64, [TB], "rows")                                    # cells written
        cells = g.input(GGMLType.I32, [K * B], "cells")                               # cells read
        mask = g.input(GGMLType.F16 if self.flash_attn else GGMLType.F32, [K, T, 1, B], "mask")
        x = ctx.get_rows(w["decoder.token_embedding.weight"], tokens) + \
            ctx.get_rows(w["decoder.positional_embedding"], pos)                                  # [D, T*B]
        es = self.cross_k[0].nb[0]
        for i in range(hp.n_text_layer):
            p = f"decoder.blocks.{i}"
            cur = self._ln(ctx, x, p + ".attn_ln")
            q = ctx.reshape(self._linear(ctx, cur, p + ".attn.query"), Dh, H, T, B)
            g.graph.build_forward(ctx.set_rows(self.kv_k[i], ctx.mul_mat(w[p + ".attn.key.weight"], cur), rows))
            g.graph.build_forward(ctx.set_rows(self.kv_v[i], self._linear(ctx, cur, p + ".attn.value"), rows))
            k = ctx.reshape(ctx.get_rows(self.kv_k[i], cells), Dh, H, K, B)                   # [Dh, H, K, B] F32
            v = ctx.reshape(ctx.get_rows(self.kv_v[i], cells), Dh, H, K, B)
            x = self._linear(ctx, self._attend(ctx, q, k, v, mask, H, False), p + ".attn.out") + x
            cur = self._ln(ctx, x, p + ".cross_attn_ln")                                        # every token
            # every token of every sequence, each window's against its own slot: [Dh, H, T*B/W, W]
            q = ctx.reshape(self._linear(ctx, cur, p + ".cross_attn.query"), Dh, H, TB // W, W)
            at = slot * D * A * es
            ck = ctx.view(self.cross_k[i], [Dh, H, A, W], nb=[Dh * es, D * es, D * A * es], offset=at)
            if self.flash_attn:
                cv = ctx.view(self.cross_v[i], [Dh, H, A, W], nb=[Dh * es, D * es, D * A * es], offset=at)
            else:                                                                              # [A, Dh, H, W]
                cv = ctx.view(self.cross_v[i], [A, Dh, H, W], nb=[A * es, A * Dh * es, A * D * es], offset=at)
            o = self._attend(ctx, q, ck, cv, None, H, not self.flash_attn)
            x = self._linear(ctx, o, p + ".cross_attn.out") + x
            x = self._mlp(ctx, x, p)
            mine = [(n, h) for n, (layer, h) in enumerate(heads or ()) if layer == i]
            if mine:                                              # the scores, as mul_mat + soft_max see them
                kq = ctx.mul_mat(ctx.permute(ck, 0, 2, 1, 3), ctx.permute(q, 0, 2, 1, 3))   # [A, T, H]
                for n, h in mine:
                    one = ctx.view(kq, [A, T], nb=[kq.nb[1]], offset=h * kq.nb[2])
                    g.output(ctx.scale(one, 1.0 / math.sqrt(Dh)), f"qk{n}")
        if heads is not None:
            x = self._ln(ctx, x, "decoder.ln")                                                   # [D, T]
            eot = self.eot
            logits = ctx.mul_mat(w["decoder.token_embedding.weight"], x)                          # [V, T]
            text = ctx.soft_max(ctx.cont(ctx.view(logits, [eot, T], nb=[logits.nb[1]])))           # [eot, T]
            pick = g.input(GGMLType.I32, [T], "pick")
            g.output(ctx.get_rows(ctx.reshape(text, 1, eot * T), pick), "probs")                 # [1, T]
            return
        if T > 1:                                                 # each sequence's last token's logits only
            x = ctx.cont(ctx.view(x, [D, B], nb=[T * x.nb[1]], offset=(T - 1) * x.nb[1]))
        x = self._ln(ctx, x, "decoder.ln")
        g.output(ctx.mul_mat(w["decoder.token_embedding.weight"], x), "logits")                 # [V, B]

    def decode(self, tokens: Sequence[int], cells: Sequence[int]) -> np.ndarray:
        """Run ``tokens`` after a history: ``cells`` are the cache cells of every position of the
        sequence, the history's and then one per token (written by this call), so the tokens
        are at positions ``len(cells) - len(tokens)``... Returns the float32 logits of the last
        token, NumPy shape (n_vocab,). Call after :meth:`encode`. Raises ValueError when the
        sequence does not fit the text context (448 positions), for an id or a cell out of range."""
        logits: np.ndarray = self.decode_batch([tokens], [cells])[0]
        return logits

    def decode_batch(self, tokens: Sequence[Sequence[int]], cells: Sequence[Sequence[int]], *,
                     windows: int = 1, slot: int = 0, copy: bool = True) -> np.ndarray:
        """:meth:`decode` of several sequences at once, in one graph (a beam search's beams, or
        the beams of several windows): ``tokens[b]`` after sequence b's history, ``cells[b]``
        its cells as there. The sequences must all be as long and get as many tokens. They are
        ``windows`` windows' in order, as many each: window w's read the cross K/V of slot
        ``slot + w`` (:meth:`encode`). Returns float32 logits, NumPy shape (len(tokens),
        n_vocab): a new array, or with ``copy=False`` the graph's own output memory, valid
        (and writable) until this graph is computed again (a decoding loop that reads each
        step's logits before the next step saves a copy of them). Raises ValueError as
        :meth:`decode`, for sequences that do not divide into the windows and for slots out of
        range."""
        hp = self.hp
        B = len(tokens)
        if B == 0 or len(cells) != B:
            raise ValueError("give the tokens and the cells of one or more sequences")
        if windows < 1 or B % windows:
            raise ValueError(f"{B} sequences do not divide into {windows} windows")
        self._check_slots(slot, windows)
        T, n = len(tokens[0]), len(cells[0])
        if any(len(t) != T for t in tokens) or any(len(c) != n for c in cells):
            raise ValueError("the sequences of a batch must be as long, and get as many tokens")
        p0 = n - T
        if T == 0 or p0 < 0 or n > hp.n_text_ctx:
            raise ValueError(f"{T} tokens after {p0} do not fit the decoder's {hp.n_text_ctx} positions")
        tok = self._ids(tokens)
        cel = np.asarray(cells, dtype=np.int64)
        if cel.min() < 0 or cel.max() >= self.n_cells * self.n_slots:
            raise ValueError(f"cells must be in 0..{self.n_cells * self.n_slots - 1}")
        K = min(hp.n_text_ctx, -(-n // KV_PAD) * KV_PAD)
        key = ("decoder", T, K, B, windows, slot)
        a = self.graphs.get(key).arrays
        self._fill(a, tok, cel, p0, K)
        self.graphs.compute(key, [])
        logits = a["logits"].reshape(B, hp.n_vocab)
        return np.array(logits) if copy else logits

    def _ids(self, tokens: Sequence[Sequence[int]] | Sequence[int]) -> np.ndarray:
        """``tokens`` as int64, flat; ValueError for an id outside the vocabulary."""
        tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tok.size and (tok.min() < 0 or tok.max() >= self.hp.n_vocab):
            raise ValueError(f"token ids must be in 0..{self.hp.n_vocab - 1}")
        return tok

    @staticmethod
    def _fill(a: dict[str, np.ndarray], tok: np.ndarray, cel: np.ndarray, p0: int, K: int) -> None:
        """A decoder graph's inputs, written in place: B sequences (the rows of ``cel``, each
        sequence's cells) of T new tokens at positions p0.. (their cells the last T of a row),
        each reading its first K cells (the padding masked)."""
        B, n = cel.shape
        T = n - p0
        positions = np.arange(p0, n, dtype=np.int32)
        a["tokens"][:] = tok
        a["pos"][:] = np.tile(positions, B)
        a["rows"][:] = cel[:, p0:].reshape(-1)
        read = a["cells"].reshape(B, K)
        read[:, :n] = cel
        read[:, n:] = cel[:, :1]                    # padding: masked
        a["mask"].reshape(B, T, K)[:] = np.where(np.arange(K)[None, None, :] <= positions[None, :, None], 0.0, -np.inf)

    def align(self, tokens: Sequence[int], heads: Sequence[tuple[int, int]],
              slot: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """What word timestamps need of the window :meth:`encode` left in slot ``slot``, for the
        sequence ``tokens`` (start of transcript, text tokens, end of text; at cells 0..T-1,
        which it overwrites): the scaled cross-attention scores (q.k / sqrt(Dh), before the
        softmax) of the (layer, head) pairs ``heads``, float32 NumPy shape (len(heads), T,
        n_audio_ctx), and each token's probability of the token after it among the text tokens
        (a softmax over the ids below end of text; 0 where the next token is not text),
        float32 (T,). One graph per length. Raises ValueError as :meth:`decode_batch` and for a
        head out of range."""
        hp = self.hp
        T = len(tokens)
        hs = tuple((int(layer), int(h)) for layer, h in heads)
        if not hs or any(not (0 <= layer < hp.n_text_layer and 0 <= h < hp.n_text_head) for layer, h in hs):
            raise ValueError(f"heads must be (layer, head) pairs in ({hp.n_text_layer}, {hp.n_text_head})")
        if T == 0 or T > hp.n_text_ctx:
            raise ValueError(f"{T} tokens do not fit the decoder's {hp.n_text_ctx} positions")
        self._check_slots(slot, 1)
        tok = self._ids(tokens)
        K = min(hp.n_text_ctx, -(-T // KV_PAD) * KV_PAD)
        key = ("align", T, K, hs, slot)
        a = self.graphs.get(key).arrays
        self._fill(a, tok, np.arange(T)[None] + slot * self.n_cells, 0, K)
        nxt = np.append(tok[1:], self.eot)
        text = nxt < self.eot
        a["pick"][:] = np.where(text, nxt, 0) + np.arange(T) * self.eot
        out = self.graphs.compute(key, [f"qk{n}" for n in range(len(hs))] + ["probs"])
        qk = np.stack([out[f"qk{n}"].reshape(T, hp.n_audio_ctx) for n in range(len(hs))])
        return qk, np.where(text, out["probs"].reshape(T), 0.0).astype(np.float32)
