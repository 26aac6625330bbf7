"""The llama architecture as ggml graphs: weights and KV cache in backend buffers, one graph per
shape, built once and computed again with new inputs.

Shapes in comments are ggml ``ne`` order (fastest-varying first): E = n_embd, D = head_dim,
H = n_head, Hkv = n_head_kv, T = tokens in the batch, C = n_ctx (KV cache cells), K = KV cells the
graph attends to (C padded down to a bucket, see :attr:`LlamaModel.kv_pad`), V = n_vocab.

The KV cache holds one F16 (or F32) tensor per layer for K, ne [Hkv*D, C], and one for V, ne
[C, Hkv*D] (transposed, so that ``mul_mat`` reads it without a copy) or, with flash attention,
[Hkv*D, C]. Token ``i`` of a batch goes to cell ``n_past + i``, written by ``ggml_set_rows`` inside
the graph at the I64 indices given as an input: nothing of the cache goes through NumPy.

A graph depends only on (T, K, all_logits): positions, token ids, the causal mask and the KV
write indices are its inputs (:class:`pyggml.runtime.GraphCache`, one scheduler for all the
graphs, reserved at load for the largest prompt batch), written in place in their NumPy views,
so a decode step writes a few numbers, computes and copies the logits out.
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import numpy as np

from pyggml import Context, GGMLType, Graph, Tensor
from pyggml.backends.device import Device
from pyggml.backends.meta import meta_device
from pyggml.core.gguf import GGUFFile
from pyggml.runtime import BackendSet, GraphParts, find_device, load_tensors, model_graphs

from ..common import layer_owners
from .hparams import HParams, check_tensors
from .split import SPLIT_MODES, TensorSplit

__all__ = ["LlamaModel"]

KV_TYPES = {"f16": GGMLType.F16, "f32": GGMLType.F32}

_META: dict[tuple[object, ...], Device] = {}


def _meta_device(devs: list[Device], policy: TensorSplit) -> Device:
    """A meta device over ``devs`` splitting by ``policy``, made once per devices and split
    (ggml keeps every meta device until the process ends)."""
    key = (tuple(d.name for d in devs), policy.key)
    if key not in _META:
        _META[key] = meta_device(devs, policy)
    return _META[key]


class LlamaModel:
    """A llama model from a GGUF file on a ggml backend, with its KV cache.

    ``backend``: ``"cpu"`` or a device name (``"CUDA0"``, ``"Vulkan0"``, ``"RPC0"``, ``"numpy"``):
    that device holds the weights and the KV cache and a :class:`~pyggml.Scheduler` runs what it
    supports there and the rest on the CPU backend. ``devices``: several device names instead
    (``["RPC0", "RPC1"]``; ``"cpu"`` is the CPU backend), the model split over them by ``split``:
    ``"layer"`` (whole layers per device, with their KV cache) or ``"tensor"`` (every layer's heads
    and FFN split through ggml's meta device; attention then uses ``flash_attn``), in proportion to
    ``tensor_split`` (one weight per device, default equal); see :mod:`.split`. ``n_threads``:
    the CPU backend's (default: the cores this process may use). ``n_ctx``: KV cache cells
    (the longest prompt + generation); ``n_batch``: most tokens per graph when processing a
    prompt; ``flash_attn``: ``ggml_flash_attn_ext`` instead of ``mul_mat`` + ``soft_max`` +
    ``mul_mat``; ``kv_type``: ``"f16"`` (as llama.cpp) or ``"f32"``; ``kv_pad``: graphs attend
    to the first multiple of ``kv_pad`` cells covering the tokens so far (llama.cpp pads the
    same way), so a decode graph is reused for ``kv_pad`` steps. ``max_graphs``: graphs kept
    (least recently used ones are freed). ``dequantize``: load every weight as F32
    (dequantized by ggml's own ``to_float``), for checking the graph against a float32
    reference without the error of the quantized matmuls (which quantize the activations
    too); about 5x the memory of Q4_1. ``repack``: the CPU's matrix weights go where llama.cpp
    puts them (``--repack``, its default): in the first extra buffer type of the CPU device
    that takes their products (:meth:`pyggml.Device.weight_buffer_type`; ``CPU_REPACK`` for
    Q4_0/Q4_K/IQ4_NL on x86); False: all in the CPU's default memory. :attr:`weight_buffers`
    says where they went. ``interruptible``: keep pyggml's Ctrl-C check inside the CPU
    backend's computation (a C throttle that asks Python at most every 10 ms,
    :data:`pyggml.backends.cpu.ABORT_INTERVAL_US`). False: Ctrl-C stops generation when the
    current graph returns.

    Raises :class:`~pyggml.models.common.ModelError` for a file it cannot run, ValueError for
    bad settings, :class:`pyggml.BackendNotAvailableError` for an unknown device.
    """

    def __init__(self, gguf: GGUFFile, *, backend: str = "cpu", devices: Sequence[str] | None = None,
                 split: str = "layer", tensor_split: Sequence[float] | None = None, n_threads: int | None = None,
                 n_ctx: int = 2048, n_batch: int = 512, flash_attn: bool = False, kv_type: str = "f16",
                 kv_pad: int = 256, max_graphs: int = 8, dequantize: bool = False,
                 repack: bool = True, interruptible: bool = True):
        if n_ctx < 1 or n_batch < 1 or kv_pad < 1 or max_graphs < 1:
            raise ValueError("n_ctx, n_batch, kv_pad and max_graphs must be >= 1")
        if n_threads is not None and n_threads < 1:
            raise ValueError("n_threads must be >= 1")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}")
        if split not in SPLIT_MODES:
            raise ValueError(f"split must be one of {SPLIT_MODES}, got {split!r}")
        devices = list(devices) if devices else [backend]
        if len({d.lower() for d in devices}) != len(devices):
            raise ValueError(f"a device appears twice in {devices}")
        weights = list(tensor_split) if tensor_split is not None else [1.0] * len(devices)
        if len(weights) != len(devices) or any(x < 0 for x in weights) or sum(weights) <= 0:
            raise ValueError(f"tensor_split needs {len(devices)} non-negative weights with a positive sum")
        self.hp = hp = HParams.from_gguf(gguf)
        names = check_tensors(gguf, hp)
        self.n_ctx, self.n_batch, self.kv_pad = n_ctx, n_batch, kv_pad
        self.split_mode = split if len(devices) > 1 else None
        self.flash_attn, self.kv_type = flash_attn or self.split_mode == "tensor", KV_TYPES[kv_type]
        self._stack = contextlib.ExitStack()
        try:
            self._init_backends(devices, weights, n_threads, interruptible)
            owners = layer_owners(hp.n_layer, weights) if self.split_mode == "layer" else [0] * hp.n_layer
            self.layer_home = owners
            last = len(self.homes) - 1

            def home_of(name: str) -> int:
                return owners[int(name.split(".")[1])] if name.startswith("blk.") else last

            # weights: the file's bytes straight into buffers of their device (quantized tensors
            # stay quantized), the matrices only products read in the CPU's extra buffer types
            self.w: dict[str, Tensor] = {}
            #: buffer type name -> (tensors, bytes) of the weights in it
            self.weight_buffers: dict[str, tuple[int, int]] = {}
            for j, home in enumerate(self.homes):
                mine = [n for n in names if home_of(n) == j]
                if not mine:
                    continue
                loaded = self._stack.enter_context(load_tensors(
                    gguf, home, mine, type_of=(lambda n, t: GGMLType.F32) if dequantize else None,
                    repack=(lambda n: n != "token_embd.weight" and len(gguf.tensor_info(n).ne) == 2)
                    if repack and home is self.cpu else None))
                self.w.update(loaded)
                for buft, (n, size) in loaded.buffers.items():
                    n0, size0 = self.weight_buffers.get(buft, (0, 0))
                    self.weight_buffers[buft] = (n0 + n, size0 + size)
            self.out_weight = self.w.get("output.weight", self.w["token_embd.weight"])  # tied
            self._init_cache()
            n_tensors = 48 * hp.n_layer + 64
            # (on the CPU alone a decode step after a prompt batch places nothing again).
            # ggml's meta backend keeps the KV-cache views of the graphs placed since it last
            # switched graphs (pyggml.backends.graph_run.check_meta_views): one graph at a time
            # with a tensor split
            self.graphs = self._stack.enter_context(model_graphs(
                self._build, self.backends, graph_size=n_tensors, n_tensors=n_tensors,
                max_graphs=1 if self.split_mode == "tensor" else max_graphs))
            if self.split_mode != "tensor":   # the compute buffer of the largest prompt batch
                self.graphs.reserve((min(n_batch, n_ctx), self.n_kv_for(n_ctx), False))
        except BaseException:
            self.close()
            raise
        self._tokens: list[int] = []   # the token ids in cells 0.. of the KV cache, in order
        #: (the decode graph, the first cell its mask hides) after the last decode step
        self._mask_open: tuple[object, int] | None = None

    # ------------------------------------------------------------------ lifetime
    def _init_backends(self, devices: list[str], weights: list[float], n_threads: int | None,
                       interruptible: bool) -> None:
        """:attr:`homes`, the backends holding weights and caches (one per device, ``"cpu"`` the
        CPU backend; with ``split="tensor"`` the one backend of a meta device over them), and
        :attr:`backends`, the scheduler's."""
        if self.split_mode != "tensor":
            bs = self._stack.enter_context(BackendSet(devices, n_threads, interruptible=interruptible))
            self.cpu, self.homes, self.backends = bs.cpu, bs.homes, bs.backends
            return
        self.cpu = self._stack.enter_context(BackendSet(["cpu"], n_threads, interruptible=interruptible)).cpu
        devs = [Device.of(self.cpu) if d.lower() == "cpu" else find_device(d) for d in devices]
        meta = _meta_device(devs, TensorSplit(self.hp, len(devs), weights))
        self.homes = [self._stack.enter_context(meta.init())]
        self.backends = [self.homes[0], self.cpu]

    def _init_cache(self) -> None:
        """Each layer's K and V cache on the device of its layer."""
        hp, C = self.hp, self.n_ctx
        v_ne = [hp.n_embd_kv, C] if self.flash_attn else [C, hp.n_embd_kv]
        k: dict[int, Tensor] = {}
        v: dict[int, Tensor] = {}
        for j, home in enumerate(self.homes):
            layers = [il for il in range(hp.n_layer) if self.layer_home[il] == j]
            if not layers:
                continue
            ctx = self._stack.enter_context(Context.for_tensors(2 * len(layers)))
            for il in layers:
                k[il] = ctx.new_tensor(self.kv_type, [hp.n_embd_kv, C], name=f"cache_k_l{il}")
                v[il] = ctx.new_tensor(self.kv_type, v_ne, name=f"cache_v_l{il}")
            ctx.alloc_tensors(home).clear(0)  # unused cells are masked, but 0 * NaN would still be NaN
        self.cache_k = [k[il] for il in range(hp.n_layer)]
        self.cache_v = [v[il] for il in range(hp.n_layer)]

    def close(self) -> None:
        """Free graphs, the scheduler, the KV cache, the weights and the backends (idempotent)."""
        self._stack.close()

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the KV cache (the next :meth:`eval` starts at position 0)."""
        self._tokens.clear()

    @property
    def n_past(self) -> int:
        """Cells of the KV cache in use: positions 0 .. n_past - 1 hold :attr:`tokens`. Setting
        it is :meth:`truncate`."""
        return len(self._tokens)

    @n_past.setter
    def n_past(self, n: int) -> None:
        self.truncate(n)

    @property
    def tokens(self) -> list[int]:
        """The token ids the KV cache holds, position by position (a copy)."""
        return list(self._tokens)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cells of the KV cache (positions 0 .. n - 1) and forget the rest:
        the next :meth:`eval` runs at position ``n``. ValueError unless 0 <= n <= :attr:`n_past`."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= len(self._tokens):
            raise ValueError(f"the cache holds {len(self._tokens)} tokens: cannot keep {n!r}")
        del self._tokens[int(n):]

    # ------------------------------------------------------------------ graph
    def _layer(self, ctx: Context, graph: Graph, il: int, x: Tensor, inp: dict[str, Tensor],
               T: int, K: int, last_only: bool) -> Tensor:
        """One transformer block: x ne [E, T] -> [E, T] (or [E, 1] for the last block when only
        the last token's logits are wanted). The block's KV cache writes go into ``graph`` first
        (as llama.cpp does): attention then reads views of the cache tensors themselves, which
        the graph computes after those writes."""
        hp, w = self.hp, self.w
        D, H, Hkv, C = hp.head_dim, hp.n_head, hp.n_head_kv, self.n_ctx
        p = f"blk.{il}."

        def linear(name: str, a: Tensor) -> Tensor:
            y = ctx.mul_mat(w[p + name + ".weight"], a)
            bias = w.get(p + name + ".bias")
            return y + bias if bias is not None else y

        cur = ctx.rms_norm(x, hp.rms_eps) * w[p + "attn_norm.weight"]               # [E, T]
        q = ctx.reshape(linear("attn_q", cur), D, H, T)                              # [D, H, T]
        k = ctx.reshape(linear("attn_k", cur), D, Hkv, T)                            # [D, Hkv, T]
        v = linear("attn_v", cur)                                                    # [Hkv*D, T]
        # GGUF llama Q/K rows are permuted for ggml's normal rope (mode 0)
        def rope(a: Tensor) -> Tensor:
            return ctx.rope(a, inp["pos"], hp.n_rot, mode=0, n_ctx_orig=hp.n_ctx_train,
                            freq_base=hp.rope_freq_base, freq_scale=hp.rope_freq_scale,
                            freq_factors=w.get("rope_freqs.weight"))

        q, k = rope(q), rope(k)

        # write this batch's K and V into the cache, then attend to its first K cells
        kc, vc = self.cache_k[il], self.cache_v[il]
        es = kc.nb[0]
        graph.build_forward(ctx.set_rows(kc, ctx.reshape(k, hp.n_embd_kv, T), inp["k_idx"]))
        if self.flash_attn:
            graph.build_forward(ctx.set_rows(vc, v, inp["k_idx"]))
        else:  # V cache transposed, ne [C, Hkv*D]: element j of token t goes to (cell(t), j).
            # Rows of one element: the cache seen as ne [1, C, Hkv*D] and v as [1, T, Hkv*D];
            # set_rows broadcasts the T cell indices over ne[2]
            graph.build_forward(ctx.set_rows(ctx.view(vc, [1, C, hp.n_embd_kv], nb=[es, vc.nb[1]]),
                                             ctx.view(v, [1, T, hp.n_embd_kv], nb=[v.nb[1], v.nb[0]]),
                                             inp["k_idx"]))
        # [D, Hkv, K] permuted to [D, K, Hkv] (ggml's meta backend splits such a view by heads)
        k_view = ctx.permute(ctx.view(kc, [D, Hkv, K], nb=[D * es, kc.nb[1]]), 0, 2, 1, 3)
        qp = ctx.permute(q, 0, 2, 1, 3)                                              # [D, T, H]
        scale = 1.0 / math.sqrt(D)
        if self.flash_attn:
            v_view = ctx.permute(ctx.view(vc, [D, Hkv, K], nb=[D * es, vc.nb[1]]), 0, 2, 1, 3)
            o = ctx.flash_attn(qp, k_view, v_view, inp["kq_mask"], scale)            # [D, H, T]
        else:
            v_view = ctx.view(vc, [K, D, Hkv], nb=[C * es, C * es * D])              # [K, D, Hkv]
            kq = ctx.mul_mat(k_view, qp)                                             # [K, T, H]
            kq = ctx.soft_max(kq, inp["kq_mask"], scale=scale)                       # causal, scaled
            kqv = ctx.mul_mat(v_view, kq)                                            # [D, T, H]
            o = ctx.cont(ctx.permute(kqv, 0, 2, 1, 3))                               # [D, H, T]
        cur = linear("attn_output", ctx.reshape(o, hp.n_embd_q, T))                  # [E, T]
        if last_only and T > 1:  # the last block computes the FFN of the last token only
            cur = ctx.view(cur, [hp.n_embd, 1], offset=(T - 1) * cur.nb[1])
            x = ctx.view(x, [hp.n_embd, 1], offset=(T - 1) * x.nb[1])
        x = cur + x
        cur = ctx.rms_norm(x, hp.rms_eps) * w[p + "ffn_norm.weight"]
        h = ctx.swiglu(ctx.mul_mat(w[p + "ffn_gate.weight"], cur),                  # silu(gate) * up
                       ctx.mul_mat(w[p + "ffn_up.weight"], cur))                     # [F, T]
        return ctx.mul_mat(w[p + "ffn_down.weight"], h) + x                          # [E, T]

    def _build(self, g: GraphParts, T: int, K: int, all_logits: bool) -> dict[str, Tensor]:
        """The graph for T tokens attending to K cache cells: the logits, F32 [V, T] with
        ``all_logits``, else [V, 1] (the last token's)."""
        hp, ctx = self.hp, g.ctx
        inp: dict[str, Tensor] = {
            "tokens": g.input(GGMLType.I32, [T], "tokens"),
            "pos": g.input(GGMLType.I32, [T], "pos"),
            "kq_mask": g.input(GGMLType.F16 if self.flash_attn else GGMLType.F32, [K, T], "kq_mask"),
            "k_idx": g.input(GGMLType.I64, [T], "k_idx"),
        }
        x = ctx.get_rows(self.w["token_embd.weight"], inp["tokens"])                 # [E, T] F32
        for il in range(hp.n_layer):
            x = self._layer(ctx, g.graph, il, x, inp, T, K, last_only=(il == hp.n_layer - 1 and not all_logits))
        x = ctx.rms_norm(x, hp.rms_eps) * self.w["output_norm.weight"]
        logits = ctx.mul_mat(self.out_weight, x)                                      # [V, n_out]
        g.output(logits, "logits")               # in host memory of its own: read without a C call
        return {}

    def n_kv_for(self, n_tokens: int) -> int:
        """Cache cells a graph attends to when ``n_tokens`` cells are used: the next multiple of
        :attr:`kv_pad`, at most ``n_ctx``."""
        return min(self.n_ctx, -(-n_tokens // self.kv_pad) * self.kv_pad)

    @property
    def graphs_built(self) -> int:
        """Graphs built so far (the largest prompt batch's, reserved at load, included)."""
        return self.graphs.builds

    @property
    def t_compute(self) -> float:
        """Seconds inside ggml's compute (and pyggml's cached checks of it), summed."""
        return self.graphs.compute_seconds

    def splits(self) -> int:
        """Scheduler splits of the most recently computed graph (1: all on one backend)."""
        s = self.graphs.scheduler
        if self.graphs.latest is None:
            return 0
        return s.n_splits if s is not None else 1

    @property
    def graph_shapes(self) -> list[tuple[int, int, bool]]:
        """(tokens, KV cells, all_logits) of the graphs kept, least recently used first."""
        return list(self.graphs.keys)   # type: ignore[arg-type]

    def placement(self) -> dict[str, set[str]]:
        """Backend name -> the ops the scheduler gave it in the most recently computed graph
        (views and reshapes, which compute nothing, left out)."""
        out: dict[str, set[str]] = {}
        latest, sched = self.graphs.latest, self.graphs.scheduler
        if latest is not None:
            for node in latest.graph.nodes:
                backend = sched.get_tensor_backend(node) if sched is not None else self.cpu
                if backend is not None and not node.is_empty_op():
                    out.setdefault(backend.name, set()).add(node.op_name)
        return out

    # ------------------------------------------------------------------ compute
    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run ``ids`` at positions ``n_past, n_past+1, ...`` (in batches of ``n_batch``), adding
        them to the KV cache. Returns float32 logits, NumPy shape (n_vocab,) for the last token,
        or (len(ids), n_vocab) with ``all_logits`` (new arrays; :meth:`step` decodes a token
        without the copy).

        Raises ValueError for an empty batch, an id outside the vocabulary, or more tokens than
        the cache holds (``n_ctx``); nothing is computed then.
        """
        if len(ids) == 1 and not all_logits and isinstance(ids[0], (int, np.integer)):  # a decode step
            return np.array(self.step(int(ids[0])))
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if a.size == 0:
            raise ValueError("no tokens to evaluate")
        lo, hi = (int(a[0]), int(a[0])) if a.size == 1 else (int(a.min()), int(a.max()))  # one id: no reductions
        if lo < 0 or hi >= self.hp.n_vocab:
            raise ValueError(f"token ids must be in 0..{self.hp.n_vocab - 1}")
        if self.n_past + a.size > self.n_ctx:
            raise ValueError(f"{self.n_past} + {a.size} tokens do not fit the context of {self.n_ctx} "
                             "(use a larger n_ctx / --ctx-size)")
        out = []
        for start in range(0, a.size, self.n_batch):
            out.append(self._eval_batch(a[start:start + self.n_batch], all_logits))
        return np.concatenate(out) if all_logits else out[-1][-1]

    def prepare_decode(self, n_steps: int = 1) -> None:
        """Build and place the graph of the next decode step now (after a prompt, before the
        first token is sampled), so that the step itself only computes; with ``n_steps`` > 1
        also the graphs of the later steps' KV buckets (:meth:`n_kv_for`), as many as the graph
        cache keeps beside a prompt graph, so that a generation crossing a bucket places a
        graph it built (about 1 ms) instead of building one between two tokens (about 16 ms
        for SmolLM2). Nothing when the cache is full."""
        if self.n_past >= self.n_ctx:
            return
        first = self.n_kv_for(self.n_past + 1)
        last = self.n_kv_for(min(self.n_ctx, self.n_past + max(1, n_steps)))
        buckets = [first]
        while buckets[-1] < last and len(buckets) < self.graphs.max_graphs - 1:
            buckets.append(self.n_kv_for(buckets[-1] + 1))
        for K in [*buckets[1:], first]:   # the next step's last: placed, the others built
            self.graphs.prepare((1, K, False))

    def step(self, token: int) -> np.ndarray:
        """A decode step: ``token`` at position ``n_past``, added to the KV cache. Returns its
        float32 logits, NumPy shape (n_vocab,): a view of the graph's output memory, valid
        until the next call (copy it to keep it). Raises ValueError for an id outside the
        vocabulary or a full cache (nothing is computed then)."""
        if not 0 <= token < self.hp.n_vocab:
            raise ValueError(f"token ids must be in 0..{self.hp.n_vocab - 1}")
        if self.n_past + 1 > self.n_ctx:
            raise ValueError(f"{self.n_past} + 1 tokens do not fit the context of {self.n_ctx} "
                             "(use a larger n_ctx / --ctx-size)")
        return self._decode(token)

    def _decode(self, tok: int) -> np.ndarray:
        """:meth:`step`, checked. The inputs are written in place: a few microseconds of NumPy
        whatever the context, the mask's K cells included."""
        p0 = self.n_past
        key = (1, self.n_kv_for(p0 + 1), False)
        entry = self.graphs.get(key)
        a = entry.arrays
        a["tokens"][0] = tok
        a["pos"][0] = a["k_idx"][0] = p0
        mask = a["kq_mask"]
        if self._mask_open == (entry, p0):                     # the step before was this graph's,
            mask[0, p0] = 0.0                                  # at p0 - 1: one more cell opens
        else:
            mask[0, :p0 + 1] = 0.0                             # causal: cells 0..p0 ...
            mask[0, p0 + 1:] = -np.inf                         # ... and no later one
        self._mask_open = (entry, p0 + 1)
        self.graphs.compute(key, [])
        self._tokens.append(tok)
        return a["logits"].reshape(self.hp.n_vocab)

    def _eval_batch(self, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        T = ids.size
        if T == 1 and not all_logits:
            return np.array(self._decode(int(ids[0]))[None])
        p0 = self.n_past
        K = self.n_kv_for(p0 + T)
        key = (T, K, all_logits)
        a = self.graphs.get(key).arrays
        pos = a["pos"]
        a["tokens"][:] = ids
        pos[:] = np.arange(p0, p0 + T, dtype=np.int32)
        # query i (position p0+i) sees cells 0..p0+i
        a["kq_mask"][:] = np.where(np.arange(K)[None, :] <= pos[:, None], 0.0, -np.inf)
        a["k_idx"][:] = pos
        logits = self.graphs.compute(key, ["logits"])["logits"]     # a copy: the caller keeps it
        self._tokens.extend(ids.tolist())
        return logits.reshape(-1, self.hp.n_vocab)
