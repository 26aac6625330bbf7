"""The tokenizer and the chat template a GGUF file carries in its ``tokenizer.*`` metadata.

A GGUF has no ``tokenizer.json``: it stores the vocabulary (``tokenizer.ggml.tokens``), the BPE
merges (``tokenizer.ggml.merges``), the token types and the special token ids. For a GPT-2 style
byte-level BPE (``tokenizer.ggml.model == "gpt2"``) this builds the same ``tokenizers.Tokenizer``
transformers builds from those keys (``transformers.integrations.gguf``): a BPE model over the
vocabulary and merges, GPT-2's byte-level pre-tokenizer (or the split regex of a known
``tokenizer.ggml.pre``), byte-level decoding, control tokens kept whole as special tokens.
No BPE is written by hand here: the ``tokenizers`` library does the merging.
"""
from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Sequence

from ..common import ModelError, bytes_to_unicode

__all__ = ["GGUFTokenizer", "ChatTemplate", "TOKEN_TYPE_CONTROL", "TOKEN_TYPE_USER_DEFINED"]

TOKEN_TYPE_CONTROL = 3        # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL (<|im_start|>, <|endoftext|>...)
TOKEN_TYPE_USER_DEFINED = 4   # added tokens matched whole but not special

# The split regexes transformers uses for these ``tokenizer.ggml.pre`` values
# (gguf_tokenizer_mapping.GGUF_PRE_TOKENIZER_SPLITS); any other value, "smollm" included, keeps
# GPT-2's byte-level regex, as transformers does.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {name: _LLAMA3_SPLIT for name in (
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "dbrx", "smaug-bpe")}


@functools.lru_cache(maxsize=1)
def _byte_of() -> dict[str, int]:
    """The byte-level alphabet inverted: character -> the byte it stands for."""
    return {c: b for b, c in bytes_to_unicode().items()}


class GGUFTokenizer:
    """Text <-> token ids for the vocabulary of a GGUF file.

    ``metadata`` is a :class:`pyggml.core.gguf.GGUFMetadata` (or any mapping with the same keys).
    Attributes: ``bos_id``, ``eos_id`` (None when the file has none), ``add_bos`` (prepend BOS
    when encoding: ``tokenizer.ggml.add_bos_token``, default False), ``n_vocab``.
    Raises :class:`ModelError` for a tokenizer model other than ``gpt2`` or missing keys, and
    ImportError (with the pip command) if the ``tokenizers`` package is missing.
    """

    def __init__(self, metadata: Any):
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, Regex
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("the tokenizer needs the 'tokenizers' package: pip install tokenizers") from e

        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelError(f"tokenizer.ggml.model is {kind!r}: only GPT-2 style byte-level BPE "
                             "('gpt2') vocabularies are supported")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in metadata:
                raise ModelError(f"the GGUF key {key!r} is missing: no tokenizer in this file")
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        merges: list[str] = list(metadata["tokenizer.ggml.merges"])
        if "tokenizer.ggml.token_type" in metadata:
            types = [int(t) for t in metadata["tokenizer.ggml.token_type"]]
        else:
            types = [1] * len(tokens)
        if len(types) != len(tokens):
            raise ModelError("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")

        # as transformers' byte_level_tokenizer: a token outside the byte-level alphabet is
        # respelled byte by byte
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            key = tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8"))
            vocab.setdefault(key, i)
        pairs = []
        for m in merges:
            parts = m.split(" ")
            if len(parts) != 2:
                raise ModelError(f"bad BPE merge {m!r} in tokenizer.ggml.merges")
            pairs.append((parts[0], parts[1]))

        tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="",
                                  end_of_word_suffix="", fuse_unk=False))
        split = _PRE_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
        if split is None:
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tk.decoder = decoders.ByteLevel()
        control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
                   if ty == TOKEN_TYPE_CONTROL and set(t) <= alphabet]
        if control:
            tk.add_special_tokens(control)
        user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
                if ty == TOKEN_TYPE_USER_DEFINED and t in vocab]
        if user:
            tk.add_tokens(user)
        self._tk = tk
        self.tokens = tokens
        self.n_vocab = len(tokens)
        self.special_ids = frozenset(i for i, ty in enumerate(types) if ty == TOKEN_TYPE_CONTROL)

        def token_id(key: str) -> int | None:
            v = metadata.get(key)
            if v is None:
                return None
            if not isinstance(v, int) or not 0 <= v < len(tokens):
                raise ModelError(f"{key} = {v!r} is not a token id")
            return int(v)

        self.bos_id = token_id("tokenizer.ggml.bos_token_id")
        self.eos_id = token_id("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and self.bos_id is not None
        self._bytes: dict[int, bytes] = {}

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) become their
        ids. ``add_special``: prepend BOS when the file asks for it (``add_bos``)."""
        ids: list[int] = self._tk.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8, e.g. half of an emoji, becomes U+FFFD)."""
        return self._tk.decode(list(ids), skip_special_tokens=skip_special)

    def token_bytes(self, i: int) -> bytes:
        """The bytes token ``i`` stands for (part of a character, for some byte-level tokens;
        a special token's text), looked up once. IndexError for an id outside the vocabulary."""
        got = self._bytes.get(i)
        if got is None:
            if not 0 <= i < self.n_vocab:
                raise IndexError(f"token id {i} is outside 0..{self.n_vocab - 1}")
            text = self._tk.id_to_token(i) or ""
            table = _byte_of()
            got = bytes(table[c] for c in text) if all(c in table for c in text) else text.encode("utf-8")
            self._bytes[i] = got
        return got

    def token_text(self, i: int) -> str:
        """The vocabulary entry of id ``i`` as stored (byte-level spelling)."""
        return self.tokens[i]


class ChatTemplate:
    """``tokenizer.chat_template`` rendered with jinja2 the way transformers renders it: a
    sandboxed environment with ``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols``
    extension, a JSON ``tojson``, ``raise_exception`` and ``strftime_now``.

    Raises :class:`ModelError` if the file has no template, ImportError if jinja2 is missing.
    """

    def __init__(self, metadata: Any, tokenizer: GGUFTokenizer):
        template = metadata.get("tokenizer.chat_template")
        if not isinstance(template, str) or not template:
            raise ModelError("this GGUF file has no tokenizer.chat_template: --chat needs one")
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:
            raise ImportError("--chat renders the GGUF chat template with jinja2: pip install jinja2") from e
        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ModelError(f"the GGUF chat template does not parse: {e}") from e
        tok = tokenizer
        self._special = {
            "bos_token": tok.tokens[tok.bos_id] if tok.bos_id is not None else "",
            "eos_token": tok.tokens[tok.eos_id] if tok.eos_id is not None else "",
        }

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (``[{"role": "user", "content": "..."}]``)."""
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **self._special)
