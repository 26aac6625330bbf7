#!/usr/bin/env python3
"""Training MNIST from Python (examples/train.py, pyggml.opt) against ggml's own C example and
against PyTorch CPU, side by side, same model, epochs and threads.

    scripts/build_mnist_example.sh                       # once: build/mnist/mnist-train, IDX files
    python benchmarks/bench_train.py --model mlp         # 30 epochs: C, Python (alternating, --repeat)
    python benchmarks/bench_train.py --model cnn --repeat 1
    python benchmarks/bench_train.py --model mlp --torch-python /work/venv-train/bin/python --torch-epochs 3
    python benchmarks/bench_train.py --model cnn --c-epochs 2   # only the first 2 epochs of each
    python benchmarks/bench_train.py --model mlp --skip-c --skip-python --backend BLAS \
        --pyggml-python build/venv-blas/bin/python --torch-python /work/venv-train/bin/python
        # pyggml's BLAS variant (scripts/check_variants.sh blas) training on [BLAS, CPU]

1. **C**: ``build/mnist/mnist-train mnist-fc|mnist-cnn`` (upstream's program, unmodified, linked
   against pyggml's own ggml libraries): 30 epochs (fixed in the program), AdamW defaults,
   batches of 500/1000, 5 % validation; then ``mnist-eval`` on the 10,000 test images.
2. **Python**: ``examples/train.py --dataset mnist`` with the same model, recipe (``--init ggml
   --schedule constant --lr 1e-3``, CNN ``--im2col f16``), epochs and thread count (both use
   ggml's rule ``min(cores, (cores + 4) / 2)`` unless ``--threads``; the C program cannot be
   told another). C and Python runs alternate, ``--repeat`` times each. ``--c-epochs K``
   compares the mean time of the first K epochs instead (the C program is stopped after K).
3. **PyTorch CPU** (``tests/data/train_torch.py`` run by ``--torch-python``, default this Python if
   it has torch): the same model trained ``--torch-epochs`` epochs at the same thread count,
   against ``examples/train.py`` for as many epochs, both on the example's own recipe (for the
   CNN: F32 im2col, optimizer steps of 50 images), not the C example's.

Printed: each run's wall time (the whole process: start, data, training, saving) and training
time (C: ggml_opt_fit's "training took", whole seconds; Python: fit()'s), test accuracy; then the
medians, the ratio Python / C of training time (goal <= 1.05), and the training time per epoch
of pyggml and PyTorch (ratio torch / pyggml: > 1 means pyggml is faster). Nothing is asserted.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MNIST = ROOT / "build" / "mnist"


def ggml_threads() -> int:
    n = os.cpu_count() or 1
    return max(1, min(n, (n + 4) // 2))


def run(cmd: list[str], cwd: Path = ROOT, env: dict | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return wall, p.stdout + p.stderr


def run_c(model: str, tmp: Path) -> dict:
    arch = {"mlp": "mnist-fc", "cnn": "mnist-cnn"}[model]
    out = tmp / f"{arch}-c.gguf"
    wall, log = run([str(MNIST / "mnist-train"), arch, str(out), str(MNIST / "data" / "train-images-idx3-ubyte"),
                     str(MNIST / "data" / "train-labels-idx1-ubyte")], cwd=MNIST)
    h, m, s = map(int, re.search(r"training took (\d+):(\d+):(\d+)", log).groups())
    _, ev = run([str(MNIST / "mnist-eval"), str(out), str(MNIST / "data" / "t10k-images-idx3-ubyte"),
                 str(MNIST / "data" / "t10k-labels-idx1-ubyte")], cwd=MNIST)
    acc = float(re.search(r"test_acc=([\d.]+)", ev).group(1)) / 100
    return {"wall": wall, "train": 3600 * h + 60 * m + s, "acc": acc, "epoch": None}


def run_c_epochs(model: str, tmp: Path, k: int) -> dict:
    """Time the first ``k`` epochs of ``mnist-train`` from the epoch headers ggml_opt_fit
    writes to stderr ("ggml_opt_fit: epoch 0002/0030:"), then stop it: mean seconds per epoch."""
    arch = {"mlp": "mnist-fc", "cnn": "mnist-cnn"}[model]
    p = subprocess.Popen([str(MNIST / "mnist-train"), arch, str(tmp / "unused.gguf"),
                          str(MNIST / "data" / "train-images-idx3-ubyte"), str(MNIST / "data" / "train-labels-idx1-ubyte")],
                         cwd=MNIST, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    starts: list[float] = []
    buf = b""
    try:
        while len(starts) < k + 1:
            chunk = p.stderr.read1(4096) if p.stderr else b""
            if not chunk:
                raise RuntimeError("mnist-train ended before the epochs were timed")
            buf += chunk
            n = len(re.findall(rb"ggml_opt_fit: epoch \d+/\d+:", buf))
            starts += [time.perf_counter()] * (n - len(starts))
    finally:
        p.kill()
        p.wait()
    return {"epoch": (starts[k] - starts[0]) / k}


def run_py(model: str, epochs: int, threads: int, extra: list[str] | None = None,
           python: str | None = None) -> dict:
    """examples/train.py run by ``python`` with the pyggml installed there, or (None) by this
    Python with this checkout's in-place build."""
    env = None if python else dict(os.environ, PYTHONPATH=str(ROOT))
    wall, log = run([python or sys.executable, str(ROOT / "examples" / "train.py"), "--dataset", "mnist", "--model", model,
                     "--epochs", str(epochs), "--threads", str(threads)] + (extra or []), env=env)
    train = float(re.search(r"training took ([\d.]+) s", log).group(1))
    epoch_times = [float(t) for t in re.findall(r"^epoch +\d+/\d+: .*\(([\d.]+) s\)$", log, re.M)]
    acc = float(re.search(r"^test accuracy: ([\d.]+)$", log, re.M).group(1))
    return {"wall": wall, "train": train, "acc": acc, "epoch": statistics.median(epoch_times)}


