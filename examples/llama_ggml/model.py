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
write indices are input tensors. Each graph has its own :class:`pyggml.Scheduler`, allocated
once, so a decode step only copies its inputs in, computes and copies the logits out.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import pyggml
from pyggml import BufferType, Context, CPUBackend, GGMLType, Scheduler, Tensor, ffi, lib
from pyggml.backends.device import Device, device_by_name
from pyggml.backends.meta import meta_device
from pyggml.core.gguf import GGUFFile
from pyggml.impl import register_builtin

from .hparams import HParams, ModelError, check_tensors
from .split import SPLIT_MODES, TensorSplit, layer_owners

__all__ = ["LlamaModel", "init_backend"]

KV_TYPES = {"f16": GGMLType.F16, "f32": GGMLType.F32}


def init_backend(name: str) -> pyggml.Backend:
    """A backend on the device ``name`` (``CUDA0``, ``Vulkan0``, ``RPC0``, ``NUMPY``, ``TORCH0``...,
    case insensitive); ``numpy`` and ``TORCH0`` register that pyggml Python backend first. Raises
    :class:`pyggml.BackendNotAvailableError` (a KeyError) saying why a device is missing."""
    register_builtin(name)
    return device_by_name(name).init()


_META: dict[tuple[object, ...], Device] = {}


def _meta_device(devs: list[Device], policy: TensorSplit) -> Device:
    """A meta device over ``devs`` splitting by ``policy``, made once per devices and split
    (ggml keeps every meta device until the process ends)."""
    key = (tuple(int(ffi.cast("uintptr_t", d.ptr)) for d in devs), policy.key)
    if key not in _META:
        _META[key] = meta_device(devs, policy)
    return _META[key]


class _Input:
    """An input tensor of a graph, in a host buffer of its own that outlives every compute (not
    the scheduler's compute buffer, whose memory later nodes reuse), and ``array``: a zero-copy
    NumPy view of it (NumPy ``shape``). A step writes its inputs into the arrays in place: no
    copy and no C call, and what a step leaves there is still there at the next step (a decode
    step opens one more mask cell). The scheduler copies an input to a device that needs it."""

    def __init__(self, tensor: Tensor, shape: tuple[int, ...]):
        self.tensor = tensor
        self.array: np.ndarray = tensor.numpy(copy=False).reshape(shape)


@dataclass
class _Step:
    """One graph of a given shape, allocated by its own scheduler. ``logits`` is F32 ne [V, n_out]."""

    n_tokens: int
    n_kv: int
    ctx: Context
    inputs: Context       # the inputs' tensors and their host buffer
    graph: pyggml.Graph
    sched: Scheduler
    tokens: _Input        # I32 [T]
    pos: _Input           # I32 [T]
    kq_mask: _Input       # F32 (F16 with flash attention) [K, T]: 0 or -inf
    k_idx: _Input         # I64 [T]: KV cell of each token
    logits: Tensor
    mask_open: int = -1   # (decode steps) the mask's cells 0..mask_open-1 are 0, the rest -inf; -1: unknown

    def close(self) -> None:
        self.sched.close()
        self.ctx.close()
        self.inputs.close()


