"""A llama-architecture LLM from its GGUF file, on ggml through pyggml.

Modules, one concept each:

* :mod:`.hparams`   -- the ``llama.*`` hyperparameters and the tensor list, checked
* :mod:`.tokenizer` -- the GPT-2 BPE tokenizer and the chat template from ``tokenizer.*``
* :mod:`.model`     -- weights, KV cache and the llama graphs (built once per shape, reused)
* :mod:`.sampling`  -- greedy / temperature / top-k / top-p / repetition penalty
* :mod:`.generate`  -- :class:`Llama`: tokenize, process the prompt, decode, stream
* :mod:`.quantize`  -- :func:`requantize`: a GGUF file's matrices in another type

``examples/llama.py`` is the command line on top of :class:`Llama`.
"""
from __future__ import annotations

from .generate import Llama
from .hparams import HParams, ModelError
from .model import LlamaModel
from .quantize import requantize
from .sampling import Sampler
from .tokenizer import ChatTemplate, GGUFTokenizer

__all__ = ["Llama", "LlamaModel", "HParams", "ModelError", "Sampler", "GGUFTokenizer", "ChatTemplate", "requantize"]
