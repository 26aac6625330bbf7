"""Word-level timestamps as openai-whisper computes them (and faster-whisper after it): the
cross-attention scores of the model's alignment heads over one window's text, a softmax over the
window's audio frames, each frame normalised across the tokens, a median filter along time,
the mean over the heads, and dynamic time warping of tokens against frames; words start where
the path reaches their first token. Then punctuation joins its word, and faster-whisper's
corrections of words that run long at pauses and segment edges.

Times: the encoder's frames are 20 ms apart (:data:`TOKENS_PER_SECOND` = 50).
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .hparams import HParams
from .model import WhisperNet
from .tokenizer import WhisperTokenizer

__all__ = ["WordTiming", "alignment_heads", "find_alignment", "merge_punctuations", "dtw", "median_filter",
           "PREPEND_PUNCTUATIONS", "APPEND_PUNCTUATIONS", "TOKENS_PER_SECOND"]

#: encoder frames per second (20 ms each)
TOKENS_PER_SECOND = 50
#: the median filter's width, in encoder frames
MEDFILT_WIDTH = 7
#: punctuation joined to the word after it (faster-whisper's default)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
#: punctuation joined to the word before it (faster-whisper's default)
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"

#: (layer, head) of the decoder's cross-attention heads that follow the audio, per model
#: (n_text_layer, n_text_state, multilingual); the tables whisper.cpp and CTranslate2's
#: converted models carry. Other models: every head of the last half of the layers
#: (openai-whisper's default)
_HEADS: dict[tuple[int, int, bool], tuple[tuple[int, int], ...]] = {
    (4, 384, False): ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)),   # tiny.en
    (4, 384, True): ((2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)),                    # tiny
    (6, 512, False): ((3, 3), (4, 7), (5, 1), (5, 5), (5, 7)),                           # base.en
    (6, 512, True): ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)),    # base
    (12, 768, False): ((6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0), (9, 4), (9, 8),
                       (9, 10), (10, 0), (10, 1), (10, 2), (10, 3), (10, 6), (10, 11), (11, 2), (11, 4)),
    (12, 768, True): ((5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7), (9, 9), (10, 5)),
    (24, 1024, False): ((11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4), (16, 9), (17, 12),
                        (17, 14), (18, 7), (18, 10), (18, 15), (20, 0), (20, 3), (20, 9), (20, 14), (21, 12)),
    (24, 1024, True): ((13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)),
}


def alignment_heads(hp: HParams) -> tuple[tuple[int, int], ...]:
    """The (layer, head) pairs whose cross-attention times words, for the model of ``hp``."""
    known = _HEADS.get((hp.n_text_layer, hp.n_text_state, hp.multilingual))
    if known is not None:
        return known
    return tuple((layer, h) for layer in range(hp.n_text_layer // 2, hp.n_text_layer)
                 for h in range(hp.n_text_head))


@dataclass
class WordTiming:
    """A word as the alignment times it (openai-whisper's ``WordTiming``): ``start`` and ``end``
    in seconds from the window's start, its text (with its leading space), the probability of
    its tokens (their mean), and its token ids. Segments carry them as
    :class:`~.transcribe.Word`."""

    start: float
    end: float
    word: str
    probability: float
    tokens: list[int] = field(default_factory=list)


def median_filter(x: np.ndarray, width: int = MEDFILT_WIDTH) -> np.ndarray:
    """The median of each ``width`` neighbours along the last axis (the edges reflected, as
    openai-whisper pads them); ``x`` as is when the axis is not longer than width // 2."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    out: np.ndarray = np.median(windows, axis=-1)
    return out


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through the cost matrix ``x`` (N tokens, M frames), from
    (0, 0) to (N-1, M-1) in steps of one token, one frame or both: (token indices, frame
    indices) along it. Ties go as in openai-whisper's ``dtw_cpu`` (diagonal, then token, then
    frame). The cells of one anti-diagonal depend only on the two before: each diagonal is one
    NumPy step."""
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf)
    trace = np.full((N + 1, M + 1), -1, dtype=np.int8)
    cost[0, 0] = 0.0
    for d in range(2, N + M + 1):
        i = np.arange(max(1, d - M), min(N, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = x[i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = N, M
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    arr = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def split_words(tok: WhisperTokenizer, tokens: Sequence[int], language: str | None) -> tuple[list[str], list[list[int]]]:
    """``tokens`` (text tokens, then end of text) grouped into words: pieces that decode to
    whole characters, joined until one starts with a space or is punctuation; for languages
    written without spaces (zh, ja, th, lo, my, yue) every whole character is a word. Special
    tokens are words of their own."""
    pieces: list[str] = []
    groups: list[list[int]] = []
    pending: list[int] = []
    for t in tokens:
        if t >= tok.sp.eot:
            if pending:                      # bytes that never made a character
                pieces.append(tok.decode(pending))
                groups.append(pending)
                pending = []
            pieces.append(f"<|{t}|>")
            groups.append([t])
            continue
        pending.append(t)
        text = b"".join(tok.vocab[i] for i in pending)
        try:
            piece = text.decode("utf-8")
        except UnicodeDecodeError:
            continue
        pieces.append(piece)
        groups.append(pending)
        pending = []
    if pending:
        pieces.append(tok.decode(pending))
        groups.append(pending)
    if language in ("zh", "ja", "th", "lo", "my", "yue"):
        return pieces, groups
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, group in zip(pieces, groups):
        if group[0] >= tok.sp.eot or piece.startswith(" ") or piece.strip() in string.punctuation or not words:
            words.append(piece)
            word_tokens.append(list(group))
        else:
            words[-1] += piece
            word_tokens[-1] += group
    return words, word_tokens


def find_alignment(net: WhisperNet, tok: WhisperTokenizer, sot_sequence: Sequence[int], text_tokens: Sequence[int],
                   n_frames: int, language: str | None = None, slot: int = 0) -> list[WordTiming]:
    """The words of ``text_tokens`` (one window's text tokens, no timestamps) in the window
    :meth:`WhisperNet.encode <pyggml.models.whisper.model.WhisperNet.encode>` left in ``net``
    (in slot ``slot``),
    ``n_frames`` mel frames of it audio (10 ms each): start and end in seconds from the
    window's start. ``sot_sequence``: the start of transcript with language and task, as the
    window was decoded. Empty for no tokens."""
    if not text_tokens:
        return []
    sp = tok.sp
    heads = alignment_heads(net.hp)
    tokens = [*sot_sequence, sp.notimestamps, *text_tokens, sp.eot]
    qk, probs = net.align(tokens, heads, slot)
    n_sot = len(sot_sequence)
    frames = max(1, n_frames // 2)
    w = qk[:, :, :frames].astype(np.float64)
    w = np.exp(w - w.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    std, mean = w.std(axis=-2, keepdims=True), w.mean(axis=-2, keepdims=True)
    w = median_filter((w - mean) / np.where(std > 0, std, 1.0))
    matrix = w.mean(axis=0)[n_sot:-1]                      # no_timestamps .. the last text token
    text_idx, time_idx = dtw(-matrix)
    words, word_tokens = split_words(tok, [*text_tokens, sp.eot], language)
    if len(word_tokens) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    jump_times = time_idx[jumps] / TOKENS_PER_SECOND
    token_probs = probs[n_sot:n_sot + len(text_tokens)]
    return [WordTiming(float(jump_times[i]), float(jump_times[j]), word, float(np.mean(token_probs[i:j])), toks)
            for word, toks, i, j in zip(words, word_tokens, bounds[:-1], bounds[1:])]


def merge_punctuations(words: list[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:
    """Join punctuation to its word, in place: an opening mark (``prepended``, after a space)
    to the word after it, a closing one (``appended``) to the word before; the mark's entry
    keeps an empty text and no tokens."""
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        prev, nxt = words[i], words[j]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            nxt.word, nxt.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        prev, nxt = words[i], words[j]
        if not prev.word.endswith(" ") and nxt.word in appended:
            prev.word, prev.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            i = j
        j += 1
