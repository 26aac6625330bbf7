#!/usr/bin/env python3
"""PyTorch cross-check of ``examples/train.py`` (not run by CI; needs torch and numpy only).

The same data and split (``examples/train_data.py``), architecture, initialisation (``--init``:
ggml's, every weight and bias N(0, 0.01), or Keras' Glorot-uniform weights and zero biases; the
same distribution, not the same draws), optimizer (ggml's AdamW with weight decay 0 is Adam: the same lr,
betas (0.9, 0.999), eps 1e-8, bias-corrected), loss (mean cross-entropy over a logical batch),
logical batch, epochs and validation hold-out as ``examples/train.py``. The CNN flattens its
last feature map channels-fastest, as ggml's ``ggml_permute(x, 1, 2, 0, 3)`` does, so a
state dict of this model holds the very tensors of the ggml model (same names, NumPy order).

    python -m venv /work/venv-train && /work/venv-train/bin/pip install torch==2.13.0 numpy
    /work/venv-train/bin/python tests/data/train_torch.py --dataset mnist --model mlp --threads 2
    /work/venv-train/bin/python tests/data/train_torch.py --dataset digits --model cnn --save-npz w.npz

Prints one line per epoch with the training time, then ``time per epoch: X s`` and
``test accuracy: 0.xxxx``. ``--save-npz`` writes the trained weights under the ggml names
(``fc1.weight``...), for ``pyggml.opt.Model.load_state_dict``.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import train_data  # noqa: E402

#: as examples/train.py DEFAULTS: nbatch_logical (the optimizer's batch), val_split, test images,
#: and per model the learning rate, (CNN) channels and pools, and init, schedule and batch
#: (``nbatch``) where not the defaults
DEFAULTS = {
    "digits": (32, 0.05, 357, {"mlp": dict(lr=1e-3), "cnn": dict(lr=2e-3, c1=32, c2=32, pools=1)}),
    "mnist": (1000, 0.05, None, {"mlp": dict(lr=1e-3),
                                 "cnn": dict(lr=1e-3, init="glorot", schedule="cosine", nbatch=50)}),
    "mnist5k": (100, 0.05, 1000, {"mlp": dict(lr=1e-3), "cnn": dict(lr=1e-3)}),
}


class FC(nn.Module):
    def __init__(self, n_in: int, n_hidden: int = 500):
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_hidden)
        self.fc2 = nn.Linear(n_hidden, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    def ggml_names(self) -> dict[str, torch.Tensor]:
        return {"fc1.weight": self.fc1.weight, "fc1.bias": self.fc1.bias,
                "fc2.weight": self.fc2.weight, "fc2.bias": self.fc2.bias}


class CNN(nn.Module):
    def __init__(self, hw: int, c1: int = 8, c2: int = 16, pools: int = 2):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.dense = nn.Linear((hw // 2 ** pools) ** 2 * c2, 10)
        self.hw, self.pools = hw, pools

    def forward(self, x):
        x = x.view(-1, 1, self.hw, self.hw)
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.relu(self.conv2(x))
        if self.pools == 2:
            x = nn.functional.max_pool2d(x, 2)
        return self.dense(x.permute(0, 2, 3, 1).flatten(1))  # channels fastest, as ggml

    def ggml_names(self) -> dict[str, torch.Tensor]:
        c1, c2 = self.conv1.out_channels, self.conv2.out_channels
        return {"conv1.kernel": self.conv1.weight, "conv1.bias": self.conv1.bias.view(c1, 1, 1),
                "conv2.kernel": self.conv2.weight, "conv2.bias": self.conv2.bias.view(c2, 1, 1),
                "dense.weight": self.dense.weight, "dense.bias": self.dense.bias}


def load(name: str, split_seed: int):
    if name == "mnist":
        return train_data.load_mnist()
    x, y = train_data.load_digits() if name == "digits" else train_data.load_mnist5k()
    tr, te = train_data.split(len(x), DEFAULTS[name][2], split_seed)
    return (x[tr], y[tr]), (x[te], y[te])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=sorted(DEFAULTS), default="digits")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda...")
    p.add_argument("--lr", type=float, default=None, help="default: as examples/train.py")
    p.add_argument("--save-npz", type=Path, default=None)
    p.add_argument("--init", choices=["ggml", "glorot"], default=None, help="default: as examples/train.py")
    p.add_argument("--schedule", choices=["constant", "cosine"], default=None,
                   help="learning rate per epoch, as examples/train.py (default: as it)")
    p.add_argument("--nbatch", type=int, default=None,
                   help="images per optimizer step (examples/train.py's --nbatch-logical; default: as it)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    nbatch, val_split, _, models = DEFAULTS[a.dataset]
    cfg = dict(models[a.model])
    # the training recipe leaves cfg (what remains is the model's shape); the command line wins
    rec = dict(init="ggml", schedule="constant", nbatch=nbatch)
    rec.update({k: cfg.pop(k) for k in ("lr", "init", "schedule", "nbatch") if k in cfg})
    rec.update({k: getattr(a, k) for k in ("lr", "init", "schedule", "nbatch") if getattr(a, k) is not None})
    lr, init, schedule, nbatch = rec["lr"], rec["init"], rec["schedule"], rec["nbatch"]

    (x_train, y_train), (x_test, y_test) = load(a.dataset, a.split_seed)
    hw = x_train.shape[1]
    rng = np.random.default_rng(a.seed)
    order = rng.permutation(len(x_train))  # one shuffle of everything, then a fixed hold-out
    n_logical = len(x_train) // nbatch
    n_train = int(np.float32(1 - np.float32(val_split)) * np.float32(n_logical)) * nbatch  # as ggml_opt_fit
    dev = torch.device(a.device)
    xt, yt = (torch.from_numpy(x_train[order[:n_train]]).to(dev), torch.from_numpy(y_train[order[:n_train]]).to(dev))
    xv, yv = torch.from_numpy(x_train[order[n_train:]]).to(dev), torch.from_numpy(y_train[order[n_train:]]).to(dev)

    model = (FC(hw * hw) if a.model == "mlp" else CNN(hw, **cfg)).to(dev)
    with torch.no_grad():
        for t in model.parameters():
            if init == "ggml":
                t.normal_(0.0, 1e-2)  # ggml's MNIST initialisation
            elif t.dim() >= 2:
                nn.init.xavier_uniform_(t)  # Keras' Glorot-uniform (examples/train.py "glorot")
            else:
                t.zero_()
    optim = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = nn.CrossEntropyLoss()
    print(f"torch {torch.__version__} on {dev}, {torch.get_num_threads()} threads; {a.dataset} {a.model}: "
          f"{n_train} training, {len(xv)} validation, {len(x_test)} test images", flush=True)
    times = []
    for epoch in range(1, a.epochs + 1):
        if schedule == "cosine":  # examples/train.py's: lr at epoch 1 down to about lr / 100
            for group in optim.param_groups:
                group["lr"] = lr * (0.01 + 0.99 * (1 + math.cos(math.pi * (epoch - 1) / max(a.epochs, 1))) / 2)
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n_train, device=dev)
        losses, correct = [], 0
        for i in range(0, n_train, nbatch):
            idx = perm[i:i + nbatch]
            optim.zero_grad()
            out = model(xt[idx])
            loss = loss_fn(out, yt[idx])
            loss.backward()
            optim.step()
            losses.append(loss.item())
            correct += int((out.argmax(1) == yt[idx]).sum())
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        model.eval()
        with torch.no_grad():
            val = float((model(xv).argmax(1) == yv).float().mean()) if len(xv) else float("nan")
        print(f"epoch {epoch:3d}/{a.epochs}: train loss {np.mean(losses):.4f} acc {100 * correct / n_train:.2f}% "
              f"| val acc {100 * val:.2f}% ({times[-1]:.2f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(x_test).to(dev)).argmax(1).cpu() == torch.from_numpy(y_test)).float().mean())
    if a.save_npz is not None:
        np.savez(a.save_npz, **{k: v.detach().cpu().numpy() for k, v in model.ggml_names().items()})
        print(f"saved {a.save_npz}")
    print(f"time per epoch: {np.median(times):.3f} s (median of {len(times)})")
    print(f"test accuracy: {acc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
