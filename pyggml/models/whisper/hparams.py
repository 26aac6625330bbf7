"""Whisper's hyperparameters as whisper.cpp's model file stores them, its special tokens and its
tensor list (whisper.cpp's names: OpenAI's), checked before any graph is built.

Shapes here are ggml ``ne`` order (NumPy's reversed). S = n_audio_state, A = n_audio_ctx (1500
encoder positions), M = n_mels, D = n_text_state, C = n_text_ctx (448 decoder positions),
V = n_vocab.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common import ModelError

__all__ = ["HParams", "ModelError", "Specials", "expected_tensors"]


@dataclass(frozen=True)
class HParams:
    """The eleven int32 fields of whisper.cpp's header, in file order."""

    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int
    ftype: int

    FIELDS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
              "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")

    @property
    def multilingual(self) -> bool:
        """English-only models have 51,864 tokens, multilingual ones more (51,865; large-v3 51,866)."""
        return self.n_vocab >= 51865

    def check(self, where: str) -> None:
        """Raise :class:`ModelError` (naming ``where``) for sizes pyggml.models.whisper cannot run."""
        for f in self.FIELDS[:-1]:
            v = getattr(self, f)
            if not 0 < v < 1 << 20:
                raise ModelError(f"{where}: hyperparameter {f} = {v} is out of range")
        if self.n_audio_state % self.n_audio_head or self.n_text_state % self.n_text_head:
            raise ModelError(f"{where}: the model width is not a multiple of its head count")
        if self.n_mels not in (80, 128):
            raise ModelError(f"{where}: n_mels = {self.n_mels}; Whisper models have 80 or 128")
        if self.n_vocab < 51864:
            raise ModelError(f"{where}: n_vocab = {self.n_vocab} is smaller than Whisper's vocabulary")


@dataclass(frozen=True)
class Specials:
    """Whisper's special token ids (as whisper.cpp numbers them): end of text, start of
    transcript, the first language token, translate, transcribe, start of LM, previous text,
    no speech, no timestamps and the first timestamp (``<|0.00|>``; one per 0.02 s)."""

    eot: int
    sot: int
    lang: int
    translate: int
    transcribe: int
    solm: int
    prev: int
    nosp: int
    notimestamps: int
    timestamp_begin: int
    n_languages: int

    @classmethod
    def of(cls, hp: HParams) -> "Specials":
        """whisper.cpp's numbering: multilingual models have one more token before ``sot`` and
        ``n_vocab - 51766`` languages, whose count shifts the tokens after them."""
        if not hp.multilingual:
            return cls(50256, 50257, 50258, 50357, 50358, 50359, 50360, 50361, 50362, 50363, 0)
        n_lang = hp.n_vocab - 51766
        dt = n_lang - 98
        return cls(50257, 50258, 50259, 50357 + dt, 50358 + dt, 50359 + dt, 50360 + dt, 50361 + dt,
                   50362 + dt, 50363 + dt, n_lang)


def expected_tensors(hp: HParams) -> dict[str, tuple[int, ...]]:
    """Every tensor whisper.cpp's file of ``hp`` holds: name -> ne (ggml order, as stored)."""
    S, A, M, D, C, V = hp.n_audio_state, hp.n_audio_ctx, hp.n_mels, hp.n_text_state, hp.n_text_ctx, hp.n_vocab
    out: dict[str, tuple[int, ...]] = {
        "encoder.positional_embedding": (S, A),
        "encoder.conv1.weight": (3, M, S), "encoder.conv1.bias": (1, S),
        "encoder.conv2.weight": (3, S, S), "encoder.conv2.bias": (1, S),
        "encoder.ln_post.weight": (S,), "encoder.ln_post.bias": (S,),
        "decoder.positional_embedding": (D, C),
        "decoder.token_embedding.weight": (D, V),
        "decoder.ln.weight": (D,), "decoder.ln.bias": (D,),
    }

    def block(p: str, E: int, cross: bool) -> None:
        for ln in ("attn_ln", "mlp_ln") + (("cross_attn_ln",) if cross else ()):
            out[f"{p}.{ln}.weight"] = out[f"{p}.{ln}.bias"] = (E,)
        for attn in ("attn",) + (("cross_attn",) if cross else ()):
            for lin in ("query", "key", "value", "out"):
                out[f"{p}.{attn}.{lin}.weight"] = (E, E)
                if lin != "key":
                    out[f"{p}.{attn}.{lin}.bias"] = (E,)
        out[f"{p}.mlp.0.weight"], out[f"{p}.mlp.0.bias"] = (E, 4 * E), (4 * E,)
        out[f"{p}.mlp.2.weight"], out[f"{p}.mlp.2.bias"] = (4 * E, E), (E,)

    for i in range(hp.n_audio_layer):
        block(f"encoder.blocks.{i}", S, False)
    for i in range(hp.n_text_layer):
        block(f"decoder.blocks.{i}", D, True)
    return out
