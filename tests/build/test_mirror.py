"""pip install from a clone also refreshes the clone's own pyggml/ (pyggml_build.mirror)."""
from __future__ import annotations

import os

from conftest import ROOT  # noqa: F401  (puts the source tree on sys.path)

import pyggml_build


def _tree(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_build_lands_in_the_clone_and_replaces_an_older_one(tmp_path):
    built, clone = tmp_path / "build" / "pyggml", tmp_path / "clone" / "pyggml"
    _tree(built, {"_ggml.so": "new ext", "lib/libggml.so.0.9": "new lib", "include/ggml.h": "h",
                  "_enums.py": "enums", "raw/_callback_table.py": "table"})
    os.symlink("libggml.so.0.9", built / "lib" / "libggml.so")
    _tree(clone, {"__init__.py": "", "_ggml.so": "old ext", "lib/libggml-vulkan.so": "stale",
                  "include/ggml-vulkan.h": "stale", "tensor.py": "source"})
    files = [p for p in built.rglob("*") if p.is_file() or p.is_symlink()]
    pyggml_build.mirror(files, built, clone)
    assert (clone / "_ggml.so").read_text() == "new ext"
    assert (clone / "raw" / "_callback_table.py").read_text() == "table"
    assert os.readlink(clone / "lib" / "libggml.so") == "libggml.so.0.9"
    assert not (clone / "lib" / "libggml-vulkan.so").exists()      # from an older build
    assert not (clone / "include" / "ggml-vulkan.h").exists()
    assert (clone / "tensor.py").read_text() == "source"            # the package's own files stay


def test_nothing_is_copied_onto_itself_or_outside_a_package(tmp_path):
    built = tmp_path / "pyggml"
    _tree(built, {"__init__.py": "", "_ggml.so": "ext"})
    pyggml_build.mirror([built / "_ggml.so"], built, built)        # in-place build
    assert (built / "_ggml.so").read_text() == "ext"
    elsewhere = tmp_path / "not-a-package"
    elsewhere.mkdir()
    pyggml_build.mirror([built / "_ggml.so"], built, elsewhere)
    assert list(elsewhere.iterdir()) == []


def test_a_relative_package_folder_with_absolute_files(tmp_path, monkeypatch):
    """setuptools hands build_ext a relative build_lib while the build returns absolute paths
    (the CI failure of 354c35a: ValueError from Path.relative_to)."""
    monkeypatch.chdir(tmp_path)
    built, clone = tmp_path / "build" / "lib" / "pyggml", tmp_path / "clone" / "pyggml"
    _tree(built, {"_ggml.so": "new ext"})
    _tree(clone, {"__init__.py": ""})
    pyggml_build.mirror([built / "_ggml.so"], built.relative_to(tmp_path), clone)
    assert (clone / "_ggml.so").read_text() == "new ext"
    pyggml_build.mirror([(built / "_ggml.so").relative_to(tmp_path)], built, clone)
    assert (clone / "_ggml.so").read_text() == "new ext"
