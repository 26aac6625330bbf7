"""Decoding one 30-s window as openai-whisper does: the prompt, the logit filters (blank and
non-speech suppression, the timestamp rules), greedy or beam search, and sampling at a
temperature for the fallback (:func:`decode_window`). Logits come from
:meth:`~.model.WhisperNet.decode`, one step at a time over the model's KV cache.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .model import WhisperNet
from .tokenizer import LANGUAGES, WhisperTokenizer

__all__ = ["DecodeOptions", "WindowResult", "decode_window", "decode_windows", "detect_language", "window_languages",
           "language_probs", "compression_ratio", "prompt_tokens", "sot_sequence"]


@dataclass(frozen=True)
class DecodeOptions:
    """``beam_size``: 1 greedy, else beam search (with ``temperature`` 0); ``temperature``: 0
    takes the most likely token, above it samples (``best_of`` candidates, the most likely kept);
    ``timestamps``: predict timestamp tokens (segments); ``language``/``task`` for multilingual
    models (``"transcribe"`` or ``"translate"``); ``max_initial_timestamp``: seconds;
    ``sample_len``: most tokens per window (default n_text_ctx // 2); ``seed`` for sampling;
    ``previous``: text tokens before the window (``<|startofprev|>`` goes before them, the last
    n_text_ctx // 2 - 1 of them are kept), ``hotwords`` there too when there is no
    ``prefix``; ``prefix``: tokens the window's text starts with (decoded as given, returned
    with the rest); ``suppress_tokens``: ids never sampled (None: openai-whisper's non-speech
    symbols); ``patience``: beam search stops when round(beam_size x patience) sequences have
    ended; ``length_penalty``: the ended one kept is the best sum of log-probabilities over its
    length to this power; ``repetition_penalty``: the logits of the window's tokens so far
    divided by it (multiplied where negative); ``no_repeat_ngram_size``: no n-gram of the
    window's tokens twice."""

    beam_size: int = 1
    temperature: float = 0.0
    best_of: int = 5
    timestamps: bool = True
    language: str | None = None
    task: str = "transcribe"
    max_initial_timestamp: float = 1.0
    sample_len: int | None = None
    suppress_blank: bool = True
    suppress_non_speech: bool = True
    seed: int = 0
    previous: tuple[int, ...] = ()
    hotwords: tuple[int, ...] = ()
    prefix: tuple[int, ...] = ()
    suppress_tokens: tuple[int, ...] | None = None
    patience: float = 1.0
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    def __post_init__(self) -> None:
        if self.beam_size < 1 or self.best_of < 1:
            raise ValueError("beam_size and best_of must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.patience <= 0 or self.repetition_penalty <= 0 or self.no_repeat_ngram_size < 0:
            raise ValueError("patience and repetition_penalty must be > 0, no_repeat_ngram_size >= 0")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {self.task!r}")


@dataclass
class WindowResult:
    """The tokens decoded for one window (after the prompt, without the final end of text),
    their summed and mean log-probability, the no-speech probability (at the first step), the
    temperature used and the compression ratio of the text."""

    tokens: list[int]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    text: str = ""


def compression_ratio(text: str) -> float:
    """gzip's ratio of ``text`` (openai-whisper's repetition detector)."""
    b = text.encode("utf-8")
    return len(b) / len(zlib.compress(b)) if b else 0.0


def sot_sequence(tok: WhisperTokenizer, language: str | None, task: str) -> list[int]:
    """``<|startoftranscript|>``, and for multilingual models the language (default English)
    and the task."""
    sp = tok.sp
    out = [sp.sot]
    if sp.n_languages:
        out += [tok.language_token(language or "en"), sp.translate if task == "translate" else sp.transcribe]
    return out


def prompt_tokens(tok: WhisperTokenizer, opts: DecodeOptions, n_text_ctx: int = 448) -> list[int]:
    """The window's prompt: ``<|startofprev|>`` with the hotwords and the previous text (when
    there are any), :func:`sot_sequence`, ``<|notimestamps|>`` without timestamps, then
    ``<|0.00|>`` (with timestamps) and the prefix."""
    sp = tok.sp
    keep = n_text_ctx // 2 - 1
    out: list[int] = []
    hot = opts.hotwords if not opts.prefix else ()
    if opts.previous or hot:
        out.append(sp.prev)
        out += hot[:keep]
        if opts.previous:
            out += opts.previous[-keep:]
    out += sot_sequence(tok, opts.language, opts.task)
    if not opts.timestamps:
        out.append(sp.notimestamps)
    if opts.prefix:
        if opts.timestamps:
            out.append(sp.timestamp_begin)
        out += opts.prefix[:keep]
    return out


class _Filters:
    """openai-whisper's logit filters for one window: ``apply(logits, seq)`` sets what may not
    come next to -inf (``seq``: the tokens sampled so far in the window)."""

    def __init__(self, tok: WhisperTokenizer, opts: DecodeOptions, n_vocab: int):
        sp = tok.sp
        self.sp, self.opts = sp, opts
        sup = [sp.translate, sp.transcribe, sp.sot, sp.prev, sp.solm, sp.nosp]
        if opts.suppress_tokens is not None:
            sup += list(opts.suppress_tokens)
        elif opts.suppress_non_speech:
            sup += tok.non_speech()
        self.suppress = np.array(sorted(set(t for t in sup if t < n_vocab)), dtype=np.int64)
        self.max_initial = sp.timestamp_begin + round(opts.max_initial_timestamp / 0.02)
        self._scratch = np.empty((1, n_vocab), np.float32)     # exp(x - max), for the normalizers

    def _log_probs(self, x: np.ndarray) -> list[_LogProbs]:
        """The :class:`_LogProbs` of each row of ``x`` (float32 or float64, NumPy shape (rows,
        n_vocab)): one maximum, subtraction, exp and sum over all rows, in ``x``'s type (the
        log of each row's sum in float64; each row's values are those of the row alone, bit
        for bit)."""
        n, V = x.shape
        if self._scratch.shape[0] < n or self._scratch.dtype != x.dtype:
            self._scratch = np.empty((max(n, self._scratch.shape[0]), V), x.dtype)
        m = x.max(axis=1)
        fin = np.isfinite(m)
        e = self._scratch[:n, :V]
        np.subtract(x, np.where(fin, m, 0)[:, None], out=e)
        np.exp(e, out=e)
        ls = np.log(e.sum(axis=1).astype(np.float64))
        return [_LogProbs(x[r], float(m[r]), float(ls[r]) if fin[r] else 0.0) for r in range(n)]

    def apply(self, logits: np.ndarray, seq: Sequence[int]) -> _LogProbs:
        """Filter ``logits`` (float32 or float64, NumPy shape (n_vocab,)) in place; return their log-softmax
        after the filters (:class:`_LogProbs`, over the filtered array: computed once, read
        where needed; the timestamp rule needs it too)."""
        return self.apply_rows(logits[None], [seq])[0]

    def apply_rows(self, logits: np.ndarray, seqs: Sequence[Sequence[int]]) -> list[_LogProbs]:
        """:meth:`apply` to each row of ``logits`` (float32 or float64, NumPy shape (rows, n_vocab)), row
        r after ``seqs[r]``, the normalizers of all rows computed together."""
        for r, seq in enumerate(seqs):
            self._mask(logits[r], seq)
        lps = self._log_probs(logits)
        if self.opts.timestamps:
            for r, seq in enumerate(seqs):
                if self._text_loses(lps[r]):     # timestamps likelier than any text token
                    logits[r, :self.sp.timestamp_begin] = -np.inf
                    lps[r] = self._log_probs(logits[r:r + 1])[0]
        return lps

    def _text_loses(self, lp: _LogProbs) -> bool:
        """openai-whisper's rule: the timestamps' summed probability above the likeliest text
        token's (the row's own maximum when no timestamp reaches it: no pass over the text)."""
        tb = self.sp.timestamp_begin
        ts = lp.values(slice(tb, None))
        if ts.size and np.isfinite(ts).any():
            m = ts.max()
            text = lp.max(slice(None, tb)) if float(lp.x[tb:].max()) >= lp.m else -lp.ls
            return bool(m + np.log(np.exp(ts - m).sum()) > text)
        return False

    def _mask(self, logits: np.ndarray, seq: Sequence[int]) -> None:
        """Set what may not follow ``seq`` to -inf in ``logits`` (NumPy shape (n_vocab,)): all
        the filters but the timestamps' probability rule (:meth:`_text_loses`)."""
        sp, tb = self.sp, self.sp.timestamp_begin
        o = self.opts
        if o.repetition_penalty != 1 and seq:       # CTranslate2's: each token of the sequence once
            ids = np.unique(np.asarray(seq, dtype=np.int64))
            v = logits[ids]
            logits[ids] = np.where(v < 0, v * o.repetition_penalty, v / o.repetition_penalty)
        n = o.no_repeat_ngram_size
        if n > 0 and len(seq) >= n:                 # a token that would repeat an n-gram of the sequence
            tail = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
            banned = [seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == tail]
            logits[banned] = -np.inf
        if not seq and self.opts.suppress_blank:
            logits[[220, sp.eot]] = -np.inf
        logits[self.suppress] = -np.inf
        if not self.opts.timestamps:
            logits[tb:] = -np.inf
            return
        logits[sp.notimestamps] = -np.inf
        last_ts = len(seq) >= 1 and seq[-1] >= tb
        penult_ts = len(seq) < 2 or seq[-2] >= tb
        if last_ts:
            if penult_ts:
                logits[tb:] = -np.inf
            else:
                logits[:sp.eot] = -np.inf
        stamps = [t for t in seq if t >= tb]
        if stamps:
            last = stamps[-1] if (last_ts and not penult_ts) else stamps[-1] + 1
            logits[tb:last] = -np.inf
        if not seq:
            logits[:tb] = -np.inf
            logits[self.max_initial + 1:] = -np.inf


class _LogProbs:
    """The log-softmax of ``x`` (float32 or float64 logits, kept, not copied), read where it is
    needed, in float64: element t is ``(x[t] - m) - ls`` (m the maximum, ls the log of the sum
    of exp(x - m)); all -inf when m is not finite."""

    __slots__ = ("x", "m", "ls")

    def __init__(self, x: np.ndarray, m: float, ls: float):
        self.x, self.m, self.ls = x, m, ls

    def __getitem__(self, t: int) -> float:
        return (float(self.x[t]) - self.m) - self.ls if np.isfinite(self.m) else -np.inf

    def values(self, part: slice) -> np.ndarray:
        """The log-probabilities of ``x[part]`` (a new float64 array)."""
        if not np.isfinite(self.m):
            return np.full(self.x[part].size, -np.inf)
        v: np.ndarray = (self.x[part].astype(np.float64) - self.m) - self.ls
        return v

    def max(self, part: slice) -> float:
        """The largest log-probability of ``x[part]`` (its largest logit's: the subtractions
        round monotonically, so this is the maximum of :meth:`values`)."""
        if not np.isfinite(self.m):
            return -np.inf
        return (float(self.x[part].max()) - self.m) - self.ls

    def best(self, k: int) -> list[int]:
        """:func:`_best` of the log-probabilities: the order of ``x`` (none when all are -inf)."""
        return _best(self.x, k) if np.isfinite(self.m) else []


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    if not np.isfinite(m):
        return np.full_like(x, -np.inf)
    y: np.ndarray = x - m
    return y - np.log(np.exp(y).sum())  # type: ignore[no-any-return]


def _best(lp: np.ndarray, k: int) -> list[int]:
    """The ids of the ``k`` largest of ``lp`` (float, NumPy shape (n,); as it was after),
    largest first (the first of equal ones first); fewer when fewer are finite: one row of
    :func:`_best_rows`."""
    return _best_rows(lp[None], k)[0]


def _best_rows(x: np.ndarray, k: int) -> list[list[int]]:
    """The ids of the ``k`` largest of each row of ``x`` (float, NumPy shape (rows, n); as it
    was after), largest first (the first of equal ones first), fewer where fewer are finite:
    ``k`` passes of ``argmax`` over all rows together (they read the array k times, a fraction
    of what ``argpartition`` costs over a vocabulary for the few a beam keeps)."""
    rows = np.arange(x.shape[0])
    picks, vals = [], []
    for _ in range(k):
        i = x.argmax(axis=1)
        picks.append(i)
        vals.append(x[rows, i])
        x[rows, i] = -np.inf
    for i, v in zip(reversed(picks), reversed(vals)):   # (a row out of finite values picks again)
        x[rows, i] = v
    out: list[list[int]] = []
    for r in rows:
        best = []
        for i, v in zip(picks, vals):
            if v[r] == -np.inf:
                break
            best.append(int(i[r]))
        out.append(best)
    return out


def language_probs(model: WhisperNet, tok: WhisperTokenizer) -> list[tuple[str, float]]:
    """The languages of the window :meth:`~.model.WhisperNet.encode` left in ``model`` (a
    multilingual model), most likely first: (code, probability among the languages) of the
    language token after ``<|startoftranscript|>``, as openai-whisper's ``detect_language``.
    ValueError for an English-only model."""
    n = tok.sp.n_languages
    if not n:
        raise ValueError("an English-only model detects no language")
    logits = model.decode([tok.sp.sot], [0])[tok.sp.lang:tok.sp.lang + n].astype(np.float64)
    p = np.exp(_log_softmax(logits))
    order = np.argsort(-p, kind="stable")
    return [(LANGUAGES[i], float(p[i])) for i in order]


def window_languages(model: WhisperNet, tok: WhisperTokenizer, n: int) -> list[str]:
    """The likeliest language of each of the windows :meth:`~.model.WhisperNet.encode` left in
    slots 0 .. n - 1 (a multilingual model), as :func:`language_probs` finds it for each, in one
    decoder graph for all (each window's row reads its own slot). ValueError for an
    English-only model."""
    sp = tok.sp
    if not sp.n_languages:
        raise ValueError("an English-only model detects no language")
    logits = model.decode_batch([[sp.sot]] * n, [[w * model.n_cells] for w in range(n)], windows=n)
    return [LANGUAGES[int(i)] for i in logits[:, sp.lang:sp.lang + sp.n_languages].argmax(axis=1)]


def detect_language(model: WhisperNet, tok: WhisperTokenizer) -> tuple[str, float]:
    """The most likely of :func:`language_probs`: (code, its probability among the languages)."""
    return language_probs(model, tok)[0]


def decode_window(model: WhisperNet, tok: WhisperTokenizer, opts: DecodeOptions) -> WindowResult:
    """Decode the window :meth:`~.model.WhisperNet.encode` left in ``model``: the tokens
    sampled after the prompt (:func:`prompt_tokens`), with the prefix before them."""
    sp = tok.sp
    prompt = prompt_tokens(tok, opts, model.hp.n_text_ctx)
    limit = opts.sample_len or model.hp.n_text_ctx // 2
    limit = min(limit, model.hp.n_text_ctx - len(prompt) - 1)
    if limit < 1:
        raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in the decoder's "
                         f"{model.hp.n_text_ctx} positions")
    filters = _Filters(tok, opts, model.hp.n_vocab)
    n_p = len(prompt)
    at = prompt.index(sp.sot)
    # <|0.00|> and the prefix: decoded with the prompt, the window's first tokens to the filters
    lead = prompt[at + len(sot_sequence(tok, opts.language, opts.task)) + (not opts.timestamps):]
    if at == 0:
        first = model.decode(prompt, range(n_p))
        # no speech: the probability of <|nospeech|> right after the start of transcript
        sot_logits = first if n_p == 1 else model.decode(prompt[:1], [0])
    else:                      # the previous text first: up to the start of transcript, then the rest
        sot_logits = model.decode(prompt[:at + 1], range(at + 1))
        first = sot_logits if n_p == at + 1 else model.decode(prompt[at + 1:], range(n_p))
    no_speech = float(np.exp(_log_softmax(sot_logits.astype(np.float64))[sp.nosp]))
    res: tuple[list[int], float] | None
    if opts.beam_size > 1 and opts.temperature == 0:
        res = _beam(model, filters, n_p, first, limit, opts.beam_size, sp.eot, lead, opts.patience,
                    opts.length_penalty)
    else:
        n = opts.best_of if opts.temperature > 0 else 1
        rng = np.random.default_rng(opts.seed)
        res = None
        for _ in range(n):
            cand = _sample(model, filters, first, n_p, limit, opts.temperature, rng, sp.eot, lead)
            if res is None or cand[1] / max(len(cand[0]), 1) > res[1] / max(len(res[0]), 1):
                res = cand
        assert res is not None
    tokens, sum_lp = res
    text = tok.decode(tokens)
    n_sampled = len(tokens) - len(lead)
    return WindowResult(tokens, sum_lp, sum_lp / (n_sampled + 1), no_speech, opts.temperature,
                        compression_ratio(text.strip()), text)


def _sample(model: WhisperNet, filters: _Filters, logits: np.ndarray, n_prompt: int, limit: int,
            temperature: float, rng: np.random.Generator, eot: int, lead: Sequence[int] = ()) -> tuple[list[int], float]:
    seq: list[int] = list(lead)          # the prompt's last tokens, the window's first
    total = 0.0
    lg = logits.astype(np.float32)          # a copy: the filters write it (best_of samples ``logits`` again)
    while True:
        lp = filters.apply(lg, seq)
        if temperature > 0:
            p = np.exp(_log_softmax(lg.astype(np.float64) / temperature))
            nxt = int(rng.choice(p.size, p=p / p.sum()))
        else:
            nxt = int(np.argmax(lg))
        total += float(lp[nxt])
        if nxt == eot or len(seq) - len(lead) >= limit:
            return seq, total
        seq.append(nxt)
        # the graph's output memory, filtered in place before the next step
        lg = model.decode_batch([[nxt]], [range(n_prompt + len(seq) - len(lead))], copy=False)[0]


def _beam_step(live: Sequence[tuple[list[int], float, list[int]]], lg: np.ndarray, filters: _Filters,
               beam_size: int, eot: int, finished: list[tuple[list[int], float]],
               enough: int) -> list[tuple[list[int], float, int]]:
    """One step of :func:`_beam` for the ``live`` beams ((tokens, score, cells)), whose logits
    are the rows of ``lg`` (float32, NumPy shape (len(live), n_vocab); filtered in place): each
    extended by its ``beam_size + 1`` best tokens, the candidates ranked by summed
    log-probability; one ending in end of text among the ``beam_size`` best goes to
    ``finished`` (up to ``enough``); returns the ``beam_size`` best others as (tokens, score,
    the live beam they extend)."""
    cands: dict[tuple[int, ...], tuple[float, int]] = {}
    lps = filters.apply_rows(lg, [seq for seq, _score, _cells in live])
    best_of = _best_rows(lg, beam_size + 1)
    for b, ((seq, score, _cells), lp, best) in enumerate(zip(live, lps, best_of)):
        for t in best:
            key = tuple(seq) + (t,)
            s = score + float(lp[t])
            if key not in cands or cands[key][0] < s:
                cands[key] = (s, b)
    chosen: list[tuple[list[int], float, int]] = []
    for rank, (key, (s, b)) in enumerate(sorted(cands.items(), key=lambda kv: -kv[1][0])):
        if key[-1] == eot:
            if rank < beam_size and len(finished) < enough:
                finished.append((list(key[:-1]), s))
        else:
            chosen.append((list(key), s, b))
        if len(chosen) >= beam_size:
            break
    return chosen


def _beam(model: WhisperNet, filters: _Filters, n_prompt: int, first: np.ndarray, limit: int,
          beam_size: int, eot: int, lead: Sequence[int] = (), patience: float = 1.0,
          length_penalty: float = 1.0) -> tuple[list[int], float]:
    """Beam search as CTranslate2 (faster-whisper's engine) runs it: ``beam_size`` live
    sequences, each extended by its ``beam_size + 1`` best tokens; of all these candidates,
    ranked by summed log-probability, one ending in end of text among the ``beam_size`` best is
    finished, and the ``beam_size`` best that do not end become the live ones; it stops when
    round(``beam_size`` x ``patience``) are finished (or at ``limit`` tokens) and returns the
    finished one of best log-probability over its length to the power ``length_penalty`` (end
    of text not counted). (openai-whisper also
    finishes end-of-text candidates ranked below the first ``beam_size``, so it can stop before a
    longer, likelier sequence ends.) Each sequence keeps the cache cells of its positions: a new
    token gets a fresh cell, prefixes share theirs (the prompt's are cells 0..n_prompt-1)."""
    if n_prompt + beam_size * limit > model.n_cells:
        raise ValueError(f"beam search of {beam_size} beams over {limit} tokens needs "
                         f"{n_prompt + beam_size * limit} KV cells; the model has {model.n_cells} (n_cells)")
    prompt_cells = list(range(n_prompt))
    # (tokens, score, cells of prompt + tokens); their logits: the rows of lg
    live: list[tuple[list[int], float, list[int]]] = [(list(lead), 0.0, prompt_cells)]
    lg = first[None]
    finished: list[tuple[list[int], float]] = []
    enough = max(1, round(beam_size * patience))
    next_cell = n_prompt
    for _ in range(limit):
        chosen = _beam_step(live, lg, filters, beam_size, eot, finished, enough)
        if len(finished) >= enough or not chosen:
            break
        cells = [live[b][2] + [next_cell + j] for j, (_seq, _s, b) in enumerate(chosen)]
        next_cell += len(chosen)
        # one graph; its output memory, read (and filtered in place) before the next step
        lg = model.decode_batch([seq[-1:] for seq, _s, _b in chosen], cells, copy=False)
        live = [(seq, s, cells[j]) for j, (seq, s, _b) in enumerate(chosen)]
    if not finished:
        finished = [(seq, s) for seq, s, _c in live]
    return max(finished, key=lambda fs: fs[1] / max(len(fs[0]), 1) ** length_penalty)


def decode_windows(model: WhisperNet, tok: WhisperTokenizer, opts: Sequence[DecodeOptions]) -> list[WindowResult]:
    """Decode the windows :meth:`~.model.WhisperNet.encode` left in slots 0 .. len(opts) - 1
    together, window w with ``opts[w]``: every step of every window's beam search (or greedy
    decoding: ``beam_size`` 1) is one decoder graph (:meth:`~.model.WhisperNet.decode_batch`
    over the windows), each window's beams reading its own cells (slot w's) and cross K/V. Each
    window's result is what :func:`decode_window` gives it alone, up to the float order of
    the batched products. The prompts must be as long (the same options but the language);
    temperature 0 only. Raises ValueError otherwise."""
    W = len(opts)
    if W == 0:
        return []
    if any(o.temperature != 0 for o in opts):
        raise ValueError("windows are decoded together at temperature 0 only")
    if len({o.beam_size for o in opts}) != 1:
        raise ValueError("the windows decoded together need one beam_size")
    sp, hp, C = tok.sp, model.hp, model.n_cells
    prompts = [prompt_tokens(tok, o, hp.n_text_ctx) for o in opts]
    n_p = len(prompts[0])
    if any(len(p) != n_p for p in prompts):
        raise ValueError("the windows decoded together need prompts of one length")
    R = opts[0].beam_size
    limits = [min(o.sample_len or hp.n_text_ctx // 2, hp.n_text_ctx - n_p - 1) for o in opts]
    limit = max(limits)
    if limit < 1:
        raise ValueError(f"a prompt of {n_p} tokens leaves no room in the decoder's {hp.n_text_ctx} positions")
    if n_p + R * limit + R > C:   # the last R cells of a window: its idle rows' scratch
        raise ValueError(f"{R} beams over {limit} tokens need {n_p + R * limit + R} KV cells a window; "
                         f"the model has {C} (n_cells)")
    filters = [_Filters(tok, o, hp.n_vocab) for o in opts]
    at = prompts[0].index(sp.sot)
    leads = [p[at + len(sot_sequence(tok, o.language, o.task)) + (not o.timestamps):] for p, o in zip(prompts, opts)]
    base = [w * C for w in range(W)]
    # the prompt, up to the start of transcript (its logits: no speech), then the rest
    upto = [p[:at + 1] for p in prompts]
    sot_logits = model.decode_batch(upto, [[b + i for i in range(at + 1)] for b in base], windows=W)
    if n_p > at + 1:
        first = model.decode_batch([p[at + 1:] for p in prompts], [[b + i for i in range(n_p)] for b in base],
                                   windows=W)
    else:
        first = sot_logits
    no_speech = [float(np.exp(_log_softmax(sot_logits[w].astype(np.float64))[sp.nosp])) for w in range(W)]
    enough = [max(1, round(R * o.patience)) for o in opts]
    live: list[list[tuple[list[int], float, list[int]]]] = [
        [(list(leads[w]), 0.0, [base[w] + i for i in range(n_p)])] for w in range(W)]
    lgs = [first[w:w + 1] for w in range(W)]      # the logits of each window's live beams
    finished: list[list[tuple[list[int], float]]] = [[] for _ in range(W)]
    done = [False] * W
    next_cell = [b + n_p for b in base]
    for step in range(limit):
        rows_tok: list[list[int]] = []
        rows_cells: list[list[int]] = []
        chosen_of: list[list[tuple[list[int], float]]] = []
        for w in range(W):
            chosen: list[tuple[list[int], float, int]] = []
            if not done[w] and step < limits[w]:
                chosen = _beam_step(live[w], lgs[w], filters[w], R, sp.eot, finished[w], enough[w])
                if len(finished[w]) >= enough[w] or not chosen:
                    done[w] = True
                    chosen = []
            elif not done[w]:
                done[w] = True                         # its own limit reached
            n = n_p + step + 1                         # cells of every row after this step's token
            kept = []
            for seq, s, b in chosen:
                rows_tok.append(seq[-1:])
                rows_cells.append(live[w][b][2] + [next_cell[w]])
                next_cell[w] += 1
                kept.append((seq, s))
            for j in range(len(chosen), R):           # rows of no beam: each writes a scratch cell of its own
                rows_tok.append([sp.eot])
                rows_cells.append([base[w] + C - R + j] * n)
            chosen_of.append(kept)
        if all(done):
            break
        # the graph's output memory: read before the next step (a window that is done keeps
        # its last beams for their tokens and scores only)
        logits_all = model.decode_batch(rows_tok, rows_cells, windows=W, copy=False)
        for w in range(W):
            if chosen_of[w]:   # (a window that stopped keeps its last beams)
                live[w] = [(seq, s, rows_cells[w * R + j]) for j, (seq, s) in enumerate(chosen_of[w])]
                lgs[w] = logits_all[w * R:w * R + len(chosen_of[w])]
    results = []
    for w in range(W):
        fin = finished[w] or [(seq, s) for seq, s, _c in live[w]]
        if not fin:
            fin = [(list(leads[w]), 0.0)]
        tokens, sum_lp = max(fin, key=lambda fs: fs[1] / max(len(fs[0]), 1) ** opts[w].length_penalty)
        text = tok.decode(tokens)
        n_sampled = len(tokens) - len(leads[w])
        results.append(WindowResult(tokens, sum_lp, sum_lp / (n_sampled + 1), no_speech[w], 0.0,
                                    compression_ratio(text.strip()), text))
    return results
