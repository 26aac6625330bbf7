"""pyggml.raw.log: ggml's log into named Python loggers."""
from __future__ import annotations

import logging


import pyggml
from pyggml import lib


def test_ggml_log_goes_to_named_loggers(caplog, tmp_path):
    pyggml.raw.log.install()  # idempotent; installed at import
    with caplog.at_level(logging.DEBUG, logger="pyggml.ggml"):
        missing = str(tmp_path / "missing.gguf").encode()
        assert lib.gguf_init_from_file(missing, {"no_alloc": True, "ctx": pyggml.ffi.NULL}) == pyggml.ffi.NULL
    recs = [r for r in caplog.records if "missing.gguf" in r.getMessage()]
    assert recs and recs[0].name == "pyggml.ggml.gguf" and recs[0].levelno == logging.ERROR
