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
    config = build_ggml.resolve_config("")
    backend, rpath = build_ggml.backend_args(config, Path("/nonexistent"))
    args = build_ggml.cmake_args(config, backend, rpath, ["-DX=1"])
    assert args.index("-DGGML_NATIVE=ON") < args.index("-DGGML_NATIVE=OFF")
    assert args[-3:] == ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DX=1"]


@pytest.mark.parametrize("backends, cmake, expected, dl, cpu", [
    ("", "", ["cpu"], False, "native"),
    ("cpu", "-DGGML_AVX512=OFF", ["cpu"], False, "native"),
    ("cpu,vulkan,rpc", "", ["cpu", "rpc", "vulkan"], True, "x86-64-v3"),
    ("", "-DGGML_CUDA=on", ["cpu", "cuda"], True, "x86-64-v3"),      # llama-cpp-python style
    ("rpc", "-DGGML_CUDA:BOOL=ON", ["cpu", "cuda", "rpc"], True, "x86-64-v3"),
    ("cpu-all-variants", "", ["cpu"], True, "all-variants"),
    ("", "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON", ["cpu"], True, "all-variants"),
    (" Vulkan , ", "", ["cpu", "vulkan"], True, "x86-64-v3"),
])
def test_backend_selection(backends, cmake, expected, dl, cpu):
    config = build_ggml.resolve_config(backends, cmake)
    assert (config.backends, config.dl, config.cpu) == (expected, dl, cpu)


@pytest.mark.parametrize("backends, cmake, message", [
    ("cuda", "-DGGML_NATIVE=ON", "GGML_NATIVE=ON, which ggml refuses together with GGML_BACKEND_DL"),
    ("vulkan", "-DGGML_VULKAN=OFF", "asks for vulkan but CMAKE_ARGS has -DGGML_VULKAN=OFF"),
    ("cpu,tpu", "", "unknown backend 'tpu'"),
    ("rpc", "-DGGML_BACKEND_DL=OFF", "need it"),
    ("", "-DGGML_CPU=OFF", "GGML_CPU=OFF is not supported"),
])
def test_contradictory_requests_are_refused_before_cmake(backends, cmake, message):
    with pytest.raises(build_ggml.BuildError, match=message):
        build_ggml.resolve_config(backends, cmake)


def test_build_folders_differ_per_backend_set():
    tags = {build_ggml.resolve_config(b, "").tag for b in ("", "cpu,rpc", "rpc", "cpu-all-variants", "cuda,rpc")}
    assert tags == {"", "-cpu-rpc", "-cpu-all-variants", "-cpu-cuda-rpc"}


def _vk_headers(root: Path, minor: int, patch: int) -> Path:
    (root / "vulkan").mkdir(parents=True)
    (root / "vulkan" / "vulkan_core.h").write_text(
        f"#define VK_HEADER_VERSION {patch}\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, {minor}, VK_HEADER_VERSION)\n")
    (root / "vulkan" / "vulkan.hpp").write_text("")
    return root


def test_vulkan_header_version_is_read_from_vulkan_core_h(tmp_path):
    assert build_ggml.vulkan_header_version(_vk_headers(tmp_path / "a", 3, 239)) == (1, 3, 239)
    assert build_ggml.vulkan_header_version(_vk_headers(tmp_path / "b", 4, 309)) == (1, 4, 309)
    assert build_ggml.vulkan_header_version(tmp_path / "none") is None


def test_old_vulkan_headers_are_refused_with_what_is_missing(tmp_path, monkeypatch):
    """Debian 12's headers (1.3.239) fail to compile ggml-vulkan: say so before a 10-minute build."""
    monkeypatch.setenv("PYGGML_VULKAN_PREFIX", str(tmp_path / "sdk"))
    _vk_headers(tmp_path / "sdk" / "include", 3, 239)
    monkeypatch.setattr(build_ggml, "vulkan_header_version",
                        lambda d: (1, 3, 239) if str(d).startswith(str(tmp_path)) else None)
    with pytest.raises(build_ggml.BuildError, match=r"Vulkan headers >= 1\.3\.261 \(found: 1\.3\.239") as e:
        build_ggml._vulkan_args(tmp_path / "cache")
    assert "scripts/vulkan_sdk.sh" in str(e.value)


def test_pinned_downloads_are_checked(tmp_path):
    project, filename, sha = build_ggml.CUBLAS_WHEEL
    (tmp_path / filename).write_bytes(b"not cuBLAS")
    with pytest.raises(build_ggml.BuildError, match="sha256 mismatch"):
        build_ggml._fetch_pinned(project, filename, sha, tmp_path)