def run_torch(python: str, model: str, epochs: int, threads: int) -> dict:
    wall, log = run([python, str(ROOT / "tests" / "data" / "train_torch.py"), "--dataset", "mnist", "--model", model,
                     "--epochs", str(epochs), "--threads", str(threads)])
    return {"wall": wall, "epoch": float(re.search(r"time per epoch: ([\d.]+) s", log).group(1)),
            "acc": float(re.search(r"^test accuracy: ([\d.]+)$", log, re.M).group(1)), "train": None}


def torch_python(arg: str | None) -> str | None:
    if arg:
        return arg
    return sys.executable if importlib.util.find_spec("torch") else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=30, help="Python epochs (the C example always runs 30)")
    p.add_argument("--repeat", type=int, default=1, help="C and Python runs, alternating")
    p.add_argument("--threads", type=int, default=None, help="default: ggml's rule, as the C example")
    p.add_argument("--torch-python", default=None, help="a Python with torch (default: this one, if it has torch)")
    p.add_argument("--torch-epochs", type=int, default=3)
    p.add_argument("--c-epochs", type=int, default=0,
                   help="time only the first K epochs of both (the C program is stopped after K): "
                        "mean seconds per epoch, for models too slow for 30")
    p.add_argument("--skip-c", action="store_true")
    p.add_argument("--skip-python", action="store_true", help="no Python run of the C recipe (the PyTorch row still runs)")
    p.add_argument("--backend", default=None, help="examples/train.py's --backend (e.g. BLAS, CUDA0); default CPU")
    p.add_argument("--pyggml-python", default=None,
                   help="a Python with pyggml installed (e.g. build/venv-blas/bin/python); default: this "
                        "Python with this checkout's in-place build")
    a = p.parse_args(argv)
    backend = ["--backend", a.backend] if a.backend else []
    threads = a.threads or ggml_threads()
    have_c = (MNIST / "mnist-train").is_file() and not a.skip_c
    if not have_c and not a.skip_c:
        print("no build/mnist/mnist-train: run scripts/build_mnist_example.sh for the C side")
    if have_c and (a.epochs != 30 or threads != ggml_threads()):
        print("note: the C example runs 30 epochs with ggml's thread rule; the runs are not the same work")
    print(f"MNIST {a.model}: {a.epochs} epochs, {threads} threads, {os.cpu_count()} cores; "
          f"C and Python alternate {a.repeat}x; pyggml: {a.pyggml_python or 'in place'}, "
          f"backend {a.backend or 'CPU'}")
    rows: dict[str, list[dict]] = {"C (mnist-train)": [], "Python (pyggml.opt)": []}
    tmp = Path(tempfile.mkdtemp())
    # the C example's recipe, whatever examples/train.py's defaults are
    same_as_c = (["--init", "ggml", "--schedule", "constant", "--lr", "1e-3", "--batch-size", "500",
                  "--nbatch-logical", "1000"] + (["--im2col", "f16"] if a.model == "cnn" else []) + backend)
    if a.c_epochs:
        try:
            for _ in range(a.repeat):
                c = run_c_epochs(a.model, tmp, a.c_epochs) if have_c else None
                py = run_py(a.model, a.c_epochs, threads, same_as_c, a.pyggml_python)
                py_mean = py["train"] / a.c_epochs
                c_txt = f"C {c['epoch']:.2f} s/epoch, " if c else ""
                print(f"  first {a.c_epochs} epochs: {c_txt}Python {py_mean:.2f} s/epoch"
                      + (f" (Python / C {py_mean / c['epoch']:.3f}x)" if c else ""), flush=True)
        finally:
            shutil.rmtree(tmp)
        return 0
    try:
        for _ in range(a.repeat):
            if have_c:
                r = run_c(a.model, tmp)
                rows["C (mnist-train)"].append(r)
                print(f"  C       wall {r['wall']:7.1f} s  training {r['train']:5d} s  test accuracy {r['acc']:.4f}", flush=True)
            if not a.skip_python:
                r = run_py(a.model, a.epochs, threads, same_as_c, a.pyggml_python)
                rows["Python (pyggml.opt)"].append(r)
                print(f"  Python  wall {r['wall']:7.1f} s  training {r['train']:7.1f} s  test accuracy {r['acc']:.4f}"
                      f"  ({r['epoch']:.3f} s/epoch)", flush=True)
    finally:
        shutil.rmtree(tmp)
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("wall", "train", "acc")} for k, v in rows.items() if v}
    for k, m in med.items():
        print(f"{k:22s} median wall {m['wall']:7.1f} s, training {m['train']:7.1f} s, test accuracy {m['acc']:.4f}")
    if len(med) == 2:
        c, py = med["C (mnist-train)"], med["Python (pyggml.opt)"]
        print(f"Python / C: training time {py['train'] / c['train']:.3f}x, wall time {py['wall'] / c['wall']:.3f}x"
              " (goal <= 1.05)")
    tp = torch_python(a.torch_python)
    if tp:
        # both on examples/train.py's own recipe (tests/data/train_torch.py mirrors it), not the C one
        ours = run_py(a.model, a.torch_epochs, threads, backend, a.pyggml_python)["epoch"]
        t = run_torch(tp, a.model, a.torch_epochs, threads)
        print(f"per epoch at {threads} threads, examples/train.py's recipe: pyggml ({a.backend or 'CPU'}) "
              f"{ours:.3f} s, PyTorch CPU "
              f"{t['epoch']:.3f} s (medians of {a.torch_epochs}); torch / pyggml = {t['epoch'] / ours:.2f}x "
              "(goal >= 1.0)")
    else:
        print("no PyTorch: pass --torch-python (e.g. a venv with torch==2.13.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
