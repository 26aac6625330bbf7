"""examples/train.py and examples/train_data.py: a model learns scikit-learn's digits (real
data, hash-pinned: read from an installed scikit-learn or the cache, else fetched once from the
package index; skipped when offline), the CLI contract, the hash-checked download."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import urllib.error

import numpy as np
import pytest

from conftest import ROOT, load_example
from pyggml import opt


@pytest.fixture(scope="module")
def digits():
    train_data = load_example("train_data")
    try:
        return train_data.load_digits()
    except (urllib.error.URLError, OSError) as e:  # a hash mismatch is a ValueError: not skipped
        pytest.skip(f"scikit-learn's digits could not be fetched from the package index: {e}")


def test_digits_mlp_learns_in_seconds(digits):
    """ggml's MNIST FC architecture (500 hidden) on scikit-learn's digits, a few epochs."""
    train = load_example("train")
    x, y = digits
    tr, te = load_example("train_data").split(len(x), 357, 0)
    model = train.make_model("mlp", 8, seed=0, n_threads=1)
    data = opt.Dataset(x[tr], opt.one_hot(y[tr], 10), seed=0)
    history = opt.fit(model, data, batch_size=32, epochs=8, val_split=0.05, progress=False)
    assert len(history) == 8 and history.stopped is None
    assert history[-1].train.loss < 0.5 * history[0].train.loss
    result = opt.evaluate(model, opt.Dataset(x[te], opt.one_hot(y[te], 10)))
    assert result.ndata == 357
    assert result.accuracy >= 0.90, result
    # ggml-opt's predictions (in dataset order: evaluate does not shuffle) and the scheduler
    # forward pass of Model.predict agree
    pred = result.pred()
    assert np.array_equal(pred, model.predict(x[te]).argmax(axis=1))
    assert result.accuracy == pytest.approx(np.mean(pred == y[te]))
    model.close()


def test_train_example_cli_contract(digits):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), "--dataset", "digits",
                          "--model", "mlp", "--epochs", "6", "--seed", "1", "--threads", "1", "--quiet"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("test accuracy: 0.") and len(last) == len("test accuracy: 0.xxxx")
    assert float(last.split(":")[1]) >= 0.9
    assert "reloaded for inference: test accuracy" in out.stdout


def test_fetch_checks_the_hash_of_a_cached_file(tmp_path, monkeypatch):
    """A cached file is checked like a downloaded one: a mismatch deletes it and raises
    ValueError (no network: the file is already in the cache)."""
    train_data = load_example("train_data")
    monkeypatch.setenv("PYGGML_CACHE_DIR", str(tmp_path))
    good = b"pinned bytes"
    (tmp_path / "f.whl").write_bytes(good)
    pinned = ("nothing", "f.whl", hashlib.sha256(good).hexdigest())
    assert train_data.fetch(pinned).read_bytes() == good
    (tmp_path / "f.whl").write_bytes(b"tampered")
    with pytest.raises(ValueError, match="sha256 mismatch"):
        train_data.fetch(pinned)
    assert not (tmp_path / "f.whl").exists()
