"""pyggml_build.toolchains: prerequisites of CUDA and Vulkan checked before a long build."""
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
