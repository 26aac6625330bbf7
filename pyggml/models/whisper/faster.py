"""faster-whisper's API on ggml: code written for ``faster_whisper.WhisperModel`` runs by
changing its import::

    from pyggml.models.whisper import WhisperModel

    model = WhisperModel("tiny.en", device="cpu", compute_type="float32")
    segments, info = model.transcribe("audio.wav", beam_size=5, word_timestamps=True)
    for segment in segments:
        print("[%.2fs -> %.2fs] %s" % (segment.start, segment.end, segment.text))

``transcribe`` takes faster-whisper's parameters with its defaults and returns a generator of
:class:`~.transcribe.Segment` (decoded as it is iterated) and a :class:`TranscriptionInfo`.
``vad_filter=True`` runs Silero VAD on ggml (:mod:`.vad`; the model file is faster-whisper's:
``pip install --no-deps faster-whisper==1.2.1``); ``multilingual=True`` detects each window's
language. ``WhisperModel.detect_language`` is faster-whisper's too. A parameter pyggml does
not implement raises ValueError when given a value that would change the result
(``chunk_length`` other than 30); nothing is ignored silently.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

import numpy as np

from pyggml import devices

from .audio import CHUNK, FRAMES, HOP, SAMPLE_RATE, load_audio, log_mel
from .convert import resolve_model
from .decode import DecodeOptions
from .loader import WhisperFile
from .model import WhisperNet
from .timing import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from .tokenizer import LANGUAGES, WhisperTokenizer
from .transcribe import (TEMPERATURES, Segment, TranscriptionOptions, Word, _suppress, audio_mel, batched_segments,
                         chunk_features, encode_first_window, generate_segments, progress, restore_times,
                         speech_only, vote_language)
from .vad import TimeMap, VadOptions, group_chunks, shared_vad, speech_timestamps

__all__ = ["WhisperModel", "BatchedInferencePipeline", "TranscriptionInfo", "TranscriptionOptions", "VadOptions",
           "Segment", "Word", "COMPUTE_TYPES"]

#: faster-whisper's compute types -> the weight type of the converted model file
COMPUTE_TYPES = {"default": "f16", "auto": "f16", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
                 "int8": "q8_0", "int8_float32": "q8_0", "int8_float16": "q8_0", "int8_bfloat16": "q8_0"}


@dataclass
class TranscriptionInfo:
    """faster-whisper's ``TranscriptionInfo``: the language given or detected and its
    probability (1 for English-only models or a given language), ``duration`` of the audio and
    of its speech after VAD (the same without ``vad_filter``) in seconds, every language's
    probability (multilingual models when detected, else None), and the options."""

    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    all_language_probs: list[tuple[str, float]] | None
    transcription_options: TranscriptionOptions
    vad_options: VadOptions = field(default_factory=VadOptions)


def _vad_options(parameters: dict[str, Any] | VadOptions | None) -> VadOptions:
    """``vad_parameters`` as :class:`VadOptions` (None: the defaults); ValueError for another
    type or an unknown name."""
    if parameters is not None and not isinstance(parameters, (dict, VadOptions)):
        raise ValueError("vad_parameters must be a dict or VadOptions")
    try:
        return VadOptions(**parameters) if isinstance(parameters, dict) else parameters or VadOptions()
    except TypeError as e:
        raise ValueError(f"vad_parameters: {e}") from None


def _check_detection(segments: int, threshold: float | None) -> None:
    """ValueError for language detection settings out of range."""
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"language_detection_segments must be an int >= 1, not {segments!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
        raise ValueError(f"language_detection_threshold must be a number or None, not {threshold!r}")


def _device(device: str, device_index: int | list[int]) -> str:
    if isinstance(device_index, list):
        if len(device_index) != 1:
            raise ValueError("one device_index: pyggml runs a model on one device")
        device_index = device_index[0]
    if device == "auto":
        names = [d.name for d in devices()]
        cuda = f"CUDA{device_index}"
        return cuda if cuda in names else "cpu"
    if device == "cuda":
        return f"CUDA{device_index}"
    return device


class WhisperModel:
    """faster-whisper's ``WhisperModel`` on ggml. ``model_size_or_path``: what
    :func:`~.convert.resolve_model` takes; ``device``: ``"cpu"``, ``"cuda"`` (``CUDA<device_index>``),
    ``"auto"`` (CUDA when there is one) or a ggml device name (``"Vulkan0"``, ``"numpy"``...);
    ``compute_type``: one of :data:`COMPUTE_TYPES` (the weight type the model is converted to;
    a whisper.cpp file runs as it is; ``"default"`` and ``"auto"`` also give the encoder BF16
    products where they are fast, as :class:`~.model.WhisperNet`'s ``encoder_bf16``);
    ``cpu_threads``: 0 for all the cores this process may use. ``num_workers``,
    ``download_root``, ``local_files_only``, ``files``, ``revision``, ``use_auth_token``:
    faster-whisper's, accepted at the values that change nothing here.
    Raises FileNotFoundError, ValueError for an unknown compute type or option,
    :class:`pyggml.BackendNotAvailableError` for an unknown device,
    :class:`~pyggml.models.common.ModelError` for a file it cannot run."""

    def __init__(self, model_size_or_path: str | os.PathLike[str], device: str = "auto",
                 device_index: int | list[int] = 0, compute_type: str = "default", cpu_threads: int = 0,
                 num_workers: int = 1, download_root: str | None = None, local_files_only: bool = False,
                 files: dict[str, Any] | None = None, revision: str | None = None,
                 use_auth_token: str | bool | None = None, *, flash_attn: bool = True):
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {sorted(COMPUTE_TYPES)}, not {compute_type!r}")
        if files is not None or revision is not None or use_auth_token not in (None, False):
            raise ValueError("files, revision and use_auth_token select downloads: pyggml downloads nothing "
                             "(pass a local model folder or file)")
        if num_workers < 1 or cpu_threads < 0:
            raise ValueError("num_workers must be >= 1 and cpu_threads >= 0")
        self.model_path = resolve_model(model_size_or_path, COMPUTE_TYPES[compute_type])
        self.file = WhisperFile(self.model_path)
        self.tok = WhisperTokenizer(self.file.vocab, self.file.hparams)
        auto = compute_type in ("default", "auto")     # else the types the user asked for, as stored
        self.net = WhisperNet(self.file, backend=_device(device, device_index), n_threads=cpu_threads or None,
                              flash_attn=flash_attn, encoder_bf16=None if auto else False)
        #: the language codes of the model (``["en"]`` for English-only models)
        self.supported_languages = list(LANGUAGES[:self.tok.sp.n_languages]) or ["en"]


    @property
    def is_multilingual(self) -> bool:
        return bool(self.tok.sp.n_languages)

    def close(self) -> None:
        """Free the model's weights and graphs (idempotent)."""
        self.net.close()

    def __enter__(self) -> "WhisperModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transcribe(  # noqa: PLR0913 - faster-whisper's parameters, one for one
            self, audio: str | os.PathLike[str] | BinaryIO | np.ndarray, language: str | None = None,
            task: str = "transcribe", log_progress: bool = False, beam_size: int = 5, best_of: int = 5,
            patience: float = 1, length_penalty: float = 1, repetition_penalty: float = 1,
            no_repeat_ngram_size: int = 0, temperature: float | list[float] | tuple[float, ...] = TEMPERATURES,
            compression_ratio_threshold: float | None = 2.4, log_prob_threshold: float | None = -1.0,
            no_speech_threshold: float | None = 0.6, condition_on_previous_text: bool = True,
            prompt_reset_on_temperature: float = 0.5, initial_prompt: str | Iterable[int] | None = None,
            prefix: str | None = None, suppress_blank: bool = True, suppress_tokens: list[int] | None = [-1],  # noqa: B006
            without_timestamps: bool = False, max_initial_timestamp: float = 1.0, word_timestamps: bool = False,
            prepend_punctuations: str = PREPEND_PUNCTUATIONS, append_punctuations: str = APPEND_PUNCTUATIONS,
            multilingual: bool = False, vad_filter: bool = False, vad_parameters: dict[str, Any] | VadOptions | None = None,
            max_new_tokens: int | None = None, chunk_length: int | None = None,
            clip_timestamps: str | list[float] = "0", hallucination_silence_threshold: float | None = None,
            hotwords: str | None = None, language_detection_threshold: float | None = 0.5,
            language_detection_segments: int = 1) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Transcribe ``audio`` (a path or file object of any format soundfile reads, or
        float32 samples at 16 kHz) as faster-whisper's ``WhisperModel.transcribe`` does, with
        its parameters and defaults (see its documentation; beam search is CTranslate2's). Returns (a generator of :class:`~.transcribe.Segment`, decoded as it is
        iterated; :class:`TranscriptionInfo`); the language of a multilingual model is detected
        on the first window here, before returning. Raises ValueError for bad values and for
        those of unimplemented features (see the module), FileNotFoundError and
        :class:`~.audio.AudioError` for audio it cannot read."""
        if chunk_length not in (None, 30):
            raise ValueError("not implemented in pyggml: chunk_length other than 30")
        _check_detection(language_detection_segments, language_detection_threshold)
        vad = _vad_options(vad_parameters)
        temps = [float(temperature)] if isinstance(temperature, (int, float)) else [float(t) for t in temperature]
        DecodeOptions(beam_size=beam_size, best_of=best_of, task=task, patience=patience,   # checks them
                      repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        if not temps or any(t < 0 for t in temps):
            raise ValueError("temperature: one or more values >= 0")
        if language is not None and language not in self.supported_languages:
            raise ValueError(f"language {language!r} is not one of the model's: {self.supported_languages}")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        opts = TranscriptionOptions(
            beam_size=beam_size, best_of=best_of, patience=patience, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            log_prob_threshold=log_prob_threshold, no_speech_threshold=no_speech_threshold,
            compression_ratio_threshold=compression_ratio_threshold,
            condition_on_previous_text=condition_on_previous_text,
            prompt_reset_on_temperature=prompt_reset_on_temperature, temperatures=temps,
            initial_prompt=initial_prompt, prefix=prefix, suppress_blank=suppress_blank,
            suppress_tokens=list(suppress_tokens) if suppress_tokens is not None else None,
            without_timestamps=without_timestamps, max_initial_timestamp=max_initial_timestamp,
            word_timestamps=word_timestamps, prepend_punctuations=prepend_punctuations,
            append_punctuations=append_punctuations, multilingual=multilingual, max_new_tokens=max_new_tokens,
            clip_timestamps=clip_timestamps, hallucination_silence_threshold=hallucination_silence_threshold,
            hotwords=hotwords)
        samples = self._samples(audio)
        duration = samples.size / SAMPLE_RATE
        tmap = None
        if vad_filter and clip_timestamps == "0":       # as faster-whisper: clips turn the VAD off
            samples, tmap = speech_only(shared_vad(), samples, vad)
        mel = audio_mel(samples, self.file.mel_filters)
        probs: list[tuple[str, float]] | None = None
        encoded = None
        if language is not None:
            probability = 1.0
        elif not self.is_multilingual:
            language, probability = "en", 1.0
        else:
            first = opts.clip_timestamps
            start = float(first.split(",")[0]) if isinstance(first, str) else float(first[0]) if first else 0.0
            seek = round(start * SAMPLE_RATE / HOP)
            seek = seek if seek < samples.size // HOP else 0
            language, probability, probs, held = vote_language(
                self.net, self.tok, lambda i: encode_first_window(self.net, samples, mel, seek + i * FRAMES),
                language_detection_segments, language_detection_threshold)
            encoded = seek + held * FRAMES if held >= 0 else None
        info = TranscriptionInfo(language, probability, duration, samples.size / SAMPLE_RATE, probs, opts, vad)
        segments = generate_segments(self.net, self.tok, samples, mel, opts, language, task, encoded=encoded)
        if tmap is not None:
            segments = restore_times(segments, tmap)
        if log_progress:
            segments = progress(segments, samples.size / SAMPLE_RATE)
        return segments, info

    def detect_language(self, audio: str | os.PathLike[str] | BinaryIO | np.ndarray | None = None,
                        features: np.ndarray | None = None, vad_filter: bool = False,
                        vad_parameters: dict[str, Any] | VadOptions | None = None,
                        language_detection_segments: int = 1,
                        language_detection_threshold: float | None = 0.5) -> tuple[str, float, list[tuple[str, float]]]:
        """faster-whisper's ``WhisperModel.detect_language``: the language of ``audio`` (float32
        samples at 16 kHz, NumPy shape (n,), or a path or file object), or of its log-mel
        ``features`` (float32, NumPy shape (n_mels, frames), as faster-whisper's feature
        extractor makes them; used when no audio is given). The first
        ``language_detection_segments`` 30-s windows (the audio after Silero VAD with
        ``vad_filter``), cut as faster-whisper cuts them (the features padded with zeros to 30
        s), are encoded in turn: the first whose likeliest language has a probability above
        ``language_detection_threshold`` decides, else the language most windows find likeliest,
        at its best probability (threshold None: always so). Returns (language code, its
        probability, every language's probability in the last window, most likely first).
        Raises ValueError for an English-only model, for neither audio nor features (or
        features of no frames), bad shapes and values; FileNotFoundError and
        :class:`~.audio.AudioError` for audio it cannot read."""
        if not self.is_multilingual:
            raise ValueError("an English-only model detects no language")
        _check_detection(language_detection_segments, language_detection_threshold)
        n = language_detection_segments
        if audio is not None:
            samples = self._samples(audio)
            if vad_filter:
                samples, _tmap = speech_only(shared_vad(), samples, _vad_options(vad_parameters))
            # faster-whisper's feature extractor: 160 samples of padding (a frame per 160 samples)
            features = log_mel(samples[:n * CHUNK], self.file.mel_filters, pad=HOP)
        elif features is None:
            raise ValueError("give audio or features")
        features = np.asarray(features, dtype=np.float32)
        n_mels = self.file.mel_filters.shape[0]
        if features.ndim != 2 or features.shape[0] != n_mels:
            raise ValueError(f"features must have NumPy shape ({n_mels}, frames), not {features.shape}")
        features = features[:, :n * FRAMES]
        if features.shape[1] == 0:
            raise ValueError("no audio to detect a language in")

        def encode(i: int) -> bool:
            window = features[:, i * FRAMES:(i + 1) * FRAMES]
            if window.shape[1] == 0:
                return False
            self.net.encode(np.ascontiguousarray(np.pad(window, ((0, 0), (0, FRAMES - window.shape[1])))))
            return True
        language, probability, probs, _held = vote_language(self.net, self.tok, encode, n,
                                                            language_detection_threshold)
        assert probs is not None   # a window was encoded
        return language, probability, probs

    @staticmethod
    def _samples(audio: str | os.PathLike[str] | BinaryIO | np.ndarray) -> np.ndarray:
        if isinstance(audio, np.ndarray):
            samples = np.asarray(audio, dtype=np.float32)
            if samples.ndim != 1:
                raise ValueError("audio samples must be one channel (a 1-D array)")
            return samples
        return load_audio(audio)


class BatchedInferencePipeline:
    """faster-whisper's ``BatchedInferencePipeline`` on ggml: ``BatchedInferencePipeline(model)
    .transcribe(audio, batch_size=8, ...)``. The audio is cut where Silero VAD finds speech
    (``vad_filter``, the default) or at ``clip_timestamps`` (``[{"start": s, "end": s}, ...]``
    in seconds), the pieces joined into chunks of at most ``chunk_length`` (30) seconds, and
    ``batch_size`` chunks decoded together: each step of all their beam searches is one decoder
    graph (:func:`~.decode.decode_windows`). As faster-whisper's pipeline does, each chunk is
    decoded on its own (no previous text), at the first temperature only, without timestamps
    by default (one segment per chunk); like faster-whisper's pipeline it takes and does not use
    ``best_of``, the fallback thresholds, ``condition_on_previous_text``,
    ``prompt_reset_on_temperature``, ``max_initial_timestamp`` (0 there) and
    ``hallucination_silence_threshold``. A multilingual model's language is detected on the
    first ``language_detection_segments`` chunks (:meth:`WhisperModel.detect_language`'s rule;
    faster-whisper's pipeline cuts 30-s windows from the chunks' features laid end to end).
    ``multilingual=True`` decodes each chunk in the language found likeliest in it. Raises
    ValueError for values it does not implement: a first temperature above 0, ``prefix``,
    ``chunk_length`` above 30."""

    def __init__(self, model: WhisperModel):
        self.model = model

    def transcribe(  # noqa: PLR0913 - faster-whisper's parameters, one for one
            self, audio: str | os.PathLike[str] | BinaryIO | np.ndarray, language: str | None = None,
            task: str = "transcribe", log_progress: bool = False, beam_size: int = 5, best_of: int = 5,
            patience: float = 1, length_penalty: float = 1, repetition_penalty: float = 1,
            no_repeat_ngram_size: int = 0, temperature: float | list[float] | tuple[float, ...] = TEMPERATURES,
            compression_ratio_threshold: float | None = 2.4, log_prob_threshold: float | None = -1.0,
            no_speech_threshold: float | None = 0.6, condition_on_previous_text: bool = True,
            prompt_reset_on_temperature: float = 0.5, initial_prompt: str | Iterable[int] | None = None,
            prefix: str | None = None, suppress_blank: bool = True, suppress_tokens: list[int] | None = [-1],  # noqa: B006
            without_timestamps: bool = True, max_initial_timestamp: float = 1.0, word_timestamps: bool = False,
            prepend_punctuations: str = PREPEND_PUNCTUATIONS, append_punctuations: str = APPEND_PUNCTUATIONS,
            multilingual: bool = False, vad_filter: bool = True,
            vad_parameters: dict[str, Any] | VadOptions | None = None, max_new_tokens: int | None = None,
            chunk_length: int | None = None, clip_timestamps: list[dict[str, float]] | None = None,
            hallucination_silence_threshold: float | None = None, batch_size: int = 8,
            hotwords: str | None = None, language_detection_threshold: float | None = 0.5,
            language_detection_segments: int = 1) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Transcribe ``audio`` as faster-whisper's ``BatchedInferencePipeline.transcribe``
        does, with its parameters and defaults: (a generator of :class:`~.transcribe.Segment`,
        decoded a batch at a time as it is iterated; :class:`TranscriptionInfo`). Times are the
        original audio's. Raises ValueError (see the class), RuntimeError for audio longer than
        ``chunk_length`` with neither VAD nor clips (as faster-whisper), FileNotFoundError and
        :class:`~.audio.AudioError` for audio it cannot read."""
        m = self.model
        temps = [float(temperature)] if isinstance(temperature, (int, float)) else [float(t) for t in temperature]
        chunk_length = chunk_length or 30
        unsupported = {"a first temperature above 0": bool(temps) and temps[0] != 0,
                       "prefix": prefix is not None, "chunk_length above 30": chunk_length > 30}
        refused = [k for k, v in unsupported.items() if v]
        if refused:
            raise ValueError(f"not implemented in pyggml's BatchedInferencePipeline: {', '.join(refused)}")
        _check_detection(language_detection_segments, language_detection_threshold)
        if not temps or batch_size < 1 or chunk_length < 1:
            raise ValueError("give a temperature, batch_size >= 1 and chunk_length >= 1")
        if language is not None and language not in m.supported_languages:
            raise ValueError(f"language {language!r} is not one of the model's: {m.supported_languages}")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if isinstance(vad_parameters, dict):
            try:
                vad = VadOptions(**{**vad_parameters, "max_speech_duration_s": chunk_length})
            except TypeError as e:
                raise ValueError(f"vad_parameters: {e}") from None
        elif vad_parameters is None:
            vad = VadOptions(max_speech_duration_s=chunk_length, min_silence_duration_ms=160)
        elif isinstance(vad_parameters, VadOptions):
            vad = vad_parameters
        else:
            raise ValueError("vad_parameters must be a dict or VadOptions")
        DecodeOptions(beam_size=beam_size, best_of=best_of, task=task, patience=patience,   # checks them
                      repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        samples = m._samples(audio)
        duration = samples.size / SAMPLE_RATE
        restore = False
        if clip_timestamps:
            try:
                chunks = [{"start": int(c["start"] * SAMPLE_RATE), "end": int(c["end"] * SAMPLE_RATE)}
                          for c in clip_timestamps]
            except (TypeError, KeyError) as e:
                raise ValueError(f"clip_timestamps: a list of {{'start': s, 'end': s}} ({e!r})") from None
            groups = [(samples[c["start"]:c["end"]], c["start"] / SAMPLE_RATE, (c["end"] - c["start"]) / SAMPLE_RATE)
                      for c in chunks]
        else:
            if vad_filter:
                chunks = speech_timestamps(shared_vad().probs(samples), samples.size, vad)
                restore = True
            elif duration < chunk_length:
                chunks = [{"start": 0, "end": samples.size}]
            else:
                raise RuntimeError("No clip timestamps found. Set 'vad_filter' to True or provide 'clip_timestamps'.")
            groups = group_chunks(samples, chunks, chunk_length)
        after_vad = sum(c["end"] - c["start"] for c in chunks) / SAMPLE_RATE
        groups = [g for g in groups if g[0].size] if after_vad else []
        tok = m.tok
        probability = 1.0
        probs: list[tuple[str, float]] | None = None
        if language is None:
            language = "en"
            if m.is_multilingual and groups:
                def encode(i: int) -> bool:
                    if i >= len(groups):
                        return False
                    m.net.encode(chunk_features(groups[i][0], m.file.mel_filters))
                    return True
                language, probability, probs, _held = vote_language(
                    m.net, tok, encode, language_detection_segments, language_detection_threshold)
        previous: tuple[int, ...] = ()
        if initial_prompt is not None:
            previous = tuple(tok.encode(" " + initial_prompt.strip()) if isinstance(initial_prompt, str)
                             else [int(t) for t in initial_prompt])
        opts = TranscriptionOptions(
            beam_size=beam_size, best_of=best_of, patience=patience, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            log_prob_threshold=log_prob_threshold, no_speech_threshold=no_speech_threshold,
            compression_ratio_threshold=compression_ratio_threshold, condition_on_previous_text=False,
            prompt_reset_on_temperature=0.5, temperatures=temps[:1], initial_prompt=initial_prompt,
            prefix=None, suppress_blank=suppress_blank,
            suppress_tokens=list(suppress_tokens) if suppress_tokens is not None else None,
            without_timestamps=without_timestamps, max_initial_timestamp=0.0, word_timestamps=word_timestamps,
            prepend_punctuations=prepend_punctuations, append_punctuations=append_punctuations,
            multilingual=multilingual and m.is_multilingual, max_new_tokens=max_new_tokens, clip_timestamps="0",
            hallucination_silence_threshold=None, hotwords=hotwords)
        decode = DecodeOptions(
            beam_size=beam_size, timestamps=not without_timestamps, language=language, task=task,
            max_initial_timestamp=0.0, sample_len=max_new_tokens, suppress_blank=suppress_blank,
            suppress_tokens=_suppress(tok, suppress_tokens), previous=previous,
            hotwords=tuple(tok.encode(" " + hotwords.strip())) if hotwords else (), patience=patience,
            length_penalty=length_penalty, repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size)
        info = TranscriptionInfo(language, probability, duration, after_vad, probs, opts, vad)
        segments: Iterator[Segment] = batched_segments(m.net, m.tok, m.file.mel_filters, groups, decode, opts,
                                                       batch_size)
        if restore and chunks:
            segments = restore_times(segments, TimeMap(chunks))
        if log_progress:
            segments = progress(segments, after_vad)
        return segments, info
