"""The hyperparameters of a llama-architecture GGUF file (``llama.*`` keys) and its tensor list.

Everything is checked here, before any graph is built: ggml aborts the process on a shape it
does not expect, so a file with another architecture, a missing key, an odd value or a tensor of
the wrong shape raises :class:`ModelError` instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyggml.core.gguf import GGUFFile
from pyggml.types import GGMLType

from ..common import ModelError

__all__ = ["HParams", "ModelError", "expected_tensors"]

ARCH = "llama"


@dataclass(frozen=True)
class HParams:
    """Model dimensions. ``head_dim`` is the per-head size of Q, K and V; ``n_rot`` the number of
    dimensions of each head RoPE rotates (``llama.rope.dimension_count``); ``rope_freq_scale``
    is 1 / the linear scaling factor (1.0 without scaling)."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float

    @property
    def n_embd_q(self) -> int:
        """Rows of the Q projection: ``n_head * head_dim``."""
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        """Rows of the K and V projections (grouped-query attention): ``n_head_kv * head_dim``."""
        return self.n_head_kv * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "HParams":
        """Read and check the ``llama.*`` keys of ``f``. Raises :class:`ModelError`."""
        md = f.metadata
        arch = md.get("general.architecture")
        if arch != ARCH:
            raise ModelError(f"{f.path}: general.architecture is {arch!r}; pyggml.models.llama runs "
                             f"{ARCH!r} models only")

        def get(key: str, kind: type, default: Any = None) -> Any:
            full = f"{ARCH}.{key}"
            if full not in md:
                if default is None:
                    raise ModelError(f"{f.path}: the GGUF key {full!r} is missing")
                return default
            value = md[full]
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ModelError(f"{f.path}: {full} must be an integer, not {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ModelError(f"{f.path}: {full} must be a number, not {value!r}")
            if kind is str and not isinstance(value, str):
                raise ModelError(f"{f.path}: {full} must be a string, not {value!r}")
            return kind(value)

        if get("expert_count", int, 0) > 0:
            raise ModelError(f"{f.path}: mixture-of-experts llama models are not supported")
        n_embd = get("embedding_length", int)
        n_head = get("attention.head_count", int)
        n_head_kv = get("attention.head_count_kv", int, n_head)
        if n_embd < 1 or n_head < 1 or n_head_kv < 1:
            raise ModelError(f"{f.path}: embedding_length and head counts must be >= 1")
        head_dim = get("attention.key_length", int, n_embd // n_head or 1)
        if get("attention.value_length", int, head_dim) != head_dim:
            raise ModelError(f"{f.path}: attention.key_length != attention.value_length is not supported")
        if f"{ARCH}.attention.key_length" not in md and n_embd % n_head:
            raise ModelError(f"{f.path}: embedding_length {n_embd} is not a multiple of head_count {n_head}")
        if n_head % n_head_kv:
            raise ModelError(f"{f.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        n_rot = get("rope.dimension_count", int, head_dim)
        if not (0 < n_rot <= head_dim and n_rot % 2 == 0):
            raise ModelError(f"{f.path}: rope.dimension_count {n_rot} must be even and in 1..{head_dim}")
        scaling = get("rope.scaling.type", str, "none")
        freq_scale = 1.0
        if scaling == "linear":
            factor = get("rope.scaling.factor", float, 1.0)
            if factor <= 0:
                raise ModelError(f"{f.path}: rope.scaling.factor must be > 0")
            freq_scale = 1.0 / factor
        elif scaling != "none":
            raise ModelError(f"{f.path}: rope scaling {scaling!r} is not supported (only none and linear)")
        n_vocab = get("vocab_size", int, 0)
        if not n_vocab:  # older files: the embedding's rows
            embd = next((t for t in f.tensors if t.name == "token_embd.weight"), None)
            n_vocab = embd.ne[-1] if embd is not None and len(embd.ne) == 2 else 0
        hp = cls(
            n_vocab=n_vocab,
            n_ctx_train=get("context_length", int),
            n_embd=n_embd,
            n_layer=get("block_count", int),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=get("feed_forward_length", int),
            n_rot=n_rot,
            rms_eps=get("attention.layer_norm_rms_epsilon", float),
            rope_freq_base=get("rope.freq_base", float, 10000.0),
            rope_freq_scale=freq_scale,
        )
        for name in ("n_vocab", "n_ctx_train", "n_layer", "n_ff"):
            if getattr(hp, name) < 1:
                raise ModelError(f"{f.path}: {name} = {getattr(hp, name)} must be >= 1")
        if not hp.rms_eps > 0 or not hp.rope_freq_base > 0:
            raise ModelError(f"{f.path}: layer_norm_rms_epsilon and rope.freq_base must be > 0")
        return hp


#: tensors that may be absent: tied output embedding, llama-3 RoPE frequency factors, biases
OPTIONAL = ("output.weight", "rope_freqs.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
            "attn_output.bias")
#: tensors added to activations element-wise: ggml's CPU kernels need them in F32
F32_ONLY = ("norm.weight", ".bias", "rope_freqs.weight")


def expected_tensors(hp: HParams) -> dict[str, tuple[int, ...]]:
    """Every tensor a llama model may have -> its ``ne`` (ggml order, trailing 1s dropped)."""
    E, V = hp.n_embd, hp.n_vocab
    out: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
        "rope_freqs.weight": (hp.n_rot // 2,),
    }
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        out.update({
            p + "attn_norm.weight": (E,),
            p + "attn_q.weight": (E, hp.n_embd_q), p + "attn_q.bias": (hp.n_embd_q,),
            p + "attn_k.weight": (E, hp.n_embd_kv), p + "attn_k.bias": (hp.n_embd_kv,),
            p + "attn_v.weight": (E, hp.n_embd_kv), p + "attn_v.bias": (hp.n_embd_kv,),
            p + "attn_output.weight": (hp.n_embd_q, E), p + "attn_output.bias": (E,),
            p + "ffn_norm.weight": (E,),
            p + "ffn_gate.weight": (E, hp.n_ff), p + "ffn_up.weight": (E, hp.n_ff),
            p + "ffn_down.weight": (hp.n_ff, E),
        })
    return out


def check_tensors(f: GGUFFile, hp: HParams) -> list[str]:
    """Check that ``f`` has every required tensor with the right ``ne`` and no unknown one;
    returns the names to load. Raises :class:`ModelError`."""
    expected = expected_tensors(hp)
    have = {t.name: t for t in f.tensors}
    unknown = sorted(set(have) - set(expected))
    if unknown:
        raise ModelError(f"{f.path}: tensors a llama model does not have: {', '.join(unknown[:5])}"
                         + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else ""))
    missing = [n for n in expected if n not in have and not n.endswith(OPTIONAL)]
    if missing:
        raise ModelError(f"{f.path}: missing tensors: {', '.join(missing[:5])}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    for name, info in have.items():
        if info.ne != expected[name]:
            raise ModelError(f"{f.path}: tensor {name} has ne {list(info.ne)}, the hyperparameters "
                             f"say {list(expected[name])}")
        if name.endswith(F32_ONLY) and info.type != GGMLType.F32:
            raise ModelError(f"{f.path}: tensor {name} is {info.type.name}; the model needs F32")
    return list(have)
