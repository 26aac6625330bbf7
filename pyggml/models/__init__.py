"""Models on ggml, ready to import: each a package over :mod:`pyggml.runtime` (backends by
device name, graphs built once per shape, weights loaded into backend buffers).

* :mod:`pyggml.models.bert` -- sentence embeddings from BERT-family safetensors folders
  (all-MiniLM-L6-v2 by default): ``Embedder(path).encode(sentences) -> (n, dim) float32``
* :mod:`pyggml.models.llama` -- llama-architecture LLMs from GGUF files (SmolLM2-135M by
  default): ``Llama(path).generate(...)``, streaming, chat templates, splits over devices
* :mod:`pyggml.models.whisper` -- speech to text from whisper.cpp's model files (tiny.en by
  default), converters from CTranslate2 and Hugging Face: ``Whisper(path).transcribe(audio)``

Each has a command line: ``pyggml-embed``, ``pyggml-llama``, ``pyggml-whisper`` (or ``python -m
pyggml.models.bert`` ...). Their optional dependencies are extras: ``pip install
"pyggml[bert]"``, ``"pyggml[llama]"``, ``"pyggml[whisper]"``. Nothing is imported here: a
model's package imports what it needs when it is imported.
"""
