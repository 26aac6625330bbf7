"""pyggml_build.cmake: a build folder reused only while the tools that configured it exist."""
from __future__ import annotations

from pathlib import Path

from pyggml_build import cmake


def _configured(build: Path, src: Path, cmake_path: str, ninja_path: str) -> None:
    build.mkdir(parents=True)
    (build / "CMakeCache.txt").write_text(
        f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\nCMAKE_COMMAND:INTERNAL={cmake_path}\n"
        f"CMAKE_MAKE_PROGRAM:UNINITIALIZED={ninja_path}\n")
    (build / "kept").write_text("an object file")


def test_a_build_folder_configured_by_a_vanished_pip_environment_starts_afresh(tmp_path, monkeypatch):
    """pip builds in a throw-away environment; the build files name its cmake and ninja, and the
    next `pip install .` failed in ninja's rule that configures again (no such file)."""
    calls = []
    monkeypatch.setattr(cmake, "run", lambda cmd, **kw: calls.append(cmd))
    src, tools = tmp_path / "src", tmp_path / "tools"
    tools.mkdir()
    for name in ("cmake", "ninja"):
        (tools / name).write_text("")
    alive, gone = tmp_path / "alive", tmp_path / "gone"
    _configured(alive, src, str(tools / "cmake"), str(tools / "ninja"))
    _configured(gone, src, str(tools / "cmake"), "/tmp/pip-build-env-gone/overlay/bin/ninja")
    cmake.build_libraries(src, alive, [], 1)
    cmake.build_libraries(src, gone, [], 1)
    assert (alive / "kept").exists() and not (gone / "kept").exists()
    assert len(calls) == 6  # configure, build, install for each
