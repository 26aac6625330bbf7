"""pyggml_build.toolchains: prerequisites of CUDA, Vulkan and BLAS checked before a long build."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyggml_build import BuildError, source, toolchains


def _vk_headers(root: Path, minor: int, patch: int) -> Path:
    (root / "vulkan").mkdir(parents=True)
    (root / "vulkan" / "vulkan_core.h").write_text(
        f"#define VK_HEADER_VERSION {patch}\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, {minor}, VK_HEADER_VERSION)\n")
    (root / "vulkan" / "vulkan.hpp").write_text("")
    return root


def test_vulkan_header_version_is_read_from_vulkan_core_h(tmp_path):
    assert toolchains.vulkan_header_version(_vk_headers(tmp_path / "a", 3, 239)) == (1, 3, 239)
    assert toolchains.vulkan_header_version(_vk_headers(tmp_path / "b", 4, 309)) == (1, 4, 309)
    assert toolchains.vulkan_header_version(tmp_path / "none") is None


def test_old_vulkan_headers_are_refused_with_what_is_missing(tmp_path, monkeypatch):
    """Debian 12's headers (1.3.239) fail to compile ggml-vulkan: say so before a 10-minute build."""
    monkeypatch.setenv("PYGGML_VULKAN_PREFIX", str(tmp_path / "sdk"))
    _vk_headers(tmp_path / "sdk" / "include", 3, 239)
    monkeypatch.setattr(toolchains, "vulkan_header_version",
                        lambda d: (1, 3, 239) if str(d).startswith(str(tmp_path)) else None)
    with pytest.raises(BuildError, match=r"Vulkan headers >= 1\.3\.261 \(found: 1\.3\.239") as e:
        toolchains._vulkan_args(tmp_path / "cache")
    assert "scripts/vulkan_sdk.sh" in str(e.value)


def test_the_pinned_cublas_wheel_is_checked(tmp_path):
    project, filename, sha = toolchains.CUBLAS_WHEEL
    (tmp_path / filename).write_bytes(b"not cuBLAS")
    with pytest.raises(BuildError, match="sha256 mismatch"):
        source.fetch_pinned(project, filename, sha, tmp_path)


def test_the_pinned_openblas_wheel_is_checked(tmp_path):
    project, filename, sha = toolchains.OPENBLAS_WHEEL
    (tmp_path / filename).write_bytes(b"not OpenBLAS")
    with pytest.raises(BuildError, match="sha256 mismatch"):
        source.fetch_pinned(project, filename, sha, tmp_path)


def _fake_openblas_wheel(path: Path, header: str) -> Path:
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("scipy_openblas32/include/cblas.h", header)
        z.writestr("scipy_openblas32/lib/libscipy_openblas.so", b"")
        z.writestr("scipy_openblas32-0.dist-info/METADATA", "")
    return path


def test_blas_args_map_the_prefixed_cblas_names_ggml_blas_calls(tmp_path, monkeypatch):
    """scipy-openblas32 declares scipy_cblas_sgemm...; ggml-blas.cpp calls cblas_sgemm and
    openblas_set_num_threads: the generated cblas.h maps every prefixed name its header
    declares (checked with the C preprocessor), and the FindBLAS module names the library."""
    import shutil
    import subprocess
    header = ("#ifndef CBLAS_H\n#define CBLAS_H\n"
              "void scipy_openblas_set_num_threads(int num_threads);\n"
              "void scipy_cblas_sgemm(int Order, int TransA);\n#endif\n")
    wheel = _fake_openblas_wheel(tmp_path / "fake.whl", header)
    monkeypatch.setattr(toolchains, "fetch_pinned", lambda *a: wheel)
    args, rpath = toolchains._blas_args(tmp_path, [])
    assert "-DGGML_BLAS=ON" in args and "-DGGML_BLAS_VENDOR=OpenBLAS" in args
    assert rpath[0] == "$ORIGIN/../../scipy_openblas32/lib"
    shim = Path(next(a for a in args if a.startswith("-DCMAKE_MODULE_PATH=")).partition("=")[2])
    find = (shim / "FindBLAS.cmake").read_text()
    assert "set(BLAS_FOUND TRUE)" in find and "libscipy_openblas.so" in find
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the preprocessor check")
    src = tmp_path / "use.c"
    src.write_text("#include <cblas.h>\nvoid f(void) { openblas_set_num_threads(2); cblas_sgemm(1, 2); }\n")
    out = subprocess.run(["cc", "-E", "-I", str(shim), str(src)], capture_output=True, text=True, check=True).stdout
    assert "scipy_openblas_set_num_threads(2); scipy_cblas_sgemm(1, 2);" in out


def test_blas_args_leave_a_named_vendor_to_cmake(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchains, "fetch_pinned", lambda *a: pytest.fail("fetched the pinned wheel"))
    assert toolchains._blas_args(tmp_path, ["-DGGML_BLAS_VENDOR=OpenBLAS"]) == (["-DGGML_BLAS=ON"], [])


def test_blas_args_refuse_a_wheel_without_cblas(tmp_path, monkeypatch):
    wheel = _fake_openblas_wheel(tmp_path / "fake.whl", "void scipy_dgemm_(void);\n")
    monkeypatch.setattr(toolchains, "fetch_pinned", lambda *a: wheel)
    with pytest.raises(BuildError, match="scipy_cblas_sgemm"):
        toolchains._blas_args(tmp_path, [])


def test_cuda_builds_have_cuda_graphs_unless_the_user_turns_them_off(tmp_path, monkeypatch):
    """ggml compiles CUDA graphs in only for llama.cpp (GGML_CUDA_GRAPHS_DEFAULT): pyggml asks for
    them, so that an unchanged decode graph is replayed instead of launched kernel by kernel."""
    monkeypatch.setattr(toolchains, "_find_cuda_toolkit", lambda: (tmp_path / "bin" / "nvcc", tmp_path))
    monkeypatch.setattr(toolchains, "_find_cublas", lambda toolkit, cache: None)
    monkeypatch.setenv("PYGGML_CUDA_ARCHITECTURES", "90")
    args, _ = toolchains._cuda_args(tmp_path, [])
    assert "-DGGML_CUDA_GRAPHS=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args
    args, _ = toolchains._cuda_args(tmp_path, ["-DGGML_CUDA_GRAPHS=OFF"])
    assert not any("GGML_CUDA_GRAPHS" in a for a in args)   # the user's own argument comes later
