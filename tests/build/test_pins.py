"""pyggml_build.pins: the table of pinned ggml versions."""
from __future__ import annotations

import pytest

from pyggml_build import pins


def test_pinned_archives_are_the_ones_from_the_issues():
    assert set(pins.PINS) == {"0.25.3", "0.26.0"} and pins.DEFAULT_VERSION == "0.26.0"
    new = pins.PINS["0.26.0"]
    assert new.archive.filename == "xllamacpp-2026.10.11549.tar.gz"
    assert new.archive.sha256 == "c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b"
    assert new.folder == "thirdparty/llama.cpp/ggml"
    previous = pins.PINS["0.25.3"]
    assert previous.archive.filename == "llama_cpp_python-0.3.36.tar.gz"
    assert previous.archive.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert previous.folder == "vendor/llama.cpp/ggml"
    examples = previous.extras["examples/simple/simple-ctx.cpp"][0]  # ggml 0.20.2's own tree
    assert examples.sha256 == "e47ff53506342959ffb3ce15380b82828fea10ec5f208f9ef6915895f1a7a176"


def test_every_pin_names_the_upstream_files_pyggml_compiles():
    for pin in pins.PINS.values():
        if pin.extras:  # trees without tests/ and examples/ of their own
            assert {"tests/test-backend-ops.cpp", "examples/simple/simple-ctx.cpp",
                    "examples/simple/simple-backend.cpp", "examples/mnist/mnist-train.cpp"} <= set(pin.extras)


def test_version_is_chosen_by_environment(monkeypatch):
    monkeypatch.delenv("PYGGML_GGML_VERSION", raising=False)
    assert pins.selected_version().version == pins.DEFAULT_VERSION
    monkeypatch.setenv("PYGGML_GGML_VERSION", "0.25.3")
    assert pins.selected_version().version == "0.25.3"
    assert pins.selected_version("0.26.0").version == "0.26.0"
    with pytest.raises(ValueError, match="not one pyggml pins"):
        pins.selected_version("9.9.9")
