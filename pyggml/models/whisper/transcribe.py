"""Speech to text: :class:`Whisper` transcribes audio of any length window by window, as
openai-whisper's ``transcribe`` does (seek, segments from timestamp pairs, temperature fallback
on repetitive or unlikely text, silent windows skipped), into a :class:`Transcription`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .audio import CHUNK, FRAMES, HOP, SAMPLE_RATE, load_audio, log_mel
from .convert import default_model
from .decode import DecodeOptions, WindowResult, decode_window, detect_language
from .loader import WhisperFile
from .model import WhisperModel
from .tokenizer import WhisperTokenizer

__all__ = ["Whisper", "Transcription", "Segment"]

#: a window whose samples all stay below this (-80 dBFS) is silence, not decoded
SILENCE = 1e-4

#: temperatures tried in turn while a window's text looks wrong (openai-whisper's defaults)
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass
class Segment:
    """A piece of the transcript: ``start`` and ``end`` in seconds, its text and token ids."""

    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)


@dataclass
class Transcription:
    """``text``: the whole transcript; ``tokens``: its text token ids (no special or timestamp
    tokens); ``segments``; ``timings`` in milliseconds: ``mel_ms``, ``encode_ms``, ``decode_ms``,
    ``total_ms`` (and ``n_tokens``, the tokens decoded); ``language``: the language given or
    detected (``"en"`` for English-only models)."""

    text: str
    tokens: list[int]
    segments: list[Segment]
    timings: dict[str, float]
    language: str = "en"

    def as_dict(self) -> dict[str, Any]:
        """The ``--dump`` JSON object: text, tokens, segments (start, end, text), timings."""
        return {"text": self.text, "tokens": self.tokens,
                "segments": [{"start": s.start, "end": s.end, "text": s.text} for s in self.segments],
                "timings": self.timings}


class Whisper:
    """A whisper.cpp model file (``model``: a path; default :func:`~.convert.default_model`,
    tiny.en) on a ggml device (``backend``, ``n_threads``, ``flash_attn``, ``repack`` as
    :class:`~.model.WhisperModel` takes them). Raises :class:`~pyggml.models.common.ModelError`
    for a file it cannot run, FileNotFoundError for a missing one (or, without ``model``, a
    missing default model, with the pip command)."""

    def __init__(self, model: str | Path | None = None, *, backend: str = "cpu", n_threads: int | None = None,
                 flash_attn: bool = True, repack: bool = True):
        self.file = WhisperFile(model if model is not None else default_model())
        self.tok = WhisperTokenizer(self.file.vocab, self.file.hparams)
        self.model = WhisperModel(self.file, backend=backend, n_threads=n_threads, flash_attn=flash_attn,
                                  repack=repack)

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "Whisper":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transcribe(self, audio: str | Path | np.ndarray, *, beam_size: int = 5, timestamps: bool = True,
                   language: str | None = None, task: str = "transcribe",
                   temperatures: Sequence[float] = TEMPERATURES, compression_ratio_threshold: float = 2.4,
                   logprob_threshold: float = -1.0, no_speech_threshold: float = 0.6) -> Transcription:
        """Transcribe ``audio`` (a file path, or float32 samples at 16 kHz). ``beam_size`` 1 is
        greedy. A window is decoded again at the next temperature while its compression ratio is
        above ``compression_ratio_threshold`` or its mean log-probability below
        ``logprob_threshold``; it is skipped as silence when its no-speech probability is above
        ``no_speech_threshold`` and its mean log-probability below ``logprob_threshold``; a window
        of digital silence (:data:`SILENCE`) is not decoded. Empty or silent audio gives an empty
        transcript. Raises FileNotFoundError,
        :class:`~.audio.AudioError` for a file that is not audio, ValueError for bad options."""
        t0 = time.perf_counter()
        samples = load_audio(audio) if not isinstance(audio, np.ndarray) else np.asarray(audio, np.float32)
        if samples.ndim != 1:
            raise ValueError("audio samples must be one channel (a 1-D array)")
        if not temperatures:
            raise ValueError("give at least one temperature")
        n_frames = samples.size // HOP
        mel = log_mel(samples, self.file.mel_filters, pad=CHUNK)   # as openai-whisper: 30 s of zeros after
        t_mel = time.perf_counter() - t0
        t_enc = t_dec = 0.0
        segments: list[Segment] = []
        all_tokens: list[int] = []
        n_decoded = 0
        seek = 0
        while seek < n_frames:
            seg_frames = min(FRAMES, n_frames - seek)
            if np.max(np.abs(samples[seek * HOP:(seek + seg_frames) * HOP]), initial=0.0) < SILENCE:
                seek += seg_frames                     # digital silence: the model would invent words
                continue
            window = mel[:, seek:seek + FRAMES]
            if window.shape[1] < FRAMES:
                window = np.pad(window, ((0, 0), (0, FRAMES - window.shape[1])))
            t1 = time.perf_counter()
            self.model.encode(np.ascontiguousarray(window))
            t2 = time.perf_counter()
            if language is None and self.tok.sp.n_languages:
                language, _p = detect_language(self.model, self.tok)     # from the first window
            res: WindowResult | None = None
            for temp in temperatures:
                opts = DecodeOptions(beam_size=beam_size if temp == 0 else 1, temperature=temp,
                                     timestamps=timestamps, language=language, task=task)
                res = decode_window(self.model, self.tok, opts)
                n_decoded += len(res.tokens) + 1
                too_repetitive = res.compression_ratio > compression_ratio_threshold
                too_unlikely = res.avg_logprob < logprob_threshold
                silent = res.no_speech_prob > no_speech_threshold and too_unlikely
                if silent or not (too_repetitive or too_unlikely):
                    break
            assert res is not None
            t_enc += t2 - t1
            t_dec += time.perf_counter() - t2
            if res.no_speech_prob > no_speech_threshold and res.avg_logprob < logprob_threshold:
                seek += seg_frames                     # silence: nothing from this window
                continue
            offset = seek * HOP / SAMPLE_RATE
            new, seek_step = self._segments(res.tokens, offset, seg_frames)
            for sgm in new:                            # a timestamp past the end of the audio
                sgm.end = min(sgm.end, n_frames * HOP / SAMPLE_RATE)
            segments += new
            for sgm in new:
                all_tokens += self.tok.text_tokens(sgm.tokens)
            seek += seek_step if seek_step > 0 else seg_frames   # <|0.00|><|0.00|>: never stand still
        text = "".join(s.text for s in segments)
        total = time.perf_counter() - t0
        return Transcription(text, all_tokens, segments,
                             {"mel_ms": 1e3 * t_mel, "encode_ms": 1e3 * t_enc, "decode_ms": 1e3 * t_dec,
                              "total_ms": 1e3 * total, "n_tokens": float(n_decoded)}, language or "en")

    def _segments(self, tokens: list[int], offset: float, seg_frames: int) -> tuple[list[Segment], int]:
        """The segments of one window's tokens (openai-whisper's rule: consecutive timestamp
        tokens close a segment) and how many mel frames to move on."""
        tok = self.tok
        is_ts = [tok.is_timestamp(t) for t in tokens]
        consecutive = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
        single_ending = len(tokens) >= 2 and not is_ts[-2] and is_ts[-1]
        out: list[Segment] = []
        if consecutive:
            slices = consecutive + ([len(tokens)] if single_ending else [])
            last = 0
            for cut in slices:
                part = tokens[last:cut]
                if len(part) >= 2 and is_ts[last] and is_ts[cut - 1]:
                    self._add(out, part, offset)
                last = cut
            if single_ending:
                return out, seg_frames
            last_ts = tokens[last - 1]
            return out, round(tok.time_of(last_ts) * SAMPLE_RATE / HOP)
        stamps = [t for t in tokens if tok.is_timestamp(t)]
        duration = seg_frames * HOP / SAMPLE_RATE
        if stamps and stamps[-1] != tok.sp.timestamp_begin:
            duration = tok.time_of(stamps[-1])
        text_ids = tok.text_tokens(tokens)
        if text_ids:
            out.append(Segment(offset, offset + duration, tok.decode(text_ids), tokens))
        return out, seg_frames

    def _add(self, out: list[Segment], part: list[int], offset: float) -> None:
        tok = self.tok
        text_ids = tok.text_tokens(part)
        if text_ids:
            out.append(Segment(round(offset + tok.time_of(part[0]), 3), round(offset + tok.time_of(part[-1]), 3),
                               tok.decode(text_ids), part))
