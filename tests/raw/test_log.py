"""pyggml.raw.log: ggml's log into named Python loggers."""
from __future__ import annotations

import logging

import pytest

import pyggml
from pyggml import lib


def test_ggml_log_goes_to_named_loggers(caplog, tmp_path):
    pyggml.raw.log.install()  # idempotent; installed at import
    with caplog.at_level(logging.DEBUG, logger="pyggml.ggml"):
        missing = str(tmp_path / "missing.gguf").encode()
        assert lib.gguf_init_from_file(missing, {"no_alloc": True, "ctx": pyggml.ffi.NULL}) == pyggml.ffi.NULL
    recs = [r for r in caplog.records if "missing.gguf" in r.getMessage()]
    assert recs and recs[0].name == "pyggml.ggml.gguf" and recs[0].levelno == logging.ERROR


def test_a_raising_log_filter_is_raised_by_the_call_that_logged(tmp_path):
    from pyggml.core.gguf import GGUFFile

    class Refuse(logging.Filter):
        def filter(self, record):
            raise LookupError("filter says no")

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    f = Refuse()
    logger = logging.getLogger("pyggml.ggml.gguf")   # where gguf's messages go
    logger.addFilter(f)
    try:
        with pytest.raises(LookupError, match="filter says no"):
            GGUFFile(bad)                       # ggml logs why it refuses the file
    finally:
        logger.removeFilter(f)
    with pytest.raises(ValueError, match="could not read"):   # and nothing is left pending
        GGUFFile(bad)
