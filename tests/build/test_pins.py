"""pyggml_build.pins: the table of pinned ggml versions."""
from __future__ import annotations

import pytest

from pyggml_build import pins


def test_pinned_archives_are_the_ones_from_the_issues():
    assert pins.PINS["0.20.2"].archive.sha256 == "e47ff53506342959ffb3ce15380b82828fea10ec5f208f9ef6915895f1a7a176"
    new = pins.PINS["0.25.3"]
    assert new.archive.filename == "llama_cpp_python-0.3.36.tar.gz"
    assert new.archive.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert new.folder == "vendor/llama.cpp/ggml"


def test_every_pin_names_the_upstream_files_pyggml_compiles():
    for pin in pins.PINS.values():
        if pin.extras:  # trees without tests/ and examples/ of their own
            assert {"tests/test-backend-ops.cpp", "examples/simple/simple-ctx.cpp",
                    "examples/simple/simple-backend.cpp", "examples/mnist/mnist-train.cpp"} <= set(pin.extras)


def test_version_is_chosen_by_environment(monkeypatch):
    monkeypatch.delenv("PYGGML_GGML_VERSION", raising=False)
    assert pins.selected_version().version == pins.DEFAULT_VERSION
    monkeypatch.setenv("PYGGML_GGML_VERSION", "0.20.2")
    assert pins.selected_version().version == "0.20.2"
    assert pins.selected_version("0.25.3").version == "0.25.3"
    with pytest.raises(ValueError, match="not one pyggml pins"):
        pins.selected_version("9.9.9")
