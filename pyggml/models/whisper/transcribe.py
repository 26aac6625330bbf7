"""Speech to text, window by window, as openai-whisper's ``transcribe`` and faster-whisper's
``generate_segments`` run it (:func:`generate_segments`): 30-s windows from a seek position,
segments from timestamp pairs, temperature fallback on repetitive or unlikely text, silent
windows skipped, the previous text as the next window's prompt, word timestamps. Segments come
one at a time, as each window is decoded. :class:`Whisper` collects them into a
:class:`Transcription`; :class:`pyggml.models.whisper.faster.WhisperModel` gives them as
faster-whisper does.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .audio import CHUNK, FRAMES, HOP, SAMPLE_RATE, load_audio, log_mel
from .convert import default_model, resolve_model
from .decode import (DecodeOptions, WindowResult, compression_ratio, decode_window, decode_windows, detect_language,
                     language_probs, sot_sequence, window_languages)
from .loader import WhisperFile
from .model import WhisperNet
from .timing import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, find_alignment, merge_punctuations
from .tokenizer import WhisperTokenizer
from .vad import SileroVAD, TimeMap, VadOptions, collect_chunks, group_chunks, shared_vad, speech_timestamps

__all__ = ["Whisper", "Transcription", "Segment", "Word", "TranscriptionOptions", "generate_segments",
           "encode_first_window", "audio_mel", "speech_only", "restore_times", "progress", "batched_segments",
           "chunk_features"]

#: a window whose samples all stay below this (-80 dBFS) is silence, not decoded
SILENCE = 1e-4

#: temperatures tried in turn while a window's text looks wrong (openai-whisper's defaults)
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

#: seconds per timestamp token; mel frames per 20-ms encoder frame
TIME_PRECISION = 0.02
INPUT_STRIDE = 2
_FRAMES_PER_SECOND = SAMPLE_RATE // HOP
_SENTENCE_ENDS = ".。!！?？"


@dataclass
class Word:
    """A word of a segment (faster-whisper's ``Word``): ``start``, ``end`` in seconds of the
    audio, the text (with its leading space) and the mean probability of its tokens."""

    start: float
    end: float
    word: str
    probability: float


@dataclass
class Segment:
    """A piece of the transcript (faster-whisper's ``Segment``, field for field): ``id`` (from
    1), ``seek`` (the mel frame its window starts at, 10 ms each), ``start`` and ``end`` in
    seconds, its text, its token ids (timestamps included), the window's mean log-probability,
    compression ratio and no-speech probability, its :class:`Word` s (with word timestamps,
    else None), the temperature that decoded it."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: list[Word] | None = None
    temperature: float | None = 0.0


@dataclass
class TranscriptionOptions:
    """What :func:`generate_segments` decodes with (faster-whisper's ``TranscriptionOptions``;
    ``multilingual``: each window's language detected, on a multilingual model;
    ``hallucination_silence_threshold`` with ``word_timestamps``: silence before anomalous
    words skipped, as faster-whisper does)."""

    beam_size: int = 5
    best_of: int = 5
    patience: float = 1.0
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    compression_ratio_threshold: float | None = 2.4
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    temperatures: list[float] = field(default_factory=lambda: list(TEMPERATURES))
    initial_prompt: str | Iterable[int] | None = None
    prefix: str | None = None
    suppress_blank: bool = True
    suppress_tokens: list[int] | None = field(default_factory=lambda: [-1])
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    word_timestamps: bool = False
    prepend_punctuations: str = PREPEND_PUNCTUATIONS
    append_punctuations: str = APPEND_PUNCTUATIONS
    multilingual: bool = False
    max_new_tokens: int | None = None
    clip_timestamps: str | list[float] = "0"
    hallucination_silence_threshold: float | None = None
    hotwords: str | None = None


@dataclass
class Transcription:
    """``text``: the whole transcript; ``tokens``: its text token ids (no special or timestamp
    tokens); ``segments``; ``timings`` in milliseconds: ``mel_ms``, ``encode_ms``, ``decode_ms``
    (word timestamps included), ``total_ms`` (and ``n_tokens``, the tokens decoded);
    ``language``: the language given or detected (``"en"`` for English-only models)."""

    text: str
    tokens: list[int]
    segments: list[Segment]
    timings: dict[str, float]
    language: str = "en"

    def as_dict(self) -> dict[str, Any]:
        """The ``--dump`` JSON object: text, tokens, segments (start, end, text, and ``words``
        of start, end, word, probability with word timestamps), timings."""
        def seg(s: Segment) -> dict[str, Any]:
            d: dict[str, Any] = {"start": s.start, "end": s.end, "text": s.text}
            if s.words is not None:
                d["words"] = [{"start": w.start, "end": w.end, "word": w.word, "probability": w.probability}
                              for w in s.words]
            return d
        return {"text": self.text, "tokens": self.tokens, "segments": [seg(s) for s in self.segments],
                "timings": self.timings}


def _suppress(tok: WhisperTokenizer, ids: Sequence[int] | None) -> tuple[int, ...]:
    """faster-whisper's ``suppress_tokens``: -1 stands for the non-speech symbols."""
    ids = list(ids or ())
    out = {t for t in ids if t >= 0}
    if -1 in ids:
        out.update(tok.non_speech())
    return tuple(sorted(out))


def _clips(clip_timestamps: str | Sequence[float], n_frames: int) -> list[tuple[int, int]]:
    """(start, end) mel frames of the clips to transcribe: ``"start,end,start,..."`` seconds
    (the last end: the audio's)."""
    if isinstance(clip_timestamps, str):
        clip_timestamps = [float(x) for x in clip_timestamps.split(",")] if clip_timestamps.strip() else []
    points = [round(float(t) * _FRAMES_PER_SECOND) for t in clip_timestamps] or [0]
    if len(points) % 2:
        points.append(n_frames)
    return list(zip(points[::2], points[1::2]))


def _split(tok: WhisperTokenizer, tokens: list[int], offset: float, seek: int, size: int,
           duration: float) -> tuple[list[Segment], int, bool]:
    """One window's tokens as segments (openai-whisper's rule: consecutive timestamp tokens
    close a segment), the next seek and whether the tokens end on a single timestamp."""
    tb = tok.sp.timestamp_begin
    single_end = len(tokens) >= 2 and tokens[-2] < tb <= tokens[-1]
    cuts = [i for i in range(1, len(tokens)) if tokens[i] >= tb and tokens[i - 1] >= tb]
    out: list[Segment] = []
    if cuts:
        last = 0
        for cut in cuts + ([len(tokens)] if single_end else []):
            part = tokens[last:cut]
            out.append(Segment(0, seek, round(offset + (part[0] - tb) * TIME_PRECISION, 3),
                               round(offset + (part[-1] - tb) * TIME_PRECISION, 3), "", part))
            last = cut
        if single_end:
            return out, seek + size, True
        step = (tokens[last - 1] - tb) * INPUT_STRIDE
        return out, seek + (step if step > 0 else size), False      # <|0.00|><|0.00|>: never stand still
    stamps = [t for t in tokens if t >= tb]
    if stamps and stamps[-1] != tb:
        duration = (stamps[-1] - tb) * TIME_PRECISION
    out.append(Segment(0, seek, offset, offset + duration, "", tokens))
    return out, seek + size, single_end


def _add_words(net: WhisperNet, tok: WhisperTokenizer, sot: list[int], segments: list[Segment], size: int,
               opts: TranscriptionOptions, language: str | None, last_speech: float, slot: int = 0) -> None:
    """Give ``segments`` (one window's) their words, in place (faster-whisper's
    ``add_word_timestamps``: :func:`~.timing.find_alignment`, punctuation merged, words at
    sentence ends and after pauses kept to twice the median word length, segment edges moved
    to their words); ``last_speech``: where speech last ended before the window, in seconds."""
    per_segment = [[t for t in s.tokens if t < tok.sp.eot] for s in segments]
    text = [t for part in per_segment for t in part]
    words = find_alignment(net, tok, sot, text, size, language, slot)
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if durations.size else 0.0
    longest = median * 2
    if durations.size:
        for i in range(1, len(words)):
            if words[i].end - words[i].start > longest:
                if words[i].word in _SENTENCE_ENDS:
                    words[i].end = words[i].start + longest
                elif words[i - 1].word in _SENTENCE_ENDS:
                    words[i].start = words[i].end - longest
    merge_punctuations(words, opts.prepend_punctuations, opts.append_punctuations)
    offset = segments[0].seek / _FRAMES_PER_SECOND if segments else 0.0
    k = 0
    for seg, toks in zip(segments, per_segment):
        mine: list[Word] = []
        taken = 0
        while k < len(words) and taken < len(toks):
            w = words[k]
            if w.word:
                mine.append(Word(round(offset + w.start, 2), round(offset + w.end, 2), w.word, w.probability))
            taken += len(w.tokens)
            k += 1
        if mine:
            first, last = mine[0], mine[-1]
            # the first words after a pause: no longer than twice the median
            if first.end - last_speech > median * 4 and (
                    first.end - first.start > longest or
                    (len(mine) > 1 and mine[1].end - first.start > longest * 2)):
                if len(mine) > 1 and mine[1].end - mine[1].start > longest:
                    boundary = max(mine[1].end / 2, mine[1].end - longest)
                    first.end = mine[1].start = boundary
                first.start = max(0.0, first.end - longest)
            # a segment edge inside a word that runs long wins; else the words set the edges
            if seg.start < first.end and seg.start - 0.5 > first.start:
                first.start = max(0.0, min(first.end - median, seg.start))
            else:
                seg.start = first.start
            if seg.end > last.start and seg.end + 0.5 < last.end:
                last.end = max(last.start + median, seg.end)
            else:
                seg.end = last.end
            last_speech = seg.end
        seg.words = mine


def audio_mel(samples: np.ndarray, mel_filters: np.ndarray) -> np.ndarray:
    """The log-mel of ``samples`` as the windows are cut from it (30 s of zeros after, as
    openai-whisper pads them), float32 NumPy shape (n_mels, frames)."""
    return log_mel(samples, mel_filters, pad=CHUNK)


def _window(mel: np.ndarray, seek: int, end: int | None = None) -> np.ndarray:
    """The 30-s window at mel frame ``seek``; frames from ``end`` on (a clip's end before the
    audio's) are the padding's silence."""
    window = mel[:, seek:seek + FRAMES]
    if window.shape[1] < FRAMES:
        window = np.pad(window, ((0, 0), (0, FRAMES - window.shape[1])))
    if end is not None and end - seek < FRAMES:
        window = window.copy()
        window[:, max(0, end - seek):] = mel[:, -1:]
    return np.ascontiguousarray(window)


def encode_first_window(net: WhisperNet, samples: np.ndarray, mel: np.ndarray, seek: int = 0) -> bool:
    """Encode the window at mel frame ``seek`` of :func:`audio_mel` ``mel`` into ``net`` (for
    language detection; give ``encoded=seek`` to :func:`generate_segments` then); False, and
    nothing encoded, when it is digital silence or past the end."""
    part = samples[seek * HOP:(seek + FRAMES) * HOP]
    if part.size < HOP or np.max(np.abs(part), initial=0.0) < SILENCE:
        return False
    net.encode(_window(mel, seek))
    return True


def vote_language(net: WhisperNet, tok: WhisperTokenizer, encode: Callable[[int], bool], segments: int = 1,
                  threshold: float | None = 0.5) -> tuple[str, float, list[tuple[str, float]] | None, int]:
    """faster-whisper's language detection over up to ``segments`` windows: ``encode(i)`` puts
    window i in ``net`` (False for none: past the end, or silence). The first window whose
    likeliest language has a probability above ``threshold`` decides; else the language most
    windows find likeliest (the first found of equal counts), at its best probability there
    (``threshold`` None: always so). Returns (language, probability, every language's
    probability in the last window encoded, the index of the window ``net`` holds); ("en", 0.0,
    None, -1) when no window was encoded. A multilingual model only (:func:`~.decode.language_probs`
    raises ValueError otherwise)."""
    votes: dict[str, list[float]] = {}
    probs: list[tuple[str, float]] | None = None
    held = -1
    for i in range(segments):
        if not encode(i):
            continue
        held = i
        probs = language_probs(net, tok)
        language, p = probs[0]
        if threshold is not None and p > threshold:
            return language, p, probs, held
        votes.setdefault(language, []).append(p)
    if not votes:
        return "en", 0.0, None, -1
    language = max(votes, key=lambda k: len(votes[k]))
    return language, max(votes[language]), probs, held


def _end_of(segments: list[Segment]) -> float | None:
    """The end of the last word of ``segments``, else of the last segment (None for none)."""
    for seg in reversed(segments):
        if seg.words:
            return seg.words[-1].end
    return segments[-1].end if segments else None


_PUNCTUATION = PREPEND_PUNCTUATIONS + APPEND_PUNCTUATIONS


def _anomalous(seg: Segment | None) -> bool:
    """faster-whisper's ``is_segment_anomaly``: the first 8 words (punctuation aside) improbable
    (< 0.15), very short (< 0.133 s) or very long (> 2 s)."""
    if seg is None or not seg.words:
        return False
    score = 0.0
    words = [w for w in seg.words if w.word not in _PUNCTUATION][:8]
    for w in words:
        d = w.end - w.start
        score += (1.0 if w.probability < 0.15 else 0.0) + (0.133 - d) * 15 * (d < 0.133) + (d - 2.0) * (d > 2.0)
    return score >= 3 or score + 0.01 >= len(words)


def _hallucinations(segments: list[Segment], threshold: float, offset: float, seek: int, size: int,
                    last_speech: float, n_frames: int) -> tuple[int, bool] | None:
    """faster-whisper's ``hallucination_silence_threshold``: a window that opens on an anomalous
    segment after more than ``threshold`` s of silence is decoded again from after the silence
    (returns (seek, True)); an anomalous segment with silence (or anomalies) on both sides
    ends the window there (``segments`` cut in place; returns (seek, False)); else None."""
    fps = _FRAMES_PER_SECOND
    words = [s for s in segments if s.words]
    first = words[0] if words else None
    if first is not None and _anomalous(first) and first.start - offset > threshold:
        return seek + round((first.start - offset) * fps), True
    last_end = last_speech
    window_end = (seek + FRAMES) / fps
    for i, seg in enumerate(segments):
        if not seg.words:
            continue
        if _anomalous(seg):
            nxt = next((s for s in segments[i + 1:] if s.words), None)
            next_start = nxt.words[0].start if nxt is not None and nxt.words else offset + size / fps
            before = seg.start - last_end > threshold or seg.start < threshold or seg.start - offset < 2.0
            after = next_start - seg.end > threshold or _anomalous(nxt) or window_end - seg.end < 2.0
            if before and after:
                new_seek = round(max(offset + 1, seg.start) * fps)
                if n_frames / fps - seg.end < threshold:
                    new_seek = n_frames
                del segments[i:]
                return new_seek, False
        last_end = seg.end
    return None


def generate_segments(net: WhisperNet, tok: WhisperTokenizer, samples: np.ndarray, mel: np.ndarray,
                      opts: TranscriptionOptions, language: str = "en", task: str = "transcribe",
                      stats: dict[str, float] | None = None, *, encoded: int | None = None) -> Iterator[Segment]:
    """Transcribe ``samples`` (float32, 16 kHz, one channel) with ``net`` window by window,
    yielding each :class:`Segment` as its window is decoded; ``mel``: their :func:`audio_mel`.
    ``language``, ``task``: as the
    windows are decoded (multilingual models; :func:`~.decode.detect_language` after
    :func:`encode_first_window` finds it). ``encoded``: the seek (mel frame) of a window
    ``net`` holds already (not encoded again). ``stats``, when given, gains ``mel_ms``,
    ``encode_ms``, ``decode_ms`` and ``n_tokens`` as the windows go. Raises ValueError for
    options it cannot decode with, ImportError for text prompts without tiktoken."""
    stats = stats if stats is not None else {}
    for k in ("encode_ms", "decode_ms", "n_tokens"):
        stats.setdefault(k, 0.0)
    n_frames = samples.size // HOP
    if not opts.temperatures:
        raise ValueError("give at least one temperature")
    suppress = _suppress(tok, opts.suppress_tokens)
    hotwords = tuple(tok.encode(" " + opts.hotwords.strip())) if opts.hotwords else ()
    prefix = tuple(tok.encode(" " + opts.prefix.strip())) if opts.prefix else ()
    all_tokens: list[int] = []
    if opts.initial_prompt is not None:
        if isinstance(opts.initial_prompt, str):
            all_tokens += tok.encode(" " + opts.initial_prompt.strip())
        else:
            all_tokens += [int(t) for t in opts.initial_prompt]
    reset_since = 0
    idx = 0
    last_speech = 0.0
    clips = _clips(opts.clip_timestamps, n_frames)
    seek = clips[0][0]
    for clip_start, clip_end in clips:
        clip_end = min(clip_end, n_frames)
        seek = max(seek, clip_start)
        while seek < clip_end:
            size = min(FRAMES, n_frames - seek, clip_end - seek)
            offset = seek * HOP / SAMPLE_RATE
            if np.max(np.abs(samples[seek * HOP:(seek + size) * HOP]), initial=0.0) < SILENCE:
                seek += size                           # digital silence: the model would invent words
                continue
            t1 = time.perf_counter()
            if seek != encoded:
                net.encode(_window(mel, seek, clip_end if clip_end < n_frames else None))
            encoded = None
            if opts.multilingual and tok.sp.n_languages:
                language = detect_language(net, tok)[0]   # each window's own language
            t2 = time.perf_counter()
            sot = sot_sequence(tok, language, task)
            res: WindowResult | None = None
            results: list[WindowResult] = []
            below: list[WindowResult] = []
            temperature = 0.0
            for temperature in opts.temperatures:
                dopts = DecodeOptions(beam_size=opts.beam_size if temperature == 0 else 1, temperature=temperature,
                                      best_of=opts.best_of, timestamps=not opts.without_timestamps,
                                      language=language, task=task, max_initial_timestamp=opts.max_initial_timestamp,
                                      sample_len=opts.max_new_tokens, suppress_blank=opts.suppress_blank,
                                      previous=tuple(all_tokens[reset_since:]), hotwords=hotwords,
                                      prefix=prefix if seek == 0 else (), suppress_tokens=suppress,
                                      patience=opts.patience, length_penalty=opts.length_penalty,
                                      repetition_penalty=opts.repetition_penalty,
                                      no_repeat_ngram_size=opts.no_repeat_ngram_size)
                res = decode_window(net, tok, dopts)
                results.append(res)
                stats["n_tokens"] += len(res.tokens) + 1
                fallback = False
                if opts.compression_ratio_threshold is not None and res.compression_ratio > opts.compression_ratio_threshold:
                    fallback = True                    # too repetitive
                else:
                    below.append(res)
                lp_low = opts.log_prob_threshold is not None and res.avg_logprob < opts.log_prob_threshold
                if lp_low:
                    fallback = True                    # too unlikely
                if opts.no_speech_threshold is not None and res.no_speech_prob > opts.no_speech_threshold and lp_low:
                    fallback = False                   # silence
                if not fallback:
                    break
            else:   # every temperature failed: the likeliest, not too repetitive if any is not
                res = max(below or results, key=lambda r: r.avg_logprob)
            assert res is not None
            stats["encode_ms"] += 1e3 * (t2 - t1)
            if opts.no_speech_threshold is not None and res.no_speech_prob > opts.no_speech_threshold and not (
                    opts.log_prob_threshold is not None and res.avg_logprob > opts.log_prob_threshold):
                seek += size                           # silence: nothing from this window
                stats["decode_ms"] += 1e3 * (time.perf_counter() - t2)
                continue
            previous_seek = seek
            segments, seek, single_end = _split(tok, res.tokens, offset, seek, size, size * HOP / SAMPLE_RATE)
            for s in segments:                         # a timestamp past the end of the audio
                s.end = min(s.end, n_frames * HOP / SAMPLE_RATE)
            if opts.word_timestamps:
                _add_words(net, tok, sot, segments, size, opts, language, last_speech)
                end = _end_of(segments)
                if not single_end and end is not None and end > offset:
                    seek = round(end * _FRAMES_PER_SECOND)
                if opts.hallucination_silence_threshold is not None:
                    cut = _hallucinations(segments, opts.hallucination_silence_threshold, offset, previous_seek,
                                          size, last_speech, n_frames)
                    if cut is not None:
                        seek, skip = cut
                        if skip:                       # the window opens on a hallucination after silence
                            stats["decode_ms"] += 1e3 * (time.perf_counter() - t2)
                            continue
                end = _end_of(segments)
                if end is not None:
                    last_speech = end
            stats["decode_ms"] += 1e3 * (time.perf_counter() - t2)
            for s in segments:
                s.text = tok.decode(s.tokens)
                if s.start == s.end or not s.text.strip():
                    continue
                all_tokens += s.tokens
                idx += 1
                s.id, s.seek, s.temperature = idx, previous_seek, temperature
                s.avg_logprob, s.compression_ratio, s.no_speech_prob = \
                    res.avg_logprob, res.compression_ratio, res.no_speech_prob
                yield s
            if not opts.condition_on_previous_text or temperature > opts.prompt_reset_on_temperature:
                reset_since = len(all_tokens)


def chunk_features(piece: np.ndarray, mel_filters: np.ndarray) -> np.ndarray:
    """A chunk's window as faster-whisper's batched pipeline makes it: the log-mel of the
    chunk alone (160 samples of padding, its last frame dropped), padded with zeros to 30 s;
    float32 NumPy shape (n_mels, 3000)."""
    mel = log_mel(piece, mel_filters, pad=HOP)[:, :-1][:, :FRAMES]
    return np.ascontiguousarray(np.pad(mel, ((0, 0), (0, FRAMES - mel.shape[1]))))


def batched_segments(net: WhisperNet, tok: WhisperTokenizer, mel_filters: np.ndarray,
                     chunks: Sequence[tuple[np.ndarray, float, float]], decode: DecodeOptions,
                     opts: TranscriptionOptions, batch_size: int,
                     stats: dict[str, float] | None = None) -> Iterator[Segment]:
    """faster-whisper's batched transcription: each of ``chunks`` ((samples of at most 30 s,
    offset and duration in seconds)) a window of its own (:func:`chunk_features`), decoded
    with ``decode`` and no previous text, ``batch_size`` windows together
    (:func:`~.decode.decode_windows`: one decoder graph per step for all of them); each window's
    segments split at its timestamp pairs (one segment without timestamps), with words where
    ``opts.word_timestamps``; with ``opts.multilingual`` (a multilingual model) each window in
    the language it is found likeliest in (:func:`~.decode.window_languages`), as
    faster-whisper's pipeline does. Yields the segments in order, as each batch is decoded;
    ``net`` holds ``min(batch_size, len(chunks))`` slots afterwards. ``stats`` gains
    ``encode_ms``, ``decode_ms`` and ``n_tokens``."""
    stats = stats if stats is not None else {}
    for k in ("encode_ms", "decode_ms", "n_tokens"):
        stats.setdefault(k, 0.0)
    if not chunks:
        return
    net.set_slots(min(batch_size, len(chunks)))
    n_id = 0
    last_speech = 0.0
    per_window = opts.multilingual and tok.sp.n_languages > 0
    for start in range(0, len(chunks), batch_size):
        batch = chunks[start:start + batch_size]
        t0 = time.perf_counter()
        for slot, (piece, _o, _d) in enumerate(batch):
            net.encode(chunk_features(piece, mel_filters), slot)
        t1 = time.perf_counter()
        options = ([replace(decode, language=lang) for lang in window_languages(net, tok, len(batch))]
                   if per_window else [decode] * len(batch))
        results = decode_windows(net, tok, options)
        stats["encode_ms"] += 1e3 * (t1 - t0)
        stats["decode_ms"] += 1e3 * (time.perf_counter() - t1)
        for slot, ((_p, offset, duration), res, o) in enumerate(zip(batch, results, options)):
            stats["n_tokens"] += len(res.tokens) + 1
            size = math.ceil(duration) * _FRAMES_PER_SECOND
            seek = int(offset * _FRAMES_PER_SECOND)
            parts, _next, _single = _split(tok, res.tokens, offset, seek, size, duration)
            for seg in parts:
                seg.text = tok.decode([t for t in seg.tokens if t < tok.sp.eot])
                seg.avg_logprob, seg.no_speech_prob = res.avg_logprob, res.no_speech_prob
                seg.compression_ratio = compression_ratio(seg.text)
                seg.temperature = decode.temperature
                seg.start, seg.end = round(seg.start, 3), round(seg.end, 3)
            if opts.word_timestamps and parts:
                _add_words(net, tok, sot_sequence(tok, o.language, o.task), parts, size, opts, o.language,
                           last_speech, slot)
                last_speech = parts[-1].end
            for seg in parts:
                n_id += 1
                seg.id = n_id
                yield seg


def progress(segments: Iterable[Segment], duration: float) -> Iterator[Segment]:
    """``segments``, with a tqdm bar of the audio's seconds done on stderr (faster-whisper's
    ``log_progress``). Raises ImportError without tqdm (``pip install "pyggml[whisper]"``)
    before any segment is decoded."""
    try:
        from tqdm import tqdm
    except ImportError as e:
        raise ImportError('a progress bar needs tqdm: pip install "pyggml[whisper]"') from e
    return _bar(tqdm, segments, duration)


def _bar(tqdm: Any, segments: Iterable[Segment], duration: float) -> Iterator[Segment]:
    with tqdm(total=round(duration, 2), unit="s") as bar:
        done = 0.0
        for s in segments:
            end = min(s.end, duration)
            bar.update(round(max(0.0, end - done), 2))
            done = max(done, end)
            yield s
        bar.update(round(max(0.0, duration - done), 2))


def speech_only(vad: SileroVAD, samples: np.ndarray, opts: VadOptions | None = None
                ) -> tuple[np.ndarray, TimeMap | None]:
    """faster-whisper's ``vad_filter``: the samples of the speech Silero VAD finds in
    ``samples`` (:func:`~.vad.speech_timestamps` with ``opts``), one chunk after the other, and
    the map of times in them back to ``samples``' (None when there is no speech: the samples
    are empty)."""
    chunks = speech_timestamps(vad.probs(samples), samples.size, opts)
    return collect_chunks(samples, chunks), (TimeMap(chunks) if chunks else None)


def restore_times(segments: Iterable[Segment], tmap: TimeMap) -> Iterator[Segment]:
    """Segments of :func:`speech_only`'s samples with the times of the original audio
    (faster-whisper's ``restore_speech_timestamps``): each word by the chunk its middle falls
    in, a segment from its first word to its last; without words, the segment's ends."""
    for s in segments:
        if s.words:
            for w in s.words:
                i = tmap.chunk_index((w.start + w.end) / 2)
                w.start, w.end = tmap.original(w.start, i), tmap.original(w.end, i)
            s.start, s.end = s.words[0].start, s.words[-1].end
        else:
            s.start, s.end = tmap.original(s.start), tmap.original(s.end, is_end=True)
        yield s


class Whisper:
    """A Whisper model (``model``: a whisper.cpp file, a CTranslate2 or Hugging Face model folder
    converted once and cached, or ``"tiny.en"``, as :func:`~.convert.resolve_model` takes them;
    default :func:`~.convert.default_model`, tiny.en) on a ggml device (``backend``,
    ``n_threads``, ``flash_attn``, ``repack``, ``encoder_bf16`` as :class:`~.model.WhisperNet`
    takes them). Raises :class:`~pyggml.models.common.ModelError` for a file it cannot run,
    FileNotFoundError for a missing one (or a missing default model, with the pip command)."""

    def __init__(self, model: str | Path | None = None, *, backend: str = "cpu", n_threads: int | None = None,
                 flash_attn: bool = True, repack: bool = True, encoder_bf16: bool | None = None):
        self.file = WhisperFile(resolve_model(model) if model is not None else default_model())
        self.tok = WhisperTokenizer(self.file.vocab, self.file.hparams)
        self.model = WhisperNet(self.file, backend=backend, n_threads=n_threads, flash_attn=flash_attn,
                                repack=repack, encoder_bf16=encoder_bf16)

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "Whisper":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transcribe(self, audio: str | Path | np.ndarray, *, beam_size: int = 5, timestamps: bool = True,
                   language: str | None = None, task: str = "transcribe",
                   temperatures: Sequence[float] = TEMPERATURES, compression_ratio_threshold: float = 2.4,
                   logprob_threshold: float = -1.0, no_speech_threshold: float = 0.6,
                   word_timestamps: bool = False, initial_prompt: str | None = None,
                   condition_on_previous_text: bool = False, hotwords: str | None = None,
                   vad: bool | VadOptions = False, show_progress: bool = False,
                   batch_size: int | None = None) -> Transcription:
        """Transcribe ``audio`` (a file path, or float32 samples at 16 kHz) with
        :func:`generate_segments`. ``beam_size`` 1 is greedy. A window is decoded again at the
        next temperature while its compression ratio is above ``compression_ratio_threshold``
        or its mean log-probability below ``logprob_threshold``; it is skipped as silence when
        its no-speech probability is above ``no_speech_threshold`` and its mean log-probability
        below ``logprob_threshold``; a window of digital silence (:data:`SILENCE`) is not
        decoded. ``word_timestamps``: each segment's :class:`Word` s; ``initial_prompt``,
        ``hotwords``: text the first window (``hotwords``: every window) is prompted with;
        ``condition_on_previous_text``: each window prompted with the text before it; ``vad``:
        only the speech Silero VAD finds (True, or its :class:`~.vad.VadOptions`; the times are
        the original audio's); ``show_progress``: a tqdm bar on stderr (:func:`progress`);
        ``batch_size``: windows decoded together (:func:`batched_segments`, faster-whisper's
        batched pipeline: VAD chunks joined up to 30 s with ``vad``, else the audio's 30-s
        pieces; each window on its own, at the first temperature, no previous text). Empty
        or silent audio gives an empty transcript. Raises FileNotFoundError,
        :class:`~.audio.AudioError` for a file that is not audio, ValueError for bad options."""
        t0 = time.perf_counter()
        samples = load_audio(audio) if not isinstance(audio, np.ndarray) else np.asarray(audio, np.float32)
        if samples.ndim != 1:
            raise ValueError("audio samples must be one channel (a 1-D array)")
        if not temperatures:
            raise ValueError("give at least one temperature")
        DecodeOptions(beam_size=beam_size, task=task)   # checks the options before anything runs
        opts = TranscriptionOptions(beam_size=beam_size, temperatures=list(temperatures),
                                    compression_ratio_threshold=compression_ratio_threshold,
                                    log_prob_threshold=logprob_threshold, no_speech_threshold=no_speech_threshold,
                                    condition_on_previous_text=condition_on_previous_text,
                                    initial_prompt=initial_prompt, hotwords=hotwords,
                                    without_timestamps=not timestamps, word_timestamps=word_timestamps)
        tmap = None
        stats: dict[str, float] = {}
        if batch_size is not None:
            return self._batched(samples, t0, opts, beam_size, timestamps, language, task, vad, batch_size,
                                 show_progress)
        if vad is not False:
            t1 = time.perf_counter()
            samples, tmap = speech_only(shared_vad(), samples, vad if isinstance(vad, VadOptions) else None)
            stats["vad_ms"] = 1e3 * (time.perf_counter() - t1)
        t1 = time.perf_counter()
        mel = audio_mel(samples, self.file.mel_filters)
        stats["mel_ms"] = 1e3 * (time.perf_counter() - t1)
        encoded = None
        if language is None:
            language = "en"
            if self.tok.sp.n_languages:
                language, _p, _probs, held = vote_language(
                    self.model, self.tok, lambda i: encode_first_window(self.model, samples, mel))
                encoded = 0 if held == 0 else None
        found: Iterable[Segment] = generate_segments(self.model, self.tok, samples, mel, opts, language, task,
                                                     stats, encoded=encoded)
        if show_progress:
            found = progress(found, samples.size / SAMPLE_RATE)
        return self._result(found, tmap, stats, t0, language)

    def _result(self, found: Iterable[Segment], tmap: TimeMap | None, stats: dict[str, float], t0: float,
                language: str) -> Transcription:
        """The :class:`Transcription` of the segments ``found`` (times mapped back by ``tmap``),
        with the timings of ``stats`` and the total since ``t0``."""
        segments = list(restore_times(found, tmap) if tmap is not None else found)
        tokens = [t for s in segments for t in self.tok.text_tokens(s.tokens)]
        timings = {"mel_ms": stats["mel_ms"], "encode_ms": stats["encode_ms"], "decode_ms": stats["decode_ms"],
                   "total_ms": 1e3 * (time.perf_counter() - t0), "n_tokens": stats["n_tokens"]}
        if "vad_ms" in stats:
            timings["vad_ms"] = stats["vad_ms"]
        return Transcription("".join(s.text for s in segments), tokens, segments, timings, language)

    def _batched(self, samples: np.ndarray, t0: float, opts: TranscriptionOptions, beam_size: int, timestamps: bool,
                 language: str | None, task: str, vad: bool | VadOptions, batch_size: int,
                 show_progress: bool) -> Transcription:
        """:meth:`transcribe` with ``batch_size`` (:func:`batched_segments`)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        stats: dict[str, float] = {"mel_ms": 0.0}      # each window's mel is made with its encoding
        tmap = None
        if vad is not False:
            t1 = time.perf_counter()
            vopts = vad if isinstance(vad, VadOptions) else VadOptions(max_speech_duration_s=30,
                                                                        min_silence_duration_ms=160)
            found = speech_timestamps(shared_vad().probs(samples), samples.size, vopts)
            chunks = group_chunks(samples, found, 30)
            tmap = TimeMap(found) if found else None
            stats["vad_ms"] = 1e3 * (time.perf_counter() - t1)
        else:
            chunks = [(samples[i:i + CHUNK], i / SAMPLE_RATE, min(CHUNK, samples.size - i) / SAMPLE_RATE)
                      for i in range(0, samples.size, CHUNK)]
        chunks = [c for c in chunks if c[0].size and np.abs(c[0]).max() >= SILENCE]
        if language is None:
            if self.tok.sp.n_languages and chunks:
                self.model.encode(chunk_features(chunks[0][0], self.file.mel_filters))
                language = detect_language(self.model, self.tok)[0]
            else:
                language = "en"
        decode = DecodeOptions(beam_size=beam_size, timestamps=timestamps, language=language, task=task,
                               temperature=opts.temperatures[0], suppress_tokens=None,
                               hotwords=tuple(self.tok.encode(" " + opts.hotwords.strip())) if opts.hotwords else (),
                               previous=tuple(self.tok.encode(" " + opts.initial_prompt.strip()))
                               if isinstance(opts.initial_prompt, str) else ())
        found_segments: Iterable[Segment] = batched_segments(self.model, self.tok, self.file.mel_filters, chunks,
                                                             decode, opts, batch_size, stats)
        if show_progress:
            found_segments = progress(found_segments, sum(c[2] for c in chunks))
        return self._result(found_segments, tmap, stats, t0, language)
