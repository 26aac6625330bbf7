"""Step 1, the upstream source: fetch a pinned archive from the package index, check its hash,
unpack its ``ggml`` folder (and the few extra files pyggml compiles) into
``vendor/ggml-<version>/``, one folder per pinned version.

Nothing here is committed: ``vendor/`` is ignored by git; a folder is refilled when its row of
the pins table changes (a stamp file records what filled it).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from .common import BuildError, log
from .pins import HEADERS, PINS, Archive, Pin

__all__ = ["ROOT", "VENDOR_DIR", "STAMP_NAME", "cache_dir", "fetch_pinned", "source_version",
           "check_source", "unpack", "resolve_source", "vendor_tree"]

ROOT = Path(__file__).resolve().parent.parent
VENDOR_DIR = ROOT / "vendor"
STAMP_NAME = ".pyggml-source"


def cache_dir() -> Path:
    """Where downloads are kept: ``$PYGGML_CACHE_DIR``, default ``~/.cache/pyggml``."""
    return Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml"))


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def fetch_pinned(project: str, filename: str, sha256: str, cache: Path | None = None) -> Path:
    """The path of ``filename`` from ``project`` on the package index (``$PIP_INDEX_URL``, default
    PyPI), downloaded into ``cache`` (default :func:`cache_dir`) if needed through the index's
    JSON simple API. The file is checked against ``sha256`` whether it came from the cache or the
    network; a mismatch deletes it and raises BuildError."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / filename
    if not path.exists():
        url = f"{_index_url()}/{project}/"
        log(f"looking up {filename} at {url}")
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        entry = next((f for f in files if f["filename"] == filename), None)
        if entry is None:
            raise BuildError(f"{filename} is not listed at {url}")
        log(f"downloading {entry['url']}")
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(entry["url"], timeout=600) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
        tmp.replace(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    if digest != sha256:
        path.unlink()
        raise BuildError(f"sha256 mismatch for {filename}: expected {sha256}, got {digest}. "
                         "The file was deleted; refusing to build from unverified files.")
    log(f"{filename}: sha256 OK")
    return path


def _fetch(archive: Archive, cache: Path | None) -> Path:
    return fetch_pinned(archive.project, archive.filename, archive.sha256, cache)


def source_version(src: Path) -> str:
    """The ggml version declared in ``src/CMakeLists.txt`` (``GGML_VERSION_MAJOR`` etc.)."""
    text = (src / "CMakeLists.txt").read_text()
    parts = [re.search(rf"set\(GGML_VERSION_{p}\s+(\d+)\)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise BuildError(f"{src}/CMakeLists.txt does not declare GGML_VERSION_MAJOR/MINOR/PATCH")
    return ".".join(m.group(1) for m in parts)  # type: ignore[union-attr]


def check_source(src: Path, pin: Pin | None = None) -> tuple[Path, Pin]:
    """``src`` resolved and the :class:`Pin` of its version. Raises BuildError if ``src`` is not
    a ggml tree, if its version has no row in :data:`~pyggml_build.pins.PINS` (the backend
    vtables of ``src/ggml-backend-impl.h`` are ABI and differ between versions), or if ``pin``
    is given and names another version."""
    src = src.resolve()
    missing = [h for h in HEADERS + ["CMakeLists.txt"] if not (src / h).is_file()]
    if missing:
        raise BuildError(f"{src} is not a ggml source tree: missing {', '.join(missing)}")
    version = source_version(src)
    if version not in PINS:
        raise BuildError(f"{src} holds ggml {version}, which pyggml does not pin (pinned: "
                         f"{', '.join(sorted(PINS))}): the backend vtables (src/ggml-backend-impl.h) "
                         "are ABI and differ between versions; add a row to pyggml_build/pins.py")
    if pin is not None and pin.version != version:
        raise BuildError(f"{src} holds ggml {version}, but ggml {pin.version} was asked for "
                         "(PYGGML_GGML_VERSION)")
    return src, PINS[version]


def _members(tar: tarfile.TarFile, prefix: str) -> tuple[str, list[tarfile.TarInfo]]:
    """(archive's top folder, members under ``<top>/<prefix>``)."""
    names = tar.getmembers()
    top = names[0].name.split("/")[0]
    want = f"{top}/{prefix}"
    return top, [m for m in names if m.name == want or m.name.startswith(want + "/")]


def unpack(pin: Pin, dest: Path, cache: Path | None = None) -> None:
    """Fill ``dest`` with ``pin``'s ggml folder and its extras (only those: the llama.cpp archive
    is 77 MB, its ggml folder 25 MB), then write the stamp."""
    log(f"unpacking ggml {pin.version} from {pin.archive.filename} into {dest}")
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(_fetch(pin.archive, cache)) as tar:
        top, members = _members(tar, pin.folder)
        if not members:
            raise BuildError(f"{pin.archive.filename} has no folder {pin.folder}")
        tar.extractall(tmp, members=members, filter="data")
        shutil.move(os.path.join(tmp, top, pin.folder), dest)
    by_archive: dict[Archive, list[tuple[str, str]]] = {}
    for target, (archive, inner) in pin.extras.items():
        by_archive.setdefault(archive, []).append((target, inner))
    for archive, files in by_archive.items():
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(_fetch(archive, cache)) as tar:
            for target, inner in files:
                top, found = _members(tar, inner)
                found = [m for m in found if m.isfile()][-1:]  # an archive may list a file twice
                if not found:
                    raise BuildError(f"{archive.filename} has no file {inner}")
                tar.extractall(tmp, members=found, filter="data")
                (dest / target).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(os.path.join(tmp, top, inner), dest / target)
    (dest / STAMP_NAME).write_text(_stamp(pin))


def _stamp(pin: Pin) -> str:
    """What fills the tree: the version and a digest of the archive, folder and extras (not of
    what the bindings leave out, which changes no file of the tree)."""
    filled = (pin.version, pin.archive, pin.folder, sorted(pin.extras.items()))
    return f"{pin.version} {hashlib.sha256(repr(filled).encode()).hexdigest()}\n"


def vendor_tree(version: str) -> Path:
    """Where the build unpacks ggml ``version``: ``vendor/ggml-<version>/``."""
    return VENDOR_DIR / f"ggml-{version}"


def resolve_source(pin: Pin, ggml_src: str | None = None, cache: Path | None = None) -> tuple[Path, Pin]:
    """The ggml tree to build and its pin: ``ggml_src`` (or ``$PYGGML_GGML_SRC``), a tree whose
    version is pinned; otherwise :func:`vendor_tree`, (re)filled from ``pin``'s archive unless
    its stamp says it already holds it."""
    ggml_src = ggml_src or os.environ.get("PYGGML_GGML_SRC")
    if ggml_src:
        log(f"using ggml source from {ggml_src}")
        explicit = pin if os.environ.get("PYGGML_GGML_VERSION") else None
        return check_source(Path(ggml_src), explicit)
    tree = vendor_tree(pin.version)
    stamp = tree / STAMP_NAME
    if not (stamp.is_file() and stamp.read_text() == _stamp(pin)):
        unpack(pin, tree, cache)
    else:
        log(f"using {tree} (ggml {pin.version} from {pin.archive.filename})")
    return check_source(tree, pin)
