"""Whisper's tokens: text from ids through the model file's vocabulary (the bytes of each BPE
token), ids from text (byte-level BPE whose merge ranks are the ids, as openai-whisper's
tiktoken files give them: ``tiktoken`` runs it), the special tokens' names, timestamps, and
openai-whisper's non-speech tokens (the symbols its ``suppress_tokens=-1`` suppresses) found
in the vocabulary.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from .hparams import HParams, Specials

__all__ = ["WhisperTokenizer", "LANGUAGES"]

#: Whisper's languages, in token order (``<|en|>`` is the first language token)
LANGUAGES = ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
             "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq "
             "sw gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my "
             "bo tl mg as tt haw ln ha ba jw su yue").split()

_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + \
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
_MISC = "♩♪♫♬♭♮♯"

#: GPT-2's pre-tokenizer (openai-whisper's tiktoken encodings): the pieces BPE runs on
_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class WhisperTokenizer:
    """``vocab``: the model file's tokens (bytes, by id); ``hp``: its hyperparameters, which
    number the special tokens (:class:`~.hparams.Specials`)."""

    def __init__(self, vocab: Sequence[bytes], hp: HParams):
        self.vocab = list(vocab)
        self.sp = Specials.of(hp)
        self.n_vocab = hp.n_vocab
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        self._non_speech: list[int] | None = None
        self._bpe: Any = None

    def is_timestamp(self, token: int) -> bool:
        return token >= self.sp.timestamp_begin

    def time_of(self, token: int) -> float:
        """Seconds of timestamp token ``token`` (0.02 s steps)."""
        return (token - self.sp.timestamp_begin) * 0.02

    def text_tokens(self, ids: Iterable[int]) -> list[int]:
        """``ids`` without special and timestamp tokens."""
        return [i for i in ids if i < self.sp.eot]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of the BPE tokens among ``ids`` (special and timestamp tokens are left out)."""
        return b"".join(self.vocab[i] for i in ids if i < self.sp.eot).decode("utf-8", "replace")

    def encode(self, text: str) -> list[int]:
        """The text token ids of ``text`` (no special tokens; give a leading space to a
        prompt, as Whisper's text has one). Needs ``tiktoken`` (``pip install
        "pyggml[whisper]"``: ImportError without it)."""
        if self._bpe is None:
            try:
                import tiktoken
            except ImportError as e:
                raise ImportError('encoding text for Whisper needs tiktoken: pip install "pyggml[whisper]"') from e
            ranks = {self.vocab[i]: i for i in range(self.sp.eot)}
            self._bpe = tiktoken.Encoding("pyggml-whisper", pat_str=_PATTERN, mergeable_ranks=ranks,
                                          special_tokens={})
        return list(self._bpe.encode_ordinary(text))

    def language_token(self, code: str) -> int:
        """The token of language ``code`` (``"en"``, ``"de"``...). ValueError for an English-only
        model or an unknown code."""
        if not self.sp.n_languages:
            raise ValueError("an English-only model has no language tokens")
        if code not in LANGUAGES[:self.sp.n_languages]:
            raise ValueError(f"unknown language {code!r}")
        return self.sp.lang + LANGUAGES.index(code)

    def non_speech(self) -> list[int]:
        """openai-whisper's non-speech tokens (``Tokenizer.non_speech_tokens``): the symbols that
        are one token alone or after a space, the first token of the music symbols, and the
        tokens of " -" and " '". Looked up once."""
        if self._non_speech is None:
            self._non_speech = self._find_non_speech()
        return list(self._non_speech)

    def _find_non_speech(self) -> list[int]:
        out = set()
        for s in (" -", " '"):
            t = self._first(s.encode())
            if t is not None:
                out.add(t)
        for sym in _SYMBOLS + list(_MISC):
            for text in (sym, " " + sym):
                b = text.encode()
                if b in self._ids:
                    out.add(self._ids[b])
                elif sym in _MISC:
                    t = self._first(b)
                    if t is not None:
                        out.add(t)
        return sorted(out)

    def _first(self, b: bytes) -> int | None:
        """The token of the longest prefix of ``b`` that is one (BPE's first token for these)."""
        for n in range(len(b), 0, -1):
            if b[:n] in self._ids:
                return self._ids[b[:n]]
        return None
