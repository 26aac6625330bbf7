"""build_ggml.py: source pinning and argument handling (no compiler run here)."""
from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("build_ggml", ROOT / "build_ggml.py")
build_ggml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_ggml)


def test_wrong_hash_is_a_hard_error(tmp_path, monkeypatch):
    fake = tmp_path / build_ggml.SDIST_FILENAME
    fake.write_bytes(b"not the pinned sdist")
    with pytest.raises(build_ggml.BuildError, match="sha256 mismatch"):
        build_ggml.download_sdist(tmp_path)
    assert not fake.exists(), "an unverified download must not stay in the cache"


def test_pinned_hash_is_the_one_from_the_issue():
    assert build_ggml.SDIST_SHA256 == "e47ff53506342959ffb3ce15380b82828fea10ec5f208f9ef6915895f1a7a176"


def _tree(root: Path, version=(0, 20, 2)) -> Path:
    for h in build_ggml.HEADERS:
        (root / h).parent.mkdir(parents=True, exist_ok=True)
        (root / h).write_text("")
    (root / "CMakeLists.txt").write_text(
        "".join(f"set(GGML_VERSION_{p} {v})\n" for p, v in zip(("MAJOR", "MINOR", "PATCH"), version)))
    return root


def test_user_source_must_be_the_pinned_version(tmp_path):
    assert build_ggml.check_source(_tree(tmp_path / "ok")) == (tmp_path / "ok").resolve()
    with pytest.raises(build_ggml.BuildError, match="pinned to ggml 0.20.2"):
        build_ggml.check_source(_tree(tmp_path / "new", (0, 21, 0)))
    with pytest.raises(build_ggml.BuildError, match="not a ggml source tree"):
        build_ggml.check_source(tmp_path)


def test_unpack_takes_only_the_ggml_folder(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("pkg-1.0/ggml/include/ggml.h", "pkg-1.0/setup.py", "pkg-1.0/ggml/src/a.c"):
            data = name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sdist = tmp_path / "pkg.tar.gz"
    sdist.write_bytes(buf.getvalue())
    build_ggml.unpack_ggml(sdist, tmp_path / "out")
    files = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == [build_ggml.STAMP_NAME, "include/ggml.h", "src/a.c"]


def test_cmake_args_from_the_environment_come_last(monkeypatch):
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    args = build_ggml.cmake_args(["-DX=1"])
    assert args.index("-DGGML_NATIVE=ON") < args.index("-DGGML_NATIVE=OFF")
    assert args[-3:] == ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DX=1"]
