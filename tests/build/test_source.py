"""pyggml_build.source: hash-pinned downloads, the ggml tree of a pinned version, unpacking."""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from pyggml_build import BuildError, pins, source
from pyggml_build.pins import Archive, Pin


def test_wrong_hash_is_a_hard_error(tmp_path):
    archive = pins.PINS["0.25.3"].archive
    fake = tmp_path / archive.filename
    fake.write_bytes(b"not the pinned sdist")
    with pytest.raises(BuildError, match="sha256 mismatch"):
        source.fetch_pinned(archive.project, archive.filename, archive.sha256, tmp_path)
    assert not fake.exists(), "an unverified download must not stay in the cache"


def _tree(root: Path, version=(0, 25, 3)) -> Path:
    for h in pins.HEADERS:
        (root / h).parent.mkdir(parents=True, exist_ok=True)
        (root / h).write_text("")
    (root / "CMakeLists.txt").write_text(
        "".join(f"set(GGML_VERSION_{p} {v})\n" for p, v in zip(("MAJOR", "MINOR", "PATCH"), version)))
    return root


def test_a_users_source_must_be_a_pinned_version(tmp_path):
    src, pin = source.check_source(_tree(tmp_path / "ok"))
    assert src == (tmp_path / "ok").resolve() and pin.version == "0.25.3"
    assert source.check_source(_tree(tmp_path / "new", (0, 26, 0)))[1].version == "0.26.0"
    with pytest.raises(BuildError, match="does not pin"):
        source.check_source(_tree(tmp_path / "other", (0, 20, 2)))
    with pytest.raises(BuildError, match="but ggml 0.26.0 was asked for"):
        source.check_source(_tree(tmp_path / "ok2"), pins.PINS["0.26.0"])
    with pytest.raises(BuildError, match="not a ggml source tree"):
        source.check_source(tmp_path)


def _tar(path: Path, names: list[str]) -> Archive:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return Archive("proj", path.name, hashlib.sha256(buf.getvalue()).hexdigest())


def test_unpack_takes_only_the_ggml_folder_and_the_extras(tmp_path):
    main = _tar(tmp_path / "main-1.0.tar.gz", ["main-1.0/vendor/x/ggml/include/ggml.h", "main-1.0/setup.py",
                                               "main-1.0/vendor/x/ggml/src/a.c", "main-1.0/vendor/x/tests/t.cpp"])
    other = _tar(tmp_path / "other-2.0.tar.gz", ["other-2.0/ggml/examples/e.cpp", "other-2.0/ggml/src/b.c"])
    pin = Pin("9.9.9", main, "vendor/x/ggml",
              extras={"tests/t.cpp": (main, "vendor/x/tests/t.cpp"), "examples/e.cpp": (other, "ggml/examples/e.cpp")})
    source.unpack(pin, tmp_path / "out", cache=tmp_path)
    files = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == [source.STAMP_NAME, "examples/e.cpp", "include/ggml.h", "src/a.c", "tests/t.cpp"]
    assert (tmp_path / "out" / "examples/e.cpp").read_text() == "other-2.0/ggml/examples/e.cpp"