class LlamaModel:
    """A llama model from a GGUF file on a ggml backend, with its KV cache.

    ``backend``: ``"cpu"`` or a device name (``"CUDA0"``, ``"Vulkan0"``, ``"RPC0"``, ``"numpy"``):
    that device holds the weights and the KV cache and a :class:`~pyggml.Scheduler` runs what it
    supports there and the rest on the CPU backend. ``devices``: several device names instead
    (``["RPC0", "RPC1"]``; ``"cpu"`` is the CPU backend), the model split over them by ``split``:
    ``"layer"`` (whole layers per device, with their KV cache) or ``"tensor"`` (every layer's heads
    and FFN split through ggml's meta device; attention then uses ``flash_attn``), in proportion to
    ``tensor_split`` (one weight per device, default equal); see :mod:`.split`. ``n_ctx``: KV cache cells (the longest
    prompt + generation); ``n_batch``: most tokens per graph when processing a prompt;
    ``flash_attn``: ``ggml_flash_attn_ext`` instead of ``mul_mat`` + ``soft_max`` + ``mul_mat``;
    ``kv_type``: ``"f16"`` (as llama.cpp) or ``"f32"``; ``kv_pad``: graphs attend to the first
    multiple of ``kv_pad`` cells covering the tokens so far (llama.cpp pads the same way), so a
    decode graph is reused for ``kv_pad`` steps. ``max_graphs``: graphs kept (least recently used
    ones are freed). ``dequantize``: load every weight as F32 (dequantized by ggml's own
    ``to_float``), for checking the graph against a float32 reference without the error of the
    quantized matmuls (which quantize the activations too); about 5x the memory of Q4_1.
    ``repack``: the CPU's matrix weights go where llama.cpp puts them (``--repack``, its default):
    in the first extra buffer type of the CPU device that takes their products
    (:meth:`pyggml.Device.weight_buffer_type`; ``CPU_REPACK`` for Q4_0/Q4_K/IQ4_NL on x86);
    False: all in the CPU's default memory. :attr:`weight_buffers` says where they went.
    ``interruptible``: keep pyggml's Ctrl-C check inside the CPU backend's computation (a C
    throttle that asks Python at most every 10 ms, :data:`pyggml.backends.cpu.ABORT_INTERVAL_US`; it
    used to call Python after every node, and was off by default then). False: Ctrl-C stops
    generation when the current graph returns.

    Raises :class:`ModelError` for a file it cannot run, ValueError for bad settings,
    :class:`pyggml.BackendNotAvailableError` for an unknown device.
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
        # ggml's meta backend keeps the KV-cache views of the graphs placed since it last switched
        # graphs (pyggml.backends.graph_run.check_meta_views): one graph at a time, as llama.cpp
        self.max_graphs = 1 if self.split_mode == "tensor" else max_graphs

        self.cpu = CPUBackend(n_threads=n_threads)
        if not interruptible:  # no public switch for this (see the README's notes): raw call
            lib.ggml_backend_cpu_set_abort_callback(self.cpu.ptr, ffi.NULL, ffi.NULL)
        self._owned: list[pyggml.Backend] = []   # backends made here besides the CPU's
        self._closables: list[Context] = []
        try:
            # homes: the backends that hold weights and caches; home_of: weight name -> index
            self.homes = self._init_homes(devices, weights)
            self.backends = [b for b in self.homes if b is not self.cpu] + [self.cpu]
            owners = layer_owners(hp.n_layer, weights) if self.split_mode == "layer" else [0] * hp.n_layer
            self.layer_home = owners
            last = len(self.homes) - 1

            def home_of(name: str) -> int:
                return owners[int(name.split(".")[1])] if name.startswith("blk.") else last

            # weights: the file's bytes straight into a buffer of their device (quantized
            # tensors stay quantized)
            self.w: dict[str, Tensor] = {}
            #: buffer type name -> (tensors, bytes) of the weights in it
            self.weight_buffers: dict[str, tuple[int, int]] = {}
            for j, home in enumerate(self.homes):
                mine = [n for n in names if home_of(n) == j]
                if not mine:
                    continue
                if dequantize:
                    wctx, w = self._load_f32(gguf, mine, home)
                    groups = {home.default_buffer_type.name: (wctx, w)}
                else:
                    groups = {}
                    for buft, group in self._weight_places(gguf, mine, home, repack):
                        groups[buft.name] = gguf.load(buft, group)
                for name, (wctx, w) in groups.items():
                    self._closables.append(wctx)
                    self.w.update(w)
                    n, size = self.weight_buffers.get(name, (0, 0))
                    self.weight_buffers[name] = (n + len(w), size + sum(t.nbytes for t in w.values()))
            self.out_weight = self.w.get("output.weight", self.w["token_embd.weight"])  # tied
            self._init_cache()
        except BaseException:
            self.close()
            raise
        self._steps: OrderedDict[tuple[int, int, bool], _Step] = OrderedDict()
        self.n_past = 0
        self.graphs_built = 0
        self.t_compute = 0.0   # seconds inside Scheduler.compute (ggml and pyggml's cached checks), summed
        self.n_compute = 0

    # ------------------------------------------------------------------ lifetime
    def _init_homes(self, devices: list[str], weights: list[float]) -> list[pyggml.Backend]:
        """The backends holding weights and caches: one per device (``"cpu"``: the CPU
        backend), or with ``split="tensor"`` the one backend of a meta device over them."""
        if self.split_mode == "tensor":
            for d in devices:
                register_builtin(d)
            devs = [Device.of(self.cpu) if d.lower() == "cpu" else device_by_name(d) for d in devices]
            meta = _meta_device(devs, TensorSplit(self.hp, len(devs), weights))
            homes = [meta.init()]
            self._owned += homes
            return homes
        homes = []
        for d in devices:
            if d.lower() == "cpu":
                homes.append(self.cpu)
            else:
                homes.append(init_backend(d))
                self._owned.append(homes[-1])
        return homes

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
            ctx = Context.for_tensors(2 * len(layers))
            self._closables.append(ctx)
            for il in layers:
                k[il] = ctx.new_tensor(self.kv_type, [hp.n_embd_kv, C], name=f"cache_k_l{il}")
                v[il] = ctx.new_tensor(self.kv_type, v_ne, name=f"cache_v_l{il}")
            buf = ctx.alloc_tensors(home)
            buf.clear(0)  # unused cells are masked, but 0 * NaN would still be NaN
        self.cache_k = [k[il] for il in range(hp.n_layer)]
        self.cache_v = [v[il] for il in range(hp.n_layer)]

    def _weight_places(self, gguf: GGUFFile, names: list[str], home: pyggml.Backend,
                       repack: bool) -> list[tuple[BufferType, list[str]]]:
        """``names`` grouped by the buffer type each goes in: on the CPU backend, with
        ``repack``, the matrices that only products read (all but the token embeddings, which
        GET_ROWS reads) where :meth:`pyggml.Device.weight_buffer_type` says; the rest in
        ``home``'s default buffer type."""
        default = home.default_buffer_type
        if home is not self.cpu or not repack:
            return [(default, names)]
        dev = Device.of(self.cpu)
        places: dict[BufferType, list[str]] = {}
        for n in names:
            info = gguf.tensor_info(n)
            product = n != "token_embd.weight" and len(info.ne) == 2
            buft = dev.weight_buffer_type(info.type, info.ne) if product else default
            places.setdefault(buft, []).append(n)
        return list(places.items())

    @staticmethod
    def _load_f32(gguf: GGUFFile, names: list[str], main: pyggml.Backend) -> tuple[Context, dict[str, Tensor]]:
        ctx = Context.for_tensors(len(names))
        w = {n: ctx.new_tensor(GGMLType.F32, list(gguf.tensor_info(n).ne), name=n) for n in names}
        buf = ctx.alloc_tensors(main)
        buf.usage = "weights"
        for n in names:
            w[n].set(gguf.array(n))   # F32 as stored, or dequantized by ggml
        return ctx, w

    def close(self) -> None:
        """Free graphs, schedulers, the KV cache, the weights and the backends."""
        for step in getattr(self, "_steps", {}).values():
            step.close()
        self._steps = OrderedDict()
        for obj in reversed(self._closables):
            obj.close()
        self._closables = []
        for b in getattr(self, "_owned", []) + [self.cpu]:
            b.close()
        self._owned = []

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the KV cache (the next :meth:`eval` starts at position 0)."""
        self.n_past = 0

    # ------------------------------------------------------------------ graph
    def _layer(self, ctx: Context, graph: pyggml.Graph, il: int, x: Tensor, inp: dict[str, Tensor],
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

    def _build(self, T: int, K: int, all_logits: bool) -> _Step:
        """The graph for T tokens attending to K cache cells."""
        hp = self.hp
        n_tensors = 48 * hp.n_layer + 64
        ictx = Context.for_tensors(4)
        ctx = Context.for_tensors(n_tensors, graph_size=n_tensors)
        try:
            inp: dict[str, Tensor] = {
                "tokens": ictx.new_tensor(GGMLType.I32, [T], name="inp_tokens").set_input(),
                "pos": ictx.new_tensor(GGMLType.I32, [T], name="inp_pos").set_input(),
                "kq_mask": ictx.new_tensor(GGMLType.F16 if self.flash_attn else GGMLType.F32, [K, T],
                                           name="kq_mask").set_input(),
                "k_idx": ictx.new_tensor(GGMLType.I64, [T], name="k_idx").set_input(),
            }
            ictx.alloc_tensors(self.cpu).clear(0)
            graph = ctx.new_graph(n_tensors)
            x = ctx.get_rows(self.w["token_embd.weight"], inp["tokens"])              # [E, T] F32
            for il in range(hp.n_layer):
                x = self._layer(ctx, graph, il, x, inp, T, K,
                                last_only=(il == hp.n_layer - 1 and not all_logits))
            x = ctx.rms_norm(x, hp.rms_eps) * self.w["output_norm.weight"]
            logits = ctx.mul_mat(self.out_weight, x).set_output()                     # [V, n_out]
            logits.name = "logits"
            graph.build_forward(logits)
            sched = Scheduler(self.backends, graph_size=2 * n_tensors + 64)
        except BaseException:
            ctx.close()
            ictx.close()
            raise
        try:
            sched.alloc_graph(graph)  # checks every node has a backend; raises otherwise
        except BaseException:
            sched.close()
            ctx.close()
            ictx.close()
            raise
        self.graphs_built += 1
        return _Step(T, K, ctx, ictx, graph, sched, _Input(inp["tokens"], (T,)), _Input(inp["pos"], (T,)),
                     _Input(inp["kq_mask"], (T, K)), _Input(inp["k_idx"], (T,)), logits)

    def _step(self, T: int, K: int, all_logits: bool) -> _Step:
        key = (T, K, all_logits)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = self._build(T, K, all_logits)
            while len(self._steps) > self.max_graphs:
                self._steps.popitem(last=False)[1].close()
        else:
            self._steps.move_to_end(key)
        return step

    def n_kv_for(self, n_tokens: int) -> int:
        """Cache cells a graph attends to when ``n_tokens`` cells are used: the next multiple of
        :attr:`kv_pad`, at most ``n_ctx``."""
        return min(self.n_ctx, -(-n_tokens // self.kv_pad) * self.kv_pad)

    def splits(self) -> int:
        """Scheduler splits of the most recently used graph (1: all on one backend)."""
        return next(reversed(self._steps.values())).sched.n_splits if self._steps else 0

    @property
    def graph_shapes(self) -> list[tuple[int, int, bool]]:
        """(tokens, KV cells, all_logits) of the graphs kept, least recently used first."""
        return list(self._steps)

    def placement(self) -> dict[str, set[str]]:
        """Backend name -> the ops the scheduler gave it in the most recently used graph
        (views and reshapes, which compute nothing, left out)."""
        out: dict[str, set[str]] = {}
        if self._steps:
            step = next(reversed(self._steps.values()))
            for node in step.graph.nodes:
                backend = step.sched.get_tensor_backend(node)
                if backend is not None and not node.is_empty_op():
                    out.setdefault(backend.name, set()).add(node.op_name)
        return out

    # ------------------------------------------------------------------ compute
    def _compute(self, step: _Step) -> None:
        t0 = time.perf_counter()
        # the same graph again: the scheduler keeps its allocation and its checks of the graph
        # (pyggml.backends.sched), so this is ggml's compute plus a check of the graph's memory in C
        step.sched.compute(step.graph)
        self.t_compute += time.perf_counter() - t0
        self.n_compute += 1

    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run ``ids`` at positions ``n_past, n_past+1, ...`` (in batches of ``n_batch``), adding
        them to the KV cache. Returns float32 logits, NumPy shape (n_vocab,) for the last token,
        or (len(ids), n_vocab) with ``all_logits``.

        Raises ValueError for an empty batch, an id outside the vocabulary, or more tokens than
        the cache holds (``n_ctx``); nothing is computed then.
        """
        if len(ids) == 1 and not all_logits and isinstance(ids[0], (int, np.integer)):  # a decode step
            tok = int(ids[0])
            if not 0 <= tok < self.hp.n_vocab:
                raise ValueError(f"token ids must be in 0..{self.hp.n_vocab - 1}")
            if self.n_past + 1 > self.n_ctx:
                raise ValueError(f"{self.n_past} + 1 tokens do not fit the context of {self.n_ctx} "
                                 "(use a larger n_ctx / --ctx-size)")
            return self._decode(tok)
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

    def _decode(self, tok: int) -> np.ndarray:
        """One token at position ``n_past`` (checked by :meth:`eval`): its logits, (n_vocab,).
        The inputs are written in place (_Input): a few microseconds of NumPy whatever the
        context, the mask's K cells included."""
        p0 = self.n_past
        step = self._step(1, self.n_kv_for(p0 + 1), False)
        step.tokens.array[0] = tok
        step.pos.array[0] = step.k_idx.array[0] = p0
        mask = step.kq_mask.array
        if step.mask_open == p0:                                # the step before was at p0 - 1
            mask[0, p0] = 0.0
        else:
            mask[0, :p0 + 1] = 0.0                              # causal: cells 0..p0 ...
            mask[0, p0 + 1:] = -np.inf                          # ... and no later one
        step.mask_open = p0 + 1
        self._compute(step)
        self.n_past = p0 + 1
        logits = np.empty(self.hp.n_vocab, dtype=np.float32)
        lib.ggml_backend_tensor_get(step.logits.ptr, ffi.from_buffer(logits), 0, logits.nbytes)
        return logits

    def _eval_batch(self, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        T = ids.size
        if T == 1 and not all_logits:
            return self._decode(int(ids[0]))[None]
        p0 = self.n_past
        K = self.n_kv_for(p0 + T)
        step = self._step(T, K, all_logits)
        pos = step.pos.array
        step.tokens.array[:] = ids
        pos[:] = np.arange(p0, p0 + T, dtype=np.int32)
        # query i (position p0+i) sees cells 0..p0+i
        step.kq_mask.array[:] = np.where(np.arange(K)[None, :] <= pos[:, None], 0.0, -np.inf)
        step.k_idx.array[:] = pos
        self._compute(step)
        self.n_past += T
        n_out = T if all_logits else 1
        logits = np.empty((n_out, self.hp.n_vocab), dtype=np.float32)
        lib.ggml_backend_tensor_get(step.logits.ptr, ffi.from_buffer(logits), 0, logits.nbytes)
        return logits
