"""Sentence embeddings from BERT-family encoders on ggml (all-MiniLM-L6-v2 by default; BERT,
RoBERTa and XLM-RoBERTa folders as sentence-transformers and Hugging Face save them).

    from pyggml.models.bert import Embedder

    with Embedder() as model:                               # or Embedder("path/to/folder")
        emb = model.encode(["The cat sleeps.", "A dog barks."])   # (2, 384) float32, unit norm

Modules: :mod:`.model` (:class:`Embedder`, the config, the graph), :mod:`.__main__` (the
command line: ``pyggml-embed``, ``python -m pyggml.models.bert``). Needs ``safetensors`` and
``tokenizers``: ``pip install "pyggml[bert]"``.
"""
from __future__ import annotations

from ..common import ModelError
from .model import WTYPES, BertConfig, Embedder, default_model_dir, default_wtype

__all__ = ["Embedder", "BertConfig", "ModelError", "WTYPES", "default_model_dir", "default_wtype"]
